"""Reader of profkit span files (``spans-pid{pid}.jsonl``, written by ``profkit.instrument``).

One file is one process; it becomes one RankPart (source ``profkit``, key ``pid=<pid>``). Kinds:
``gc`` for category ``gc`` (GC pauses), ``cpu_span`` for everything else; the category is the
span's own. The rank is the header's (the last header line that knows one wins: the recorder
learns it lazily), ``rank_origin="metadata"``; None when no header knew it.

Times: spans are on the process's monotonic clock. Absolute ns = ``wall + (mono - mono_anchor)``
using the (wall, mono) anchor whose mono is nearest the span's start (anchors are taken when the
recorder starts and at every flush), applied to start and end alike so durations stay exact.
Piecewise-nearest, not interpolated: a wall-clock step (NTP) between two anchors must not smear
into every span between them; the drift between anchors is reported in ``meta``.

A torn last line (the process died mid-write) is skipped with a warning; anything else that is
not a span file is a TraceError naming the file and line.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from profkit import schema as S
from profkit.errors import TraceError
from profkit.ingest.base import RankPart
from profkit.ingest.jsonio import gc_paused

SOURCE = "profkit"
FORMAT_VERSION = 1
HEADER_KEY = "profkit_spans"
GC_CATEGORY = "gc"
_HEADER_RE = re.compile(rb'^\s*\{\s*"profkit_spans"\s*:')
_IDENTITY_KEYS = ("rank", "rank_origin", "dp_rank", "dp_size", "ep_rank", "tp_rank", "pp_rank", "local_rank",
                  "global_rank", "process_name", "role", "host", "pid")
_MAX_META_ANCHORS = 10_000


def is_span_file(path: str | Path) -> bool:
    """Whether ``path`` starts with a profkit span-file header (reads the first 4 KB only)."""
    try:
        with open(path, "rb") as fh:
            return bool(_HEADER_RE.match(fh.read(4096)))
    except OSError:
        return False


class _Parsed:
    def __init__(self) -> None:
        self.identity: dict[str, Any] = {}
        self.version = FORMAT_VERSION
        self.anchors: list[tuple[int, int]] = []
        self.names: dict[int, str] = {}
        self.blocks: list[np.ndarray] = []
        self.gc_collected = 0
        self.gc_uncollectable = 0
        self.warnings: list[str] = []
        self.lines = 0


def _parse(path: Path) -> _Parsed:
    out = _Parsed()
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceError(path, f"cannot open: {exc.strerror or exc}") from None
    with fh, gc_paused():
        pending: tuple[int, bytes] | None = None  # a line that failed to parse: torn only if last
        for lineno, line in enumerate(fh, 1):
            if pending is not None:
                raise TraceError(path, f"line {pending[0]}: not JSON ({pending[1][:40]!r}...)")
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                pending = (lineno, line)
                continue
            if not isinstance(obj, dict):
                raise TraceError(path, f"line {lineno}: expected a JSON object, found {type(obj).__name__}")
            if out.lines == 0 and HEADER_KEY not in obj:
                raise TraceError(path, "not a profkit span file: the first line has no 'profkit_spans' header")
            out.lines += 1
            _take(path, lineno, obj, out)
        if pending is not None:
            if out.lines == 0:
                raise TraceError(path, "not a profkit span file: the first line is not JSON")
            out.warnings.append(f"torn last line {pending[0]} ({len(pending[1])} bytes) skipped: "
                                f"the process stopped while writing it")
    if out.lines == 0:
        raise TraceError(path, "empty file")
    return out


def _take(path: Path, lineno: int, obj: dict, out: _Parsed) -> None:
    if HEADER_KEY in obj:
        version = obj[HEADER_KEY]
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise TraceError(path, f"span file format {version!r} is newer than this reader ({FORMAT_VERSION})")
        for key in _IDENTITY_KEYS:
            if obj.get(key) is not None and key != "rank_origin":
                out.identity[key] = obj[key]
        if obj.get("rank") is not None:  # its origin goes with the rank, not with later headers
            out.identity["rank_origin"] = obj.get("rank_origin")
        for anchor in obj.get("anchors") or ():
            out.anchors.append(_anchor(path, lineno, anchor))
    if "anchor" in obj:
        out.anchors.append(_anchor(path, lineno, obj["anchor"]))
    names = obj.get("names")
    if names:
        try:
            out.names.update({int(k): str(v) for k, v in names.items()})
        except (ValueError, AttributeError):
            raise TraceError(path, f"line {lineno}: 'names' must map integer ids to strings") from None
    spans = obj.get("spans")
    if not spans:
        return
    try:
        if all(len(s) == 5 for s in spans):
            block = np.asarray(spans, dtype=np.int64)
        else:
            block = np.asarray([s[:5] for s in spans], dtype=np.int64)
            for s in spans:
                if len(s) > 5 and isinstance(s[5], dict):
                    out.gc_collected += int(s[5].get("collected", 0) or 0)
                    out.gc_uncollectable += int(s[5].get("uncollectable", 0) or 0)
    except (TypeError, ValueError, OverflowError):
        raise TraceError(path, f"line {lineno}: spans must be [name_id, category_id, start, end, tid]") from None
    if block.ndim != 2 or block.shape[1] != 5:
        raise TraceError(path, f"line {lineno}: spans must be [name_id, category_id, start, end, tid]")
    out.blocks.append(block)


def _anchor(path: Path, lineno: int, value: Any) -> tuple[int, int]:
    try:
        wall, mono = value
        return int(wall), int(mono)
    except (TypeError, ValueError):
        raise TraceError(path, f"line {lineno}: an anchor must be [wall_ns, mono_ns], got {value!r}") from None


def to_absolute(mono_ns: np.ndarray, anchors: list[tuple[int, int]]) -> np.ndarray:
    """Offset (wall - mono) of the anchor nearest each monotonic time, int64 exact."""
    arr = np.array(sorted(set(anchors), key=lambda a: a[1]), dtype=np.int64)
    monos, offsets = arr[:, 1], arr[:, 0] - arr[:, 1]
    right = np.clip(np.searchsorted(monos, mono_ns), 0, len(monos) - 1)
    left = np.clip(right - 1, 0, len(monos) - 1)
    nearer_left = np.abs(mono_ns - monos[left]) <= np.abs(monos[right] - mono_ns)
    return np.where(nearer_left, offsets[left], offsets[right])


def _resolve(ids: np.ndarray, names: dict[int, str], what: str, warnings: list[str]) -> np.ndarray:
    uniq, inverse = np.unique(ids, return_inverse=True)
    missing = [int(i) for i in uniq if int(i) not in names]
    if missing:
        warnings.append(f"{len(missing)} {what} id(s) never defined (e.g. {missing[0]}): shown as '<unknown {what}>'")
    text = np.array([names.get(int(i), f"<unknown {what} {int(i)}>") for i in uniq], dtype=object)
    return text[inverse] if len(ids) else np.array([], dtype=object)


def read_spans(path: str | Path) -> list[RankPart]:
    """One RankPart (one process) from a profkit span file; see the module docstring."""
    path = Path(path)
    parsed = _parse(path)
    warnings = parsed.warnings
    spans = np.concatenate(parsed.blocks) if parsed.blocks else np.empty((0, 5), dtype=np.int64)
    start, end = spans[:, 2], spans[:, 3]
    backwards = end < start
    if backwards.any():
        warnings.append(f"{int(backwards.sum())} span(s) end before they start: end set to start")
        end = np.where(backwards, start, end)
    if parsed.anchors:
        offset = to_absolute(start, parsed.anchors)
    else:
        warnings.append("no clock anchors: times are on the process's monotonic clock, not wall time")
        offset = np.zeros(len(start), dtype=np.int64)
    order = np.argsort(start + offset, kind="stable")
    names = _resolve(spans[order, 0], parsed.names, "name", warnings)
    categories = _resolve(spans[order, 1], parsed.names, "category", warnings)
    n = len(order)
    pid = parsed.identity.get("pid")
    table = S.to_table({
        "source": np.full(n, SOURCE, dtype=object),
        "kind": np.where(categories == GC_CATEGORY, S.GC, S.CPU_SPAN).astype(object),
        "name": names,
        "category": categories,
        "start_ns": (start + offset)[order],
        "end_ns": (end + offset)[order],
        "pid": np.full(n, int(pid), dtype=np.int64) if pid is not None else [None] * n,
        "tid": spans[order, 4],
    })
    rank = parsed.identity.get("rank")
    rank = int(rank) if rank is not None else None
    return [RankPart(path=str(path), source=SOURCE, table=table, rank=rank,
                     rank_origin="metadata" if rank is not None else "unknown",
                     key=f"pid={pid}" if pid is not None else "", meta=_meta(parsed, n), warnings=warnings)]


def _meta(parsed: _Parsed, n_spans: int) -> dict[str, Any]:
    ident = parsed.identity
    anchors = sorted(set(parsed.anchors), key=lambda a: a[1])
    meta: dict[str, Any] = {
        "format": f"{HEADER_KEY}/{FORMAT_VERSION}",
        "clock": "monotonic",
        **{k: ident.get(k) for k in _IDENTITY_KEYS if k != "rank"},
        "n_spans": n_spans,
        "gc_collected": parsed.gc_collected,
        "gc_uncollectable": parsed.gc_uncollectable,
        "anchors": [list(a) for a in anchors[:_MAX_META_ANCHORS]],
    }
    if len(anchors) >= 2:
        (w0, m0), (w1, m1) = anchors[0], anchors[-1]
        if m1 > m0:
            meta["wall_vs_mono_drift_ppm"] = ((w1 - m1) - (w0 - m0)) / (m1 - m0) * 1e6
            meta["anchor_span_s"] = (m1 - m0) / 1e9
    return meta
