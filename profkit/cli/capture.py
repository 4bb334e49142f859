"""``profkit capture [--torch] [--nsys] [--pyspy] [--steps A:B] [-o DIR] -- CMD ...``.

Runs CMD with profkit's instrumentation on in every Python process it starts, optionally under
torch.profiler (by step, in every rank), Nsight Systems or py-spy, and leaves a folder that
``profkit analyze DIR`` reads with nothing else. Also runnable as ``python -m profkit.cli.capture``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

EXAMPLES = """examples:
  profkit capture -o cap -- python -m profkit.engine --ranks 4 --steps 30 --inject gc:rank=2,every=5
  profkit capture --torch --steps 10:30 -o cap -- python -m profkit.engine --ranks 2 --steps 40 --device cuda
  VLLM_WORKER_MULTIPROC_METHOD=spawn profkit capture --nsys --steps 100:120 -o cap -- vllm serve MODEL ...
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--out", metavar="DIR", help="capture folder (default: profkit-capture-YYYYmmdd-HHMMSS)")
    p.add_argument("-f", "--force", action="store_true", help="replace a capture already in DIR")
    p.add_argument("--torch", action="store_true", help="torch.profiler in every rank over the --steps window")
    p.add_argument("--nsys", action="store_true",
                   help="run under Nsight Systems (nsys from $PROFKIT_NSYS, PATH or Nsight Compute's copy)")
    p.add_argument("--pyspy", action="store_true", help="sample every Python process with py-spy (skipped, with "
                                                         "the reason, where py-spy is missing or ptrace is refused)")
    p.add_argument("--steps", metavar="A:B", help="profiler window: from step A up to step B, the same step "
                                                  "numbers on every rank (torch default 10:30; nsys default: all)")
    p.add_argument("--hooks", metavar="SETS", help="hook sets, comma-separated (default vllm,engine; 'none')")
    p.add_argument("--grace", type=float, metavar="S",
                   help="seconds between SIGINT and SIGTERM when stopping the command (default 5; 30 with --nsys)")
    p.add_argument("--pyspy-rate", type=int, default=100, metavar="HZ", help="py-spy samples per second (100)")
    p.add_argument("--nsys-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for nsys profile (repeatable), e.g. --nsys-arg=--sample=none")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress, only errors")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to capture")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capture", help="run a command with profkit instrumentation (and torch/nsys/py-spy) on "
                                       "in all its processes", description=__doc__, epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from profkit.capture.runner import CaptureError, CaptureOptions, parse_steps, run_capture

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    out = Path(args.out or time.strftime("profkit-capture-%Y%m%d-%H%M%S"))
    try:
        opts = CaptureOptions(
            command=command, out_dir=out, torch=args.torch, nsys=args.nsys, pyspy=args.pyspy,
            steps=parse_steps(args.steps) if args.steps else None,
            hooks=[h.strip() for h in args.hooks.split(",")] if args.hooks else None,
            force=args.force, quiet=args.quiet, grace_s=args.grace, pyspy_rate=args.pyspy_rate,
            nsys_args=list(args.nsys_arg))
        return run_capture(opts)
    except CaptureError as exc:
        print(f"profkit capture: {exc}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="profkit capture", description=__doc__, epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
