"""Estimate one timeline for every rank and source, and move events onto it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit.align.clock import TIME_COLUMNS, rank_clocks, shift_columns
from profkit.align.ranks import (
    CPU_TIER,
    KERNEL_TIER,
    RANK_COLUMNS,
    SolveOptions,
    exit_lag_ns,
    solve_ranks,
    without_exit_lag,
)
from profkit.collectives.candidates import collective_candidates
from profkit.collectives.instances import MATCH_INPUT_COLUMNS, instances_from_candidates
from profkit.collectives.sequences import CPU_SPAN, KERNEL
from profkit.align.sources import SOURCE_COLUMNS, apply_source_offsets, source_offsets


@dataclass
class Alignment:
    """Result of ``estimate``: per-rank clocks, per-source offsets, and what the user must know.

    ``ranks``: one row per rank (``RANK_COLUMNS``): ``offset_ns``/``drift_ppm`` against the
    reference rank at ``t0_ns``, ``residual_ns``/``residual_p90_ns`` (median / p90 distance of the
    rank's aligned collective ends from the other participants'), ``error_bound_ns`` (3 standard
    errors of the fitted clock over the rank's window; 1 ms on clock anchors), ``method``
    (reference | collective_ends | anchors), ``n_points`` (ends used), ``end_source``.
    ``sources``: one row per (rank, source) (``SOURCE_COLUMNS``). ``instances``: the matched
    collective instances on the raw clocks (``apply_alignment`` moves them too).
    """

    ranks: pd.DataFrame
    sources: pd.DataFrame
    t0_ns: int
    warnings: list[str] = field(default_factory=list)
    instances: pd.DataFrame | None = None
    report: dict = field(default_factory=dict)

    def summary(self) -> dict[int, dict]:
        """``{rank: {offset_ns, drift_ppm, residual_ns, method, error_bound_ns}}`` for summary.json."""
        out = {}
        for row in self.ranks.itertuples():
            out[int(row.rank)] = {
                "offset_ns": int(row.offset_ns),
                "drift_ppm": float(row.drift_ppm),
                "residual_ns": None if pd.isna(row.residual_ns) else int(row.residual_ns),
                "method": row.method,
                "error_bound_ns": None if pd.isna(row.error_bound_ns) else int(row.error_bound_ns),
            }
        return out


def estimate(
    events: pd.DataFrame,
    fit_drift: bool | None = None,
    refine_passes: int = 2,
    min_drift_span_ns: int = SolveOptions.min_drift_span_ns,
    exit_lag: bool = True,
    same_clock: bool = False,
) -> Alignment:
    """Estimate every rank's clock against the reference rank (the lowest rank with collectives).

    ``fit_drift``: None fits drift when at least 3 shared ends span 10 ms or more; False for
    clocks known to be disciplined (PTP), True to force it. ``exit_lag``: estimate how much
    earlier the clear last arriver leaves a kernel collective than the others (``report
    ["exit_lag_ns"]``; needs rank pairs where each is sometimes last) and fit on ends corrected
    for it. ``same_clock``: every rank was recorded on one host, so their clocks are one clock:
    nothing to estimate across ranks (``method`` "same_host", offset 0); collective ends of busy
    host processes (Gloo spans) would only add their scheduling noise.
    """
    prepared = [prepare_rank(g) for _, g in events.groupby("rank", sort=True)] if len(events) else []
    return estimate_from_ranks(prepared, fit_drift=fit_drift, refine_passes=refine_passes,
                               min_drift_span_ns=min_drift_span_ns, exit_lag=exit_lag, same_clock=same_clock)


@dataclass
class RankClockFacts:
    """What one rank contributes to the alignment (small): computed where its events are."""

    rank: int
    sources: pd.DataFrame  # SOURCE_COLUMNS rows of this rank
    candidates: pd.DataFrame  # collective candidates on the rank's primary-source clock
    window: tuple[int, int]  # first start, last end of its events (raw clocks)
    warnings: list[str] = field(default_factory=list)


def prepare_rank(events: pd.DataFrame) -> RankClockFacts:
    """The map half of ``estimate`` for ONE rank's events: source offsets and collective candidates."""
    rank = int(events["rank"].iloc[0])
    sources, warnings = source_offsets(events)
    candidates = collective_candidates(apply_source_offsets(events, sources))
    window = (int(events["start_ns"].min()), int(events["end_ns"].max()))
    return RankClockFacts(rank=rank, sources=sources, candidates=candidates, window=window, warnings=warnings)


# the instance columns the estimate reads where it keeps no instances
_ESTIMATE_COLUMNS = ["rank", "instance", "source_kind", "start_ns", "end_ns"]


def estimate_from_ranks(
    prepared: list[RankClockFacts],
    fit_drift: bool | None = None,
    refine_passes: int = 2,
    min_drift_span_ns: int = SolveOptions.min_drift_span_ns,
    exit_lag: bool = True,
    same_clock: bool = False,
    keep_instances: bool = True,
) -> Alignment:
    """The reduce half of ``estimate``: match every rank's candidates, then solve the clocks.

    ``keep_instances`` False: the matched instances are not kept (``Alignment.instances`` None), so
    only the columns matching reads are matched (the same instances, without every rank's kernel
    names and span columns taken and converted: ~0.5 s of the driver's at DEP32 x 1,000 steps)."""
    prepared = sorted(prepared, key=lambda f: f.rank)
    warnings: list[str] = [w for f in prepared for w in f.warnings]
    frames = [f.sources for f in prepared if len(f.sources)]
    sources = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SOURCE_COLUMNS)
    if len(sources):
        sources["offset_ns"] = sources["offset_ns"].astype("int64")
        sources["residual_ns"] = sources["residual_ns"].astype("Int64")
    cands = [f.candidates if keep_instances else f.candidates[[c for c in MATCH_INPUT_COLUMNS if c in f.candidates]]
             for f in prepared if len(f.candidates)]
    inst = instances_from_candidates(pd.concat(cands, ignore_index=True) if cands else None, complete_only=False,
                                     columns=None if keep_instances else _ESTIMATE_COLUMNS)
    report = dict(inst.attrs.get("report", {}))
    tiers = {KERNEL: KERNEL_TIER, CPU_SPAN: CPU_TIER}
    coinc = inst["source_kind"].isin(list(tiers)).to_numpy(bool)  # only the columns read: never take the strings
    obs = pd.DataFrame({
        "rank": inst["rank"].to_numpy(dtype=np.int64)[coinc],
        "instance": inst["instance"].to_numpy(dtype=np.int64)[coinc],
        "start_ns": inst["start_ns"].to_numpy(dtype=np.int64)[coinc],
        "end_ns": inst["end_ns"].to_numpy(dtype=np.int64)[coinc],
        "tier": _codes_map(inst["source_kind"][coinc], tiers),
    })
    ranks = [f.rank for f in prepared]
    windows = {f.rank: f.window for f in prepared}
    with_obs = sorted(set(obs["rank"].tolist()))
    ref = with_obs[0] if with_obs else (ranks[0] if ranks else 0)
    t0 = windows.get(ref, (0, 0))[0]
    if same_clock:
        table = _same_clock_table(ranks, ref, t0, obs)
        return Alignment(ranks=table, sources=sources, t0_ns=t0, warnings=warnings,
                         instances=inst if keep_instances else None, report=report)
    opts = SolveOptions(fit_drift=fit_drift, min_drift_span_ns=min_drift_span_ns, refine_passes=refine_passes)
    table, rank_warn = solve_ranks(obs, ranks, windows, t0, opts)
    if exit_lag:
        lag, support = exit_lag_ns(obs, table, t0)
        report["exit_lag_ns"], report["exit_lag_support"] = lag, support
        if lag:  # the clear last arriver leaves early: compare like with like, then solve again
            table, rank_warn = solve_ranks(without_exit_lag(obs, table, t0, lag), ranks, windows, t0, opts)
    warnings.extend(rank_warn)
    return Alignment(ranks=table, sources=sources, t0_ns=t0, warnings=warnings,
                     instances=inst if keep_instances else None, report=report)


def estimate_alignment(events: pd.DataFrame, **options) -> pd.DataFrame:
    """Per-rank alignment table (see ``Alignment.ranks``); warnings in ``df.attrs["warnings"]``.

    The per-source offsets within a rank are in ``estimate(events).sources``; pass the
    ``Alignment`` itself to ``apply_alignment`` to apply them too.
    """
    result = estimate(events, **options)
    table = result.ranks.copy()
    table.attrs["warnings"] = list(result.warnings)
    return table


def apply_alignment(
    frame: pd.DataFrame, alignment: Alignment | pd.DataFrame, columns: tuple[str, ...] = TIME_COLUMNS
) -> pd.DataFrame:
    """A new frame with every time column present (start_ns, end_ns, launch_ns, host_*_ns) moved
    onto the reference rank's clock: per source first (within a rank), then per rank.

    Works on the event table and on any table with a ``rank`` column (collective instances).
    Ranks missing from the alignment are left as they are.
    """
    if isinstance(alignment, Alignment):
        table, sources = alignment.ranks, alignment.sources
    else:
        table, sources = alignment, None
    if frame.empty:
        return frame.copy()
    out = apply_source_offsets(frame, sources) if sources is not None else frame
    off, drift = rank_clocks(table, frame["rank"].to_numpy(dtype=np.int64))
    t0 = int(table["t0_ns"].iloc[0]) if len(table) else 0
    return shift_columns(out, off, drift, t0, columns)


__all__ = ["Alignment", "RANK_COLUMNS", "SOURCE_COLUMNS", "apply_alignment", "estimate", "estimate_alignment"]


def _codes_map(col: pd.Series, mapping: dict) -> np.ndarray:
    """``col.map(mapping)`` as int64 (every value mapped), each distinct value looked up once."""
    codes, uniques = pd.factorize(col)
    return np.array([mapping[u] for u in uniques], dtype=np.int64)[codes] if len(uniques) else np.empty(0, np.int64)


def _same_clock_table(ranks: list[int], ref: int, t0_ns: int, obs: pd.DataFrame) -> pd.DataFrame:
    """Rank rows for ranks known to share the reference's clock: no offset, no drift, no error."""
    n_points = obs.groupby("rank").size()
    rows = [
        {"rank": r, "method": "reference" if r == ref else "same_host", "offset_ns": 0, "drift_ppm": 0.0,
         "t0_ns": t0_ns, "residual_ns": np.nan, "residual_p90_ns": np.nan, "error_bound_ns": 0,
         "n_points": int(n_points.get(r, 0)), "n_instances": int(n_points.get(r, 0)), "end_source": "",
         "via_rank": ref, "component": 0, "drift_stderr_ppm": np.nan}
        for r in ranks
    ]
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def one_host(meta: dict[int, list[dict]]) -> bool:
    """True when every rank names a host and all name the same one: their clocks are one clock."""
    hosts = [{m["host"] for m in parts if m.get("host")} for parts in meta.values()]
    return bool(hosts) and all(hosts) and len(set().union(*hosts)) == 1
