"""A rank read from one file keeps its stored part as its events (moved, not converted and written
again), on both stores, and a retried prepare task finds it already moved."""
from __future__ import annotations

from pathlib import Path

import pytest

from profkit import schema
from profkit.ingest.loader import read_file
from profkit.analyze import stages
from profkit.analyze.store import DiskStore, MemoryStore

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "sample_traces/engine-dep2-h200/torch_clean/trace/rank1.pt.trace.json.gz"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("PROFKIT_CACHE_DIR", str(cache))
        [part] = read_file(TRACE)
    return part


@pytest.mark.parametrize("store_kind", ["disk", "memory"])
def test_one_part_becomes_the_rank_events(result, store_kind, tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    store = DiskStore(tmp_path / "scratch") if store_kind == "disk" else MemoryStore()
    out = stages.read_file_task(0, str(TRACE), None, store)
    [info] = out.parts
    prep = stages.prepare_task(7, [info.store_key], store, None)
    assert not store.has(info.store_key) and store.has(stages.events_key(7))  # moved, not copied
    events = stages.rank_events(store, 7)
    schema.validate(events)
    assert prep.n_events == len(events) == result.table.num_rows
    assert set(events["rank"].tolist()) == {7}  # filled on load: the part was stored before ranks were known
    expected = schema.to_frame(result.table)
    for column in ("kind", "name", "start_ns", "end_ns", "pid", "correlation"):
        assert events[column].equals(expected[column]), column
    again = stages.prepare_task(7, [info.store_key], store, None)  # a retried task: the part is gone
    assert again.n_events == prep.n_events and again.markers == prep.markers
    store.close()
