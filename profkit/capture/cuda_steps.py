"""The CUDA profiler window by step number: ``PROFKIT_CUDA_PROFILER_STEPS=A:B`` (in-process).

Why: ``nsys profile --capture-range=cudaProfilerApi`` records only between cudaProfilerStart and
cudaProfilerStop, and those calls must come at the same step number on every rank (not at the
same wall time), exactly like the torch.profiler window of ``PROFKIT_TORCH_STEPS``. Steps are
counted on the same hook-set step targets (vLLM ``Worker.execute_model`` and
``execute_dummy_batch``; the bundled engine's ``Worker.execute_model``): start before call A,
stop before call B or at exit. torch is used only once the window opens, and only if the
process has already initialized CUDA (a process without a CUDA context has nothing to record).

Until ``profkit.instrument.torch_steps`` reads this variable itself, :func:`install` chains the
window onto its ``from_env`` (the capture agent calls it before ``activate()``).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

from profkit.instrument import identity, nvtx_ranges
from profkit.instrument.torch_steps import StepWindow
from profkit.instrument.torch_steps import parse_steps as _parse_steps

ENV = "PROFKIT_CUDA_PROFILER_STEPS"
PreHook = Callable[[tuple, dict], None]


def parse_steps(text: str) -> tuple[int, int]:
    """``"A:B"`` -> (A, B) with 0 <= A < B (the torch window's parser, naming this variable)."""
    return _parse_steps(text, ENV)


def _cuda() -> Any:
    """torch, if this process has a CUDA context (never creates one)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


class CudaProfilerWindow(StepWindow):
    """cudaProfilerStart at step A, cudaProfilerStop at step B (nsys --capture-range=cudaProfilerApi)."""

    def __init__(self, start_step: int, stop_step: int):
        self.on = False
        self.events: list[tuple[str, int]] = []  # ("start"|"stop", step) that took effect
        super().__init__(start_step, stop_step)

    def _start(self, step: int) -> None:
        torch = _cuda()
        if torch is None:
            print(f"profkit: pid {os.getpid()}: no CUDA context at step {step}; cudaProfilerStart skipped",
                  file=sys.stderr)
            return
        try:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            self.on = True
            self.events.append(("start", step))
            nvtx_ranges.mark_rank(identity.current().rank)
        except Exception as exc:  # noqa: BLE001 - profiling must never break serving
            print(f"profkit: cudaProfilerStart failed: {exc!r}", file=sys.stderr)

    def _stop(self, step: int) -> None:
        if not self.on:
            return
        self.on = False
        torch = _cuda()
        try:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            self.events.append(("stop", step))
        except Exception as exc:  # noqa: BLE001
            print(f"profkit: cudaProfilerStop failed: {exc!r}", file=sys.stderr)


def from_env() -> CudaProfilerWindow | None:
    text = os.environ.get(ENV, "").strip()
    return CudaProfilerWindow(*parse_steps(text)) if text else None


def chain(*hooks: PreHook | None) -> PreHook | None:
    """One pre hook calling each given one in order (None when none is given)."""
    present = [h for h in hooks if h is not None]
    if len(present) <= 1:
        return present[0] if present else None

    def pre(args: tuple, kwargs: dict) -> None:
        for hook in present:
            hook(args, kwargs)

    return pre


def install() -> bool:
    """Make ``torch_steps.from_env`` also return this window; False if it already reads ``ENV``."""
    from profkit.instrument import torch_steps

    if getattr(torch_steps, "CUDA_PROFILER_ENV", None) == ENV or getattr(torch_steps.from_env, "_profkit_cuda", False):
        return False
    original = torch_steps.from_env

    def from_env() -> Any:
        try:
            cuda_window = globals()["from_env"]()
        except ValueError as exc:
            print(f"profkit: {exc}", file=sys.stderr)
            cuda_window = None
        return chain(original(), cuda_window)

    from_env._profkit_cuda = True  # type: ignore[attr-defined]
    torch_steps.from_env = from_env
    return True
