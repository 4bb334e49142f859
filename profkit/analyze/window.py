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
    earliest last event (int64). A rank with one source gets that source's whole extent. Rows
    without a rank or a source are left out (as a groupby leaves them)."""
    src, _ = distinct.codes(events["source"])
    rank = events["rank"]
    ok = (src >= 0) & rank.notna().to_numpy(bool)
    ranks, at = _dense_unique(rank.to_numpy(np.int64, na_value=0)[ok])
    n_src = int(src.max()) + 1 if ok.any() else 1
    key = at * n_src + src[ok]  # one slot per (rank, source)
    first = np.full(ranks.size * n_src, np.iinfo(np.int64).max, np.int64)
    last = np.full(ranks.size * n_src, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(first, key, events["start_ns"].to_numpy(np.int64)[ok])
    np.maximum.at(last, key, events["end_ns"].to_numpy(np.int64)[ok])
    seen = np.zeros(first.size, bool)
    seen[key] = True
    first = np.where(seen, first, np.iinfo(np.int64).min).reshape(ranks.size, n_src).max(axis=1)
    last = np.where(seen, last, np.iinfo(np.int64).max).reshape(ranks.size, n_src).min(axis=1)
    return pd.DataFrame({"first_ns": first, "last_ns": last}, index=pd.Index(ranks, dtype="int64", name="rank"))


def _dense_unique(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of rank numbers (a few, close together) by
    counting, not sorting: a rank's task asks this of its ~200k rows of one rank (4 ms sorted)."""
    if not values.size:
        return values[:0], values[:0]
    low, high = int(values.min()), int(values.max())
    if high - low > (1 << 20):
        return np.unique(values, return_inverse=True)
    present = np.bincount(values - low, minlength=high - low + 1) > 0
    slot = np.cumsum(present) - 1
    return np.flatnonzero(present) + low, slot[values - low]


def clip_to_recorded(events: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, int]]:
    """Events that lie wholly inside their rank's recorded window, and how many were cut per rank.

    A no-op for ranks with a single source (the common case of one profiler trace per rank).
    """
    if events.empty or distinct.codes(events["source"])[1].size < 2:
        return events, {}
    window = recorded_window(events)
    rank = events["rank"].to_numpy(np.int64)  # raises on a missing rank, as astype("int64") did
    ranks = window.index.to_numpy(np.int64)
    at = np.minimum(np.searchsorted(ranks, rank), max(ranks.size - 1, 0))
    if not ranks.size or not (ranks[at] == rank).all():
        raise ValueError("rows of a rank without a recorded window (a row without a source)")
    lo, hi = window["first_ns"].to_numpy(np.int64)[at], window["last_ns"].to_numpy(np.int64)[at]
    inside = (events["start_ns"].to_numpy(np.int64) >= lo) & (events["end_ns"].to_numpy(np.int64) <= hi)
    if inside.all():
        return events, {}
    cut_ranks, counts = np.unique(rank[~inside], return_counts=True)
    return events.loc[inside], {int(r): int(n) for r, n in zip(cut_ranks.tolist(), counts.tolist())}
