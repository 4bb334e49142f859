"""Interval arithmetic against a brute-force per-nanosecond model (hypothesis)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from profkit import intervals as iv

spans = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=25)


def _cover(pairs) -> np.ndarray:
    mask = np.zeros(300, dtype=bool)
    for s, d in pairs:
        mask[s : s + d] = True
    return mask


def _mask_of(ivs) -> np.ndarray:
    mask = np.zeros(300, dtype=bool)
    for s, e in zip(*ivs):
        mask[s:e] = True
    return mask


def _merged(pairs):
    return iv.union([s for s, _ in pairs], [s + d for s, d in pairs])


@settings(max_examples=300, deadline=None)
@given(spans)
def test_union_is_disjoint_and_exact(pairs):
    u = _merged(pairs)
    assert np.array_equal(_mask_of(u), _cover(pairs))
    s, e = u
    assert (s[1:] > e[:-1]).all()  # disjoint, sorted
    assert iv.total(u) == int(_cover(pairs).sum())


@settings(max_examples=300, deadline=None)
@given(spans, spans)
def test_subtract_and_intersect(a, b):
    ua, ub = _merged(a), _merged(b)
    assert np.array_equal(_mask_of(iv.subtract(ua, ub)), _cover(a) & ~_cover(b))
    assert np.array_equal(_mask_of(iv.intersect(ua, ub)), _cover(a) & _cover(b))


@settings(max_examples=300, deadline=None)
@given(spans, spans)
def test_the_linear_way_gives_the_general_way_s_arrays(a, b):
    """``subtract``/``intersect`` of merged sets go the linear way (``_within``): the very arrays
    the general way (every boundary, ``_by_points``) gives, not only the same coverage, so no
    table downstream changes; sets that are not merged still go the general way."""
    ua, ub = _merged(a), _merged(b)
    assert iv._canonical(ua) and iv._canonical(ub)
    for fn, keep in ((iv.subtract, lambda x, y: x & ~y), (iv.intersect, lambda x, y: x & y)):
        got = fn(ua, ub)
        want = iv._by_points(ua, ub, keep) if len(ua[0]) and len(ub[0]) else fn(ua, ub)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert got[0].dtype == np.int64 and got[1].dtype == np.int64
    # a merged set cut in two where it is long enough touches itself: not canonical, so it goes
    # the general way, with the same coverage
    s, e = ua
    mid = (s + e) // 2
    cut = mid > s
    touching = (np.sort(np.r_[s, mid[cut]]), np.sort(np.r_[mid[cut], e]))
    if cut.any():
        assert not iv._canonical(touching)
        assert np.array_equal(_mask_of(iv.subtract(touching, ub)), _cover(a) & ~_cover(b))
        assert np.array_equal(_mask_of(iv.intersect(touching, ub)), _cover(a) & _cover(b))


@settings(max_examples=300, deadline=None)
@given(spans, st.lists(st.tuples(st.integers(0, 250), st.integers(0, 60)), min_size=1, max_size=8))
def test_covered_between_windows(pairs, windows):
    u = _merged(pairs)
    lo = np.array([w[0] for w in windows])
    hi = np.array([w[0] + w[1] for w in windows])
    got = iv.covered_between(u, lo, hi)
    cover = _cover(pairs)
    want = [int(cover[a:b].sum()) for a, b in zip(lo, hi)]
    assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(spans, st.integers(0, 150), st.integers(0, 150))
def test_gaps_complement_busy_inside_window(pairs, lo, width):
    hi = lo + width
    u = _merged(pairs)
    g = iv.gaps(u, lo, hi)
    cover = _cover(pairs)
    want = np.zeros(300, dtype=bool)
    want[lo:hi] = ~cover[lo:hi]
    assert np.array_equal(_mask_of(g), want)


def _stack_parents(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Reference: the stack walk the collective candidates ran before issue #15."""
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    for i in range(len(starts)):
        while stack and ends[stack[-1]] < ends[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 40)), max_size=40))
def test_nesting_parents_equal_the_stack_walk(pairs):
    """One parent algorithm for nested and partly overlapping intervals alike (sorted by start,
    longest first): pointer jumping gives what the stack walk gives."""
    s = np.array([p[0] for p in pairs], np.int64)
    e = s + np.array([p[1] for p in pairs], np.int64)
    order = np.lexsort((-e, s))
    s, e = s[order], e[order]
    assert np.array_equal(iv.nesting_parents(s, e), _stack_parents(s, e))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-50, 50), max_size=30), st.lists(st.integers(-60, 60), max_size=300), st.booleans(),
       st.sampled_from(["left", "right"]))
def test_search_is_numpys_searchsorted(a, v, sort_v, side):
    """``intervals.search``: numpy's positions, counted from the short side where the queries are
    sorted and several times as many (ties on both sides), numpy's own search otherwise."""
    a = np.sort(np.array(a, np.int64))
    v = np.array(v, np.int64)
    if sort_v:
        v = np.sort(v)
    np.testing.assert_array_equal(iv.search(a, v, side), np.searchsorted(a, v, side=side))
