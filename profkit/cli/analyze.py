"""``profkit analyze PATH... [-o OUT]``: load traces, find steps, print and write the summary."""
from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="analyze traces (files or folders) and summarize GPU time vs step time")
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders (Kineto JSON[.gz], nsys SQLite, Chrome JSON)")
    p.add_argument("-o", "--out", metavar="OUT", help="write summary.json, steps.csv, causes.csv, impact.csv, stragglers.csv and report.html here")
    p.add_argument("--expert-loads", metavar="FILE",
                   help="tokens per rank/step/layer (CSV rank,step,layer,tokens; default: found beside the traces)")
    p.add_argument("--experts", type=int, metavar="E",
                   help="routed experts per MoE layer, for the uniform-routing baseline in balance.csv "
                        "(default: what the expert loads say, when they do)")
    p.add_argument("--topk", type=int, metavar="K", help="experts per token, for the uniform-routing baseline")
    add_load_options(p)
    add_scale_options(p)
    p.set_defaults(run=run)


def add_scale_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scale (the per-rank work runs as a map over ranks; same results on every executor)")
    g.add_argument("--workers", type=int, metavar="N",
                   help="processes of the local pool (default: CPU count; captures under 1 MB, or 64 MB where "
                        "the workers would spawn, run in-process unless this is given)")
    g.add_argument("--executor", choices=("serial", "pool", "dask"), default="pool",
                   help="serial (in this process, debugging), pool (local processes, default), dask")
    g.add_argument("--scheduler", metavar="ADDRESS", help="run on this Dask cluster (tcp://host:8786)")
    g.add_argument("--dask-local", type=int, metavar="N", help="start a Dask LocalCluster of N workers here")
    g.add_argument("--scratch", metavar="DIR",
                   help="folder for intermediate per-rank tables (default: a temporary one; on a cluster, "
                        "a folder every worker can reach)")


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
    scale = {"executor": args.executor, "workers": args.workers, "scheduler": args.scheduler,
             "dask_local": args.dask_local, "scratch": args.scratch}
    return analyze_and_report(args.paths, args.out, args.step_pattern, args.rank, args.quiet, args.expert_loads,
                              scale=scale, routing={"experts": args.experts, "topk": args.topk})


def analyze_and_report(paths, out, step_pattern, rank_specs, quiet, expert_loads_file=None,
                       scale: dict | None = None, routing: dict | None = None) -> int:
    """``scale``: executor options for ``profkit.scale.analyze_paths``; None: load, then analyze in memory."""
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
    from profkit.errors import TraceError
    from profkit.ingest.expert_loads import discover_expert_loads, read_expert_loads

    try:
        loads = read_expert_loads(expert_loads_file) if expert_loads_file else discover_expert_loads(paths)
    except TraceError as exc:
        print(f"profkit: skipped {exc}", file=sys.stderr)
        loads = None
    if loads is not None and routing and any(v is not None for v in routing.values()):
        from profkit.analyze.balance import ROUTING_ATTR, routing_of

        try:  # the flags override what the loads' source said
            loads.attrs[ROUTING_ATTR] = routing_of(loads, **routing) or {}
        except ValueError as exc:
            print(f"profkit: {exc}", file=sys.stderr)
            return 2
    if scale is not None:
        from profkit.scale import ScaleError, analyze_paths
        from profkit.cli.terminate import terminate_raises

        try:
            with terminate_raises():  # SIGTERM: the pool and the scratch folder go as with Ctrl-C
                analysis = analyze_paths(paths, step_pattern=step_pattern, expert_loads=loads, rank_map=rank_map,
                                         progress=progress, **scale)
        except (ScaleError, ValueError, OSError) as exc:
            print(f"profkit: {exc}", file=sys.stderr)
            return 1
    else:
        analysis = analyze(load(*paths, rank_map=rank_map, progress=progress), step_pattern, expert_loads=loads)
    for line in analysis.capture.skipped:
        print(f"profkit: skipped {line}", file=sys.stderr)
    if analysis.capture.parts.empty:
        print("profkit: nothing could be analyzed", file=sys.stderr)
        return 1
    if not quiet:
        print(render_summary(analysis))
    if out:
        written = write_outputs(analysis, out)
        if not quiet:
            print("\nwrote " + ", ".join(str(p) for p in written))
    return 0
