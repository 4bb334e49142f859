"""When the cores sit idle during ``profkit.scale.analyze_paths``: the driver's own stages, timed,
beside the machine's CPU use sampled every ``--interval`` s.

Why: wall time on a pool is the tasks' CPU over the workers plus whatever the driver does while
they wait. Issue #16's thirteenth round found ~9 s of a 37 s DEP32 x 1,000 run in which the
driver worked alone; this prints that, stage by stage, so the next change can be aimed at it and
its effect seen. The driver's stages are timed by wrapping the functions ``pipeline.run_stages``
calls (names of this version of profkit); the CPU use is the whole machine's (``/proc/stat``:
run it on a quiet machine). Linux only.

    python benchmarks/idle.py                                   # DEP32 x 100, simulated once
    python benchmarks/idle.py --ranks 32 --steps 1000           # the issue's capture (~40 s)
    python benchmarks/idle.py --capture DIR --workers 2         # any capture

A cold parsed-trace cache (a fresh ``PROFKIT_CACHE_DIR``) unless ``--warm``.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# (module, function): what the driver does between and beside the maps, in ``run_stages`` order
DRIVER_STAGES = [
    ("profkit.scale.run", "_read"),
    ("profkit.analyze.pipeline", "prepare_ranks"),
    ("profkit.analyze.pipeline", "_sync_names"),
    ("profkit.analyze.pipeline", "_moved"),
    ("profkit.analyze.pipeline", "_collectives"),
    ("profkit.analyze.pipeline", "plan_stragglers"),
    ("profkit.analyze.pipeline", "_submit_programs"),
    ("profkit.analyze.pipeline", "finish_stragglers"),
    ("profkit.analyze.pipeline", "_impact"),
    ("profkit.analyze.pipeline", "rank_summary"),
    ("profkit.analyze.pipeline", "verdict_consistency"),
]


class Sampler(threading.Thread):
    """The machine's busy fraction (0..1 over all cores) every ``interval`` s, from ``/proc/stat``."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True, name="idle-sampler")
        self.interval, self.samples, self.stopped = interval, [], threading.Event()

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        return vals[3] + vals[4], sum(vals)  # idle + iowait, all

    def run(self) -> None:
        prev = self._read()
        while not self.stopped.wait(self.interval):
            now = self._read()
            total = now[1] - prev[1]
            if total > 0:
                self.samples.append((time.perf_counter(), 1.0 - (now[0] - prev[0]) / total))
            prev = now


def timed(log: list, t0: float):
    """Wrap the driver's stage functions: (start, end, name) of every call on the main thread."""
    undo = []
    for module, name in DRIVER_STAGES:
        mod = importlib.import_module(module)
        fn = getattr(mod, name, None)
        if fn is None:
            continue

        def wrap(fn, label):
            @functools.wraps(fn)
            def inner(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    if threading.current_thread() is threading.main_thread():
                        log.append((start - t0, time.perf_counter() - t0, label))
            return inner

        setattr(mod, name, wrap(fn, name))
        undo.append((mod, name, fn))
    return undo


def busy_between(samples: list, t0: float, a: float, b: float) -> float:
    """Mean busy fraction of the samples taken in [a, b] (seconds from ``t0``); NaN when none."""
    got = [u for t, u in samples if a <= t - t0 <= b]
    return sum(got) / len(got) if got else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, help="a capture folder (default: a simulated one, see --ranks/--steps)")
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "profkit-scale",
                    help="where the simulated capture is kept (benchmarks/scale.py's default)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between CPU samples")
    ap.add_argument("--warm", action="store_true", help="keep the parsed-trace cache (default: a fresh one)")
    args = ap.parse_args()
    if not Path("/proc/stat").exists():
        print("needs /proc/stat (Linux)", file=sys.stderr)
        return 2
    capture = args.capture
    if capture is None:
        from scale import capture_dir  # benchmarks/scale.py: simulated once, kept

        capture = capture_dir(args.work_dir, args.ranks, args.steps, "kineto")
    cache = None
    if not args.warm:
        cache = tempfile.TemporaryDirectory(prefix="profkit-idle-cache-")
        os.environ["PROFKIT_CACHE_DIR"] = cache.name
        os.environ.pop("PROFKIT_CACHE", None)
    from profkit.scale import analyze_paths

    cores = os.cpu_count() or 1
    log: list = []
    sampler = Sampler(args.interval)
    t0 = time.perf_counter()
    undo = timed(log, t0)
    sampler.start()
    try:
        analyze_paths([capture], executor="pool", workers=args.workers)
    finally:
        wall = time.perf_counter() - t0
        sampler.stopped.set()
        sampler.join()
        for mod, name, fn in undo:
            setattr(mod, name, fn)
        if cache is not None:
            cache.cleanup()
    samples = sampler.samples
    idle_core_s = sum((1.0 - u) * cores * args.interval for _, u in samples)
    print(f"\n{capture}: {wall:.2f} s on a {args.workers}-worker pool ({cores} cores), "
          f"{len(samples)} CPU samples every {args.interval:g} s\n")
    print("| driver stage | start s | end s | s | cores busy (of " + str(cores) + ") |")
    print("|---|---|---|---|---|")
    for a, b, name in sorted(log):
        if b - a >= 0.005:
            print(f"| {name} | {a:.2f} | {b:.2f} | {b - a:.2f} | {busy_between(samples, t0, a, b) * cores:.2f} |")
    print(f"\nidle core-seconds: {idle_core_s:.1f} of {wall * cores:.1f} "
          f"({100 * idle_core_s / max(wall * cores, 1e-9):.0f}%): time the work could not fill")
    print("\nbusy cores per second: " + " ".join(
        f"{s}:{v * cores:.1f}" for s, v in per_second(samples, t0)))
    return 0


def per_second(samples: list, t0: float) -> list[tuple[int, float]]:
    bins: dict[int, list[float]] = {}
    for t, u in samples:
        bins.setdefault(int(t - t0), []).append(u)
    return [(s, sum(v) / len(v)) for s, v in sorted(bins.items())]


if __name__ == "__main__":
    sys.exit(main())
