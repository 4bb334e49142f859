"""The ``profkit`` command: one subcommand per job."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from profkit import __version__
from profkit.cli.terminate import TERMINATED_EXIT_CODE, Terminated


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="profkit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"profkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from profkit.cli import analyze, balance, capture, compare, dashboard, demo, history, merge, simulate

    capture.register(sub)
    analyze.register(sub)
    merge.register(sub)
    history.register(sub)
    compare.register(sub)
    balance.register(sub)
    dashboard.register(sub)
    demo.register(sub)
    simulate.register(sub)
    return parser


# subcommands with their own full argument parser: argv after the name is handed over as is
PASSTHROUGH = {"simulate": "profkit.simulate.cli"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        import importlib

        return int(importlib.import_module(PASSTHROUGH[argv[0]]).main(argv[1:]) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except Terminated:  # SIGTERM inside ``terminate.terminate_raises``: cleaned up as for Ctrl-C
        print("terminated", file=sys.stderr)
        return TERMINATED_EXIT_CODE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
