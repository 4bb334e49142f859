"""How long ``profkit analyze`` takes on real captures, against the floor of their traces;
and, given another checkout (``--baseline``), the same captures with its code, side by side.

Why: ``benchmarks/scale.py`` measures simulated captures, one file per rank. The captures users
bring are real and shaped otherwise: a ``profkit capture`` folder gives each rank a span file
beside its torch trace (or nsys report), a vLLM one has processes that are no rank. Small ones
are all fixed cost, and a change aimed at the simulated grid can miss them, or slow them.

Each run is a fresh interpreter with a fresh parsed-trace cache (cold), timing
``profkit.scale.analyze_paths`` on the default executor (imports not timed), CPU time included
(the process and its pool's workers); each checkout's compiled scanner and replay are built first
(not timed; ``--no-build`` skips it), as a machine that has analyzed a large capture has them. The
floor is ``benchmarks/scale.py``'s, the median of as many passes as runs: the fastest gunzip +
orjson parse of the capture's ``*.json.gz`` traces (whole, or in pieces on one process or two), or
for an nsys capture the fastest read of its SQLite export's event rows (times and process or
thread, and the strings); span files not counted; "n/a" without either. With ``--baseline`` the runs
alternate, this checkout's then the other's, so both see the same machine.

    python benchmarks/captures.py                               # the torch and nsys captures in sample_traces/
    python benchmarks/captures.py CAPTURE_DIR ... --repeat 9
    python benchmarks/captures.py --baseline ../profkit-before  # this code against another checkout's
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
sys.path.insert(0, str(REPO / "benchmarks"))
import scale  # noqa: E402 - its floor and its kernel builds, for these captures too

# one run, in a fresh interpreter: the checkout to import from, the capture; prints a JSON line
_RUN = r"""
import json, os, resource, shutil, sys, tempfile, time
cache = os.environ["PROFKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="profkit-bench-cache-")
sys.path.insert(0, sys.argv[1])
from profkit.scale import analyze_paths
t0 = time.perf_counter()
try:
    analysis = analyze_paths([sys.argv[2]])
    wall = time.perf_counter() - t0
finally:
    shutil.rmtree(cache, ignore_errors=True)  # every run's cache is its own: none is left behind
sys.path.insert(0, sys.argv[3])
from scale import reap_pool_workers  # this checkout's benchmarks
reap_pool_workers()  # the pool's workers exit after the call returns: their CPU counts once they are reaped
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "ranks": len(analysis.ranks),
                  "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}))
"""


def default_captures() -> list[Path]:
    """The capture folders of ``sample_traces/`` (a ``manifest.json`` each) with torch or nsys traces."""
    return sorted(m.parent for m in SAMPLES.glob("*/*/manifest.json")
                  if (m.parent / "torch").is_dir() or (m.parent / "nsys").is_dir())


def kineto_traces(capture: Path) -> list[Path]:
    return sorted(capture.rglob("*.json.gz"))


def run_once(checkout: Path, capture: Path) -> dict:
    """One cold analysis of ``capture`` with ``checkout``'s profkit, in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _RUN, str(checkout), str(capture), str(REPO / "benchmarks")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{capture} with {checkout}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def nsys_reports(capture: Path) -> list[Path]:
    return sorted(capture.rglob("*.sqlite"))


def floor_s(capture: Path, repeat: int = 1) -> float | None:
    """``benchmarks/scale.py``'s floor of the capture's Kineto traces, else of its nsys SQLite
    exports (None without either), the median of ``repeat`` passes."""
    traces = kineto_traces(capture) or nsys_reports(capture)
    return scale.floor_seconds(scale.measure_floor(traces, repeat)) if traces else None


def summary(runs: list[dict]) -> dict:
    """Median and range of a capture's runs (wall and CPU seconds)."""
    walls, cpus = [r["wall_s"] for r in runs], [r["cpu_s"] for r in runs]
    return {"wall_s": statistics.median(walls), "wall_min_s": min(walls), "wall_max_s": max(walls),
            "cpu_s": statistics.median(cpus), "ranks": runs[0]["ranks"], "n": len(runs)}


def table(rows: list[dict], baseline: bool) -> str:
    """Markdown: per capture its ranks, size, wall (median, range), CPU and x floor; with a baseline
    the other checkout's wall and CPU beside them, and the change."""
    head = ["capture", "ranks", "MB", "wall s (median)", "range s", "CPU s", "floor s", "x floor"]
    if baseline:
        head += ["baseline wall s", "baseline CPU s", "wall change"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s, fl = r["this"], r["floor_s"]
        cells = [r["capture"], str(s["ranks"]), f"{r['mb']:.1f}", f"{s['wall_s']:.3f}",
                 f"{s['wall_min_s']:.3f}-{s['wall_max_s']:.3f}", f"{s['cpu_s']:.2f}",
                 f"{fl:.3f}" if fl else "n/a", f"{s['wall_s'] / fl:.1f}" if fl else "n/a"]
        if baseline:
            b = r["baseline"]
            cells += [f"{b['wall_s']:.3f}", f"{b['cpu_s']:.2f}", f"{(s['wall_s'] / b['wall_s'] - 1) * 100:+.0f}%"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("captures", nargs="*", type=Path, help="capture folders (default: sample_traces' torch and nsys ones)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per capture and checkout (default 5; the median is shown)")
    ap.add_argument("--baseline", type=Path, help="another checkout of profkit, run alternately with this one")
    ap.add_argument("--json", type=Path, help="also write every run here")
    ap.add_argument("--no-build", action="store_true",
                    help="do not build the checkouts' compiled scanner and replay first (without them profkit "
                         "reads files under 8 MB with msgspec)")
    args = ap.parse_args(argv)
    captures = [c.resolve() for c in args.captures] or default_captures()
    if not captures:
        ap.error("no capture given and none found in sample_traces/")
    if args.baseline is not None and not (args.baseline / "profkit" / "__init__.py").is_file():
        ap.error(f"--baseline {args.baseline}: not a profkit checkout (no profkit/__init__.py)")
    if not args.no_build:
        for checkout in (REPO, args.baseline):
            if checkout is not None:
                print(f"{checkout}: {scale.build_kernels(checkout)}", file=sys.stderr)
    rows = []
    for capture in captures:
        runs: dict[str, list[dict]] = {"this": [], "baseline": []}
        for _ in range(max(1, args.repeat)):
            runs["this"].append(run_once(REPO, capture))
            if args.baseline is not None:
                runs["baseline"].append(run_once(args.baseline, capture))
        full = capture.resolve()
        name = str(full.relative_to(SAMPLES)) if full.is_relative_to(SAMPLES) else str(capture)
        mb = sum(p.stat().st_size for p in capture.rglob("*") if p.is_file()) / 1e6
        row = {"capture": name, "mb": mb, "floor_s": floor_s(capture, args.repeat), "this": summary(runs["this"]), "runs": runs}
        if args.baseline is not None:
            row["baseline"] = summary(runs["baseline"])
        rows.append(row)
        print(f"{name}: {row['this']['wall_s']:.3f} s", file=sys.stderr)
    print(f"profkit analyze on real captures, cold cache, fresh interpreters, medians of {args.repeat}"
          + (f"; baseline: {args.baseline}" if args.baseline else ""))
    print()
    print(table(rows, args.baseline is not None))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
