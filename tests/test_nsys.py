"""Nsight Systems SQLite reader: real 2022-era exports (extra-p/extrap, BSD-3-Clause, see
../shared/traces/nsys/LICENSE), synthetic exports in the 2025.3 schema (table and column names
copied from a real 2025.3.2 export made on the lent H200s), and hostile input."""
from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import stat
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profkit.errors import TraceError
from profkit.ingest import nsys_db
from profkit.ingest.nsys import is_nsys_sqlite, read_nsys, read_nsys_rep
from profkit.ingest.nsys_events import kernel_coll_name, nvtx_coll_name
from profkit.ingest.nsys_ranks import rank_from_name
from profkit.schema import to_frame, validate

REAL_FILES = ("con_kernel.sqlite", "profile1.sqlite", "profile16.sqlite")
SECRET = "hunter2-SECRET-TOKEN-5f1c9a"
REPO = Path(__file__).resolve().parents[1]


# -- helpers -----------------------------------------------------------------------------------
def sql(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def frame(parts):
    frames = [to_frame(p.table) for p in parts]
    for p, df in zip(parts, frames):
        validate(df, p.label)
    import pandas as pd
    return pd.concat(frames, ignore_index=True)


def writable_copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    os.chmod(dst, stat.S_IRUSR | stat.S_IWUSR)
    return dst


def everything_as_text(parts) -> str:
    """Every string the reader returns: all table cells, meta and warnings."""
    chunks = []
    for p in parts:
        for col in p.table.columns:
            chunks.extend(str(v) for v in col.to_pylist() if v is not None)
        chunks.append(json.dumps(p.meta, default=str))
        chunks.extend(p.warnings)
        chunks.append(p.key)
    return "\n".join(chunks)


# -- a synthetic export in the nsys 2025.3 schema ----------------------------------------------
VM_BITS = 1 << 48  # <HwId:8><VmId:8><Pid:24><Tid:24>, as a real 2025.3 export on one host


def gpid(pid: int) -> int:
    return VM_BITS | (pid << 24)


def gtid(pid: int, tid: int) -> int:
    return gpid(pid) | tid


DDL_2025 = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT",
    "META_DATA_EXPORT": "name TEXT, value TEXT",
    "META_DATA_CAPTURE": "name TEXT, value TEXT",
    "TARGET_INFO_SYSTEM_ENV": "globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL, "
                              "nameEnum INTEGER NOT NULL, value TEXT NOT NULL",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "TARGET_INFO_GPU": "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, uuid TEXT, "
                       "cuDevice INTEGER",
    "TARGET_INFO_CUDA_DEVICE": "gpuId INTEGER, cudaId INTEGER NOT NULL, pid INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
                                  "correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, "
                                  "shortName INTEGER NOT NULL, mangledName INTEGER, gridX INTEGER, "
                                  "graphNodeId INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
                                  "correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, "
                                  "copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER, copyCount INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMSET": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
                                  "correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, "
                                  "bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
                                   "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
                                   "returnValue INTEGER NOT NULL, callchainId INTEGER",
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
                   "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
                   "textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, "
                   "doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, "
                   "jsonTextId INTEGER, jsonText TEXT, binaryData TEXT",
    "OSRT_API": "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, "
                "nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, nestingLevel INTEGER, "
                "callchainId INTEGER NOT NULL",
}
UTC0 = 1_795_971_390_145_685_882


class SynthNsys:
    """Rows for a small nsys export; ``write`` lays them out in one schema variant."""

    def __init__(self):
        self.strings: dict[str, int] = {}
        self.rows: dict[str, list[dict]] = {t: [] for t in DDL_2025}
        self.rows["TARGET_INFO_SESSION_START_TIME"].append(
            {"utcEpochNs": UTC0, "utcTime": "2026-11-29T16:56:30", "localTime": "2026-11-29T16:56:30"})
        for k, v in (("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_PRODUCT_VERSION", "2025.3.2.0"),
                     ("EXPORT_SCHEMA_VERSION", "3.20.3"), ("EXPORT_PLATFORM", "linux-desktop"),
                     ("EXPORT_USER", "alice"), ("EXPORT_PARAM_INPUT_PATH", "/home/alice/secret-project/x.nsys-rep")):
            self.rows["META_DATA_EXPORT"].append({"name": k, "value": v})
        self.rows["TARGET_INFO_SYSTEM_ENV"].append(
            {"globalVid": VM_BITS, "devStateName": "", "name": "Hostname", "nameEnum": 19, "value": "vm"})

    def sid(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings))

    def process(self, pid: int, name: str = "python3", thread_name: str | None = None, gpu: int | None = None):
        self.rows["PROCESSES"].append({"globalPid": gpid(pid), "pid": pid, "name": name})
        if thread_name:
            self.rows["ThreadNames"].append({"nameId": self.sid(thread_name), "priority": 20,
                                             "globalTid": gtid(pid, pid)})
        if gpu is not None:
            self.rows["TARGET_INFO_CUDA_DEVICE"].append({"gpuId": gpu, "cudaId": gpu, "pid": pid})

    def gpu(self, gid: int, name: str = "NVIDIA H200"):
        self.rows["TARGET_INFO_GPU"].append({"vmId": VM_BITS, "id": gid, "name": name,
                                             "busLocation": f"0000:00:0{6 + gid}.0", "uuid": f"uuid-{gid}",
                                             "cuDevice": gid})

    def kernel(self, pid, device, name, start, end, corr, stream=7):
        self.rows["CUPTI_ACTIVITY_KIND_KERNEL"].append({
            "start": start, "end": end, "deviceId": device, "contextId": 1, "greenContextId": 0,
            "streamId": stream, "correlationId": corr, "globalPid": gpid(pid), "demangledName": self.sid(name),
            "shortName": self.sid(name.split("(")[0]), "mangledName": None, "gridX": 1, "graphNodeId": None})

    def runtime(self, pid, tid, name, start, end, corr):
        self.rows["CUPTI_ACTIVITY_KIND_RUNTIME"].append({
            "start": start, "end": end, "eventClass": 1, "globalTid": gtid(pid, tid), "correlationId": corr,
            "nameId": self.sid(name), "returnValue": 0, "callchainId": None})

    def memcpy(self, pid, device, start, end, corr, nbytes, kind=1):
        self.rows["CUPTI_ACTIVITY_KIND_MEMCPY"].append({
            "start": start, "end": end, "deviceId": device, "contextId": 1, "greenContextId": 0, "streamId": 7,
            "correlationId": corr, "globalPid": gpid(pid), "bytes": nbytes, "copyKind": kind,
            "srcKind": 0, "dstKind": 2, "copyCount": 1})

    def memset(self, pid, device, start, end, corr, nbytes):
        self.rows["CUPTI_ACTIVITY_KIND_MEMSET"].append({
            "start": start, "end": end, "deviceId": device, "contextId": 1, "greenContextId": 0, "streamId": 7,
            "correlationId": corr, "globalPid": gpid(pid), "value": 0, "bytes": nbytes, "graphNodeId": None,
            "memKind": 2})

    def nvtx(self, pid, tid, start, end, text=None, *, registered=None, event_type=59, domain=0):
        self.rows["NVTX_EVENTS"].append({
            "start": start, "end": end, "eventType": event_type, "text": text, "globalTid": gtid(pid, tid),
            "textId": self.sid(registered) if registered else None, "domainId": domain})

    def domain(self, pid, tid, domain_id, name, start=1):
        self.nvtx(pid, tid, start, None, name, event_type=75, domain=domain_id)

    def osrt(self, pid, tid, name, start, end):
        self.rows["OSRT_API"].append({"start": start, "end": end, "eventClass": 27, "globalTid": gtid(pid, tid),
                                      "nameId": self.sid(name), "returnValue": 0, "nestingLevel": 0,
                                      "callchainId": 0})

    def write(self, path: Path, variant: str = "2025", page_size: int = 4096) -> Path:
        """variant: 2025 | 2022 (EXPORT_META_DATA, no CUDA_DEVICE / greenContextId / binaryData)
        | no_clock (no TARGET_INFO_SESSION_START_TIME)."""
        ddl = dict(DDL_2025)
        rows = {t: [dict(r) for r in v] for t, v in self.rows.items()}
        if variant == "2022":
            ddl["EXPORT_META_DATA"] = ddl.pop("META_DATA_EXPORT")
            rows["EXPORT_META_DATA"] = rows.pop("META_DATA_EXPORT")
            for t in ("TARGET_INFO_CUDA_DEVICE", "META_DATA_CAPTURE"):
                ddl.pop(t)
                rows.pop(t)
            for t in list(ddl):
                cols = [c for c in ddl[t].split(", ") if not c.startswith(("greenContextId", "binaryData",
                                                                            "copyCount"))]
                ddl[t] = ", ".join(cols)
                keep = {c.split()[0] for c in cols}
                rows[t] = [{k: v for k, v in r.items() if k in keep} for r in rows[t]]
        elif variant == "no_clock":
            ddl.pop("TARGET_INFO_SESSION_START_TIME")
            rows.pop("TARGET_INFO_SESSION_START_TIME")
        rows["StringIds"] = [{"id": i, "value": s} for s, i in self.strings.items()]
        path.unlink(missing_ok=True)
        con = sqlite3.connect(path)
        con.execute(f"PRAGMA page_size = {page_size}")
        for table, cols in ddl.items():
            con.execute(f'CREATE TABLE "{table}" ({cols})')
            for r in rows.get(table, []):
                names = ", ".join(f'"{k}"' for k in r)
                con.execute(f'INSERT INTO "{table}" ({names}) VALUES ({", ".join("?" * len(r))})', list(r.values()))
        con.commit()
        con.close()
        return path


def two_rank_export(*, worker_names=("python3", "python3"), marks=(None, None), engine_thread="EngineCore_DP1",
                    nccl_kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"):
    """Two GPU workers (pid 2001 on GPU 1, pid 2002 on GPU 0), one CPU-only engine process
    (pid 2003) and a launcher (pid 2000, OS runtime calls only). Both workers use the same
    correlation ids, as real processes do."""
    s = SynthNsys()
    s.gpu(0)
    s.gpu(1)
    s.process(2000, thread_name="launcher")
    s.osrt(2000, 2000, "poll", 10, 500)
    for pid, dev, wname, mark in ((2001, 1, worker_names[0], marks[0]), (2002, 0, worker_names[1], marks[1])):
        s.process(pid, name=wname, thread_name="VLLM::Worker_DP", gpu=dev)
        base = 1000 * (pid - 2000)
        for i, kname in enumerate(["void gemm_kernel<128>(float*)", nccl_kernel, "void fill_kernel(float*)"]):
            corr = 100 + i
            s.runtime(pid, pid, "cudaLaunchKernel_v7000", base + 10 * i, base + 10 * i + 5, corr)
            s.kernel(pid, dev, kname, base + 10 * i + 6, base + 10 * i + 9, corr)
        s.runtime(pid, pid, "cudaMemcpyAsync_v3020", base + 40, base + 41, 200)
        s.memcpy(pid, dev, base + 42, base + 50, 200, 4096)
        s.runtime(pid, pid, "cudaMemsetAsync_v3020", base + 51, base + 52, 201)
        s.memset(pid, dev, base + 53, base + 55, 201, 1024)
        s.runtime(pid, pid, "cudaStreamSynchronize_v3020", base + 56, base + 90, 202)
        s.domain(pid, pid, 1, "NCCL")
        s.nvtx(pid, pid, base + 11, base + 20, registered="ncclAllReduce", domain=1)
        s.nvtx(pid, pid, base, base + 95, "step 0")
        s.nvtx(pid, pid + 1, base + 1, base + 3, "start/end range", event_type=60)
        s.nvtx(pid, pid, base + 60, None, "never closed")
        if mark is not None:
            s.nvtx(pid, pid, base + 2, None, mark, event_type=34)
        s.osrt(pid, pid + 2, "futex", base + 5, base + 80)
    s.process(2003, thread_name=engine_thread)
    s.nvtx(2003, 2003, 3000, 3100, "schedule")
    s.nvtx(2003, 2003, 3100, 3150, "ncclAllReduce")  # default domain: not a collective
    s.osrt(2003, 2003, "read", 3000, 3001)
    return s


@pytest.fixture(scope="module")
def synth_dir():
    with tempfile.TemporaryDirectory(prefix="profkit-nsys-") as d:
        yield Path(d)


@pytest.fixture()
def two_rank_db(tmp_path) -> Path:
    return two_rank_export().write(tmp_path / "two_rank.sqlite")


# -- real exports --------------------------------------------------------------------------------
@pytest.fixture(params=REAL_FILES)
def real_file(request, shared_traces) -> Path:
    return shared_traces / "nsys" / request.param


def test_real_file_reads_completely(real_file):
    parts = read_nsys(real_file)
    assert len(parts) == 1
    part = parts[0]
    assert part.source == "nsys" and part.key.startswith("pid=") and part.path == str(real_file)
    assert part.rank is None and part.rank_origin == "unknown"  # one GPU process: the loader decides
    (pid,) = sql(real_file, "SELECT DISTINCT (globalPid >> 24) & 16777215 FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    assert part.key == f"pid={pid}" and part.meta["pid"] == pid
    (utc,) = sql(real_file, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    assert part.meta["clock_origin"] == "utc_epoch" and part.meta["utc_epoch_ns"] == utc
    assert part.meta["nsys_version"] == "2022.1.1.61"
    assert part.meta["gpus"][0]["name"] == "GeForce GTX 1060 with Max-Q Design"
    assert "OSRT_API" in part.meta["tables_missing"]
    json.dumps(part.meta)  # JSON-safe
    df = frame(parts)
    assert (df["source"] == "nsys").all()
    assert df["rank"].isna().all()  # the loader fills it


def test_real_kernels_match_sql(real_file):
    df = frame(read_nsys(real_file))
    k = df[df["kind"] == "kernel"]
    n, dur, first = sql(real_file, 'SELECT count(*), sum("end" - start), min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL')[0]
    (utc,) = sql(real_file, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    assert len(k) == n
    assert int((k["end_ns"] - k["start_ns"]).sum()) == dur
    assert int(k["start_ns"].min()) == utc + first
    names = sql(real_file, "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                           "JOIN StringIds s ON s.id = k.demangledName GROUP BY 1")
    assert dict(k["name"].value_counts()) == dict(names)
    assert k["device"].notna().all() and k["stream"].notna().all() and k["tid"].isna().all()


@pytest.mark.parametrize("kind,table", [("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY"),
                                        ("memset", "CUPTI_ACTIVITY_KIND_MEMSET"),
                                        ("runtime", "CUPTI_ACTIVITY_KIND_RUNTIME")])
def test_real_counts_match_sql(real_file, kind, table):
    df = frame(read_nsys(real_file))
    rows = df[df["kind"] == kind]
    n, dur = sql(real_file, f'SELECT count(*), sum("end" - start) FROM {table}')[0]
    assert len(rows) == n
    assert int((rows["end_ns"] - rows["start_ns"]).sum()) == dur
    if kind != "runtime":
        (nbytes,) = sql(real_file, f"SELECT sum(bytes) FROM {table}")[0]
        assert int(rows["bytes"].sum()) == nbytes
    if kind == "memcpy":
        kinds = dict(sql(real_file, "SELECT copyKind, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1"))
        assert (rows["name"] == "Memcpy HtoD").sum() == kinds.get(1, 0)
        assert (rows["name"] == "Memcpy DtoH").sum() == kinds.get(2, 0)
    if kind == "runtime":
        assert not rows["name"].str.contains(r"_v\d+$").any()  # cudaLaunchKernel_v7000 -> cudaLaunchKernel
        assert rows["tid"].notna().all() and rows["device"].isna().all()


def test_real_nvtx_matches_sql(real_file):
    df = frame(read_nsys(real_file))
    tables = {r[0] for r in sql(real_file, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    spans = df[df["kind"] == "cpu_span"]
    marks = df[df["kind"] == "instant"]
    if "NVTX_EVENTS" not in tables:
        assert spans.empty and marks.empty
        return
    (n_ranges,) = sql(real_file, 'SELECT count(*) FROM NVTX_EVENTS '
                                 'WHERE eventType IN (59, 60) AND "end" IS NOT NULL')[0]
    (n_marks,) = sql(real_file, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 34")[0]
    assert len(spans) == n_ranges and len(marks) == n_marks
    (domain,) = sql(real_file, "SELECT text FROM NVTX_EVENTS WHERE eventType = 75")[0]
    assert set(spans["category"]) == {domain}  # the extra-prof domain, named by its create event
    assert spans["name"].str.startswith("main").all()
    (dur,) = sql(real_file, 'SELECT sum("end" - start) FROM NVTX_EVENTS WHERE eventType = 59')[0]
    assert int((spans["end_ns"] - spans["start_ns"]).sum()) == dur


def test_real_runtime_joins_kernels(real_file):
    df = frame(read_nsys(real_file))
    k = df[df["kind"] == "kernel"][["pid", "correlation"]]
    r = df[df["kind"] == "runtime"][["pid", "correlation", "name"]]
    joined = k.merge(r, on=["pid", "correlation"])
    (expected,) = sql(real_file, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                                 "ON r.correlationId = k.correlationId "
                                 "AND ((r.globalTid >> 24) & 16777215) = ((k.globalPid >> 24) & 16777215)")[0]
    assert len(joined) == expected > 0
    assert joined["name"].str.contains("Launch").all()


def test_real_files_are_sniffed(real_file, tmp_path):
    assert is_nsys_sqlite(real_file)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    assert not is_nsys_sqlite(other)
    assert not is_nsys_sqlite(tmp_path / "missing.sqlite")
    (tmp_path / "rand.bin").write_bytes(os.urandom(2048))
    assert not is_nsys_sqlite(tmp_path / "rand.bin")


def _sample_nsys_files() -> list[Path]:
    root = REPO / "sample_traces"
    return sorted(p for p in root.rglob("*.sqlite") if is_nsys_sqlite(p)) if root.is_dir() else []


@pytest.mark.parametrize("path", _sample_nsys_files() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no nsys export under sample_traces/ yet"))])
def test_sample_trace_counts_match_sql(path):
    """Project captures (2025.3, several GPU processes): every GPU row lands in exactly one part."""
    parts = read_nsys(path)
    df = frame(parts)
    for kind, table in (("kernel", "CUPTI_ACTIVITY_KIND_KERNEL"), ("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY"),
                        ("memset", "CUPTI_ACTIVITY_KIND_MEMSET")):
        if any(table in p.meta["tables_present"] for p in parts):
            n, dur = sql(path, f'SELECT count(*), coalesce(sum("end" - start), 0) FROM {table}')[0]
            rows = df[df["kind"] == kind]
            assert len(rows) == n and int((rows["end_ns"] - rows["start_ns"]).sum()) == dur
    assert len({p.key for p in parts}) == len(parts)


# -- synthetic 2025-style exports: splitting and ranks ---------------------------------------------
def test_two_gpu_processes_split_by_pid_with_order_ranks(two_rank_db):
    parts = read_nsys(two_rank_db)
    assert [p.key for p in parts] == ["pid=2002", "pid=2001"]  # GPU 0 first
    assert [p.rank for p in parts] == [0, 1]
    assert all(p.rank_origin == "order" for p in parts)
    assert any("guessed from the order" in w for w in parts[0].warnings)
    for p, dev in zip(parts, (0, 1)):
        df = to_frame(p.table)
        validate(df)
        assert p.meta["devices"] == [dev]
        assert p.meta["cuda_device_to_gpu"] == {str(dev): dev}
        assert p.meta["nsys_version"] == "2025.3.2.0" and p.meta["clock_origin"] == "utc_epoch"
        assert (df["kind"] == "kernel").sum() == 3 and (df["kind"] == "memcpy").sum() == 1
        assert set(df.loc[df["kind"] == "kernel", "device"]) == {dev}
        assert int(df["start_ns"].min()) >= UTC0
        # same correlation ids in both processes: joining on (pid, correlation) stays one-to-one
        j = df[df["kind"] == "kernel"].merge(df[df["kind"] == "runtime"], on=["pid", "correlation"])
        assert len(j) == 3 and set(j["name_y"]) == {"cudaLaunchKernel"}
        spans = df[df["kind"] == "cpu_span"]
        assert "start/end range" in set(spans["name"]) and "never closed" not in set(spans["name"])
        assert any("1 NVTX ranges never closed" in w for w in p.warnings)
    # the CPU-only engine process EngineCore_DP1 joins rank 1; the launcher is dropped and reported
    rank1 = to_frame(parts[1].table)
    assert set(rank1["pid"]) == {2001, 2003}
    assert parts[1].meta["attached_pids"]["2003"]["thread_name"] == "EngineCore_DP1"
    assert any("pid 2003" in w and "guessed from device order" in w for w in parts[1].warnings)
    assert 2003 not in set(to_frame(parts[0].table)["pid"])
    assert any("pid 2000" in w and "dropped" in w for w in parts[0].warnings)


def test_pid_to_rank_overrides(two_rank_db):
    parts = read_nsys(two_rank_db, pid_to_rank={2001: 7, 2002: 3, 2000: 3})
    by_key = {p.key: p for p in parts}
    assert by_key["pid=2001"].rank == 7 and by_key["pid=2001"].rank_origin == "mapping"
    assert by_key["pid=2002"].rank == 3 and by_key["pid=2002"].rank_origin == "mapping"
    assert [p.rank for p in parts] == [3, 7]
    # the launcher was mapped to rank 3 too, so it joins that part; EngineCore_DP1 matches no part
    assert set(to_frame(by_key["pid=2002"].table)["pid"]) == {2000, 2002}
    assert any("pid 2003" in w and "matches no GPU process" in w for w in parts[0].warnings)


def test_partial_mapping_fills_the_rest_by_order(two_rank_db):
    parts = read_nsys(two_rank_db, pid_to_rank={2001: 0})
    by_key = {p.key: (p.rank, p.rank_origin) for p in parts}
    assert by_key == {"pid=2001": (0, "mapping"), "pid=2002": (1, "order")}


def test_profkit_nvtx_payload_gives_metadata_rank(tmp_path):
    db = two_rank_export(marks=("profkit rank=5", "profkit rank=4")).write(tmp_path / "m.sqlite")
    parts = read_nsys(db)
    assert [(p.key, p.rank, p.rank_origin) for p in parts] == [("pid=2002", 4, "metadata"),
                                                                ("pid=2001", 5, "metadata")]
    assert "rank=4" in parts[0].meta["rank_evidence"]
    assert not any("guessed" in w for w in parts[0].warnings)
    assert not any(p.meta["attached_pids"] for p in parts)  # EngineCore_DP1: no part has rank 1


def test_process_name_gives_metadata_rank(tmp_path):
    db = two_rank_export(worker_names=("VLLM::Worker_DP1_EP1", "VLLM::Worker_DP0_EP0")).write(tmp_path / "n.sqlite")
    parts = read_nsys(db)
    assert [(p.key, p.rank, p.rank_origin) for p in parts] == [("pid=2002", 0, "metadata"),
                                                                ("pid=2001", 1, "metadata")]
    assert "2003" in parts[1].meta["attached_pids"]
    assert not any("guessed from device order" in w for w in parts[1].warnings)


def test_conflicting_metadata_falls_back_to_order(tmp_path):
    db = two_rank_export(marks=("profkit rank=2", "profkit rank=2")).write(tmp_path / "c.sqlite")
    parts = read_nsys(db)
    assert [(p.rank, p.rank_origin) for p in parts] == [(0, "order"), (1, "order")]
    assert any("rank 2 is claimed by pids" in w for w in parts[0].warnings)


@pytest.mark.parametrize("name,rank", [
    ("VLLM::Worker_DP3_EP3", 3), ("VLLM::Worker_DP1_TP0_EP1", 1), ("EngineCore_DP7", 7),
    ("VLLM::Worker_TP2", 2), ("worker_dp0_pp0_tp1_dcp0_ep1_rank1", 1), ("VLLM::Worker_DP", None),
    ("EngineCore_DP12", None),  # 15 characters: possibly cut from EngineCore_DP123
    ("VLLM::Worker_DP1_TP1", None), ("python3", None), ("Frank7", None), (None, None)])
def test_rank_from_name(name, rank):
    assert rank_from_name(name) == rank


def test_2022_variant_and_missing_clock(tmp_path):
    old = read_nsys(two_rank_export().write(tmp_path / "old.sqlite", variant="2022"))
    assert [p.rank for p in old] == [0, 1]
    assert old[0].meta["nsys_version"] == "2025.3.2.0"  # read from EXPORT_META_DATA
    assert "TARGET_INFO_CUDA_DEVICE" in old[0].meta["tables_missing"]
    noclock = read_nsys(two_rank_export().write(tmp_path / "noclock.sqlite", variant="no_clock"))
    assert noclock[0].meta["clock_origin"] == "session" and noclock[0].meta["utc_epoch_ns"] is None
    assert any("not UTC" in w for w in noclock[0].warnings)
    df = to_frame(noclock[0].table)
    assert int(df["start_ns"].min()) < 10_000  # session-relative


def test_nccl_collectives_named(two_rank_db):
    df = frame(read_nsys(two_rank_db))
    k = df[df["kind"] == "kernel"]
    assert set(k.loc[k["name"].str.startswith("ncclDevKernel"), "coll_name"]) == {"all_reduce"}
    assert k.loc[~k["name"].str.startswith("ncclDevKernel"), "coll_name"].isna().all()
    nccl = df[(df["kind"] == "cpu_span") & (df["category"] == "NCCL")]
    assert len(nccl) == 2 and set(nccl["name"]) == {"ncclAllReduce"} and set(nccl["coll_name"]) == {"all_reduce"}
    default = df[(df["kind"] == "cpu_span") & (df["category"] == "nvtx")]
    assert default["coll_name"].isna().all()


@pytest.mark.parametrize("name,coll", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "all_reduce"), ("ncclDevKernel_SendRecv", "send_recv"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
    ("ncclDevKernel_Broadcast_RING_LL", "broadcast"),
    ("ncclDevKernel_AllGather_RING_LL", "all_gather"), ("void ncclKernel_Reduce_RING_LL_Sum_half", "reduce"),
    ("gemm_kernel", None), (None, None)])
def test_kernel_coll_name(name, coll):
    assert kernel_coll_name(name) == coll


def test_nvtx_coll_name():
    assert nvtx_coll_name("ncclAlltoAll") == "all_to_all"
    assert nvtx_coll_name("ncclAllReduce") == "all_reduce"
    assert nvtx_coll_name("ncclCommInitRankConfig") is None


def test_gpu_less_export_gives_cpu_parts(tmp_path):
    s = SynthNsys()
    s.process(10, thread_name="EngineCore_DP0")
    s.nvtx(10, 10, 5, 50, "schedule")
    s.runtime(10, 10, "cudaGetDevice_v3020", 1, 2, 1)
    parts = read_nsys(s.write(tmp_path / "cpu.sqlite"))
    assert [(p.key, p.rank, p.rank_origin) for p in parts] == [("pid=10", 0, "metadata")]
    assert any("no GPU activity" in w for w in parts[0].warnings)


# -- secrets ---------------------------------------------------------------------------------------
def _plant_secret(db: Path) -> None:
    con = sqlite3.connect(db)
    con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV (globalVid, devStateName, name, nameEnum, value) "
                "VALUES (0, '', 'HF_TOKEN', 0, ?)", (SECRET,))
    con.execute("CREATE TABLE IF NOT EXISTS META_DATA_CAPTURE (name TEXT, value TEXT)")
    con.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)", (f"HF_TOKEN={SECRET}",))
    con.commit()
    con.close()


def test_system_env_secret_never_leaks_from_real_file(shared_traces, tmp_path):
    db = writable_copy(shared_traces / "nsys" / "profile1.sqlite", tmp_path / "profile1.sqlite")
    _plant_secret(db)
    assert sql(db, f"SELECT count(*) FROM TARGET_INFO_SYSTEM_ENV WHERE value = '{SECRET}'")[0][0] == 1
    parts = read_nsys(db)
    assert parts and SECRET not in everything_as_text(parts)
    assert "hunter2" not in everything_as_text(parts)


def test_system_env_secret_never_leaks_from_synthetic(two_rank_db):
    _plant_secret(two_rank_db)
    text = everything_as_text(read_nsys(two_rank_db))
    assert SECRET not in text
    assert "alice" not in text and "secret-project" not in text  # export user and paths stay out too


# -- bad input -------------------------------------------------------------------------------------
def _expect_trace_error(path: Path, *fragments: str) -> TraceError:
    with pytest.raises(TraceError) as info:
        read_nsys(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path))
    for f in fragments:
        assert f in msg, msg
    return info.value


def test_random_bytes_and_empty_file(tmp_path):
    p = tmp_path / "random.sqlite"
    p.write_bytes(random.Random(1).randbytes(4096))
    _expect_trace_error(p, "not a SQLite file")
    e = tmp_path / "empty.sqlite"
    e.write_bytes(b"")
    _expect_trace_error(e, "not a SQLite file", "empty")
    _expect_trace_error(tmp_path / "missing.sqlite", "no such file")
    _expect_trace_error(tmp_path, "not a regular file")


def test_non_nsys_sqlite(tmp_path):
    p = tmp_path / "app.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    _expect_trace_error(p, "not an Nsight Systems export", "CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS")


def test_kernel_table_dropped_still_reads_memcpy(shared_traces, tmp_path):
    db = writable_copy(shared_traces / "nsys" / "profile1.sqlite", tmp_path / "nokernel.sqlite")
    con = sqlite3.connect(db)
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    con.commit()
    con.close()
    parts = read_nsys(db)
    df = frame(parts)
    assert (df["kind"] == "kernel").sum() == 0 and (df["kind"] == "memcpy").sum() == 30
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in parts[0].meta["tables_missing"]


def test_no_event_tables_is_an_error(shared_traces, tmp_path):
    db = writable_copy(shared_traces / "nsys" / "con_kernel.sqlite", tmp_path / "noevents.sqlite")
    con = sqlite3.connect(db)
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_RUNTIME"):
        con.execute(f"DROP TABLE {t}")
    con.commit()
    con.close()
    _expect_trace_error(db, "no usable nsys event tables", "CUPTI_ACTIVITY_KIND_KERNEL")


def test_missing_string_ids_is_an_error(shared_traces, tmp_path):
    db = writable_copy(shared_traces / "nsys" / "con_kernel.sqlite", tmp_path / "nostrings.sqlite")
    con = sqlite3.connect(db)
    con.execute("DROP TABLE StringIds")
    con.commit()
    con.close()
    _expect_trace_error(db, "StringIds is missing")


def test_truncated_sqlite(shared_traces, tmp_path):
    data = (shared_traces / "nsys" / "profile1.sqlite").read_bytes()
    p = tmp_path / "truncated.sqlite"
    p.write_bytes(data[: len(data) // 3])
    _expect_trace_error(p, "SQLite")


def test_hostile_nvtx_text(tmp_path):
    s = two_rank_export()
    huge = "x" * 2_000_000
    s.nvtx(2001, 2001, 1100, 1200, huge)
    s.nvtx(2001, 2001, 1200, 1300, "rank=9 profkit\x00\u202e<script>")
    db = s.write(tmp_path / "hostile.sqlite")
    con = sqlite3.connect(db)  # invalid UTF-8 straight into a TEXT column
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                "VALUES (1300, 1400, 59, CAST(X'66FF6F80' AS TEXT), ?, 0)", (gtid(2001, 2001),))
    con.commit()
    con.close()
    parts = read_nsys(db)
    df = frame(parts)
    names = set(df.loc[df["kind"] == "cpu_span", "name"])
    assert "x" * nsys_db.MAX_TEXT_CHARS in names and huge not in names
    assert "f\ufffdo\ufffd" in names
    assert any("cut" in w for w in parts[0].warnings)
    assert parts[1].rank_origin == "order"  # "rank=9 profkit" does not start with profkit: no claim


def test_dangling_string_ids_leave_names_empty(tmp_path):
    s = two_rank_export()
    s.kernel(2001, 1, "k", 900, 950, 998)
    db = s.write(tmp_path / "dangling.sqlite")
    con = sqlite3.connect(db)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 99999 WHERE correlationId = 998")
    con.commit()
    con.close()
    parts = read_nsys(db)
    df = frame(parts)
    k = df[(df["kind"] == "kernel") & (df["correlation"] == 998)]
    assert len(k) == 1 and k["name"].isna().all()
    assert any("1 events name StringIds ids that do not exist" in w for w in parts[0].warnings)


def test_queries_never_touch_the_captured_environment(two_rank_db):
    with nsys_db.open_nsys_db(two_rank_db) as db:
        assert "TARGET_INFO_SYSTEM_ENV" in db.columns  # seen, but its columns were never asked for
        with pytest.raises(RuntimeError, match="captured environment"):
            db.scalar_rows("SELECT value FROM TARGET_INFO_SYSTEM_ENV")
        with pytest.raises(RuntimeError):
            db.scalar_rows("select * from meta_data_capture")


def test_end_before_start_is_dropped(tmp_path):
    s = two_rank_export()
    s.kernel(2001, 1, "backwards", 900, 800, 999)
    parts = read_nsys(s.write(tmp_path / "back.sqlite"))
    df = frame(parts)
    assert "backwards" not in set(df["name"])
    assert any("ending before they start: dropped" in w for w in parts[0].warnings)


# -- the ADBC fast path: the same parts as sqlite3 gives, or sqlite3 decides ---------------------------
def _read_both(path: Path, monkeypatch) -> tuple[object, object, int, int]:
    """read_nsys through ADBC where it can, then through sqlite3 alone: (fast result, sqlite3 result,
    tables ADBC gave, tables sqlite3 gave in the fast run). A result is the parts or the TraceError's text."""
    counts = {"fast": 0, "rows": 0}
    fetch_arrow, fetch_rows = nsys_db.NsysDb._fetch_arrow, nsys_db.NsysDb._fetch_rows

    def arrow(self, sql, schema):
        out = fetch_arrow(self, sql, schema)
        counts["fast"] += out is not None
        return out

    def rows(self, sql, schema, params):
        counts["rows"] += 1
        return fetch_rows(self, sql, schema, params)

    def read():
        try:
            return read_nsys(path)
        except TraceError as exc:
            return str(exc)

    with monkeypatch.context() as m:
        m.setattr(nsys_db.NsysDb, "_fetch_arrow", arrow)
        m.setattr(nsys_db.NsysDb, "_fetch_rows", rows)
        fast = read()
    fast_counts = dict(counts)
    with monkeypatch.context() as m:
        m.setattr(nsys_db.NsysDb, "_arrow_connection", lambda self: None)
        slow = read()
    return fast, slow, fast_counts["fast"], fast_counts["rows"]


def _same_parts(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    assert [p.key for p in a] == [p.key for p in b]
    for x, y in zip(a, b):
        assert x.table.schema == y.table.schema and x.table.equals(y.table), x.label
        assert (x.meta, x.warnings, x.rank, x.rank_origin) == (y.meta, y.warnings, y.rank, y.rank_origin)


@pytest.mark.skipif(nsys_db.adbc_sqlite is None, reason="adbc-driver-sqlite (the fast extra) not installed")
@pytest.mark.parametrize("path", _sample_nsys_files() + [Path("shared") / f for f in REAL_FILES],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_adbc_reads_real_exports_as_sqlite3_does(path, monkeypatch, shared_traces):
    """Real exports (2022 toys, the project's 2025.3 captures): every event table came through ADBC
    and the parts are equal, table by table (exact: both read the same SQLite rows)."""
    if not path.is_absolute():  # a public trace beside the checkout
        path = shared_traces / "nsys" / path.name
    fast, slow, by_arrow, by_rows = _read_both(path, monkeypatch)
    assert by_arrow >= 3 and by_rows == 0
    _same_parts(fast, slow)


def _odd_export(tmp_path: Path, how: str) -> Path:
    db = two_rank_export().write(tmp_path / f"{how}.sqlite")
    con = sqlite3.connect(db)
    if how == "real_in_integers":  # sqlite3's pa.array truncates 5.5 to 5; ADBC's column would be double
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + 0.5 WHERE correlationId = 101")
    elif how == "text_in_integers":  # sqlite3's path refuses it; ADBC would make the column text
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 'x' WHERE correlationId = 202")
    elif how == "text_name_after_nulls":  # names as text after a batch of ids: ADBC fails at the next batch
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 'void typed_name(int)' "
                    "WHERE rowid = (SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    elif how == "invalid_utf8":  # ADBC would pass the bytes through; sqlite3 replaces them
        con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                    "VALUES (1300, 1400, 59, CAST(X'66FF6F80' AS TEXT), ?, 0)", (gtid(2001, 2001),))
    elif how == "device_beyond_int32":  # an overflow sqlite3's pa.array refuses; ADBC's cast refuses too
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 4294967296 WHERE correlationId = 100")
    con.commit()
    con.close()
    return db


@pytest.mark.skipif(nsys_db.adbc_sqlite is None, reason="adbc-driver-sqlite (the fast extra) not installed")
@pytest.mark.parametrize("how", ["real_in_integers", "text_in_integers", "text_name_after_nulls", "invalid_utf8",
                                 "device_beyond_int32"])
def test_adbc_leaves_odd_values_to_sqlite3(how, tmp_path, monkeypatch):
    """Where ADBC's inferred types or bytes would differ from sqlite3's reading, that table is read
    again through sqlite3: the same parts, or the same error, as sqlite3 alone gives."""
    monkeypatch.setattr(nsys_db, "FETCH_BATCH_ROWS", 2)  # batches of 2 rows: types change across them
    fast, slow, by_arrow, by_rows = _read_both(_odd_export(tmp_path, how), monkeypatch)
    assert by_rows >= 1 and by_arrow >= 1  # the odd table went through sqlite3, the others did not
    _same_parts(fast, slow)
    if how == "invalid_utf8":
        names = set(frame(fast)["name"])
        assert "f\ufffdo\ufffd" in names
    if how in ("text_in_integers", "device_beyond_int32"):
        assert isinstance(fast, str) and "unexpected value types" in fast


# -- .nsys-rep ---------------------------------------------------------------------------------------
def _fake_nsys(tmp_path: Path, source_db: Path, fail: bool = False) -> Path:
    script = tmp_path / "fake-nsys"
    calls = tmp_path / "calls.txt"
    body = (f"import shutil, sys\nopen({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
            + ("sys.stderr.write('Error: report is damaged\\n'); sys.exit(3)\n" if fail else
               f"out = sys.argv[sys.argv.index('--output') + 1]\nshutil.copyfile({str(source_db)!r}, out)\n"))
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    return script


def test_nsys_rep_without_nsys(tmp_path, monkeypatch):
    rep = tmp_path / "run_rank3.nsys-rep"
    rep.write_bytes(b"not really a report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv("PROFKIT_NSYS", raising=False)
    with pytest.raises(TraceError, match="nsys export --type sqlite"):
        read_nsys_rep(rep)
    monkeypatch.setenv("PROFKIT_NSYS", str(tmp_path / "nope"))
    with pytest.raises(TraceError, match="PROFKIT_NSYS"):
        read_nsys(rep)


def test_nsys_rep_exports_once_and_caches(tmp_path, monkeypatch, two_rank_db):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"report")
    monkeypatch.setenv("PROFKIT_NSYS", str(_fake_nsys(tmp_path, two_rank_db)))
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    parts = read_nsys(rep)
    assert [p.rank for p in parts] == [0, 1] and all(p.path == str(rep) for p in parts)
    assert Path(parts[0].meta["exported_sqlite"]).is_file()
    read_nsys_rep(rep)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("export --type sqlite")


def test_nsys_rep_export_failure(tmp_path, monkeypatch, two_rank_db):
    rep = tmp_path / "bad.nsys-rep"
    rep.write_bytes(b"report")
    monkeypatch.setenv("PROFKIT_NSYS", str(_fake_nsys(tmp_path, two_rank_db, fail=True)))
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(TraceError, match="exit 3.*report is damaged"):
        read_nsys_rep(rep)
    assert not list((tmp_path / "cache").rglob("*.sqlite"))


# -- fuzz: damaged files give TraceError and nothing else -------------------------------------------
_FUZZ_BASE: dict[str, bytes] = {}


def _fuzz_base() -> bytes:
    if "db" not in _FUZZ_BASE:
        with tempfile.TemporaryDirectory() as d:
            p = two_rank_export(marks=("profkit rank=1", None)).write(Path(d) / "base.sqlite", page_size=512)
            _FUZZ_BASE["db"] = p.read_bytes()
    return _FUZZ_BASE["db"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.one_of(st.none(), st.integers(min_value=0, max_value=1 << 16)),
       flips=st.lists(st.tuples(st.integers(min_value=0, max_value=1 << 16), st.integers(1, 255)), max_size=12))
def test_mangled_exports_raise_only_trace_error(cut, flips):
    data = bytearray(_fuzz_base())
    for pos, xor in flips:
        data[pos % len(data)] ^= xor
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "mangled.sqlite"
        p.write_bytes(bytes(data))
        try:
            parts = read_nsys(p)
        except TraceError as exc:
            assert "\n" not in str(exc)
            return
        for part in parts:
            validate(to_frame(part.table), part.label)
            json.dumps(part.meta)
            assert isinstance(part.table, pa.Table)
