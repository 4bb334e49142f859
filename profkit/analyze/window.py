"""The time every source of a rank recorded: where cross-source facts about the rank hold.

A capture mixes sources with different windows: profkit's span files cover the whole run,
torch.profiler and nsys a window of steps. Outside the window they all cover, a rank looks idle
on the GPU or late at a collective only because one source was not recording.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit import distinct


def recorded_window(events: pd.DataFrame) -> pd.DataFrame:
    """Per rank (index): ``first_ns`` = the latest first event over its sources, ``last_ns`` = the
    earliest last event (int64). A rank with one source gets that source's whole extent."""
    g = events.groupby(["rank", "source"], observed=True)
    ext = pd.DataFrame({"first_ns": g["start_ns"].min(), "last_ns": g["end_ns"].max()}).reset_index()
    out = pd.DataFrame(
        {"first_ns": ext.groupby("rank")["first_ns"].max(), "last_ns": ext.groupby("rank")["last_ns"].min()}
    )
    out.index = out.index.astype("int64")
    return out.astype("int64")


def clip_to_recorded(events: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, int]]:
    """Events that lie wholly inside their rank's recorded window, and how many were cut per rank.

    A no-op for ranks with a single source (the common case of one profiler trace per rank).
    """
    if events.empty or distinct.codes(events["source"])[1].size < 2:
        return events, {}
    window = recorded_window(events)
    rank = events["rank"].astype("int64")
    lo = rank.map(window["first_ns"]).to_numpy(np.int64)
    hi = rank.map(window["last_ns"]).to_numpy(np.int64)
    inside = (events["start_ns"].to_numpy(np.int64) >= lo) & (events["end_ns"].to_numpy(np.int64) <= hi)
    if inside.all():
        return events, {}
    cut = events.loc[~inside].groupby("rank", observed=True).size()
    return events.loc[inside], {int(r): int(n) for r, n in cut.items() if n}
