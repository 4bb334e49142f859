"""Every reader's event table on the real traces equals the recorded golden, bit for bit.

What a change to a reader, the JSON decoding, the Parquet cache or the event dtypes can break:
per part of every trace file in ``sample_traces/`` and the public traces, its rank, source,
warnings, meta, row count, schema, a hash of every column's values in row order (nulls marked),
and per kind the row count and the sums of start times and durations
(``scripts/golden_outputs.py``, ``fingerprint``). The golden was recorded with the readers before
the speed work of issue #16; a deliberate change to what a reader produces regenerates it with

    python scripts/golden_outputs.py tables --write tests/golden/event_tables.json

and the diff of that file shows what changed.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "event_tables.json"
REGENERATE = "python scripts/golden_outputs.py tables --write tests/golden/event_tables.json"


def _golden_module():
    spec = importlib.util.spec_from_file_location("golden_outputs", REPO / "scripts" / "golden_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def golden(shared_traces):
    return _golden_module(), json.loads(GOLDEN.read_text())


def _differences(g, want: dict, got: dict) -> list[str]:
    out: list[str] = []
    g._diff_json(want, got, "", out, 0.0)
    return out


def test_every_reader_table_equals_the_golden(golden, monkeypatch):
    """A real parse (cache off) of every sample and public trace."""
    g, want = golden
    monkeypatch.setenv("PROFKIT_CACHE", "0")
    inputs, roots = g.default_tables_inputs()
    assert set(inputs) == set(want), f"inputs changed: regenerate with `{REGENERATE}`"
    got = g.tables_record(inputs, roots)
    diffs = _differences(g, want, got)
    assert not diffs, "event tables differ from the golden (if intended: " + REGENERATE + "):\n" + "\n".join(diffs)


@pytest.mark.parametrize("name", [
    "samples/engine-dep2-h200/torch_split",  # Kineto, two processes of one rank
    "samples/engine-dep2-h200-capture/nsys_clean",  # nsys SQLite (two ranks in one file) and span files
    "public/tracelens/vllm_b200_tp8_eager/eager_trace.json.gz",
])
def test_tables_read_back_from_the_cache_equal_the_golden(golden, name, monkeypatch, tmp_path):
    """The same tables through a fresh cache entry: written by the first read, read by the second."""
    g, want = golden
    monkeypatch.setenv("PROFKIT_CACHE", "1")
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    inputs, roots = g.default_tables_inputs()
    first = g.tables_record({name: inputs[name]}, roots)
    assert any((tmp_path / "cache").iterdir()), "the first read wrote no cache entry"
    second = g.tables_record({name: inputs[name]}, roots)
    assert not _differences(g, {name: want[name]}, first)
    diffs = _differences(g, {name: want[name]}, second)
    assert not diffs, "tables read from the cache differ from the golden:\n" + "\n".join(diffs)


def test_the_fingerprint_sees_a_changed_value(golden):
    """The check can fail: one changed timestamp, one null, one reordered row change the fingerprint."""
    import pyarrow as pa

    g, _ = golden
    table = pa.table({"kind": ["kernel", "kernel", "cpu_op"], "name": ["a", "b", None],
                      "start_ns": pa.array([1, 2, 3], pa.int64()), "end_ns": pa.array([2, 3, 4], pa.int64())})
    base = g.table_fingerprint(table)
    moved = table.set_column(2, "start_ns", pa.array([1, 2, 4], pa.int64()))
    nulled = table.set_column(1, "name", pa.array(["a", None, None]))
    swapped = table.take([1, 0, 2])
    for other in (moved, nulled, swapped):
        assert g.table_fingerprint(other) != base
    as_dictionary = table.set_column(1, "name", table["name"].dictionary_encode())
    assert g.table_fingerprint(as_dictionary)["columns"] == base["columns"]  # storage does not matter
