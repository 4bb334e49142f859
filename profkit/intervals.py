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


def search(a: np.ndarray, v: np.ndarray, side: str = "left") -> np.ndarray:
    """``np.searchsorted(a, v, side)`` (``a`` sorted), counted from ``a``'s side where ``v`` is
    sorted and several times longer: each of ``a`` found among ``v``, then a running count over
    ``v`` (a binary search per query, numpy's, costs ~10 ns each on millions of piece starts;
    this ~4 ns). Exact: the same positions."""
    if a.size * _SEARCH_FROM_A < v.size and v.ndim == 1 and bool((v[1:] >= v[:-1]).all()):
        # a[k] <= v[i] (right) / a[k] < v[i] (left) from the first v[i] at or past a[k]
        first = np.searchsorted(v, a, side="left" if side == "right" else "right")
        return np.cumsum(np.bincount(first, minlength=v.size + 1))[:v.size]
    return np.searchsorted(a, v, side=side)


_SEARCH_FROM_A = 4  # v this many times longer than a: counting from a's side pays (2-2.5x at 5-30x)


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
    if _canonical(a) and _canonical(b):  # ``union``'s output: ``a`` inside the gaps of ``b``
        return _within(a, _complement(b))
    return _by_points(a, b, lambda in_a, in_b: in_a & ~in_b)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    a_s, a_e = a
    b_s, b_e = b
    if a_s.size == 0 or b_s.size == 0:
        return empty()
    if _canonical(a) and _canonical(b):
        return _within(a, b)
    return _by_points(a, b, lambda in_a, in_b: in_a & in_b)


def _canonical(iv: Intervals) -> bool:
    """Sorted, disjoint, non-touching, none reversed: what ``union`` makes (the form every caller
    passes). Other input takes the general way (``_by_points``)."""
    s, e = iv
    return bool((e >= s).all()) and (s.size < 2 or bool((s[1:] > e[:-1]).all()))


def _complement(iv: Intervals) -> Intervals:
    """The gaps of a canonical set over all of int64 (sorted and disjoint as well)."""
    s, e = iv
    lo = np.concatenate([[np.iinfo(np.int64).min], e])
    hi = np.concatenate([s, [np.iinfo(np.int64).max]])
    keep = hi > lo
    return lo[keep], hi[keep]


def _within(a: Intervals, c: Intervals) -> Intervals:
    """``a`` & ``c`` for canonical ``a`` and sorted disjoint ``c``, in canonical form: each
    interval of ``a`` meets the run of ``c``'s intervals that binary search finds for it. Linear
    in the output: no sort of every boundary and no search of every one (the general way costs
    4-8x as much on a rank's ~10^5 kernels)."""
    a_s, a_e = a
    c_s, c_e = c
    lo = np.searchsorted(c_e, a_s, side="right")  # the first of c ending after a's start
    hi = np.searchsorted(c_s, a_e, side="left")  # past the last of c starting before a's end
    counts = np.maximum(hi - lo, 0)
    total = int(counts.sum())
    if total == 0:
        return empty()
    owner = np.repeat(np.arange(a_s.size, dtype=np.int64), counts)
    j = lo[owner] + (np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts))
    s = np.maximum(a_s[owner], c_s[j])
    e = np.minimum(a_e[owner], c_e[j])
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size > 1:  # sorted and disjoint; pieces that touch (around an empty interval of b) are joined
        new = np.r_[True, s[1:] > e[:-1]]
        if not new.all():
            last = np.r_[np.flatnonzero(new)[1:] - 1, s.size - 1]
            s, e = s[new], e[last]
    return s, e


def _by_points(a: Intervals, b: Intervals, keep_fn) -> Intervals:
    """The general way for any sorted sets: every boundary of both, each elementary piece kept by
    ``keep_fn(in_a, in_b)`` of its coverage."""
    points = unique_sorted(np.concatenate([a[0], a[1], b[0], b[1]]))
    lo = points[:-1]
    hi = points[1:]
    keep = keep_fn(_covered(a, lo), _covered(b, lo))
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
    i = search(s, t, side="right")  # intervals starting at or before t
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
