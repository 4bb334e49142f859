"""Across ranks: each rank's clock offset and drift from the ends of collectives it shares.

Why ends only: every participant leaves a collective when the last one's data has arrived, so
its end is one real moment on all of them; its start is each rank's own arrival, the skew the
straggler analysis measures. Fitting on ends leaves an injected late arrival exactly as late.

How: a reference rank (the lowest rank with collectives) keeps its clock. Ranks are solved in
levels over the graph "shares an instance with": a rank sharing instances with already-solved
ranks gets the consensus end of each shared instance (median of the solved ranks' aligned ends)
and a robust line ``end - consensus = offset + drift * (consensus - t0)`` (Theil-Sen start,
Huber then Tukey IRLS; kernel ends preferred, Gloo/DP-sync span ends weighted 1/400 as they are
~20x less exact). So ranks that never meet the reference (EP groups of 8, joined by the DP
group) are reached through the others. Then a few refinement passes refit every rank against the
median of all other participants (the reference's own end noise stops mattering).

A rank that shares nothing with the solved ranks starts a new component anchored to its own
clock (its clock anchors: NTP-level error, stated as ``error_bound_ns``); ranks with no
collective at all stay on their anchors with a warning. Nothing is shifted silently.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit.align.clock import rank_clocks, to_reference
from profkit.keys import first_match, sorted_groups
from profkit.robust import LineFit, robust_line

KERNEL_TIER, CPU_TIER = 0, 1
TIER_SIGMA_NS = {KERNEL_TIER: 10_000, CPU_TIER: 200_000}  # typical end disagreement (DEP2 H200 captures)
ANCHOR_ERROR_NS = 1_000_000  # clocks on anchors only: NTP-level agreement between hosts
MIN_KERNEL_POINTS = 3  # fewer kernel ends than this: Gloo/DP-sync ends join in
MIN_DRIFT_POINTS = 3
MIN_DRIFT_SPAN_NS = 10_000_000  # drift is fitted only over at least this much time
MAX_PLAUSIBLE_DRIFT_PPM = 500.0  # host clocks drift tens of ppm; beyond this the ends are noise
ERROR_SIGMAS = 3.0

RANK_COLUMNS = [
    "rank", "method", "offset_ns", "drift_ppm", "t0_ns", "residual_ns", "residual_p90_ns", "error_bound_ns",
    "n_points", "n_instances", "end_source", "via_rank", "component", "drift_stderr_ppm",
]


@dataclass(frozen=True)
class SolveOptions:
    fit_drift: bool | None = None  # None: when >= 3 ends span >= min_drift_span_ns
    min_drift_span_ns: int = MIN_DRIFT_SPAN_NS
    refine_passes: int = 2


@dataclass
class _RankFit:
    offset_ns: int
    drift_ppm: float
    line: LineFit | None
    end_source: str
    n_instances: int
    via_rank: int
    parent_bound_ns: int = 0


def solve_ranks(
    obs: pd.DataFrame, ranks: list[int], windows: dict[int, tuple[int, int]], t0_ns: int,
    opts: SolveOptions = SolveOptions(),
) -> tuple[pd.DataFrame, list[str]]:
    """Per-rank clocks from ``obs`` (rank, instance, end_ns, tier), one row per rank in ``ranks``."""
    warnings: list[str] = []
    obs = _shared(obs)
    fits: dict[int, _RankFit] = {}
    component: dict[int, int] = {}
    methods: dict[int, str] = {}
    pending = sorted(int(r) for r in obs["rank"].unique())
    ref_global = pending[0] if pending else (min(ranks) if ranks else 0)
    comp = 0
    while pending:
        ref = pending[0]
        fits[ref] = _RankFit(0, 0.0, None, "", 0, ref)
        methods[ref] = "reference" if comp == 0 else "anchors"
        members = _levels(obs, ref, set(pending), fits, t0_ns, opts)
        for r in members:
            component[r] = comp
            if r != ref:
                methods[r] = "collective_ends"
        for _ in range(opts.refine_passes):
            _refine(obs, members, ref, fits, t0_ns, opts)
        for r in list(fits):  # chained error bounds from the final fits, in the order ranks were reached
            f = fits[r]
            if r in members and f.line is not None and f.via_rank not in (ref, r):
                f.parent_bound_ns = _bound(fits[f.via_rank], windows.get(f.via_rank), t0_ns)
        if comp > 0:
            others = sorted(members - {ref})
            warnings.append(
                f"ranks {sorted(members)} share no collective with rank {ref_global}'s group of ranks: "
                f"aligned among themselves (to rank {ref}) and to the rest by clock anchors only "
                f"(error up to ~{ANCHOR_ERROR_NS // 1_000_000} ms)" if others else
                f"rank {ref} shares no collective with any other rank: left on its clock anchors "
                f"(error up to ~{ANCHOR_ERROR_NS // 1_000_000} ms)")
        pending = [r for r in pending if r not in members]
        comp += 1
    no_coll = [r for r in ranks if r not in fits and r != ref_global]
    if no_coll:
        warnings.append(f"ranks {no_coll}: no collective instance shared with another rank: left on their clock "
                        f"anchors, offset 0 (error up to ~{ANCHOR_ERROR_NS // 1_000_000} ms)")
    resid = _residuals(obs, fits, t0_ns)
    shared = obs.groupby("rank")["instance"].nunique().to_dict() if len(obs) else {}
    rows = []
    for r in sorted(set(ranks) | set(fits)):
        row = _row(r, fits.get(r), methods.get(r, "reference" if r == ref_global else "anchors"),
                   component.get(r), resid.get(r), windows.get(r), t0_ns)
        if row["n_points"] == 0:
            row["n_points"] = row["n_instances"] = int(shared.get(r, 0))
        rows.append(row)
    table = pd.DataFrame(rows, columns=RANK_COLUMNS)
    for c in ("residual_ns", "residual_p90_ns", "error_bound_ns", "via_rank", "component"):
        table[c] = table[c].astype("Int64")
    for c in ("rank", "offset_ns", "t0_ns", "n_points", "n_instances"):
        table[c] = table[c].astype("int64")
    _warn_wild(table, warnings)
    return table, warnings


def _shared(obs: pd.DataFrame) -> pd.DataFrame:
    """Only instances seen on at least two ranks say anything about clocks."""
    if obs.empty:
        return obs
    n = obs.groupby("instance")["rank"].transform("nunique")
    return obs[n >= 2].reset_index(drop=True)


def _aligned(obs: pd.DataFrame, fits: dict[int, _RankFit], t0_ns: int) -> np.ndarray:
    """Each row's end on the reference clock, by its rank's fit (a KeyError where a rank has none).
    The fits are looked up by a search among their few ranks, not by sorting every row's rank
    (``np.unique`` of ~0.5 M rows at DEP32 x 1,000: ~40 ms a call, several calls a solve)."""
    rank = obs["rank"].to_numpy(dtype=np.int64)
    known = np.array(sorted(fits), dtype=np.int64)
    at = np.minimum(np.searchsorted(known, rank), max(known.size - 1, 0))
    if rank.size and not (known.size and np.array_equal(known[at], rank)):
        missing = sorted(set(rank.tolist()) - set(known.tolist()))
        raise KeyError(missing[0])
    off = np.array([fits[r].offset_ns for r in known.tolist()], dtype=np.int64)[at]
    drift = np.array([fits[r].drift_ppm for r in known.tolist()], dtype=np.float64)[at]
    return to_reference(obs["end_ns"].to_numpy(dtype=np.int64), off, drift, t0_ns)


def _levels(obs, ref, pending: set, fits, t0_ns, opts) -> set:
    """Solve ranks level by level outward from ``ref``; returns the component's members."""
    members = {ref}
    while True:
        in_s = obs["rank"].isin(members).to_numpy()
        s_rows = obs[in_s]
        if s_rows.empty:
            break
        aligned = pd.Series(_aligned(s_rows, fits, t0_ns), index=s_rows.index)
        consensus = aligned.groupby(s_rows["instance"]).median()
        cand = obs[~in_s & obs["rank"].isin(pending - members).to_numpy() & obs["instance"].isin(consensus.index)]
        if cand.empty:
            break
        new = {}
        groups = list(cand.groupby("rank", sort=True))
        jobs = [(g, np.rint(consensus.reindex(g["instance"]).to_numpy()).astype(np.int64)) for _, g in groups]
        for (r, g), fit in zip(groups, _fits(jobs, t0_ns, opts)):
            if fit is None:
                continue
            via = s_rows[s_rows["instance"].isin(g["instance"])]["rank"].value_counts()
            fit.via_rank = int(via.index[0])
            fit.parent_bound_ns = 0 if fit.via_rank == ref else _bound(fits[fit.via_rank], None, t0_ns)
            new[int(r)] = fit
        if not new:
            break
        fits.update(new)
        members |= set(new)
    return members


def _fit(g: pd.DataFrame, target: np.ndarray, t0_ns: int, opts: SolveOptions) -> _RankFit | None:
    """Robust line of this rank's ends against the consensus ends of the same instances."""
    tier = g["tier"].to_numpy()
    kernel = tier == KERNEL_TIER
    if kernel.sum() >= MIN_KERNEL_POINTS:
        sel, source = kernel, "kernel"
    else:
        sel = np.ones(len(g), dtype=bool)
        kinds = {KERNEL_TIER: "kernel", CPU_TIER: "cpu_span"}
        source = "+".join(kinds[t] for t in sorted(set(tier.tolist())))
    if not sel.any():
        return None
    end = g["end_ns"].to_numpy(dtype=np.int64)[sel]
    t = target[sel]
    x = (t - np.int64(t0_ns)).astype(np.float64)
    y = (end - t).astype(np.float64)
    tiers = np.unique(tier[sel])
    sigma = np.array([TIER_SIGMA_NS[v] for v in tiers.tolist()], dtype=np.float64)[np.searchsorted(tiers, tier[sel])]
    prior = (TIER_SIGMA_NS[KERNEL_TIER] / sigma) ** 2
    if opts.fit_drift is None:
        drift = len(x) >= MIN_DRIFT_POINTS and np.ptp(x) >= opts.min_drift_span_ns
    else:
        drift = bool(opts.fit_drift) and len(x) >= 2 and np.ptp(x) > 0
    line = robust_line(x, y, prior=prior, fit_slope=drift)
    if drift and abs(line.slope * 1e6) > MAX_PLAUSIBLE_DRIFT_PPM:
        # no host clock drifts like that: the slope fits noisy ends (e.g. Gloo spans on a loaded
        # host), and extrapolating it would move whole steps by milliseconds; fit the offset only
        line = robust_line(x, y, prior=prior, fit_slope=False)
    return _RankFit(int(np.rint(line.offset)), float(line.slope * 1e6), line, source, int(len(g)), -1)


FIT_THREADS = 2  # ranks fitted side by side (the driver's workers are idle while it aligns)
# points a rank from which threads pay: 32 robust lines of n points on 2 threads against one after
# the other (2 cores): 1,700 points 0.56x, 4,000 0.86x, 8,000 1.05x, 17,000 1.32x
FIT_THREAD_MIN_POINTS = 10_000


def _fits(jobs: list[tuple[pd.DataFrame, np.ndarray]], t0_ns: int, opts: SolveOptions) -> list[_RankFit | None]:
    """``_fit`` of each (rank's rows, targets), in order; on threads where there are several ranks
    of many points (DEP32 x 1,000: 17,000 a rank): each fit's medians and partitions run without
    the GIL there, and the fits are most of the alignment, which the driver does alone."""
    threads = min(FIT_THREADS, os.cpu_count() or 1, len(jobs))
    if threads < 2 or len(jobs) < 4 or sum(len(g) for g, _ in jobs) < FIT_THREAD_MIN_POINTS * len(jobs):
        return [_fit(g, t, t0_ns, opts) for g, t in jobs]
    with ThreadPoolExecutor(threads, thread_name_prefix="profkit-fit") as pool:
        return list(pool.map(lambda job: _fit(job[0], job[1], t0_ns, opts), jobs))


def _median_excluding_self(obs: pd.DataFrame, aligned: np.ndarray) -> np.ndarray:
    """Per row: median of the other rows' aligned ends of the same instance (NaN if none)."""
    inst = obs["instance"].to_numpy()
    order = np.lexsort((aligned, inst))
    v = aligned[order].astype(np.float64)
    g = inst[order]
    start_of = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    size = np.diff(np.r_[start_of, len(g)])
    grp = np.repeat(np.arange(len(start_of)), size)
    base = start_of[grp]
    pos = np.arange(len(g)) - base
    q = size[grp] - 1  # number of others

    def other(k: np.ndarray) -> np.ndarray:  # k-th (0-based) of the others, in the sorted order
        idx = base + k + (k >= pos)
        return v[np.clip(idx, 0, len(v) - 1)]

    lo_k = np.maximum((q - 1) // 2, 0)
    hi_k = np.maximum(q // 2, 0)
    med = np.where(q % 2 == 1, other(lo_k), 0.5 * (other(lo_k) + other(hi_k)))
    med = np.where(q > 0, med, np.nan)
    out = np.empty(len(g))
    out[order] = med
    return out


def _refine(obs, members: set, ref: int, fits, t0_ns, opts) -> None:
    """Refit every non-reference member against the median of all other participants."""
    rows = obs[obs["rank"].isin(members).to_numpy()]
    if rows.empty:
        return
    others = _median_excluding_self(rows, _aligned(rows, fits, t0_ns))
    updated = {}
    ranks, jobs = [], []
    for r, idx in rows.groupby("rank", sort=True).indices.items():
        r = int(r)
        if r == ref:
            continue
        ok = ~np.isnan(others[idx])
        if not ok.any():
            continue
        ranks.append(r)
        jobs.append((rows.iloc[idx[ok]], np.rint(others[idx[ok]]).astype(np.int64)))
    for r, fit in zip(ranks, _fits(jobs, t0_ns, opts)):
        if fit is not None:
            fit.via_rank, fit.parent_bound_ns = fits[r].via_rank, fits[r].parent_bound_ns
            updated[r] = fit
    fits.update(updated)


def _residuals(obs, fits, t0_ns) -> dict[int, tuple[int, int]]:
    """Per rank: median and p90 |aligned end - median of the other participants' aligned ends|."""
    rows = obs[obs["rank"].isin(list(fits)).to_numpy()]
    if rows.empty:
        return {}
    aligned = _aligned(rows, fits, t0_ns)
    others = _median_excluding_self(rows, aligned.astype(np.float64))
    dev = np.abs(aligned - others)
    out = {}
    for r, idx in rows.groupby("rank", sort=True).indices.items():
        f = fits[int(r)]
        tier = rows["tier"].to_numpy()[idx]
        use = idx[tier == KERNEL_TIER] if f.end_source == "kernel" or (tier == KERNEL_TIER).sum() >= MIN_KERNEL_POINTS \
            else idx
        d = dev[use]
        d = d[~np.isnan(d)]
        if len(d):
            out[int(r)] = (int(np.rint(np.median(d))), int(np.rint(np.percentile(d, 90))))
    return out


def _bound(fit: _RankFit, window: tuple[int, int] | None, t0_ns: int) -> int:
    """ERROR_SIGMAS standard errors of the fitted clock over the rank's window, plus its parent's."""
    if fit.line is None:
        return 0
    if window is None:
        xs = np.array([fit.line.x.min(), fit.line.x.max()])
    else:
        xs = np.array([window[0] - fit.offset_ns - t0_ns, window[1] - fit.offset_ns - t0_ns], dtype=np.float64)
    se = float(np.max(fit.line.stderr_at(xs)))
    if not np.isfinite(se):
        se = float(TIER_SIGMA_NS[CPU_TIER])
    if fit.line.n_used <= 1:  # one point: no spread to learn from; take the kind's typical error
        se = max(se, float(TIER_SIGMA_NS[KERNEL_TIER if fit.end_source == "kernel" else CPU_TIER]))
    return int(np.ceil(ERROR_SIGMAS * se)) + fit.parent_bound_ns


def _row(r, fit, method, comp, resid, window, t0_ns) -> dict:
    if fit is None or (method == "anchors" and fit.line is None):
        anchors = method == "anchors"
        return {"rank": r, "method": method, "offset_ns": 0, "drift_ppm": 0.0, "t0_ns": t0_ns,
                "residual_ns": resid[0] if resid else None, "residual_p90_ns": resid[1] if resid else None,
                "error_bound_ns": ANCHOR_ERROR_NS if anchors else 0, "n_points": 0,
                "n_instances": 0, "end_source": "none", "via_rank": None, "component": comp,
                "drift_stderr_ppm": float("nan")}
    bound = _bound(fit, window, t0_ns)
    if comp and comp > 0:
        bound += ANCHOR_ERROR_NS
    return {
        "rank": r, "method": method, "offset_ns": fit.offset_ns, "drift_ppm": fit.drift_ppm, "t0_ns": t0_ns,
        "residual_ns": resid[0] if resid else None, "residual_p90_ns": resid[1] if resid else None,
        "error_bound_ns": bound if fit.line is not None else 0,
        "n_points": fit.line.n_used if fit.line is not None else 0, "n_instances": fit.n_instances,
        "end_source": fit.end_source or "none", "via_rank": fit.via_rank if fit.line is not None else None,
        "component": comp, "drift_stderr_ppm": fit.line.slope_stderr * 1e6 if fit.line is not None else float("nan"),
    }


def _warn_wild(table: pd.DataFrame, warnings: list[str]) -> None:
    """Fits that are numerically fine but physically doubtful deserve a line of their own.
    Row by row over the columns' values (``itertuples`` made a named tuple class each call)."""
    cols = ("rank", "method", "drift_ppm", "drift_stderr_ppm", "error_bound_ns", "n_points", "end_source")
    for rank, method, drift, drift_se, bound, n_points, source in zip(*(table[c].tolist() for c in cols)):
        if method != "collective_ends":
            continue
        if abs(drift) > MAX_PLAUSIBLE_DRIFT_PPM:
            warnings.append(f"rank {rank}: fitted drift {drift:.0f} ppm is implausible for a host clock "
                            f"(± {drift_se:.0f} ppm): few or noisy shared ends")
        if pd.notna(bound) and bound > 100_000:
            warnings.append(f"rank {rank}: alignment error bound {bound / 1e3:.0f} us ({n_points} ends from {source})")


# ---- the last arriver's early exit -------------------------------------------------------------
EXIT_MARGIN_NS = 20_000  # an instance has a clear last arriver when it starts this much after the rest
MIN_EXIT_PAIRS = 5  # instances per direction of a rank pair before the exit lag counts


def last_arriver_flags(obs: pd.DataFrame, table: pd.DataFrame, t0_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: (clear, is_last). ``clear``: the row's instance has one rank arriving at least
    EXIT_MARGIN_NS after all others (on the aligned clocks); ``is_last``: this row is that rank."""
    off, drift = rank_clocks(table, obs["rank"].to_numpy().astype(np.int64))
    start = to_reference(obs["start_ns"].to_numpy(np.int64), off, drift, t0_ns)
    clear, last, _ = _arrivals_sorted(obs["instance"].to_numpy(np.int64), start)
    return clear, last


def _arrivals_sorted(inst: np.ndarray, start: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """``last_arriver_flags`` of rows of instances ``inst`` with aligned starts ``start``, and the
    rows sorted by (instance, start), ties in row order: (order, each sorted row's exclusive group
    end), for the pairs ``exit_lag_ns`` makes of them. Groups of sorted arrays
    (``keys.sorted_groups``), not groupby transforms of a frame (a tenth of the time)."""
    n = inst.size
    order, heads = sorted_groups((inst,), within=(start,))
    s_start = start[order]
    sizes = np.diff(np.r_[heads, n]).astype(np.int64)
    end_of, size_of = np.repeat(heads + sizes, sizes), np.repeat(sizes, sizes)
    last_start = s_start[end_of - 1]
    # the second-latest start as a float (NaN in an instance of one row), as a groupby max of a
    # ``where`` had it: the int64 - float64 difference is then the one that was compared
    second = np.where(size_of >= 2, s_start[np.maximum(end_of - 2, 0)].astype(np.float64), np.nan)
    with np.errstate(invalid="ignore"):
        clear_sorted = (last_start - second) >= EXIT_MARGIN_NS
    clear = np.zeros(n, dtype=bool)
    last = np.zeros(n, dtype=bool)
    clear[order] = clear_sorted
    last[order] = end_of - 1 == np.arange(n)
    return clear, last, (order, end_of)


def exit_lag_ns(obs: pd.DataFrame, table: pd.DataFrame, t0_ns: int) -> tuple[int | None, int]:
    """How much later the other ranks leave a kernel collective than its clear last arriver.

    Measured on real H200 NCCL all-to-alls (~11 µs): treating the ends as simultaneous would bias
    a rank that is often last by that much. For each rank pair, D = aligned end of r - aligned end
    of s where s arrived last, and the reverse: the mean of the two directions' medians is the lag
    with both clocks' errors cancelled. Returns (lag, supporting instances) or (None, n) when no
    pair saw both directions MIN_EXIT_PAIRS times.
    """
    k = obs[obs["tier"].to_numpy() == KERNEL_TIER]
    if k.empty:
        return None, 0
    rank = k["rank"].to_numpy().astype(np.int64)
    off, drift = rank_clocks(table, rank)
    start = to_reference(k["start_ns"].to_numpy(np.int64), off, drift, t0_ns)
    end = to_reference(k["end_ns"].to_numpy(np.int64), off, drift, t0_ns)
    clear, last, (order, end_of) = _arrivals_sorted(k["instance"].to_numpy(np.int64), start)
    # each clear instance's other rows against its last row (one per instance: its latest start)
    s_rank, s_end = rank[order], end[order]
    pair = (clear & ~last)[order]
    if not pair.any():
        return None, 0
    who, d = s_rank[pair], s_end[pair] - s_end[end_of[pair] - 1]
    by = s_rank[end_of[pair] - 1]
    # per (rank, last rank), in their sort order, the median of its differences; and its reverse pair
    o, heads = sorted_groups((who, by), within=(d,))
    d = d[o]
    size = np.diff(np.r_[heads, d.size])
    lo, hi = heads + (size - 1) // 2, heads + size // 2
    median = np.where(size % 2 == 1, d[lo].astype(np.float64), (d[lo].astype(np.float64) + d[hi]) / 2.0)
    a, b = who[o][heads], by[o][heads]
    rev = first_match((a, b), (b, a))  # -1: the reverse pair never happened
    both = (a < b) & (rev >= 0) & (size >= MIN_EXIT_PAIRS) & (size[np.maximum(rev, 0)] >= MIN_EXIT_PAIRS)
    if not both.any():
        return None, int(pair.sum())
    lag = 0.5 * (median[both] + median[rev[both]])
    weight = np.minimum(size[both], size[rev[both]])
    order = np.argsort(lag)
    cum = np.cumsum(weight[order])
    mid = float(lag[order][np.searchsorted(cum, cum[-1] / 2.0)])
    return int(np.rint(mid)), int(weight.sum())


def without_exit_lag(obs: pd.DataFrame, table: pd.DataFrame, t0_ns: int, lag_ns: int) -> pd.DataFrame:
    """Kernel ends of ranks that were not the clear last arriver, moved back by the exit lag."""
    out = obs.copy()
    kernel = obs["tier"].to_numpy() == KERNEL_TIER
    clear, last = last_arriver_flags(obs, table, t0_ns)
    move = kernel & clear & ~last
    out["end_ns"] = obs["end_ns"].to_numpy(np.int64) - np.where(move, lag_ns, 0)
    return out
