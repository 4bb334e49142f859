"""Alignment accuracy and speed on simulated DEP-N captures with known clock skew.

    python benchmarks/align.py [--ranks 32 256] [--steps 50] [--layers 8] [--format kineto] [--json OUT]

For each size: simulate (per-host offsets up to ±25 ms, drift up to ±60 ppm), load, match
collective instances, estimate every rank's clock, apply it. Reports the time (untraced run) and
peak Python memory (a second run under tracemalloc) of ``estimate`` and ``apply_alignment``, and
the accuracy against the
simulator's truth: the largest |aligned - true| over every timestamp of every rank.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def run(ranks: int, steps: int, layers: int, fmt: str, workdir: Path) -> dict:
    import profkit
    from profkit.align import apply_alignment, estimate, to_reference
    from profkit.simulate import simulate

    out = workdir / f"dep{ranks}-{fmt}"
    t = time.perf_counter()
    truth = simulate(ranks, steps, seed=1, out_dir=out, fmt=fmt, layers=layers, offset_ms_max=25.0,
                     drift_ppm_max=60.0)
    sim_s = time.perf_counter() - t
    t = time.perf_counter()
    events = profkit.load(out).events
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    est = estimate(events)
    estimate_s = time.perf_counter() - t
    t = time.perf_counter()
    aligned = apply_alignment(events, est)
    apply_s = time.perf_counter() - t
    # peak memory in a second, traced run (tracing slows Python allocations several-fold)
    tracemalloc.start()
    estimate(events)
    _, estimate_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    apply_alignment(events, est)
    _, apply_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    r = events["rank"].to_numpy()
    off, drift = np.array(truth.offsets_ns)[r], np.array(truth.drift_ppm)[r]
    err = 0
    for col in ("start_ns", "end_ns"):
        true = to_reference(events[col].to_numpy(np.int64), off, drift, truth.t0_ns)
        err = max(err, int(np.abs(aligned[col].to_numpy(np.int64) - true).max()))
    table = est.ranks
    return {
        "ranks": ranks, "steps": steps, "layers": layers, "format": fmt, "events": len(events),
        "instance_rows": len(est.instances), "simulate_s": round(sim_s, 2), "load_s": round(load_s, 2),
        "estimate_s": round(estimate_s, 2), "estimate_peak_mb": round(estimate_peak / 2**20, 1),
        "apply_s": round(apply_s, 2), "apply_peak_mb": round(apply_peak / 2**20, 1),
        "max_error_ns": err, "residual_p90_ns_max": int(table["residual_p90_ns"].max()),
        "error_bound_ns_max": int(table["error_bound_ns"].max()), "warnings": est.warnings,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--format", choices=("kineto", "nsys"), default="kineto")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("PROFKIT_CACHE_DIR", str(Path(tmp) / "cache"))
        for n in args.ranks:
            row = run(n, args.steps, args.layers, args.format, Path(tmp))
            rows.append(row)
            print(f"DEP{n:<4} {row['events']:>9} events  estimate {row['estimate_s']:6.2f} s "
                  f"({row['estimate_peak_mb']} MB)  apply {row['apply_s']:5.2f} s  "
                  f"max error {row['max_error_ns']} ns  residual p90 {row['residual_p90_ns_max']} ns  "
                  f"bound {row['error_bound_ns_max']} ns")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
