"""profkit.ingest.spans: the reader of ``spans-pid{pid}.jsonl`` files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from profkit import schema
from profkit.errors import TraceError
from profkit.ingest.spans import is_span_file, read_spans, to_absolute

HEADER = {"profkit_spans": 1, "pid": 4242, "host": "node7", "rank": None, "rank_origin": "unknown",
          "dp_rank": None, "process_name": "VLLM::EngineCore_DP3", "role": "engine_core", "clock": "monotonic",
          "anchors": [[1_700_000_000_000_000_000, 1_000_000_000]]}


def write(path: Path, *lines: dict | str, newline_last: bool = True) -> Path:
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    path.write_text(text + ("\n" if newline_last else ""))
    return path


def batch(spans, names=None, anchor=None) -> dict:
    out: dict = {}
    if anchor:
        out["anchor"] = anchor
    out["names"] = {str(k): v for k, v in (names or {}).items()}
    out["spans"] = spans
    return out


def frame(part):
    df = schema.to_frame(part.table)
    schema.validate(df, part.label)
    return df


def test_basic_fields_and_times(tmp_path):
    path = write(tmp_path / "spans-pid4242.jsonl", HEADER,
                 batch([[0, 1, 1_000_000_500, 1_000_002_500, 77],
                        [2, 3, 1_000_000_100, 1_000_000_400, 78, {"collected": 5, "uncollectable": 0}]],
                       {0: "EngineCore.step", 1: "step", 2: "gc.gen2", 3: "gc"}))
    (part,) = read_spans(path)
    assert (part.source, part.key, part.rank, part.rank_origin) == ("profkit", "pid=4242", None, "unknown")
    df = frame(part)
    assert df["name"].tolist() == ["gc.gen2", "EngineCore.step"]  # sorted by start
    assert df["kind"].tolist() == ["gc", "cpu_span"] and df["category"].tolist() == ["gc", "step"]
    base = 1_700_000_000_000_000_000 - 1_000_000_000
    assert df["start_ns"].tolist() == [base + 1_000_000_100, base + 1_000_000_500]
    assert df["end_ns"].tolist() == [base + 1_000_000_400, base + 1_000_002_500]
    assert df["tid"].tolist() == [78, 77] and set(df["pid"]) == {4242}
    assert df["device"].isna().all() and df["stream"].isna().all()
    assert part.meta["host"] == "node7" and part.meta["process_name"] == "VLLM::EngineCore_DP3"
    assert part.meta["gc_collected"] == 5 and part.warnings == []


def test_rank_from_last_header_that_knows(tmp_path):
    later = {**HEADER, "rank": 3, "rank_origin": "process title", "dp_rank": 3}
    path = write(tmp_path / "s.jsonl", HEADER, batch([[0, 0, 1_000_000_000, 1_000_000_001, 1]], {0: "a"}), later,
                 batch([[0, 0, 1_000_000_002, 1_000_000_003, 1]]), {**HEADER, "rank": None})
    (part,) = read_spans(path)
    assert (part.rank, part.rank_origin) == (3, "metadata")
    assert part.meta["dp_rank"] == 3 and part.meta["rank_origin"] == "process title"


def test_nearest_anchor_piecewise(tmp_path):
    # the wall clock steps by +1 ms between the two anchors; each span uses the nearest one
    a0 = [10_000_000_000, 1_000]
    a1 = [10_000_000_000 + 1_000_000 + 1_000_000_000, 1_000 + 1_000_000_000]
    header = {**HEADER, "anchors": [a0]}
    path = write(tmp_path / "s.jsonl", header,
                 batch([[0, 0, 2_000, 3_000, 1], [0, 0, 999_999_000, 999_999_500, 1]], {0: "x"}, anchor=a1))
    df = frame(read_spans(path)[0])
    assert df["start_ns"].tolist() == [10_000_000_000 + 1_000, 10_000_000_000 + 1_000_000 + 999_998_000]
    assert (df["end_ns"] - df["start_ns"]).tolist() == [1_000, 500]  # durations exact
    offsets = to_absolute(__import__("numpy").array([0, 500_000_999, 500_001_001]), [tuple(a0), tuple(a1)])
    assert offsets.tolist() == [a0[0] - a0[1], a0[0] - a0[1], a1[0] - a1[1]]


def test_drift_in_meta(tmp_path):
    a1 = [1_700_000_000_000_000_000 + 10_000_000_000 + 1_000, 1_000_000_000 + 10_000_000_000]  # +1 us in 10 s
    path = write(tmp_path / "s.jsonl", HEADER, json.dumps({"anchor": a1}))
    part = read_spans(path)[0]
    assert part.meta["wall_vs_mono_drift_ppm"] == pytest.approx(0.1)
    assert part.table.num_rows == 0


def test_torn_last_line_is_a_warning(tmp_path):
    good = batch([[0, 0, 1_000_000_000, 1_000_000_010, 1]], {0: "a"})
    path = write(tmp_path / "s.jsonl", HEADER, good, '{"names":{},"spans":[[0,0,1000000', newline_last=False)
    (part,) = read_spans(path)
    assert part.table.num_rows == 1
    assert len(part.warnings) == 1 and "torn last line 3" in part.warnings[0]


@pytest.mark.parametrize("lines, problem", [
    ((HEADER, "{not json", batch([[0, 0, 1, 2, 3]], {0: "a"})), "line 2: not JSON"),
    ((batch([[0, 0, 1, 2, 3]], {0: "a"}),), "no 'profkit_spans' header"),
    (("hello world",), "first line is not JSON"),
    (({**HEADER, "profkit_spans": 2},), "format 2 is newer"),
    ((HEADER, batch([[0, 0, 1]], {0: "a"})), "spans must be"),
    ((HEADER, '[1, 2]'), "expected a JSON object"),
    ((HEADER, {"anchor": "now"}), "an anchor must be"),
])
def test_garbage_is_a_trace_error(tmp_path, lines, problem):
    path = write(tmp_path / "bad.jsonl", *lines)
    with pytest.raises(TraceError) as err:
        read_spans(path)
    assert problem in str(err.value) and str(path) in str(err.value)


def test_empty_and_missing(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(TraceError, match="empty file"):
        read_spans(empty)
    with pytest.raises(TraceError, match="cannot open"):
        read_spans(tmp_path / "nope.jsonl")


def test_unknown_name_id_warns(tmp_path):
    path = write(tmp_path / "s.jsonl", HEADER, batch([[9, 0, 1_000_000_000, 1_000_000_001, 1]], {0: "cat"}))
    part = read_spans(path)[0]
    assert part.table.column("name").to_pylist() == ["<unknown name 9>"]
    assert any("never defined" in w for w in part.warnings)


def test_is_span_file(tmp_path):
    assert is_span_file(write(tmp_path / "a.jsonl", HEADER))
    assert not is_span_file(write(tmp_path / "rank0.steps.jsonl", {"rank": 0, "step": 1}))
    assert not is_span_file(tmp_path / "missing.jsonl")


def test_recorder_file_round_trip(tmp_path):
    """What the recorder writes (identity, names across lines, GC args) is what the reader reads."""
    import gc

    import profkit.instrument as pi
    from profkit.instrument import gcspans, identity
    from profkit.instrument.recorder import Recorder, use_recorder

    rec = Recorder(str(tmp_path), capacity=4, flush_interval_s=0)
    previous = use_recorder(rec)
    gcspans.install()
    try:
        identity.current().learn({"rank": 2, "dp_rank": 2, "ep_rank": 2})
        for i in range(10):
            with pi.span(f"n{i % 3}", category="c"):
                pass
        gc.collect()
        rec.flush()
    finally:
        gcspans.uninstall()
        rec.close()
        use_recorder(previous)
        identity.reset()
    (part,) = read_spans(rec.path)
    df = frame(part)
    assert part.rank == 2 and part.meta["ep_rank"] == 2
    assert df.loc[df["kind"] == "cpu_span", "name"].tolist() == [f"n{i % 3}" for i in range(10)]
    assert "gc.gen2" in df.loc[df["kind"] == "gc", "name"].tolist()
    assert part.warnings == []
