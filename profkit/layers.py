"""Point queries over interval sets: which interval holds time t (the innermost, or any).

Overhead attribution cuts GPU-idle time into pieces at every host-span boundary, so inside
one piece the host's call stack is constant and one query at the piece start answers for the
whole piece. Queries are vectorized over all pieces: a per-thread span stack becomes a parent
array (each span's innermost enclosing span), and "innermost span at t" is the last span
starting at or before t, walked up its parents until one still runs at t. The walk takes as
many numpy rounds as the stack is deep, never one Python step per piece.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from profkit import intervals as iv

NONE = -1


@dataclass(frozen=True)
class Layer:
    """Intervals of one kind on one thread, sorted by (start asc, end desc); ``codes`` label them."""

    starts: np.ndarray
    ends: np.ndarray
    codes: np.ndarray
    parent: np.ndarray  # index of the innermost enclosing interval, NONE at the top

    @property
    def size(self) -> int:
        return int(self.starts.size)

    @cached_property
    def reach(self) -> tuple[np.ndarray, np.ndarray]:
        """Per interval (in order): the furthest end reached so far and the first interval that
        reaches it (``covering``'s tables, made once per layer: layers are queried many times)."""
        run_end = np.maximum.accumulate(self.ends)
        idx = np.arange(self.size, dtype=np.int64)
        return run_end, np.maximum.accumulate(np.where(self.ends == run_end, idx, 0))

    @cached_property
    def bounds(self) -> np.ndarray:
        """The distinct starts and ends, sorted: between two of them every query's answer is the
        same (no interval starts or ends in between), so many times can be answered at these."""
        return iv.unique_sorted(np.concatenate([self.starts, self.ends]))


def make_layer(starts: np.ndarray, ends: np.ndarray, codes: np.ndarray) -> Layer:
    """Layer of the non-empty intervals; parents assume proper nesting (a partial overlap
    just loses that ancestor: every answer still contains the query time)."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    codes = np.asarray(codes, np.int64)
    keep = ends > starts
    starts, ends, codes = starts[keep], ends[keep], codes[keep]
    order = np.lexsort((-ends, starts))
    starts, ends, codes = starts[order], ends[order], codes[order]
    return Layer(starts, ends, codes, iv.nesting_parents(starts, ends))


def at_bounds(bounds: np.ndarray, t: np.ndarray, answer) -> np.ndarray:
    """A query's answers at times ``t`` read from ``answer(bounds)``, its answers at the sorted,
    distinct ``bounds`` between which it cannot change: each time takes the answer of the last
    bound at or before it (NONE before the first). Why: the pieces asked about are often many
    times the intervals (a CPU engine capture: ~427k pieces, a few thousand spans a thread), and
    the query then runs over the bounds, not over every piece."""
    k = iv.search(bounds, t, side="right") - 1
    return np.where(k >= 0, answer(bounds)[np.maximum(k, 0)], NONE)


def _at_bounds(layer: Layer, t: np.ndarray, query) -> np.ndarray:
    """``query(layer, t)`` read at the layer's bounds (``at_bounds``)."""
    return at_bounds(layer.bounds, t, lambda b: query(layer, b))


AT_BOUNDS_FROM = 4  # times per interval from which they are answered at the bounds


def innermost(layer: Layer, t: np.ndarray) -> np.ndarray:
    """Index of the innermost interval of ``layer`` holding each time in ``t`` (NONE if none)."""
    t = np.asarray(t, np.int64)
    if layer.size == 0:
        return np.full(t.size, NONE, np.int64)
    if t.size > AT_BOUNDS_FROM * layer.size:
        return _at_bounds(layer, t, _innermost)
    return _innermost(layer, t)


def _innermost(layer: Layer, t: np.ndarray) -> np.ndarray:
    """``innermost`` by search and parent walk at every time."""
    j = iv.search(layer.starts, t, side="right") - 1
    todo = np.flatnonzero(j >= 0)
    while todo.size:
        jj = j[todo]
        bad = layer.ends[jj] <= t[todo]
        todo = todo[bad]
        j[todo] = layer.parent[j[todo]]
        todo = todo[j[todo] >= 0]
    return j


def covering(layer: Layer, t: np.ndarray) -> np.ndarray:
    """Index of an interval holding each time (the one reaching furthest: the outermost under
    nesting), NONE if none. Works for overlapping, non-nested sets too."""
    t = np.asarray(t, np.int64)
    if layer.size == 0:
        return np.full(t.size, NONE, np.int64)
    if t.size > AT_BOUNDS_FROM * layer.size:
        return _at_bounds(layer, t, _covering)
    return _covering(layer, t)


def _covering(layer: Layer, t: np.ndarray) -> np.ndarray:
    """``covering`` by search at every time."""
    run_end, run_arg = layer.reach
    j = iv.search(layer.starts, t, side="right") - 1
    out = np.full(t.size, NONE, np.int64)
    ok = j >= 0
    hit = np.zeros(t.size, dtype=bool)
    hit[ok] = run_end[j[ok]] > t[ok]
    out[hit] = run_arg[j[hit]]
    return out


def codes_at(layer: Layer, j: np.ndarray, default: int = NONE) -> np.ndarray:
    """``layer.codes`` of query answers ``j``; ``default`` where there was none."""
    if layer.size == 0:
        return np.full(j.size, default, np.int64)
    return np.where(j >= 0, layer.codes[np.maximum(j, 0)], default)


def split_at(starts: np.ndarray, ends: np.ndarray, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut each interval at the (sorted, unique) ``cuts`` strictly inside it.

    Returns (piece_starts, piece_ends, owner) where owner is the index of the interval.
    """
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    lo = np.searchsorted(cuts, starts, side="right")
    hi = np.searchsorted(cuts, ends, side="left")
    inner = np.maximum(hi - lo, 0)
    counts = inner + 1
    owner = np.repeat(np.arange(starts.size, dtype=np.int64), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    k = np.arange(owner.size, dtype=np.int64) - first  # piece number inside its interval
    lo_o = lo[owner]
    is_first = k == 0
    is_last = k == inner[owner]
    if cuts.size == 0:  # nothing to cut at: every interval is one piece
        return starts.copy(), ends.copy(), owner
    top = cuts.size - 1
    p_start = np.where(is_first, starts[owner], cuts[np.clip(lo_o + k - 1, 0, top)])
    p_end = np.where(is_last, ends[owner], cuts[np.clip(lo_o + k, 0, top)])
    return p_start.astype(np.int64), p_end.astype(np.int64), owner
