"""Generic Chrome trace-event JSON reader: X, B/E pairing, instants, both document forms, bad input."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import SHARED_TRACES

from profkit import schema as S
from profkit.errors import TraceError
from profkit.ingest import jsonio
from profkit.ingest.chrome import chrome_spec, read_chrome
from profkit.ingest.kineto import read_kineto


def write(path: Path, doc, gz: bool = False) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def rows_of(path: Path) -> list[dict]:
    [part] = read_chrome(path)
    assert part.source == "chrome"
    S.validate(S.to_frame(part.table), str(path))
    return sorted(part.table.to_pylist(), key=lambda r: (r["start_ns"], -r["end_ns"], r["name"]))


PYSPY = [  # py-spy --format chrometrace: nested B/E frames per thread
    {"name": "main", "cat": "py-spy", "ph": "B", "ts": 10.0, "pid": 40, "tid": 41, "args": {"filename": "a.py", "line": 1}},
    {"name": "step", "cat": "py-spy", "ph": "B", "ts": 11.5, "pid": 40, "tid": 41, "args": {"filename": "a.py", "line": 9}},
    {"name": "step", "cat": "py-spy", "ph": "E", "ts": 20.25, "pid": 40, "tid": 41},
    {"name": "main", "cat": "py-spy", "ph": "E", "ts": 30.0, "pid": 40, "tid": 41},
    {"name": "other", "cat": "py-spy", "ph": "B", "ts": 12.0, "pid": 40, "tid": 42},
    {"name": "other", "cat": "py-spy", "ph": "E", "ts": 13.0, "pid": 40, "tid": 42},
]


def test_pyspy_begin_end_pairs_become_sample_spans(tmp_path):
    rows = rows_of(write(tmp_path / "pyspy.json", PYSPY))
    got = [(r["name"], r["kind"], r["start_ns"], r["end_ns"], r["pid"], r["tid"]) for r in rows]
    assert got == [
        ("main", S.SAMPLE, 10_000, 30_000, 40, 41),
        ("step", S.SAMPLE, 11_500, 20_250, 40, 41),
        ("other", S.SAMPLE, 12_000, 13_000, 40, 42),
    ]
    assert {r["category"] for r in rows} == {"py-spy"}


def test_pairing_follows_time_not_file_order(tmp_path):
    shuffled = [PYSPY[3], PYSPY[1], PYSPY[0], PYSPY[2]]
    rows = rows_of(write(tmp_path / "shuffled.json", shuffled))
    assert [(r["name"], r["start_ns"], r["end_ns"]) for r in rows] == [("main", 10_000, 30_000), ("step", 11_500, 20_250)]


def test_unmatched_begin_end_are_reported(tmp_path):
    events = [
        {"name": "orphan end", "ph": "E", "ts": 1.0, "pid": 1, "tid": 1},
        {"name": "open", "ph": "B", "ts": 2.0, "pid": 1, "tid": 1},
        {"name": "x", "ph": "X", "ts": 3.0, "dur": 4.0, "pid": 1, "tid": 1},
        {"name": "later", "ph": "B", "ts": 5.0, "pid": 1, "tid": 1},
        {"name": "later", "ph": "E", "ts": 9.0, "pid": 1, "tid": 1},
    ]
    [part] = read_chrome(write(tmp_path / "u.json", events))
    rows = {r["name"]: r for r in part.table.to_pylist()}
    assert rows["open"]["end_ns"] == 9_000  # closed at the thread's last B/E event
    assert rows["x"]["kind"] == S.CPU_SPAN and rows["x"]["end_ns"] == 7_000
    assert "orphan end" not in rows
    assert any("1 E events with no open B" in w for w in part.warnings)
    assert any("1 B events never ended" in w for w in part.warnings)


def test_object_form_kinds_and_instants(tmp_path):
    doc = {
        "displayTimeUnit": "ns",
        "traceEvents": [
            {"name": "gemm", "cat": "cuda,kernel", "ph": "X", "ts": 100.001, "dur": 2.5, "pid": 0, "tid": 7,
             "args": {"correlation": 3}},
            {"name": "copy", "cat": "gpu_memcpy", "ph": "X", "ts": 103, "dur": 1, "pid": 0, "tid": 8,
             "args": {"device": 1, "stream": 8, "bytes": 64}},
            {"name": "launch", "cat": "cuda_runtime", "ph": "X", "ts": 99, "dur": 1.5, "pid": 123, "tid": 124,
             "args": {"correlation": 3}},
            {"name": "mark", "ph": "i", "s": "g", "ts": 50, "pid": 123, "tid": 124},
            {"name": "Mark", "ph": "I", "ts": 51, "pid": 123, "tid": 124},
            {"name": "gc", "cat": "gc", "ph": "X", "ts": 60, "dur": 3, "pid": 123, "tid": 124},
            {"name": "span", "ph": "X", "ts": 61, "dur": 1, "pid": "Main Process", "tid": "Main Thread"},
            {"name": "counter", "ph": "C", "ts": 70, "pid": 123, "args": {"v": 1}},
            {"name": "thread_name", "ph": "M", "pid": 123, "tid": 124, "args": {"name": "worker"}},
        ],
    }
    [part] = read_chrome(write(tmp_path / "obj.json.gz", doc, gz=True))
    S.validate(S.to_frame(part.table))
    rows = {r["name"]: r for r in part.table.to_pylist()}
    gemm = rows["gemm"]
    assert (gemm["kind"], gemm["device"], gemm["stream"], gemm["pid"], gemm["tid"]) == (S.KERNEL, 0, 7, 123, None)
    assert (gemm["start_ns"], gemm["end_ns"], gemm["correlation"]) == (100_001, 102_501, 3)
    assert (rows["copy"]["kind"], rows["copy"]["device"], rows["copy"]["bytes"]) == (S.MEMCPY, 1, 64)
    assert rows["launch"]["kind"] == S.RUNTIME
    assert rows["mark"]["kind"] == rows["Mark"]["kind"] == S.INSTANT
    assert rows["mark"]["start_ns"] == rows["mark"]["end_ns"] == 50_000
    assert rows["gc"]["kind"] == S.GC
    assert rows["span"]["kind"] == S.CPU_SPAN
    assert part.meta["id_names"]["pid"][str(rows["span"]["pid"])] == "Main Process"
    assert "counter" not in rows and part.meta["skipped"] == {"phase 'C'": 1}
    assert part.meta["thread_names"] == {"123/124": "worker"}
    assert part.meta["base_time_ns"] == 0 and part.rank is None


def test_chrome_spec_defaults():
    assert chrome_spec(None) == (S.CPU_SPAN, False)
    assert chrome_spec("my_app") == (S.CPU_SPAN, False)
    assert chrome_spec("kernel") == (S.KERNEL, True)
    assert chrome_spec("gpu_memset") == (S.MEMSET, True)
    assert chrome_spec("python_function") == (S.PYTHON, False)
    assert chrome_spec("py-spy") == (S.SAMPLE, False)


def test_array_without_closing_bracket_is_read(tmp_path):
    """Chrome's format lets a crashed writer leave the array open."""
    body = json.dumps(PYSPY)[:-1] + ",\n"
    (tmp_path / "open.json").write_text(body)
    [part] = read_chrome(tmp_path / "open.json")
    assert part.table.num_rows == 3
    assert any("not closed" in w for w in part.warnings)


def test_large_array_in_small_chunks_equals_one_chunk(tmp_path, monkeypatch):
    events = [{"name": f"f{i % 7}]}}, {{", "cat": "py-spy", "ph": "BE"[i % 2], "ts": float(i), "pid": 1, "tid": i % 3}
              for i in range(3000)]
    path = write(tmp_path / "big.json", events)
    [whole] = read_chrome(path)
    monkeypatch.setattr(jsonio, "CHUNK_BYTES", 2 << 10)
    [small] = read_chrome(path)
    assert small.table.equals(whole.table) and whole.table.num_rows > 0


def test_a_kineto_file_read_as_chrome():
    rel = SHARED_TRACES / "hta/trace_filter_2rank/sampled_rank-1.json.gz"
    [chrome] = read_chrome(rel)
    [kineto] = read_kineto(rel)
    assert chrome.source == "chrome" and chrome.rank == 1
    assert chrome.table.drop(["source"]).equals(kineto.table.drop(["source"]))


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "empty file"),
        (b"3.5", "is a number"),
        (b'{"events": []}', "no traceEvents"),
        (b"[{]", "invalid JSON"),
        (b'[{"ph": "X", "ts": 1', "truncated JSON"),
    ],
)
def test_bad_input_is_a_trace_error(tmp_path, content, match):
    (tmp_path / "bad.json").write_bytes(content)
    with pytest.raises(TraceError, match=match) as info:
        read_chrome(tmp_path / "bad.json")
    assert info.value.path == str(tmp_path / "bad.json")


def test_truncated_gzip(tmp_path):
    data = gzip.compress(json.dumps(PYSPY * 50).encode())
    (tmp_path / "cut.json.gz").write_bytes(data[:-20])
    with pytest.raises(TraceError, match="gzip"):
        read_chrome(tmp_path / "cut.json.gz")


def test_hostile_strings_are_data(tmp_path):
    names = ["</script><img src=x onerror=alert(1)>", "\x1b[31mred\x1b[0m", "a\u2028b", "y" * (1 << 20)]
    events = [{"name": n, "cat": n[:50], "ph": "X", "ts": i, "dur": 1, "pid": n[:50], "tid": 1} for i, n in enumerate(names)]
    [part] = read_chrome(write(tmp_path / "h.json", events))
    assert part.table.column("name").to_pylist() == names
    assert part.table.column("category").to_pylist() == [n[:50] for n in names]
