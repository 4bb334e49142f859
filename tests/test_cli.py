"""`profkit analyze` end to end: outputs, bad inputs next to good ones, exit codes, the cache."""
from __future__ import annotations

import csv
import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

import profkit
from profkit.cli.main import main
from profkit.ingest import loader

HTA_2RANK = ("hta", "trace_filter_2rank")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))


def two_rank_copy(shared_traces, dst):
    dst.mkdir()
    for f in (shared_traces.joinpath(*HTA_2RANK)).glob("*.json.gz"):
        shutil.copy(f, dst / f.name)
    return dst


def test_analyze_writes_summary_and_steps(shared_traces, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["analyze", str(shared_traces.joinpath(*HTA_2RANK)), "-o", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "rank" in text and "steps found by marker 'profiler_step'" in text
    summary = json.loads((out / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    for r in summary["ranks"]:
        for key in ("window_ns", "gpu_busy_ns", "gpu_idle_ns", "computation_ns", "exposed_comm_ns", "exposed_memcpy_ns", "n_steps"):
            assert isinstance(r[key], int), key
        assert r["gpu_busy_ns"] + r["gpu_idle_ns"] == r["window_ns"]
        assert r["n_steps"] == 2
    with open(out / "steps.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0])[:8] == ["rank", "step", "start_ns", "end_ns", "step_ns", "gpu_busy_ns", "gpu_kernel_ns", "gap_ns"]
    assert len(rows) == 4
    for row in rows:
        assert int(row["gap_ns"]) == int(row["step_ns"]) - int(row["gpu_busy_ns"])


def test_bad_inputs_are_named_and_others_still_analyzed(shared_traces, tmp_path, capsys):
    good = two_rank_copy(shared_traces, tmp_path / "good")
    bad = tmp_path / "bad"
    bad.mkdir()
    raw = gzip.open(good / "sampled_rank-0.json.gz").read()
    (bad / "truncated.json.gz").write_bytes(gzip.compress(raw)[:5000])
    (bad / "invalid.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1,,}]}')
    (bad / "empty.json").write_bytes(b"")
    (bad / "weird.sqlite").write_bytes(b"this is not sqlite at all")
    db = sqlite3.connect(bad / "notnsys.sqlite")
    db.execute("create table people (name text)")
    db.commit()
    db.close()
    (bad / "dup_rank1.json.gz").write_bytes((good / "sampled_rank-1.json.gz").read_bytes())
    (bad / "cpu_only.json").write_text(
        json.dumps({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1, "dur": 5, "pid": 1, "tid": 1}],
                    "distributedInfo": {"rank": 7}})
    )
    out = tmp_path / "out"
    rc = main(["analyze", str(good), str(bad), "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == 0
    err_lines = [line for line in captured.err.splitlines() if line.startswith("profkit: skipped")]
    named = {name: [line for line in err_lines if name in line] for name in
             ("truncated.json.gz", "invalid.json", "empty.json", "weird.sqlite", "notnsys.sqlite", "dup_rank1.json.gz")}
    for name, lines in named.items():
        assert len(lines) == 1, (name, err_lines)
    assert "sampled_rank-1.json.gz" in named["dup_rank1.json.gz"][0]  # both files named
    summary = json.loads((out / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 7]
    assert len(summary["skipped"]) == 6
    assert any("cpu_only.json" in w and "no GPU events" in w for w in summary["warnings"])


def test_exit_code_nonzero_only_when_nothing_analyzed(tmp_path, capsys):
    (tmp_path / "a.json").write_text("[1, 2")
    assert main(["analyze", str(tmp_path / "a.json")]) == 1
    assert "nothing could be analyzed" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "missing_dir")]) == 1


def test_rank_mapping_beats_metadata(shared_traces, tmp_path):
    good = two_rank_copy(shared_traces, tmp_path / "good")
    cap = profkit.load(good, rank_map={"sampled_rank-0.json.gz": 5})
    assert cap.ranks == [1, 5]
    assert set(cap.parts["rank_origin"]) == {"metadata", "mapping"}


def test_rank_from_file_name():
    assert loader.rank_from_filename(loader.Path("trace_rank3.json.gz")) == 3
    assert loader.rank_from_filename(loader.Path("rank-12.pt.trace.json")) == 12
    assert loader.rank_from_filename(loader.Path("worker_rank7_step2.json")) == 7
    assert loader.rank_from_filename(loader.Path("frankly.json")) is None
    assert loader.rank_from_filename(loader.Path("cranks3.json")) is None


def test_second_load_comes_from_parquet_cache(shared_traces, tmp_path, monkeypatch):
    good = two_rank_copy(shared_traces, tmp_path / "good")
    first = profkit.load(good)

    def no_parse(*_a, **_k):
        raise AssertionError("parsed again instead of using the cache")

    import profkit.ingest.kineto as kineto

    monkeypatch.setattr(kineto, "read_kineto", no_parse)
    second = profkit.load(good)
    assert second.skipped == []
    assert second.events.equals(first.events)
    # touching the file invalidates its entry
    (good / "sampled_rank-0.json.gz").touch()
    with pytest.raises(AssertionError):
        loader.read_file(good / "sampled_rank-0.json.gz")


def test_a_cached_file_is_named_as_this_caller_names_it(shared_traces, tmp_path, monkeypatch):
    """The cache is keyed by the resolved path; a hit names the file the way the caller did (as a
    fresh parse does), not the way the first caller did: summary.json and warnings must not depend
    on what filled the cache."""
    good = two_rank_copy(shared_traces, tmp_path / "good")
    absolute = profkit.load(good)  # fills the cache with absolute paths
    monkeypatch.chdir(tmp_path)
    relative = profkit.load(Path("good"))
    assert sorted(relative.parts["path"]) == sorted(str(Path("good") / Path(p).name) for p in absolute.parts["path"])
    assert not any(str(tmp_path) in w for w in relative.warnings)


def test_rank_spec_parse_errors():
    with pytest.raises(ValueError):
        loader.RankMap.parse(["nofile"])
    m = loader.RankMap.parse(["cap.sqlite:4242=3", "x.json=1"])
    assert m.by_file_pid == {("cap.sqlite", 4242): 3} and m.by_file == {"x.json": 1}
