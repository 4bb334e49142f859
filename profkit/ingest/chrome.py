"""Generic Chrome trace-event JSON reader (array ``[...]`` or object ``{"traceEvents": [...]}``).

For traces from tools other than Kineto: ``X`` complete events, ``B``/``E`` pairs
(matched as a stack per (pid, tid), as Chrome does; py-spy's chrometrace is all
B/E), and ``i``/``I``/``n`` instants. ``ts`` is µs on the tool's own clock
(absolute only if the file says so via ``baseTimeNanoseconds``); the loader's
alignment step places it. Kinds come from ``cat``: Kineto's categories keep their
Kineto meaning, ``py-spy`` frames are samples, names that say kernel/memcpy/memset
are device work, anything else is a CPU span.
"""
from __future__ import annotations

from pathlib import Path

from profkit import schema as S
from profkit.ingest.base import RankPart
from profkit.ingest.kineto import read_trace_json
from profkit.ingest.traceevents import KINETO_CATS, Spec

SOURCE = "chrome"


def chrome_spec(cat: str | None) -> Spec:
    """Kind of a Chrome ``cat`` (may be a comma-separated list)."""
    if cat is None:
        return S.CPU_SPAN, False
    if cat in KINETO_CATS:
        return KINETO_CATS[cat]
    words = {w.strip().lower() for w in cat.split(",")}
    if "py-spy" in words or "pyspy" in words:
        return S.SAMPLE, False
    for word in words:
        if word in KINETO_CATS:
            return KINETO_CATS[word]
    text = cat.lower()
    if "memcpy" in text:
        return S.MEMCPY, True
    if "memset" in text:
        return S.MEMSET, True
    if "kernel" in text:
        return S.KERNEL, True
    if words & {"gc", "garbage_collection"}:
        return S.GC, False
    return S.CPU_SPAN, False


def read_chrome(path: str | Path) -> list[RankPart]:
    """One RankPart with every event of a Chrome trace-event JSON(.gz) file."""
    return [read_trace_json(path, SOURCE, chrome_spec)]
