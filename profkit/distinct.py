"""Work on a string column's distinct values instead of its rows: regex tests, Python strings.

Why: an event table has hundreds of thousands of rows but a few hundred distinct names, sources
and categories (kernel and span names repeat every step). pandas runs a compiled pattern with
flags through Python's ``re`` row by row, and ``astype(str)`` makes a Python string per row.
Factorizing first (pyarrow's hash, codes in order of first appearance) and working on the
distinct values with the very same calls gives the same results at a fraction of the cost.

``codes`` factorizes an Arrow-backed column once for as long as its data lives: the per-rank tasks
test a rank's ``kind`` column about a dozen times and factorize its ``name`` column several times
(in as many modules), and each ``isin`` or factorize hashed every row again (~8 ms and ~17 ms at
390k rows; a test of the codes ~0.5 ms).
"""
from __future__ import annotations

import re
import weakref
from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa

# id of a column's Arrow data -> (a weak reference to it, its codes, its distinct values)
_CODES: dict[int, tuple[weakref.ref, np.ndarray, np.ndarray]] = {}


def codes(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(values, use_na_sentinel=True)`` as (int64 codes, -1 where missing; the
    distinct values as an object array of Python strings), computed once per Arrow column while
    it lives (keyed by its data object, never by value: a frame derived by ``assign`` or a column
    selection shares the data, a filtered one has its own). Both arrays are read-only."""
    data = _arrow_data(values)
    if data is not None:
        hit = _CODES.get(id(data))
        if hit is not None and hit[0]() is data:
            return hit[1], hit[2]
    c, u = pd.factorize(values, use_na_sentinel=True)
    c = np.asarray(c, np.int64)
    u = np.array([str(x) for x in u], dtype=object)
    if data is not None:
        _remember(data, c, u)
    else:
        c.flags.writeable = False
        u.flags.writeable = False
    return c, u


def is_text(values: pd.Series) -> bool:
    """An Arrow-backed string column: ``codes`` spells its values as they are (and remembers them)."""
    dtype = values.dtype
    return (isinstance(dtype, pd.ArrowDtype) and (pa.types.is_string(dtype.pyarrow_dtype)
                                                  or pa.types.is_large_string(dtype.pyarrow_dtype))) or (
        isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow")


def factorize(values: pd.Series, sort: bool = False) -> tuple[np.ndarray, pd.Index]:
    """``pd.factorize(values, sort=sort)`` (missing: -1): a text column's from its ``codes``
    (remembered while its data lives, as ``strings_from_codes`` makes them known), others by pandas."""
    if not is_text(values):
        return pd.factorize(values, sort=sort, use_na_sentinel=True)
    c, u = codes(values)
    if sort and u.size:
        order = np.argsort(u, kind="stable")  # Python's string order, as pandas sorts the uniques
        rank = np.empty(u.size, np.int64)
        rank[order] = np.arange(u.size)
        c = np.where(c < 0, -1, rank[np.maximum(c, 0)])
        u = u[order]
    return c, pd.Index(u, dtype=values.dtype)


def text_objects(values: pd.Series) -> np.ndarray:
    """``values.astype(str).to_numpy(dtype=object)``; for a text column without missing values from
    its ``codes`` (one string object per distinct value, no per-row conversion)."""
    if is_text(values):
        c, u = codes(values)
        if not (c < 0).any():
            return u[c] if c.size else np.empty(0, dtype=object)
    return values.astype(str).to_numpy(dtype=object)


def _arrow_data(values: pd.Series):
    """The column's Arrow data object, when it has one that stays the same object (the memo's key)."""
    arr = getattr(values, "array", None)
    take = getattr(arr, "__arrow_array__", None)
    if take is None or not isinstance(values.dtype, (pd.ArrowDtype, pd.StringDtype)):
        return None
    try:
        data = take()
    except Exception:  # noqa: BLE001 - no Arrow data to key on: factorized each time
        return None
    return data if take() is data else None


# (pattern, flags, "match" | "search") -> {string: hit}: every string a process has tested
_REGEX: dict[tuple[str, int, str], dict[str, bool]] = {}
_REGEX_MEMO_MAX = 1 << 20  # strings per pattern kept (a trace of unique names must not grow it forever)


def regex_flags(uniques: np.ndarray, codes: np.ndarray, regex: re.Pattern[str], how: str = "match",
                missing: str | None = "") -> np.ndarray:
    """Per row, whether ``regex.match`` (``how="search"``: ``regex.search``, as ``str.contains``)
    finds its value, from the column's codes and distinct values (``codes``): a missing value
    (code -1) is tested as ``missing`` (None: False). Each string is tested once per process:
    a rank's names are the other ranks' names, so a worker of the scale path tests a name once,
    not once per rank and call (pandas' ``str.match`` on the distinct values cost 1-3 ms a call,
    several calls per rank). The same Python ``re`` test pandas makes of a compiled pattern."""
    memo = _REGEX.setdefault((regex.pattern, regex.flags, how), {})
    if len(memo) > _REGEX_MEMO_MAX:
        memo.clear()
    test = regex.match if how == "match" else regex.search
    values = uniques.tolist() if isinstance(uniques, np.ndarray) else list(uniques)
    flags = np.zeros(len(values) + 1, dtype=bool)
    for i, u in enumerate(values):
        hit = memo.get(u)
        if hit is None:
            hit = memo[u] = test(u) is not None
        flags[i] = hit
    flags[-1] = missing is not None and test(missing) is not None
    codes = np.asarray(codes, np.int64)
    return flags[np.where(codes < 0, len(values), codes)] if codes.size else np.zeros(0, dtype=bool)


def isin(values: pd.Series, wanted: Iterable[str]) -> np.ndarray:
    """``values.isin(wanted).to_numpy(dtype=bool)`` for a string column (missing: False), from
    its ``codes``: each distinct value tested once."""
    c, u = codes(values)
    return codes_in(u, c, wanted)


def codes_in(uniques: np.ndarray, codes: np.ndarray, wanted: str | Iterable[str],
             missing: str | None = None) -> np.ndarray:
    """Per row, whether its value (``codes`` into the distinct Python strings ``uniques``, -1 where
    missing) is one of ``wanted``: a set look-up per distinct value, where a pandas ``isin`` or
    ``==`` of them costs ~0.2 ms of fixed work a call. A missing value is tested as ``missing``
    (None: False)."""
    wanted = {wanted} if isinstance(wanted, str) else set(wanted)
    hit = np.array([x in wanted for x in uniques.tolist()] + [missing is not None and missing in wanted], dtype=bool)
    codes = np.asarray(codes, np.int64)
    return hit[np.where(codes < 0, len(uniques), codes)] if codes.size else np.zeros(0, dtype=bool)


def contains(names: pd.Series, pattern: str | re.Pattern[str], as_string: bool = True) -> np.ndarray:
    """``names[.astype("string")].str.contains(pattern, na=False)`` as a bool array, computed on the
    distinct values (``regex_flags``: Python's ``re``, as pandas uses for these patterns)."""
    return contains_each(names, [pattern], as_string)[0]


def contains_each(names: pd.Series, patterns: list[str | re.Pattern[str]], as_string: bool = True) -> list[np.ndarray]:
    """``contains`` for several patterns over one column (factorized once)."""
    if len(names) == 0:
        return [np.zeros(0, dtype=bool) for _ in patterns]
    codes, uniques = pd.factorize(names, use_na_sentinel=True)
    values = [str(u) for u in uniques] if as_string else list(uniques)
    if not all(type(v) is str for v in values):  # objects that are not strings: pandas decides (NaN, so False)
        distinct = pd.Series(uniques)
        return [_spread(codes, distinct.str.contains(p, na=False).to_numpy(dtype=bool)) for p in patterns]
    return [regex_flags(values, codes, _compiled(p), "search", missing=None) for p in patterns]


def contains_each_at(values: pd.Series, rows: np.ndarray, patterns: list[str | re.Pattern[str]]) -> list[np.ndarray]:
    """``contains_each(values.iloc[rows], patterns)`` from the whole column's ``codes`` (kept while
    the column lives): the rows' strings are neither taken nor factorized again (a rank's host
    span names, ~2 ms a call, twice a rank)."""
    c, u = codes(values)
    at = c[np.asarray(rows, np.int64)]
    return [regex_flags(u, at, _compiled(p), "search", missing=None) for p in patterns]


def _compiled(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    """The pattern as ``str.contains`` compiles it (no flags)."""
    return pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)


def _spread(codes: np.ndarray, hit: np.ndarray) -> np.ndarray:
    out = np.zeros(len(codes), dtype=bool)
    valid = codes >= 0
    if hit.size:
        out[valid] = hit[codes[valid]]
    return out


def str_objects(values: pd.Series) -> np.ndarray:
    """``values.astype(str).to_numpy()`` (an object array of Python strings) with one string object
    per distinct value, shared by its rows."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    if (codes < 0).any():  # nulls: let pandas spell them as astype(str) does
        return values.astype(str).to_numpy()
    distinct = pd.Series(uniques).astype(str).to_numpy(dtype=object)
    return distinct[codes] if len(distinct) else np.empty(0, dtype=object)


# what pandas makes of an object array of Python strings put in a frame (pandas 3: ``str``, Arrow-backed)
STR_DTYPE = pd.Series(np.array(["x"], dtype=object)).dtype


def strings_at(uniques: np.ndarray, codes: np.ndarray):
    """``uniques[codes]`` (code -1: missing, None) as a frame column would hold that object array:
    pandas 3 infers its ``str`` dtype row by row (a Python type test and a copy per row); here
    Arrow takes the distinct strings by code, to the same dtype and values. Falls back to the
    object array itself (inferred by the caller's frame as before) where inference would give
    something else: no strings at all, or pandas without the Arrow ``str`` dtype."""
    codes = np.asarray(codes, np.int64)
    missing = codes < 0
    objects = np.asarray(uniques, dtype=object)
    fast = (isinstance(STR_DTYPE, pd.StringDtype) and STR_DTYPE.storage == "pyarrow" and codes.size
            and not missing.all() and all(type(u) is str for u in objects))
    if not fast:
        return np.where(missing, None, objects[np.maximum(codes, 0)]) if objects.size else \
            np.full(codes.size, None, dtype=object)
    import pyarrow as pa

    taken = pa.array(list(objects), pa.large_string()).take(pa.array(codes, mask=missing))
    return pd.array(taken, dtype=STR_DTYPE)


def coded(uniques: np.ndarray, codes: np.ndarray):
    """``strings_at``'s values kept as codes (a Categorical of the distinct strings ``uniques``),
    for a table that goes to the store as they are (``store.frame_to_table``'s ``strings``
    columns): no string per row is made or written, and ``strings_from_codes`` gives the reader
    the same column with its ``codes`` known. ``strings_at`` itself where ``uniques`` are not
    distinct strings (the store then keeps the column as it is)."""
    names = np.asarray(uniques, dtype=object)
    if not _distinct_strings(names):
        return strings_at(names, codes)
    return pd.Categorical.from_codes(np.asarray(codes, np.int64), categories=pd.Index(names, dtype=object))


def from_coded(values: pd.Series):
    """The text column a ``coded`` Categorical stands for (``strings_from_codes``: its codes known)."""
    return strings_from_codes(np.asarray(values.cat.categories, dtype=object), values.cat.codes.to_numpy(np.int64))


def _distinct_strings(names: np.ndarray) -> bool:
    """Every name a Python string, none twice: codes into them compare as the strings do."""
    values = names.tolist()
    return all(type(u) is str for u in values) and len(set(values)) == len(values)


def strings_from_codes(uniques: np.ndarray, codes: np.ndarray):
    """``strings_at(uniques, codes)`` (distinct ``uniques``), with the column's ``codes`` known from
    these codes: renumbered in order of first appearance (an integer factorize), so a reader's
    factorize of the column costs nothing."""
    codes = np.asarray(codes, np.int64)
    column = strings_at(uniques, codes)
    data = _arrow_data(pd.Series(column, copy=False))
    if data is None or not _distinct_strings(np.asarray(uniques, dtype=object)):
        return column  # not distinct: two codes of one string are one code of the column (left to ``codes``)
    first_codes, order = first_appearance(codes, len(uniques))
    names = np.array([str(x) for x in np.asarray(uniques, dtype=object)], dtype=object)[order]
    _remember(data, first_codes, names)
    return column


def first_appearance(codes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(codes)`` of codes below ``n`` (-1: missing, kept -1): the codes renumbered in
    order of first appearance, and the old code of each new one (int64). Each code's first row is
    found in a table of ``n``, not by hashing every row (a 173k-row column of ~100 names: 0.36 ms
    against 0.76)."""
    codes = np.asarray(codes, np.int64)
    if not codes.size:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    valid = codes >= 0
    rows = np.arange(codes.size, dtype=np.int64)
    first = np.full(max(n, 1), codes.size, np.int64)
    np.minimum.at(first, codes[valid] if not valid.all() else codes, rows[valid] if not valid.all() else rows)
    present = np.flatnonzero(first < codes.size)
    order = present[np.argsort(first[present], kind="stable")]
    renumber = np.full(max(n, 1) + 1, -1, np.int64)  # the last: a missing code stays -1
    renumber[order] = np.arange(order.size, dtype=np.int64)
    return renumber[codes], order


def _remember(data, c: np.ndarray, u: np.ndarray) -> None:
    """``codes``' memo entry of the Arrow data ``data``: (codes, distinct values), read-only."""
    c.flags.writeable = False
    u.flags.writeable = False
    key = id(data)
    _CODES[key] = (weakref.ref(data, lambda _, k=key: _CODES.pop(k, None)), c, u)


def group_keys(uniques: pd.Index, codes: np.ndarray):
    """A groupby's key column rebuilt from factorized ``uniques`` and codes: the names' own dtype,
    object names typed as pandas types a column of Python strings (``strings_at``), as groupby's
    ``reset_index`` gives them."""
    return strings_at(uniques, codes) if uniques.dtype == object else uniques.take(codes)
