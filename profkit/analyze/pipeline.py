"""One analysis of a capture: the tables every face of profkit (terminal, files, report) reads.

Every rank is first moved onto one clock (``profkit.align``); steps, GPU timelines and causes
are computed on the aligned events, so cross-rank facts (who waited for whom) are comparable.
The stages themselves live in ``profkit.scale`` (a map over ranks, a reduce over small tables):
``analyze`` runs them in memory on a loaded capture. The result, ``Analysis``, is defined in
``profkit.analyze.result`` (read as ``pipeline.Analysis`` too).
"""
from __future__ import annotations

import pandas as pd

from profkit.align.estimate import one_host  # noqa: F401 - read as pipeline.one_host too
from profkit.analyze.result import Analysis
from profkit.ingest.loader import Capture


def analyze(capture: Capture, step_pattern: str | None = None, expert_loads: pd.DataFrame | None = None) -> Analysis:
    """``expert_loads``: rows ``rank, step, layer, tokens`` (see ``balance.parse_expert_loads``).

    Runs the same per-rank stages as ``profkit.scale.analyze_paths`` (serially, in memory), so
    an analysis of a loaded capture and of files on a cluster are the same tables.
    """
    from profkit.scale.run import analyze_capture

    return analyze_capture(capture, step_pattern, expert_loads)
