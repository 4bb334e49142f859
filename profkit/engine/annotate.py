"""Phase spans that every profiler sees, timed by the engine itself.

One ``with spans.span(name):`` opens a ``torch.profiler.record_function`` (Kineto) and, when CUDA
is in use, an NVTX range (Nsight Systems), and adds the phase's duration (monotonic ns) to the
current step's record, so the engine's own timings and the traces name phases identically.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch


class Spans:
    """Per-process span emitter plus the per-step phase accumulator."""

    def __init__(self, use_nvtx: bool):
        self.use_nvtx = use_nvtx
        self.phase_ns: dict[str, int] = {}

    def reset(self) -> dict[str, int]:
        phases, self.phase_ns = self.phase_ns, {}
        return phases

    @contextmanager
    def span(self, name: str, timed: bool = True) -> Iterator[None]:
        if self.use_nvtx:
            torch.cuda.nvtx.range_push(name)
        t0 = time.monotonic_ns()
        try:
            with torch.profiler.record_function(name):
                yield
        finally:
            if timed:
                self.phase_ns[name] = self.phase_ns.get(name, 0) + time.monotonic_ns() - t0
            if self.use_nvtx:
                torch.cuda.nvtx.range_pop()

    def add(self, name: str, ns: int) -> None:
        """Account time measured elsewhere (e.g. time spent inside all-to-all calls)."""
        self.phase_ns[name] = self.phase_ns.get(name, 0) + int(ns)
