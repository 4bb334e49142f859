"""Rows grouped, or matched to another table's rows, by equal integer keys: sorted instead of hashed.

Why: a kernel's launch is the runtime call of its (rank, pid, correlation); pandas' ``merge`` of
two frames cost a rank milliseconds of its own work and carried a column with missing rows
through float64 (epoch-sized nanoseconds came back rounded); a ``groupby`` of a few thousand rows
costs milliseconds of fixed work. Used by the collective candidates, the replay's GPU ops, the
causes per rank and the straggler verdicts.
"""
from __future__ import annotations

import numpy as np


def first_match(table: tuple[np.ndarray, ...], keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Per row of ``keys`` (tuples of int64 columns), the first row of ``table`` with equal
    columns, -1 if none: ``drop_duplicates`` then a left ``merge`` (missing ids are the caller's
    sentinel, so a missing one matches a missing one)."""
    m, n = table[0].size, keys[0].size
    if not m or not n:
        return np.full(n, -1, np.int64)
    cols = tuple(np.concatenate([t, k]) for t, k in zip(table, keys))
    is_key = np.r_[np.zeros(m, np.int64), np.ones(n, np.int64)]
    order, starts = sorted_groups(cols, within=(is_key,))  # a key's table rows first, in row order
    head = order[starts]
    found = np.repeat(np.where(head < m, head, -1), np.diff(np.r_[starts, m + n]))
    out = np.full(n, -1, np.int64)
    k = order >= m
    out[order[k] - m] = found[k]
    return out


def sorted_groups(cols: tuple[np.ndarray, ...], within: tuple[np.ndarray, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by equal integer columns, as ``groupby(sort=True)`` orders them: the row order
    (by the columns, then by ``within``, ties in row order) and where each group starts in it.
    Sorted, not hashed: a pandas groupby of a few thousand rows on several keys costs
    milliseconds of fixed work."""
    n = cols[0].size
    packed = _packed(cols + within) if n else None
    if packed is not None:  # one int64 key: one stable sort, several times faster than a lexsort
        order = stable_argsort(packed)
    else:
        order = np.lexsort(tuple(reversed(cols + within))) if n else np.empty(0, np.int64)
    new = np.zeros(n, bool)
    if n:
        new[0] = True
    for c in cols:
        sc = c[order]
        new[1:] |= sc[1:] != sc[:-1]
    return order, np.flatnonzero(new)


def _packed(cols: tuple[np.ndarray, ...]) -> np.ndarray | None:
    """The columns as one int64 that sorts as they do (the first most significant), None when
    their ranges together do not fit in 62 bits."""
    key, span = None, 1
    for c in cols:
        lo, hi = int(c.min()), int(c.max())
        width = hi - lo + 1
        span *= width
        if span >= 1 << 62:
            return None
        part = c.astype(np.int64) - np.int64(lo)
        key = part if key is None else key * np.int64(width) + part
    return key


def stable_argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` of an int64 key. Where the key's range times its length
    fits in an int64, the row number goes in the low digits: every value is then distinct, and
    numpy's unstable sort (vectorized, ~10x a stable argsort of random keys) gives the same order."""
    n = key.size
    if not n:
        return np.empty(0, np.int64)
    lo, hi = int(key.min()), int(key.max())
    if hi - lo >= (1 << 63) // n:
        return np.argsort(key, kind="stable")
    return np.sort((key - np.int64(lo)) * np.int64(n) + np.arange(n, dtype=np.int64)) % np.int64(n)
