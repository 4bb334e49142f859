"""Regression history: schema migrations, round trips, filters, and concurrent writers that all land."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from profkit.cli.main import main
from profkit.history import HistoryDB, RunError, SchemaError, read_analysis_dir
from profkit.history import schema as history_schema

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces" / "engine-dep2-h200"


def analyze_into(capture: str, out: Path) -> Path:
    """``profkit analyze CAPTURE -o OUT``; it writes ``cause_steps.csv`` itself (checked)."""
    assert main(["analyze", str(SAMPLES / capture), "-o", str(out), "-q"]) == 0
    assert (out / "cause_steps.csv").is_file(), "profkit analyze did not write cause_steps.csv"
    return out


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    """torch_clean analyzed once for the module, with a private Parquet cache."""
    base = tmp_path_factory.mktemp("history")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFKIT_CACHE_DIR", str(base / "cache"))
        yield analyze_into("torch_clean", base / "torch_clean")


def test_new_database_is_wal_versioned_and_waits_on_locks(tmp_path):
    db_path = tmp_path / "runs.sqlite"
    with HistoryDB(db_path, timeout_s=7) as db:
        assert db.version == history_schema.LATEST
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 7000
        tables = {r[0] for r in db.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"schema_version", "runs", "run_meta", "metrics", "step_samples", "cause_samples", "causes",
            "stragglers", "lateness_samples", "balance_samples"} <= tables
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(history_schema.LATEST,)]


def test_old_database_is_migrated_in_order_keeping_its_runs(tmp_path, analyzed):
    db_path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for sql in history_schema.MIGRATIONS[0].statements:  # a database written by a version-1 profkit
        conn.execute(sql)
    conn.execute("INSERT INTO schema_version VALUES (1)")
    conn.execute("INSERT INTO runs (label, created_ns) VALUES ('old-run', 1)")
    conn.close()
    with HistoryDB(db_path) as db:
        assert db.version == history_schema.LATEST
        assert list(db.runs()["label"]) == ["old-run"]
        db.add(read_analysis_dir(analyzed), label="new-run")  # uses the tables migration 2 added
        assert list(db.runs()["label"]) == ["old-run", "new-run"]


def test_newer_database_is_refused(tmp_path):
    db_path = tmp_path / "future.sqlite"
    HistoryDB(db_path).close()
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.close()
    with pytest.raises(SchemaError, match="newer"):
        HistoryDB(db_path)


def test_round_trip_of_a_run(tmp_path, analyzed):
    run = read_analysis_dir(analyzed)
    assert run.cause_steps is not None and not run.notes
    with HistoryDB(tmp_path / "runs.sqlite") as db:
        rid = db.add(run, label="nightly-1", meta={"commit": "abc", "gpus": "2xH200"}, created_ns=10)
        back = db.load(rid)
        metrics = dict(db.conn.execute("SELECT name, value FROM metrics WHERE run_id = ?", (rid,)).fetchall())
    pd.testing.assert_frame_equal(back.steps, run.steps)
    pd.testing.assert_frame_equal(back.cause_steps.sort_values(["rank", "step", "cause"]).reset_index(drop=True),
                                  run.cause_steps.sort_values(["rank", "step", "cause"]).reset_index(drop=True),
                                  check_dtype=False)
    assert list(back.causes["cause"]) == list(run.causes["cause"])
    assert back.causes["total_ns"].tolist() == run.causes["total_ns"].tolist()
    assert back.meta == {"commit": "abc", "gpus": "2xH200"} and back.label == "nightly-1" and back.created_ns == 10
    assert back.summary == json.loads((analyzed / "summary.json").read_text())
    steps = pd.read_csv(analyzed / "steps.csv")
    assert metrics["step_ns_p50"] == pytest.approx(steps["step_ns"].median())
    assert metrics["gpu_busy_ns_p50"] == pytest.approx(steps["gpu_busy_ns"].median())


def test_straggler_tables_are_recorded_when_present(tmp_path, analyzed):
    out = tmp_path / "out"
    shutil.copytree(analyzed, out)
    stragglers = pd.DataFrame({"rank": [0, 1], "times_last": [3, 17], "late_ns_p50": [0, 2_000_000],
                               "late_ns_p99": [10, 15_000_000], "caused_wait_ns": [5, 90_000_000], "score": [1.0, 0.72],
                               "top_cause": ["moe_dispatch", "EngineCore.step"], "straggler": [False, True]})
    stragglers.to_csv(out / "stragglers.csv", index=False)
    steps = pd.read_csv(out / "steps.csv")
    lateness = steps[["rank", "step"]].assign(late_ns=(steps["rank"] * 1_000_000).astype("int64"), late_max_ns=1,
                                              top_cause="EngineCore.step")
    lateness.to_csv(out / "lateness.csv", index=False)
    run = read_analysis_dir(out)
    with HistoryDB(tmp_path / "runs.sqlite") as db:
        back = db.load(db.add(run, label="with-stragglers"))
        metrics = dict(db.conn.execute("SELECT name, value FROM metrics").fetchall())
    assert back.stragglers["top_cause"].tolist() == ["moe_dispatch", "EngineCore.step"]
    assert back.stragglers["score"].tolist() == [1.0, 0.72]
    assert back.lateness["late_ns"].sum() == lateness["late_ns"].sum() and len(back.lateness) == len(lateness)
    assert metrics["straggler_score_min"] == 0.72
    assert metrics["late_ns_mean"] == 1_000_000  # worst rank (1) is 1 ms late every step


def test_labels_ids_and_filters(tmp_path, analyzed):
    run = read_analysis_dir(analyzed)
    with HistoryDB(tmp_path / "runs.sqlite") as db:
        a = db.add(run, label="nightly-1", meta={"gpus": "H200"}, created_ns=1)
        b = db.add(run, label="nightly-2", meta={"gpus": "B200"}, created_ns=2)
        c = db.add(run, label="nightly-2", meta={"gpus": "H200"}, created_ns=3)
        d = db.add(run, label="pr-7", meta={"gpus": "H200"}, created_ns=4)
        assert db.find("nightly-2") == c  # the latest with the label
        assert db.find(f"#{b}") == b and db.find("#999") is None and db.find("nope") is None
        assert list(db.runs("nightly-*")["id"]) == [a, b, c]
        assert list(db.runs(["pr-*", "nightly-1"])["id"]) == [a, d]
        assert list(db.runs(meta={"gpus": "H200"})["id"]) == [a, c, d]
        assert list(db.runs("nightly-*", {"gpus": "H200"})["id"]) == [a, c]


def test_history_cli_add_and_list(tmp_path, analyzed, capsys):
    db = tmp_path / "runs.sqlite"
    rc = main(["history", "add", str(analyzed), "--db", str(db), "--label", "n1", "--meta", "commit=abc",
               "--time", "2026-11-29T10:00:00"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "recorded run #1 'n1'" in out.out and "40 step samples" in out.out
    assert "reading" in out.err  # progress on stderr
    assert main(["history", "add", str(analyzed), "--db", str(db), "--label", "n2", "-q"]) == 0
    assert capsys.readouterr().out == ""  # quiet
    assert main(["history", "list", "--db", str(db), "--label", "n*", "--meta", "commit=abc"]) == 0
    listed = capsys.readouterr().out
    assert "n1" in listed and "2026-11-29 10:00:00" in listed and "commit=abc" in listed and "n2" not in listed


def test_history_cli_errors_name_the_problem(tmp_path, analyzed, capsys):
    db = tmp_path / "runs.sqlite"
    assert main(["history", "add", str(analyzed), "--db", str(db), "--meta", "novalue"]) == 2
    assert "--meta 'novalue': expected KEY=VALUE" in capsys.readouterr().err
    traces = SAMPLES / "torch_clean" / "trace"
    assert main(["history", "add", str(traces), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert str(traces) in err and "not an analysis folder" in err and "profkit analyze" in err
    assert main(["history", "list", "--db", str(tmp_path / "missing.sqlite")]) == 2
    assert "no such history database" in capsys.readouterr().err
    assert not (tmp_path / "missing.sqlite").exists()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text("{}")
    (broken / "steps.csv").write_text("rank,step\n0,1\n")
    assert main(["history", "add", str(broken), "--db", str(db)]) == 2
    assert "steps.csv: missing column(s) step_ns" in capsys.readouterr().err
    assert not HistoryDB(db).runs().shape[0]  # nothing half-written


# ---- concurrent writers ---------------------------------------------------------------------------
WRITER = textwrap.dedent(
    """
    import sqlite3, sys
    from profkit.cli.main import main  # import first, so the writers reach the database together

    connect = sqlite3.connect

    def traced(*args, **kwargs):  # says when the write transaction is attempted (before any wait for the lock)
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(lambda sql: sql.startswith("BEGIN IMMEDIATE") and print("BEGIN", flush=True))
        return conn

    sqlite3.connect = traced
    print("ready", flush=True)
    sys.stdin.readline()  # the test says go to every writer at once
    sys.exit(main(sys.argv[1:]))
    """
)


def _writer(db: Path, out: Path, label: str, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, "history", "add", str(out), "--db", str(db), "--label", label,
                             "-q"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc


def _go(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["PROFKIT_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def _writers(db: Path, out: Path, labels: list[str], env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """Start a writer per label, wait until each has imported everything, then let all go at once."""
    procs = [_writer(db, out, label, env) for label in labels]
    for p in procs:
        _go(p)
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)  # a hang guard
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


def test_two_concurrent_writers_both_land(tmp_path, analyzed):
    env = _env(tmp_path)
    n_steps = len(pd.read_csv(analyzed / "steps.csv"))
    n_cause_rows = int((pd.read_csv(analyzed / "cause_steps.csv")["ns"] != 0).sum())
    for round_ in range(4):
        # round 0 and 2: both writers create the database at once; rounds 1 and 3: it exists
        db = tmp_path / f"runs{round_ // 2}.sqlite"
        labels = [f"r{round_}-a", f"r{round_}-b"]
        results = _writers(db, analyzed, labels, env)
        for r in results:
            assert r.returncode == 0, r.stderr
        with HistoryDB(db) as h:
            runs = h.runs(f"r{round_}-*")
            assert sorted(runs["label"]) == labels
            for rid in runs["id"]:
                got = h.load(int(rid))
                assert len(got.steps) == n_steps and len(got.cause_steps) == n_cause_rows
            assert h.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with HistoryDB(tmp_path / "runs0.sqlite") as h:
        assert len(h.runs()) == 4


def test_writer_waits_for_a_held_write_lock(tmp_path, analyzed):
    db = tmp_path / "runs.sqlite"
    HistoryDB(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another CI job in the middle of its write
    proc = _writer(db, analyzed, "waited", _env(tmp_path))
    _go(proc)
    assert proc.stdout.readline().strip() == "BEGIN", proc.stderr.read()  # it tried to write while the lock was held
    time.sleep(0.5)
    assert proc.poll() is None  # still waiting, not failed
    holder.execute("COMMIT")
    holder.close()
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    with HistoryDB(db) as h:
        assert list(h.runs()["label"]) == ["waited"]


def test_unknown_label_is_an_error(tmp_path, analyzed):
    with HistoryDB(tmp_path / "runs.sqlite") as db:
        from profkit.history import resolve_run

        with pytest.raises(RunError, match="neither an analysis folder nor a run"):
            resolve_run("nope", db)
