"""``profkit dashboard --db runs.sqlite -o dashboard.html``: the regression history as one HTML file."""
from __future__ import annotations

import argparse
import sqlite3
import sys

from profkit.cli.history import add_db_option, add_filter_options, parse_meta

EPILOG = """\
panels come from a JSON spec (--spec; default: the panels shipped with profkit, dashboards/default.json
in the repository): a title, then
"panels": [{"title": ..., "metric": "step_ns" | "gpu_busy_ns" | "gap_ns" | "late_ns" |
"balancedness" | "straggler_score" | "cause:<name>" | "cause:*", "aggregation": "p50" | "p90" |
"p99" | "mean" | "max", "threshold": "5%", "top": 5 (for cause:*)}], and optionally
"x": "index" | "time", "baseline": "previous" | "first", "resamples": 1000.

The file is self-contained (plotly.js inlined once; it opens offline and makes no requests).

examples:
  profkit dashboard --db runs.sqlite -o dashboard.html
  profkit dashboard --db runs.sqlite -o nightly.html --label 'nightly-*' --meta gpus=H200x8 --spec dashboards/default.json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="write an HTML dashboard of the regression history (trends, noise bands, regressions)",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_db_option(p)
    p.add_argument("-o", "--out", required=True, metavar="HTML", help="output file")
    p.add_argument("--spec", metavar="JSON", help="panel definitions (default: the shipped dashboards/default.json)")
    add_filter_options(p)
    p.add_argument("--seed", type=int, default=0, metavar="K", help="bootstrap seed (default 0)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from profkit.history import HistoryDB, RunError, SchemaError
    from profkit.report.dashboard import SpecError, build_dashboard, load_spec

    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    try:
        meta = parse_meta(args.meta)
        spec = load_spec(args.spec)
        with HistoryDB(args.db, create=False) as db:
            listed = db.runs(args.label, meta)
            say(f"loading {len(listed)} run(s) from {args.db}")
            runs = [db.load(int(i)) for i in listed["id"]]
    except (ValueError, RunError, SchemaError, SpecError, sqlite3.Error) as exc:
        print(f"profkit dashboard: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print("profkit dashboard: no runs match the filters", file=sys.stderr)
        return 1
    filters = "".join([f", label {' or '.join(args.label)}" if args.label else "",
                       "".join(f", {k}={v}" for k, v in meta.items())])
    page = build_dashboard(runs, spec, seed=args.seed, filters=filters, progress=say)
    Path(args.out).write_text(page, encoding="utf-8")
    if not args.quiet:
        print(f"wrote {args.out} ({len(spec.panels)} panels, {len(runs)} runs)")
    return 0
