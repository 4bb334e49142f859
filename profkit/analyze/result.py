"""What one analysis of a capture holds (``Analysis``) and its JSON document (``summary.json``).

Why a module of its own: the analysis stages (``profkit.scale`` runs them), the in-memory entry
(``pipeline.analyze``), the files and report (``profkit.report``) and the regression history
(``profkit.history``) all read this one result; defined below all of them, none imports another
for it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

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
    # one row per (sync instance, rank): ``sync_table.SYNC_COLUMNS`` (``OUT/sync_points.csv``)
    sync_points: pd.DataFrame | None = None
    # per (rank, step, phase): own work since the previous sync point (``stragglers.PHASE_STEP_COLUMNS``),
    # the cause time the episodes are judged on
    phase_steps: pd.DataFrame | None = None
    # one line per disagreement between the straggler verdict and the cause table (``consistency``)
    consistency: list[str] = field(default_factory=list)
    impact: object | None = None  # ``analyze.impact.Impact``: impact.csv and its per-step samples; None: not computed


def _jsonable(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    if hasattr(value, "item"):  # numpy scalar
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return int(value) if value.is_integer() and abs(value) < 2**63 else value
    return value


def summary_document(analysis) -> dict[str, Any]:
    """The JSON document for ``summary.json`` (``ranks`` is a list sorted by rank)."""
    alignment = analysis.alignment.summary() if analysis.alignment is not None else {}
    ranks = []
    for row in analysis.ranks.to_dict("records"):
        entry = {k: _jsonable(v) for k, v in row.items()}
        entry["alignment"] = alignment.get(int(row["rank"]))
        ranks.append(entry)
    return {
        "profkit_version": analysis.version,
        "step_marker": analysis.step_marker,
        "stragglers": None if analysis.straggler_ranks is None else [int(r) for r in analysis.straggler_ranks],
        "n_ranks": len(ranks),
        "ranks": ranks,
        "inputs": [{k: _jsonable(v) for k, v in r.items()} for r in analysis.capture.parts.to_dict("records")],
        "consistency": list(getattr(analysis, "consistency", None) or []),
        "skipped": list(analysis.capture.skipped),
        "unranked_processes": [{k: _jsonable(v) if not isinstance(v, list) else v for k, v in u.items()}
                               for u in getattr(analysis.capture, "unranked", [])],
        "warnings": list(analysis.capture.warnings) + list(analysis.warnings),
        "impact": impact.to_summary() if (impact := getattr(analysis, "impact", None)) is not None else None,
    }
