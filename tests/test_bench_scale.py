"""``benchmarks/scale.py --quick`` runs end to end and prints its table (a smoke test, not a measurement)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        idle = importlib.import_module("idle")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
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
