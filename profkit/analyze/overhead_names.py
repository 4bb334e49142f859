"""Cause names: short, stable names for the host activity that idle GPU time is charged to.

Raw names carry per-step noise (batch sizes in vLLM's step annotation, ``ProfilerStep#12``,
graph hashes, object addresses in Python frames); one cause must keep one name across steps
and ranks, or the ranking splits it into many small rows. Span names are otherwise kept as-is.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.analyze.steps import BUILTIN_MARKERS, VLLM_STEP_RE
from profkit.ingest.collectives import coll_from_kernel
from profkit.analyze.vocabulary import GC_CAUSE
from profkit.names import kernel_short_name

MAX_NAME = 120

# GC pauses: profkit's gc.gen{n}, the bundled engine's "gc", the simulator's gc.collect
GC_RE = re.compile(
    r"^(?:gc|gc\.collect|gc[.:_ ]?gen(?:eration)?[ _]?\d+|python[ _]gc|garbage[ _]collect(?:ion|or)?)$", re.I
)
_PROFILER_STEP = re.compile(r"^(ProfilerStep)#\d+$")
_SGLANG_STEP = re.compile(r"^step\[(\w+)[^\]]*\]$")
_FX_GRAPH = re.compile(r"^## Call (CompiledFxGraph) \w+ ##$")
_MODULE = re.compile(r"^(nn\.Module: \w+?)(?:_\d+)?$")
_PY_FRAME = re.compile(r"^(?P<path>[^()]*?)\((?P<line>\d+)\): (?P<func>.+)$")
_ADDRESS = re.compile(r" (?:of [^<>]*? )?at 0x[0-9a-fA-F]+")


def cause_name(raw: str) -> str:
    """Stable, short name of a span / op / frame (see module docstring)."""
    name = str(raw).strip()
    if GC_RE.match(name):
        return GC_CAUSE
    if VLLM_STEP_RE.match(name):
        return "execute_context_N_generation_N"
    for pattern in (_PROFILER_STEP, _FX_GRAPH, _MODULE):
        m = pattern.match(name)
        if m:
            return m.group(1)
    m = _SGLANG_STEP.match(name)
    if m:
        return f"step[{m.group(1)}]"
    m = _PY_FRAME.match(name)
    if m:
        base = m.group("path").replace("\\", "/").rsplit("/", 1)[-1]
        name = f"{base}:{m.group('func')}"
    name = _ADDRESS.sub("", name)
    if len(name) > MAX_NAME:
        name = name[: MAX_NAME - 3] + "..."
    return name


_KERNEL_COLLS = (
    (re.compile(r"all_?reduce", re.I), "all_reduce"),
    (re.compile(r"all_?gather", re.I), "all_gather"),
    (re.compile(r"reduce_?scatter", re.I), "reduce_scatter"),
    (re.compile(r"all_?to_?all", re.I), "all_to_all"),
)


def collective_of_kernel(kernel: str) -> str:
    """Collective a communication kernel serves, in ingest's vocabulary (``all_reduce``, ...);
    else the kernel's short name (no ``void``, namespaces, templates or arguments)."""
    known = coll_from_kernel(kernel)
    if known:
        return known
    for pattern, coll in _KERNEL_COLLS:
        if pattern.search(kernel):
            return coll
    return kernel_short_name(kernel, keep_anonymous=False) or "collective"


def is_builtin_frame(raw: str) -> bool:
    """Python frames of builtins / frozen importlib: too fine to name a cause."""
    return str(raw).startswith("<")


def is_container(raw: str, step_names: frozenset[str]) -> bool:
    """A step-level span (step marker or the step table's own span): time in it with nothing
    deeper is the step's self time, so deeper ops or frames name the cause when there are any."""
    name = str(raw)
    return name in step_names or any(m.pattern.match(name) for m in BUILTIN_MARKERS)


def classify_names(uniques: np.ndarray, step_names: frozenset[str]) -> dict[str, np.ndarray]:
    """Per unique raw name: cause name and flags (computed once per rank, not per event)."""
    raw = [str(u) for u in uniques]
    return {
        "cause": np.array([cause_name(r) for r in raw], dtype=object),
        "container": np.array([is_container(r, step_names) for r in raw], dtype=bool),
        "gc": np.array([bool(GC_RE.match(r.strip())) for r in raw], dtype=bool),
        "builtin": np.array([is_builtin_frame(r) for r in raw], dtype=bool),
    }
