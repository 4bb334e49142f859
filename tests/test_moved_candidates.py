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
        moved.update(got or {})
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
