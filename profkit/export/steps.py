"""The step table, one rank at a time, with the marker chosen once for all ranks.

``step_table`` over the whole capture copies rows of every rank at once (its peak was most of
a merge's memory on DEP32); here the marker is chosen as ``find_step_spans`` does (the first
marker that matches on any rank, so steps stay comparable across ranks) from each rank's
distinct span names, and then each rank's steps are computed from that rank's rows alone.
"""
from __future__ import annotations

from typing import Iterable

import pandas as pd

from profkit import schema
from profkit.analyze.steps import STEP_COLUMNS, StepMarker, step_markers, step_table

HOST_SPAN_KINDS = (schema.CPU_SPAN, schema.CPU_OP)  # where step markers live (as analyze.steps)
STEP_TABLE_COLUMNS = ["rank", "kind", "name", "start_ns", "end_ns"]  # all that step_table reads


def span_names(events: pd.DataFrame) -> set[str]:
    """Distinct names of one rank's host spans (what a step marker can match)."""
    host = events["kind"].isin(HOST_SPAN_KINDS).to_numpy(dtype=bool)
    return {str(n) for n in pd.unique(events["name"].to_numpy(dtype=object, na_value=None)[host]) if n is not None}


def choose_marker(names_per_rank: Iterable[set[str]], step_pattern: str | None) -> StepMarker | None:
    names = set().union(*names_per_rank)
    for marker in step_markers(step_pattern):
        if any(marker.pattern.search(n) for n in names):
            return marker
    return None


def rank_steps(events: pd.DataFrame, names: set[str], marker: StepMarker | None) -> pd.DataFrame:
    """``step_table`` rows of one rank for ``marker`` (none if the rank lacks that marker)."""
    if marker is None or not any(marker.pattern.search(n) for n in names):
        return pd.DataFrame(columns=STEP_COLUMNS)
    steps = step_table(events[STEP_TABLE_COLUMNS], marker.pattern.pattern)
    steps["marker"] = marker.key
    return steps
