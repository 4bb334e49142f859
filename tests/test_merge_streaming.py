"""The streaming merge: ``merge_ranks`` over a source that hands out one rank at a time.

Why: a DEP256 capture does not fit in memory, so ``profkit merge`` must write the merged trace
from per-rank reads (the scale pipeline's per-rank spill) and produce the very file that
``merge_capture`` writes from a loaded capture.
"""
from __future__ import annotations

import weakref
from pathlib import Path

import pandas as pd
import pytest

import profkit
from profkit.align import estimate
from profkit.export import (
    SUMMARY_COLUMNS, FrameSource, RankSource, merge_capture, merge_ranks, parse_steps, parse_time, summarize_rank,
)
from profkit.simulate import simulate
from conftest import SAMPLE_TRACES

STRAGGLER = SAMPLE_TRACES / "engine-dep2-h200" / "torch_straggler"


class SpillSource:
    """Each rank in its own Parquet file, as a per-rank spill: read one rank per call, nothing kept.

    Records every ``events`` call and checks that no frame it handed out earlier is still alive
    when the next one is asked for.
    """

    def __init__(self, capture, folder: Path) -> None:
        self.ranks = sorted(int(r) for r in capture.events["rank"].unique())
        self.meta = capture.meta
        self.parts = capture.parts
        self.folder = folder
        for rank, rows in capture.events.groupby("rank", sort=True):
            rows.reset_index(drop=True).to_parquet(folder / f"rank{int(rank)}.parquet")
        self.calls: list[int] = []
        self.handed_out: list[weakref.ref] = []
        self.alive_at_call: list[int] = []

    def events(self, rank: int) -> pd.DataFrame:
        self.alive_at_call.append(sum(ref() is not None for ref in self.handed_out))
        self.calls.append(rank)
        frame = pd.read_parquet(self.folder / f"rank{rank}.parquet", dtype_backend="pyarrow")
        self.handed_out.append(weakref.ref(frame))
        return frame

    def summary(self, rank: int):
        columns = pd.read_parquet(self.folder / f"rank{rank}.parquet", columns=list(SUMMARY_COLUMNS), dtype_backend="pyarrow")
        return summarize_rank(rank, columns)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    try:
        sim = tmp_path_factory.mktemp("dep8")
        simulate(ranks=8, steps=6, seed=1, out_dir=sim)
        yield {"dep8": profkit.load(sim), "straggler": profkit.load(STRAGGLER)}
    finally:
        mp.undo()


WINDOWS = {"all": {}, "steps": {"steps": parse_steps("2:3")}, "time": {"time": parse_time("0.01:0.03")}}


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
@pytest.mark.parametrize("name, window", [("dep8", "all"), ("dep8", "steps"), ("dep8", "time"), ("straggler", "all")])
def test_streamed_merge_is_byte_identical_to_merge_capture(captures, name, fmt, window, tmp_path):
    cap = captures[name]
    whole = merge_capture(cap, tmp_path / "whole", fmt=fmt, **WINDOWS[window])
    assert whole.alignment is not None  # profkit.align was used
    source = SpillSource(cap, tmp_path)
    streamed = merge_ranks(source, tmp_path / "streamed", fmt=fmt, alignment=estimate(cap.events), **WINDOWS[window])
    assert (tmp_path / "streamed").read_bytes() == (tmp_path / "whole").read_bytes()
    assert (streamed.ranks, streamed.n_events, streamed.n_steps, streamed.n_flows) == (
        whole.ranks, whole.n_events, whole.n_steps, whole.n_flows)
    assert streamed.notes == whole.notes
    pd.testing.assert_frame_equal(streamed.alignment, whole.alignment)
    assert source.calls == source.ranks  # once per rank, in order


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
def test_unaligned_streamed_merge_is_byte_identical(captures, fmt, tmp_path):
    cap = captures["dep8"]
    merge_capture(cap, tmp_path / "whole", fmt=fmt, align=None)
    result = merge_ranks(SpillSource(cap, tmp_path), tmp_path / "streamed", fmt=fmt, alignment=None)
    assert (tmp_path / "streamed").read_bytes() == (tmp_path / "whole").read_bytes()
    assert result.alignment is None and any("not aligned (no alignment was given)" in n for n in result.notes)


def test_one_rank_in_memory_at_a_time(captures, tmp_path):
    cap = captures["dep8"]
    source = SpillSource(cap, tmp_path)
    merge_ranks(source, tmp_path / "m.pftrace", alignment=estimate(cap.events))
    assert source.calls == list(range(8))
    assert source.alive_at_call == [0] * 8, "a rank's frame was still alive when the next rank was read"
    assert all(ref() is None for ref in source.handed_out)


def test_source_without_summary_is_read_twice_but_gives_the_same_file(captures, tmp_path):
    cap = captures["dep8"]

    class NoSummary:
        def __init__(self, inner: FrameSource) -> None:
            self.ranks, self.meta, self.parts, self.inner, self.calls = inner.ranks, inner.meta, inner.parts, inner, []

        def events(self, rank: int) -> pd.DataFrame:
            self.calls.append(rank)
            return self.inner.events(rank)

    source = NoSummary(FrameSource.from_capture(cap))
    assert isinstance(source, RankSource)
    merge_ranks(source, tmp_path / "a.pftrace")
    merge_ranks(FrameSource.from_capture(cap), tmp_path / "b.pftrace")
    assert (tmp_path / "a.pftrace").read_bytes() == (tmp_path / "b.pftrace").read_bytes()
    assert source.calls == list(range(8)) * 2


def test_summary_needs_only_its_columns(captures):
    cap = captures["straggler"]
    rank0 = cap.events[cap.events["rank"] == 0]
    full, narrow = summarize_rank(0, rank0), summarize_rank(0, rank0[list(SUMMARY_COLUMNS)])
    assert full == narrow and full.n_events == len(rank0)
    assert "EngineCore.step" in full.span_names
    assert max(full.host_pid_counts, key=full.host_pid_counts.get) == 912  # the engine process
    assert min(full.first_start_ns.values()) == int(rank0["start_ns"].min())


def test_empty_source_writes_an_empty_trace(tmp_path):
    class Empty:
        ranks: list[int] = []
        meta: dict = {}

        def events(self, rank):
            raise AssertionError("no rank to read")

    result = merge_ranks(Empty(), tmp_path / "e.json", fmt="chrome")
    assert result.ranks == [] and result.n_events == 0
    assert (tmp_path / "e.json").read_bytes().startswith(b'{"displayTimeUnit"')
