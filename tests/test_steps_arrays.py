"""The step table and the step tokens on arrays (issue #16) against the pandas spellings they
replaced: random step spans on several ranks (nested, with and without numbers, with
annotations inside and outside the steps, one rank's sources recording less than the other)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pandas.testing import assert_frame_equal

from profkit import schema
from profkit.analyze import balance as bal
from profkit.analyze.steps import (_NUMBER_RE, _outermost, choose_step_marker, find_step_spans, step_marker_facts,
                                   step_table)


def _outermost_pandas(rank: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The spelling ``steps._outermost`` replaced: a groupby cummax of the ends per rank."""
    order = np.lexsort((-end, start, rank))
    rank, end = rank[order], end[order]
    same = np.r_[False, rank[1:] == rank[:-1]]
    run_end = pd.Series(end).groupby(np.cumsum(~same)).cummax().to_numpy()
    inner = same & (end <= np.r_[0, run_end[:-1]])
    return order[~inner]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-50, 50), st.integers(0, 40)), min_size=1, max_size=40))
def test_outermost_matches_the_groupby_cummax(spans):
    rank = np.array([s[0] for s in spans], dtype=np.int64)
    start = np.array([s[1] for s in spans], dtype=np.int64)
    end = start + np.array([s[2] for s in spans], dtype=np.int64)
    assert _outermost(rank, start, end).tolist() == _outermost_pandas(rank, start, end).tolist()


def _step_tokens_pandas(steps: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """The spelling ``balance.step_tokens`` replaced: a frame per rank, filled and sorted by pandas."""
    cols = ["rank", "step", "num_tokens", "batch_size"]
    if not len(steps):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
    base = steps[["rank", "step", "start_ns", "end_ns"]].astype("int64").copy()
    for c in ("num_tokens", "batch_size"):
        base[c] = pd.array(steps[c], dtype="Int64")
    if base["num_tokens"].notna().all():
        return base[cols]
    hit = events["kind"].isin([schema.CPU_SPAN, schema.CPU_OP]) & events["name"].str.match(bal.VLLM_STEP_RE.pattern)
    ann = events.loc[hit.fillna(False).to_numpy(bool), ["rank", "start_ns", "name"]]
    if not len(ann):
        return base[cols]
    from profkit.analyze.steps import step_batch_facts

    facts = step_batch_facts(ann["name"])
    ann = pd.DataFrame({"rank": ann["rank"].to_numpy(np.int64), "start_ns": ann["start_ns"].to_numpy(np.int64),
                        "tokens": facts["num_tokens"].to_numpy(dtype="float64", na_value=np.nan),
                        "batch": facts["batch_size"].to_numpy(dtype="float64", na_value=np.nan)})
    filled = []
    for rank, b in base.groupby("rank", sort=False):
        a = ann[ann["rank"].to_numpy() == rank].sort_values("start_ns", kind="stable")
        b = b.sort_values("start_ns")
        a_start = a["start_ns"].to_numpy(np.int64)
        j = np.searchsorted(b["start_ns"].to_numpy(np.int64), a_start, side="right") - 1
        inside = (j >= 0) & (a_start < b["end_ns"].to_numpy(np.int64)[np.maximum(j, 0)])
        for col, src in (("num_tokens", "tokens"), ("batch_size", "batch")):
            v = a[src].to_numpy(np.float64)
            ok = inside & ~np.isnan(v)
            sums = pd.Series(v[ok]).groupby(j[ok]).sum()
            summed = pd.Series(pd.NA, index=range(len(b)), dtype="Int64")
            summed[sums.index] = np.rint(sums.to_numpy()).astype(np.int64)
            b = b.assign(**{col: b[col].fillna(pd.Series(summed.to_numpy(), index=b.index))})
        filled.append(b)
    out = pd.concat(filled, ignore_index=True).sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
    return out[cols]


def _span(rank, name, start, end, source="t"):
    return {"rank": rank, "source": source, "kind": schema.CPU_SPAN, "name": name, "start_ns": start,
            "end_ns": end, "pid": 1, "tid": 1}


def _kernel(rank, start, end, source="t"):
    return {"rank": rank, "source": source, "kind": schema.KERNEL, "name": "gemm", "start_ns": start,
            "end_ns": end, "device": 0, "stream": 7}


PATTERN = "^my_step"
_step = st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(1, 12),
                  st.sampled_from(["plain", "numbered", "nested"]))
_note = st.tuples(st.integers(0, 2), st.integers(-5, 400), st.integers(0, 300), st.integers(0, 9))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_step, min_size=1, max_size=12, unique_by=lambda s: (s[0], s[1])),
       notes=st.lists(_note, max_size=15), two_sources=st.booleans(), numbered_marker=st.booleans())
def test_step_table_and_tokens_on_random_ranks(steps, notes, two_sources, numbered_marker):
    rows = []
    for rank, slot, length, how in steps:
        start = slot * 15
        # a user marker (first in priority, before the annotations) numbered backwards, else the loop's span
        name = f"my_step#{130 - slot}" if numbered_marker or how == "numbered" else "EngineCore.step"
        if numbered_marker and how == "plain":
            name = "my_step"  # without a number: the rank's steps are counted in order
        rows.append(_span(rank, name, start, start + length))
        if how == "nested":
            rows.append(_span(rank, name, start + 1, start + max(length - 1, 1)))
        rows.append(_kernel(rank, start, start + length // 2))
    for rank, start, tokens, batch in notes:
        rows.append(_span(rank, f"execute_context_0(0)_generation_{batch}({tokens})", start, start + 3))
    if two_sources:  # rank 0's second source records from 60 on: its earlier steps are left out
        rows.append(_kernel(0, 60, 10_000, source="nsys"))
    ev = schema.from_records(rows)
    table = step_table(ev, PATTERN)
    # the table of every rank at once is each rank's table (the marker chosen over all), one after the other
    ranks = [ev[ev["rank"] == r].reset_index(drop=True) for r in sorted(ev["rank"].unique())]
    chosen = choose_step_marker([step_marker_facts(r, PATTERN) for r in ranks], PATTERN)
    per_rank = [step_table(r, PATTERN, chosen) for r in ranks]
    per_rank = pd.concat([t for t in per_rank if len(t)] or [table.iloc[:0]], ignore_index=True)
    assert_frame_equal(table, per_rank, check_dtype=False)
    spans = find_step_spans(ev, PATTERN)
    if len(spans):  # numbers where every outermost span has one, else the order on its rank
        numbered = spans["name"].map(lambda n: _NUMBER_RE.search(n) is not None).all()
        want = (spans["name"].str.extract(_NUMBER_RE, expand=False).astype("int64") if numbered
                else spans.groupby("rank").cumcount())
        assert spans["step"].tolist() == want.tolist()
    if two_sources and len(table):
        assert (table.loc[table["rank"] == 0, "start_ns"] >= 60).all()
    got = bal.step_tokens(table, ev)
    assert_frame_equal(got.reset_index(drop=True), _step_tokens_pandas(table, ev).reset_index(drop=True))


def test_step_tokens_keeps_the_step_tables_own_counts():
    ev = schema.from_records([_span(0, "execute_context_0(0)_generation_4(4)", 0, 10),
                              _span(0, "execute_context_2(30)_generation_1(1)", 10, 20)])
    table = step_table(ev)
    got = bal.step_tokens(table, ev)
    assert got["num_tokens"].tolist() == [4, 31] and got.attrs == table.attrs
    assert list(got.columns) == ["rank", "step", "num_tokens", "batch_size"]


def test_step_numbers_too_large_for_int64_count_in_order():
    """A hostile ``#<n>`` past int64 is not a step number: the steps are counted in order."""
    ev = schema.from_records([_span(0, "ProfilerStep#99999999999999999999999", 0, 10),
                              _span(0, "ProfilerStep#3", 10, 20)])
    assert step_table(ev)["step"].tolist() == [0, 1]


def test_numbered_marker_with_an_unnumbered_span_names_it():
    ev = schema.from_records([_span(0, "my_step", 0, 10), _span(0, "my_step#4", 10, 20)])
    assert find_step_spans(ev, step_pattern="^my_step")["step"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="my_step"):  # the other ranks' names were all numbered
        find_step_spans(ev, step_pattern="^my_step", chosen=("user", True))


def test_a_rank_whose_every_step_is_left_out_says_so():
    """Steps a second source of the rank did not record whole are left out; where that is every
    step, the empty table still counts them (``attrs["dropped_steps"]``: the run's warning)."""
    rows = [_span(0, "EngineCore.step", 15 * i, 15 * i + 10) for i in range(4)]
    rows += [_kernel(0, 15 * i, 15 * i + 5) for i in range(4)]
    rows.append(_kernel(0, 100, 200, source="nsys"))  # the second source records from 100 on
    table = step_table(schema.from_records(rows))
    assert not len(table) and table.attrs["dropped_steps"] == {0: 4}
    some = schema.from_records(rows[:-1] + [_kernel(0, 30, 200, source="nsys")])
    assert step_table(some).attrs["dropped_steps"] == {0: 2}


def test_the_run_warns_of_a_rank_whose_every_step_is_left_out(tmp_path, monkeypatch):
    """The real two-source capture (profkit span file + Nsight) with rank 1's Nsight rows kept only
    for 0.1 ms, shorter than any step: every rank-1 step is left out, and the warning says how many."""
    import profkit
    from conftest import SAMPLE_TRACES
    from profkit.analyze.pipeline import analyze
    from profkit.ingest.loader import Capture

    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path))
    cap = profkit.load(SAMPLE_TRACES / "engine-dep2-h200-capture" / "nsys_clean")
    ev = cap.events
    nsys1 = ((ev["rank"] == 1) & (ev["source"] == "nsys")).to_numpy(bool)
    start = ev["start_ns"].to_numpy("int64")
    first = int(start[nsys1].min())
    keep = ~nsys1 | (ev["end_ns"].to_numpy("int64") <= first + 100_000)
    cut = ev[keep].reset_index(drop=True)
    n1 = len(find_step_spans(cut[(cut["rank"] == 1).to_numpy(bool)].reset_index(drop=True)))
    a = analyze(Capture(events=cut, parts=cap.parts, meta=cap.meta, skipped=cap.skipped, warnings=cap.warnings))
    assert not (a.steps["rank"] == 1).any() and (a.steps["rank"] == 0).any()
    assert any(w.startswith(f"rank 1: {n1} step(s) left out") for w in a.warnings), a.warnings
