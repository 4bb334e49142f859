"""``profkit merge PATH... -o merged.pftrace``: every rank's trace in one file for the Perfetto UI."""
from __future__ import annotations

import argparse
import sys

from profkit.cli.analyze import add_load_options, add_scale_options

EPILOG = """\
windows:
  --steps A:B   steps A..B of every rank (inclusive; step numbers as in steps.csv), plus the GPU
                work launched inside them; either side may be empty (--steps 10: , --steps :12)
  --time T0:T1  what overlaps [T0, T1] on the merged timeline. Seconds from the trace's first
                event: 0.5, 2, 1.5s, 250ms, 40us. Absolute ns: a plain integer of 13+ digits, or
                an integer with 'ns' (1795972928988048694, 1000ns). Either side may be empty.

open the result at https://ui.perfetto.dev (Open trace file); for files over ~1 GB run
`trace_processor --httpd merged.pftrace` and open the UI, which then uses that local processor.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge",
        help="merge every rank's trace into one Perfetto (or Chrome JSON) trace",
        description="Merge the traces of all ranks into one trace: a process per rank, its CPU threads, "
        "its GPU streams, launch->kernel flows and a steps track.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders (Kineto JSON[.gz], nsys SQLite, Chrome JSON)")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="output file (merged.pftrace, or merged.json with --format chrome)")
    p.add_argument("--format", choices=("perfetto", "chrome"), default="perfetto",
                   help="perfetto: protobuf, streamed, for any size (default); chrome: Chrome trace JSON")
    window = p.add_mutually_exclusive_group()
    window.add_argument("--steps", metavar="A:B", help="keep steps A..B of every rank")
    window.add_argument("--time", metavar="T0:T1", help="keep [T0, T1]: seconds from the start, or absolute ns")
    p.add_argument("--no-align", action="store_true", help="merge on each rank's own clock (skip clock alignment)")
    add_load_options(p)
    add_scale_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from profkit.export import WindowError, parse_steps, parse_time
    from profkit.ingest.loader import RankMap

    try:
        rank_map = RankMap.parse(args.rank)
        steps = parse_steps(args.steps) if args.steps else None
        time = parse_time(args.time) if args.time else None
    except (ValueError, WindowError) as exc:
        print(f"profkit: {exc}", file=sys.stderr)
        return 2
    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    from profkit.scale import ScaleError, merge_paths
    from profkit.cli.terminate import terminate_raises

    try:
        with terminate_raises():  # SIGTERM: the pool and the scratch folder go as with Ctrl-C
            result, capture = merge_paths(
                args.paths, args.out, align=not args.no_align, executor=args.executor, workers=args.workers,
                scheduler=args.scheduler, dask_local=args.dask_local, rank_map=rank_map, progress=say,
                scratch=args.scratch, fmt=args.format, steps=steps, time=time, step_pattern=args.step_pattern,
            )
    except OSError as exc:
        print(f"profkit: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except ScaleError as exc:
        print(f"profkit: {exc}", file=sys.stderr)
        return 1
    for line in capture.skipped:
        print(f"profkit: skipped {line}", file=sys.stderr)
    for line in capture.warnings:
        say(f"profkit: warning: {line}")
    if result is None or capture.parts.empty:
        print("profkit: nothing could be merged", file=sys.stderr)
        return 1
    for note in result.notes:
        print(f"profkit: note: {note}", file=sys.stderr)
    if not result.ranks:
        print(f"profkit: no rank had events in the window; wrote an empty trace to {result.path}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(
            f"wrote {result.path} ({result.fmt}, {result.bytes_written / 1e6:.1f} MB): {len(result.ranks)} ranks, "
            f"{result.n_events:,} events, {result.n_steps} steps, {result.n_flows:,} flows"
        )
        if result.fmt == "perfetto":
            print("open it at https://ui.perfetto.dev (Open trace file), or for large files: "
                  f"trace_processor --httpd {result.path}")
    return 0
