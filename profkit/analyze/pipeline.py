"""One analysis of a capture: the tables every face of profkit (terminal, files, report) reads."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from profkit import __version__
from profkit.analyze.gpu import gpu_timelines
from profkit.analyze.overhead import causes_table
from profkit.analyze.steps import step_table
from profkit.analyze.summary import rank_summary
from profkit.ingest.loader import Capture


@dataclass
class Analysis:
    capture: Capture
    steps: pd.DataFrame
    timelines: pd.DataFrame
    ranks: pd.DataFrame
    step_marker: str | None
    causes: pd.DataFrame
    version: str = __version__


def analyze(capture: Capture, step_pattern: str | None = None) -> Analysis:
    steps = step_table(capture.events, step_pattern)
    timelines = gpu_timelines(capture.events)
    marker = str(steps["marker"].iloc[0]) if len(steps) else None
    return Analysis(
        capture=capture,
        steps=steps,
        timelines=timelines,
        ranks=rank_summary(timelines, steps),
        step_marker=marker,
        causes=causes_table(capture.events, steps),
    )
