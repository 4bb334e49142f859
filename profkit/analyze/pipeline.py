"""One analysis of a capture: the tables every face of profkit (terminal, files, report) reads.

Every rank is first moved onto one clock (``profkit.align``); steps, GPU timelines and causes
are computed on the aligned events, so cross-rank facts (who waited for whom) are comparable.
The stages themselves live in ``profkit.scale`` (a map over ranks, a reduce over small tables):
``analyze`` runs them in memory on a loaded capture.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from profkit import __version__
from profkit.align import Alignment
from profkit.ingest.loader import Capture


@dataclass
class Analysis:
    capture: Capture
    events: pd.DataFrame | None  # aligned onto the reference rank's clock (None: never held, scale path)
    alignment: Alignment | None
    steps: pd.DataFrame
    timelines: pd.DataFrame
    ranks: pd.DataFrame
    step_marker: str | None
    causes: pd.DataFrame
    # one row per charged GPU-idle interval (rank, step, cause, dur_ns, ...)
    charged: pd.DataFrame | None = field(default_factory=pd.DataFrame)  # None: not held (scale path)
    cause_steps: pd.DataFrame | None = None  # per (rank, step, cause): charged ns (``OUT/cause_steps.csv``)
    stragglers: pd.DataFrame | None = None  # per rank: STRAGGLER_COLUMNS first
    straggler_instances: pd.DataFrame | None = None  # per collective instance: skew, last arriver
    lateness: pd.DataFrame | None = None  # per (rank, step): lateness at sync points
    straggler_ranks: list[int] | None = None  # None: not computed
    balance: dict[str, pd.DataFrame] | None = None  # "ep" (when loads known), "dp"; None: not computed
    warnings: list[str] = field(default_factory=list)
    version: str = __version__
    straggler_episodes: pd.DataFrame | None = None  # one row per episode: straggler_episodes.EPISODE_COLUMNS
    # one row per task of the run: stage, rank, worker, wall_s, peak_rss_bytes, events
    run_stats: pd.DataFrame | None = None
    store: object | None = None  # the scale path's store when asked to keep the aligned events
    # one row per (sync instance, rank): ``syncpoints.SYNC_COLUMNS`` (``OUT/sync_points.csv``)
    sync_points: pd.DataFrame | None = None
    # per (rank, step, phase): own work since the previous sync point (``stragglers.PHASE_STEP_COLUMNS``),
    # the cause time the episodes are judged on
    phase_steps: pd.DataFrame | None = None
    # one line per disagreement between the straggler verdict and the cause table (``consistency``)
    consistency: list[str] = field(default_factory=list)
    impact: object | None = None  # ``analyze.impact.Impact``: impact.csv and its per-step samples; None: not computed


def one_host(meta: dict[int, list[dict]]) -> bool:
    """True when every rank names a host and all name the same one: their clocks are one clock."""
    hosts = [{m["host"] for m in parts if m.get("host")} for parts in meta.values()]
    return bool(hosts) and all(hosts) and len(set().union(*hosts)) == 1


def analyze(capture: Capture, step_pattern: str | None = None, expert_loads: pd.DataFrame | None = None) -> Analysis:
    """``expert_loads``: rows ``rank, step, layer, tokens`` (see ``balance.parse_expert_loads``).

    Runs the same per-rank stages as ``profkit.scale.analyze_paths`` (serially, in memory), so
    an analysis of a loaded capture and of files on a cluster are the same tables.
    """
    from profkit.scale.run import analyze_capture

    return analyze_capture(capture, step_pattern, expert_loads)
