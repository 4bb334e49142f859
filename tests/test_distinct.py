"""``distinct.codes`` and ``distinct.isin``: pandas' own answers, memoized per Arrow column and
never by value (a column with other data, even at the same address later, is factorized anew)."""
from __future__ import annotations

import gc
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profkit import distinct

values = st.lists(st.one_of(st.none(), st.sampled_from(["kernel", "cpu_op", "runtime", "", "ünïcode", "a b"])),
                  max_size=40)


def _arrow(items: list) -> pd.Series:
    return pd.Series(pd.array(items, dtype=pd.ArrowDtype(pa.string())))


@settings(max_examples=200, deadline=None)
@given(values, st.sets(st.sampled_from(["kernel", "runtime", "", "missing"])))
def test_codes_and_isin_are_pandas_answers(items, wanted):
    s = _arrow(items)
    codes, uniques = distinct.codes(s)
    want_codes, want_uniques = pd.factorize(s, use_na_sentinel=True)
    np.testing.assert_array_equal(codes, want_codes)
    assert list(uniques) == [str(u) for u in want_uniques] and codes.dtype == np.int64
    np.testing.assert_array_equal(distinct.isin(s, wanted), s.isin(list(wanted)).to_numpy(dtype=bool))
    # the pandas "str" dtype (Arrow-backed) and an object column give the same answers
    for other in (s.astype("str") if not s.isna().any() else s, pd.Series(items, dtype=object)):
        np.testing.assert_array_equal(distinct.isin(other, wanted), s.isin(list(wanted)).to_numpy(dtype=bool))


def test_memo_follows_the_data_not_the_values():
    frame = pd.DataFrame({"kind": _arrow(["kernel", "runtime", "kernel"]), "x": [1, 2, 3]})
    first = distinct.codes(frame["kind"])
    assert distinct.codes(frame.assign(y=0)["kind"])[0] is first[0]  # the same data: shared
    other = pd.DataFrame({"kind": _arrow(["kernel", "runtime", "kernel"])})
    assert distinct.codes(other["kind"])[0] is not first[0]  # equal values, other data: its own
    before = len(distinct._CODES)
    del frame, other, first
    gc.collect()
    assert len(distinct._CODES) <= before - 2  # entries go with their columns: nothing is held
    # a new column (possibly at a freed column's address) never gets another column's codes
    for _ in range(20):
        s = _arrow(["runtime", "kernel"])
        assert distinct.codes(s)[0].tolist() == [0, 1] and list(distinct.codes(s)[1]) == ["runtime", "kernel"]
        del s


# ---- regex_flags: pandas' str.match / str.contains, each string tested once per process ------
names = st.lists(st.one_of(st.none(), st.sampled_from([
    "ncclDevKernel_AllReduce", "NCCL:all_reduce", "c10d::allreduce_", "gloo:all_reduce", "sync_dp_padding",
    "", "ünïcode nccl", "x\nnccl", "nccl\n", "ProfilerStep#12", "ProfilerStep#12\n", "<script>nccl</script>",
    "a" * 300])), max_size=30)
PATTERNS = [re.compile(r"^(?:nccl|rccl)", re.IGNORECASE), re.compile(r"nccl$"), re.compile(r"#(\d+)$"),
            re.compile(r"(?:c10d|gloo)::?\w+"), re.compile(r"\bsync\b|_sync_|dp_padding")]


@pytest.mark.filterwarnings("ignore:This pattern is interpreted as a regular expression")  # pandas, the reference
@settings(max_examples=150, deadline=None)
@given(names, st.sampled_from(PATTERNS), st.sampled_from(["match", "search"]), st.sampled_from(["", None]))
def test_regex_flags_are_pandas_string_answers(items, regex, how, missing):
    s = _arrow(items)
    codes, uniques = distinct.codes(s)
    got = distinct.regex_flags(uniques, codes, regex, how, missing=missing)
    filled = s.astype("string").fillna("") if missing == "" else s.astype("string")
    want = (filled.str.match(regex) if how == "match" else filled.str.contains(regex)).fillna(False)
    np.testing.assert_array_equal(got, want.to_numpy(dtype=bool))
    # the memo answers the second time exactly as the first
    np.testing.assert_array_equal(distinct.regex_flags(uniques, codes, regex, how, missing=missing), got)
    np.testing.assert_array_equal(distinct.contains(s, regex), s.astype("string").str.contains(regex, na=False)
                                  .to_numpy(dtype=bool))


def test_regex_memo_is_per_pattern_and_flags():
    """Two patterns of one text but other flags never share answers (the memo's key is both)."""
    u, c = np.array(["NCCL_x", "nccl_x"], dtype=object), np.array([0, 1, -1])
    loose = distinct.regex_flags(u, c, re.compile("^nccl", re.IGNORECASE))
    strict = distinct.regex_flags(u, c, re.compile("^nccl"))
    assert loose.tolist() == [True, True, False] and strict.tolist() == [False, True, False]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-1, 4), max_size=40), st.booleans())
def test_strings_from_codes_makes_strings_at_with_pandas_codes_known(codes, sort):
    """``strings_from_codes`` is ``strings_at``, and the codes it leaves for ``codes`` /
    ``factorize`` are pandas' factorize of that column (first appearance, or sorted), never hashed
    again: a consumer's factorize of a stored text column costs nothing."""
    names = np.array(["zeta", "alpha", "Beta", "é", "a b"], dtype=object)
    codes = np.array(codes, dtype=np.int64)
    made = pd.Series(distinct.strings_from_codes(names, codes))
    plain = pd.Series(distinct.strings_at(names, codes))
    pd.testing.assert_series_equal(made, plain)
    got_c, got_u = distinct.factorize(made, sort=sort)
    want_c, want_u = pd.factorize(plain, sort=sort, use_na_sentinel=True)
    assert np.array_equal(got_c, want_c)
    pd.testing.assert_index_equal(got_u, want_u)
    if len(codes) and (codes >= 0).any():
        data = distinct._arrow_data(made)
        assert data is not None and id(data) in distinct._CODES  # known before anyone asked


def test_coded_keeps_text_where_its_names_are_not_distinct_strings():
    """``coded`` stands for ``strings_at`` only over distinct strings (a Categorical needs them,
    the store writes them as an Arrow dictionary); other names give ``strings_at``'s column."""
    codes = np.array([0, 1, 1, -1], np.int64)
    cat = distinct.coded(np.array(["a", "b"], dtype=object), codes)
    assert isinstance(cat, pd.Categorical) and list(cat.astype(object)[:3]) == ["a", "b", "b"]
    for names in (np.array(["a", "a"], dtype=object), np.array(["a", None], dtype=object)):
        got = distinct.coded(names, codes)
        assert not isinstance(got, pd.Categorical)
        pd.testing.assert_series_equal(pd.Series(got), pd.Series(distinct.strings_at(names, codes)))


def test_strings_from_codes_of_names_that_repeat_leaves_the_codes_to_pandas():
    """Two codes naming one string are one value of the column: its codes are then pandas' own
    factorize of it (nothing remembered from the given codes)."""
    names = np.array(["a", "b", "a"], dtype=object)
    made = pd.Series(distinct.strings_from_codes(names, np.array([2, 1, 0, 2], np.int64)))
    got_c, got_u = distinct.factorize(made)
    want_c, want_u = pd.factorize(pd.Series(["a", "b", "a", "a"], dtype=made.dtype), use_na_sentinel=True)
    assert np.array_equal(got_c, want_c) and list(got_u) == list(want_u) == ["a", "b"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-1, 6), max_size=60), st.integers(0, 3))
def test_first_appearance_is_pandas_factorize_of_the_codes(codes, extra):
    """``first_appearance``: the codes renumbered as ``pd.factorize`` numbers them (missing, -1,
    left out and kept -1), and each new code's old one."""
    codes = np.asarray(codes, np.int64)
    got, order = distinct.first_appearance(codes, 7 + extra)
    valid = codes >= 0
    want = np.full(codes.size, -1, np.int64)
    taken, uniques = pd.factorize(codes[valid])
    want[valid] = taken
    assert got.tolist() == want.tolist()
    assert order.tolist() == np.asarray(uniques, np.int64).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["cpu_op", "cpu_span", "kernel", "", "NCCL"]), min_size=1, max_size=6, unique=True),
       st.lists(st.integers(-1, 5), max_size=40), st.sampled_from([None, "", "NCCL"]),
       st.sets(st.sampled_from(["cpu_op", "kernel", "", "NCCL", "other"]), max_size=3))
def test_codes_in_is_the_isin_test_of_code_flags(uniques, codes, missing, wanted):
    """``distinct.codes_in`` (a set look-up per distinct value) answers as ``syncpoints.code_flags``
    of the pandas ``isin`` test it replaced, a missing value tested as ``missing``."""
    from profkit.collectives.syncpoints import code_flags

    code_in = distinct.codes_in

    u = np.array(uniques, dtype=object)
    c = np.array([x if x < len(u) else -1 for x in codes], dtype=np.int64)
    want = code_flags(u, c, lambda s: s.isin(list(wanted)), missing=missing)
    assert code_in(u, c, wanted, missing=missing).tolist() == want.tolist()
    if len(wanted) == 1:
        assert code_in(u, c, next(iter(wanted)), missing=missing).tolist() == want.tolist()


@pytest.mark.filterwarnings("ignore:This pattern is interpreted as a regular expression")
@settings(max_examples=150, deadline=None)
@given(names, st.lists(st.integers(0, 29), max_size=30), st.booleans())
def test_contains_each_at_is_contains_each_of_the_rows(items, picks, plain):
    """The whole column's codes read at the rows give what ``contains_each`` of those rows gives
    (Arrow strings, and an object column of strings and None; a missing name matches nothing)."""
    s = _arrow(items) if not plain else pd.Series(items, dtype=object)
    rows = np.array([p for p in picks if p < len(items)], dtype=np.int64)
    patterns = [PATTERNS[0], PATTERNS[2], r"EngineCore\.step|execute_model"]
    got = distinct.contains_each_at(s, rows, patterns)
    want = distinct.contains_each(s.iloc[rows], patterns)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == bool and g.size == rows.size
