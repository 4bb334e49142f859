"""Nsight Systems reader: an ``nsys export --type sqlite`` file -> one RankPart per GPU process.

One export often holds several ranks (``nsys profile`` around a whole multi-process job), so the
file is split by OS process: every process with GPU work (kernels, memcpy, memset) is a part.
CPU-only processes (vLLM's ``EngineCore_DP{n}`` scheduler, the launcher) are attached to the part
whose rank they reveal (mapping or metadata), or to the only GPU process of the file; otherwise
their events are dropped and the warning says so. Warnings about the whole file are on the first part
only (the loader prints every part's warnings). ``TARGET_INFO_SYSTEM_ENV`` and
``META_DATA_CAPTURE`` hold the captured environment (secrets included) and are never read.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from profkit import schema as S
from profkit.errors import TraceError
from profkit.ingest.base import RankPart
from profkit.ingest.nsys_db import MAX_TEXT_CHARS, NsysDb, is_nsys_sqlite, open_nsys_db
from profkit.ingest.nsys_events import EVENT_TABLES, RawEvents, read_raw_events
from profkit.ingest.nsys_ranks import ProcessFacts, RankDecision, assign_ranks, metadata_rank, nvtx_rank_claims
from profkit.ingest.nsys_rep import export_to_sqlite

__all__ = ["read_nsys", "read_nsys_rep", "is_nsys_sqlite"]

SOURCE = "nsys"
REP_SUFFIXES = (".nsys-rep", ".qdrep")
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # 2023+ name, then 2022-era name
META_KEYS = {"EXPORT_PRODUCT_VERSION": "nsys_version", "EXPORT_SCHEMA_VERSION": "nsys_schema_version",
             "EXPORT_PLATFORM": "export_platform"}  # never user, host or paths
CONTEXT_TABLES = ("StringIds", "PROCESSES", "ThreadNames", "TARGET_INFO_SESSION_START_TIME",
                  "TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE")


def read_nsys(path: str | Path, *, pid_to_rank: dict[int, int] | None = None) -> list[RankPart]:
    """Read an nsys SQLite export (or a ``.nsys-rep`` via ``read_nsys_rep``) into RankParts."""
    p = Path(path)
    if p.suffix in REP_SUFFIXES:
        return read_nsys_rep(p, pid_to_rank=pid_to_rank)
    return _read(p, p, pid_to_rank)


def read_nsys_rep(path: str | Path, *, pid_to_rank: dict[int, int] | None = None) -> list[RankPart]:
    """Export a ``.nsys-rep`` with the user's nsys (cached), then read the SQLite file."""
    rep = Path(path)
    sqlite_path = export_to_sqlite(rep)
    try:
        parts = _read(sqlite_path, rep, pid_to_rank)
    except TraceError as exc:
        raise TraceError(rep, f"export {sqlite_path.name}: {exc.problem}") from exc
    for part in parts:
        part.meta["exported_sqlite"] = str(sqlite_path)
    return parts


# -- file-level facts --------------------------------------------------------------------------
@dataclass
class FileFacts:
    clock_origin: str  # utc_epoch | utc_seconds | session
    utc_epoch_ns: int | None
    meta: dict[str, Any]
    warnings: list[str]


def _clock(db: NsysDb, warnings: list[str]) -> tuple[str, int | None]:
    table = "TARGET_INFO_SESSION_START_TIME"
    if db.has(table, "utcEpochNs"):
        rows = db.scalar_rows(f'SELECT "utcEpochNs" FROM "{table}" WHERE "utcEpochNs" IS NOT NULL LIMIT 1')
        if rows and isinstance(rows[0][0], int) and 0 < rows[0][0] < (1 << 62):
            return "utc_epoch", int(rows[0][0])
    if db.has(table, "utcTime"):
        rows = db.scalar_rows(f'SELECT "utcTime" FROM "{table}" WHERE "utcTime" IS NOT NULL LIMIT 1')
        try:
            start = datetime.fromisoformat(str(rows[0][0])).replace(tzinfo=timezone.utc) if rows else None
        except ValueError:
            start = None
        if start is not None:
            warnings.append("session start known to the second only (utcTime, no utcEpochNs)")
            return "utc_seconds", int(start.timestamp()) * 1_000_000_000
    warnings.append("no session start time (TARGET_INFO_SESSION_START_TIME.utcEpochNs): "
                    "times are ns since the capture started, not UTC")
    return "session", None


def _file_facts(db: NsysDb) -> FileFacts:
    warnings: list[str] = []
    origin, utc = _clock(db, warnings)
    meta: dict[str, Any] = {"clock_origin": origin, "utc_epoch_ns": utc}
    for table in META_TABLES:
        if db.has(table, "name", "value"):
            keys = ", ".join(f"'{k}'" for k in META_KEYS)
            for name, value in db.scalar_rows(f'SELECT "name", "value" FROM "{table}" WHERE "name" IN ({keys})'):
                meta[META_KEYS[name]] = str(value)[:200]
            break
    gpu_cols = [c for c in ("id", "name", "busLocation", "uuid") if db.has("TARGET_INFO_GPU", c)]
    if gpu_cols:
        sel = ", ".join('CAST("id" AS INTEGER)' if c == "id" else f'substr(CAST("{c}" AS TEXT), 1, 200)'
                        for c in gpu_cols)
        rows = db.scalar_rows(f'SELECT {sel} FROM "TARGET_INFO_GPU" ORDER BY 1 LIMIT 256')
        meta["gpus"] = [dict(zip(("id" if c == "id" else _snake(c) for c in gpu_cols), r)) for r in rows]
    wanted = list(EVENT_TABLES) + list(CONTEXT_TABLES)
    meta["tables_present"] = [t for t in wanted if t in db.columns] + [t for t in META_TABLES if t in db.columns]
    meta["tables_missing"] = [t for t in wanted if t not in db.columns]
    if not any(t in db.columns for t in META_TABLES):
        meta["tables_missing"].append(" | ".join(META_TABLES))
    return FileFacts(origin, utc, meta, warnings)


def _snake(name: str) -> str:
    return "".join("_" + ch.lower() if ch.isupper() else ch for ch in name)


def _process_facts(db: NsysDb, pids: list[int]) -> dict[int, ProcessFacts]:
    facts = {pid: ProcessFacts(pid) for pid in pids}
    if not pids:
        return facts
    if db.has("PROCESSES", "pid", "name"):
        for pid, name in db.scalar_rows('SELECT "pid", substr(CAST("name" AS TEXT), 1, 256) FROM "PROCESSES"'):
            if isinstance(pid, int) and pid in facts and name:
                facts[pid].process_name = name
    if db.has("ThreadNames", "nameId", "globalTid") and db.has("StringIds", "id", "value"):
        sql = ('SELECT ((t."globalTid" >> 24) & 16777215), substr(CAST(s.value AS TEXT), 1, 256) '
               'FROM "ThreadNames" t JOIN "StringIds" s ON s.id = t."nameId" '
               'WHERE (t."globalTid" & 16777215) = ((t."globalTid" >> 24) & 16777215)')
        for pid, name in db.scalar_rows(sql):
            f = facts.get(pid) if isinstance(pid, int) else None
            if f is not None and name and len(name) > len(f.thread_name or ""):
                f.thread_name = name
    return facts


def _cuda_devices(db: NsysDb) -> dict[int, dict[str, int]]:
    """pid -> {CUDA device id: GPU id} (2023+ exports; helps when CUDA_VISIBLE_DEVICES differs)."""
    if not db.has("TARGET_INFO_CUDA_DEVICE", "gpuId", "cudaId", "pid"):
        return {}
    out: dict[int, dict[str, int]] = {}
    for gpu, cuda, pid in db.scalar_rows('SELECT DISTINCT "gpuId", "cudaId", "pid" FROM "TARGET_INFO_CUDA_DEVICE"'):
        if isinstance(pid, int) and isinstance(cuda, int) and isinstance(gpu, int):
            out.setdefault(pid, {})[str(cuda)] = gpu
    return out


# -- events -> parts ---------------------------------------------------------------------------
def _clean(raw: RawEvents, origin_ns: int, path: Path, warnings: list[str]) -> pa.Table:
    """Drop rows that cannot be placed on the timeline; add the UTC origin (int64, checked)."""
    t = raw.table
    ok = pc.and_(pc.is_valid(t["start_rel"]), pc.is_valid(t["end_rel"]))
    ok = pc.and_(ok, pc.is_valid(t["pid"]))
    ok = pc.and_(ok, pc.fill_null(pc.greater_equal(t["end_rel"], t["start_rel"]), False))
    dropped = t.num_rows - int(pc.sum(pc.cast(ok, pa.int64())).as_py() or 0)
    if dropped:
        warnings.append(f"{dropped} events without start/end/process, or ending before they start: dropped")
        t = t.filter(ok)
    try:
        start = pc.add_checked(t["start_rel"], pa.scalar(origin_ns, pa.int64()))
        end = pc.add_checked(t["end_rel"], pa.scalar(origin_ns, pa.int64()))
    except pa.ArrowInvalid as exc:
        raise TraceError(path, f"timestamps overflow int64 ns after adding the session start ({exc})") from exc
    t = t.append_column("start_ns", start).append_column("end_ns", end)
    return t.drop_columns(["start_rel", "end_rel"])


def _gpu_pids(events: pa.Table) -> dict[int, int | None]:
    """pid -> lowest device id it used, for processes with kernels / memcpy / memset."""
    gpu = events.filter(pc.is_in(events["kind"], pa.array(list(S.GPU_KINDS))))
    if gpu.num_rows == 0:
        return {}
    agg = gpu.group_by("pid").aggregate([("device", "min")]).to_pylist()
    return {int(r["pid"]): r["device_min"] for r in agg}


def _to_part_table(events: pa.Table) -> pa.Table:
    events = events.sort_by([("start_ns", "ascending"), ("end_ns", "descending")])
    cols = {c: events[c] for c in S.COLUMNS if c in events.column_names}
    cols["source"] = pa.repeat(pa.scalar(SOURCE, pa.string()), events.num_rows)
    return S.to_table(cols)


def _read(path: Path, label: Path, pid_to_rank: dict[int, int] | None) -> list[RankPart]:
    try:
        with open_nsys_db(path) as db:
            if not any(t in db.columns for t in ("StringIds", "PROCESSES") + EVENT_TABLES + META_TABLES):
                raise TraceError(path, "SQLite file is not an Nsight Systems export: none of the tables "
                                       f"{['StringIds', 'PROCESSES', *EVENT_TABLES]} exist")
            return _read_db(db, label, pid_to_rank)
    except TraceError as exc:
        if exc.path != str(label):
            raise TraceError(label, exc.problem) from exc
        raise
    except (sqlite3.Error, pa.ArrowException, OverflowError) as exc:
        raise TraceError(label, f"unreadable nsys export ({type(exc).__name__}: {exc})") from exc


def _read_db(db: NsysDb, label: Path, pid_to_rank: dict[int, int] | None) -> list[RankPart]:
    facts = _file_facts(db)
    file_warnings = list(facts.warnings)
    raw = read_raw_events(db)
    file_warnings += raw.warnings
    events = _clean(raw, facts.utc_epoch_ns or 0, label, file_warnings)
    if events.num_rows == 0:
        raise TraceError(label, f"no events: tables {raw.tables_read} hold no rows that can be mapped")

    gpu = _gpu_pids(events)
    all_pids = sorted(int(p) for p in pc.unique(events["pid"]).to_pylist())
    procs = _process_facts(db, all_pids)
    for pid, ranks in nvtx_rank_claims(events).items():
        if pid in procs:
            procs[pid].nvtx_ranks = ranks
    for pid, dev in gpu.items():
        procs[pid].min_device = dev
    primary_pids = sorted(gpu)
    if not primary_pids:
        hosts = events.filter(pc.is_in(events["kind"], pa.array([S.RUNTIME, S.CPU_SPAN, S.INSTANT])))
        primary_pids = sorted(int(p) for p in pc.unique(hosts["pid"]).to_pylist()) or all_pids
        file_warnings.append("no GPU activity (kernels, memcpy, memset) in the file: one part per process "
                             "with NVTX or CUDA runtime events")
    decisions = assign_ranks([procs[p] for p in primary_pids], pid_to_rank, file_warnings)
    members, part_warnings = _attach_cpu_only(procs, primary_pids, decisions, pid_to_rank, events, file_warnings)

    cuda_map = _cuda_devices(db)
    parts = []
    for pid in primary_pids:
        group = members[pid]
        keep = pc.is_in(events["pid"], pa.array(sorted(group), pa.int64()))
        sub = events if pc.all(keep).as_py() else events.filter(keep)  # one part of every row: no copy
        d = decisions[pid]
        meta = dict(facts.meta)
        meta.update(_part_meta(pid, procs, group, sub, d, primary_pids, cuda_map))
        warnings = list(part_warnings[pid])
        for member in sorted(group):
            n = raw.unclosed_nvtx_by_pid.get(member, 0)
            if n:
                warnings.append(f"pid {member}: {n} NVTX ranges never closed (end is NULL): dropped")
        parts.append(RankPart(path=str(label), source=SOURCE, table=_to_part_table(sub), rank=d.rank,
                              rank_origin=d.origin, key=f"pid={pid}", meta=meta, warnings=warnings))
    parts.sort(key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0, p.key))
    parts[0].warnings[:0] = file_warnings  # file-level facts: said once, on the first part
    return parts


def _attach_cpu_only(procs: dict[int, ProcessFacts], primary_pids: list[int],
                     decisions: dict[int, RankDecision], pid_to_rank: dict[int, int] | None,
                     events: pa.Table, file_warnings: list[str]
                     ) -> tuple[dict[int, dict[int, str]], dict[int, list[str]]]:
    """Group each CPU-only process with the GPU process of its rank; say what was dropped."""
    members: dict[int, dict[int, str]] = {p: {p: "GPU process"} for p in primary_pids}
    part_warnings: dict[int, list[str]] = {p: [] for p in primary_pids}
    by_rank = {d.rank: pid for pid, d in decisions.items() if d.rank is not None}
    counts = dict(zip(*[c.to_pylist() for c in pc.value_counts(events["pid"]).flatten()]))
    mapping = pid_to_rank or {}
    for pid in sorted(set(procs) - set(primary_pids)):
        f = procs[pid]
        label = f"pid {pid} ({f.thread_name or f.process_name or 'unnamed'})"
        if pid in mapping:
            rank, why = int(mapping[pid]), f"pid_to_rank[{pid}]"
        else:
            rank, why = metadata_rank(f, file_warnings)
        if rank is not None and rank in by_rank:
            target = by_rank[rank]
            members[target][pid] = f"rank {rank} from {why}"
            if decisions[target].origin == "order":
                part_warnings[target].append(f"{label} attached by rank {rank}, but this part's rank is only "
                                             "guessed from device order")
        elif rank is None and len(primary_pids) == 1:
            members[primary_pids[0]][pid] = "CPU-only process of a file with one GPU process"
        else:
            reason = f"its rank {rank} ({why}) matches no GPU process" if rank is not None \
                else "it has no GPU work and no rank in its name or NVTX, and the file holds several GPU processes"
            file_warnings.append(f"{label}: {counts.get(pid, 0)} CPU events dropped: {reason}")
    return members, part_warnings


def _part_meta(pid: int, procs: dict[int, ProcessFacts], group: dict[int, str], sub: pa.Table,
               d: RankDecision, primary_pids: list[int], cuda_map: dict[int, dict[str, int]]) -> dict[str, Any]:
    f = procs[pid]
    gpu = sub.filter(pc.is_valid(sub["device"]))
    devices = sorted(int(x) for x in pc.unique(gpu["device"]).to_pylist())
    kinds = pc.value_counts(sub["kind"]).flatten()
    return {
        "pid": pid,
        "process_name": f.process_name,
        "thread_name": f.thread_name,
        "attached_pids": {str(p): {"process_name": procs[p].process_name, "thread_name": procs[p].thread_name,
                                   "reason": why} for p, why in sorted(group.items()) if p != pid},
        "devices": devices,
        "cuda_device_to_gpu": cuda_map.get(pid, {}),
        "gpu_pids_in_file": list(primary_pids),
        "rank_evidence": d.evidence,
        "event_counts": dict(zip(kinds[0].to_pylist(), kinds[1].to_pylist())),
        "max_text_chars": MAX_TEXT_CHARS,
    }
