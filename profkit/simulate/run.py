"""``simulate()``: compute a DEP-N timeline and write per-rank traces plus truth.json.

Pass 1 runs all ranks vectorised to fix the cross-rank sync ends and the truth; pass 2 writes
ranks in groups (a process pool when there are several groups), each group recomputing its own
timeline from the same per-rank random streams (see model.py). With one group (N <= group_size)
both happen in a single pass.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable

import numpy as np
import orjson

from profkit.simulate import identity as ident_mod
from profkit.simulate.clock import CONVENTION, host_clocks
from dataclasses import replace

from profkit.simulate.config import INJECT_KINDS, Inject, SimConfig
from profkit.simulate.identity import SPAN_NAMES, RankIdentity, identities
from profkit.simulate.kineto import KinetoRankWriter
from profkit.simulate.kineto import file_name as kineto_file
from profkit.simulate import replay as replay_mod
from profkit.simulate.model import ChunkResult, Coupling, Timeline
from profkit.simulate.replay import ReplayTokens
from profkit.simulate.nsys import NsysRankWriter
from profkit.simulate.nsys import file_name as nsys_file
from profkit.simulate.truth import Truth

EXPERT_LOADS_FILE = "expert_loads.json"
#: routed experts per EP rank the simulated loads stand for (written to expert_loads.json, so the
#: uniform-routing baseline can be computed for them)
EXPERTS_PER_RANK = 8


def simulate(
    ranks: int,
    steps: int,
    seed: int,
    out_dir: Path | str,
    fmt: str = "kineto",
    injects: Iterable[Inject] = (),
    **options,
) -> Truth:
    """Write ``ranks`` traces of ``steps`` engine steps into ``out_dir``; return (and write) the truth.

    ``options`` are further SimConfig fields (layers, ranks_per_host, offset_ms_max,
    drift_ppm_max, cpu_scale, group_size, workers, chunk_steps, ...). Same arguments, same bytes.
    """
    wall0 = time.perf_counter()
    cfg = SimConfig(ranks=ranks, steps=steps, seed=seed, fmt=fmt, injects=tuple(injects), **options)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clocks = host_clocks(seed, cfg.hosts, cfg.offset_ms_max, cfg.drift_ppm_max, cfg.start_epoch_ns)
    who = identities(cfg, clocks)
    timeline = Timeline(cfg)
    coupling = timeline.new_coupling()
    acc = _TruthAccumulator(cfg)
    all_ranks = np.arange(cfg.ranks)
    groups = [all_ranks[i:i + cfg.group_size] for i in range(0, cfg.ranks, cfg.group_size)]
    if len(groups) == 1:
        _write_group(cfg, groups[0], coupling, who, out, acc, timeline)
    else:
        for res in timeline.run(all_ranks, coupling):
            acc.add(res)
        workers = cfg.workers or min(os.cpu_count() or 1, len(groups))
        if workers <= 1:
            for grp in groups:
                _write_group(cfg, grp, coupling, who, out, None, None)
        else:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                futures = [pool.submit(_write_group, cfg, grp, coupling, who, out, None, None) for grp in groups]
                for fut in futures:
                    fut.result()
    truth = acc.finish(coupling, who, out, timeline)
    truth.wall_s = round(time.perf_counter() - wall0, 3)
    truth.write(out / "truth.json")
    return truth


def _write_group(
    cfg: SimConfig,
    ranks: np.ndarray,
    coupling: Coupling,
    who: list[RankIdentity],
    out: Path,
    acc: "_TruthAccumulator | None",
    timeline: Timeline | None,
) -> None:
    """Recompute the timeline of ``ranks`` and stream it into one writer per rank."""
    timeline = timeline or Timeline(cfg)
    writer_cls = KinetoRankWriter if cfg.fmt == "kineto" else NsysRankWriter
    writers = [writer_cls(out, cfg, timeline.prog, who[int(r)]) for r in ranks]
    try:
        for res in timeline.run(ranks, coupling):
            if acc is not None:
                acc.add(res)
            for gi, w in enumerate(writers):
                w.write_chunk(res, gi)
    finally:
        for w in writers:
            w.close()


class _TruthAccumulator:
    """Collects truth from pass-1 chunks (all ranks) without keeping the timeline."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.rows: list[list] = []
        self.loads = np.zeros((cfg.steps, cfg.layers, cfg.ranks), dtype=np.int64)
        self.step_b = np.zeros(cfg.steps, dtype=np.int64)
        self.step_e = np.zeros(cfg.steps, dtype=np.int64)
        self.parts = {k: np.zeros((cfg.steps, cfg.ranks), dtype=np.int64) for k in ("step", "gpu", "wait", "xfer", "xfer_last")}
        self.tokens = np.zeros((cfg.steps, cfg.ranks), dtype=np.int64)

    def add(self, res: ChunkResult) -> None:
        s0, n = res.step0, res.n
        for kind in INJECT_KINDS:
            arr = res.delay_ns[kind]
            for gi, j in zip(*np.nonzero(arr)):
                self.rows.append([s0 + int(j), int(res.ranks[gi]), kind, int(arr[gi, j])])
        self.loads[s0:s0 + n, :, res.ranks] = res.loads.transpose(1, 2, 0)
        self.step_b[s0:s0 + n] = res.spans["step_b"].min(axis=0)
        self.step_e[s0:s0 + n] = res.spans["step_e"].max(axis=0)
        self.tokens[s0:s0 + n, res.ranks] = res.tokens.T
        self.parts["step"][s0:s0 + n, res.ranks] = (res.spans["step_e"] - res.spans["step_b"]).T
        for key in ("gpu", "wait", "xfer", "xfer_last"):
            self.parts[key][s0:s0 + n, res.ranks] = getattr(res, f"{key}_ns").T

    def decomposition(self) -> dict:
        """truth.json's ``decomposition``: every step split into GPU, host, waiting and transfer."""
        return decomposition_truth(self.parts)

    def finish(self, coupling: Coupling, who: list[RankIdentity], out: Path, timeline: Timeline) -> Truth:
        cfg = self.cfg
        self.rows.sort(key=lambda r: (r[0], r[1], r[2]))
        causes = []
        for inj in cfg.injects:
            steps = inj.steps(cfg.steps)
            applied = [r[3] for r in self.rows if r[1] == inj.rank and r[2] == inj.kind]
            ms = inj.ms_per_step if inj.factor is None else (sum(applied) / max(len(steps), 1) / 1e6)
            causes.append({
                "kind": inj.kind, "rank": inj.rank, "steps": steps, "ms": round(ms, 6), "every": inj.every,
                "total_ns": int(sum(applied)), **({"factor": inj.factor} if inj.factor is not None else {}),
            })
        (out / EXPERT_LOADS_FILE).write_bytes(orjson.dumps({
            "layout": "tokens[step][layer][rank]: tokens routed to the experts hosted on each rank",
            "steps": cfg.steps, "layers": cfg.layers, "ranks": cfg.ranks, "topk": cfg.topk,
            "experts": cfg.ranks * EXPERTS_PER_RANK,
            "tokens": self.loads,
        }, option=orjson.OPT_SERIALIZE_NUMPY))
        file_of = kineto_file if cfg.fmt == "kineto" else nsys_file
        params = {
            "ranks": cfg.ranks, "steps": cfg.steps, "seed": cfg.seed, "format": cfg.fmt, "layers": cfg.layers,
            "ranks_per_host": cfg.ranks_per_host, "hosts": cfg.hosts, "batch_per_rank": cfg.batch_per_rank,
            "topk": cfg.topk, "offset_ms_max": cfg.offset_ms_max, "drift_ppm_max": cfg.drift_ppm_max,
            "cpu_scale": cfg.cpu_scale, "start_epoch_ns": cfg.start_epoch_ns,
            "injects": [inj.to_json() for inj in cfg.injects],
        }
        params.update(gpu_scale=cfg.gpu_scale, host_jitter_ms=cfg.host_jitter_ms, bench_forward=cfg.bench_forward)
        extra = {"decomposition": self.decomposition()}
        if timeline.replay is not None:
            params.update(replay=cfg.replay, replay_seed=cfg.replay_seed, token_ns=cfg.token_ns, workload=cfg.workload)
            extra["replay"] = replay_truth(cfg, timeline.replay, coupling)
        elif timeline.lag:
            params.update(replay=cfg.replay, replay_seed=cfg.replay_seed, token_ns=cfg.token_ns, workload=cfg.workload,
                          lag_ms=cfg.lag_ms)
            extra["replay"] = lag_truth(cfg, coupling, self)
        if cfg.bench_forward:
            extra["bench_forward"] = bench_truth(cfg, self)
        return Truth(
            params=params,
            convention=CONVENTION,
            t0_ns=cfg.start_epoch_ns,
            offsets_ns=[w.clock.offset_ns for w in who],
            drift_ppm=[w.clock.drift_ppm for w in who],
            hosts=[w.host for w in who],
            devices=[w.device for w in who],
            pids=[w.pid for w in who],
            stragglers=sorted({inj.rank for inj in cfg.injects}),
            causes=causes,
            injected_delay_ns={"columns": ["step", "rank", "kind", "delay_ns"], "rows": self.rows},
            sync={
                "dp_allreduce_end_ns": coupling.dp_end_ns.tolist(),
                "collective_end_ns": coupling.coll_end_ns.tolist(),
                "collective_order": "per step: dispatch(layer 0), combine(layer 0), dispatch(layer 1), ...",
                "ep_seq_base": ident_mod.EP_SEQ_BASE,
                "dp_seq_base": ident_mod.DP_SEQ_BASE,
                "ep_group": ident_mod.PG_EP,
                "dp_group": ident_mod.PG_DP_CPU,
            },
            steps_true_ns=[[int(b), int(e)] for b, e in zip(self.step_b, self.step_e)],
            span_names=dict(SPAN_NAMES),
            files=[file_of(r) for r in range(cfg.ranks)],
            expert_loads_file=EXPERT_LOADS_FILE,
            extra=extra,
        )


def replay_truth(cfg: SimConfig, rep: ReplayTokens, coupling: Coupling) -> dict:
    """truth.json's ``replay``: what was replayed and the DP-imbalance cost it carries (see truth.py)."""
    tokens = rep.tokens  # (N, S)
    mean, mx = tokens.mean(axis=0), tokens.max(axis=0)
    cost = coupling.dp_cost_vs_mirror_ns
    imbalance = coupling.dp_imbalance_ns
    assert cost is not None and imbalance is not None
    with np.errstate(invalid="ignore", divide="ignore"):
        balancedness = np.where(mx > 0, mean / np.maximum(mx, 1), np.nan)
    return {
        "mode": rep.mode, "seed": cfg.replay_seed, "token_ns": cfg.token_ns,
        "balancer": replay_mod.BALANCER if rep.mode == "round-robin" else "copy r -> rank r",
        "lag_steps": replay_mod.LAG_STEPS if rep.mode == "round-robin" else 0,
        "rate_per_step": replay_mod.RATE, "warmup_steps": replay_mod.WARMUP,
        "prompt": {"median": replay_mod.PROMPT_MEDIAN, "sigma": replay_mod.PROMPT_SIGMA,
                   "range": list(replay_mod.PROMPT_RANGE)},
        "output_range": list(replay_mod.OUTPUT_RANGE),
        "base_requests": int(rep.requests[:, 0].max() + 1) if len(rep.requests) else 0,
        "requests": {"columns": ["base", "copy", "rank", "arrival_step", "prompt_tokens", "output_tokens"],
                     "rows": rep.requests},
        "tokens": np.ascontiguousarray(tokens.T),  # [step][rank]
        "mirror_tokens": rep.mirror_tokens,  # [step]: every rank, in the mirror replay
        "tokens_served": int(tokens.sum()),
        "mirror_tokens_served": int(rep.mirror_tokens.sum()) * cfg.ranks,
        "balancedness": [None if not np.isfinite(b) else float(b) for b in balancedness],
        "padding_tokens": int(np.rint((mx - mean).sum() * cfg.ranks)),
        "cost_ns": cost,
        "cost_ns_mean": float(cost.mean()),
        "imbalance_ns": imbalance,
        "imbalance_ns_mean": float(imbalance.mean()),
    }


def decomposition_truth(parts: dict[str, np.ndarray]) -> dict:
    """Per step (mean over ranks) and overall: step time = GPU computing + transfers + waiting + host.

    ``gpu_ns``: kernels and copies the rank ran in the step; ``wait_ns``: at every sync point (DP
    all-reduce, each all-to-all) the last arrival minus the rank's own; ``transfer_ns``: the sync
    points' own time once all had arrived; ``host_ns``: the rest (the GPU idle while the host
    worked). A trace shows a waiting rank's transfer only as the end of its wait, so the split a
    trace can give is ``observed``: ``wait_ns`` = waiting plus the transfers of the sync points where
    the rank was not last (profkit: ``waiting for rank k`` / ``wait:*``), ``gpu_ns`` = computing plus
    the transfers where it was last (``transfer:*``), ``host_ns`` the same."""
    step, gpu, wait, xfer, last = (parts[k].astype(np.float64) for k in ("step", "gpu", "wait", "xfer", "xfer_last"))
    host = step - gpu - wait - xfer
    per = {"step_ns": step, "gpu_ns": gpu, "wait_ns": wait, "transfer_ns": xfer, "host_ns": host}
    out: dict = {k + "_mean": float(v.mean()) for k, v in per.items()}
    out["per_step"] = {k: v.mean(axis=1) for k, v in per.items()}
    obs = {"step_ns": step, "gpu_ns": gpu + last, "host_ns": host, "wait_ns": wait + xfer - last}
    out["observed"] = {k + "_mean": float(v.mean()) for k, v in obs.items()}
    out["observed"]["per_step"] = {k: v.mean(axis=1) for k, v in obs.items()}
    return out


def lag_truth(cfg: SimConfig, coupling: Coupling, acc: "_TruthAccumulator") -> dict:
    """truth.json's ``replay`` for the lag replay: what was replayed, when each rank admitted it, and the
    known cost: this run's throughput against its mirror twin (same seeds, lag 0), computed here."""
    lag = coupling.lag_replay
    assert lag is not None and coupling.dp_imbalance_ns is not None
    tokens = acc.tokens  # [step][rank]
    twin_step, twin_tokens = mirror_twin(cfg)
    step_mean, twin_mean = acc.parts["step"].mean(axis=1), twin_step.mean(axis=1)
    mx, mean = tokens.max(axis=1), tokens.mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        balancedness = np.where(mx > 0, mean / np.maximum(mx, 1), np.nan)
    thr = float(tokens.sum() / step_mean.sum() * 1e9)
    twin_thr = float(twin_tokens.sum() / twin_mean.sum() * 1e9)
    return {
        "mode": "lag", "seed": cfg.replay_seed, "token_ns": cfg.token_ns, "workload": cfg.workload,
        "lag_ms": cfg.lag_ms, "lag_ns_per_rank": lag.shift, "nominal_step_ns": replay_mod.NOMINAL_STEP_NS,
        "balancer": "copy r -> rank r, r x lag later",
        "base_requests": int(len(lag.base)),
        "requests": {"columns": ["base", "copy", "rank", "arrival_step", "admitted_step", "prompt_tokens",
                                 "output_tokens"], "rows": lag.requests_table()},
        "tokens": tokens, "tokens_served": int(tokens.sum()),
        "balancedness": [None if not np.isfinite(b) else float(b) for b in balancedness],
        "step_ns_mean": step_mean,
        "imbalance_ns": coupling.dp_imbalance_ns, "imbalance_ns_mean": float(coupling.dp_imbalance_ns.mean()),
        "throughput_tokens_per_s": thr,
        "mirror_twin": {"step_ns_mean": twin_mean, "tokens": twin_tokens, "tokens_served": int(twin_tokens.sum()),
                        "throughput_tokens_per_s": twin_thr},
        "throughput_change": thr / twin_thr - 1.0,
    }


def mirror_twin(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    """(step ns, tokens), each [step][rank], of the mirror replay with this run's seeds (no files)."""
    twin = Timeline(replace(cfg, replay="mirror"))
    coupling = twin.new_coupling()
    steps = np.zeros((cfg.steps, cfg.ranks), np.int64)
    tokens = np.zeros((cfg.steps, cfg.ranks), np.int64)
    for res in twin.run(np.arange(cfg.ranks), coupling):
        steps[res.step0:res.step0 + res.n] = (res.spans["step_e"] - res.spans["step_b"]).T
        tokens[res.step0:res.step0 + res.n] = res.tokens.T
    return steps, tokens


def bench_truth(cfg: SimConfig, acc: "_TruthAccumulator") -> dict:
    """truth.json's ``bench_forward``: the serving run with the same seeds (computed here, no files) and
    the gap of each of its steps over this GPU-only run, with the serving step's split."""
    serving = Timeline(replace(cfg, bench_forward=False))
    coupling = serving.new_coupling()
    parts = {k: np.zeros((cfg.steps, cfg.ranks), np.int64) for k in ("step", "gpu", "wait", "xfer", "xfer_last")}
    spans = {k: np.zeros((cfg.steps, cfg.ranks), np.int64) for k in ("sched", "prep", "dp", "st", "upd", "gc")}
    for res in serving.run(np.arange(cfg.ranks), coupling):
        sl = slice(res.step0, res.step0 + res.n)
        parts["step"][sl, res.ranks] = (res.spans["step_e"] - res.spans["step_b"]).T
        for key in ("gpu", "wait", "xfer", "xfer_last"):
            parts[key][sl, res.ranks] = getattr(res, f"{key}_ns").T
        for key in spans:
            spans[key][sl, res.ranks] = (res.spans[f"{key}_e"] - res.spans[f"{key}_b"]).T
    gpu_only = acc.parts["step"].astype(np.float64)
    gap = parts["step"] - gpu_only
    return {
        "gpu_only_step_ns": gpu_only.mean(axis=1), "serving_step_ns": parts["step"].mean(axis=1),
        "gap_ns": gap.mean(axis=1), "gap_ns_mean": float(gap.mean()),
        "gpu_only_step_ns_mean": float(gpu_only.mean()), "serving_step_ns_mean": float(parts["step"].mean()),
        "serving": decomposition_truth(parts),
        "serving_spans_ns_mean": {name: float(spans[key].mean()) for key, name in
                                  (("sched", "Scheduler.schedule"), ("prep", "prepare_inputs"), ("dp", "dp_allreduce"),
                                   ("st", "sample_tokens"), ("upd", "update_from_output"), ("gc", "gc.collect"))},
    }
