"""One analysis of a capture: the tables every face of profkit (terminal, files, report) reads.

Every rank is first moved onto one clock (``profkit.align``); steps, GPU timelines and causes
are computed on the aligned events, so cross-rank facts (who waited for whom) are comparable.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from profkit import __version__
from profkit.align import Alignment, apply_alignment, drop_duplicate_spans, estimate
from profkit.analyze.balance import dp_imbalance, ep_balance
from profkit.analyze.gpu import gpu_timelines
from profkit.analyze.overhead import charge, rank_causes
from profkit.analyze.steps import step_table
from profkit.analyze.stragglers import straggler_ranks, straggler_table
from profkit.analyze.summary import rank_summary
from profkit.analyze.window import clip_to_recorded
from profkit.ingest.loader import Capture


@dataclass
class Analysis:
    capture: Capture
    events: pd.DataFrame  # aligned onto the reference rank's clock
    alignment: Alignment | None
    steps: pd.DataFrame
    timelines: pd.DataFrame
    ranks: pd.DataFrame
    step_marker: str | None
    causes: pd.DataFrame
    # one row per charged GPU-idle interval (rank, step, cause, dur_ns, ...)
    charged: pd.DataFrame = field(default_factory=pd.DataFrame)
    stragglers: pd.DataFrame | None = None  # per rank: STRAGGLER_COLUMNS first
    straggler_instances: pd.DataFrame | None = None  # per collective instance: skew, last arriver
    lateness: pd.DataFrame | None = None  # per (rank, step): lateness at sync points
    straggler_ranks: list[int] | None = None  # None: not computed
    balance: dict[str, pd.DataFrame] | None = None  # "ep" (when loads known), "dp"; None: not computed
    warnings: list[str] = field(default_factory=list)
    version: str = __version__


def one_host(meta: dict[int, list[dict]]) -> bool:
    """True when every rank names a host and all name the same one: their clocks are one clock."""
    hosts = [{m["host"] for m in parts if m.get("host")} for parts in meta.values()]
    return bool(hosts) and all(hosts) and len(set().union(*hosts)) == 1


def align(events: pd.DataFrame, same_clock: bool = False) -> tuple[pd.DataFrame, Alignment | None, list[str]]:
    """Events on one clock, the alignment, and what the user must know about it."""
    if events.empty:
        return events, None, []
    alignment = estimate(events, same_clock=same_clock)
    warnings = [f"alignment: {w}" for w in alignment.warnings]
    aligned, dropped = drop_duplicate_spans(apply_alignment(events, alignment))
    if dropped:
        counts = ", ".join(f"rank {r} {src}: {n}" for (r, src), n in sorted(dropped.items()))
        warnings.append(f"duplicate spans dropped (kept the profkit span file's copy): {counts}")
    return aligned, alignment, warnings


def analyze(capture: Capture, step_pattern: str | None = None, expert_loads: pd.DataFrame | None = None) -> Analysis:
    """``expert_loads``: rows ``rank, step, layer, tokens`` (see ``balance.parse_expert_loads``)."""
    events, alignment, warnings = align(capture.events, same_clock=one_host(capture.meta))
    steps = step_table(events, step_pattern)  # whole steps only: judged before the cut below
    events, cut = clip_to_recorded(events)
    for rank, n in sorted(cut.items()):
        warnings.append(f"rank {rank}: {n} event(s) outside the window every source recorded left out")
    for rank, n in sorted(steps.attrs.get("dropped_steps", {}).items()):
        warnings.append(f"rank {rank}: {n} step(s) left out: not recorded whole by every source "
                        "(outside or at the edge of a profiler window)")
    timelines = gpu_timelines(events)
    marker = str(steps["marker"].iloc[0]) if len(steps) else None
    charged, windows = charge(events, steps)
    # collective instances matched again on the aligned, de-duplicated, clipped events (the
    # alignment's own instances include spans recorded twice and the edges of profiler windows)
    per_rank, per_instance, lateness = straggler_table(events, steps)
    balance = {"dp": dp_imbalance(steps, events)}
    if expert_loads is not None and len(expert_loads):
        balance["ep"] = ep_balance(expert_loads)
    return Analysis(
        capture=capture,
        events=events,
        alignment=alignment,
        steps=steps,
        timelines=timelines,
        ranks=rank_summary(timelines, steps),
        step_marker=marker,
        causes=rank_causes(charged, windows),
        charged=charged,
        stragglers=per_rank,
        straggler_instances=per_instance,
        lateness=lateness,
        straggler_ranks=straggler_ranks(per_rank),
        balance=balance,
        warnings=warnings,
    )
