"""``profkit.scale.collector``: Python's collector looks less often during an analysis, and the
caller gets its own collector back, whatever happened inside."""
from __future__ import annotations

import gc
import sys

import pytest

from profkit.scale import collector
from profkit.scale.executors import START_ENV, PoolExecutor

pytestmark = pytest.mark.xdist_group("multiprocess")  # process pools: not beside the others


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def callers_collector():
    """The test process's collector set to an odd threshold, and put back afterwards."""
    old = gc.get_threshold()
    gc.set_threshold(900, 11, 12)
    try:
        yield (900, 11, 12)
    finally:
        gc.set_threshold(*old)


def test_inside_the_young_generation_is_collected_less_often_and_old_objects_are_frozen(callers_collector,
                                                                                         monkeypatch):
    monkeypatch.delenv(collector.ENV, raising=False)
    assert gc.get_freeze_count() == 0
    with collector.fewer_collections() as applied:
        assert applied
        assert gc.get_threshold() == (collector.GEN0_THRESHOLD, 11, 12)
        assert gc.get_freeze_count() > 1000  # every object of the test process (pytest, pandas, ...)
    assert gc.get_threshold() == callers_collector
    assert gc.get_freeze_count() == 0


def test_cycles_made_inside_are_collected_afterwards_and_an_error_restores_the_collector(callers_collector,
                                                                                        monkeypatch):
    import weakref

    monkeypatch.delenv(collector.ENV, raising=False)
    with pytest.raises(RuntimeError, match="inside"):
        with collector.fewer_collections():
            cycle = _Cycle()
            alive = weakref.ref(cycle)
            del cycle
            raise RuntimeError("inside")
    assert gc.get_threshold() == callers_collector and gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None  # not left in a frozen generation


def test_a_callers_own_freeze_is_left_as_it_is(callers_collector, monkeypatch):
    monkeypatch.delenv(collector.ENV, raising=False)
    gc.freeze()
    try:
        theirs = gc.get_freeze_count()
        with collector.fewer_collections():
            assert gc.get_freeze_count() == theirs
            assert gc.get_threshold()[0] == collector.GEN0_THRESHOLD
        assert gc.get_freeze_count() == theirs
        assert gc.get_threshold() == callers_collector
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("value", ["0", "off"])
def test_switched_off_the_collector_is_not_touched(callers_collector, monkeypatch, value):
    monkeypatch.setenv(collector.ENV, value)
    with collector.fewer_collections() as applied:
        assert not applied
        assert gc.get_threshold() == callers_collector
        assert gc.get_freeze_count() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers")
def test_forked_workers_inherit_the_freeze_and_spawned_ones_set_the_threshold(monkeypatch):
    monkeypatch.delenv(collector.ENV, raising=False)
    monkeypatch.setenv(START_ENV, "fork")
    with collector.fewer_collections():
        ex = PoolExecutor(1)
        try:
            [(frozen, threshold)] = ex.map(_worker_collector, [()], ["rank 0"])
        finally:
            ex.close()
    assert frozen > 1000  # the driver's objects: their pages are not written by the worker's collector
    assert threshold[0] == collector.GEN0_THRESHOLD
    monkeypatch.setenv(START_ENV, "spawn")
    ex = PoolExecutor(1)
    try:
        [(frozen, threshold)] = ex.map(_worker_collector, [()], ["rank 0"])
    finally:
        ex.close()
    assert frozen == 0 and threshold[0] == collector.GEN0_THRESHOLD  # set by the worker's initializer


def _worker_collector() -> tuple[int, tuple[int, int, int]]:
    return gc.get_freeze_count(), gc.get_threshold()


def test_an_analysis_gives_the_caller_its_collector_back(callers_collector, monkeypatch, tmp_path):
    """``analyze_paths`` (and so the CLI's analyze) on a real 4-rank capture, with a pool."""
    from pathlib import Path

    from profkit.scale import analyze_paths

    monkeypatch.delenv(collector.ENV, raising=False)
    capture = Path(__file__).resolve().parents[1] / "sample_traces" / "engine-dep4-h200-capture" / "torch_faults"
    analysis = analyze_paths([capture], executor="pool", workers=2, scratch=tmp_path / "scratch")
    assert len(analysis.steps) and analysis.straggler_ranks is not None
    assert gc.get_threshold() == callers_collector
    assert gc.get_freeze_count() == 0
