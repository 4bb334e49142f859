"""The rank task's coded shortcuts against the row-by-row paths they stand in for, on real
captures (sample_traces: the engine's torch and nsys captures, vLLM's own profiler, HTA's public
sample): GPU timelines from the attribution's arrays, launch-bound runs and blocking copies
from them, and one rank's phase sums in its windows. Exact equality: the shortcuts only skip
string work, so any difference is a bug."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

import profkit
from conftest import SAMPLE_TRACES
from profkit import schema
from profkit.analyze import overhead as ov
from profkit.analyze import overhead_host as host
from profkit.analyze import straggler_phases as ph
from profkit.analyze.gpu import gpu_timelines
from profkit.analyze.straggler_arrivals import trace_windows

CAPTURES = {
    "engine-torch": SAMPLE_TRACES / "engine-dep2-h200" / "torch_straggler",
    "engine-nsys": SAMPLE_TRACES / "engine-dep2-h200" / "nsys_straggler",
    "engine4-torch": SAMPLE_TRACES / "engine-dep4-h200-capture" / "torch_faults",
    "vllm-native": SAMPLE_TRACES / "vllm-0.26-h200" / "native_clean",
    "hta-public": SAMPLE_TRACES / "public-hta-2rank",
}


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def loaded():
    return {k: profkit.load(p).events for k, p in CAPTURES.items()}


def _same_intervals(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for r in a:
        assert np.array_equal(a[r][0], b[r][0]) and np.array_equal(a[r][1], b[r][1])


@pytest.mark.parametrize("name", list(CAPTURES))
def test_gpu_timelines_from_arrays_equal_the_row_path(loaded, name):
    events = loaded[name]
    fast = gpu_timelines(events, ov.event_arrays(events))
    assert len(fast) == events["rank"].nunique()
    assert_frame_equal(fast, gpu_timelines(events), check_exact=True)


@pytest.mark.parametrize("name", list(CAPTURES))
def test_launch_runs_and_blocking_copies_from_arrays_equal_the_row_path(loaded, name):
    events = loaded[name]
    ea, g = ov.event_arrays(events), ph._GpuArrays.build(ph.gpu_rows(events))
    assert ph._correlations_unsigned(events)
    _same_intervals(ph._launch_runs_coded(ea, g), ph._launch_runs(events, g))
    _same_intervals(ph._blocking_copies_coded(ea), ph._blocking_copies(events))


def _row(kind, name, start, end, rank, **extra):
    return {"rank": rank, "source": "t", "kind": kind, "name": name, "start_ns": start, "end_ns": end, **extra}


def test_launch_runs_and_blocking_copies_from_arrays_on_built_runs():
    """The real captures above hold no launch-bound run: here two ranks launch runs of tiny
    kernels (one rank from two threads, with a copy whose GPU row shares the run's
    correlation ids), and block in long copy calls; the answers are not empty and the same."""
    rows = []
    for rank in (0, 1):
        rows.append(_row(schema.CPU_SPAN, "EngineCore.step", 0, 3_000_000, rank, pid=1, tid=1))
        for k, tid in enumerate((1, 2) if rank else (1,)):
            for i in range(host.RUN_MIN_LAUNCHES + 3):
                corr = 1000 * (k + 1) + i
                ls = 100_000 + 1_000_000 * k + i * 15_000
                rows.append(_row(schema.RUNTIME, "cudaLaunchKernel", ls, ls + 5_000, rank, pid=1, tid=tid,
                                 correlation=corr))
                rows.append(_row(schema.KERNEL, "fill", ls + 8_000, ls + 10_000, rank, device=rank, stream=7,
                                 correlation=corr))
        rows.append(_row(schema.RUNTIME, "cudaMemcpyAsync", 2_500_000, 2_600_000, rank, pid=1, tid=1, correlation=9))
        rows.append(_row(schema.MEMCPY, "Memcpy DtoH", 2_550_000, 2_590_000, rank, device=rank, stream=7,
                         correlation=9))
    events = schema.from_records(rows)
    ea, g = ov.event_arrays(events), ph._GpuArrays.build(ph.gpu_rows(events))
    runs, copies = ph._launch_runs_coded(ea, g), ph._blocking_copies_coded(ea)
    assert sorted(runs) == [0, 1] and sorted(copies) == [0, 1]
    assert runs[1][0].size == 2 and copies[0][0].tolist() == [2_500_000]
    _same_intervals(runs, ph._launch_runs(events, g))
    _same_intervals(copies, ph._blocking_copies(events))


@pytest.mark.parametrize("name", list(CAPTURES))
def test_one_rank_window_phases_equal_the_all_ranks_path(loaded, name):
    """The finish task's path (windows of one rank) against the general one (windows of all
    ranks), on each rank's extent cut into 7 windows, the last overlapping the one before."""
    events = loaded[name]
    extents = trace_windows(events)
    host, gpu = ph.timeline_pieces(events, extents)
    rows = []
    for r, lo, hi in zip(extents["rank"], extents["trace_start_ns"], extents["trace_end_ns"]):
        cuts = np.linspace(int(lo), int(hi), 7).astype(np.int64)
        for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            rows.append((100 * i, int(r), int(a), int(b)))
        rows.append((999, int(r), int(cuts[-3]), int(cuts[-1])))
    windows = pd.DataFrame(rows, columns=ph.WINDOW_COLUMNS)
    ranks = windows["rank"].unique()
    for pieces in (host, gpu):
        assert len(pieces)
        per_rank = [ph.window_phases(pieces, windows[windows["rank"] == r]) for r in ranks]
        if len(ranks) > 1:
            general = ph.window_phases(pieces, windows)
        else:  # one rank: the general path with the rows grouped as it groups them
            general = ph._window_phases_grouped(pieces, windows).astype({"ns": "int64"})
        joined = pd.concat(per_rank, ignore_index=True)
        assert len(joined)
        assert_frame_equal(joined, general, check_exact=True)
        # the finish task's coded tables: the text tables' factorized, made without the strings
        from profkit.analyze.stragglers import _coded_table

        late = windows[windows["window"] >= 300]  # from mid-extent on: names first seen in another order
        for w in (windows, late):
            for r in ranks:
                mine = w[w["rank"] == r]
                got, text = ph.window_phases_coded(pieces, mine), ph.window_phases(pieces, mine)
                if got is None:  # nothing inside: the caller codes the (empty) text table
                    assert not len(text)
                    continue
                table, (phases, categories) = got
                want, (want_phases, want_categories) = _coded_table(text)
                assert_frame_equal(table, want, check_exact=True)
                assert phases.tolist() == want_phases.tolist() and categories.tolist() == want_categories.tolist()
        assert ph.window_phases_coded(pieces, windows) is None or len(ranks) == 1  # several ranks: the text path
