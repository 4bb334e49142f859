"""Kineto / torch.profiler JSON(.gz) reader, and the sniffer that tells it from other Chrome JSON.

Times: absolute ns = ``baseTimeNanoseconds + round(ts * 1000)`` computed exactly in
int64 (``traceevents.us_to_ns``); traces without ``baseTimeNanoseconds`` (older
Kineto) write absolute epoch µs, so the base is 0 and ``meta['base_time_source']``
says so. GPU rows take device/stream from args (else the event's pid/tid) and the
host process's pid; several kernels may share one correlation id (CUDA graphs)
and are all kept. The rank is ``distributedInfo.rank`` when present.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Literal

from profkit import schema as S
from profkit.errors import TraceError
from profkit.ingest import scanned
from profkit.ingest.base import RankPart
from profkit.ingest.collectives import as_int
from profkit.ingest.jsonio import ChunkingFailed, TraceJSON, gc_paused, read_head
from profkit.ingest.traceevents import KINETO_CATS, EventColumns, Spec
from profkit.ingest.typedjson import decode_piece

SOURCE = "kineto"
_VERSION_KEYS = (
    "cuda_runtime_version", "cuda_driver_version", "cupti_version",
    "roctracer_version", "hip_runtime_version", "hip_driver_version",
)
_KINETO_KEY = re.compile(rb'"(?:schemaVersion|deviceProperties|distributedInfo|baseTimeNanoseconds|cupti_version|roctracer_version)"\s*:')
_KINETO_CAT = re.compile(
    rb'"cat"\s*:\s*"(?:kernel|cuda_runtime|cuda_driver|cpu_op|gpu_memcpy|gpu_memset|python_function'
    rb'|gpu_user_annotation|user_annotation|cpu_instant_event)"'
)
_MAX_NAMES = 10_000


def kineto_spec(cat: str | None) -> Spec:
    """Kind of a Kineto category; unknown categories are ``other`` host events."""
    return KINETO_CATS.get(cat, (S.OTHER, False))  # type: ignore[arg-type]


def is_kineto(head: bytes) -> bool:
    """Whether the first bytes of a JSON trace look like Kineto's (header keys or its categories)."""
    return bool(_KINETO_KEY.search(head) or _KINETO_CAT.search(head))


def sniff_json(path: str | Path) -> Literal["kineto", "chrome"]:
    """``kineto`` or ``chrome`` for a JSON(.gz) trace, from its first 64 KB only."""
    head = read_head(path)
    body = head.lstrip()
    if not body:
        raise TraceError(path, "empty file")
    if body[:1] not in (b"{", b"["):
        raise TraceError(path, f"not a JSON trace: starts with {body[:16]!r}")
    return "kineto" if is_kineto(head) else "chrome"


def read_kineto(path: str | Path) -> list[RankPart]:
    """One RankPart with every event of a Kineto trace file (plain or gzip JSON)."""
    return [read_trace_json(path, SOURCE, kineto_spec)]


# ---------------------------------------------------------------- shared driver


def read_trace_json(path: str | Path, source: str, cat_spec: Callable[[str | None], Spec]) -> RankPart:
    """Read any Chrome-format JSON trace into one RankPart; every failure is a TraceError."""
    try:
        with gc_paused():
            doc = TraceJSON.open(path)
            cols = EventColumns(cat_spec)
            chunked = doc.whole_events is None
            decode, chunk_bytes = _piece_decoder(path)
            try:
                for chunk in doc.chunks(chunk_bytes, decode=decode):
                    cols.add(chunk)
                    del chunk  # else two chunks of dicts are alive while the next one parses
            except ChunkingFailed:
                doc = doc.whole()
                cols = EventColumns(cat_spec)
                chunked = False
                for chunk in doc.chunks():
                    cols.add(chunk)
            return _finish(str(path), source, doc, cols, chunked)
    except TraceError:
        raise
    except RecursionError:
        raise TraceError(path, "JSON nested too deeply") from None
    except Exception as exc:  # a reader bug must still name the file, not kill the batch
        raise TraceError(path, f"unreadable trace ({type(exc).__name__}: {exc})") from exc
    finally:
        scanned.release()


def _piece_decoder(path: str | Path) -> tuple[Callable[[Any], Any], int | None]:
    """(decoder of a piece, piece bytes): the compiled scanner's (``scanned``) where it is installed
    and the file is large enough to repay loading it, its pieces sized by the file's size on disk
    (``scanned.chunk_bytes``), else msgspec's (``decode_piece``)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    scan = scanned.decoder(size)
    return (decode_piece, None) if scan is None else (scan, scanned.chunk_bytes(size))


def _finish(path: str, source: str, doc: TraceJSON, cols: EventColumns, chunked: bool) -> RankPart:
    header = doc.header
    warnings = list(doc.notes)
    meta: dict[str, Any] = {"format": "kineto" if source == SOURCE else "chrome", "chunked_parse": chunked}
    base_ns, base_source = _base_time(header, warnings)
    meta["base_time_ns"] = base_ns
    meta["base_time_source"] = base_source
    for key, out in (("schemaVersion", "schema_version"), ("traceName", "trace_name"), ("trace_id", "trace_id"),
                     ("displayTimeUnit", "display_time_unit")):
        if key in header:
            meta[out] = header[key]
    versions = {k: header[k] for k in _VERSION_KEYS if k in header}
    if versions:
        meta["versions"] = versions
    if "roctracer_version" in header or "hip_runtime_version" in header:
        meta["platform"] = "rocm"
    elif "cupti_version" in header or "cuda_runtime_version" in header:
        meta["platform"] = "cuda"
    devices = header.get("deviceProperties")
    if isinstance(devices, list):
        meta["devices"] = [d.get("name") if isinstance(d, dict) else None for d in devices]
    rank = _rank(header, meta, warnings)

    labelled_cpu = _metadata(cols.metadata, meta)
    warnings += cols.pair_begin_end()
    table, host_pid, dropped = cols.table(source, base_ns, labelled_cpu)
    meta["host_pid"] = host_pid
    warnings += dropped
    id_names = {k: v for k, v in cols.id_names.items() if v}
    if id_names:
        meta["id_names"] = id_names  # hashed non-numeric pids/tids -> their text
    if cols.skipped["not an object"]:
        warnings.append(f"skipped {cols.skipped['not an object']} entries of traceEvents that are not objects")
    meta["events"] = table.num_rows
    meta["skipped"] = dict(cols.skipped)
    meta["metadata_events"] = len(cols.metadata)
    if table.num_rows == 0:
        warnings.append("no events")
    return RankPart(
        path=path, source=source, table=table, rank=rank,
        rank_origin="metadata" if rank is not None else "unknown", meta=meta, warnings=warnings,
    )


def _base_time(header: dict, warnings: list[str]) -> tuple[int, str]:
    if "baseTimeNanoseconds" not in header:
        return 0, "absent: ts read as absolute µs"
    base = as_int(header["baseTimeNanoseconds"])
    if base is None or abs(base) >= 1 << 62:
        warnings.append(f"ignored baseTimeNanoseconds={str(header['baseTimeNanoseconds'])[:40]!r}: not an integer ns time")
        return 0, "invalid: ignored"
    return base, "baseTimeNanoseconds"


def _rank(header: dict, meta: dict, warnings: list[str]) -> int | None:
    info = header.get("distributedInfo")
    if not isinstance(info, dict):
        return None
    meta["distributed"] = info
    rank = as_int(info.get("rank"))
    if rank is None or not 0 <= rank < 1 << 31:
        if "rank" in info:
            warnings.append(f"ignored distributedInfo.rank={str(info.get('rank'))[:40]!r}: not a rank number")
        return None
    return rank


def _metadata(events: list[dict], meta: dict) -> list[int]:
    """Process/thread names from ``M`` events into meta; returns pids labelled "CPU"."""
    process_names: dict[str, str] = {}
    process_labels: dict[str, str] = {}
    thread_names: dict[str, str] = {}
    cpu_pids: list[int] = []
    for e in events:
        args = e.get("args")
        if not isinstance(args, dict):
            continue
        what = e.get("name")
        pid = str(e.get("pid"))[:64]
        if what == "process_name" and len(process_names) < _MAX_NAMES:
            process_names[pid] = str(args.get("name"))[:200]
        elif what == "process_labels" and len(process_labels) < _MAX_NAMES:
            labels = str(args.get("labels"))[:200]
            process_labels[pid] = labels
            if labels == "CPU" and type(e.get("pid")) is int and e["pid"] not in cpu_pids:
                cpu_pids.append(e["pid"])
        elif what == "thread_name" and len(thread_names) < _MAX_NAMES:
            thread_names[f"{pid}/{str(e.get('tid'))[:64]}"] = str(args.get("name"))[:200]
    for key, value in (("process_names", process_names), ("process_labels", process_labels), ("thread_names", thread_names)):
        if value:
            meta[key] = value
    return cpu_pids
