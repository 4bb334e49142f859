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
