"""The one event schema every reader produces and every analyzer consumes.

Each row is one event of one rank. Time is int64 nanoseconds on an absolute clock
(Unix epoch where the source says so: Kineto ``baseTimeNanoseconds``, nsys
``utcEpochNs``; else the source's own clock, recorded in the rank's metadata).
Instants have ``end_ns == start_ns``. Columns are Arrow-backed (``pd.ArrowDtype``);
missing values are Arrow nulls, never magic numbers.

Columns
-------
rank         int32   global rank the event belongs to
source       string  reader that produced it: kineto, nsys, chrome, profkit, pyspy
kind         string  one of KINDS below
name         string  kernel / op / range / function name
category     string  the source's own category (Kineto ``cat``, NVTX domain, nsys table)
start_ns     int64   absolute start
end_ns       int64   absolute end (>= start_ns)
device       int32   GPU index for device events, null for host events
stream       int64   GPU stream for device events, null for host events
pid          int64   OS process id (GPU events: the owning process where known)
tid          int64   OS thread id (host events), null for device events
correlation  int64   launch <-> device-activity link (runtime call and its kernels)
coll_name    string  collective name (all_reduce, all_to_all, ...) where the source says
coll_group   string  process group / communicator
coll_seq     int64   sequence number of the collective within its group
bytes        int64   bytes moved (memcpy/memset size, collective message size)
"""
from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa

SCHEMA_VERSION = 1

KERNEL = "kernel"
MEMCPY = "memcpy"
MEMSET = "memset"
RUNTIME = "runtime"  # CUDA/HIP runtime or driver API call on the host
CPU_OP = "cpu_op"  # framework operator (aten::...)
CPU_SPAN = "cpu_span"  # user annotation, NVTX range, record_function, profkit span
GPU_SPAN = "gpu_span"  # annotation projected onto the GPU (gpu_user_annotation)
PYTHON = "python"  # python_function frames
SAMPLE = "sample"  # sampling profiler frame (py-spy)
OSRT = "osrt"  # OS runtime call (futex, poll, ...)
GC = "gc"  # garbage-collector pause
INSTANT = "instant"  # zero-length marker
OTHER = "other"

KINDS = (KERNEL, MEMCPY, MEMSET, RUNTIME, CPU_OP, CPU_SPAN, GPU_SPAN, PYTHON, SAMPLE, OSRT, GC, INSTANT, OTHER)
GPU_KINDS = (KERNEL, MEMCPY, MEMSET)

ARROW_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("source", pa.string()),
        ("kind", pa.string()),
        ("name", pa.string()),
        ("category", pa.string()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("device", pa.int32()),
        ("stream", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("correlation", pa.int64()),
        ("coll_name", pa.string()),
        ("coll_group", pa.string()),
        ("coll_seq", pa.int64()),
        ("bytes", pa.int64()),
    ]
)
COLUMNS = tuple(ARROW_SCHEMA.names)


def to_table(columns: dict[str, list | object]) -> pa.Table:
    """Build an Arrow table in schema order from a dict of column lists/arrays.

    Missing columns become all-null; unknown columns are an error (a reader bug).
    """
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        raise KeyError(f"not in the event schema: {sorted(unknown)}")
    lengths = {len(v) for v in columns.values()}  # type: ignore[arg-type]
    if len(lengths) > 1:
        raise ValueError(f"event columns differ in length: {lengths}")
    n = lengths.pop() if lengths else 0
    arrays = []
    for field in ARROW_SCHEMA:
        values = columns.get(field.name)
        if values is None:
            arrays.append(pa.nulls(n, type=field.type))
        else:
            arrays.append(as_array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=ARROW_SCHEMA)


def as_array(values, typ: pa.DataType) -> pa.Array:
    """``pa.array(values, type=typ, from_pandas=True)``, without going through Python objects when
    ``values`` already is an Arrow array of that type (``pa.array`` iterates a ChunkedArray
    element by element: ~0.4 µs a value)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)) and values.type == typ:
        return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return pa.array(values, type=typ, from_pandas=True)


def from_records(rows: list[dict]) -> pd.DataFrame:
    """Event table from row dicts (missing keys are null); for tests, synthetic traces, notebooks."""
    cols: dict[str, list] = {c: [r.get(c) for r in rows] for c in COLUMNS}
    return to_frame(to_table(cols))


# A stored table's schema metadata: how each column comes back as a frame column (``analyze.store``).
FRAME_KINDS_KEY = b"profkit.columns"


def as_arrow_frame(table: pa.Table, extra: dict[bytes, bytes] | None = None) -> pa.Table:
    """``table`` marked so that ``analyze.store`` reads every column back as an ``ArrowDtype`` column
    (as ``to_frame`` would make it), with ``extra`` metadata beside: an event table written this way
    (the parsed-trace cache's files) is a table the store can hold as it is."""
    meta = dict(table.schema.metadata or {})
    meta.update(extra or {})
    meta[FRAME_KINDS_KEY] = json.dumps({name: "arrow" for name in table.column_names}).encode()
    return table.replace_schema_metadata(meta)


def to_frame(table: pa.Table) -> pd.DataFrame:
    """Arrow table -> DataFrame with Arrow-backed columns (no copies of strings)."""
    return table.cast(ARROW_SCHEMA).to_pandas(types_mapper=pd.ArrowDtype)


def empty_frame() -> pd.DataFrame:
    return to_frame(ARROW_SCHEMA.empty_table())


def validate(df: pd.DataFrame, origin: str = "events") -> None:
    """Raise ValueError if ``df`` does not follow the schema (used by tests and readers)."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{origin}: missing columns {missing}")
    for field in ARROW_SCHEMA:
        dtype = df[field.name].dtype
        if not isinstance(dtype, pd.ArrowDtype) or dtype.pyarrow_dtype != field.type:
            raise ValueError(f"{origin}: column {field.name} has dtype {dtype}, expected {field.type}")
    if len(df) and (df["end_ns"] < df["start_ns"]).any():
        raise ValueError(f"{origin}: events with end_ns < start_ns")
    bad_kinds = set(df["kind"].dropna().unique()) - set(KINDS)
    if bad_kinds:
        raise ValueError(f"{origin}: unknown kinds {sorted(bad_kinds)}")
