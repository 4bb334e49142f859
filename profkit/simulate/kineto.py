"""Write one rank's timeline as a torch 2.x Kineto trace (``rank{r}.pt.trace.json.gz``).

Layout follows real torch.profiler output (reference/formats.md): object form with
``schemaVersion``, ``deviceProperties``, ``distributedInfo``, ``baseTimeNanoseconds``; ``ts`` /
``dur`` are µs with 3 decimals relative to ``baseTimeNanoseconds``; GPU events use pid = device,
tid = stream; ``s``/``f`` flows with ``cat: ac2g`` and ``id`` = correlation join launches to
kernels. JSON text is built from string templates (no per-event dicts) and streamed chunk by
chunk through gzip level 1, so a rank never sits in memory whole.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from profkit.simulate import identity as ident_mod
from profkit.simulate.config import SimConfig
from profkit.simulate.identity import SPAN_NAMES, RankIdentity
from profkit.simulate.model import NCCL_ANN_INSET_NS, ChunkResult
from profkit.simulate.program import COMM_STREAM, COMPUTE_STREAM, MEMCPY_D2H, MEMCPY_H2D, TINY, OpSpec, Program

CBID = {"cudaLaunchKernel": 211, "cudaMemcpyAsync": 41, "cudaStreamSynchronize": 131}
TS = "%d.%03d"  # µs with ns resolution from two ints (quotient, remainder)

H200 = {
    "name": "NVIDIA H200", "totalGlobalMem": 150754820096, "computeMajor": 9, "computeMinor": 0,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
    "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472,
}


def file_name(rank: int) -> str:
    return f"rank{rank}.pt.trace.json.gz"


def _q(name: str) -> str:
    """JSON string literal, safe inside a %-template."""
    return json.dumps(name).replace("%", "%%")


def _qr(a: np.ndarray) -> tuple[list[int], list[int]]:
    a = np.asarray(a, dtype=np.int64).ravel()
    return (a // 1000).tolist(), (a % 1000).tolist()


class KinetoRankWriter:
    """Streams one rank's events; ``write_chunk`` per chunk, ``close`` once."""

    def __init__(self, out_dir: Path, cfg: SimConfig, prog: Program, who: RankIdentity):
        self.cfg, self.prog, self.who = cfg, prog, who
        self.path = Path(out_dir) / file_name(who.rank)
        self.start_host_ns = int(who.clock.to_host(np.array([cfg.start_epoch_ns]))[0])
        self.base_ns = (self.start_host_ns // 1_000_000_000) * 1_000_000_000
        self.last_host_ns = self.start_host_ns
        self.ext = 1
        self.corr = 1
        self._fh = gzip.open(self.path, "wb", compresslevel=1)
        self._first = True
        self._build_templates()
        self._write_header()

    # ---- templates ----------------------------------------------------------------------------
    def _build_templates(self) -> None:
        w, dev = self.who, self.who.device
        cpu = f'"pid":{w.pid},"tid":{w.tid}'
        self.t_span = '{"ph":"X","cat":"%s","name":%s,' + cpu + ',"ts":' + TS + ',"dur":' + TS + \
            ',"args":{"External id":%d,"Record function id":0%s}}'
        self.t_runtime = {
            name: '{"ph":"X","cat":"cuda_runtime","name":"' + name + '",' + cpu + ',"ts":' + TS + ',"dur":' + TS
            + ',"args":{"External id":%d,"cbid":' + str(cbid) + ',"correlation":%d}}'
            for name, cbid in CBID.items()
        }
        self.t_flow_s = '{"ph":"s","id":%d,' + cpu + ',"ts":' + TS + ',"cat":"ac2g","name":"ac2g"}'
        self.t_flow_f = '{"ph":"f","id":%d,"pid":' + str(dev) + ',"tid":%d,"ts":' + TS + \
            ',"cat":"ac2g","name":"ac2g","bp":"e"}'
        self.t_gpu = [self._gpu_template(op) for op in self.prog.ops]
        # per op: runtime call + GPU op + flow s + flow f, args in that order (see write_chunk)
        self.t_launch = [
            self.t_runtime["cudaMemcpyAsync" if op.kind in (MEMCPY_H2D, MEMCPY_D2H) else "cudaLaunchKernel"]
            + ",\n" + gpu + ",\n" + self.t_flow_s + ",\n" + self.t_flow_f.replace('"tid":%d', '"tid":' + str(op.stream))
            for op, gpu in zip(self.prog.ops, self.t_gpu)
        ]
        self.t_tiny = self._gpu_template(TINY)
        self.t_gpu_ann = '{"ph":"X","cat":"gpu_user_annotation","name":%s,"pid":' + str(dev) + ',"tid":' + \
            str(COMPUTE_STREAM) + ',"ts":' + TS + ',"dur":' + TS + ',"args":{"External id":%d}}'
        ranks_str = json.dumps(str(list(range(w.world))))
        self.coll_args = (
            ',"Collective name":"all_to_all","dtype":"BFloat16","In msg nelems":%d,"Out msg nelems":%d,'
            '"Group size":' + str(w.world) + ',"Process Group Name":"' + ident_mod.PG_EP + '",'
            '"Process Group Description":"ep","Process Group Ranks":' + ranks_str + ',"Rank":' + str(w.rank)
            + ',"Sequence number":%d,"In split size":"[]","Out split size":"[]"'
        )
        self.dp_args = (
            ',"Collective name":"allreduce","dtype":"Int","In msg nelems":5,"Out msg nelems":5,'
            '"Group size":' + str(w.world) + ',"Process Group Name":"' + ident_mod.PG_DP_CPU + '",'
            '"Process Group Description":"dp_cpu","Process Group Ranks":' + ranks_str + ',"Rank":' + str(w.rank)
            + ',"Sequence number":%d'
        )

    def _gpu_template(self, op: OpSpec) -> str:
        """Template with args (ts_q, ts_r, dur_q, dur_r, external id, correlation, args suffix)."""
        dev, stream = self.who.device, op.stream
        where = ',"pid":' + str(dev) + ',"tid":' + str(stream) + ',"ts":' + TS + ',"dur":' + TS
        if op.kind in (MEMCPY_H2D, MEMCPY_D2H):
            return (
                '{"ph":"X","cat":"gpu_memcpy","name":' + _q(op.name) + where
                + ',"args":{"External id":%d,"device":' + str(dev) + ',"context":1,"stream":' + str(stream)
                + ',"correlation":%d,"bytes":2048,"memory bandwidth (GB/s)":1.68%s}}'
            )
        threads = op.block[0] * op.block[1] * op.block[2]
        blocks = op.grid[0] * op.grid[1] * op.grid[2]
        bps = round(blocks / H200["numSms"], 6)
        wps = round(bps * threads / 32, 6)
        occ = int(min(100, wps / 64 * 100))
        grid = "[%d,%d,%d]" % op.grid
        block = "[%d,%d,%d]" % op.block
        return (
            '{"ph":"X","cat":"kernel","name":' + _q(op.name) + where
            + ',"args":{"External id":%d,"queued":0,"device":' + str(dev) + ',"context":1,"stream":' + str(stream)
            + ',"correlation":%d,"registers per thread":' + str(op.regs) + ',"shared memory":' + str(op.smem)
            + ',"blocks per SM":' + repr(bps) + ',"warps per SM":' + repr(wps) + ',"grid":' + grid
            + ',"block":' + block + ',"est. achieved occupancy %%":' + str(occ) + '%s}}'
        )

    # ---- header / trailer -------------------------------------------------------------------
    def _write_header(self) -> None:
        cfg, w = self.cfg, self.who
        head = {
            "schemaVersion": 1,
            "deviceProperties": [dict(id=i, **H200) for i in range(cfg.ranks_per_host)],
            "cupti_version": 26,
            "cuda_runtime_version": 12080,
            "cuda_driver_version": 12080,
            "distributedInfo": {
                "backend": "nccl", "rank": w.rank, "world_size": w.world, "pg_count": 3,
                "pg_config": ident_mod.pg_config(w.world), "nccl_version": "2.27.3",
            },
            "record_shapes": 0,
            "with_stack": 0,
            "trace_id": f"{cfg.seed:08X}{w.rank:08X}{cfg.ranks:08X}{cfg.steps:08X}",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": self.base_ns,
        }
        text = json.dumps(head)[:-1] + ', "traceEvents": [\n'
        self._fh.write(text.encode())
        t = self.start_host_ns - self.base_ns
        q, r = t // 1000, t % 1000
        ts = TS % (q, r)
        dev, pid, tid = w.device, w.pid, w.tid
        meta = [
            ("process_name", pid, 0, {"name": w.process_name}),
            ("process_labels", pid, 0, {"labels": "CPU"}),
            ("process_sort_index", pid, 0, {"sort_index": pid}),
            ("process_name", dev, 0, {"name": w.process_name}),
            ("process_labels", dev, 0, {"labels": f"GPU {dev}"}),
            ("process_sort_index", dev, 0, {"sort_index": 16777216 + dev}),
            ("thread_name", dev, COMPUTE_STREAM, {"name": f"stream {COMPUTE_STREAM} "}),
            ("thread_sort_index", dev, COMPUTE_STREAM, {"sort_index": COMPUTE_STREAM}),
            ("thread_name", dev, COMM_STREAM, {"name": f"stream {COMM_STREAM} "}),
            ("thread_sort_index", dev, COMM_STREAM, {"sort_index": COMM_STREAM}),
            ("thread_name", pid, tid, {"name": f"thread {tid} (python3)"}),
            ("thread_sort_index", pid, tid, {"sort_index": tid}),
        ]
        lines = [
            '{"name":"%s","ph":"M","ts":%s,"pid":%d,"tid":%d,"args":%s}' % (n, ts, p, t_, json.dumps(a))
            for n, p, t_, a in meta
        ]
        lines.append(
            '{"name":"Iteration Start: PyTorch Profiler","ph":"i","s":"g","pid":"Traces",'
            '"tid":"Trace PyTorch Profiler","ts":%s}' % ts
        )
        self._emit(lines)

    def _emit(self, lines: list[str]) -> None:
        if not lines:
            return
        text = ",\n".join(lines)
        if not self._first:
            text = ",\n" + text
        self._first = False
        self._fh.write(text.encode())

    def close(self) -> None:
        t0 = self.start_host_ns - self.base_ns
        t1 = self.last_host_ns + 1_000_000 - self.base_ns
        self._emit([
            '{"ph":"X","cat":"Trace","name":"PyTorch Profiler (0)","pid":"Spans","tid":"PyTorch Profiler",'
            '"ts":' + TS % (t0 // 1000, t0 % 1000) + ',"dur":' + TS % ((t1 - t0) // 1000, (t1 - t0) % 1000)
            + ',"args":{"Op count":0}}',
            '{"name":"process_sort_index","ph":"M","ts":' + TS % (t0 // 1000, t0 % 1000)
            + ',"pid":"Spans","tid":0,"args":{"sort_index":536870912}}',
            '{"name":"Record Window End","ph":"i","s":"g","pid":"","tid":"","ts":' + TS % (t1 // 1000, t1 % 1000) + "}",
        ])
        trailer = '\n], "traceName": "%s"}\n' % (self.path.name[: -len(".gz")])
        self._fh.write(trailer.encode())
        self._fh.close()

    # ---- events -------------------------------------------------------------------------------
    def write_chunk(self, res: ChunkResult, gi: int) -> None:
        w, prog = self.who, self.prog
        n, k = res.n, prog.n
        c = len(prog.coll_ops)
        rel = lambda a: w.clock.to_host(a) - self.base_ns  # noqa: E731
        sp = {key: rel(v[gi]) for key, v in res.spans.items()}
        ls, le, gs, ge = (rel(a[gi]) for a in (res.ls, res.le, res.gs, res.ge))
        cb, ce = rel(res.comm_b[gi]), rel(res.comm_e[gi])
        self.last_host_ns = max(self.last_host_ns, int(sp["step_e"].max()) + self.base_ns)
        per_step_ext = 10 + 2 * c
        ext0 = self.ext + np.arange(n, dtype=np.int64) * per_step_ext
        self.ext += n * per_step_ext
        per_step_corr = k + 2
        corr = self.corr + np.arange(n, dtype=np.int64)[:, None] * per_step_corr + np.arange(k)[None, :]
        sync_corr = self.corr + np.arange(n, dtype=np.int64) * per_step_corr + k
        self.corr += n * per_step_corr
        steps = np.arange(res.step0, res.step0 + n)
        out: list[str] = []
        span = self.t_span

        # host spans
        def add(cat: str, name_q: str, b, e, ext_off: int, extra=None) -> None:
            bq, br = _qr(b)
            dq, dr = _qr(e - b)
            ext = (ext0 + ext_off).tolist()
            for j in range(len(bq)):
                out.append(span % (cat, name_q if isinstance(name_q, str) else name_q[j], bq[j], br[j], dq[j],
                                   dr[j], ext[j], "" if extra is None else extra[j]))

        ua = "user_annotation"
        bench = res.bench  # GPU-only run: the forward and its timing sync, nothing of the serving loop
        if not bench:
            add(ua, _q(SPAN_NAMES["step"]), sp["step_b"], sp["step_e"], 0)
            add(ua, _q(SPAN_NAMES["sched"]), sp["sched_b"], sp["sched_e"], 1)
        gcm = sp["gc_e"] > sp["gc_b"]
        if gcm.any():
            idx = np.nonzero(gcm)[0]
            bq, br = _qr(sp["gc_b"][idx])
            dq, dr = _qr(sp["gc_e"][idx] - sp["gc_b"][idx])
            for x, j in enumerate(idx.tolist()):
                out.append(span % (ua, _q(SPAN_NAMES["gc"]), bq[x], br[x], dq[x], dr[x], int(ext0[j]) + 2,
                                   ',"generation":2'))
        add(ua, _q(SPAN_NAMES["em"]), sp["em_b"], sp["em_e"], 3)
        ann_names = [_q(a) for a in res.annotations(gi)]
        add(ua, ann_names, sp["ann_b"], sp["ann_e"], 4)
        if not bench:
            add(ua, _q(SPAN_NAMES["prep"]), sp["prep_b"], sp["prep_e"], 5)
            add(ua, _q(SPAN_NAMES["dp"]), sp["dp_b"], sp["dp_e"], 6)
            dp_extra = [self.dp_args % (ident_mod.DP_SEQ_BASE + s) for s in steps.tolist()]
            add("cpu_op", _q(SPAN_NAMES["comm_op"]), sp["dp_b"] + 1_000, sp["dp_e"] - 500, 7, dp_extra)
            add(ua, _q(SPAN_NAMES["st"]), sp["st_b"], sp["st_e"], 8)
            add(ua, _q(SPAN_NAMES["upd"]), sp["upd_b"], sp["upd_e"], 9)

        # all-to-all host ops: record_param_comms (cpu_op) > nccl:all_to_all (user_annotation)
        nel = (res.tokens[gi] * ident_mod.HIDDEN).tolist()
        seq = ident_mod.EP_SEQ_BASE + steps[:, None] * c + np.arange(c)[None, :]
        coll_extra = [[self.coll_args % (nel[j], nel[j], int(seq[j, x])) for x in range(c)] for j in range(n)]
        for x in range(c):
            ex = [coll_extra[j][x] for j in range(n)]
            add("cpu_op", _q(SPAN_NAMES["comm_op"]), cb[:, x], ce[:, x], 10 + 2 * x, ex)
            add(ua, _q(SPAN_NAMES["nccl"]), cb[:, x] + NCCL_ANN_INSET_NS, ce[:, x] - NCCL_ANN_INSET_NS,
                11 + 2 * x, ex)

        # launches, GPU ops, flows
        ext_of_op = np.full(k, 4, dtype=np.int64)  # the step annotation
        ext_of_op[0] = 4 if bench else 5  # H2D inside prepare_inputs
        ext_of_op[prog.sampler_first:] = 8  # sampler ops inside sample_tokens
        for x, i in enumerate(prog.coll_ops):
            ext_of_op[i] = 10 + 2 * x
        op_ext = (ext0[:, None] + ext_of_op[None, :]).ravel().tolist()
        corr_l = corr.ravel().tolist()
        lq, lr = _qr(ls)
        ldq, ldr = _qr(le - ls)
        gq, gr = _qr(gs)
        gdq, gdr = _qr(ge - gs)
        suffix = [""] * (n * k)
        for x, i in enumerate(prog.coll_ops):
            for j in range(n):
                suffix[j * k + i] = coll_extra[j][x]
        rt_launch = self.t_runtime["cudaLaunchKernel"]
        fs, ff = self.t_flow_s, self.t_flow_f
        # one %-format per launch writes its 4 events (runtime call, GPU op, flow start, flow end)
        launches = zip(self.t_launch * n, zip(lq, lr, ldq, ldr, op_ext, corr_l, gq, gr, gdq, gdr, op_ext, corr_l, suffix,
                                               corr_l, lq, lr, corr_l, gq, gr))
        if bench:  # no sampler and no output copy in a GPU-only forward
            keep = np.tile(np.arange(k) < prog.sampler_first, n).tolist()
            launches = (x for x, kept in zip(launches, keep) if kept)
        out.extend(t % a for t, a in launches)

        # the step annotation projected on the GPU
        fwd_last = prog.sampler_first - 1
        add_gpu = self.t_gpu_ann
        bq, br = _qr(gs[:, 0])
        dq, dr = _qr(ge[:, fwd_last] - gs[:, 0])
        for j in range(n):
            out.append(add_gpu % (ann_names[j], bq[j], br[j], dq[j], dr[j], int(ext0[j]) + 4))

        # host syncs: after the sampled-token copy, and injected ones
        rt_sync = self.t_runtime["cudaStreamSynchronize"]
        bq, br = _qr(sp["ss_b"])
        dq, dr = _qr(sp["ss_e"] - sp["ss_b"])
        sc = sync_corr.tolist()
        for j in range(n):
            out.append(rt_sync % (bq[j], br[j], dq[j], dr[j], int(ext0[j]) + (4 if bench else 8), sc[j]))
        hsm = sp["hs_e"] > sp["hs_b"]
        for j in np.nonzero(hsm)[0].tolist():
            b, e = int(sp["hs_b"][j]), int(sp["hs_e"][j])
            out.append(rt_sync % (b // 1000, b % 1000, (e - b) // 1000, (e - b) % 1000, int(ext0[j]) + 4, sc[j] + 1))

        # launch_bound: tiny kernels
        for (g_i, j), arrays in res.tiny.items():
            if g_i != gi:
                continue
            t_ls, t_le, t_gs, t_ge = (rel(a) for a in arrays)
            m = len(t_ls)
            cids = list(range(self.corr, self.corr + m))
            self.corr += m
            tq, tr = _qr(t_ls)
            tdq, tdr = _qr(t_le - t_ls)
            kq, kr = _qr(t_gs)
            kdq, kdr = _qr(t_ge - t_gs)
            ext = int(ext0[j]) + 4
            for e in range(m):
                out.append(rt_launch % (tq[e], tr[e], tdq[e], tdr[e], ext, cids[e]))
                out.append(self.t_tiny % (kq[e], kr[e], kdq[e], kdr[e], ext, cids[e], ""))
                out.append(fs % (cids[e], tq[e], tr[e]))
                out.append(ff % (cids[e], COMPUTE_STREAM, kq[e], kr[e]))
        self._emit(out)
