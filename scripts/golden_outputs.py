"""Record everything ``profkit analyze`` writes, and every reader's event table, then compare two records.

Why: speed work on the readers, the cache and the scale stages must not change a single output.
Record before a change, record after, compare::

    python scripts/golden_outputs.py record /tmp/golden/before          # ~3-5 min on 2 cores
    python scripts/golden_outputs.py record /tmp/golden/after
    python scripts/golden_outputs.py compare /tmp/golden/before /tmp/golden/after

    python scripts/golden_outputs.py tables --write tests/golden/event_tables.json   # the test's golden
    python scripts/golden_outputs.py outputs --write tests/golden/analyze_outputs.json  # ~1-2 min

``record`` runs ``profkit analyze -o`` on every capture of ``sample_traces/``, on the public
traces (``../shared/traces``), and on two simulated captures (DEP8 x 40, a GC cause injected on
rank 2; Kineto and nsys; generated once under ``--sim-dir`` and reused, so before and after read
the same bytes), each with a cold Parquet cache and again with the warm one, and a simulated
capture on a 2-worker pool. It keeps every CSV and ``summary.json`` (``report.html`` is
left out: it embeds a timestamp) plus the event-table fingerprint of every input file
(``tables``). ``compare`` diffs them: CSVs cell by cell (exactly, or within ``--rtol`` for
float cells when asked), JSON value by value, and names the first differences.

The fingerprint of an event table (``fingerprint``) is what the readers can break: per part its
rank, source, key, row count, Arrow schema, warnings and meta, and per column a hash of its values
in row order (nulls marked) plus, per kind, row counts and sums of the times. It does not depend on
how a column is stored (plain or dictionary strings, chunking), only on the values.

``outputs`` fingerprints what ``profkit analyze -o`` writes (every CSV and ``summary.json``; not
``report.html``) on every capture of ``sample_traces/`` and two small simulated captures
(``GOLDEN_SIMS``: fixed seeds, injected faults), in-process through the CLI's own function. Per CSV:
its row count, its header in order, and per column a hash of its cells in row order plus, for
numeric columns, their sum (``"hash sum=S"``). Cells are compared as written, except that float cells are rounded to
``FLOAT_DIGITS`` significant digits first (so a float that moves only in its last bits, because a
sum was reordered, does not count; anything larger does). ``summary.json`` is kept whole, floats
rounded the same way, without ``profkit_version`` and with the capture's folder written ``<root>``.
That golden is ``tests/golden/analyze_outputs.json`` (``tests/test_analyze_golden.py``).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
SAMPLES = REPO / "sample_traces"
SIM_INJECT = "gc:rank=2,every=5,ms=8"


# ---------------------------------------------------------------- inputs


def sample_inputs() -> dict[str, list[str]]:
    """name -> paths: every capture folder of sample_traces/ (a folder holding trace files)."""
    out: dict[str, list[str]] = {}
    for top in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        subs = sorted(p for p in top.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not subs:
            out[f"samples/{top.name}"] = [str(top)]
        for sub in subs:
            out[f"samples/{top.name}/{sub.name}"] = [str(sub)]
    return out


def public_inputs() -> dict[str, list[str]]:
    """name -> paths: each public trace (file, or the 2-rank folder) on its own."""
    out: dict[str, list[str]] = {"public/hta/trace_filter_2rank": [str(SHARED / "hta" / "trace_filter_2rank")]}
    for f in sorted(SHARED.rglob("*")):
        if f.is_file() and f.name.endswith((".json.gz", ".sqlite")) and "trace_filter_2rank" not in f.parts:
            out[f"public/{f.relative_to(SHARED)}"] = [str(f)]
    return out


def simulated_inputs(sim_dir: Path, profkit: str) -> dict[str, list[str]]:
    out = {}
    for fmt in ("kineto", "nsys"):
        folder = sim_dir / f"dep8x40-{fmt}"
        if not (folder / "truth.json").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            subprocess.run([profkit, "simulate", "--ranks", "8", "--steps", "40", "--seed", "1", "--format", fmt,
                            "--inject", SIM_INJECT, "-o", str(folder), "-q"], check=True)
        out[f"sim/dep8x40-{fmt}"] = [str(folder)]
    return out


# ---------------------------------------------------------------- fingerprints


def _hash_column(column) -> str:
    """sha256 of a column's values in row order, independent of its Arrow layout."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    h = hashlib.sha256()
    valid = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool) if len(col) else np.zeros(0, bool)
    h.update(np.packbits(valid).tobytes())
    if pa.types.is_integer(col.type):
        h.update(np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64).tobytes())
    elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        for v in col.to_pylist():
            h.update(b"\x00N" if v is None else v.encode("utf-8", "surrogatepass") + b"\x00")
    else:
        h.update(repr(col.to_pylist()).encode())
    return h.hexdigest()[:20]


def table_fingerprint(table) -> dict:
    kinds = table["kind"].to_pylist()
    starts = table["start_ns"].to_pylist()
    ends = table["end_ns"].to_pylist()
    per_kind: dict[str, dict] = {}
    for k, s, e in zip(kinds, starts, ends):
        d = per_kind.setdefault(str(k), {"rows": 0, "sum_start_ns": 0, "sum_dur_ns": 0})
        d["rows"] += 1
        d["sum_start_ns"] += int(s)
        d["sum_dur_ns"] += int(e) - int(s)
    return {
        "rows": table.num_rows,
        "schema": [f"{f.name}:{f.type}" for f in table.schema],
        "columns": {name: _hash_column(table[name]) for name in table.column_names},
        "nulls": {name: int(table[name].null_count) for name in table.column_names},
        "distinct_names": len(set(table["name"].to_pylist())) - (1 if table["name"].null_count else 0),
        "kinds": dict(sorted(per_kind.items())),
    }


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str, sort_keys=True))


def fingerprint(path: str | Path, root: Path | None = None) -> list[dict]:
    """Every part ``read_file`` gives for one trace file, fingerprinted (paths relative to ``root``)."""
    from profkit.ingest.loader import read_file

    parts = read_file(Path(path))
    out = []
    for part in parts:
        meta = dict(part.meta)
        meta.pop("exported_sqlite", None)
        entry = {"source": part.source, "rank": part.rank, "rank_origin": part.rank_origin, "key": part.key,
                 "warnings": list(part.warnings), "meta": _jsonable(meta), **table_fingerprint(part.table)}
        out.append(entry)
    text = json.dumps(out, sort_keys=True)
    if root is not None:
        text = text.replace(str(root), "<root>")
    return json.loads(text)


def trace_files(paths: list[str]) -> list[Path]:
    from profkit.ingest.loader import discover

    files, _ = discover(paths)
    return files


def tables_record(inputs: dict[str, list[str]], roots: dict[str, Path]) -> dict:
    """{input name: {file (relative): [part fingerprints]}} with the cache off (a real parse) and
    again through a fresh cache entry (what a warm run reads)."""
    out: dict[str, dict] = {}
    for name, paths in inputs.items():
        root = roots.get(name.split("/")[0], REPO)
        entry = {}
        for f in trace_files(paths):
            rel = str(f.resolve().relative_to(root.resolve()))
            entry[rel] = fingerprint(f, root)
        out[name] = entry
    return out


def default_tables_inputs() -> tuple[dict[str, list[str]], dict[str, Path]]:
    inputs = {**sample_inputs(), **public_inputs()}
    return inputs, {"samples": REPO, "public": SHARED}


# ---------------------------------------------------------------- analyze outputs (the golden)

FLOAT_DIGITS = 10  # significant digits kept of a float cell before hashing (a float64 holds ~15.9)
GOLDEN_SIMS = {  # name -> profkit simulate arguments: small, fixed seeds, injected faults
    "sim/dep4x12-kineto": ["--ranks", "4", "--steps", "12", "--seed", "3", "--format", "kineto",
                           "--inject", "gc:rank=1,every=4,ms=6", "--inject", "slow_schedule:rank=3,every=3,ms=3"],
    "sim/dep8x8-nsys": ["--ranks", "8", "--steps", "8", "--seed", "5", "--format", "nsys",
                        "--inject", "host_sync:rank=2,every=2,ms=2", "--inject", "hot_experts:rank=5"],
}
VOLATILE_SUMMARY_KEYS = ("profkit_version",)


def golden_sim_inputs(sim_dir: Path) -> dict[str, list[str]]:
    """Generate (once per folder) the simulated captures of the analyze golden."""
    from profkit.cli.main import main as profkit_main

    out = {}
    for name, argv in GOLDEN_SIMS.items():
        folder = sim_dir / name.split("/", 1)[1]
        if not (folder / "truth.json").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            rc = profkit_main(["simulate", *argv, "-o", str(folder), "-q"])
            if rc:
                raise RuntimeError(f"profkit simulate {' '.join(argv)} failed ({rc})")
        out[name] = [str(folder)]
    return out


def _round_float(x: float) -> str:
    return repr(x) if not math.isfinite(x) else f"{x:.{FLOAT_DIGITS}g}"


def _cell(text: str) -> tuple[str, float | None]:
    """A CSV cell as compared (floats rounded) and its numeric value (None: not a number)."""
    if text == "":
        return text, None
    try:
        return text, float(int(text))
    except ValueError:
        pass
    try:
        x = float(text)
    except ValueError:
        return text, None
    return _round_float(x), x


def csv_fingerprint(path: Path) -> dict:
    """rows, header and per column ``hash`` (cells in row order, floats rounded) and ``sum`` (numeric)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    columns = {}
    for j, name in enumerate(header):
        h = hashlib.sha256()
        total, numeric = 0.0, True
        for row in body:
            shown, value = _cell(row[j] if j < len(row) else "")
            h.update(shown.encode("utf-8", "surrogatepass") + b"\x00")
            if value is None and shown != "":
                numeric = False
            elif value is not None and math.isfinite(value):
                total += value
        entry = h.hexdigest()[:16]
        if numeric and body:
            entry += f" sum={_round_float(total)}"
        columns[name] = entry
    return {"rows": len(body), "header": header, "columns": columns}


def _rounded(obj):
    if isinstance(obj, float):
        return _round_float(obj)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def summary_fingerprint(path: Path, roots: list[Path]) -> dict:
    text = path.read_text()
    for root in roots:  # absolute and as given
        text = text.replace(str(root.resolve()), "<root>").replace(str(root), "<root>")
    doc = json.loads(text)
    for key in VOLATILE_SUMMARY_KEYS:
        doc.pop(key, None)
    return _rounded(doc)


def analyze_outputs(paths: list[str], out: Path, roots: list[Path]) -> dict:
    """Run what ``profkit analyze PATHS -o OUT -q`` runs (in this process, report.html left out) and
    fingerprint every file it writes."""
    import contextlib
    import io

    import profkit.report.html as html
    from profkit.cli.analyze import analyze_and_report

    out.mkdir(parents=True, exist_ok=True)
    real = html.write_report
    html.write_report = lambda analysis, folder: Path(folder) / "report.html"  # it embeds a timestamp
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            rc = analyze_and_report(paths, str(out), None, [], True,
                                    scale={"executor": "pool", "workers": None, "scheduler": None,
                                           "dask_local": None, "scratch": None},
                                    routing={"experts": None, "topk": None})
    finally:
        html.write_report = real
    result: dict = {"rc": rc, "files": {}}
    for f in sorted(out.iterdir()):
        if f.suffix == ".csv":
            result["files"][f.name] = csv_fingerprint(f)
        elif f.name == "summary.json":
            result["files"][f.name] = summary_fingerprint(f, roots)
    return result


def default_output_inputs(sim_dir: Path) -> tuple[dict[str, list[str]], list[Path]]:
    return {**sample_inputs(), **golden_sim_inputs(sim_dir)}, [sim_dir, REPO]


def outputs_record(inputs: dict[str, list[str]], roots: list[Path], work: Path) -> dict:
    return {name: analyze_outputs(paths, work / name, roots) for name, paths in inputs.items()}


def output_differences(want: dict, got: dict) -> list[str]:
    """Readable differences between two analyze fingerprints (of one input or of many)."""
    out: list[str] = []
    _diff_json(want, got, "", out, 0.0)
    return out


# ---------------------------------------------------------------- record


def _analyze(profkit: str, paths: list[str], out: Path, cache_dir: Path, extra: list[str]) -> dict:
    env = dict(os.environ, PROFKIT_CACHE_DIR=str(cache_dir), PROFKIT_CACHE="1")
    proc = subprocess.run([profkit, "analyze", *paths, "-o", str(out), "-q", *extra], env=env,
                          capture_output=True, text=True)
    (out / "report.html").unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stderr.txt").write_text(proc.stderr)
    return {"rc": proc.returncode}


def record(dest: Path, sim_dir: Path, only: str | None) -> None:
    profkit = str(Path(sys.executable).with_name("profkit"))
    inputs = {**sample_inputs(), **public_inputs(), **simulated_inputs(sim_dir, profkit)}
    if only:
        inputs = {k: v for k, v in inputs.items() if only in k}
    dest.mkdir(parents=True, exist_ok=True)
    runs = []
    for name, paths in inputs.items():
        variants = [("cold", []), ("warm", [])]
        if name == "sim/dep8x40-kineto":
            variants.append(("pool2", ["--executor", "pool", "--workers", "2"]))
        with tempfile.TemporaryDirectory(prefix="golden-cache-") as cache:
            for variant, extra in variants:
                out = dest / "analyze" / name / variant
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                info = _analyze(profkit, paths, out, Path(cache), extra)
                runs.append({"input": name, "variant": variant, **info})
                print(f"{name} [{variant}]: rc={info['rc']}", flush=True)
    roots = {"samples": REPO, "public": SHARED, "sim": sim_dir}
    os.environ["PROFKIT_CACHE"] = "0"
    tables = tables_record(inputs, roots)
    (dest / "tables.json").write_text(json.dumps(tables, indent=1, sort_keys=True) + "\n")
    # through the cache: a fresh cache folder, stored then loaded
    with tempfile.TemporaryDirectory(prefix="golden-cache-") as cache:
        os.environ["PROFKIT_CACHE"] = "1"
        os.environ["PROFKIT_CACHE_DIR"] = cache
        tables_record(inputs, roots)  # fills it
        warm = tables_record(inputs, roots)
    (dest / "tables_warm.json").write_text(json.dumps(warm, indent=1, sort_keys=True) + "\n")
    (dest / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")


# ---------------------------------------------------------------- compare


def _cells_equal(a: str, b: str, rtol: float) -> bool:
    if a == b:
        return True
    if rtol <= 0:
        return False
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) and math.isnan(y):
        return True
    return abs(x - y) <= rtol * max(abs(x), abs(y))


def _compare_csv(a: Path, b: Path, rtol: float) -> list[str]:
    with open(a, newline="") as fa, open(b, newline="") as fb:
        ra, rb = list(csv.reader(fa)), list(csv.reader(fb))
    problems = []
    if len(ra) != len(rb):
        problems.append(f"{len(ra)} vs {len(rb)} lines")
    if ra and rb and ra[0] != rb[0]:
        problems.append(f"header {ra[0]} vs {rb[0]}")
        return problems
    header = ra[0] if ra else []
    for i, (x, y) in enumerate(zip(ra[1:], rb[1:]), 2):
        for j, (u, v) in enumerate(zip(x, y)):
            if not _cells_equal(u, v, rtol):
                col = header[j] if j < len(header) else j
                problems.append(f"line {i} column {col}: {u!r} vs {v!r}")
                if len(problems) >= 5:
                    return problems
    return problems


def _diff_json(a, b, where: str, out: list[str], rtol: float) -> None:
    if len(out) >= 8:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{where}/{k}: only in {'after' if k not in a else 'before'}")
            else:
                _diff_json(a[k], b[k], f"{where}/{k}", out, rtol)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff_json(x, y, f"{where}[{i}]", out, rtol)
    elif isinstance(a, float) and isinstance(b, float) and rtol > 0:
        if not _cells_equal(repr(a), repr(b), rtol):
            out.append(f"{where}: {a!r} vs {b!r}")
    elif a != b:
        out.append(f"{where}: {str(a)[:200]!r} vs {str(b)[:200]!r}")


def compare(before: Path, after: Path, rtol: float = 0.0) -> int:
    problems: list[str] = []
    files_a = {p.relative_to(before) for p in before.rglob("*") if p.is_file()}
    files_b = {p.relative_to(after) for p in after.rglob("*") if p.is_file()}
    for rel in sorted(files_a ^ files_b):
        problems.append(f"{rel}: only in {'before' if rel in files_a else 'after'}")
    n = 0
    for rel in sorted(files_a & files_b):
        a, b = before / rel, after / rel
        if rel.name == "runs.json":
            continue
        n += 1
        if rel.suffix == ".csv":
            diffs = _compare_csv(a, b, rtol)
        elif rel.suffix == ".json":
            diffs = []
            _diff_json(json.loads(a.read_text()), json.loads(b.read_text()), "", diffs, rtol)
        else:
            diffs = [] if a.read_bytes() == b.read_bytes() else ["bytes differ"]
        problems.extend(f"{rel}: {d}" for d in diffs)
    for line in problems:
        print(line)
    print(f"compared {n} files: {'identical' if not problems else f'{len(problems)} difference(s)'}")
    return 1 if problems else 0


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run profkit analyze on every input and fingerprint every event table")
    r.add_argument("dest", type=Path)
    r.add_argument("--sim-dir", type=Path, default=Path(tempfile.gettempdir()) / "profkit-golden-sim")
    r.add_argument("--only", help="only inputs whose name contains this")
    c = sub.add_parser("compare", help="diff two records")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--rtol", type=float, default=0.0, help="relative tolerance for float cells (default: exact)")
    t = sub.add_parser("tables", help="event-table fingerprints of sample_traces/ and the public traces")
    t.add_argument("--write", type=Path, help="write them here (the test's golden); else print")
    o = sub.add_parser("outputs", help="fingerprints of what profkit analyze writes on sample_traces/ and two "
                                        "small simulated captures")
    o.add_argument("--write", type=Path, help="write them here (the test's golden); else print")
    o.add_argument("--only", help="only inputs whose name contains this (printing only)")
    args = ap.parse_args(argv)
    if args.cmd == "outputs":
        with tempfile.TemporaryDirectory(prefix="golden-outputs-") as work:
            inputs, roots = default_output_inputs(Path(work) / "sim")
            if args.only:
                inputs = {k: v for k, v in inputs.items() if args.only in k}
            got = outputs_record(inputs, roots, Path(work) / "out")
        text = json.dumps(got, indent=1, sort_keys=True) + "\n"
        return _write_or_print(text, args.write)
    if args.cmd == "record":
        record(args.dest, args.sim_dir, args.only)
        return 0
    if args.cmd == "compare":
        return compare(args.before, args.after, args.rtol)
    os.environ["PROFKIT_CACHE"] = "0"
    inputs, roots = default_tables_inputs()
    text = json.dumps(tables_record(inputs, roots), indent=1, sort_keys=True) + "\n"
    return _write_or_print(text, args.write)


def _write_or_print(text: str, dest: Path | None) -> int:
    if dest:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
        print(f"wrote {dest} ({len(text) // 1024} KB)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
