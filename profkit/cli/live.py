"""``profkit demo --live``: run the bundled engine briefly on this machine's CPU, then analyze it."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

LIVE_ARGS = ["--ranks", "4", "--steps", "24", "--device", "cpu", "--profile-steps", "8:24",
             "--inject", "sleep:rank=2,every=4,ms=20,start=9"]


def run_live(out_dir: Path) -> Path:
    """Run 4 Gloo ranks with an injected straggler (rank 2); return the torch.profiler trace folder."""
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("profkit demo --live runs the bundled engine, which needs torch (pip install torch)")
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / "trace"
    cmd = [sys.executable, "-m", "profkit.engine", *LIVE_ARGS, "--out", str(out_dir),
           "--truth", str(out_dir / "truth.json"), "--torch-profile", str(trace)]
    print("running: " + " ".join(cmd[1:]), file=sys.stderr)
    proc = subprocess.run(cmd, text=True, stdout=sys.stderr, stderr=sys.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"profkit demo --live: the engine failed (exit {proc.returncode})")
    print(f"injected truth: {out_dir / 'truth.json'} (rank 2 sleeps 20 ms every 4 steps)\n", file=sys.stderr)
    return trace
