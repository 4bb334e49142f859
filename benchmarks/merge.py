"""Time, peak memory and output size of ``profkit merge`` on a simulated DEP32 capture:
Perfetto protobuf vs Chrome JSON.

    python benchmarks/merge.py [--ranks 32] [--steps 20] [--repeat 3] [--json OUT.json]

The capture is written once by ``profkit.simulate`` (Kineto JSON, one file per rank) into a
temporary folder. Every measurement runs in a fresh interpreter (this file with ``--worker``)
that loads the capture (Parquet cache off: a real parse; timed apart), then merges it into one
file (clocks not aligned: this measures the exporters) while a thread samples the RSS every 10 ms. Reported per format: merge wall and
CPU time, peak RSS of the process, the peak above the RSS right after loading (what merging
itself costs on top of the loaded events), output size and bytes per event. Medians of
``--repeat`` runs, the formats interleaved.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20
FORMATS = ("perfetto", "chrome")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS(threading.Thread):
    def __init__(self, interval_s: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.peak = _rss_bytes()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, _rss_bytes())
            self._halt.wait(self.interval_s)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        self.peak = max(self.peak, _rss_bytes())
        return self.peak


def worker(fmt: str, capture_dir: str, out_dir: str) -> dict:
    sys.path.insert(0, str(REPO))
    os.environ["PROFKIT_CACHE"] = "0"
    import profkit
    from profkit.export import merge_capture

    t0 = time.perf_counter()
    capture = profkit.load(capture_dir)
    load_s = time.perf_counter() - t0
    rss_loaded = _rss_bytes()
    sampler = PeakRSS()
    sampler.start()
    out = Path(out_dir) / ("merged.pftrace" if fmt == "perfetto" else "merged.json")
    cpu0, t0 = time.process_time(), time.perf_counter()
    result = merge_capture(capture, out, fmt=fmt, align=None)  # clock alignment is measured apart
    merge_s = time.perf_counter() - t0
    merge_cpu_s = time.process_time() - cpu0
    peak = sampler.stop()
    size = out.stat().st_size
    out.unlink()
    return {
        "format": fmt,
        "events": result.n_events,
        "ranks": len(result.ranks),
        "flows": result.n_flows,
        "load_s": load_s,
        "merge_s": merge_s,
        "merge_cpu_s": merge_cpu_s,
        "rss_loaded_mb": rss_loaded / MB,
        "peak_rss_mb": peak / MB,
        "peak_above_loaded_mb": (peak - rss_loaded) / MB,
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "output_mb": size / MB,
        "bytes_per_event": size / max(result.n_events, 1),
    }


def run_worker(fmt: str, capture_dir: Path, out_dir: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", fmt, str(capture_dir), str(out_dir)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"worker {fmt} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    head = ("format", "events", "merge s", "merge CPU s", "peak RSS MB", "peak above loaded MB", "output MB", "bytes/event")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            f"| {r['format']} | {r['events']:,} | {r['merge_s']:.2f} | {r['merge_cpu_s']:.2f} | {r['peak_rss_mb']:.0f} | "
            f"{r['peak_above_loaded_mb']:.0f} | {r['output_mb']:.1f} | {r['bytes_per_event']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(*sys.argv[2:5])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the raw runs here")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from profkit.simulate import simulate

    with tempfile.TemporaryDirectory(prefix="profkit-merge-bench-") as tmp:
        capture_dir, out_dir = Path(tmp) / "capture", Path(tmp) / "out"
        out_dir.mkdir()
        t0 = time.perf_counter()
        simulate(ranks=args.ranks, steps=args.steps, seed=args.seed, out_dir=capture_dir)
        input_mb = sum(f.stat().st_size for f in capture_dir.glob("*.json.gz")) / MB
        print(f"simulated DEP{args.ranks}, {args.steps} steps: {input_mb:.1f} MB of gzip'd Kineto JSON "
              f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        runs: dict[str, list[dict]] = {f: [] for f in FORMATS}
        for i in range(args.repeat):
            for fmt in FORMATS:
                runs[fmt].append(run_worker(fmt, capture_dir, out_dir))
                print(f"run {i + 1}/{args.repeat} {fmt}: {runs[fmt][-1]['merge_s']:.2f} s", file=sys.stderr)
    rows = []
    for fmt in FORMATS:
        med = {k: statistics.median(r[k] for r in runs[fmt]) for k, v in runs[fmt][0].items() if isinstance(v, (int, float))}
        rows.append({"format": fmt, **med})
    load_s = statistics.median(r["load_s"] for f in FORMATS for r in runs[f])
    print(f"\nDEP{args.ranks}, {args.steps} steps, input {input_mb:.1f} MB (Kineto JSON.gz); load (not included) "
          f"{load_s:.2f} s; medians of {args.repeat}; {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}\n")
    print(table(rows))
    pf, ch = rows
    print(f"\nChrome JSON / Perfetto: {ch['merge_s'] / pf['merge_s']:.1f}x the time, "
          f"{ch['output_mb'] / pf['output_mb']:.1f}x the size, {ch['peak_above_loaded_mb'] / max(pf['peak_above_loaded_mb'], 1):.1f}x the memory above loaded")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs, "medians": rows}, indent=2))


if __name__ == "__main__":
    main()
