"""Where ``merge_ranks`` reads a capture from: one rank's events at a time.

A DEP256 capture does not fit in memory at once, so merge never asks for all events. A source is
any object with

* ``ranks: list[int]`` and ``meta: dict[int, list[dict]]`` (rank -> its parts' meta, as
  ``Capture.meta``);
* ``events(rank) -> pd.DataFrame``: that rank's events in the profkit schema (``profkit.schema``),
  on its own clocks. Merge calls it once per rank, in rank order, and drops the frame before it
  asks for the next rank;
* ``summary(rank) -> RankSummary`` (recommended): the small per-rank facts merge needs before it
  writes the first rank (the step marker is chosen over all ranks' span names, display pids over
  all ranks' pids, the Chrome header and ``--time`` need the earliest event). A source backed by
  Parquet can build it from ``SUMMARY_COLUMNS`` alone (``summarize_rank`` on those columns), or
  keep it from when it wrote the rank. Without ``summary`` merge reads every rank twice (once
  for the summary, once to write it);
* optionally ``parts: pd.DataFrame`` (``Capture.parts``: rank, path, key, source): the inputs named
  in each process track's description.

``FrameSource`` is the in-memory source over one event table, as ``profkit.load`` returns it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from profkit.export.steps import span_names

# every column summarize_rank reads: a columnar source can load just these for the first pass
SUMMARY_COLUMNS = ("kind", "name", "stream", "pid", "source", "start_ns")


@dataclass(frozen=True)
class RankSummary:
    """What merge must know of a rank before writing any rank (all small, none per event)."""

    rank: int
    n_events: int
    span_names: frozenset[str]  # distinct host span names: where a step marker can match
    host_pid_counts: dict[int, int] = field(default_factory=dict)  # OS pid -> host events (identity)
    first_start_ns: dict[str | None, int] = field(default_factory=dict)  # source -> earliest start, own clock


@runtime_checkable
class RankSource(Protocol):
    ranks: list[int]
    meta: dict[int, list[dict[str, Any]]]

    def events(self, rank: int) -> pd.DataFrame: ...


def summarize_rank(rank: int, events: pd.DataFrame) -> RankSummary:
    """``RankSummary`` of one rank's events (needs only ``SUMMARY_COLUMNS``)."""
    host = events["stream"].isna().to_numpy(dtype=bool) & events["pid"].notna().to_numpy(dtype=bool)
    pids = events["pid"].to_numpy(np.int64, na_value=-1)[host]
    values, counts = np.unique(pids, return_counts=True)
    timed = events[events["start_ns"].notna().to_numpy(dtype=bool)]
    first = timed.groupby("source", dropna=False, sort=True, observed=True)["start_ns"].min() if len(timed) else pd.Series(dtype="int64")
    return RankSummary(
        rank=int(rank),
        n_events=len(events),
        span_names=frozenset(span_names(events)),
        host_pid_counts={int(p): int(n) for p, n in zip(values.tolist(), counts.tolist())},
        first_start_ns={(None if pd.isna(s) else str(s)): int(t) for s, t in first.items()},
    )


def first_starts_frame(summaries: list[RankSummary]) -> pd.DataFrame:
    """One row per (rank, source): its earliest start, as an event-shaped frame alignment can move.

    Moving a rank's clock is monotone per (rank, source) (an offset, and a drift far below 1), so
    the earliest aligned event of the capture is the earliest of these rows once aligned.
    """
    rows = [(s.rank, src, t) for s in summaries for src, t in s.first_start_ns.items()]
    starts = np.array([r[2] for r in rows], dtype=np.int64)
    return pd.DataFrame({
        "rank": pd.array([r[0] for r in rows], dtype="int32"),
        "source": pd.array([r[1] for r in rows], dtype="string"),
        "start_ns": pd.array(starts, dtype="Int64"),
        "end_ns": pd.array(starts, dtype="Int64"),
    })


class FrameSource:
    """An in-memory ``RankSource`` over one event table (``Capture.events``), grouped by rank.

    ``events(rank)`` is a slice of the table (no copy when the rank's rows are contiguous, as the
    loader builds them), so this source saves no memory: it lets ``merge_capture`` and tests use
    the same streaming path as sources that read ranks from disk.
    """

    def __init__(self, events: pd.DataFrame, meta: dict[int, list[dict]] | None = None, parts: pd.DataFrame | None = None) -> None:
        self._events = events
        self._positions = events.groupby("rank", sort=True).indices if len(events) else {}
        self.ranks = sorted(int(r) for r in pd.unique(events["rank"].dropna())) if len(events) else []
        self.meta = dict(meta or {})
        self.parts = parts

    @classmethod
    def from_capture(cls, capture) -> "FrameSource":
        return cls(capture.events, capture.meta, capture.parts)

    def events(self, rank: int) -> pd.DataFrame:
        return rows_at(self._events, self._positions[rank])

    def summary(self, rank: int) -> RankSummary:
        return summarize_rank(rank, self.events(rank))


def rows_at(events: pd.DataFrame, positions: np.ndarray) -> pd.DataFrame:
    """Rows at ``positions``: a slice (no copy) when contiguous, as the loader builds them."""
    if len(positions) and positions[-1] - positions[0] + 1 == len(positions):
        return events.iloc[int(positions[0]):int(positions[-1]) + 1]
    return events.iloc[positions]
