"""Load time and peak memory of profkit vs Holistic Trace Analysis on the same multi-rank inputs.

    python benchmarks/ingest.py [--traces DIR] [--repeat 3] [--copies 8] [--json OUT.json]

Inputs (from the shared public traces, ``<repo>/../shared/traces`` unless ``--traces``):

1. ``hta/trace_filter_2rank/``: HTA's own 2-rank test set (ranks in the files' metadata).
2. ``hta/negative_queue_length_rank0.json.gz`` (the largest public Kineto trace here, 25 MB of
   JSON) copied ``--copies`` times as ``rank{i}.json.gz``, each copy's ``distributedInfo.rank``
   rewritten to ``i`` and gzipped again, so both tools read identical bytes with distinct ranks
   (profkit is also given ``rank_map`` by file name).

Every measurement runs in a fresh interpreter (this file with ``--worker``), so imports and
caches never leak from one tool to the other. The worker times the imports, then the load:

- profkit: ``profkit.load(dir, rank_map=...)`` with ``PROFKIT_CACHE=0`` (a real parse), and
  again with a warm parsed-trace cache (a private cache folder, filled by one unmeasured run).
- HTA: ``TraceAnalysis(trace_dir=dir)`` with its defaults (it parses ranks in a fork pool).

Memory: a thread samples the RSS of the worker plus all its children every 20 ms (the
children are HTA's pool workers) and, every 100 ms, their PSS (``/proc/PID/smaps_rollup``:
pages shared copy-on-write between a forked worker and its parent are counted once, where a
sum of RSS counts them in every process). ``ru_maxrss`` of RUSAGE_SELF and RUSAGE_CHILDREN
(the largest reaped child) is reported too. Each cell is the median of ``--repeat`` runs;
the runs of the tools are interleaved so drift on the machine hits all alike.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "traces"
BIG_TRACE = Path("hta") / "negative_queue_length_rank0.json.gz"
TWO_RANK = Path("hta") / "trace_filter_2rank"
_RANK_IN_INFO = re.compile(rb'("distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*)(\d+)')
MB = 1 << 20

TOOLS = ("profkit", "profkit (warm cache)", "HTA 0.5.0")


def reader_note(readers: list[str]) -> str | None:
    """A warning where no cold run read with profkit's compiled scanner (this Python has no numba):
    the comparison would then be of the msgspec fallback, about half the scanner's speed."""
    if not readers or any(r.startswith("scanner") for r in readers):
        return None
    return ("(not profkit's compiled scanner: this Python has no numba; `pip install profkit[fast]` for it, "
            "as the product's setup does)")


# ---------------------------------------------------------------- worker (one measurement)


class TreeSampler(threading.Thread):
    """Peak RSS (and PSS) of this process plus all its descendants, sampled in a thread."""

    def __init__(self, interval: float = 0.02, pss_every: int = 5):
        super().__init__(daemon=True)
        import psutil

        self._psutil = psutil
        self.proc = psutil.Process()
        self.interval = interval
        self.pss_every = pss_every
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_procs = 1
        self.samples = 0
        self._halt = threading.Event()

    def _tree(self) -> list:
        try:
            return [self.proc, *self.proc.children(recursive=True)]
        except self._psutil.Error:
            return [self.proc]

    def sample(self, pss: bool) -> None:
        procs = self._tree()
        rss = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
            except self._psutil.Error:
                pass  # a pool worker that just exited
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_procs = max(self.peak_procs, len(procs))
        if pss:
            total = sum(_pss(p.pid) for p in procs)
            self.peak_pss = max(self.peak_pss, total)
        self.samples += 1

    def run(self) -> None:
        tick = 0
        while not self._halt.is_set():
            self.sample(pss=tick % self.pss_every == 0)
            tick += 1
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample(pss=True)


def _pss(pid: int) -> int:
    """Proportional set size in bytes (0 when the process is gone or the kernel lacks smaps_rollup)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def worker(tool: str, trace_dir: str, rank_map: dict[str, int] | None) -> dict:
    import psutil  # the sampler's own import is part of the interpreter baseline, not of the tool

    me = psutil.Process()
    rss_start = me.memory_info().rss
    t0 = time.perf_counter()
    if tool == "hta":
        import logging

        from hta.trace_analysis import TraceAnalysis

        logging.getLogger("hta").setLevel(logging.ERROR)  # it logs a warning per file and phase
    else:
        sys.path.insert(0, str(REPO))
        import profkit
        import profkit.ingest.kineto  # noqa: F401  (imported lazily by load(); count it here)
        import profkit.ingest.loader  # noqa: F401
    import_s = time.perf_counter() - t0
    rss_base = me.memory_info().rss

    sampler = TreeSampler()
    sampler.sample(pss=True)
    sampler.start()
    cpu0 = os.times()
    t1 = time.perf_counter()
    if tool == "hta":
        analysis = TraceAnalysis(trace_dir=trace_dir)
        load_s = time.perf_counter() - t1
        frames = analysis.t.traces
        ranks = sorted(int(r) for r in frames)
        events = int(sum(len(df) for df in frames.values()))
        try:
            extra = {"profiler_steps": len(analysis.t.get_iterations())}
        except Exception:  # a trace without ProfilerStep markers
            extra = {"profiler_steps": 0}
    else:
        cap = profkit.load(trace_dir, rank_map=rank_map)
        load_s = time.perf_counter() - t1
        ranks = cap.ranks
        events = len(cap.events)
        from profkit.ingest import scanned

        if scanned._loaded():
            reader = "scanner, " + ("numba JIT" if "numba" in sys.modules else "built ahead of time")
        else:
            reader = "parsed-trace cache" if os.environ.get("PROFKIT_CACHE") == "1" else "msgspec"
        extra = {"skipped": cap.skipped, "warnings": len(cap.warnings), "reader": reader}
    cpu1 = os.times()
    sampler.stop()
    return {
        "tool": tool,
        "import_s": import_s,
        "load_s": load_s,
        "cpu_s": (cpu1.user + cpu1.system + cpu1.children_user + cpu1.children_system)
        - (cpu0.user + cpu0.system + cpu0.children_user + cpu0.children_system),
        "rss_start_mb": rss_start / MB,
        "baseline_mb": rss_base / MB,
        "peak_rss_mb": sampler.peak_rss / MB,
        "peak_pss_mb": sampler.peak_pss / MB,
        "end_rss_mb": me.memory_info().rss / MB,
        "maxrss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "maxrss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "max_procs": sampler.peak_procs,
        "samples": sampler.samples,
        "ranks": ranks,
        "events": events,
        **extra,
    }


# ---------------------------------------------------------------- driver


def make_copies(src: Path, out: Path, copies: int) -> dict[str, int]:
    """``copies`` gzip'd copies of ``src`` as rank{i}.json.gz with distributedInfo.rank = i."""
    data = gzip.decompress(src.read_bytes())
    if _RANK_IN_INFO.search(data) is None:
        sys.exit(f"{src}: no distributedInfo.rank to rewrite")
    out.mkdir(parents=True)
    rank_map = {}
    for i in range(copies):
        body, n = _RANK_IN_INFO.subn(lambda m: m.group(1) + str(i).encode(), data, count=1)
        assert n == 1
        name = f"rank{i}.json.gz"
        (out / name).write_bytes(gzip.compress(body, compresslevel=6, mtime=0))
        rank_map[name] = i
    return rank_map


def run_worker(tool: str, trace_dir: Path, rank_map: dict | None, env: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", tool, "--dir", str(trace_dir)]
    if rank_map:
        cmd += ["--rank-map", json.dumps(rank_map)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        sys.exit(f"worker {tool} on {trace_dir} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def table(results: dict, datasets: list[tuple[str, Path, dict | None]], repeat: int) -> str:
    head = (
        "| input | tool | events loaded | import s | baseline RSS MB | load s (median) | load CPU s "
        "| peak RSS MB (tree) | peak PSS MB (tree) | peak RSS − baseline MB | ru_maxrss self / children MB |"
    )
    lines = [head, "|" + "|".join(["---"] * 11) + "|"]
    for label, _, _ in datasets:
        for tool in TOOLS:
            rows = results[label][tool]
            lines.append(
                "| " + " | ".join([
                    label,
                    tool,
                    f"{rows[0]['events']:,}",
                    fmt(median(rows, "import_s")),
                    fmt(median(rows, "baseline_mb"), 0),
                    fmt(median(rows, "load_s")),
                    fmt(median(rows, "cpu_s")),
                    fmt(median(rows, "peak_rss_mb"), 0),
                    fmt(median(rows, "peak_pss_mb"), 0),
                    fmt(statistics.median(r["peak_rss_mb"] - r["baseline_mb"] for r in rows), 0),
                    f"{fmt(median(rows, 'maxrss_self_mb'), 0)} / {fmt(median(rows, 'maxrss_children_mb'), 0)}",
                ])
                + " |"
            )
    return "\n".join(lines)


def ratios(results: dict, datasets: list) -> str:
    head = ("| input | vs | load time HTA/profkit | load CPU HTA/profkit | peak RSS HTA/profkit "
            "| peak PSS HTA/profkit | peak RSS − baseline HTA/profkit |")
    lines = [head, "|" + "|".join(["---"] * 7) + "|"]
    for label, _, _ in datasets:
        hta = results[label]["HTA 0.5.0"]
        for tool in ("profkit", "profkit (warm cache)"):
            pk = results[label][tool]
            added = _added(hta) / _added(pk)
            lines.append(
                f"| {label} | {tool} | {median(hta, 'load_s') / median(pk, 'load_s'):.1f}x "
                f"| {median(hta, 'cpu_s') / median(pk, 'cpu_s'):.1f}x "
                f"| {median(hta, 'peak_rss_mb') / median(pk, 'peak_rss_mb'):.1f}x "
                f"| {median(hta, 'peak_pss_mb') / median(pk, 'peak_pss_mb'):.1f}x | {added:.1f}x |"
            )
    return "\n".join(lines)


def _added(rows: list[dict]) -> float:
    return statistics.median(r["peak_rss_mb"] - r["baseline_mb"] for r in rows)


GOALS = ((5.0, 0.5, "first goal"), (10.0, 1 / 3, "issue #16"))  # (x faster, share of HTA's peak memory)


def verdict(results: dict, datasets: list) -> str:
    """The issues' goals, cold profkit parse vs HTA: load time (wall; CPU beside it, which a busy
    machine distorts less) and peak memory (tree RSS; PSS beside it)."""
    out = []
    for label, _, _ in datasets:
        hta, pk = results[label]["HTA 0.5.0"], results[label]["profkit"]
        speed = median(hta, "load_s") / median(pk, "load_s")
        cpu = median(hta, "cpu_s") / median(pk, "cpu_s")
        mem = median(pk, "peak_rss_mb") / median(hta, "peak_rss_mb")
        pss = median(pk, "peak_pss_mb") / median(hta, "peak_pss_mb")
        for times, share, issue in GOALS:
            out.append(
                f"- {label} ({issue}): profkit (cold) is {speed:.2f}x faster in wall time ({cpu:.2f}x in CPU time; "
                f"goal {times:.0f}x: {'met' if speed >= times else 'MISSED'}) and uses {mem:.2f} of HTA's peak RSS "
                f"({pss:.2f} of its peak PSS; goal <= {share:.2f}: {'met' if mem <= share else 'MISSED'})."
            )
    return "\n".join(out)


NOTES = """\
Notes:
- Fresh interpreter per run; "import s" / "baseline RSS" are the tool's imports (profkit:
  profkit, profkit.ingest.loader and .kineto; HTA: hta.trace_analysis), not part of "load s".
  Load = profkit.load(dir, rank_map=...) with PROFKIT_CACHE=0 (cold: parses every file) or a
  warm parsed-trace cache; HTA = TraceAnalysis(trace_dir=dir). Input files are in the page cache.
- HTA runs with its defaults: ParserConfig default (JSON backend: json.loads of each whole
  file, then a DataFrame of every event; a default subset of args becomes columns), its
  fork pool of min(ranks, cpu_count) = {procs} processes, and include_last_profiler_step=False,
  so after parsing everything it drops the events of the last ProfilerStep (and GPU kernels
  not launched inside kept steps) -> fewer "events loaded" than it parsed. It also drops
  rows without dur/cat (flows, metadata, instants) and cat == "Trace". profkit keeps every
  complete and instant event (flows are counted and dropped, metadata events go to meta) in
  one Arrow-backed DataFrame, in one process, one file at a time: with its compiled scanner
  (built ahead of time once per machine, before the runs, unless --no-build), else with msgspec
  (on threads only when numba's JIT scans, i.e. the build failed and the files are 8 MB and
  more on disk, or --scan-min-bytes). Both parse every event of every file.
- Peak RSS (tree) sums RSS over the worker and its children every 20 ms; for HTA's forked
  workers that counts copy-on-write pages shared with the parent once per process. Peak PSS
  (tree, every 100 ms) counts them once; it may miss short spikes. ru_maxrss children is
  the largest single reaped child (HTA's pool workers; 0 for profkit). A worker's ru_maxrss
  starts at the driver's RSS at fork (Linux keeps it across exec): the driver stays small.
- Load CPU s = user+sys of the worker and its reaped children during the load."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="shared traces folder (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool and input; the median is reported")
    ap.add_argument("--copies", type=int, default=8, help="ranks made from the large trace")
    ap.add_argument("--json", type=Path, help="also write every run's raw numbers here")
    ap.add_argument("--scan-min-bytes", type=int, metavar="N",
                    help="profkit: the scanner's file-size threshold while it is not built "
                         "(PROFKIT_SCAN_MIN_BYTES; default: profkit's own, 8 MB on disk)")
    ap.add_argument("--no-build", action="store_true",
                    help="profkit without a built scanner (a machine that never read a large trace: an empty "
                         "PROFKIT_NATIVE_DIR; files under the threshold are decoded with msgspec)")
    ap.add_argument("--worker", choices=("profkit", "hta"), help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--rank-map", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", nargs=3, metavar=("SRC", "OUT", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeat < 1 or args.copies < 1:
        ap.error("--repeat and --copies must be at least 1")

    if args.prepare:
        src, out, n = args.prepare
        print(json.dumps(make_copies(Path(src), Path(out), int(n))))
        return
    if args.worker:
        rank_map = json.loads(args.rank_map) if args.rank_map else None
        print(json.dumps(worker(args.worker, args.dir, rank_map)))
        return

    # The driver stays small and imports neither tool: a child starts with its parent's RSS
    # as its ru_maxrss (Linux keeps the high-water mark across exec), and libraries the
    # driver mapped would share pages with the workers and lower their PSS.
    check = subprocess.run([sys.executable, "-c", "import psutil, hta.trace_analysis"], capture_output=True, text=True)
    if check.returncode != 0:  # HTA 0.5.0 needs psutil too
        last = (check.stderr.strip().splitlines() or ["import failed"])[-1]
        sys.exit(f"{last}\n(pip install HolisticTraceAnalysis==0.5.0 psutil)")

    big, two = args.traces / BIG_TRACE, args.traces / TWO_RANK
    for p in (big, two):
        if not p.exists():
            sys.exit(f"missing input {p} (use --traces DIR)")
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="profkit-bench-"))
    try:
        copies_dir = tmp / f"{args.copies}rank"
        print(f"making {args.copies} re-ranked copies of {big} ...", file=sys.stderr)
        prep = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--prepare", str(big), str(copies_dir), str(args.copies)],
            capture_output=True, text=True,
        )
        if prep.returncode != 0:
            sys.exit(f"preparing copies failed:\n{prep.stderr[-4000:]}")
        copies_map = json.loads(prep.stdout)
        datasets = [
            (f"HTA 2-rank set ({TWO_RANK.name})", two, None),
            (f"{big.name.split('.')[0]} x{args.copies} ranks", copies_dir, copies_map),
        ]
        for _, d, _ in datasets:  # page cache: no tool pays the first disk read
            for f in Path(d).iterdir():
                with open(f, "rb") as fh:
                    while fh.read(1 << 20):
                        pass

        if not args.no_build:  # once per machine, as profkit does on its first large trace: not measured
            subprocess.run([sys.executable, "-m", "profkit.ingest.scanbuild"], cwd=REPO, check=False,
                           stdout=subprocess.DEVNULL)
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("PROFKIT_")}
        scan = {} if args.scan_min_bytes is None else {"PROFKIT_SCAN_MIN_BYTES": str(args.scan_min_bytes)}
        if args.no_build:
            scan["PROFKIT_NATIVE_DIR"] = str(tmp / "native")
        envs = {
            "profkit": {**base_env, **scan, "PROFKIT_CACHE": "0"},
            "profkit (warm cache)": {**base_env, **scan, "PROFKIT_CACHE": "1", "PROFKIT_CACHE_DIR": str(tmp / "cache")},
            "HTA 0.5.0": base_env,
        }
        worker_of = {"profkit": "profkit", "profkit (warm cache)": "profkit", "HTA 0.5.0": "hta"}
        results: dict = {label: {t: [] for t in TOOLS} for label, _, _ in datasets}
        for label, d, rank_map in datasets:
            run_worker("profkit", d, rank_map, envs["profkit (warm cache)"])  # fill the cache, unmeasured
            for rep in range(args.repeat):
                for tool in TOOLS:
                    r = run_worker(worker_of[tool], d, rank_map, envs[tool])
                    print(f"  {label} | {tool} | run {rep + 1}: load {r['load_s']:.2f} s, peak RSS "
                          f"{r['peak_rss_mb']:.0f} MB, {r['events']:,} events, ranks {r['ranks']}"
                          + (f", reader: {r['reader']}" if r.get("reader") else ""), file=sys.stderr)
                    results[label][tool].append(r)
            want = sorted((rank_map or {}).values()) or None
            for tool in TOOLS:
                got = results[label][tool][0]["ranks"]
                if want is not None and got != want:
                    sys.exit(f"{label}: {tool} loaded ranks {got}, expected {want}")
                if tool.startswith("profkit") and results[label][tool][0].get("skipped"):
                    sys.exit(f"{label}: {tool} skipped inputs: {results[label][tool][0]['skipped']}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    procs = max(r["max_procs"] for r in results[datasets[-1][0]]["HTA 0.5.0"]) - 1
    print(f"\n## profkit vs HTA 0.5.0: load time and peak memory (median of {args.repeat} runs)\n")
    driver_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}; "
          f"benchmark took {time.perf_counter() - t_start:.0f} s (driver max RSS {driver_mb:.0f} MB).\n")
    readers = sorted({r["reader"] for by_tool in results.values() for r in by_tool["profkit"] if r.get("reader")})
    print(f"profkit's reader in the cold runs: {', '.join(readers)}.\n")
    note = reader_note(readers)
    if note:
        print(note + "\n")
    print(table(results, datasets, args.repeat))
    print("\nRatios (HTA / profkit; above 1 = profkit faster / smaller):\n")
    print(ratios(results, datasets))
    print("\nGoals (first goal: at least 5x faster and at most half HTA's peak memory; issue #16: 10x and a third),"
          " measured in this run:\n")
    print(verdict(results, datasets))
    print()
    print(NOTES.format(procs=procs))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
