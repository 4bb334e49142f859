"""``benchmarks/scale.py --quick`` runs end to end and prints its table (a smoke test, not a measurement)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import benchmark_module

REPO = Path(__file__).resolve().parents[1]


def test_quick_scale_benchmark_prints_its_table(tmp_path):
    env = {**os.environ, "PROFKIT_CACHE_DIR": str(tmp_path / "unused-cache")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "scale.py"), "--quick", "--executors", "serial",
         "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "scale.html")],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO,  # a hang guard
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "| capture | events | executor | cache | wall s | events/s | driver peak MB |" in out
    rows = [line for line in out.splitlines() if line.startswith("| DEP8 x 20 |")]
    assert {line.split("|")[4].strip() for line in rows} == {"cold", "warm"}, out
    assert all("serial" in line and "failed" not in line for line in rows)
    assert "Floor:" in out and "Goals (issue #9):" in out
    assert (tmp_path / "scale.html").stat().st_size > 10_000


def test_idle_benchmark_times_the_drivers_stages_beside_the_cpu_use(tmp_path):
    """``benchmarks/idle.py`` on a small simulated capture: every driver stage it wraps still
    exists in the pipeline (a renamed one would drop out of its table silently), and it prints
    the idle core-seconds."""
    import importlib

    idle = benchmark_module("idle")
    for module, name in idle.DRIVER_STAGES:
        assert hasattr(importlib.import_module(module), name), (module, name)
    if not Path("/proc/stat").exists():
        return
    env = {**os.environ, "PROFKIT_CACHE_DIR": str(tmp_path / "unused-cache")}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "idle.py"), "--ranks", "4", "--steps", "6",
                           "--work-dir", str(tmp_path / "work"), "--workers", "2"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "| driver stage | start s | end s | s | cores busy" in out
    for stage in ("_read", "prepare_ranks", "plan_stragglers", "finish_stragglers", "_impact"):
        assert f"| {stage} |" in out, out
    assert "idle core-seconds:" in out


def _scale_module():
    return benchmark_module("scale")


def _run(ranks: int, steps: int, stage_cpu: dict, driver: float, wall: float, executor: str = "pool") -> dict:
    return {"executor": executor, "cache": "cold", "ranks": ranks, "steps": steps, "stage_cpu_s": stage_cpu,
            "driver_cpu_s": driver, "wall_s": wall}


def test_fixed_costs_split_each_measure_into_a_fixed_and_a_per_step_part():
    """Runs made of known lines (fixed + per_step x steps): the split gives those lines back, the
    fixed share at the fewest steps, every stage a run timed (impact and the rarer ones too), and
    nothing for a rank count measured at one step count only or for a failed run."""
    scale = _scale_module()

    def stage(fixed, per_step, steps):
        return fixed + per_step * steps

    runs = [
        _run(8, steps, {"read": stage(0.0, 0.004, steps), "rank": stage(0.2, 0.002, steps),
                        "impact": stage(0.05, 0.001, steps), "replay": stage(0.01, 0.0005, steps)},
             driver=stage(0.3, 0.001, steps), wall=stage(0.5, 0.005, steps))
        for steps in (100, 400, 1000)
    ]
    runs.append(_run(32, 100, {"read": 1.0}, 1.0, 3.0))  # one step count: no line
    runs.append({**_run(8, 2000, {"read": 99.0}, 99.0, 99.0), "error": "failed"})  # not counted
    rows = {(r["ranks"], r["measure"]): r for r in scale.fixed_costs(runs)}
    assert {m for (ranks, m) in rows if ranks == 8} == {"read", "rank", "impact", "replay", "tasks", "driver", "wall"}
    assert not [k for k in rows if k[0] == 32]
    expect = {"read": (0.0, 0.4), "rank": (0.2, 0.2), "impact": (0.05, 0.1), "replay": (0.01, 0.05),
              "tasks": (0.26, 0.75), "driver": (0.3, 0.1), "wall": (0.5, 0.5)}
    for measure, (fixed, per_100) in expect.items():
        row = rows[(8, measure)]
        assert abs(row["fixed_s"] - fixed) < 1e-9, (measure, row)
        assert abs(row["per_100_steps_s"] - per_100) < 1e-9, (measure, row)
        assert row["steps"] == 100
        assert abs(row["fixed_share"] - fixed / (fixed + per_100)) < 1e-9, (measure, row)
    assert scale.stage_names(runs) == ["read", "rank", "impact", "replay"]  # STAGES' order, then the others
    table = scale.fixed_cost_table(scale.fixed_costs(runs))
    assert "| DEP8, pool, cold | wall | 0.50 | 0.50 | 1.00 (100 steps) | 50% |" in table
    assert scale.line_fit([(100, 1.0)]) is None and scale.line_fit([(1, 1.0), (1, 2.0)]) is None


def test_fixed_costs_least_squares_over_noisy_runs():
    """Three runs off a line: the least-squares line (not the first and last points' chord)."""
    scale = _scale_module()
    runs = [_run(8, s, {"read": y}, 0.0, y) for s, y in ((100, 1.0), (200, 2.5), (300, 3.0))]
    row = next(r for r in scale.fixed_costs(runs) if r["measure"] == "wall")
    # x mean 200, y mean 6.5/3; slope = (-100 * (1 - 6.5/3) + 0 + 100 * (3 - 6.5/3)) / 20000 = 0.01
    assert abs(row["per_100_steps_s"] - 1.0) < 1e-9 and abs(row["fixed_s"] - (6.5 / 3 - 2.0)) < 1e-9


def test_a_checkout_gets_its_compiled_kernels_built_with_its_own_code(monkeypatch, tmp_path):
    """Without its built scanner a checkout reads files under 8 MB with msgspec (an A/B of
    ``benchmarks/captures.py`` against one would be unfair): its scanner and replay are built by
    its own code, from its folder (``-m`` puts the working folder first on the path)."""
    import subprocess as sp

    scale = _scale_module()
    calls = []

    def fake_run(cmd, cwd=None, env=None, capture_output=False, text=False):
        calls.append((cmd[-1], Path(cwd), env["PYTHONPATH"].split(os.pathsep)[0]))
        return sp.CompletedProcess(cmd, 0, stdout="built ahead of time: /x.so\n", stderr="")

    monkeypatch.setattr(scale.subprocess, "run", fake_run)
    assert scale.build_kernels(tmp_path) == "scanner built ahead of time, replay built ahead of time"
    assert calls == [("profkit.ingest.scanbuild", tmp_path, str(tmp_path)),
                     ("profkit.analyze.impact_replay", tmp_path, str(tmp_path))]
    calls.clear()
    scale.build_kernels()
    assert {(c[1], c[2]) for c in calls} == {(REPO, str(REPO))}  # this checkout by default


def test_repeated_runs_keep_the_median_one_with_every_wall_time():
    mod = benchmark_module("scale")
    tries = [{"wall_s": 3.0, "events": 1}, {"error": "killed"}, {"wall_s": 1.0, "events": 2}, {"wall_s": 2.0, "events": 3}]
    kept = mod.median_run(tries)
    assert kept["wall_s"] == 2.0 and kept["events"] == 3  # the median run's own measures, not a mix
    assert kept["wall_s_all"] == [3.0, None, 1.0, 2.0]
    assert mod.median_run([{"wall_s": 1.0}, {"wall_s": 5.0}])["wall_s"] == 1.0  # the lower middle of an even count
    assert mod.median_run([{"error": "a"}, {"error": "b"}]) == {"error": "a"}


def test_nsys_exports_get_a_sqlite_floor_of_their_event_rows():
    """The floor of an nsys capture: its event rows out of SQLite, counted against SQL's own count,
    the median of the passes; and it is the floor the runs are compared with."""
    import sqlite3

    mod = benchmark_module("scale")
    files = sorted((REPO / "sample_traces" / "engine-dep4-h200-capture").rglob("*.sqlite"))
    assert files
    rows = mod.measure_floor(files, repeat=3)
    by_method = {(r["method"], r["processes"]): r for r in rows}
    expected = 0
    for f in files:
        con = sqlite3.connect(f"file:{f}?mode=ro&immutable=1", uri=True)
        tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        expected += sum(con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
                        for t in mod._SQLITE_FLOOR_QUERIES if t in tables)
        con.close()
    sqlite_rows = [r for r in rows if "SQLite" in r["method"]]
    assert ("SQLite event rows (sqlite3)", 1) in by_method and len(sqlite_rows) in (1, 3)  # 3 with ADBC
    for r in sqlite_rows:
        assert r["raw_events"] == expected and len(r["seconds_all"]) == 3
        assert r["seconds"] == sorted(r["seconds_all"])[1]
    assert mod.floor_seconds(rows) == min(r["seconds"] for r in sqlite_rows)
    json_rows = mod.measure_floor(sorted((REPO / "sample_traces" / "vllm-0.26-h200").rglob("*.json.gz")))
    assert not any("SQLite" in r["method"] for r in json_rows) and any("orjson" in r["method"] for r in json_rows)


def test_floor_passes_merge_into_each_methods_median():
    mod = benchmark_module("scale")
    row = {"file_bytes": 10, "json_bytes": 20, "raw_events": 3}
    passes = [[{**row, "method": "a", "processes": 1, "seconds": s}, {**row, "method": "a", "processes": 2, "seconds": 9.0}]
              for s in (3.0, 1.0, 2.0)]
    merged = {(r["method"], r["processes"]): r for r in mod.merge_floor_passes(passes)}
    assert merged[("a", 1)]["seconds"] == 2.0 and merged[("a", 1)]["seconds_all"] == [3.0, 1.0, 2.0]
    assert merged[("a", 2)]["seconds"] == 9.0 and merged[("a", 2)]["raw_events"] == 3
    assert len(merged) == 2


def test_a_run_waits_for_the_pools_workers_before_counting_their_cpu(monkeypatch):
    """``analyze_paths`` returns while its pool's workers exit (``PoolExecutor.close(wait=False)``);
    RUSAGE_CHILDREN counts a child only once it is reaped, so the benchmarks wait for them first
    (``reap_pool_workers``): a worker that burned 0.3 s of CPU is counted then, and none is left."""
    import multiprocessing
    import resource

    from profkit.scale.executors import START_ENV, PoolExecutor

    mod = _scale_module()
    monkeypatch.setenv(START_ENV, "fork")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    ex = PoolExecutor(1)
    assert ex.map(_burn, [(0.3,)], ["rank 0"]) == [True]
    ex.close(wait=False)
    mod.reap_pool_workers()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert not multiprocessing.active_children()
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) >= 0.25


def _burn(seconds: float) -> bool:
    import time

    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return True
