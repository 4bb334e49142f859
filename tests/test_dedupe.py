"""drop_duplicate_spans: one copy of each host span seen by several sources of one rank.

Real captures (``profkit capture --nsys`` / ``--torch`` of the bundled engine hold each span up to
three times per rank) and hand-built cases (what must collapse, what must stay).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import profkit
from profkit import schema
from profkit.align import apply_alignment, drop_duplicate_spans, estimate
from tests.conftest import SAMPLE_TRACES

CAPTURES = SAMPLE_TRACES / "engine-dep2-h200-capture"
SINGLE_SOURCE = SAMPLE_TRACES / "engine-dep2-h200" / "torch_straggler"
HOST = (schema.CPU_SPAN, schema.GC)
US = 1_000
MS = 1_000_000


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))


def aligned(path) -> pd.DataFrame:
    events = profkit.load(path).events
    return apply_alignment(events, estimate(events))


def leaf(names: pd.Series) -> np.ndarray:
    return names.astype(str).str.rsplit(".", n=1).str[-1].to_numpy()


# ---- real captures ----------------------------------------------------------------------------
@pytest.mark.parametrize("capture", ["nsys_clean", "nsys_straggler", "torch_clean"])
def test_real_capture_one_step_and_one_dp_sync_per_engine_step(capture):
    folder = CAPTURES / capture
    events = aligned(folder)
    before = events.copy()
    out, dropped = drop_duplicate_spans(events)
    pd.testing.assert_frame_equal(events, before)  # pure
    other = "kineto" if capture.startswith("torch") else "nsys"
    assert dropped and {s for _, s in dropped} == {other}
    assert len(events) - len(out) == sum(dropped.values())
    # nothing but host spans is ever dropped
    not_host = ~events["kind"].isin(HOST)
    assert events[not_host]["kind"].value_counts().equals(out[~out["kind"].isin(HOST)]["kind"].value_counts())
    for rank in (0, 1):
        n_engine_steps = sum(1 for _ in open(folder / "engine" / f"rank{rank}.steps.jsonl"))
        mine = out[(out["rank"] == rank) & out["kind"].isin(HOST)]
        steps = mine[mine["name"] == "EngineCore.step"].sort_values("start_ns")
        # one EngineCore.step per engine step, the span file's (it has the whole run)
        assert len(steps) == n_engine_steps == 32
        assert (steps["source"] == "profkit").all()
        assert (steps["start_ns"].to_numpy()[1:] >= steps["end_ns"].to_numpy()[:-1]).all()
        # one DP sync span per step, the profiler window's steps included
        sync = mine[leaf(mine["name"]) == "sync_dp_padding"]
        assert len(sync) == n_engine_steps
        at = np.searchsorted(steps["start_ns"].to_numpy(), sync["start_ns"].to_numpy(), side="right") - 1
        assert sorted(at.tolist()) == list(range(n_engine_steps))
        # the window's other copies are gone, the engine's own phases without a twin stay
        window = events[(events["rank"] == rank) & (events["source"] == other)]
        lo, hi = window["start_ns"].min(), window["end_ns"].max()
        in_window = steps[(steps["end_ns"] > lo) & (steps["start_ns"] < hi)]
        assert len(in_window) >= 20
        names = set(mine.loc[mine["source"] == other, "name"].astype(str))
        assert {"attn", "router", "experts", "moe_dispatch", "moe_combine"} <= names
        assert not names & {"EngineCore.step", "sync_dp_padding", "execute_model", "Scheduler.schedule"}


def test_single_source_capture_is_unchanged():
    events = aligned(SINGLE_SOURCE)
    out, dropped = drop_duplicate_spans(events)
    assert dropped == {}
    assert len(out) == len(events)


# ---- hand-built events ------------------------------------------------------------------------
def frame(rows: list[dict]) -> pd.DataFrame:
    cols: dict[str, list] = {c: [r.get(c) for r in rows] for c in schema.COLUMNS}
    df = schema.to_frame(schema.to_table(cols))
    schema.validate(df)
    return df


def ev(name, start, end, source="profkit", category="step", kind=schema.CPU_SPAN, rank=0, **extra):
    return {"rank": rank, "source": source, "kind": kind, "name": name, "category": category,
            "start_ns": start, "end_ns": end, "pid": 1, "tid": 1, **extra}


def kept(out: pd.DataFrame) -> list[tuple[str, str, str]]:
    return sorted(zip(out["source"].astype(str), out["category"].astype(str), out["name"].astype(str)))


def test_near_identical_copies_in_three_streams_collapse_to_the_span_file():
    rows = [
        ev("GPUModelRunner.sync_dp_padding", 10 * MS, 11 * MS, category="dp_sync"),
        ev("GPUModelRunner.sync_dp_padding", 10 * MS + 1 * US, 11 * MS - 1 * US, source="nsys", category="profkit"),
        ev("sync_dp_padding", 10 * MS - 90 * US, 11 * MS + 80 * US, source="nsys", category="nvtx"),
        ev("sync_dp_padding", 10 * MS + 30 * US, 11 * MS - 70 * US, source="kineto", category="user_annotation"),
    ]
    out, dropped = drop_duplicate_spans(frame(rows))
    assert kept(out) == [("profkit", "dp_sync", "GPUModelRunner.sync_dp_padding")]
    assert dropped == {(0, "nsys"): 2, (0, "kineto"): 1}


def test_without_the_span_file_the_profkit_domain_copy_is_kept():
    rows = [
        ev("sync_dp_padding", 10 * MS - 20 * US, 11 * MS + 20 * US, source="nsys", category="nvtx"),
        ev("GPUModelRunner.sync_dp_padding", 10 * MS, 11 * MS, source="nsys", category="profkit"),
    ]
    out, dropped = drop_duplicate_spans(frame(rows))
    assert kept(out) == [("nsys", "profkit", "GPUModelRunner.sync_dp_padding")]
    assert dropped == {(0, "nsys"): 1}


def test_recursive_call_with_clearly_different_times_is_kept():
    rows = [
        ev("Model.forward", 0, 10 * MS),  # outer call
        ev("Model.forward", 3 * MS, 6 * MS),  # inner call, same source
        ev("forward", 3 * MS + 5 * US, 6 * MS - 5 * US, source="kineto", category="user_annotation"),  # its twin
        ev("forward", 2 * MS, 4 * MS, source="nsys", category="nvtx"),  # a third call only nsys saw
    ]
    out, dropped = drop_duplicate_spans(frame(rows))
    assert dropped == {(0, "kineto"): 1}
    assert kept(out) == [("nsys", "nvtx", "forward"), ("profkit", "step", "Model.forward"),
                         ("profkit", "step", "Model.forward")]


def test_different_names_ranks_and_kinds_are_kept():
    rows = [
        ev("Worker.execute_model", 0, 5 * MS, category="worker"),
        ev("GPUModelRunner.execute_model", 0, 5 * MS, source="nsys", category="profkit"),  # not a suffix
        ev("prepare_inputs", 0, 5 * MS, source="nsys", category="nvtx"),
        ev("Worker.execute_model", 0, 5 * MS, source="nsys", category="profkit", rank=1),  # another rank
        ev("gemm", 1 * MS, 2 * MS, source="kineto", category="kernel", kind=schema.KERNEL, device=0, stream=7),
        ev("gemm", 1 * MS, 2 * MS, source="nsys", category="kernel", kind=schema.KERNEL, device=0, stream=7),
        ev("cudaLaunchKernel", 1 * MS, 1 * MS + 5 * US, source="kineto", category="cuda_runtime", kind=schema.RUNTIME),
        ev("cudaLaunchKernel", 1 * MS, 1 * MS + 5 * US, source="nsys", category="cuda_api", kind=schema.RUNTIME),
        ev("aten::mm", 1 * MS, 2 * MS, source="kineto", category="cpu_op", kind=schema.CPU_OP),
        ev("aten::mm", 1 * MS, 2 * MS, source="nsys", category="cpu_op_x", kind=schema.CPU_OP),
    ]
    events = frame(rows)
    out, dropped = drop_duplicate_spans(events)
    assert dropped == {}
    assert len(out) == len(events)


def test_span_file_spans_are_never_deduplicated_among_themselves():
    rows = [ev("gc.gen0", 0, 50 * US, category="gc", kind=schema.GC),
            ev("gc.gen0", 0, 50 * US, category="gc2", kind=schema.GC)]
    assert drop_duplicate_spans(frame(rows))[1] == {}


def test_copy_cut_by_its_sources_window_is_dropped_only_at_the_edge():
    step = [ev("EngineCore.step", 0, 100 * MS), ev("EngineCore.step", 200 * MS, 210 * MS)]
    cut = ev("EngineCore.step", 5 * US, 20 * MS, source="nsys", category="nvtx")  # nsys stopped at 20 ms
    out, dropped = drop_duplicate_spans(frame(step + [ev("attn", 1 * MS, 2 * MS, source="nsys", category="nvtx"), cut]))
    assert dropped == {(0, "nsys"): 1}
    assert "EngineCore.step" not in set(out.loc[out["source"] == "nsys", "name"])
    # the same short span while nsys went on recording: a different activity, kept
    later = ev("attn", 50 * MS, 60 * MS, source="nsys", category="nvtx")
    out, dropped = drop_duplicate_spans(frame(step + [later, cut]))
    assert dropped == {}
    # cut at its source's start: the ends agree
    first = ev("EngineCore.step", 90 * MS, 100 * MS - 10 * US, source="kineto", category="user_annotation")
    tail = ev("attn", 95 * MS, 300 * MS, source="kineto", category="user_annotation")
    out, dropped = drop_duplicate_spans(frame(step + [first, tail]))
    assert dropped == {(0, "kineto"): 1}


def test_tolerance_is_the_larger_of_the_floor_and_the_fraction():
    base = ev("Scheduler.schedule", 0, 1 * MS, category="scheduler")
    near = ev("schedule", 150 * US, 1 * MS, source="nsys", category="nvtx")  # 150 us off: within 200 us
    far = ev("schedule", 300 * US, 1 * MS + 300 * US, source="nsys", category="nvtx")
    assert drop_duplicate_spans(frame([base, near]))[1] == {(0, "nsys"): 1}
    assert drop_duplicate_spans(frame([base, far]))[1] == {}
    long = ev("Scheduler.schedule", 0, 100 * MS, category="scheduler")
    long_far = ev("schedule", 1 * MS, 101 * MS, source="nsys", category="nvtx")  # 1 ms off on 100 ms: < 2%
    assert drop_duplicate_spans(frame([long, long_far]))[1] == {(0, "nsys"): 1}
    assert drop_duplicate_spans(frame([long, long_far]), tol_fraction=0.0)[1] == {}


def test_empty_and_index_kept():
    out, dropped = drop_duplicate_spans(schema.empty_frame())
    assert out.empty and dropped == {}
    events = frame([ev("a", 0, 10), ev("a", 0, 10, source="nsys", category="nvtx"), ev("b", 0, 10)])
    events.index = [7, 8, 9]
    out, _ = drop_duplicate_spans(events)
    assert list(out.index) == [7, 9]


def test_streams_of_one_source_are_told_apart_by_category():
    """``_one_stream``, the early exit of a rank with one source: two categories of one source are
    two streams (deduplicated), a missing category is the "" one."""
    from profkit.align.dedupe import _one_stream

    two = frame([ev("a.step", 0, 100 * US, source="nsys", category="profkit"),
                 ev("a.step", 0, 100 * US, source="nsys", category="cuda")])
    assert not _one_stream(two, np.arange(2))
    assert kept(drop_duplicate_spans(two)[0]) == [("nsys", "profkit", "a.step")]
    blank = frame([ev("a.step", 0, 100 * US, source="nsys", category=None),
                   ev("b.step", 200 * US, 300 * US, source="nsys", category="")])
    assert _one_stream(blank, np.arange(2))
    assert not _one_stream(frame([ev("a", 0, 1, source="nsys"), ev("a", 0, 1, source="kineto")]), np.arange(2))


@pytest.mark.parametrize("seed", range(10))
def test_codes_read_off_the_column_are_the_factorized_rows(seed):
    """``_codes_at``: the codes and distinct strings that factorizing the taken rows' strings gives
    (numbered by first appearance; missing as "" where asked, one value with ""), on Arrow-backed
    columns as the store gives them."""
    from profkit.align.dedupe import _codes_at
    from profkit.distinct import str_objects

    rng = np.random.default_rng(seed)
    words = np.array(["nvtx", "" if seed % 3 else "z", "profkit", "user_annotation", None], dtype=object)
    values = pd.Series(rng.choice(words[: 4 + seed % 2], 300), dtype="string[pyarrow]")
    pos = np.sort(rng.choice(300, int(rng.integers(1, 300)), replace=False))
    want_codes, want_uni = pd.factorize(str_objects(values.iloc[pos].fillna("")))
    codes, uni = _codes_at(values, pos, missing="")
    assert np.array_equal(codes, want_codes) and list(uni) == list(want_uni)
    full = values.fillna("x")
    want_codes, want_uni = pd.factorize(str_objects(full.iloc[pos]))
    codes, uni = _codes_at(full, pos)
    assert np.array_equal(codes, want_codes) and list(uni) == list(want_uni)
