"""True-time timeline of a DEP deployment: every rank's host spans, launches and GPU ops.

All ranks run the same step program (``program.py``); they differ by seeded draws and injected
causes. Ranks couple only through sync points whose END is common to all ranks: the Gloo DP
all-reduce (ends when the last rank arrives + a transfer time) and each MoE all-to-all (same).
So the timeline runs in two passes when ranks are written in groups:

1. all ranks, vectorised with numpy, to find the common ends (``Coupling``) and the truth;
2. per group of ranks, the same code with the common ends given: each rank redraws exactly the
   same random numbers (one generator per rank, drawn chunk by chunk in a fixed order), so its
   timeline is identical and memory stays bounded by group x chunk.

Time is int64 ns of true time throughout; clock skew is applied only when writing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from profkit.simulate import replay as replay_mod
from profkit.simulate import stats
from profkit.simulate.config import SimConfig
from profkit.simulate.identity import step_annotation
from profkit.simulate.program import COLL, Program, build_program

# fixed host costs (ns): small enough not to matter, present so spans nest strictly
EXEC_PRE_NS = 4_000  # EngineCore.step -> execute_model
ANN_PRE_NS = 3_000  # execute_model -> vLLM step annotation
PREP_PRE_NS = 2_000
DP_PRE_NS = 3_000
DP_POST_NS = 5_000
COLL_PRE_NS = 12_000  # record_param_comms start -> launch
COLL_POST_NS = 8_000  # launch end -> record_param_comms end
NCCL_ANN_INSET_NS = 2_000  # nccl:all_to_all sits inside record_param_comms by this much
SAMPLE_PRE_NS = 13_000  # last forward launch -> first sampler launch (span boundaries)
SYNC_PRE_NS = 2_000
SYNC_MIN_NS = 2_500
SYNC_POST_NS = 3_000
UPDATE_PRE_NS = 5_000
STEP_POST_NS = 5_000
TINY_GAP_NS = 12_000  # launch_bound: host gap before each tiny launch
TINY_LAUNCH_NS = 6_600
TINY_LAT_NS = 9_500
TINY_PERIOD_NS = TINY_GAP_NS + TINY_LAUNCH_NS
GAP_JITTER_SIGMA = 0.15  # per (rank, step) jitter of an op's host gap (lognormal sigma)
# bench forward (GPU-only run): the forward replayed as a CUDA graph, so the host runs far ahead
BENCH_LAUNCH_NS = 1_000  # host time per launch inside a graph replay
BENCH_GAP_NS = 500
BENCH_INTERSTEP_NS = 30_000  # between two timed forwards (event record, loop)

INJECT_COLUMNS = ("gc", "slow_rank", "slow_schedule", "host_sync", "launch_bound", "hot_experts")

SPANS = (
    "step", "sched", "gc", "em", "ann", "prep", "dp", "st", "upd", "ss", "hs",
)  # each has <name>_b / <name>_e arrays in ChunkResult.spans


@dataclass
class Coupling:
    """The cross-rank facts: common transfer times (drawn once) and common sync ends (true ns)."""

    gloo_ns: np.ndarray  # (S,)
    xfer_ns: np.ndarray  # (S, C)
    dp_end_ns: np.ndarray  # (S,)
    coll_end_ns: np.ndarray  # (S, C)
    complete: bool = False
    # replay only, per step: how much later the DP all-reduce ended than in the mirror replay of the
    # same seeds (every rank at the mirror's tokens), and than with every rank at the step's mean tokens
    dp_cost_vs_mirror_ns: np.ndarray | None = None  # (S,)
    dp_imbalance_ns: np.ndarray | None = None  # (S,)
    # lag replay only: tokens per (rank, step), decided in the pass that computes the coupling
    lag_tokens: dict[str, np.ndarray] | None = None  # n_prefill, prefill_tokens, n_decode: (N, S)
    lag_replay: object | None = None  # the LagReplay that decided them (admission steps, for the truth)


@dataclass
class Injections:
    """Per (rank, step) injected amounts for the whole run, built from the config (no randomness)."""

    ms: dict[str, np.ndarray]  # kind -> (N, S) float ms per step (0 = none)
    slow_factor: np.ndarray  # (N, S) explicit CPU factor (1 = none; used when factor= given)
    hot_factor: np.ndarray  # (N, S) explicit load factor (1 = none)
    host_sync_layer: np.ndarray  # (N,) layer after whose combine the extra sync sits

    @classmethod
    def build(cls, cfg: SimConfig) -> "Injections":
        n, s = cfg.ranks, cfg.steps
        ms = {k: np.zeros((n, s)) for k in INJECT_COLUMNS}
        slow = np.ones((n, s))
        hot = np.ones((n, s))
        hs_layer = np.full(n, cfg.layers // 2, dtype=np.int64)
        for inj in cfg.injects:
            steps = inj.steps(s)
            if inj.factor is not None:
                (slow if inj.kind == "slow_rank" else hot)[inj.rank, steps] *= inj.factor
            else:
                ms[inj.kind][inj.rank, steps] += inj.ms_per_step
            if inj.kind == "host_sync" and inj.layer is not None:
                hs_layer[inj.rank] = inj.layer
        return cls(ms, slow, hot, hs_layer)


@dataclass
class ChunkResult:
    """Timeline of ``ranks`` over steps ``step0 .. step0+n-1`` (true int64 ns)."""

    ranks: np.ndarray  # (G,)
    step0: int
    n: int
    spans: dict[str, np.ndarray]  # "<span>_b"/"<span>_e" -> (G, n)
    ls: np.ndarray  # (G, n, K) launch call start
    le: np.ndarray  # (G, n, K) launch call end
    gs: np.ndarray  # (G, n, K) GPU start
    ge: np.ndarray  # (G, n, K) GPU end
    batch: np.ndarray  # (G, n) decode requests this step (one token each)
    delay_ns: dict[str, np.ndarray]  # kind -> (G, n) injected ns actually applied
    loads: np.ndarray  # (G, n, L) tokens routed to the rank's experts per layer
    comm_b: np.ndarray  # (G, n, C) record_param_comms start of each all-to-all
    comm_e: np.ndarray  # (G, n, C) record_param_comms end
    tiny: dict[tuple[int, int], tuple[np.ndarray, ...]] = field(default_factory=dict)  # (g, j) -> ls, le, gs, ge
    n_prefill: np.ndarray | None = None  # (G, n) replay only: prefill requests and their tokens
    prefill_tokens: np.ndarray | None = None
    # the step's true split (G, n): GPU computing (kernels and copies), waiting for other ranks at the
    # DP all-reduce and the all-to-alls (last arrival minus own arrival), transfers once all arrived
    gpu_ns: np.ndarray | None = None
    wait_ns: np.ndarray | None = None
    xfer_ns: np.ndarray | None = None
    xfer_last_ns: np.ndarray | None = None  # the part of xfer_ns at sync points where the rank arrived last
    bench: bool = False  # a GPU-only (bench forward) chunk: no serving-loop spans, no sampler

    @property
    def tokens(self) -> np.ndarray:
        """(G, n) tokens each rank ran per step."""
        return self.batch if self.prefill_tokens is None else self.batch + self.prefill_tokens

    def annotations(self, gi: int) -> list[str]:
        """vLLM's step annotation per step of group member ``gi``."""
        if self.n_prefill is None or self.prefill_tokens is None:
            return [step_annotation(int(b)) for b in self.batch[gi]]
        return [step_annotation(int(b), int(p), int(t))
                for b, p, t in zip(self.batch[gi], self.n_prefill[gi], self.prefill_tokens[gi])]


def chunk_steps(cfg: SimConfig) -> int:
    """Steps per chunk: keeps (ranks x chunk x ops) arrays to a few MB, and identical in both passes."""
    if cfg.chunk_steps > 0:
        return cfg.chunk_steps
    return int(max(1, min(cfg.steps, 4096 // max(cfg.ranks, 1), 64)))


class Timeline:
    """Computes the true timeline of a rank subset, chunk by chunk (see module docstring)."""

    def __init__(self, cfg: SimConfig, injections: Injections | None = None):
        self.cfg = cfg
        self.prog: Program = build_program(cfg.layers)
        self.inj = injections or Injections.build(cfg)
        ops = self.prog.ops
        k = self.prog.n
        laws = self.prog.durations()
        self.dur_med = np.array([law.p50_us * 1e3 if law else 0.0 for law in laws])
        if cfg.gpu_scale != 1.0:
            self.dur_med = self.dur_med * cfg.gpu_scale
        self.dur_sig = np.array([law.sigma if law else 0.0 for law in laws])
        is_memcpy = np.array([op.kind.startswith("memcpy") for op in ops])
        self.ldur_med = np.where(is_memcpy, stats.MEMCPY_CALL_US.p50_us, stats.LAUNCH_US.p50_us) * 1e3
        self.ldur_sig = np.where(is_memcpy, stats.MEMCPY_CALL_US.sigma, stats.LAUNCH_US.sigma)
        self.is_coll = np.array([op.kind == COLL for op in ops])
        self.coll_idx = np.array(self.prog.coll_ops, dtype=np.int64)
        self.pre = np.where(self.is_coll, COLL_PRE_NS, 0).astype(np.int64)
        self.post = np.where(self.is_coll, COLL_POST_NS, 0).astype(np.int64)
        self.extra_gap = np.zeros(k, dtype=np.int64)
        self.extra_gap[self.prog.sampler_first] = SAMPLE_PRE_NS
        self.expert_idx = np.array([i for i, op in enumerate(ops) if op.expert], dtype=np.int64)
        self.expert_layer = np.array([ops[i].layer for i in self.expert_idx], dtype=np.int64)
        # Host gap before each launch: the Python work of one op is the same code path every step on
        # every rank, so the base gap per op is drawn once (shared) from the real distribution and
        # each (rank, step) only jitters it. Independent draws per launch would make ranks drift
        # apart by ~1 ms per step by chance alone, drowning small injected causes in noise.
        base_rng = np.random.default_rng([cfg.seed, 0x6A9])
        # Stratified: ops launched back-to-back inside vLLM's fused MoE op take the lowest gaps of
        # the real distribution, the others the rest, so the pooled gaps still follow it.
        fused = np.array([op.fused for op in ops])
        frac = fused.mean()
        u = base_rng.random(k)
        base_gap = stats.LAUNCH_GAP_US.ns(np.where(fused, u * frac, frac + u * (1.0 - frac)))
        self.base_gap = base_gap.astype(np.float64) * cfg.cpu_scale
        self.chunk = chunk_steps(cfg)
        self.hosts_one = cfg.hosts == 1
        # replay: the rank's own tokens cost token_ns each on the host before the DP all-reduce
        self.lag = cfg.replay == "lag"
        self.replay = (replay_mod.build(cfg.replay, cfg.ranks, cfg.steps, cfg.replay_seed, cfg.workload)
                       if cfg.replay and not self.lag else None)
        if self.lag:
            lag = self.new_lag_replay()
            self.mirror_tok_ns = lag.mirror_tokens * np.int64(cfg.token_ns)
        if self.replay is not None:
            self.tok_ns = self.replay.tokens * np.int64(cfg.token_ns)  # (N, S)
            self.mirror_tok_ns = self.replay.mirror_tokens * np.int64(cfg.token_ns)  # (S,)
            # the step's mean over ranks, in ns: float (a mean of integers), rounded once
            self.mean_tok_ns = self.replay.tokens.mean(axis=0) * float(cfg.token_ns)

    def new_lag_replay(self) -> replay_mod.LagReplay:
        cfg = self.cfg
        return replay_mod.LagReplay(cfg.ranks, cfg.steps, cfg.replay_seed, int(round(cfg.lag_ms * 1e6)), cfg.workload)

    # ---- shared draws ---------------------------------------------------------------------------
    def new_coupling(self) -> Coupling:
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, 0xC0FFEE])
        c = len(self.coll_idx)
        gloo = stats.GLOO_ALLREDUCE_US[self.hosts_one].ns(rng.standard_normal(cfg.steps))
        z = rng.standard_normal((cfg.steps, c))
        xfer = np.empty((cfg.steps, c), dtype=np.int64)
        scale = 1.0 + 0.05 * np.log2(max(cfg.ranks, 2))
        xfer[:, 0::2] = np.rint(stats.DISPATCH_US.ns(z[:, 0::2]) * scale)
        xfer[:, 1::2] = np.rint(stats.COMBINE_US.ns(z[:, 1::2]) * scale)
        coupling = Coupling(gloo, xfer, np.zeros(cfg.steps, np.int64), np.zeros((cfg.steps, c), np.int64))
        if self.replay is not None or self.lag:
            coupling.dp_cost_vs_mirror_ns = np.zeros(cfg.steps, np.int64)
            coupling.dp_imbalance_ns = np.zeros(cfg.steps, np.int64)
        if self.lag:
            coupling.lag_tokens = {k: np.zeros((cfg.ranks, cfg.steps), np.int64)
                                   for k in ("n_prefill", "prefill_tokens", "n_decode")}
        return coupling

    # ---- per-rank draws (must be identical in both passes) ----------------------------------
    def _rank_rngs(self, ranks: np.ndarray) -> list[np.random.Generator]:
        return [np.random.default_rng([self.cfg.seed, 1, int(r)]) for r in ranks]

    def _draw(self, rngs: list[np.random.Generator], n: int) -> dict[str, np.ndarray]:
        k, layers = self.prog.n, self.cfg.layers
        parts: dict[str, list[np.ndarray]] = {key: [] for key in ("cpu", "gap", "ldur", "lat", "dur", "load", "batch")}
        for rng in rngs:
            parts["cpu"].append(rng.standard_normal((n, 5)))
            parts["gap"].append(rng.standard_normal((n, k)))
            parts["ldur"].append(rng.standard_normal((n, k)))
            parts["lat"].append(rng.random((n, k)))
            parts["dur"].append(rng.standard_normal((n, k)))
            parts["load"].append(rng.standard_normal((n, layers)))
            parts["batch"].append(rng.poisson(self.cfg.batch_per_rank, n))
        return {key: np.stack(v) for key, v in parts.items()}

    # ---- the timeline -----------------------------------------------------------------------
    def run(self, ranks: np.ndarray, coupling: Coupling) -> Iterator[ChunkResult]:
        """Yield the timeline of ``ranks`` chunk by chunk.

        If ``coupling.complete`` is False, ``ranks`` must be all ranks and the common sync ends
        are computed (and stored into ``coupling``) as they are reached; else they are read.
        """
        cfg = self.cfg
        ranks = np.asarray(ranks, dtype=np.int64)
        if not coupling.complete and len(ranks) != cfg.ranks:
            raise ValueError("computing the coupling needs all ranks")
        rngs = self._rank_rngs(ranks)
        start_jitter = np.array([int(rng.integers(0, 200_000)) for rng in rngs], dtype=np.int64)
        c_next = cfg.start_epoch_ns + 1_000_000 + start_jitter  # first step starts ~1 ms into the capture
        gpu = c_next.copy()
        # host jitter: a stream of its own per rank, so turning it on leaves every other draw as it was
        jit = [np.random.default_rng([cfg.seed, 2, int(r)]) for r in ranks] if cfg.host_jitter_ms > 0 else None
        self._lag_state = self.new_lag_replay() if self.lag and not coupling.complete else None
        if self._lag_state is not None:
            coupling.lag_replay = self._lag_state
        chunk_fn = self._bench_chunk if cfg.bench_forward else self._chunk
        for step0 in range(0, cfg.steps, self.chunk):
            n = min(self.chunk, cfg.steps - step0)
            d = self._draw(rngs, n)
            if jit is not None:  # (g, n, C): before each all-to-all's launch
                c_n = len(self.coll_idx)
                d["jitter"] = np.stack([np.rint(r.exponential(cfg.host_jitter_ms * 1e6, (n, c_n))).astype(np.int64)
                                        for r in jit])
            res, c_next, gpu = chunk_fn(ranks, step0, n, d, coupling, c_next, gpu)
            yield res
        if not coupling.complete:
            coupling.complete = True

    def _chunk(self, ranks, step0, n, d, coupling: Coupling, c_next, gpu):
        cfg, prog, inj = self.cfg, self.prog, self.inj
        g, k = len(ranks), prog.n
        steps = np.arange(step0, step0 + n)
        sl = np.ix_(ranks, steps)

        # -- base draws -> int64 ns
        z = d["cpu"]
        sched = stats.SCHEDULE_US.ns(z[..., 0])
        prep = stats.PREPARE_US.ns(z[..., 1])
        upd = stats.UPDATE_US.ns(z[..., 2])
        inter = stats.INTERSTEP_US.ns(z[..., 3])
        post_sample = stats.POST_SAMPLE_US.ns(z[..., 4])
        gap = np.rint(self.base_gap * np.exp(GAP_JITTER_SIGMA * d["gap"])).astype(np.int64) + self.extra_gap
        if "jitter" in d:  # host jitter: the host stalls before launching each all-to-all
            gap[..., self.coll_idx] += d["jitter"]
        ldur = np.rint(self.ldur_med * np.exp(self.ldur_sig * d["ldur"])).astype(np.int64)
        lat = stats.LAUNCH_LATENCY_US.ns(d["lat"])
        dur = np.rint(self.dur_med * np.exp(self.dur_sig * d["dur"])).astype(np.int64)
        pre = np.broadcast_to(self.pre, (g, n, k)).copy()
        post = np.broadcast_to(self.post, (g, n, k)).copy()

        # -- slow_rank: scale every host component by f (f from an explicit factor or from ms)
        cpu_parts = [sched, prep, upd, inter, post_sample]
        base_sum = sum(cpu_parts) + (gap[..., 1:] + ldur[..., 1:] + pre[..., 1:] + post[..., 1:]).sum(-1) + ldur[..., 0]
        f = inj.slow_factor[sl] * (1.0 + inj.ms["slow_rank"][sl] * 1e6 / base_sum)
        slow_delay = np.zeros((g, n), dtype=np.int64)
        if (f != 1.0).any():
            def scale(a: np.ndarray) -> np.ndarray:
                fa = f if a.ndim == 2 else f[..., None]
                return np.rint(a * fa).astype(np.int64)
            sched, prep, upd, inter, post_sample = (scale(p) for p in cpu_parts)
            gap, ldur, pre, post = scale(gap), scale(ldur), scale(pre), scale(post)
            new_sum = (sched + prep + upd + inter + post_sample + ldur[..., 0]
                       + (gap[..., 1:] + ldur[..., 1:] + pre[..., 1:] + post[..., 1:]).sum(-1))
            slow_delay = new_sum - base_sum

        # -- expert loads (hot_experts scales the rank's load, hence its expert GEMM time)
        mean_tokens = cfg.batch_per_rank * cfg.topk
        load_scale = np.clip(1.0 + 0.05 * d["load"], 0.5, None)  # (g, n, L)
        exp_dur = dur[..., self.expert_idx].astype(np.float64) * load_scale[..., self.expert_layer]
        exp_per_step = exp_dur.sum(-1)
        hot = inj.hot_factor[sl] * (1.0 + inj.ms["hot_experts"][sl] * 1e6 / np.maximum(exp_per_step, 1.0))
        new_exp = np.rint(exp_dur * hot[..., None]).astype(np.int64)
        base_exp = np.rint(exp_dur).astype(np.int64)
        dur[..., self.expert_idx] = new_exp
        hot_delay = (new_exp - base_exp).sum(-1)
        loads = np.rint(mean_tokens * load_scale * hot[..., None]).astype(np.int64)

        tok_ns = self.tok_ns[sl] if self.replay is not None else None
        batch, n_prefill, prefill_tokens = d["batch"], None, None
        if self.replay is not None:
            batch = self.replay.n_decode[sl]
            n_prefill, prefill_tokens = self.replay.n_prefill[sl], self.replay.prefill_tokens[sl]
        elif self.lag:  # decided at each step's start, below
            batch, n_prefill, prefill_tokens = (np.zeros((g, n), np.int64) for _ in range(3))
            tok_ns = np.zeros((g, n), np.int64)
        sched_extra = np.rint(inj.ms["slow_schedule"][sl] * 1e6).astype(np.int64)
        gc_ns = np.rint(inj.ms["gc"][sl] * 1e6).astype(np.int64)
        hs_ns = np.rint(inj.ms["host_sync"][sl] * 1e6).astype(np.int64)
        n_tiny = np.rint(inj.ms["launch_bound"][sl] * 1e6 / TINY_PERIOD_NS).astype(np.int64)
        hs_coll = 2 * inj.host_sync_layer[ranks] + 1  # (g,) collective index after which it syncs

        ls = np.zeros((g, n, k), np.int64)
        le = np.zeros_like(ls)
        gs = np.zeros_like(ls)
        ge = np.zeros_like(ls)
        sp = {f"{name}_{x}": np.zeros((g, n), np.int64) for name in SPANS for x in "be"}
        tiny: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
        delay = {kind: np.zeros((g, n), np.int64) for kind in INJECT_COLUMNS}
        delay["slow_rank"] = slow_delay
        delay["hot_experts"] = hot_delay
        delay["slow_schedule"] = sched_extra
        delay["gc"] = gc_ns
        delay["host_sync"] = hs_ns
        delay["launch_bound"] = n_tiny * TINY_PERIOD_NS

        computing = not coupling.complete
        coll_idx = self.coll_idx
        wait_ns = np.zeros((g, n), np.int64)
        xfer_ns = np.zeros((g, n), np.int64)
        xfer_last = np.zeros((g, n), np.int64)  # transfers at the sync points where this rank came last
        seg_starts = [1] + [int(ci) + 1 for ci in coll_idx]
        seg_ends = [int(ci) for ci in coll_idx] + [k - 1]  # inclusive end op of each segment
        for j in range(n):
            s = step0 + j
            c = c_next.copy()
            if self.lag:
                self._lag_tokens(s, j, ranks, c, coupling, computing, batch, n_prefill, prefill_tokens, tok_ns)
            sp["step_b"][:, j] = c
            sp["sched_b"][:, j] = c
            c = c + sched[:, j] + sched_extra[:, j]
            sp["sched_e"][:, j] = c
            sp["gc_b"][:, j] = c
            c = c + gc_ns[:, j]
            sp["gc_e"][:, j] = c
            sp["em_b"][:, j] = c = c + EXEC_PRE_NS
            sp["ann_b"][:, j] = c = c + ANN_PRE_NS
            sp["prep_b"][:, j] = c = c + PREP_PRE_NS
            # H2D copy of the step inputs, launched inside prepare_inputs
            ls[:, j, 0] = c + prep[:, j] // 2
            le[:, j, 0] = ls[:, j, 0] + ldur[:, j, 0]
            gs[:, j, 0] = np.maximum(ls[:, j, 0] + lat[:, j, 0], gpu)
            ge[:, j, 0] = gpu = gs[:, j, 0] + dur[:, j, 0]
            c = np.maximum(c + prep[:, j], le[:, j, 0] + 1_000)
            if tok_ns is not None:  # the rank's own batch: token-proportional host work
                c = c + tok_ns[:, j]
            sp["prep_e"][:, j] = c
            # DP padding all-reduce over Gloo: ends for all when the last rank arrives
            sp["dp_b"][:, j] = c = c + DP_PRE_NS
            if computing:
                coupling.dp_end_ns[s] = c.max() + coupling.gloo_ns[s]
                if tok_ns is not None:  # the same arrivals with every rank at other token counts
                    own = c - tok_ns[:, j]
                    mean_tok = self.mean_tok_ns_s if self.lag else self.mean_tok_ns[s]
                    coupling.dp_cost_vs_mirror_ns[s] = c.max() - (own + self.mirror_tok_ns[s]).max()
                    coupling.dp_imbalance_ns[s] = c.max() - int(np.rint((own + mean_tok).max()))
            elif (c > coupling.dp_end_ns[s] - coupling.gloo_ns[s]).any():
                raise AssertionError(f"step {s}: rank arrival after the coupled DP all-reduce end")
            sp["dp_e"][:, j] = coupling.dp_end_ns[s]
            w = coupling.dp_end_ns[s] - coupling.gloo_ns[s] - sp["dp_b"][:, j]
            wait_ns[:, j] += w
            xfer_ns[:, j] += coupling.gloo_ns[s]
            xfer_last[:, j] += np.where(w == 0, coupling.gloo_ns[s], 0)
            c = np.full(g, coupling.dp_end_ns[s] + DP_POST_NS, dtype=np.int64)
            # launch_bound: many tiny kernels, GPU idle between them
            for gi in np.nonzero(n_tiny[:, j])[0]:
                m = int(n_tiny[gi, j])
                t_ls = c[gi] + np.arange(m, dtype=np.int64) * TINY_PERIOD_NS + TINY_GAP_NS
                t_le = t_ls + TINY_LAUNCH_NS
                t_dur = 2_080 + (np.arange(m, dtype=np.int64) * 7919) % 600
                t_gs, t_ge = _serial_gpu(t_ls + TINY_LAT_NS, t_dur, gpu[gi])
                tiny[(int(gi), j)] = (t_ls, t_le, t_gs, t_ge)
                c[gi] += m * TINY_PERIOD_NS
                gpu[gi] = t_ge[-1]
            # forward: segments of compute kernels, each closed by an all-to-all
            hs_b = np.zeros(g, np.int64)
            hs_e = np.zeros(g, np.int64)
            for seg, (a, b) in enumerate(zip(seg_starts, seg_ends)):
                inc = gap[:, j, a:b + 1] + pre[:, j, a:b + 1] + ldur[:, j, a:b + 1] + post[:, j, a:b + 1]
                cum = np.cumsum(inc, axis=1)
                ls[:, j, a:b + 1] = c[:, None] + cum - ldur[:, j, a:b + 1] - post[:, j, a:b + 1]
                le[:, j, a:b + 1] = ls[:, j, a:b + 1] + ldur[:, j, a:b + 1]
                c = c + cum[:, -1]
                last_compute = b if seg == len(coll_idx) else b - 1
                if last_compute >= a:
                    rs = slice(a, last_compute + 1)
                    gs[:, j, rs], ge[:, j, rs] = _serial_gpu(ls[:, j, rs] + lat[:, j, rs], dur[:, j, rs], gpu)
                    gpu = ge[:, j, last_compute].copy()
                if seg == len(coll_idx):
                    break
                # the all-to-all: starts when this rank's GPU and launch are ready, ends for all at once
                arrive = np.maximum(ls[:, j, b] + lat[:, j, b], gpu)
                gpu = _all_to_all(coupling, s, seg, arrive, computing, (j, b), (gs, ge, wait_ns, xfer_ns, xfer_last),
                                  check=True)
                # host_sync: an extra stream sync after this combine, M ms beyond the GPU drain
                hit = (hs_coll == seg) & (hs_ns[:, j] > 0)
                if hit.any():
                    hs_b = np.where(hit, c, hs_b)
                    hs_e = np.where(hit, np.maximum(c, gpu) + hs_ns[:, j], hs_e)
                    c = np.where(hit, hs_e, c)
            sp["hs_b"][:, j], sp["hs_e"][:, j] = hs_b, hs_e
            fwd_last = prog.sampler_first - 1
            sp["ann_e"][:, j] = le[:, j, fwd_last] + ANN_PRE_NS
            sp["em_e"][:, j] = sp["ann_e"][:, j] + EXEC_PRE_NS
            sp["st_b"][:, j] = sp["em_e"][:, j] + 6_000
            # sampled-token copy + stream sync: the host waits for the GPU here
            sp["ss_b"][:, j] = le[:, j, k - 1] + SYNC_PRE_NS
            sp["ss_e"][:, j] = np.maximum(sp["ss_b"][:, j] + SYNC_MIN_NS, ge[:, j, k - 1] + SYNC_POST_NS)
            sp["st_e"][:, j] = c = sp["ss_e"][:, j] + post_sample[:, j]
            sp["upd_b"][:, j] = c = c + UPDATE_PRE_NS
            sp["upd_e"][:, j] = c = c + upd[:, j]
            sp["step_e"][:, j] = c = c + STEP_POST_NS
            c_next = c + inter[:, j]

        gpu_ns = np.where(self.is_coll, 0, ge - gs).sum(axis=-1)
        for (gi, j), (_, _, t_gs, t_ge) in tiny.items():
            gpu_ns[gi, j] += int((t_ge - t_gs).sum())
        res = ChunkResult(
            ranks=ranks, step0=step0, n=n, spans=sp, ls=ls, le=le, gs=gs, ge=ge,
            batch=batch, delay_ns=delay, loads=loads,
            comm_b=ls[..., coll_idx] - pre[..., coll_idx], comm_e=le[..., coll_idx] + post[..., coll_idx],
            tiny=tiny, n_prefill=n_prefill, prefill_tokens=prefill_tokens,
            gpu_ns=gpu_ns, wait_ns=wait_ns, xfer_ns=xfer_ns, xfer_last_ns=xfer_last,
        )
        return res, c_next, gpu

    def _lag_tokens(self, s, j, ranks, c, coupling: Coupling, computing: bool, batch, n_prefill, prefill_tokens,
                    tok_ns) -> None:
        """Lag replay: the step's tokens per rank, admitted by the step's start time (the earliest
        rank's: the ranks run in lockstep, and one shared instant keeps a lag of 0 a mirror)."""
        lt = coupling.lag_tokens
        assert lt is not None
        if computing:
            npf, ptk, ndc = self._lag_state.admit(s, int(c.min()))
            lt["n_prefill"][:, s], lt["prefill_tokens"][:, s], lt["n_decode"][:, s] = npf, ptk, ndc
        n_prefill[:, j] = lt["n_prefill"][ranks, s]
        prefill_tokens[:, j] = lt["prefill_tokens"][ranks, s]
        batch[:, j] = lt["n_decode"][ranks, s]
        tok_ns[:, j] = (prefill_tokens[:, j] + batch[:, j]) * np.int64(self.cfg.token_ns)
        if computing:
            self.mean_tok_ns_s = float((lt["prefill_tokens"][:, s] + lt["n_decode"][:, s]).mean()) * self.cfg.token_ns

    def _bench_chunk(self, ranks, step0, n, d, coupling: Coupling, c_next, gpu):
        """GPU-only run (vLLM's ``bench forward``): the same batches' forward back to back, replayed as a
        graph (the host far ahead of the GPU), timed by a sync after each; no scheduler, DP all-reduce,
        sampling or output processing. Same draws as the serving run, so the same kernel durations."""
        cfg, prog, inj = self.cfg, self.prog, self.inj
        g, k = len(ranks), prog.n
        steps = np.arange(step0, step0 + n)
        sl = np.ix_(ranks, steps)
        lat = stats.LAUNCH_LATENCY_US.ns(d["lat"])
        dur = np.rint(self.dur_med * np.exp(self.dur_sig * d["dur"])).astype(np.int64)
        load_scale = np.clip(1.0 + 0.05 * d["load"], 0.5, None)
        exp_dur = dur[..., self.expert_idx].astype(np.float64) * load_scale[..., self.expert_layer]
        hot = inj.hot_factor[sl] * (1.0 + inj.ms["hot_experts"][sl] * 1e6 / np.maximum(exp_dur.sum(-1), 1.0))
        dur[..., self.expert_idx] = np.rint(exp_dur * hot[..., None]).astype(np.int64)
        loads = np.rint(cfg.batch_per_rank * cfg.topk * load_scale * hot[..., None]).astype(np.int64)
        batch, n_prefill, prefill_tokens = d["batch"], None, None
        if self.replay is not None:  # the serving run's batches: decodes and prefills
            batch = self.replay.n_decode[sl]
            n_prefill, prefill_tokens = self.replay.n_prefill[sl], self.replay.prefill_tokens[sl]
        ls, le, gs, ge = (np.zeros((g, n, k), np.int64) for _ in range(4))
        sp = {f"{name}_{x}": np.zeros((g, n), np.int64) for name in SPANS for x in "be"}
        wait_ns = np.zeros((g, n), np.int64)
        xfer_ns = np.zeros((g, n), np.int64)
        xfer_last = np.zeros((g, n), np.int64)  # transfers at the sync points where this rank came last
        computing = not coupling.complete
        fwd_last = prog.sampler_first - 1
        pre = np.where(self.is_coll, COLL_PRE_NS, 0).astype(np.int64)
        post = np.where(self.is_coll, COLL_POST_NS, 0).astype(np.int64)
        step_inc = BENCH_GAP_NS + pre + BENCH_LAUNCH_NS + post  # (k,) host time per launch
        for j in range(n):
            s = step0 + j
            c = c_next.copy()
            sp["em_b"][:, j] = c
            sp["ann_b"][:, j] = c = c + ANN_PRE_NS
            # launches of the whole forward, back to back
            cum = c[:, None] + np.cumsum(step_inc[: fwd_last + 1])[None, :]
            ls[:, j, : fwd_last + 1] = cum - BENCH_LAUNCH_NS - post[: fwd_last + 1]
            le[:, j, : fwd_last + 1] = ls[:, j, : fwd_last + 1] + BENCH_LAUNCH_NS
            seg_start = 0
            for seg, b in enumerate(list(self.coll_idx) + [fwd_last + 1]):
                rs = slice(seg_start, b)
                if b > seg_start:
                    gs[:, j, rs], ge[:, j, rs] = _serial_gpu(ls[:, j, rs] + lat[:, j, rs], dur[:, j, rs], gpu)
                    gpu = ge[:, j, b - 1].copy()
                if b > fwd_last:
                    break
                arrive = np.maximum(ls[:, j, b] + lat[:, j, b], gpu)
                gpu = _all_to_all(coupling, s, seg, arrive, computing, (j, b), (gs, ge, wait_ns, xfer_ns, xfer_last))
                seg_start = b + 1
            sp["ss_b"][:, j] = le[:, j, fwd_last] + SYNC_PRE_NS
            sp["ss_e"][:, j] = np.maximum(sp["ss_b"][:, j] + SYNC_MIN_NS, ge[:, j, fwd_last] + SYNC_POST_NS)
            sp["ann_e"][:, j] = sp["ss_e"][:, j] + 1_000
            sp["em_e"][:, j] = sp["ann_e"][:, j] + EXEC_PRE_NS
            sp["step_b"][:, j], sp["step_e"][:, j] = sp["ann_b"][:, j], sp["ann_e"][:, j]
            c_next = sp["em_e"][:, j] + BENCH_INTERSTEP_NS
        coll_idx = self.coll_idx
        gpu_ns = np.where(self.is_coll, 0, ge - gs).sum(axis=-1)
        zeros = {kind: np.zeros((g, n), np.int64) for kind in INJECT_COLUMNS}
        res = ChunkResult(
            ranks=ranks, step0=step0, n=n, spans=sp, ls=ls, le=le, gs=gs, ge=ge, batch=batch, delay_ns=zeros,
            loads=loads, comm_b=ls[..., coll_idx] - pre[coll_idx], comm_e=le[..., coll_idx] + post[coll_idx],
            gpu_ns=gpu_ns, wait_ns=wait_ns, xfer_ns=xfer_ns, xfer_last_ns=xfer_last, bench=True,
            n_prefill=n_prefill, prefill_tokens=prefill_tokens,
        )
        return res, c_next, gpu



def _all_to_all(coupling, s: int, seg: int, arrive: np.ndarray, computing: bool, at: tuple[int, int],
                out: tuple[np.ndarray, ...], check: bool = False) -> np.ndarray:
    """The all-to-all of step ``s``, segment ``seg`` (kernel ``b`` of step ``j``, ``at``): it starts
    on each rank at its arrival and ends for all at once, the last arrival plus the transfer (set
    by the run that computes the coupling; ``check``: a coupled run never arrives later). Writes
    its GPU span, each rank's wait and transfer into ``out``; returns when each GPU is free."""
    gs, ge, wait_ns, xfer_ns, xfer_last = out
    j, b = at
    if computing:
        coupling.coll_end_ns[s, seg] = arrive.max() + coupling.xfer_ns[s, seg]
    elif check and (arrive > coupling.coll_end_ns[s, seg] - coupling.xfer_ns[s, seg]).any():
        raise AssertionError(f"step {s} collective {seg}: arrival after the coupled end")
    gs[:, j, b] = arrive
    ge[:, j, b] = coupling.coll_end_ns[s, seg]
    w = coupling.coll_end_ns[s, seg] - coupling.xfer_ns[s, seg] - arrive
    wait_ns[:, j] += w
    xfer_ns[:, j] += coupling.xfer_ns[s, seg]
    xfer_last[:, j] += np.where(w == 0, coupling.xfer_ns[s, seg], 0)
    return ge[:, j, b].copy()


def _serial_gpu(ready: np.ndarray, dur: np.ndarray, gpu_free: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """Ops on one stream in order: start_k = max(ready_k, end_{k-1}), end_k = start_k + dur_k.

    Closed form along the last axis: end_k = C_k + max(free, max_{j<=k}(ready_j - C_{j-1})) with
    C the cumulative durations, so it runs as numpy scans instead of a Python loop.
    """
    cum = np.cumsum(dur, axis=-1)
    cprev = cum - dur
    m = np.maximum.accumulate(ready - cprev, axis=-1)
    m = np.maximum(m, np.asarray(gpu_free)[..., None] if np.ndim(gpu_free) else gpu_free)
    start = cprev + m
    return start, start + dur
