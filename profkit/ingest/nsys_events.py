"""SQL for each nsys event table -> one Arrow table of raw events (session-relative ns).

One query per table, joined and filtered in SQLite; names come back as ``StringIds`` ids and are
resolved once per distinct id (``StringTable``), never per row in Python.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from profkit import schema as S
from profkit.errors import TraceError
from profkit.ingest import collectives as C
from profkit.ingest.nsys_db import MAX_TEXT_CHARS, NsysDb, StringTable

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
OSRT_TABLE = "OSRT_API"
EVENT_TABLES = (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, RUNTIME_TABLE, NVTX_TABLE, OSRT_TABLE)
GPU_TABLES = (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE)

# Columns without which a table cannot be mapped at all.
REQUIRED = {
    KERNEL_TABLE: ("start", "end", "globalPid"),
    MEMCPY_TABLE: ("start", "end", "globalPid"),
    MEMSET_TABLE: ("start", "end", "globalPid"),
    RUNTIME_TABLE: ("start", "end", "globalTid"),
    NVTX_TABLE: ("start", "end", "eventType", "globalTid"),
    OSRT_TABLE: ("start", "end", "globalTid"),
}

NVTX_MARK, NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE = 34, 59, 60, 75
DEFAULT_NVTX_CATEGORY = "nvtx"  # NVTX default domain (domainId 0)
NCCL_NVTX_DOMAIN = "NCCL"

PID_OF_GPID = '(("globalPid" >> 24) & 16777215)'
PID_OF_GTID = '(("globalTid" >> 24) & 16777215)'
TID_OF_GTID = '("globalTid" & 16777215)'

# CUPTI copyKind (ENUM_CUDA_MEMCPY_OPER) -> Kineto-like names.
MEMCPY_NAMES = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
                8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}

# NCCL's NVTX domain names ranges after the API call: ncclAllReduce, ncclAlltoAll (not ncclCommInitRank).
_NCCL_NVTX_RE = re.compile(r"^nccl([A-Za-z]+)$")
_COLLECTIVES = frozenset({C.ALL_REDUCE, C.ALL_GATHER, C.REDUCE_SCATTER, C.ALL_TO_ALL, C.BROADCAST, C.SEND_RECV,
                          "reduce", "send", "recv"})


def kernel_coll_name(name: str | None) -> str | None:
    """Shared vocabulary (``collectives.coll_from_kernel``); tolerates a demangled ``void `` prefix."""
    if not name:
        return None
    return C.coll_from_kernel(name[5:] if name.startswith("void ") else name)


def nvtx_coll_name(name: str | None) -> str | None:
    m = _NCCL_NVTX_RE.match(name or "")
    coll = C.normalize_coll_name(m.group(1)) if m else None
    return coll if coll in _COLLECTIVES else None


def map_unique(names: pa.Array | pa.ChunkedArray, fn) -> pa.Array:
    """Apply ``fn`` to each distinct string once (traces repeat a few names millions of times)."""
    if len(names) == 0:
        return pa.array([], pa.string())
    encoded = pc.dictionary_encode(names)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    mapped = pa.array([fn(v) for v in encoded.dictionary.to_pylist()], type=pa.string())
    return pc.take(mapped, encoded.indices)


RAW_SCHEMA = pa.schema([
    ("kind", pa.string()), ("name", pa.string()), ("category", pa.string()),
    ("start_rel", pa.int64()), ("end_rel", pa.int64()), ("device", pa.int32()),
    ("stream", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()),
    ("correlation", pa.int64()), ("coll_name", pa.string()), ("bytes", pa.int64()),
])


@dataclass
class RawEvents:
    """All mapped events of one file, plus what the reader should tell the user."""

    table: pa.Table
    tables_read: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # file-level
    unclosed_nvtx_by_pid: dict[int, int] = field(default_factory=dict)


def _name_ref(db: NsysDb, table: str, candidates: tuple[str, ...]) -> str:
    cols = [f'"{c}"' for c in candidates if db.has(table, c)]
    if not cols:
        return "NULL"
    return cols[0] if len(cols) == 1 else f"COALESCE({', '.join(cols)})"


def _split_ref(ref: str) -> str:
    """A name column may hold a StringIds id (every known schema) or, defensively, the text."""
    return (f"CASE WHEN typeof({ref}) = 'integer' THEN {ref} END AS name_id, "
            f"CASE WHEN typeof({ref}) = 'text' THEN substr({ref}, 1, {MAX_TEXT_CHARS}) END AS name_text")


_REF_SCHEMA = [("name_id", pa.int64()), ("name_text", pa.string())]


def _schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema(list(fields))


class _Planner:
    """Builds each table's query once, so the name ids can be collected before fetching."""

    def __init__(self, db: NsysDb):
        self.db = db
        kernel_ref = _name_ref(db, KERNEL_TABLE, ("demangledName", "shortName", "mangledName"))
        self.refs = {
            KERNEL_TABLE: kernel_ref,
            RUNTIME_TABLE: _name_ref(db, RUNTIME_TABLE, ("nameId",)),
            OSRT_TABLE: _name_ref(db, OSRT_TABLE, ("nameId",)),
            NVTX_TABLE: _name_ref(db, NVTX_TABLE, ("textId",)),
        }

    def id_queries(self, tables: list[str]) -> list[str]:
        out = []
        for t in tables:
            ref = self.refs.get(t)
            if ref and ref != "NULL":
                out.append(f'SELECT DISTINCT {ref} FROM "{t}" WHERE typeof({ref}) = \'integer\'')
        return out

    def needs_strings(self, tables: list[str]) -> list[str]:
        """Tables whose rows name events through StringIds ids (an error if StringIds is absent)."""
        needs = []
        for t in tables:
            ref = self.refs.get(t)
            if ref and ref != "NULL":
                rows = self.db.scalar_rows(f'SELECT 1 FROM "{t}" WHERE typeof({ref}) = \'integer\' LIMIT 1')
                if rows:
                    needs.append(t)
        return needs


def _gpu_query(db: NsysDb, table: str, extra: str) -> str:
    return (f'SELECT "start", "end", {db.col(table, "deviceId")}, {db.col(table, "streamId")}, '
            f'{db.col(table, "correlationId")}, {PID_OF_GPID}, {extra} FROM "{table}"')


_GPU_SCHEMA = [("start_rel", pa.int64()), ("end_rel", pa.int64()), ("device", pa.int32()),
               ("stream", pa.int64()), ("correlation", pa.int64()), ("pid", pa.int64())]


def _const(value: str | None, n: int) -> pa.Array:
    """``n`` times ``value`` (a string column of one value: never a Python list of it)."""
    return pa.repeat(pa.scalar(value, pa.string()), n) if value is not None else pa.nulls(n, pa.string())


def _finish(tbl: pa.Table, kind: str, category: str, name: pa.Array, **cols: pa.Array) -> pa.Table:
    """Shape a per-table result into RAW_SCHEMA (absent columns become nulls)."""
    n = tbl.num_rows
    out = {"kind": _const(kind, n), "name": name, "category": _const(category, n)}
    for f in RAW_SCHEMA:
        if f.name in out:
            continue
        if f.name in cols:
            out[f.name] = cols[f.name]
        elif f.name in tbl.column_names:
            out[f.name] = tbl[f.name]
        else:
            out[f.name] = pa.nulls(n, f.type)
    return pa.table([_as_array(out[f.name], f.type) for f in RAW_SCHEMA], schema=RAW_SCHEMA)


def _as_array(values, typ: pa.DataType) -> pa.Array:
    """``pa.array(values, type=typ)``; an Arrow array of that type as it is (not value by value)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)) and values.type == typ:
        return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return pa.array(values, type=typ)


def _resolved(strings: StringTable, tbl: pa.Table) -> pa.Array:
    return pc.coalesce(strings.lookup(tbl["name_id"]), tbl["name_text"])


def _kernels(db: NsysDb, plan: _Planner, strings: StringTable) -> pa.Table:
    ref = plan.refs[KERNEL_TABLE]
    tbl = db.fetch_table(_gpu_query(db, KERNEL_TABLE, _split_ref(ref)), _schema(*_GPU_SCHEMA, *_REF_SCHEMA))
    names = _resolved(strings, tbl)
    return _finish(tbl, S.KERNEL, KERNEL_TABLE, names, coll_name=map_unique(names, kernel_coll_name))


def _memcpy(db: NsysDb) -> pa.Table:
    cases = " ".join(f"WHEN {k} THEN 'Memcpy {v}'" for k, v in MEMCPY_NAMES.items())
    kind_col = db.col(MEMCPY_TABLE, "copyKind")
    extra = f"{db.col(MEMCPY_TABLE, 'bytes')}, CASE {kind_col} {cases} ELSE 'Memcpy' END"
    tbl = db.fetch_table(_gpu_query(db, MEMCPY_TABLE, extra),
                         _schema(*_GPU_SCHEMA, ("bytes", pa.int64()), ("name", pa.string())))
    return _finish(tbl, S.MEMCPY, MEMCPY_TABLE, tbl["name"])


def _memset(db: NsysDb) -> pa.Table:
    tbl = db.fetch_table(_gpu_query(db, MEMSET_TABLE, db.col(MEMSET_TABLE, "bytes")),
                         _schema(*_GPU_SCHEMA, ("bytes", pa.int64())))
    return _finish(tbl, S.MEMSET, MEMSET_TABLE, _const("Memset", tbl.num_rows))


_HOST_SCHEMA = [("start_rel", pa.int64()), ("end_rel", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64())]


def _runtime(db: NsysDb, plan: _Planner, strings: StringTable) -> pa.Table:
    ref = plan.refs[RUNTIME_TABLE]
    sql = (f'SELECT "start", "end", {PID_OF_GTID}, {TID_OF_GTID}, {db.col(RUNTIME_TABLE, "correlationId")}, '
           f'{_split_ref(ref)} FROM "{RUNTIME_TABLE}"')
    tbl = db.fetch_table(sql, _schema(*_HOST_SCHEMA, ("correlation", pa.int64()), *_REF_SCHEMA))
    # cudaLaunchKernel_v7000 -> cudaLaunchKernel: the name Kineto and analyzers use.
    names = pc.replace_substring_regex(_resolved(strings, tbl), r"_v\d+$", "")
    return _finish(tbl, S.RUNTIME, RUNTIME_TABLE, names)


def _osrt(db: NsysDb, plan: _Planner, strings: StringTable) -> pa.Table:
    ref = plan.refs[OSRT_TABLE]
    sql = f'SELECT "start", "end", {PID_OF_GTID}, {TID_OF_GTID}, {_split_ref(ref)} FROM "{OSRT_TABLE}"'
    tbl = db.fetch_table(sql, _schema(*_HOST_SCHEMA, *_REF_SCHEMA))
    return _finish(tbl, S.OSRT, OSRT_TABLE, _resolved(strings, tbl))


def _nvtx_domain_sql(db: NsysDb) -> str:
    text = f"substr(CAST(d.\"text\" AS TEXT), 1, {MAX_TEXT_CHARS})" if db.has(NVTX_TABLE, "text") else "NULL"
    if db.has(NVTX_TABLE, "textId") and db.has("StringIds", "id", "value"):
        join = 'LEFT JOIN "StringIds" s ON s.id = d."textId"'
        text = f"COALESCE({text}, substr(CAST(s.value AS TEXT), 1, {MAX_TEXT_CHARS}))"
    else:
        join = ""
    return (f'SELECT ((d."globalTid" >> 24) & 16777215) AS dpid, d."domainId" AS did, MIN({text}) AS dname '
            f'FROM "{NVTX_TABLE}" d {join} WHERE d."eventType" = {NVTX_DOMAIN_CREATE} GROUP BY 1, 2')


def _nvtx(db: NsysDb, plan: _Planner, strings: StringTable) -> tuple[pa.Table, dict[int, int], int]:
    has_domain = db.has(NVTX_TABLE, "domainId")
    domain = 'COALESCE(n."domainId", 0)' if has_domain else "0"
    if has_domain:
        with_dom = f"WITH dom AS ({_nvtx_domain_sql(db)}) "
        dom_join = 'LEFT JOIN dom ON dom.dpid = ((n."globalTid" >> 24) & 16777215) AND dom.did = n."domainId"'
        dom_name = "dom.dname"
    else:
        with_dom, dom_join, dom_name = "", "", "NULL"
    text = 'CAST(n."text" AS TEXT)' if db.has(NVTX_TABLE, "text") else "NULL"
    ref = plan.refs[NVTX_TABLE].replace('"textId"', 'n."textId"')
    pid = '((n."globalTid" >> 24) & 16777215)'
    tid = '(n."globalTid" & 16777215)'
    ranges = f"{NVTX_PUSH_POP}, {NVTX_START_END}"
    sql = (f'{with_dom}SELECT n."start", CASE WHEN n."eventType" = {NVTX_MARK} THEN n."start" ELSE n."end" END, '
           f'{pid}, {tid}, n."eventType", {domain}, {dom_name}, substr({text}, 1, {MAX_TEXT_CHARS}), '
           f'length({text}) > {MAX_TEXT_CHARS}, '
           f'CASE WHEN typeof({ref}) = \'integer\' THEN {ref} END '
           f'FROM "{NVTX_TABLE}" n {dom_join} '
           f'WHERE n."eventType" = {NVTX_MARK} OR (n."eventType" IN ({ranges}) AND n."end" IS NOT NULL)')
    tbl = db.fetch_table(sql, _schema(*_HOST_SCHEMA, ("event_type", pa.int64()), ("domain_id", pa.int64()),
                                      ("domain_name", pa.string()), ("name_text", pa.string()),
                                      ("text_cut", pa.int64()), ("name_id", pa.int64())))
    unclosed = db.scalar_rows(f'SELECT {PID_OF_GTID}, count(*) FROM "{NVTX_TABLE}" '
                              f'WHERE "eventType" IN ({ranges}) AND "end" IS NULL GROUP BY 1')
    unclosed_by_pid = {int(p): int(c) for p, c in unclosed if p is not None}
    names = pc.coalesce(tbl["name_text"], strings.lookup(tbl["name_id"]))
    default = pa.scalar(DEFAULT_NVTX_CATEGORY)
    unnamed = pc.binary_join_element_wise("nvtx_domain_", pc.cast(tbl["domain_id"], pa.string()), "")
    category = pc.if_else(pc.equal(tbl["domain_id"], 0), default, pc.coalesce(tbl["domain_name"], unnamed))
    is_mark = pc.equal(tbl["event_type"], NVTX_MARK)
    kind = pc.if_else(is_mark, pa.scalar(S.INSTANT), pa.scalar(S.CPU_SPAN))
    in_nccl = pc.fill_null(pc.equal(category, NCCL_NVTX_DOMAIN), False)
    coll = pc.if_else(in_nccl, map_unique(names, nvtx_coll_name), pa.scalar(None, pa.string()))
    out = _finish(tbl, S.CPU_SPAN, NVTX_TABLE, names, coll_name=coll)
    out = out.set_column(out.schema.get_field_index("kind"), "kind", kind)
    out = out.set_column(out.schema.get_field_index("category"), "category", category)
    cut = int(pc.sum(tbl["text_cut"]).as_py() or 0)
    return out, unclosed_by_pid, cut


def read_raw_events(db: NsysDb) -> RawEvents:
    """Every mappable event of the file. Raises TraceError only when nothing is usable."""
    result = RawEvents(table=RAW_SCHEMA.empty_table())
    usable = []
    for t in EVENT_TABLES:
        if t not in db.columns:
            continue
        missing = db.missing_columns(t, REQUIRED[t])
        if missing:
            result.warnings.append(f"table {t} lacks columns {missing}: skipped")
            continue
        usable.append(t)
    if not usable:
        present = sorted(t for t in db.columns if not t.startswith("ENUM_"))[:20]
        raise TraceError(db.path, f"no usable nsys event tables: expected any of {list(EVENT_TABLES)}; "
                                  f"found {present}")
    plan = _Planner(db)
    needs = plan.needs_strings(usable)
    if needs and not db.has("StringIds", "id", "value"):
        raise TraceError(db.path, f"table StringIds is missing, but {needs} name events through it")
    strings = StringTable.load(db, plan.id_queries(usable))
    parts = []
    for t in usable:
        if t == KERNEL_TABLE:
            parts.append(_kernels(db, plan, strings))
        elif t == MEMCPY_TABLE:
            parts.append(_memcpy(db))
        elif t == MEMSET_TABLE:
            parts.append(_memset(db))
        elif t == RUNTIME_TABLE:
            parts.append(_runtime(db, plan, strings))
        elif t == OSRT_TABLE:
            parts.append(_osrt(db, plan, strings))
        elif t == NVTX_TABLE:
            tbl, result.unclosed_nvtx_by_pid, cut = _nvtx(db, plan, strings)
            parts.append(tbl)
            if cut:
                result.warnings.append(f"{cut} NVTX texts longer than {MAX_TEXT_CHARS} characters were cut")
    if strings.missing:
        result.warnings.append(f"{strings.missing} events name StringIds ids that do not exist: names left empty")
    if strings.truncated:
        result.warnings.append(f"{strings.truncated} names longer than {MAX_TEXT_CHARS} characters were cut")
    result.tables_read = usable
    result.table = pa.concat_tables(parts) if parts else RAW_SCHEMA.empty_table()
    return result
