"""Write one rank's timeline as an Nsight Systems SQLite export (``rank{r}.sqlite``).

Tables and columns are those of real exports (the 2022-era files in ../shared/traces/nsys,
extended with what newer exports carry: ``META_DATA_EXPORT`` instead of ``EXPORT_META_DATA``,
kernel ``graphId`` and cluster dims from CUPTI's kernel record). Times are int64 ns on the
session timeline; wall clock = ``TARGET_INFO_SESSION_START_TIME.utcEpochNs + start``, and
utcEpochNs is this rank's HOST clock at the capture start (so it carries the clock skew, as
real per-node reports do). Ids follow formats.md: globalTid = <HwId:8><VmId:8><Pid:24><Tid:24>.
Rows go in with ``executemany`` per chunk, journal off: a rank never sits in memory whole.

Not real nsys: ``jsonText`` on the NCCL ranges holds {comm, nranks, bytes, seq} so a reader can
match collectives across ranks without order heuristics; META_DATA_EXPORT says it is simulated.
"""
from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from profkit.simulate import identity as ident_mod
from profkit.simulate.config import SimConfig
from profkit.simulate.identity import SPAN_NAMES, RankIdentity
from profkit.simulate.model import NCCL_ANN_INSET_NS, ChunkResult
from profkit.simulate.program import COMM_STREAM, COMPUTE_STREAM, MEMCPY_D2H, MEMCPY_H2D, TINY, Program

NVTX_PUSHPOP, NVTX_DOMAIN_CREATE = 59, 75
NCCL_DOMAIN_ID = 1
RUNTIME_NAMES = {
    "launch": "cudaLaunchKernel_v7000",
    "copy": "cudaMemcpyAsync_v3020",
    "sync": "cudaStreamSynchronize_v3020",
}
COPY_KIND = {MEMCPY_H2D: 1, MEMCPY_D2H: 2}
SYNC_STREAM = 3  # CUpti_ActivitySynchronizationType: stream synchronize

SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER NOT NULL, duration INTEGER NOT NULL,
    startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL);
CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INTEGER NOT NULL, devStateName TEXT NOT NULL,
    name TEXT NOT NULL, nameEnum INTEGER NOT NULL, value TEXT NOT NULL);
CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);
CREATE TABLE ThreadNames (nameId INTEGER NOT NULL REFERENCES StringIds(id), priority INTEGER, globalTid INTEGER);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT,
    isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER,
    smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER,
    ctxswDevPath TEXT, ctrlDevPath TEXT, revision INTEGER, nodeMask INTEGER, constantMemory INTEGER,
    maxIPC INTEGER, maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, maxShmemPerBlockOptin INTEGER,
    maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER, threadsPerWarp INTEGER, asyncEngines INTEGER,
    maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER, maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER,
    maxBlockDimY INTEGER, maxBlockDimZ INTEGER, maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER,
    computeMajor INTEGER, computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER);
CREATE TABLE TARGET_INFO_CUDA_STREAM (streamId INTEGER NOT NULL, hwId INTEGER NOT NULL, vmId INTEGER NOT NULL,
    processId INTEGER NOT NULL, contextId INTEGER NOT NULL, priority INTEGER NOT NULL, flag INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
    nameId INTEGER NOT NULL REFERENCES StringIds(id), returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER,
    launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL,
    gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL,
    blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
    sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER, graphId INTEGER,
    clusterX INTEGER, clusterY INTEGER, clusterZ INTEGER, clusterSchedulingPolicy INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER,
    srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, migrationCause INTEGER,
    graphNodeId INTEGER, virtualAddress INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
    category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
    textId INTEGER REFERENCES StringIds(id), domainId INTEGER, uint64Value INTEGER, int64Value INTEGER,
    doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
"""

KERNEL_COLS = 32
NVTX_COLS = 19


def file_name(rank: int) -> str:
    return f"rank{rank}.sqlite"


class NsysRankWriter:
    """Streams one rank's rows into a fresh SQLite file; ``write_chunk`` per chunk, ``close`` once."""

    def __init__(self, out_dir: Path, cfg: SimConfig, prog: Program, who: RankIdentity):
        self.cfg, self.prog, self.who = cfg, prog, who
        self.path = Path(out_dir) / file_name(who.rank)
        if self.path.exists():
            self.path.unlink()
        self.db = sqlite3.connect(self.path)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.executescript(SCHEMA)
        self.session_ns = int(who.clock.to_host(np.array([cfg.start_epoch_ns]))[0])
        self.last_ns = 0
        self.corr = 1
        self.grid_id = 1
        self.n_rows = 0
        self.strings: dict[str, int] = {}
        for name in RUNTIME_NAMES.values():
            self._sid(name)
        self.op_name = [self._sid(op.name) for op in prog.ops]
        self.op_short = [self._sid(op.short_name) for op in prog.ops]
        self.tiny_name, self.tiny_short = self._sid(TINY.name), self._sid(TINY.short_name)
        self._write_static()

    def _sid(self, value: str) -> int:
        if value not in self.strings:
            self.strings[value] = len(self.strings) + 1
        return self.strings[value]

    def _rows(self, table: str, rows: list[tuple]) -> None:
        if rows:
            marks = ",".join("?" * len(rows[0]))
            self.db.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
            self.n_rows += len(rows)

    def _write_static(self) -> None:
        cfg, w = self.cfg, self.who
        utc = datetime.fromtimestamp(self.session_ns / 1e9, tz=timezone.utc)
        self._rows("TARGET_INFO_SESSION_START_TIME", [
            (self.session_ns, utc.strftime("%Y-%m-%dT%H:%M:%S"), utc.strftime("%Y-%m-%dT%H:%M:%S"))
        ])
        self._rows("META_DATA_EXPORT", [
            ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
            ("EXPORT_PRODUCT_VERSION", "2025.3.1.90"),
            ("EXPORT_SCHEMA_VERSION_MAJOR", "3"),
            ("EXPORT_PLATFORM", "linux-x86_64"),
            ("EXPORT_HOST", w.hostname),
            ("EXPORT_INPUT_FILE", f"rank{w.rank}.nsys-rep"),
            ("EXPORT_SIMULATED_BY", "profkit.simulate"),
        ])
        self._rows("META_DATA_CAPTURE", [("CAPTURE_HOST", w.hostname), ("CAPTURE_RANGE", "none")])
        vid = 1 << 56
        env = [("Hostname", w.hostname), ("RANK", str(w.rank)), ("WORLD_SIZE", str(w.world)),
               ("LOCAL_RANK", str(w.device)), ("VLLM_DP_RANK", str(w.rank)), ("VLLM_DP_SIZE", str(w.world))]
        self._rows("TARGET_INFO_SYSTEM_ENV", [(vid, "Local", n, i, v) for i, (n, v) in enumerate(env)])
        self._rows("PROCESSES", [(w.global_pid, w.pid, w.process_name)])
        self._rows("ThreadNames", [(self._sid(w.process_name), 10, w.global_tid)])
        gpus = []
        for d in range(cfg.ranks_per_host):
            gpus.append((vid, d, "NVIDIA H200", f"0000:{0x18 + 0x10 * d:02x}:00.0", 1, 62914560, 150754820096,
                         4_800_000_000_000, 1_980_000_000, 132, d, f"GPU-{w.host:04x}{d:04x}-sim", 0, "GH100", d,
                         "", "", 161, 1, 65536, 6, 65536, 49152, 232448, 233472, 65536, 32, 4, 64, 32, 1024,
                         1024, 1024, 64, 2147483647, 65535, 65535, 9, 0, 9, 0))
        self._rows("TARGET_INFO_GPU", gpus)
        self._rows("TARGET_INFO_CUDA_STREAM", [
            (COMPUTE_STREAM, 0, 0, w.pid, 1, 0, 1),
            (COMM_STREAM, 0, 0, w.pid, 1, 4294967295, 2),
        ])
        self._rows("NVTX_EVENTS", [self._nvtx(1_000_000, None, "NCCL", NCCL_DOMAIN_ID, NVTX_DOMAIN_CREATE)])

    def _nvtx(self, start: int, end: int | None, text: str, domain: int, event_type: int = NVTX_PUSHPOP,
              json_text: str | None = None) -> tuple:
        g = self.who.global_tid
        return (start, end, event_type, None, None, None, text, g, None, None, domain,
                None, None, None, None, None, None, None, json_text)

    def close(self) -> None:
        stop = self.last_ns + 1_000_000
        self._rows("ANALYSIS_DETAILS", [(1 << 56, stop, 0, stop)])
        strings = sorted(((i, v) for v, i in self.strings.items()))
        self._rows("StringIds", strings)
        self.db.commit()
        self.db.close()

    # ---- events -------------------------------------------------------------------------------
    def write_chunk(self, res: ChunkResult, gi: int) -> None:
        w, prog = self.who, self.prog
        n, k = res.n, prog.n
        c = len(prog.coll_ops)
        rel = lambda a: w.clock.to_host(a) - self.session_ns  # noqa: E731
        sp = {key: rel(v[gi]) for key, v in res.spans.items()}
        ls, le, gs, ge = (rel(a[gi]) for a in (res.ls, res.le, res.gs, res.ge))
        cb, ce = rel(res.comm_b[gi]), rel(res.comm_e[gi])
        self.last_ns = max(self.last_ns, int(sp["step_e"].max()))
        steps = np.arange(res.step0, res.step0 + n)
        gtid, gpid, dev = w.global_tid, w.global_pid, w.device
        nvtx: list[tuple] = []

        def spans(key: str, name: str | list[str], b=None, e=None) -> None:
            b = sp[f"{key}_b"] if b is None else b
            e = sp[f"{key}_e"] if e is None else e
            for j, (x, y) in enumerate(zip(b.tolist(), e.tolist())):
                if y > x or key != "gc":
                    nvtx.append(self._nvtx(x, y, name if isinstance(name, str) else name[j], 0))

        spans("step", SPAN_NAMES["step"])
        spans("sched", SPAN_NAMES["sched"])
        spans("gc", SPAN_NAMES["gc"])
        spans("em", SPAN_NAMES["em"])
        spans("ann", res.annotations(gi))
        spans("prep", SPAN_NAMES["prep"])
        spans("dp", SPAN_NAMES["dp"])
        spans("st", SPAN_NAMES["st"])
        spans("upd", SPAN_NAMES["upd"])
        nbytes = (res.tokens[gi] * ident_mod.HIDDEN * 2).tolist()
        for x in range(c):
            for j in range(n):
                seq = ident_mod.EP_SEQ_BASE + int(steps[j]) * c + x
                payload = json.dumps({"comm": ident_mod.PG_EP, "nranks": w.world, "bytes": nbytes[j], "seq": seq})
                nvtx.append(self._nvtx(int(cb[j, x]) + NCCL_ANN_INSET_NS, int(ce[j, x]) - NCCL_ANN_INSET_NS,
                                       SPAN_NAMES["nccl_nvtx"], NCCL_DOMAIN_ID, json_text=payload))

        per_step_corr = k + 2
        corr = self.corr + np.arange(n, dtype=np.int64)[:, None] * per_step_corr + np.arange(k)[None, :]
        self.corr += n * per_step_corr
        rid = self.strings
        launch_id, copy_id, sync_id = (rid[RUNTIME_NAMES[x]] for x in ("launch", "copy", "sync"))
        runtime: list[tuple] = []
        kernels: list[tuple] = []
        copies: list[tuple] = []
        syncs: list[tuple] = []
        lsl, lel, gsl, gel, cl = ls.tolist(), le.tolist(), gs.tolist(), ge.tolist(), corr.tolist()
        for i, op in enumerate(prog.ops):
            is_copy = op.kind in (MEMCPY_H2D, MEMCPY_D2H)
            for j in range(n):
                cid = cl[j][i]
                runtime.append((lsl[j][i], lel[j][i], 0, gtid, cid, copy_id if is_copy else launch_id, 0, None))
                if is_copy:
                    copies.append((gsl[j][i], gel[j][i], dev, 1, op.stream, cid, gpid, 2048, COPY_KIND[op.kind],
                                   None, 1 if op.kind == MEMCPY_H2D else 2, 2 if op.kind == MEMCPY_H2D else 1,
                                   dev, 1, dev, 1, None, None, None))
                else:
                    kernels.append(self._kernel(gsl[j][i], gel[j][i], op, cid, self.op_name[i], self.op_short[i]))
        sync_corr = (self.corr - n * per_step_corr) + np.arange(n) * per_step_corr + k
        for j in range(n):
            b, e, cid = int(sp["ss_b"][j]), int(sp["ss_e"][j]), int(sync_corr[j])
            runtime.append((b, e, 0, gtid, cid, sync_id, 0, None))
            syncs.append((b, e, dev, 1, COMPUTE_STREAM, cid, gpid, SYNC_STREAM, 4294967295))
            if sp["hs_e"][j] > sp["hs_b"][j]:
                b, e = int(sp["hs_b"][j]), int(sp["hs_e"][j])
                runtime.append((b, e, 0, gtid, cid + 1, sync_id, 0, None))
                syncs.append((b, e, dev, 1, COMPUTE_STREAM, cid + 1, gpid, SYNC_STREAM, 4294967295))
        for (g_i, _j), arrays in res.tiny.items():
            if g_i != gi:
                continue
            t_ls, t_le, t_gs, t_ge = (rel(a).tolist() for a in arrays)
            for e in range(len(t_ls)):
                cid = self.corr
                self.corr += 1
                runtime.append((t_ls[e], t_le[e], 0, gtid, cid, launch_id, 0, None))
                kernels.append(self._kernel(t_gs[e], t_ge[e], TINY, cid, self.tiny_name, self.tiny_short))
        self._rows("NVTX_EVENTS", nvtx)
        self._rows("CUPTI_ACTIVITY_KIND_RUNTIME", runtime)
        self._rows("CUPTI_ACTIVITY_KIND_KERNEL", kernels)
        self._rows("CUPTI_ACTIVITY_KIND_MEMCPY", copies)
        self._rows("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", syncs)

    def _kernel(self, start: int, end: int, op, cid: int, name_id: int, short_id: int) -> tuple:
        self.grid_id += 1
        return (start, end, self.who.device, 1, op.stream, cid, self.who.global_pid, name_id, short_id, None,
                0, 0, op.regs, *op.grid, *op.block, 0, op.smem, 0, 0, self.grid_id, op.smem, None, 0, None,
                0, 0, 0, 0)
