"""``profkit history add OUT --db runs.sqlite --label NAME``: record an analysis in the regression
history; ``profkit history list``: what is in it."""
from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from datetime import datetime, timezone

EPILOG = """\
the database is one SQLite file (WAL mode; schema versioned and migrated on open). Several CI jobs
may add runs to it at once: each waits for the others' short write (--timeout) and lands whole.
It records the run's metrics (summary.json, causes.csv, stragglers.csv when present) and its
per-step samples (steps.csv; cause_steps.csv, lateness.csv, balance.csv when present), which give
`profkit compare` and `profkit dashboard` their bootstrap intervals.

examples:
  profkit analyze traces/ -o out/ && profkit history add out/ --db runs.sqlite --label nightly-1234 \\
      --meta commit=abc123 --meta gpus=H200x8
  profkit history list --db runs.sqlite --label 'nightly-*'
"""


def default_db() -> str:
    return os.environ.get("PROFKIT_HISTORY_DB", "runs.sqlite")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("history", help="record analyses in a regression history database and list them",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    hsub = p.add_subparsers(dest="history_command", required=True)

    add = hsub.add_parser("add", help="record an analysis folder (OUT of `profkit analyze -o OUT`)",
                          epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add.add_argument("out", metavar="OUT", help="analysis folder (summary.json, steps.csv, ...)")
    add_db_option(add)
    add.add_argument("--label", help="the run's name (default: the folder's name); labels may repeat")
    add.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata to filter on later; repeatable")
    add.add_argument("--time", metavar="ISO", help="when the run happened (ISO 8601, default now), e.g. to backfill")
    add.add_argument("--timeout", type=float, default=120.0, metavar="S", help="wait this long for other writers (default 120)")
    add.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    add.set_defaults(run=run_add)

    ls = hsub.add_parser("list", help="list recorded runs in time order")
    add_db_option(ls)
    add_filter_options(ls)
    ls.set_defaults(run=run_list)


def add_db_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=default_db(), metavar="FILE",
                   help="history database (default $PROFKIT_HISTORY_DB or runs.sqlite; created if missing)")


def add_filter_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--label", action="append", default=[], metavar="GLOB", help="runs whose label matches (shell pattern); repeatable")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="runs with this metadata; repeatable, all must match")


def parse_meta(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--meta {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def parse_time(text: str | None) -> int | None:
    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--time {text!r}: expected ISO 8601, e.g. 2026-11-29T17:25:00") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1e9)


def run_add(args: argparse.Namespace) -> int:
    from profkit.history import HistoryDB, RunError, SchemaError, read_analysis_dir

    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    try:
        meta = parse_meta(args.meta)
        created_ns = parse_time(args.time)
        say(f"reading {args.out}")
        run = read_analysis_dir(args.out, label=args.label)
        for note in run.notes:
            say(f"note: {note}")
        say(f"writing to {args.db}")
        with HistoryDB(args.db, timeout_s=args.timeout) as db:
            run_id = db.add(run, label=args.label, meta=meta, created_ns=created_ns)
    except (ValueError, RunError, SchemaError) as exc:
        print(f"profkit history add: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"profkit history add: {args.db}: {exc} (nothing recorded)", file=sys.stderr)
        return 2
    if not args.quiet:
        extra = f", {run.cause_steps['cause'].nunique()} causes with per-step samples" if run.cause_steps is not None else ""
        print(f"recorded run #{run_id} '{run.label if not args.label else args.label}' in {args.db}: "
              f"{run.n_ranks} rank(s), {len(run.steps)} step samples{extra}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from profkit.history import HistoryDB, RunError, SchemaError

    try:
        meta = parse_meta(args.meta)
        with HistoryDB(args.db, create=False) as db:
            runs = db.runs(args.label, meta)
            metrics = {int(r): dict(db.conn.execute("SELECT name, value FROM metrics WHERE run_id = ?", (int(r),)).fetchall())
                       for r in runs["id"]}
    except (ValueError, RunError, SchemaError, sqlite3.Error) as exc:
        print(f"profkit history list: {args.db}: {exc}", file=sys.stderr)
        return 2
    if not len(runs):
        print("no runs")
        return 0
    print(f"{'id':>4}  {'time (UTC)':19}  {'label':24}  {'ranks':>5}  {'steps':>5}  {'step p50 ms':>11}  meta")
    for r in runs.itertuples():
        when = datetime.fromtimestamp(r.created_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        p50 = metrics[int(r.id)].get("step_ns_p50")
        p50s = f"{p50 / 1e6:11.3f}" if p50 is not None else f"{'-':>11}"
        meta_s = " ".join(f"{k}={v}" for k, v in r.meta.items())
        print(f"{r.id:>4}  {when}  {str(r.label)[:24]:24}  {r.n_ranks:>5}  {r.n_steps:>5}  {p50s}  {meta_s}")
    return 0
