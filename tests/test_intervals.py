"""Interval arithmetic against a brute-force per-nanosecond model (hypothesis)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from profkit.analyze import intervals as iv

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
