"""One analysis of a capture: the tables every face of profkit (terminal, files, report) reads.

Every rank is first moved onto one clock (``profkit.align``); steps, GPU timelines and causes
are computed on the aligned events, so cross-rank facts (who waited for whom) are comparable.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from profkit import __version__
from profkit.align import Alignment, apply_alignment, estimate
from profkit.analyze.gpu import gpu_timelines
from profkit.analyze.overhead import charge, rank_causes
from profkit.analyze.steps import step_table
from profkit.analyze.summary import rank_summary
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
    warnings: list[str] = field(default_factory=list)
    version: str = __version__


def align(events: pd.DataFrame) -> tuple[pd.DataFrame, Alignment | None, list[str]]:
    """Events on one clock, the alignment, and what the user must know about it."""
    if events.empty:
        return events, None, []
    alignment = estimate(events)
    return apply_alignment(events, alignment), alignment, [f"alignment: {w}" for w in alignment.warnings]


def analyze(capture: Capture, step_pattern: str | None = None) -> Analysis:
    events, alignment, warnings = align(capture.events)
    steps = step_table(events, step_pattern)
    timelines = gpu_timelines(events)
    marker = str(steps["marker"].iloc[0]) if len(steps) else None
    charged, windows = charge(events, steps)
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
        warnings=warnings,
    )
