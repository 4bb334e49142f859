"""The driver matches the collective instances while the ranks are analyzed (issue #16's
thirteenth round): where every rank comes from one source with one host span stream
(``stages.one_stream``) and no span name is a sync point by cross-rank evidence, ``rank_task``
only moves each rank's prepared candidates onto the common clock, so the driver moves them
itself (``pipeline._movable_candidates``, ``_moved``) and matches them meanwhile.

Checked against what it replaces: the candidates the rank tasks return when not told the driver
moves them, frame for frame, and every table of the analysis with the driver's early matching
switched off; the fall-back when a rank's candidates come back after all; and captures with
several sources (span files, Nsight) left to the rank tasks as before.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.analyze import pipeline, stages
from profkit.scale import analyze_paths

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
TABLES = ("steps", "timelines", "ranks", "causes", "cause_steps", "stragglers", "straggler_instances", "lateness",
          "sync_points", "phase_steps")


@pytest.fixture(scope="module")
def dep6(tmp_path_factory) -> Path:
    """A simulated DEP6 (Kineto only: one source a rank) with a straggler cause."""
    out = tmp_path_factory.mktemp("dep6") / "sim"
    subprocess.run([sys.executable, "-m", "profkit.cli.main", "simulate", "--ranks", "6", "--steps", "6", "--seed", "4",
                    "--layers", "2", "--inject", "slow_schedule:rank=3,ms=4", "-o", str(out), "-q"], check=True)
    return out


def _assert_same(a, b) -> None:
    for name in TABLES:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        pd.testing.assert_frame_equal(x.reset_index(drop=True), y.reset_index(drop=True), check_exact=True,
                                      obj=name)
    pd.testing.assert_frame_equal(a.impact.table, b.impact.table, check_exact=True, obj="impact")
    assert a.warnings == b.warnings
    assert a.straggler_ranks == b.straggler_ranks


def _spy(monkeypatch, returned: dict, moved: dict, asked: dict, honour: bool = True) -> None:
    """Record what each rank task would return (told nothing) and what the driver moved."""
    real_task, real_moved = stages.rank_task, pipeline._moved

    def task(*args):
        rank, driver_moves = args[0], args[-1]
        asked[rank] = driver_moves
        out = real_task(*args[:-1], False)
        returned[rank] = out.candidates
        if driver_moves and honour:
            out.candidates = None
        return out

    def moved_candidates(*args):
        got = real_moved(*args)
        moved.update({r: got.of(r) for r in got.ranks} if got is not None else {})
        return got

    monkeypatch.setattr(stages, "rank_task", task)
    monkeypatch.setattr(pipeline, "_moved", moved_candidates)


def _moves_nothing(prep: list, *args) -> None:
    """``pipeline._movable_candidates`` as before this round: every rank's candidates come back."""
    for p in prep:
        p.candidates = None
    return None


def _capture(name: str, dep6: Path) -> Path:
    return dep6 if name == "simulated" else SAMPLES / "public-hta-2rank"


@pytest.mark.parametrize("name", ["simulated", "public-hta-2rank"])
def test_the_driver_moves_the_candidates_the_rank_tasks_would_return(name, dep6, monkeypatch):
    path = _capture(name, dep6)
    returned, moved, asked = {}, {}, {}
    _spy(monkeypatch, returned, moved, asked)
    early = analyze_paths([path], executor="serial")
    assert moved and set(asked) == set(returned) and all(asked.values())
    for rank, frame in returned.items():
        pd.testing.assert_frame_equal(moved[rank], frame, check_exact=True, obj=f"rank {rank}'s candidates")
    monkeypatch.undo()
    monkeypatch.setattr(pipeline, "_movable_candidates", _moves_nothing)
    _assert_same(early, analyze_paths([path], executor="serial"))
    assert len(early.straggler_instances) and len(early.sync_points)  # the instances mattered


def test_candidates_that_come_back_after_all_are_matched_instead(dep6, monkeypatch):
    """A rank whose task returns its candidates though the driver moved them (it dropped events
    after all): the instances are matched again from what came back, the same tables."""
    want = analyze_paths([dep6], executor="serial")
    returned, moved, asked = {}, {}, {}
    _spy(monkeypatch, returned, moved, asked, honour=False)
    got = analyze_paths([dep6], executor="serial")
    assert moved and all(asked.values())
    _assert_same(want, got)


def test_ranks_with_several_sources_find_their_candidates_as_before(monkeypatch):
    """A profkit capture (Kineto, Nsight and span files a rank): the rank tasks drop duplicate
    spans, so they return their candidates and the driver moves none."""
    returned, moved, asked = {}, {}, {}
    _spy(monkeypatch, returned, moved, asked)
    analyze_paths([SAMPLES / "engine-dep2-h200-capture"], executor="serial")
    assert not moved and asked and not any(asked.values())
    assert all(c is not None and len(c) for c in returned.values())


def _events(sources: list[str], kinds: list[str], categories: list) -> pd.DataFrame:
    n = len(sources)
    return pd.DataFrame({"source": pd.array(sources, dtype="string[pyarrow]"), "kind": pd.array(kinds, dtype="string[pyarrow]"),
                         "category": pd.array(categories, dtype="string[pyarrow]"), "start_ns": np.arange(n, dtype=np.int64)})


@pytest.mark.parametrize("sources, kinds, categories, want", [
    (["kineto"] * 3, ["cpu_span", "kernel", "cpu_span"], ["user_annotation", "kernel", "user_annotation"], True),
    (["kineto", "kineto"], ["kernel", "cpu_op"], ["kernel", "cpu_op"], True),  # no host span at all
    (["kineto", None], ["kernel", "cpu_op"], ["kernel", None], True),  # a missing source is no second source
    (["kineto", "kineto"], ["cpu_span", "cpu_span"], ["a", None], False),  # a missing category is a stream of its own
    (["kineto", "profkit"], ["kernel", "kernel"], ["kernel", "kernel"], False),  # two sources: clipped between them
    (["nsys", "nsys"], ["cpu_span", "gc"], ["nvtx", "profkit"], False),  # two host span streams: deduplicated
    ([], [], [], False),
])
def test_one_stream(sources, kinds, categories, want):
    assert stages.one_stream(_events(sources, kinds, categories)) is want


def _alignment():
    from profkit.align import Alignment
    from profkit.align.sources import SOURCE_COLUMNS

    ranks = pd.DataFrame({"rank": [0, 1, 2], "offset_ns": [0, 1_500, -700], "drift_ppm": [0.0, 3.5, -2.0],
                          "t0_ns": [1_000, 1_000, 1_000]})
    return Alignment(ranks=ranks, sources=pd.DataFrame(columns=SOURCE_COLUMNS), t0_ns=1_000)


def _candidates(rank: int, launch: pd.Series | np.ndarray, n: int = 5) -> pd.DataFrame:
    start = np.arange(n, dtype=np.int64) * 1_000_000 + 7 * rank
    return pd.DataFrame({"rank": np.full(n, rank, np.int64), "start_ns": start, "end_ns": start + 50_000,
                         "launch_ns": launch, "name": [f"k{i}" for i in range(n)]})


def _one_by_one(movable: dict, alignment) -> pd.DataFrame:
    """What the driver did before: each rank moved with its own rank alignment, then joined."""
    from profkit.align import apply_alignment

    by_rank = stages.rank_alignments(alignment, list(movable))
    return pd.concat([apply_alignment(c, by_rank[r]) for r, c in movable.items() if len(c)], ignore_index=True)


def test_moved_joined_first_as_one_by_one():
    """Ranks alike (the same columns and dtypes, an Int64 time column with a missing value on one
    rank only): joined, then moved at once, the same table as each rank moved and joined after;
    each rank's rows read back as its own; a rank without candidates is moved, with no rows."""
    al = _alignment()
    movable = {0: _candidates(0, pd.array([5, None, 7, 8, 9], dtype="Int64")),
               1: _candidates(1, pd.array([1, 2, 3, 4, 5], dtype="Int64")),
               2: _candidates(2, pd.array([], dtype="Int64"), n=0)}
    got = pipeline._moved(movable, al, stages.rank_alignments(al, list(movable)))
    want = _one_by_one(movable, al)
    pd.testing.assert_frame_equal(got.joined, want, check_exact=True)
    assert got.ranks == {0, 1, 2} and len(got.of(2)) == 0 and got.of(5) is None
    pd.testing.assert_frame_equal(got.of(1), want[want["rank"] == 1].reset_index(drop=True), check_exact=True)
    assert got.joined["start_ns"].tolist() != pd.concat([movable[0], movable[1]])["start_ns"].tolist()  # moved


def test_moved_one_by_one_where_a_float_column_would_change():
    """A float time column with a missing value on one rank only: moved alone, that rank's column
    becomes Int64 and the others' stay float64, so the joined table differs from one moved at
    once; such ranks are moved one by one, as before."""
    from profkit.align import apply_alignment

    al = _alignment()
    movable = {0: _candidates(0, np.array([5.0, np.nan, 7.0, 8.0, 9.0])),
               1: _candidates(1, np.array([1.0, 2.0, 3.0, 4.0, 5.0]))}
    got = pipeline._moved(movable, al, stages.rank_alignments(al, list(movable)))
    want = _one_by_one(movable, al)
    pd.testing.assert_frame_equal(got.joined, want, check_exact=True)
    at_once = apply_alignment(pd.concat(list(movable.values()), ignore_index=True), al)
    assert at_once["launch_ns"].dtype != want["launch_ns"].dtype  # why the guard is there
