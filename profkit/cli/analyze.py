"""``profkit analyze PATH... [-o OUT]``: load traces, find steps, print and write the summary."""
from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="analyze traces (files or folders) and summarize GPU time vs step time")
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders (Kineto JSON[.gz], nsys SQLite, Chrome JSON)")
    p.add_argument("-o", "--out", metavar="OUT", help="write summary.json, steps.csv, causes.csv, stragglers.csv and report.html here")
    p.add_argument("--expert-loads", metavar="FILE",
                   help="tokens per rank/step/layer (CSV rank,step,layer,tokens; default: found beside the traces)")
    add_load_options(p)
    p.set_defaults(run=run)


def add_load_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step-pattern", metavar="REGEX", help="regex naming the step spans (overrides built-in markers)")
    p.add_argument(
        "--rank",
        action="append",
        default=[],
        metavar="FILE[:PID]=RANK",
        help="assign a rank to a file (or to one process of a multi-process nsys file); repeatable",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print only errors")


def run(args: argparse.Namespace) -> int:
    return analyze_and_report(args.paths, args.out, args.step_pattern, args.rank, args.quiet, args.expert_loads)


def analyze_and_report(paths, out, step_pattern, rank_specs, quiet, expert_loads_file=None) -> int:
    from profkit.analyze.pipeline import analyze
    from profkit.ingest.loader import RankMap, load
    from profkit.report.files import write_outputs
    from profkit.report.terminal import render_summary

    try:
        rank_map = RankMap.parse(rank_specs)
    except ValueError as exc:
        print(f"profkit: {exc}", file=sys.stderr)
        return 2
    progress = None if quiet else (lambda msg: print(msg, file=sys.stderr))
    capture = load(*paths, rank_map=rank_map, progress=progress)
    for line in capture.skipped:
        print(f"profkit: skipped {line}", file=sys.stderr)
    if capture.parts.empty:
        print("profkit: nothing could be analyzed", file=sys.stderr)
        return 1
    from profkit.errors import TraceError
    from profkit.ingest.expert_loads import discover_expert_loads, read_expert_loads

    try:
        loads = read_expert_loads(expert_loads_file) if expert_loads_file else discover_expert_loads(paths)
    except TraceError as exc:
        print(f"profkit: skipped {exc}", file=sys.stderr)
        loads = None
    analysis = analyze(capture, step_pattern, expert_loads=loads)
    if not quiet:
        print(render_summary(analysis))
    if out:
        written = write_outputs(analysis, out)
        if not quiet:
            print("\nwrote " + ", ".join(str(p) for p in written))
    return 0
