"""How ``profkit.scale.analyze_paths`` scales with ranks and steps, per executor, against the floor.

    python benchmarks/scale.py                      # DEP8x100, DEP32x100, DEP32x1000, DEP64x100
    python benchmarks/scale.py --full               # + DEP64x1000 and DEP256x200
    python benchmarks/scale.py --ranks 8,32 --steps 100 --executors pool,dask
    python benchmarks/scale.py --quick              # DEP8x20, serial and pool (a smoke test)
    python benchmarks/scale.py --repeat 3           # 3 passes (floor, then every run): the medians
    python benchmarks/scale.py --format nsys        # the same captures as nsys SQLite exports

Captures are simulated once (``profkit simulate --ranks N --steps S --seed 1``, Kineto JSON.gz,
one file per rank) and kept under ``--work-dir`` (default /tmp/profkit-scale); generating them
is not measured, nor is building profkit's compiled JSON scanner and impact replay (once per
machine, before the runs; ``--no-build`` leaves them to the first run that reads a large file). Every measurement runs
in a fresh interpreter (this file with ``--child``), so each run's peak memory is its own:

- cold: ``PROFKIT_CACHE_DIR`` is a fresh folder (every file is parsed and its cache entry written);
- warm: the same folder again (the parsed-trace cache is read instead).

Per run: the wall time of ``analyze_paths`` (imports excluded, executor start-up included), the
driver's peak RSS (the child's own high-water mark, ``VmHWM``: RUSAGE_CHILDREN would add the
pool's workers, and ``ru_maxrss`` of RUSAGE_SELF starts at the RSS of whoever forked it), each
worker's peak RSS (``analysis.run_stats.peak_rss_bytes``, max per worker: as the workers measure
it), events and events/s. Growth: milliseconds per rank-step and its ratio to the smallest run of the
same executor and cache (1.0 everywhere = time linear in ranks x steps), and the exponents of
``time ~ ranks^a`` (at fixed steps) and ``time ~ steps^b`` (at fixed ranks).

The floor, per capture: how fast this machine can only read the raw files (bytes), gunzip them
(``gzip``, streaming ``zlib``, and ``isal`` / ``zlib-ng`` where installed) and parse the JSON
(``orjson``: whole files, up to 100 MB of input, and ~256 KB pieces as profkit's reader does) in
one process and in two; for nsys exports, take each event's start, end and process or thread, and
the strings, out of SQLite (``sqlite3``; and straight into Arrow with the ADBC driver, in one process
and in two). The table's ``x floor`` is a run's wall time over the fastest parse (or SQLite read).
One measurement each is noisy on a shared VM (a DEP8 x 100 floor measured 0.31 s and 0.47 s in two
runs): ``--repeat N`` makes N passes over each capture, each the floor and then every run once
(so floor and runs see the machine at the same minutes), and takes the medians. Prints markdown tables, the CPU time per stage, and whether the goals of issues #9 and #16 are met; writes a
plotly figure to ``--out`` (default benchmarks/results/scale.html) and raw runs to ``--json``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import itertools
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20
GB = 1 << 30
CHUNK = 1 << 20
DEFAULT_GRID = [(8, 100), (32, 100), (32, 1000), (64, 100)]
FULL_EXTRA = [(64, 1000), (256, 200)]
QUICK_GRID = [(8, 20)]
EXECUTORS = ("serial", "pool", "dask")
CACHES = ("cold", "warm")
COLORS = {"serial": "#636efa", "pool": "#ef553b", "dask": "#00cc96"}  # one per executor in both panels; warm dotted
TRACE_SUFFIXES = (".json.gz", ".json", ".sqlite")
NOT_TRACES = {"truth.json", "expert_loads.json", "manifest.json"}
WHOLE_PARSE_MAX_BYTES = 100 * MB  # gzip'd input up to which the whole-file parse is measured too
PIECE = 256 << 10  # JSON bytes per orjson parse in the chunked floor (as profkit.ingest.jsonio)
_CUT = re.compile(rb"\}\s*,\s*\{")  # between two events of the traceEvents array
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')

# issue #9's goals on the 2-core machine
GOAL_DEP32 = (32, 1000, 60.0, 2 * GB)  # ranks, steps, wall s, driver peak bytes
GOAL_DEP256 = (256, 200, 24 * GB)  # ranks, steps, memory of the driver plus every worker
# issue #16's goals (cold runs): close to the read/parse floor
GOAL_X_FLOOR = 2.5  # every cold run's wall time over its floor
GOAL16_DEP32 = (32, 1000, 30.0, "pool", 2)  # ranks, steps, wall s, executor, workers
GOAL16_DEP256 = (256, 200, 3 * GB)  # ranks, steps, driver plus every worker's peak
STAGES = ("read", "prepare", "rank", "causes", "finish", "impact")  # first in the tables; any other stage a run has follows
LINEAR_EXPONENT_MAX = 1.15  # time ~ ranks^a with a at most this counts as linear


# ---------------------------------------------------------------- child (one measurement)


def child(spec: dict) -> dict:
    """One ``analyze_paths`` run in this fresh interpreter: wall time, memory, events."""
    sys.path.insert(0, str(REPO))
    t0 = time.perf_counter()
    from profkit.scale import analyze_paths

    import_s = time.perf_counter() - t0
    # the pool gets its worker count explicitly: left to itself it runs small captures in-process
    workers = spec["workers"] or (os.cpu_count() if spec["executor"] == "pool" else None)
    options = {"executor": spec["executor"], "workers": workers}
    if spec.get("scheduler"):
        options["scheduler"] = spec["scheduler"]
    elif spec["executor"] == "dask":
        options["dask_local"] = spec["workers"] or os.cpu_count()
    t1, c1 = time.perf_counter(), time.process_time()
    analysis = analyze_paths([spec["capture"]], **options)
    wall_s, driver_cpu_s = time.perf_counter() - t1, time.process_time() - c1
    reap_pool_workers()  # for RUSAGE_CHILDREN below
    stats = getattr(analysis, "run_stats", None)
    workers = worker_peaks(stats)
    in_driver = workers.pop(f"{socket.gethostname()}:{os.getpid()}", None)  # tasks the driver ran itself
    return {
        "import_s": import_s,
        "wall_s": wall_s,
        "events": events_of(analysis),
        "driver_peak_bytes": peak_rss_bytes(),
        "driver_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # KiB on Linux
        "worker_peak_bytes": workers,  # other processes only: the driver's own tasks are in its peak
        "tasks_in_driver": in_driver is not None,
        "children_maxrss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "tasks": 0 if stats is None else len(stats),
        "stage_wall_s": stage_walls(stats),
        "stage_cpu_s": stage_walls(stats, "cpu_s"),
        "driver_cpu_s": driver_cpu_s,  # the driver's own CPU (its reduces; with serial, every task too)
        "workers": workers_used(stats),
    }


def median_run(tries: list[dict]) -> dict:
    """Of repeated runs, the one with the median wall time (the lower of the two middle ones), every
    run's wall time beside it in ``wall_s_all``; the first error if no run finished."""
    done = sorted((r for r in tries if "error" not in r), key=lambda r: r["wall_s"])
    if not done:
        return tries[0]
    return {**done[(len(done) - 1) // 2], "wall_s_all": [r.get("wall_s") for r in tries]}


def merge_floor_passes(passes: list[list[dict]]) -> list[dict]:
    """Floor rows of several passes (each ``measure_floor`` once) as one: per method and process
    count, the median of its passes' seconds, each pass's in ``seconds_all``."""
    merged: dict[tuple[str, int], dict] = {}
    for rows in passes:
        for row in rows:
            key = (row["method"], row["processes"])
            merged.setdefault(key, {**row, "seconds_all": []})["seconds_all"].append(row["seconds"])
    for row in merged.values():
        row["seconds"] = statistics.median(row["seconds_all"])
    return list(merged.values())


def reap_pool_workers(timeout_s: float = 60.0) -> None:
    """Wait until the pool's workers have exited and been reaped: ``analyze_paths`` returns while
    they exit (``PoolExecutor.close``), and RUSAGE_CHILDREN counts only children already waited for.
    The pool's manager thread joins them, then ends."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(timeout_s)


def peak_rss_bytes() -> int:
    """This process's peak RSS: ``VmHWM``, else ``ru_maxrss`` of RUSAGE_SELF.

    Why not ``ru_maxrss`` first: Linux carries the RSS high-water mark over fork and exec, so a
    process started by a large one reports at least the parent's RSS at the fork (measured: a
    child of an 800 MB parent says 813 MB, VmHWM 13 MB). VmHWM belongs to this address space only.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker_peaks(stats) -> dict[str, int]:
    """Peak RSS per worker from ``run_stats`` (empty when the run kept no task statistics)."""
    if stats is None or len(stats) == 0 or "peak_rss_bytes" not in stats:
        return {}
    peaks = stats.dropna(subset=["peak_rss_bytes"]).groupby("worker")["peak_rss_bytes"].max()
    return {str(w): int(p) for w, p in peaks.items()}


def stage_walls(stats, column: str = "wall_s") -> dict[str, float]:
    """Sum of task wall time (or ``cpu_s``: CPU time, which a busy machine inflates less) per stage,
    over all workers."""
    if stats is None or len(stats) == 0 or column not in stats:
        return {}
    return {str(k): float(v) for k, v in stats.groupby("stage")[column].sum().items()}


def workers_used(stats) -> int:
    """Processes that ran tasks (the driver included when it ran some itself)."""
    if stats is None or len(stats) == 0 or "worker" not in stats:
        return 0
    return int(stats["worker"].nunique())


def events_of(analysis) -> int:
    """Events profkit read: the loaded parts' counts, else the largest per-stage sum of task events."""
    capture = getattr(analysis, "capture", None)
    parts = getattr(capture, "parts", None)
    if parts is not None and len(parts) and "n_events" in parts:
        return int(parts["n_events"].sum())
    stats = getattr(analysis, "run_stats", None)
    if stats is not None and len(stats) and "events" in stats:
        return int(stats.groupby("stage")["events"].sum().max())
    events = getattr(analysis, "events", None)
    return 0 if events is None else len(events)


def floor_child(spec: dict) -> dict:
    """The floor in a fresh interpreter, so its parses never raise this benchmark's own RSS (which
    every later child would inherit in ``ru_maxrss``)."""
    return {"rows": measure_floor([Path(p) for p in spec["files"]], spec.get("repeat", 1))}


def run_child(spec: dict, env: dict[str, str], timeout_s: float) -> dict:
    """Run ``child`` in a fresh interpreter (own session, so a timeout ends its workers too)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        why = "killed (out of memory?)" if proc.returncode == -signal.SIGKILL else f"exit {proc.returncode}"
        tail = err.strip().splitlines()[-1] if err.strip() else ""
        return {"error": f"{why}: {tail}"[:200]}
    return json.loads(lines[-1])


# ---------------------------------------------------------------- captures


def capture_dir(work_dir: Path, ranks: int, steps: int, fmt: str) -> Path:
    """The simulated DEP``ranks`` x ``steps`` capture, generated once and kept under ``work_dir``."""
    out = work_dir / f"dep{ranks}x{steps}-{fmt}-seed1"
    done = out / ".complete"
    if done.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    say(f"simulating DEP{ranks} x {steps} steps ({fmt}) into {out} (not measured)")
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "profkit", "simulate", "--ranks", str(ranks), "--steps", str(steps), "--seed", "1",
           "--format", fmt, "-o", str(out), "-q"]
    subprocess.run(cmd, check=True, cwd=REPO, env=child_env(None))
    done.write_text(f"{time.perf_counter() - t0:.1f} s\n")
    return out


def trace_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(TRACE_SUFFIXES) and p.name not in NOT_TRACES)


def child_env(cache_dir: Path | None, checkout: Path = REPO) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if cache_dir is not None:
        env["PROFKIT_CACHE_DIR"] = str(cache_dir)
        env.pop("PROFKIT_CACHE", None)
    return env


# ---------------------------------------------------------------- the floor


def _read(path: Path) -> tuple[int, int, int]:
    return len(path.read_bytes()), 0, 0


def _gzip(path: Path) -> tuple[int, int, int]:
    with gzip.open(path, "rb") as fh:
        return path.stat().st_size, len(fh.read()), 0


def _zlib_stream(path: Path) -> tuple[int, int, int]:
    """Streaming inflate in 1 MiB chunks, output dropped: no whole-file buffer."""
    out = 0
    inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            out += len(inflate.decompress(chunk))
            while inflate.unused_data:  # concatenated gzip members
                rest = inflate.unused_data
                out += len(inflate.flush())
                inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
                out += len(inflate.decompress(rest))
        out += len(inflate.flush())
    return path.stat().st_size, out, 0


def _accelerators() -> str:
    """Which of the ``fast`` extra's modules the runs had (isal: gunzip; numba: the impact replay)."""
    import importlib.util

    have = [m for m in ("isal", "numba") if importlib.util.find_spec(m) is not None]
    off = " (PROFKIT_NO_JIT set: numpy replay)" if os.environ.get("PROFKIT_NO_JIT") else ""
    return f"fast extra: {', '.join(have) or 'none'}{off}"


def build_kernels(checkout: Path = REPO) -> str:
    """Build ``checkout``'s compiled JSON scanner (``ingest/scanbuild.py``) and impact replay
    (``analyze/impact_replay.py``) before any run, as a machine that has analyzed a large capture
    once has them: their one-time builds (~18 s and ~10 s) are not part of a run. Without them a
    checkout reads files under 8 MB with msgspec (``benchmarks/captures.py`` builds the other
    checkout of an A/B too). Run from the checkout: ``-m`` puts the working folder first on the path."""
    said = []
    for module in ("profkit.ingest.scanbuild", "profkit.analyze.impact_replay"):
        done = subprocess.run([sys.executable, "-m", module], cwd=checkout, env=child_env(None, checkout),
                              capture_output=True, text=True)
        lines = (done.stdout.strip() or done.stderr.strip() or "not built").splitlines()
        said.append(lines[-1].split(":")[0] if done.returncode == 0 else lines[-1])
    return "scanner " + said[0] + ", replay " + said[1]


def _isal(path: Path) -> tuple[int, int, int]:
    from isal import igzip

    with igzip.open(path, "rb") as fh:
        return path.stat().st_size, len(fh.read()), 0


def _zlib_ng(path: Path) -> tuple[int, int, int]:
    from zlib_ng import gzip_ng

    with gzip_ng.open(path, "rb") as fh:
        return path.stat().st_size, len(fh.read()), 0


def _orjson(path: Path) -> tuple[int, int, int]:
    """gunzip + ``orjson.loads``: what any JSON trace reader must at least do."""
    import orjson

    with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as fh:
        data = fh.read()
    doc = orjson.loads(data)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return path.stat().st_size, len(data), len(events)


def _orjson_pieces(path: Path) -> tuple[int, int, int]:
    """Streaming gunzip + ``orjson`` over ~256 KB pieces of the ``traceEvents`` array, cut between
    events: a whole-document parse of a large file allocates and faults in far more memory, so
    pieces are what a fast reader does (``profkit.ingest.jsonio`` too). Pieces whose cut fell
    inside a string are re-joined with the next one.
    """
    import orjson

    out, events, pending, started = 0, 0, b"", False
    inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16) if path.name.endswith(".gz") else None
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            data = inflate.decompress(chunk) if inflate else chunk
            out += len(data)
            pending += data
            if not started:
                at = _EVENTS_KEY.search(pending)
                if at is None:
                    continue
                pending, started = pending[at.end():], True
            events_in, pending = _parse_pieces(pending)
            events += events_in
    tail = pending.rstrip()
    end = tail.rfind(b"]")  # the array's end; whatever follows it is the trace's other keys
    while end > 0:
        try:
            events += len(orjson.loads(b"[" + tail[:end] + b"]"))
            break
        except orjson.JSONDecodeError:
            end = tail.rfind(b"]", 0, end)
    return path.stat().st_size, out, events


def _parse_pieces(pending: bytes) -> tuple[int, bytes]:
    """Parse whole ~``PIECE``-byte runs of events off the front of ``pending``: (events, the rest)."""
    import orjson

    events, start, at = 0, 0, PIECE
    while len(pending) - start > at:
        cut = _CUT.search(pending, start + at)
        if cut is None:
            break
        try:
            events += len(orjson.loads(b"[" + pending[start:cut.start() + 1] + b"]"))
        except orjson.JSONDecodeError:  # the cut fell inside a string: try the next one
            at = cut.end() - start
            continue
        start, at = cut.end() - 1, PIECE
    return events, pending[start:]


# what any reader of an nsys export must take from it: each event's times and process or thread
# (profkit reads more: names, ids, devices), and the strings that name events
_SQLITE_FLOOR_QUERIES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": '"start", "end", "globalPid"',
    "CUPTI_ACTIVITY_KIND_MEMCPY": '"start", "end", "globalPid"',
    "CUPTI_ACTIVITY_KIND_MEMSET": '"start", "end", "globalPid"',
    "CUPTI_ACTIVITY_KIND_RUNTIME": '"start", "end", "globalTid"',
    "NVTX_EVENTS": '"start", "end", "globalTid"',
    "OSRT_API": '"start", "end", "globalTid"',
    "StringIds": '"id", "value"',
}


def _sqlite_queries(path: Path) -> list[str]:
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        con.close()
    return [f'SELECT {cols} FROM "{t}"' for t, cols in _SQLITE_FLOOR_QUERIES.items() if t in tables]


def _sqlite_rows(path: Path) -> tuple[int, int, int]:
    """The event rows through the standard library's sqlite3 (a tuple per row)."""
    import sqlite3

    rows = 0
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        for q in _sqlite_queries(path):
            rows += len(con.execute(q).fetchall())
    finally:
        con.close()
    return path.stat().st_size, 0, rows


def _sqlite_arrow(path: Path) -> tuple[int, int, int]:
    """The event rows straight into Arrow through the ADBC SQLite driver (profkit's fast path)."""
    import adbc_driver_sqlite.dbapi as adbc

    rows = 0
    with adbc.connect(f"file:{path}?mode=ro&immutable=1") as con:
        for q in _sqlite_queries(path):
            with con.cursor() as cur:
                cur.execute(q)
                rows += cur.fetch_arrow_table().num_rows
    return path.stat().st_size, 0, rows


def floor_methods(files: list[Path]) -> list[tuple[str, object, int]]:
    """(label, function, processes) for what is installed and applies to these files."""
    methods: list[tuple[str, object, int]] = [("read bytes", _read, 1)]
    if files and all(p.name.endswith(".sqlite") for p in files):
        methods.append(("SQLite event rows (sqlite3)", _sqlite_rows, 1))
        try:
            __import__("adbc_driver_sqlite")
        except ImportError:
            return methods
        return methods + [("SQLite event rows -> Arrow (ADBC)", _sqlite_arrow, 1),
                          ("SQLite event rows -> Arrow (ADBC)", _sqlite_arrow, 2)]
    if not all(p.name.endswith(".gz") for p in files):
        return methods
    methods += [("gzip.open().read()", _gzip, 1), ("zlib streaming (1 MiB chunks)", _zlib_stream, 1)]
    for module, label, fn in (("isal", "isal igzip", _isal), ("zlib_ng", "zlib-ng gzip_ng", _zlib_ng)):
        try:
            __import__(module)
        except ImportError:
            continue
        methods.append((label, fn, 1))
    if all(p.name.endswith((".json.gz", ".json")) for p in files):
        if sum(p.stat().st_size for p in files) <= WHOLE_PARSE_MAX_BYTES:  # slow and ~6x the JSON in RAM
            methods.append(("gunzip + orjson.loads (whole file)", _orjson, 1))
        methods += [("gunzip + orjson (256 KB pieces)", _orjson_pieces, 1),
                    ("gunzip + orjson (256 KB pieces)", _orjson_pieces, 2)]
    return methods


def measure_floor(files: list[Path], repeat: int = 1) -> list[dict]:
    """Each floor method over every file, ``repeat`` passes of every method: seconds (each method's
    median pass, each pass in ``seconds_all``: ``merge_floor_passes``), compressed and JSON bytes,
    raw trace events (or SQLite rows)."""
    return merge_floor_passes([_floor_pass(files) for _ in range(max(repeat, 1))])


def _floor_pass(files: list[Path]) -> list[dict]:
    """Each floor method over every file once."""
    rows = []
    for label, fn, procs in floor_methods(files):
        if procs == 1:
            t0 = time.perf_counter()
            sizes = [fn(p) for p in files]
            seconds = time.perf_counter() - t0
        else:
            with concurrent.futures.ProcessPoolExecutor(procs) as pool:
                list(pool.map(_read, files[:procs]))  # start the workers outside the timing
                t0 = time.perf_counter()
                sizes = list(pool.map(fn, files))
                seconds = time.perf_counter() - t0
        rows.append({
            "method": label, "processes": procs, "seconds": seconds,
            "file_bytes": sum(s[0] for s in sizes), "json_bytes": sum(s[1] for s in sizes), "raw_events": sum(s[2] for s in sizes),
        })
    return rows


def floor_seconds(rows: list[dict]) -> float | None:
    """The floor a run is compared to: the fastest parse (JSON) or SQLite rows read (nsys), else
    gunzip, else read, measured."""
    for key in ("orjson", "SQLite", "gz", "read"):
        times = [r["seconds"] for r in rows if key in r["method"] or (key == "gz" and "zlib" in r["method"])]
        if times:
            return min(times)
    return None


# ---------------------------------------------------------------- tables and growth


def fmt_mb(n: int | None) -> str:
    return "n/a" if not n else f"{n / MB:,.0f}"


def growth(runs: list[dict]) -> None:
    """Adds ``ms_per_rank_step`` and ``vs_smallest`` (per executor and cache) to each good run."""
    good = [r for r in runs if "error" not in r]
    for key, group in itertools.groupby(sorted(good, key=_series), key=_series):
        group = list(group)
        smallest = min(group, key=lambda r: (r["ranks"] * r["steps"], r["ranks"]))
        base = smallest["wall_s"] / (smallest["ranks"] * smallest["steps"])
        for r in group:
            r["ms_per_rank_step"] = 1000 * r["wall_s"] / (r["ranks"] * r["steps"])
            r["vs_smallest"] = r["wall_s"] / (r["ranks"] * r["steps"]) / base


def _series(run: dict) -> tuple[str, str]:
    return run["executor"], run["cache"]


def line_fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares ``y = a + b x`` through ``points`` (a, b); None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def exponent(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(time) on log(size) (``line_fit``): 1.0 = linear."""
    fit = line_fit([(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0])
    return None if fit is None else fit[1]


def exponents(runs: list[dict]) -> list[dict]:
    """Per executor and cache: time ~ ranks^a at each fixed step count, ~ steps^b at each fixed rank count."""
    out = []
    good = [r for r in runs if "error" not in r]
    for (executor, cache), group in itertools.groupby(sorted(good, key=_series), key=_series):
        group = list(group)
        for along, fixed in (("ranks", "steps"), ("steps", "ranks")):
            for value in sorted({r[fixed] for r in group}):
                pts = [(r[along], r["wall_s"]) for r in group if r[fixed] == value]
                e = exponent(pts)
                if e is not None:
                    sizes = sorted(x for x, _ in pts)
                    out.append({"executor": executor, "cache": cache, "along": along, "fixed": fixed, "at": value,
                                "exponent": e, "from": sizes[0], "to": sizes[-1]})
    return out


def run_table(runs: list[dict], floors: dict[str, float | None]) -> str:
    head = ("capture", "events", "executor", "cache", "wall s", "events/s", "driver peak MB", "worker peak MB (max)",
            "ms per rank-step", "vs smallest", "x floor")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        name = f"DEP{r['ranks']} x {r['steps']}"
        if "error" in r:
            cells = [name, "", r["executor"], r["cache"], f"failed: {r['error']}"] + [""] * (len(head) - 5)
        else:
            workers, floor = r["worker_peak_bytes"], floors.get(r["capture"])
            cells = [
                name, f"{r['events']:,}", r["executor"], r["cache"], f"{r['wall_s']:.2f}",
                f"{r['events'] / r['wall_s']:,.0f}", fmt_mb(r["driver_peak_bytes"]),
                fmt_mb(max(workers.values())) if workers else "in driver" if r.get("tasks_in_driver") else "n/a",
                f"{r['ms_per_rank_step']:.2f}",
                f"{r['vs_smallest']:.2f}", f"{r['wall_s'] / floor:.1f}" if floor else "n/a",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def floor_table(floors: dict[str, list[dict]]) -> str:
    head = ("capture", "files", "method", "processes", "s", "file MB/s", "JSON MB/s", "events/s")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in floors.items():
        for r in rows:
            s = max(r["seconds"], 1e-9)
            cells = [
                name, str(r["n_files"]), r["method"], str(r["processes"]), f"{r['seconds']:.2f}",
                f"{r['file_bytes'] / MB / s:,.0f}", f"{r['json_bytes'] / MB / s:,.0f}" if r["json_bytes"] else "–",
                f"{r['raw_events'] / s:,.0f}" if r["raw_events"] else "–",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(runs: list[dict]) -> list[str]:
    """Issue #9's goals, one line each: met, not met, or not measured (and which run says so)."""
    lines = []
    ranks, steps, wall_max, driver_max = GOAL_DEP32
    for r in runs:
        if (r["ranks"], r["steps"]) != (ranks, steps):
            continue
        label = f"DEP{ranks} x {steps}, {r['executor']}, {r['cache']} cache"
        if "error" in r:
            lines.append(f"NOT MET  {label}: failed ({r['error']})")
            continue
        ok = r["wall_s"] < wall_max and r["driver_peak_bytes"] < driver_max
        lines.append(f"{'met    ' if ok else 'NOT MET'}  {label}: {r['wall_s']:.1f} s (goal < {wall_max:.0f} s), "
                     f"driver {r['driver_peak_bytes'] / GB:.2f} GB (goal < {driver_max / GB:.0f} GB)")
    if not any((r["ranks"], r["steps"]) == (ranks, steps) for r in runs):
        lines.append(f"not measured  DEP{ranks} x {steps} (in the default grid)")
    ranks, steps, mem_max = GOAL_DEP256
    for r in runs:
        if (r["ranks"], r["steps"]) != (ranks, steps):
            continue
        label = f"DEP{ranks} x {steps}, {r['executor']}, {r['cache']} cache"
        if "error" in r:
            lines.append(f"NOT MET  {label}: failed ({r['error']})")
            continue
        total = r["driver_peak_bytes"] + sum(r["worker_peak_bytes"].values())
        lines.append(f"{'met    ' if total < mem_max else 'NOT MET'}  {label}: completed in {r['wall_s']:.1f} s, "
                     f"driver + workers' peaks {total / GB:.2f} GB (goal < {mem_max / GB:.0f} GB)")
    if not any((r["ranks"], r["steps"]) == (ranks, steps) for r in runs):
        lines.append(f"not measured  DEP{ranks} x {steps} (run with --full)")
    for e in exponents(runs):
        if e["along"] != "ranks":
            continue
        ok = e["exponent"] <= LINEAR_EXPONENT_MAX
        lines.append(f"{'met    ' if ok else 'NOT MET'}  time linear in ranks, {e['executor']}, {e['cache']} cache: "
                     f"time ~ ranks^{e['exponent']:.2f} at {e['at']} steps (DEP{e['from']}..{e['to']}; goal <= {LINEAR_EXPONENT_MAX})")
    return lines


def stage_names(runs: list[dict]) -> list[str]:
    """The stages the runs timed: ``STAGES`` first, then any other (``impact_gpu``, ``replay``) by name."""
    seen = {st for r in runs if "error" not in r for st in (r.get("stage_cpu_s") or {})}
    return [st for st in STAGES if st in seen] + sorted(seen - set(STAGES))


def stage_table(runs: list[dict]) -> str:
    stages = stage_names(runs)
    head = ("run", *(f"{st} CPU s" for st in stages), "tasks CPU s", "driver CPU s", "wall s")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        if "error" in r or not r.get("stage_cpu_s"):
            continue
        cpu = r["stage_cpu_s"]
        cells = [f"DEP{r['ranks']} x {r['steps']}, {r['executor']}, {r['cache']}", *(f"{cpu.get(st, 0):.1f}" for st in stages),
                 f"{sum(cpu.values()):.1f}", f"{r.get('driver_cpu_s', 0):.1f}", f"{r['wall_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fixed_costs(runs: list[dict]) -> list[dict]:
    """Per executor, cache and rank count measured at two step counts or more: each stage's CPU, the
    driver's CPU and the wall time as ``fixed + per_step x steps`` (``line_fit``), and the fixed
    part's share at the fewest steps. Why: a short capture's ratio to its floor is set by what a run
    costs whatever its length (a rank's tables made, stored and read back, each stage's Python and
    pandas calls, the driver's reduces), which the floor (parsing alone) does not have."""
    out = []
    good = [r for r in runs if "error" not in r and r.get("stage_cpu_s")]
    key = lambda r: (r["executor"], r["cache"], r["ranks"])  # noqa: E731
    for (executor, cache, ranks), group in itertools.groupby(sorted(good, key=key), key=key):
        group = sorted(group, key=lambda r: r["steps"])
        if len({r["steps"] for r in group}) < 2:
            continue
        measures = [(st, lambda r, st=st: r["stage_cpu_s"].get(st, 0.0)) for st in stage_names(group)]
        measures += [("tasks", lambda r: sum(r["stage_cpu_s"].values())), ("driver", lambda r: r.get("driver_cpu_s", 0.0)),
                     ("wall", lambda r: r["wall_s"])]
        for name, value in measures:
            fixed, per_step = line_fit([(r["steps"], value(r)) for r in group])
            first = value(group[0])
            out.append({"executor": executor, "cache": cache, "ranks": ranks, "measure": name, "fixed_s": fixed,
                        "per_100_steps_s": 100 * per_step, "steps": group[0]["steps"], "at_fewest_s": first,
                        "fixed_share": fixed / first if first > 0 else math.nan})
    return out


def fixed_cost_table(rows: list[dict]) -> str:
    head = ("runs", "measure", "fixed s", "s per 100 steps", "at fewest steps s", "fixed share there")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| DEP{r['ranks']}, {r['executor']}, {r['cache']} | {r['measure']} | {r['fixed_s']:.2f} | "
                     f"{r['per_100_steps_s']:.2f} | {r['at_fewest_s']:.2f} ({r['steps']} steps) | {r['fixed_share']:.0%} |")
    return "\n".join(lines)


def goals16(runs: list[dict], floors: dict[str, float | None]) -> list[str]:
    """Issue #16's goals, one line each: every cold run within GOAL_X_FLOOR of its floor, DEP32 x 1000
    on a 2-worker pool under 30 s cold, DEP256 x 200 under 3 GB (driver plus workers)."""
    lines = []
    cold = [r for r in runs if r["cache"] == "cold"]
    for r in cold:
        label = f"DEP{r['ranks']} x {r['steps']}, {r['executor']}, cold"
        floor = floors.get(r["capture"])
        if "error" in r:
            lines.append(f"NOT MET  {label}: failed ({r['error']})")
        elif floor:
            x = r["wall_s"] / floor
            lines.append(f"{'met    ' if x <= GOAL_X_FLOOR else 'NOT MET'}  {label}: {x:.2f}x its floor "
                         f"({r['wall_s']:.1f} s / {floor:.1f} s; goal <= {GOAL_X_FLOOR}x)")
    ranks, steps, wall_max, executor, workers = GOAL16_DEP32
    hits = [r for r in cold if (r["ranks"], r["steps"], r["executor"]) == (ranks, steps, executor)]
    for r in hits:
        label = f"DEP{ranks} x {steps}, {executor} ({r.get('workers') or '?'} workers), cold"
        if "error" not in r:
            lines.append(f"{'met    ' if r['wall_s'] < wall_max else 'NOT MET'}  {label}: {r['wall_s']:.1f} s "
                         f"(goal < {wall_max:.0f} s on {workers} workers)")
    if not hits:
        lines.append(f"not measured  DEP{ranks} x {steps}, {executor}, cold")
    ranks, steps, mem_max = GOAL16_DEP256
    hits = [r for r in runs if (r["ranks"], r["steps"]) == (ranks, steps) and "error" not in r]
    for r in hits:
        total = r["driver_peak_bytes"] + sum(r["worker_peak_bytes"].values())
        lines.append(f"{'met    ' if total < mem_max else 'NOT MET'}  DEP{ranks} x {steps}, {r['executor']}, {r['cache']}: "
                     f"driver + workers' peaks {total / GB:.2f} GB (goal < {mem_max / GB:.0f} GB)")
    if not hits:
        lines.append(f"not measured  DEP{ranks} x {steps} (run with --ranks {ranks} --steps {steps})")
    return lines


# ---------------------------------------------------------------- figure


def write_figure(runs: list[dict], path: Path, title: str) -> None:
    """Wall time vs ranks (at fixed steps) and vs steps (at fixed ranks), a line per executor and cache."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    good = [r for r in runs if "error" not in r]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("wall time vs ranks", "wall time vs steps"))
    for col, (along, fixed) in enumerate((("ranks", "steps"), ("steps", "ranks")), start=1):
        for (executor, cache), group in itertools.groupby(sorted(good, key=_series), key=_series):
            group = list(group)
            for value in sorted({r[fixed] for r in group}):
                pts = sorted((r for r in group if r[fixed] == value), key=lambda r: r[along])
                if len(pts) < 2 and len({r[fixed] for r in good}) > 1:
                    continue  # a lone point is drawn on the other panel
                fig.add_trace(go.Scatter(
                    x=[r[along] for r in pts], y=[r["wall_s"] for r in pts], mode="lines+markers",
                    name=f"{executor}, {cache} cache, {fixed}={value}", legendgroup=f"{executor}-{cache}",
                    line={"color": COLORS.get(executor), "dash": "solid" if cache == "cold" else "dot"},
                    text=[f"DEP{r['ranks']} x {r['steps']}: {r['events']:,} events, {r['events'] / r['wall_s']:,.0f} events/s, "
                          f"driver {r['driver_peak_bytes'] / MB:,.0f} MB" for r in pts],
                    hovertemplate="%{text}<br>%{y:.2f} s<extra>%{fullData.name}</extra>",
                ), row=1, col=col)
        fig.update_xaxes(title_text=along, type="log", row=1, col=col)
        fig.update_yaxes(title_text="wall s", type="log", row=1, col=col)
    fig.update_layout(title=title, height=520, template="plotly_white")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)


# ---------------------------------------------------------------- driver


def report(runs: list[dict], floors: dict[str, list[dict]], header: str, out: Path | None) -> None:
    """Print the tables, growth and goals; write the figure to ``out``."""
    growth(runs)
    floor_s = {name: floor_seconds(rows) for name, rows in floors.items()}
    print(f"\n{header}\n")
    print(run_table(runs, floor_s))
    growth_lines = [f"- {e['executor']}, {e['cache']} cache: time ~ {e['along']}^{e['exponent']:.2f} at {e['fixed']}={e['at']} "
                    f"({e['along']} {e['from']}..{e['to']})" for e in exponents(runs)]
    if growth_lines:
        print("\nGrowth (1.00 = linear):\n" + "\n".join(growth_lines))
    if floors:
        print("\nFloor: the raw files only read, gunzipped, parsed (page cache warm)\n")
        print(floor_table({Path(k).name: v for k, v in floors.items()}))
    if any(r.get("stage_cpu_s") for r in runs):
        print("\nWhere the CPU time goes (sum over tasks per stage, and the driver's own; s):\n")
        print(stage_table(runs))
    fixed = fixed_costs(runs)
    if fixed:
        print("\nFixed and per-step cost (a line fixed + per-step x steps through one rank count's runs; negative "
              "fixed: faster than linear):\n")
        print(fixed_cost_table(fixed))
    print("\nGoals (issue #9):\n" + "\n".join(goals(runs)))
    print("\nGoals (issue #16, cold runs):\n" + "\n".join(goals16(runs, floor_s)))
    if out is None:
        return
    try:
        write_figure(runs, out, header)
        print(f"\nfigure: {out}")
    except ImportError as exc:
        say(f"no figure ({exc})")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_list(text: str | None, kind=int) -> list:
    return [kind(x) for x in text.split(",") if x.strip()] if text else []


def grid_of(args) -> list[tuple[int, int]]:
    if args.quick:
        return list(QUICK_GRID)
    if args.ranks or args.steps:
        return list(itertools.product(parse_list(args.ranks) or [32], parse_list(args.steps) or [100]))
    return DEFAULT_GRID + (FULL_EXTRA if args.full else [])


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        spec = json.loads(sys.argv[2])
        print(json.dumps(floor_child(spec) if spec.get("floor") else child(spec)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:7]))
    ap.add_argument("--quick", action="store_true", help="DEP8 x 20 only, serial and pool: a smoke test")
    ap.add_argument("--full", action="store_true", help="add DEP64 x 1000 and DEP256 x 200 to the default grid")
    ap.add_argument("--ranks", help="comma-separated rank counts (grid: every --ranks x every --steps)")
    ap.add_argument("--steps", help="comma-separated step counts")
    ap.add_argument("--executors", help=f"comma-separated, of {', '.join(EXECUTORS)} (default: all; --quick: serial,pool)")
    ap.add_argument("--workers", type=int, help="workers per executor (default: the executor's own)")
    ap.add_argument("--scheduler", help="Dask scheduler address for the dask executor (default: a LocalCluster)")
    ap.add_argument("--caches", default="cold,warm", help="cold, warm or both (default cold,warm)")
    ap.add_argument("--format", choices=("kineto", "nsys"), default="kineto", help="simulated trace format")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/profkit-scale"), help="captures and caches (kept)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scale.html", help="plotly figure")
    ap.add_argument("--json", type=Path, help="also write every run and floor measurement here")
    ap.add_argument("--no-floor", action="store_true", help="skip the read / gunzip / parse floor")
    ap.add_argument("--no-build", action="store_true",
                    help="do not build profkit's compiled JSON scanner and replay before the runs (once per machine, unmeasured); "
                         "without it the first run to read a file of 8 MB or more builds it, ~18 s inside that run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="passes per capture, each the floor and then every run once (cold: an emptied cache); "
                         "the tables show each run's median and each floor method's median (default 1)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run before it is killed (default 1800)")
    ap.add_argument("--report", type=Path, metavar="JSON", help="measure nothing: print the tables of a --json file again")
    args = ap.parse_args()
    if args.report:
        saved = json.loads(args.report.read_text())
        report(saved["runs"], saved["floors"], saved.get("header", str(args.report)), args.out)
        return 0
    executors = parse_list(args.executors, str) or (["serial", "pool"] if args.quick else list(EXECUTORS))
    unknown = set(executors) - set(EXECUTORS)
    caches = parse_list(args.caches, str)
    if unknown or not set(caches) <= set(CACHES) or not caches:
        ap.error(f"executors are {', '.join(EXECUTORS)}; caches are cold, warm")
    grid = grid_of(args)
    args.work_dir.mkdir(parents=True, exist_ok=True)

    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    scanner = "not built first" if args.no_build else build_kernels()
    header = (f"profkit.scale.analyze_paths on simulated captures ({args.format}, seed 1); {machine}; "
              f"workers: {args.workers or 'executor default'}; {_accelerators()}; JSON scanner: {scanner}; "
              + ("one run each" if args.repeat <= 1 else f"medians of {args.repeat} runs and of {args.repeat} floor passes"))
    runs: list[dict] = []
    floors: dict[str, list[dict]] = {}

    def save() -> None:  # after every run, so a long grid that is stopped keeps what it measured
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "header": header,
                                             "runs": runs, "floors": floors}, indent=2))

    for ranks, steps in grid:
        folder = capture_dir(args.work_dir, ranks, steps, args.format)
        files = trace_files(folder)
        # with --repeat, each pass measures the floor and then every run once: the floor and the
        # runs see the machine at the same minutes (this VM's speed moves by a third in an hour)
        passes: list[list[dict]] = []
        tries: dict[tuple[str, str], list[dict]] = {}
        for attempt in range(max(args.repeat, 1)):
            of = f" ({attempt + 1} of {args.repeat})" if args.repeat > 1 else ""
            if not args.no_floor:
                say(f"floor: DEP{ranks} x {steps}, {len(files)} files{of}")
                floor = run_child({"floor": True, "files": [str(f) for f in files]}, child_env(None), args.timeout)
                if "error" in floor:
                    say(f"  floor failed: {floor['error']}")
                else:
                    passes.append(floor["rows"])
            for executor in executors:
                cache_dir = args.work_dir / "cache" / f"{folder.name}-{executor}"
                shutil.rmtree(cache_dir, ignore_errors=True)  # every pass's first run is cold
                spec = {"capture": str(folder), "executor": executor, "workers": args.workers,
                        "scheduler": args.scheduler}
                for cache in caches:
                    if cache == "warm" and "cold" not in caches:  # warm needs a filled cache: fill it unmeasured
                        run_child(spec, child_env(cache_dir), args.timeout)
                    say(f"run: DEP{ranks} x {steps}, {executor}, {cache} cache{of}")
                    result = run_child(spec, child_env(cache_dir), args.timeout)
                    tries.setdefault((executor, cache), []).append(result)
                    say("  " + (f"failed: {result['error']}" if "error" in result else
                                f"{result['wall_s']:.2f} s, {result['events']:,} events, "
                                f"driver {result['driver_peak_bytes'] / MB:,.0f} MB"))
                shutil.rmtree(cache_dir, ignore_errors=True)
        if passes:
            floors[str(folder)] = [{**row, "n_files": len(files)} for row in merge_floor_passes(passes)]
        for (executor, cache), measured in tries.items():
            runs.append({"ranks": ranks, "steps": steps, "executor": executor, "cache": cache,
                         "capture": str(folder), **median_run(measured)})
        save()
    report(runs, floors, header, args.out)
    return 1 if runs and all("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
