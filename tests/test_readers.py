"""The reader registry (``profkit.ingest.readers``): every format is one entry, and ``sniff`` /
``read_file`` find a file's reader through it, on the real captures of ``sample_traces/``."""
from __future__ import annotations

from pathlib import Path

import pytest

from profkit.errors import TraceError
from profkit.ingest import loader, readers
from tests.conftest import SAMPLE_TRACES


@pytest.mark.parametrize("path, kind", [
    ("public-hta-2rank/sampled_rank-0.json.gz", "kineto"),
    ("vllm-0.26-h200/nsys_clean/nsys/report.sqlite", "nsys"),
    ("vllm-0.26-h200/torch_faults/spans-pid1188.jsonl", "profkit"),
])
def test_sniff_names_the_reader_of_real_files(path, kind):
    assert loader.sniff(SAMPLE_TRACES / path) == kind
    assert kind in readers.BY_KIND


def test_recognition_by_name_head_and_its_errors(tmp_path):
    assert readers.sniff(tmp_path / "x.nsys-rep") == "nsys-rep"  # by name: not opened
    (tmp_path / "empty.json").write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        readers.sniff(tmp_path / "empty.json")
    (tmp_path / "side.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(TraceError, match="not a profkit span file"):
        readers.sniff(tmp_path / "side.jsonl")
    (tmp_path / "chrome.json").write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}]}')
    assert readers.sniff(tmp_path / "chrome.json") == "chrome"
    (tmp_path / "bin.json").write_bytes(b"\x00\x01binary")
    with pytest.raises(TraceError, match="unknown format"):
        readers.sniff(tmp_path / "bin.json")


def test_a_new_format_is_one_entry(tmp_path, monkeypatch):
    """An entry with a head test and a read function is all ``read_file`` needs."""
    import sys
    import types

    module = types.ModuleType("profkit_test_reader")
    module.read_xyz = lambda path: [f"parts of {Path(path).name}"]
    monkeypatch.setitem(sys.modules, "profkit_test_reader", module)
    entry = readers.Reader("xyz", (".xyz",), "profkit_test_reader:read_xyz",
                           by_head=lambda path, head: "xyz" if head.startswith(b"XYZ") else None)
    monkeypatch.setattr(readers, "READERS", readers.READERS + (entry,))
    monkeypatch.setitem(readers.BY_KIND, "xyz", entry)
    monkeypatch.setenv("PROFKIT_CACHE", "0")
    (tmp_path / "t.xyz").write_bytes(b"XYZ data")
    assert loader.read_file(tmp_path / "t.xyz") == ["parts of t.xyz"]
