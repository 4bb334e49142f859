"""Load balance across ranks: EP balancedness per MoE layer and step, DP imbalance per step.

Why: in a DEP deployment every rank waits at each MoE layer for the most loaded one, so the
step costs what the MAXIMUM load costs while the work done is the MEAN load.
``balancedness = mean / max`` (1.0 = perfectly balanced; 0.5 = the hottest rank does twice the
average and half the fleet's expert time is waiting). The same ratio over tokens per DP rank
per step is the DP imbalance (a rank given a bigger batch is a straggler by construction).

Expert loads come as a long table ``LOAD_COLUMNS`` (``rank, step, layer, tokens``: tokens routed
to the experts a rank hosts). Parsers in ``profkit.ingest.expert_loads`` turn the known formats
into it (pure: they take text or parsed JSON, never a path; ``read_expert_loads`` reads the file):

- ``parse_engine_steps``: profkit's engine ``rank{r}.steps.jsonl`` (``expert_recv[layer][local
  expert]``: tokens received by the rank's local experts);
- ``parse_sim_expert_loads``: the simulator's ``expert_loads.json`` (``tokens[step][layer][rank]``);
- ``parse_expert_loads``: either of those, or CSV with the ``LOAD_COLUMNS`` header.

Where the source says how tokens were routed (the simulator's JSON: ``experts``, ``topk``; engine
records: one load per global expert and the step's token count), the parsers keep it in the
table's ``attrs["routing"]`` (``{"experts": E, "topk": K}``); ``--experts``/``--topk`` give it for a
CSV. With it, ``ep_balance`` adds the uniform-routing baseline of the same batches
(``profkit.analyze.uniform``): what balancedness the step would have with experts picked
uniformly at random, and the gap to it (``UNIFORM_COLUMNS``). vLLM's own load statistics
(``EplbState.expert_load_pass``, per MoE layer and physical expert) become this CSV once a
capture records them per step: rank = physical expert // local physical experts.

``dp_imbalance_cost`` prices DP imbalance from two analyses of the same requests, a mirror replay
(every rank an identical copy: balanced) and a lag replay (the same copies through a DP balancer):
the step-time change per step and per token served, with bootstrap intervals (``profkit compare``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profkit import distinct, schema
from profkit.analyze.jsonable import json_scalar
from profkit.analyze.steps import VLLM_STEP_RE, batch_fact_arrays
from profkit.ingest.expert_loads import (  # noqa: F401 - the parsers live in ingest; read as balance.* too
    LOAD_COLUMNS, ROUTING_ATTR, LoadsFormatError, parse_engine_steps, parse_expert_loads, parse_sim_expert_loads,
)

if TYPE_CHECKING:
    from profkit.analyze.overhead_rank import EventArrays

NO_RANK = -1  # ``max_rank`` when every rank has the same load
EP_COLUMNS = ["step", "layer", "n_ranks", "total_tokens", "mean_tokens", "max_tokens", "max_rank", "balancedness"]
#: added to ``EP_COLUMNS`` where the routing (experts, top-k) is known: the batch's tokens
#: (total_tokens / topk), the uniform-routing baseline's mean, std and 95% band, and the
#: recoverable gap (baseline mean - real balancedness: the most expert balancing can recover)
UNIFORM_COLUMNS = ["step_tokens", "uniform_balancedness", "uniform_std", "uniform_lo", "uniform_hi", "recoverable"]
EP_LAYER_COLUMNS = ["layer", "n_steps", "balancedness_mean", "balancedness_p10", "balancedness_window", "hot_rank",
                    "hot_rank_share"]
DP_COLUMNS = ["step", "n_ranks", "total_tokens", "mean_tokens", "max_tokens", "max_rank", "min_tokens",
              "balancedness", "imbalance"]
DP_RANK_COLUMNS = ["rank", "n_steps", "tokens_mean", "tokens_share", "times_max"]



# ---- EP balancedness -------------------------------------------------------------------------
def routing_of(loads: pd.DataFrame | None, experts: int | None = None, topk: int | None = None) -> dict | None:
    """``{"experts", "topk"}`` for the uniform baseline: the flags where given, else what the loads'
    source said (``attrs["routing"]``); None when either is unknown."""
    known = dict(loads.attrs.get(ROUTING_ATTR) or {}) if loads is not None else {}
    if experts is not None:
        known["experts"] = int(experts)
    if topk is not None:
        known["topk"] = int(topk)
    if not known.get("experts") or not known.get("topk"):
        return None
    if known["topk"] > known["experts"]:
        raise ValueError(f"top-k {known['topk']} exceeds the {known['experts']} experts")
    return known


def ep_balance(loads: pd.DataFrame, routing: dict | None = None, draws: int = 100, seed: int = 0) -> pd.DataFrame:
    """Per (step, layer): tokens over ranks, the hottest rank (``NO_RANK`` on a tie of all) and
    ``balancedness`` = mean / max (NaN where no rank got a token). Where the routing is known
    (``routing`` or the loads' ``attrs``), ``UNIFORM_COLUMNS`` follow: the uniform-routing baseline
    of a batch of ``step_tokens`` = total_tokens / topk tokens (seeded Monte Carlo, ``draws`` per
    batch size) and ``recoverable`` = baseline mean - balancedness."""
    if loads is None or not len(loads):
        return _empty(EP_COLUMNS)
    routing = routing if routing is not None else routing_of(loads)
    out = _ep_real(loads)
    return _with_uniform(out, routing, draws, seed) if routing is not None else out


def _with_uniform(per: pd.DataFrame, routing: dict, draws: int, seed: int) -> pd.DataFrame:
    from profkit.analyze.uniform import baselines_for_sizes

    experts, topk = int(routing["experts"]), int(routing["topk"])
    per = per.copy()
    per["step_tokens"] = np.rint(per["total_tokens"] / topk).astype("int64")
    for c in UNIFORM_COLUMNS[1:]:
        per[c] = np.nan
    for n_ranks, idx in per.groupby("n_ranks").groups.items():
        if n_ranks < 2 or experts < n_ranks:
            continue  # one rank is always balanced; fewer experts than ranks: no linear placement
        base = baselines_for_sizes(int(n_ranks), experts, topk, per.loc[idx, "step_tokens"].to_numpy(), draws, seed)
        for key, col in (("mean", "uniform_balancedness"), ("std", "uniform_std"), ("lo", "uniform_lo"),
                         ("hi", "uniform_hi")):
            per.loc[idx, col] = base[key]
    per["recoverable"] = per["uniform_balancedness"] - per["balancedness"]
    per.attrs[ROUTING_ATTR] = dict(routing)
    return per


def _ep_real(loads: pd.DataFrame) -> pd.DataFrame:
    g = loads.groupby(["step", "layer"], sort=True)["tokens"]
    out = pd.DataFrame({"n_ranks": g.size(), "total_tokens": g.sum(), "max_tokens": g.max()})
    out["mean_tokens"] = out["total_tokens"] / out["n_ranks"]
    hot = loads.sort_values(["tokens", "rank"], ascending=[False, True], kind="stable")
    out["max_rank"] = hot.groupby(["step", "layer"], sort=True)["rank"].first()
    out.loc[out["max_tokens"] == g.min(), "max_rank"] = NO_RANK  # all equal: no hottest rank
    out["balancedness"] = out["mean_tokens"] / out["max_tokens"].where(out["max_tokens"] > 0)
    return out.reset_index().astype({"n_ranks": "int64", "total_tokens": "int64", "max_tokens": "int64",
                                     "max_rank": "int64"})[EP_COLUMNS]


def ep_balance_by_layer(loads: pd.DataFrame, per: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per MoE layer over the window: mean and 10th percentile (the bad steps) of the per-step
    balancedness, the balancedness of the tokens summed over the window (imbalance that
    averages out over steps vs. a persistently hot rank), and the hottest rank over the window
    with its share of the layer's tokens; with ``per`` (``ep_balance``'s table) carrying the
    uniform baseline, also its mean and the mean recoverable gap."""
    per = ep_balance(loads) if per is None else per
    if not len(per):
        return _empty(EP_LAYER_COLUMNS)
    g = per.groupby("layer", sort=True)["balancedness"]
    out = pd.DataFrame({"n_steps": g.size(), "balancedness_mean": g.mean(), "balancedness_p10": g.quantile(0.1)})
    window = loads.groupby(["layer", "rank"])["tokens"].sum()
    w = window.groupby(level=0)
    out["balancedness_window"] = (w.mean() / w.max().where(w.max() > 0))
    out["hot_rank"] = window.groupby(level=0).idxmax().map(lambda k: int(k[1]))
    out["hot_rank_share"] = w.max() / w.sum().where(w.sum() > 0)
    cols = list(EP_LAYER_COLUMNS)
    if "uniform_balancedness" in per:
        gu = per.groupby("layer", sort=True)
        out["uniform_balancedness_mean"] = gu["uniform_balancedness"].mean()
        out["recoverable_mean"] = gu["recoverable"].mean()
        cols += ["uniform_balancedness_mean", "recoverable_mean"]
    return out.reset_index().astype({"n_steps": "int64", "hot_rank": "int64"})[cols]


# ---- DP imbalance ----------------------------------------------------------------------------
def step_tokens(steps: pd.DataFrame, events: pd.DataFrame | None = None,
                arrays: "EventArrays | None" = None) -> pd.DataFrame:
    """``rank, step, num_tokens, batch_size``: the step table's own columns, or, when the step marker
    carries no token count (``EngineCore.step``), the vLLM annotation ``execute_context_N(tok)_
    generation_N(tok)`` that starts inside each step on the same rank (summed if several).
    ``arrays``: ``overhead.event_arrays(events)``, when the caller has them (names factorized).
    Arrays, not a frame per rank: a rank's few hundred steps made each pandas call cost more than
    its work."""
    cols = ["rank", "step", "num_tokens", "batch_size"]
    if steps is None or not len(steps):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
    have = {c: pd.array(steps[c] if c in steps else pd.Series(pd.NA, index=steps.index), dtype="Int64")
            for c in ("num_tokens", "batch_size")}
    if not have["num_tokens"].isna().any() or events is None or not len(events):
        return _own(steps, have)
    # the regex once per distinct name, and only the annotations' rows taken (a rank has hundreds
    # of thousands of host rows and a few hundred distinct names)
    is_host = distinct.isin(events["kind"], (schema.CPU_SPAN, schema.CPU_OP))
    named = arrays.factorized_names(events) if arrays is not None else None
    codes, uniques = named if named is not None else pd.factorize(events["name"], use_na_sentinel=True)
    text = [str(u) for u in uniques]
    rows = np.flatnonzero(is_host & distinct.regex_flags(text, codes, VLLM_STEP_RE, missing=None))
    if not len(rows):
        return _own(steps, have)
    _, a_batch, a_tokens = batch_fact_arrays(np.asarray(text, dtype=object)[codes[rows]])
    a_rank = events["rank"].iloc[rows].to_numpy(np.int64)
    a_start = events["start_ns"].iloc[rows].to_numpy(np.int64)
    rank, step = steps["rank"].to_numpy(np.int64), steps["step"].to_numpy(np.int64)
    start, end = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    order = np.lexsort((start, rank))  # each rank's steps by start
    a_order = np.lexsort((a_start, a_rank))  # and its annotations (stable)
    rank, step, start, end = rank[order], step[order], start[order], end[order]
    a_rank, a_start, a_batch, a_tokens = a_rank[a_order], a_start[a_order], a_batch[a_order], a_tokens[a_order]
    at = np.full(len(a_rank), -1, dtype=np.int64)  # each annotation's step (position), -1: none
    lo = np.searchsorted(rank, a_rank, side="left")
    hi = np.searchsorted(rank, a_rank, side="right")
    for r in np.unique(a_rank).tolist():  # per rank: the step each annotation starts in
        mine = np.flatnonzero(a_rank == r)
        first, last = int(lo[mine[0]]), int(hi[mine[0]])
        if first == last:  # a rank without steps
            continue
        j = np.searchsorted(start[first:last], a_start[mine], side="right") - 1
        ok = (j >= 0) & (a_start[mine] < end[first:last][np.maximum(j, 0)])
        at[mine[ok]] = first + j[ok]
    out = {"rank": rank, "step": step}
    for col, values in (("num_tokens", a_tokens), ("batch_size", a_batch)):
        known = have[col][order]
        out[col] = known.fillna(_summed(values, at, at >= 0, len(rank))) if known.isna().any() else known
    final = np.lexsort((start, step, rank))  # as a stable sort by (rank, step) of the steps by start
    return _kept_attrs(pd.DataFrame({c: v[final] for c, v in out.items()}), steps)


def _own(steps: pd.DataFrame, have: dict) -> pd.DataFrame:
    """``step_tokens`` of the steps' own columns (their index kept)."""
    return _kept_attrs(pd.DataFrame({"rank": steps["rank"].astype("int64"), "step": steps["step"].astype("int64")}
                                    | have), steps)


def _kept_attrs(out: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``out`` with the steps' ``attrs`` (their dropped steps), as pandas carries them through a
    selection of the steps' columns."""
    out.attrs = copy.deepcopy(steps.attrs)
    return out


def _summed(values: np.ndarray, step: np.ndarray, inside: np.ndarray, n: int) -> pd.arrays.IntegerArray:
    """Per step (``step``: each value's step position, where ``inside``; ``n`` steps): the sum of
    its values, rounded; missing where it has none that is not NaN (a sum of ``min_count=1``;
    token counts and batch sizes are whole numbers, so any order of summing gives the same)."""
    ok = inside & ~np.isnan(values)
    counts = np.bincount(step[ok], minlength=n)
    sums = np.bincount(step[ok], weights=values[ok], minlength=n)
    return pd.arrays.IntegerArray(np.rint(sums).astype(np.int64), counts == 0)


def dp_imbalance(steps: pd.DataFrame, events: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per step: tokens per DP rank (``step_tokens``), the largest batch and ``balancedness`` =
    mean / max, ``imbalance`` = max / mean. Steps where no rank's token count is known are left out."""
    tok = step_tokens(steps, events).dropna(subset=["num_tokens"])
    if not len(tok):
        return _empty(DP_COLUMNS)
    tok = tok.astype({"num_tokens": "int64"})
    g = tok.groupby("step", sort=True)["num_tokens"]
    out = pd.DataFrame({"n_ranks": g.size(), "total_tokens": g.sum(), "max_tokens": g.max(), "min_tokens": g.min()})
    out["mean_tokens"] = out["total_tokens"] / out["n_ranks"]
    hot = tok.sort_values(["num_tokens", "rank"], ascending=[False, True], kind="stable")
    out["max_rank"] = hot.groupby("step", sort=True)["rank"].first()
    out.loc[out["max_tokens"] == out["min_tokens"], "max_rank"] = NO_RANK  # all equal: no largest batch
    out["balancedness"] = out["mean_tokens"] / out["max_tokens"].where(out["max_tokens"] > 0)
    out["imbalance"] = out["max_tokens"] / out["mean_tokens"].where(out["mean_tokens"] > 0)
    return out.reset_index().astype({"n_ranks": "int64", "total_tokens": "int64", "max_tokens": "int64",
                                     "min_tokens": "int64", "max_rank": "int64"})[DP_COLUMNS]


def dp_rank_summary(steps: pd.DataFrame, events: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per DP rank: mean tokens per step, its share of all tokens, and how often it had the
    largest batch (a rank always given more is a structural straggler)."""
    tok = step_tokens(steps, events).dropna(subset=["num_tokens"])
    if not len(tok):
        return _empty(DP_RANK_COLUMNS)
    tok = tok.astype({"num_tokens": "int64"})
    per = dp_imbalance(steps, events)
    g = tok.groupby("rank", sort=True)["num_tokens"]
    out = pd.DataFrame({"n_steps": g.size(), "tokens_mean": g.mean(), "tokens_share": g.sum() / tok["num_tokens"].sum()})
    out["times_max"] = per.loc[per["max_rank"] != NO_RANK, "max_rank"].value_counts().reindex(out.index).fillna(0).astype("int64")
    return out.reset_index().astype({"rank": "int64", "n_steps": "int64"})[DP_RANK_COLUMNS]


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64" if ("balanced" in c or c in ("mean_tokens", "imbalance",
                                                                                     "tokens_mean", "tokens_share",
                                                                                     "hot_rank_share"))
                                      else "int64") for c in columns})


# ---- DP-imbalance cost: a mirror and a lag replay of the same requests ----------------------------
#: columns of ``dp_imbalance_cost.csv`` (one row per metric; CI columns NaN for point-only rows)
DP_COST_COLUMNS = ["metric", "unit", "base", "cand", "delta", "delta_lo", "delta_hi", "rel", "rel_lo", "rel_hi",
                   "significant"]
DP_STEP_COLUMNS = ["step", "n_ranks", "step_ns_sum", "total_tokens", "mean_tokens", "max_tokens", "balancedness",
                   "wait_ns_sum"]
_DP_SOURCE = "dp_imbalance"  # one bootstrap stream per side for every DP metric


def dp_step_samples(steps: pd.DataFrame, dp: pd.DataFrame | None,
                    cause_steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per step with known token counts (the bootstrap unit; ranks of one step move together):
    summed step time over ranks, tokens (from ``dp_imbalance``'s table), balancedness, and the time
    ranks spent waiting for others (``vocabulary.is_wait_cause`` rows of ``cause_steps``; NaN when unknown).
    Steps without token counts are left out: no token count, no imbalance to price."""
    if steps is None or not len(steps) or dp is None or not len(dp):
        return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("mean_tokens", "balancedness", "wait_ns_sum")
                                          else "int64") for c in DP_STEP_COLUMNS})
    g = steps.groupby("step", sort=True)["step_ns"]
    per = pd.DataFrame({"n_ranks": g.size(), "step_ns_sum": g.sum()}).reset_index()
    tok = dp[["step", "total_tokens", "mean_tokens", "max_tokens", "balancedness"]]
    per = per.merge(tok, on="step", how="inner")
    if cause_steps is not None:
        from profkit.analyze.vocabulary import WAIT, kinds_of

        waits = cause_steps[(kinds_of(cause_steps["cause"]) == WAIT).to_numpy(dtype=bool)]
        per["wait_ns_sum"] = per["step"].map(waits.groupby("step")["ns"].sum()).fillna(0).astype("float64")
    else:
        per["wait_ns_sum"] = np.nan
    return per.astype({"step": "int64", "n_ranks": "int64", "step_ns_sum": "int64", "total_tokens": "int64",
                       "max_tokens": "int64", "mean_tokens": "float64", "balancedness": "float64"})[DP_STEP_COLUMNS]


@dataclass
class DpCostMetric:
    """One row of the DP-imbalance section: both sides, the change and its bootstrap interval."""

    metric: str
    unit: str  # "ns", "ns/token", "ratio", "tokens"
    base: float
    cand: float
    delta: float = math.nan
    delta_ci: tuple[float, float] = (math.nan, math.nan)
    rel: float = math.nan
    rel_ci: tuple[float, float] = (math.nan, math.nan)

    @property
    def significant(self) -> bool:
        """The interval of the change excludes 0 (False where there is no interval)."""
        lo, hi = self.delta_ci
        return bool(math.isfinite(lo) and math.isfinite(hi) and (lo > 0 or hi < 0))

    def row(self) -> dict:
        return {"metric": self.metric, "unit": self.unit, "base": self.base, "cand": self.cand, "delta": self.delta,
                "delta_lo": self.delta_ci[0], "delta_hi": self.delta_ci[1], "rel": self.rel,
                "rel_lo": self.rel_ci[0], "rel_hi": self.rel_ci[1], "significant": self.significant}


@dataclass
class DpCost:
    """The DP-imbalance section of ``profkit compare``: BASE (the mirror) vs CAND (the lag)."""

    available: bool
    headline: str
    metrics: list[DpCostMetric] = field(default_factory=list)
    sides: dict[str, dict] = field(default_factory=dict)  # "base"/"cand": balancedness summary
    wait_share: float = math.nan  # waiting change / mean step-time change
    paired: bool = False  # step resamples shared by both sides (they replay the same steps)
    significant: bool = False  # CAND is less balanced and its step time significantly longer
    notes: list[str] = field(default_factory=list)
    confidence: float = 0.95

    def get(self, name: str) -> DpCostMetric | None:
        return next((m for m in self.metrics if m.metric == name), None)

    def to_frame(self) -> pd.DataFrame:
        """``dp_imbalance_cost.csv``: ``DP_COST_COLUMNS``, one row per metric."""
        if not self.metrics:
            return pd.DataFrame({c: pd.Series(dtype="object") for c in DP_COST_COLUMNS})
        return pd.DataFrame([m.row() for m in self.metrics])[DP_COST_COLUMNS]

    def to_dict(self) -> dict:
        clean = json_scalar

        return {"available": self.available, "headline": self.headline, "confidence": self.confidence,
                "paired": self.paired, "significant": self.significant,
                "wait_share": clean(self.wait_share), "notes": self.notes,
                "sides": {k: {kk: clean(vv) for kk, vv in v.items()} for k, v in self.sides.items()},
                "metrics": [{k: clean(v) for k, v in m.row().items()} for m in self.metrics]}


def _side_summary(per: pd.DataFrame) -> dict:
    """DP balancedness of one side: how far from a mirror it is."""
    bal = per["balancedness"].dropna()
    tokens = per["total_tokens"].sum()
    return {"n_steps": int(len(per)), "balancedness_mean": float(bal.mean()) if len(bal) else math.nan,
            "balancedness_min": float(bal.min()) if len(bal) else math.nan,
            "steps_unbalanced": int((bal < 1.0 - 1e-12).sum()),
            "padding_share": float(1.0 - per["mean_tokens"].sum() / per["max_tokens"].sum())
            if per["max_tokens"].sum() > 0 else math.nan,
            "tokens_served": int(tokens), "tokens_per_step": float(tokens / len(per)) if len(per) else math.nan}


def _resampled(per: pd.DataFrame, steps: pd.DataFrame, n_resamples: int, seed: int, side: int) -> dict[str, np.ndarray]:
    """Every DP metric over step resamples of one side (the same resamples for every per-step mean, so
    their ratios are coherent; moving blocks of steps for the ratios of sums); two sides given the
    same ``side`` number and step list get the same resamples (paired)."""
    from profkit.analyze.compare import _pivot, _rng, bootstrap

    n = len(per)
    idx = _rng(seed, side, _DP_SOURCE).integers(0, n, size=(n_resamples, n))
    # ratios of sums over steps (per token, throughput): circular blocks of ~sqrt(n) consecutive steps,
    # so a burst and the decode steps after it stay together (a lag replay moves bursts between steps)
    blk = max(1, int(round(math.sqrt(n))))
    starts = _rng(seed, side, _DP_SOURCE + ":blocks").integers(0, n, size=(n_resamples, -(-n // blk)))
    bidx = ((starts[:, :, None] + np.arange(blk)) % n).reshape(n_resamples, -1)[:, :n]
    s_sum, n_r = per["step_ns_sum"].to_numpy(np.float64), per["n_ranks"].to_numpy(np.float64)
    tok, bal = per["total_tokens"].to_numpy(np.float64), per["balancedness"].to_numpy(np.float64)
    wait = per["wait_ns_sum"].to_numpy(np.float64)
    step_mean = s_sum / n_r  # the fleet's step time in that step
    kept = steps[steps["step"].isin(per["step"])]
    matrix = _pivot(kept, "step_ns", per["step"].to_numpy(), np.sort(kept["rank"].unique()))
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "step_ns_mean": s_sum[idx].sum(1) / n_r[idx].sum(1),
            # same generator seed: bootstrap() draws the very same step indices first
            "step_ns_p50": bootstrap(matrix, "p50", n_resamples, _rng(seed, side, _DP_SOURCE)),
            "step_ns_per_token": step_mean[bidx].sum(1) / tok[bidx].sum(1),
            "throughput": 1e9 * tok[bidx].sum(1) / step_mean[bidx].sum(1),
            "wait_ns_mean": wait[idx].sum(1) / n_r[idx].sum(1),
            "balancedness_mean": (np.nanmean(bal[idx], axis=1) if np.isfinite(bal).any()
                                  else np.full(n_resamples, np.nan)),
        }


def _points(per: pd.DataFrame, steps: pd.DataFrame) -> dict[str, float]:
    kept = steps[steps["step"].isin(per["step"])]
    n_r = per["n_ranks"].sum()
    step_mean = per["step_ns_sum"] / per["n_ranks"]
    tok = per["total_tokens"].sum()
    return {"step_ns_mean": float(per["step_ns_sum"].sum() / n_r), "step_ns_p50": float(np.median(kept["step_ns"])),
            "step_ns_per_token": float(step_mean.sum() / tok) if tok else math.nan,
            "throughput": float(1e9 * tok / step_mean.sum()) if step_mean.sum() else math.nan,
            "wait_ns_mean": float(per["wait_ns_sum"].sum() / n_r) if per["wait_ns_sum"].notna().all() else math.nan,
            "balancedness_mean": float(per["balancedness"].mean())}


DP_METRICS = (  # name, unit
    ("step_ns_mean", "ns"), ("step_ns_p50", "ns"), ("step_ns_per_token", "ns/token"),
    ("wait_ns_mean", "ns"), ("balancedness_mean", "ratio"),
    ("throughput", "tokens/s"),  # tokens served per second of step time: what the study reports
)


def dp_imbalance_cost(base_steps: pd.DataFrame, base_dp: pd.DataFrame | None,
                      cand_steps: pd.DataFrame, cand_dp: pd.DataFrame | None,
                      base_cause_steps: pd.DataFrame | None = None, cand_cause_steps: pd.DataFrame | None = None,
                      n_resamples: int = 2000, seed: int = 0, confidence: float = 0.95) -> DpCost:
    """What DP imbalance costs, from a mirror (BASE: every rank the same batch) and a lag replay (CAND:
    the same requests dealt out by a balancer): the change in step time (mean and median per step,
    and per token served), each with a bootstrap interval over steps (seeded; paired, i.e. the same
    steps drawn on both sides, when both have the same step numbers, as two replays of one request
    set do; else independent), the DP balancedness of each side, and the share of the change that the causes tables
    charge to waiting for other ranks. ``*_steps``: rank, step, step_ns (steps.csv); ``*_dp``:
    dp_imbalance.csv; ``*_cause_steps``: cause_steps.csv. Without token counts on a side there is no
    mirror/lag pair to price: ``available`` is False and the headline says why."""
    from profkit.analyze.compare import _percentiles

    missing = [name for name, st, dp in (("BASE", base_steps, base_dp), ("CAND", cand_steps, cand_dp))
               if dp is None or not len(dp) or st is None or not len(st)]
    if missing:
        return DpCost(False, f"DP imbalance: no cost computed: {' and '.join(missing)} "
                             f"{'has' if len(missing) == 1 else 'have'} no token counts per rank and step "
                             "(dp_imbalance.csv empty or missing, or a run from the history database), so this is not "
                             "a mirror/lag pair of replays",
                      confidence=confidence)
    per_b = dp_step_samples(base_steps, base_dp, base_cause_steps)
    per_c = dp_step_samples(cand_steps, cand_dp, cand_cause_steps)
    short = [name for name, per in (("BASE", per_b), ("CAND", per_c)) if len(per) < 2]
    if short:
        return DpCost(False, f"DP imbalance: no cost computed: {' and '.join(short)}: fewer than 2 steps with both "
                             "a step time and token counts", confidence=confidence)
    sides = {"base": _side_summary(per_b), "cand": _side_summary(per_c)}
    pb, pc = _points(per_b, base_steps), _points(per_c, cand_steps)
    # a replay pair serves the same requests over the same steps: resample the same steps on both
    # sides (paired), so what the steps share (their token counts, and with one seed their noise)
    # cancels and the interval is that of the change itself; otherwise independently, like compare
    paired = per_b["step"].tolist() == per_c["step"].tolist()
    rb = _resampled(per_b, base_steps, n_resamples, seed, 0)
    rc = _resampled(per_c, cand_steps, n_resamples, seed, 0 if paired else 1)
    metrics = []
    for name, unit in DP_METRICS:
        b, c = pb[name], pc[name]
        m = DpCostMetric(name, unit, b, c, c - b)
        m.rel = (c - b) / b if b and math.isfinite(b) else math.nan
        deltas = rc[name] - rb[name]
        if np.isfinite(deltas).any():
            m.delta_ci = _percentiles(deltas, confidence)
            with np.errstate(invalid="ignore", divide="ignore"):
                m.rel_ci = _percentiles(np.where(rb[name] != 0, deltas / rb[name], np.nan), confidence)
        metrics.append(m)
    out = DpCost(True, "", metrics, sides, confidence=confidence, paired=paired)
    step, wait = out.get("step_ns_mean"), out.get("wait_ns_mean")
    if step is not None and wait is not None and math.isfinite(wait.delta) and step.delta:
        out.wait_share = wait.delta / step.delta
    if not math.isfinite(pb["wait_ns_mean"]) or not math.isfinite(pc["wait_ns_mean"]):
        out.notes.append("no per-step cause samples (cause_steps.csv) on a side: the waiting share is unknown")
    if sides["base"]["steps_unbalanced"]:
        out.notes.append(f"BASE is not a mirror replay (balancedness < 1 on {sides['base']['steps_unbalanced']} of "
                         f"{sides['base']['n_steps']} steps): the change is the difference in imbalance cost, "
                         "not all of it")
    if not sides["cand"]["steps_unbalanced"]:
        out.notes.append("CAND is balanced at every step (a mirror?): there is no DP imbalance to price")
    tb, tc = sides["base"]["tokens_per_step"], sides["cand"]["tokens_per_step"]
    if tb > 0 and abs(tc - tb) > 0.2 * tb:
        out.notes.append(f"the sides served different tokens per step ({tb:.0f} vs {tc:.0f}): not the same requests? "
                         "read the change per token served")
    out.headline = _dp_headline(out)
    return out


def _dp_headline(c: DpCost) -> str:
    """Sets ``c.significant`` too: a cost is DP imbalance's only where CAND is the less balanced side."""
    step, per_tok, bal_change = c.get("step_ns_mean"), c.get("step_ns_per_token"), c.get("balancedness_mean")
    assert step is not None and per_tok is not None and bal_change is not None
    bal = f"DP balancedness {c.sides['base']['balancedness_mean']:.3f} -> {c.sides['cand']['balancedness_mean']:.3f}"
    lo, hi = step.delta_ci
    ci = f" [{lo / 1e6:+.3f}, {hi / 1e6:+.3f}]" if math.isfinite(lo) else ""
    tlo, thi = per_tok.delta_ci
    tci = f" [{tlo:+.0f}, {thi:+.0f}]" if math.isfinite(tlo) else ""
    if math.isfinite(tlo) and not per_tok.significant:
        tci += " (within noise)"
    change = (f"{step.delta / 1e6:+.3f} ms per step ({100 * step.rel:+.1f}%){ci}, "
              f"{per_tok.delta:+.0f} ns per token served ({100 * per_tok.rel:+.1f}%){tci}")
    thr = c.get("throughput")
    if thr is not None and math.isfinite(thr.rel):
        rlo, rhi = thr.rel_ci
        change += (f", throughput {100 * thr.rel:+.1f}%" +
                   (f" [{100 * rlo:+.1f}%, {100 * rhi:+.1f}%]" if math.isfinite(rlo) else ""))
    less_balanced = math.isfinite(bal_change.delta_ci[1]) and bal_change.delta_ci[1] < 0
    if math.isfinite(bal_change.delta_ci[0]) and bal_change.delta_ci[0] > 0:
        return (f"DP imbalance: BASE is the less balanced side ({bal}): give the mirror replay as BASE and the "
                f"lag replay as CAND; as given, CAND's mean step time changed by {change}")
    if not less_balanced:
        return (f"DP imbalance: none to price: CAND is not less balanced than BASE ({bal}); the mean step time "
                f"changed by {change}, which is not DP imbalance (noise, machine, seed or requests)")
    if not step.significant:
        return f"DP imbalance: no significant cost: mean step time {change}; {bal}"
    if step.delta < 0:
        return (f"DP imbalance: CAND is FASTER by {change}; {bal} (expected BASE = mirror, CAND = lag: "
                "swapped, or something else changed)")
    c.significant = True
    text = f"DP-imbalance cost: {change}; {bal}"
    if math.isfinite(c.wait_share):
        text += f"; {100 * c.wait_share:.0f}% of it is waiting for other ranks"
    return text
