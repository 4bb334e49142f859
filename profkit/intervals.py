"""Interval arithmetic on int64 nanosecond arrays (vectorized; no per-event Python loops).

A *merged* interval set is two int64 arrays ``(starts, ends)``, sorted, disjoint and
non-touching. Everything here is exact integer arithmetic: float sums of ~1e18 ns
timestamps would lose tens of microseconds, which is the size of the waits we hunt.
"""
from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]


def as_i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def empty() -> Intervals:
    return np.empty(0, np.int64), np.empty(0, np.int64)


def union(starts, ends) -> Intervals:
    """Merge possibly overlapping intervals into a disjoint sorted set."""
    s = as_i64(starts)
    e = as_i64(ends)
    if s.size == 0:
        return empty()
    order = np.argsort(s, kind="stable")
    s = s[order]
    e = e[order]
    running_end = np.maximum.accumulate(e)
    # a new block starts where this start lies beyond everything seen so far
    new_block = np.empty(s.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > running_end[:-1]
    block_starts = s[new_block]
    block_last = np.flatnonzero(np.r_[new_block[1:], True])
    block_ends = running_end[block_last]
    return block_starts, block_ends


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of a 1-D numeric array by sort: numpy 2.3+'s hash-based unique is ~100x
    slower on millions of distinct timestamps (the hot path of every interval operation)."""
    if values.size < 2:
        return np.array(values, copy=True)
    s = np.sort(values, kind="stable")
    return s[np.r_[True, s[1:] != s[:-1]]]


def total(iv: Intervals) -> int:
    s, e = iv
    return int((e - s).sum())


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Parts of merged set ``a`` not covered by merged set ``b``."""
    a_s, a_e = a
    b_s, b_e = b
    if a_s.size == 0 or b_s.size == 0:
        return a_s.copy(), a_e.copy()
    # boundaries of both sets; coverage counts tell which elementary pieces are in a but not b
    points = unique_sorted(np.concatenate([a_s, a_e, b_s, b_e]))
    lo = points[:-1]
    hi = points[1:]
    in_a = _covered(a, lo)
    in_b = _covered(b, lo)
    keep = in_a & ~in_b
    return union(lo[keep], hi[keep])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    a_s, a_e = a
    b_s, b_e = b
    if a_s.size == 0 or b_s.size == 0:
        return empty()
    points = unique_sorted(np.concatenate([a_s, a_e, b_s, b_e]))
    lo = points[:-1]
    hi = points[1:]
    keep = _covered(a, lo) & _covered(b, lo)
    return union(lo[keep], hi[keep])


def _covered(iv: Intervals, points: np.ndarray) -> np.ndarray:
    """True where ``points`` lies in [start, end) of some interval of merged set ``iv``."""
    s, e = iv
    idx = np.searchsorted(s, points, side="right") - 1
    ok = idx >= 0
    out = np.zeros(points.size, dtype=bool)
    out[ok] = points[ok] < e[idx[ok]]
    return out


def covered_before(iv: Intervals, t) -> np.ndarray:
    """Total covered time of merged set ``iv`` in (-inf, t), for each t (vectorized)."""
    s, e = iv
    t = as_i64(t)
    if s.size == 0:
        return np.zeros(t.shape, np.int64)
    cum = np.concatenate([[0], np.cumsum(e - s)])
    i = np.searchsorted(s, t, side="right")  # intervals starting at or before t
    out = cum[i]
    has = i > 0
    last = i[has] - 1
    overshoot = np.maximum(e[last] - t[has], 0)
    out[has] -= overshoot
    return out


def covered_between(iv: Intervals, lo, hi) -> np.ndarray:
    """Covered time of merged set ``iv`` inside each window [lo, hi)."""
    return covered_before(iv, hi) - covered_before(iv, lo)


def clip(iv: Intervals, lo: int, hi: int) -> Intervals:
    s, e = iv
    keep = (e > lo) & (s < hi)
    return np.maximum(s[keep], lo), np.minimum(e[keep], hi)


def gaps(iv: Intervals, lo: int, hi: int) -> Intervals:
    """The uncovered pieces of [lo, hi): GPU-idle intervals when ``iv`` is GPU busy time."""
    s, e = clip(iv, lo, hi)
    starts = np.concatenate([[lo], e])
    ends = np.concatenate([s, [hi]])
    keep = ends > starts
    return starts[keep], ends[keep]


def nesting_parents(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Innermost enclosing interval of each interval (sorted by start, longest first; -1 at top
    level), by pointer jumping.

    Start from the previous interval; while the candidate does not contain this one, jump to
    the candidate's own candidate. No interval between a candidate and its interval can contain
    the interval (under nesting), so the first containing candidate is the parent; rounds grow
    with log(siblings) + depth, not with the number of intervals. Also when intervals overlap
    partly, the answer is that of the stack walk (pop while the top ends before this one ends;
    the top is the parent), which the collective candidates used to run in a Python loop.
    """
    n = starts.size
    parent = np.arange(n, dtype=np.int64) - 1
    # an interval ending after every earlier one has no parent (the stack walk pops everything):
    # answered at once, e.g. a stream's kernels one after the other, which would otherwise take
    # log2(n) rounds over all of them
    if n:
        before = np.maximum.accumulate(ends)
        top = np.r_[True, before[:-1] < ends[1:]]
        parent[top] = -1
        todo = np.flatnonzero(~top).astype(np.int64)
    else:
        todo = np.arange(n, dtype=np.int64)
    while todo.size:
        p = parent[todo]
        bad = (p >= 0) & (ends[np.maximum(p, 0)] < ends[todo])
        todo = todo[bad]
        parent[todo] = parent[parent[todo]]
    return parent
