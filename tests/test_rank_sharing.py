"""Work shared between the analyses of one rank gives exactly what each computed alone (issue #16).

The scale path's rank task attributes a rank's idle time twice (``causes.csv``: GPU-idle time in
the steps; the straggler timeline pieces: all host time over the traced extent, GPU left out).
Both now read one ``overhead.event_arrays`` of the events (names factorized and classified once,
the host layers built once per rank) and one take of the GPU rows; the prepare task builds one
sync-point thread context for the candidates and the span facts. Each shortcut is compared here
with the path it replaces on real H200 engine captures (``sample_traces/engine-dep2-h200``) and the
public HTA pair: equal frames, exactly (no tolerance: the same integers and strings).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import profkit
from conftest import SAMPLE_TRACES
from profkit import schema
from profkit.analyze import impact_program as prog
from profkit.analyze import overhead as ov
from profkit.analyze import straggler_phases as ph
from profkit.analyze.steps import step_table
from profkit.analyze.straggler_arrivals import trace_windows
from profkit.analyze.sync_table import wait_intervals
from profkit.collectives import syncpoints
from profkit.collectives.candidates import collective_candidates

ENGINE = SAMPLE_TRACES / "engine-dep2-h200"
CAPTURES = [ENGINE / "torch_straggler", ENGINE / "nsys_straggler", SAMPLE_TRACES / "public-hta-2rank"]


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module", params=CAPTURES, ids=lambda p: p.name)
def rank_events(request) -> list[pd.DataFrame]:
    events = profkit.load(request.param).events
    return [ev.reset_index(drop=True) for _, ev in events.groupby("rank", sort=True, observed=True)]


def test_shared_arrays_give_the_causes_and_host_attribution_of_separate_builds(rank_events):
    for ev in rank_events:
        steps = step_table(ev)
        waits = wait_intervals(collective_candidates(ev))
        windows = ov.analysis_windows(ev, steps)
        arrays = ov.event_arrays(ev)
        alone = ov.attribute_gaps(ev, windows, waits)
        pd.testing.assert_frame_equal(ov.attribute_gaps(ev, windows, waits, arrays=arrays), alone)
        # the host attribution over the whole extent: before, the host rows were taken and attributed
        tiled = ph._tiled_windows(trace_windows(ev), steps)
        host_rows = ev[~ev["kind"].isin(schema.GPU_KINDS).to_numpy(bool)]
        host_alone = ov.attribute_gaps(host_rows, tiled, waits)
        host_shared = ov.attribute_gaps(ev, tiled, waits, arrays=arrays, with_gpu=False)
        pd.testing.assert_frame_equal(host_shared, host_alone)
        assert len(alone) and len(host_alone) > len(alone) // 10  # both attributions charge something
        # the same arrays again, in the other order (the memo of the host layers is per rank)
        pd.testing.assert_frame_equal(ov.attribute_gaps(ev, windows, waits, arrays=arrays), alone)


def test_without_steps_the_host_attribution_has_no_windows(rank_events):
    ev = rank_events[0]
    host_rows = ev[~ev["kind"].isin(schema.GPU_KINDS).to_numpy(bool)]
    want = ov.attribute_gaps(host_rows, None)
    got = ov.attribute_gaps(ev, None, arrays=ov.event_arrays(ev), with_gpu=False)
    assert len(want) == len(got) == 0
    assert list(got.columns) == list(want.columns)


def test_timeline_pieces_and_gpu_ops_from_shared_rows_equal_their_own(rank_events):
    for ev in rank_events:
        steps = step_table(ev)
        waits = wait_intervals(collective_candidates(ev))
        extents = trace_windows(ev)
        gpu = ph.gpu_rows(ev)
        host_a, gpu_a = ph.timeline_pieces(ev, extents, waits, steps)
        host_b, gpu_b = ph.timeline_pieces(ev, extents, waits, steps, arrays=ov.event_arrays(ev), gpu=gpu)
        pd.testing.assert_frame_equal(host_b, host_a)
        pd.testing.assert_frame_equal(gpu_b, gpu_a)
        pd.testing.assert_frame_equal(prog.gpu_ops(ev, gpu), prog.gpu_ops(ev))
        assert len(host_a) and len(gpu_a)


def test_one_thread_context_serves_the_candidates_and_the_span_facts(rank_events, monkeypatch):
    built = []
    real = syncpoints._ThreadContext

    class Counting(real):
        def __init__(self, events):
            built.append(events)
            super().__init__(events)

    for ev in rank_events:
        want_c, want_f = collective_candidates(ev), syncpoints.span_facts(ev)
        monkeypatch.setattr(syncpoints, "_ThreadContext", Counting)
        built.clear()
        with syncpoints.shared_context(ev):
            got_c, got_f = collective_candidates(ev), syncpoints.span_facts(ev)
            other = ev.copy()  # another frame inside the block gets its own context
            syncpoints.span_facts(other)
        monkeypatch.setattr(syncpoints, "_ThreadContext", real)
        pd.testing.assert_frame_equal(got_c, want_c)
        for a, b in zip(got_f, want_f):
            pd.testing.assert_frame_equal(a, b)
        assert [id(e) for e in built] in ([id(ev), id(other)], [id(other)])  # at most once for ev


def test_strings_at_builds_the_column_pandas_infers():
    from profkit.distinct import strings_at

    names = np.array(["wait:all_reduce", "gc", "Scheduler.schedule"], dtype=object)
    for codes in ([0, 2, 1, 1, -1], [-1, -1], [], [2]):
        codes = np.asarray(codes, np.int64)
        want = pd.DataFrame({"c": np.where(codes >= 0, names[np.maximum(codes, 0)], None)})
        pd.testing.assert_frame_equal(pd.DataFrame({"c": strings_at(names, codes)}), want)


def test_coded_pieces_and_charged_rows_are_the_text_ones(rank_events):
    """The rank task asks for its pieces and charged rows coded (``coded=True``: Categoricals the
    store writes as codes and names); they must stand for the very text columns the plain calls
    make, one rank at a time and, for the pieces, several ranks at once (joined as text)."""
    from profkit import distinct

    def as_text(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(**{c: distinct.from_coded(frame[c]) for c in frame.columns
                               if isinstance(frame[c].dtype, pd.CategoricalDtype)})

    every = pd.concat(rank_events, ignore_index=True)
    for ev in rank_events + [every]:
        steps = step_table(ev)
        waits = wait_intervals(collective_candidates(ev))
        extents = trace_windows(ev)
        plain = ph.timeline_pieces(ev, extents, waits, steps)
        coded = ph.timeline_pieces(ev, extents, waits, steps, coded=True)
        for got, want in zip(coded, plain):
            pd.testing.assert_frame_equal(as_text(got), want)
        if ev is not every:
            windows = ov.analysis_windows(ev, steps)
            charged = ov.attribute_gaps(ev, windows, waits, coded=True)
            assert isinstance(charged["cause"].dtype, pd.CategoricalDtype)
            pd.testing.assert_frame_equal(as_text(charged), ov.attribute_gaps(ev, windows, waits))


def test_wait_labels_name_each_distinct_collective_once_and_missing_ones_row_by_row():
    """``sync_table._wait_labels`` (the labels of ``wait_intervals``) are ``wait:`` + ``cause_name``
    of every row's name, a missing name spelled as ``cause_name`` spells it (None and NaN apart)."""
    from profkit.analyze.overhead_names import cause_name
    from profkit.analyze.sync_table import _wait_labels

    names = pd.Series(["nccl:all_reduce", None, "gloo  ", "nccl:all_reduce", np.nan, "gloo  "], dtype=object)
    want = ["wait:" + cause_name(n) for n in names]
    assert _wait_labels(names).tolist() == want and "wait:None" in want and "wait:nan" in want
    assert _wait_labels(names.astype("string[pyarrow]").iloc[[0, 2]]).tolist() == [want[0], want[2]]
    assert _wait_labels(names.iloc[:0]).tolist() == []


def test_attribution_of_each_rank_alone_is_its_part_of_every_ranks(rank_events):
    """``overhead._rank_groups``: a one-rank table is its own group (no groupby copy), and windows
    in order are not sorted again; the causes of each rank alone are its rows of all ranks' at
    once, windows given in reverse order included."""
    both = pd.concat(rank_events, ignore_index=True)
    steps = step_table(both)
    waits = wait_intervals(collective_candidates(both))
    windows = ov.analysis_windows(both, steps)
    whole = ov.attribute_gaps(both, windows, waits)
    backwards = ov.attribute_gaps(both, windows.iloc[::-1], waits)
    pd.testing.assert_frame_equal(backwards, whole)
    for ev in rank_events:
        r = int(ev["rank"].iloc[0])
        alone = ov.attribute_gaps(ev, windows[windows["rank"] == r], waits[waits["rank"] == r])
        pd.testing.assert_frame_equal(alone, whole[whole["rank"] == r].reset_index(drop=True))
    one = windows[windows["rank"] == r]
    assert ov._rank_groups(one)[0] == (r, one) and ov._rank_groups(one)[0][1] is one  # no copy
    assert ov._increasing(np.array([1, 2])) and not ov._increasing(np.array([1, 1]))
