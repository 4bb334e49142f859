"""Progress on stderr while the command runs: steps seen per rank and files written so far.

On a terminal one line is redrawn in place about once a second; otherwise (logs, CI) a line is
printed when the numbers changed, at most every ``log_every_s`` seconds, and once at the end.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from .spanscan import SpanScan


def count_outputs(out_dir: Path) -> dict[str, int]:
    """Files written so far, by kind (span files, torch traces, nsys reports)."""
    return {
        "span files": len(list(out_dir.glob("spans-pid*.jsonl"))),
        "torch traces": len(list(out_dir.glob("torch/*.pt.trace.json*"))),
        "nsys reports": len(list(out_dir.glob("nsys/*.nsys-rep"))) + len(list(out_dir.glob("nsys/*.qdstrm"))),
    }


def describe(scan: SpanScan, out_dir: Path, elapsed_s: float) -> str:
    steps = scan.steps_by_rank()
    if steps:
        shown = list(steps.items())
        text = ", ".join(f"r{r} {n}" for r, n in shown[:16])
        if len(shown) > 16:
            lo, hi = min(steps.values()), max(steps.values())
            text += f", ... ({len(shown)} ranks, {lo}-{hi})"
        step_text = f"steps {text}"
    else:
        step_text = "no steps yet"
    files = ", ".join(f"{n} {kind}" for kind, n in count_outputs(out_dir).items() if n)
    return f"profkit capture: {elapsed_s:5.0f} s | {step_text} | {files or 'no files yet'}"


class Progress:
    """Polls the span files and prints the progress line (nothing when quiet)."""

    def __init__(self, scan: SpanScan, out_dir: Path, quiet: bool, stream: TextIO | None = None,
                 log_every_s: float = 2.0):
        self.scan, self.out_dir, self.quiet = scan, out_dir, quiet
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.log_every_s = log_every_s
        self.t0 = time.monotonic()
        self._last_text = ""
        self._last_print = 0.0
        self._drawn = False

    def update(self, final: bool = False) -> None:
        """Poll the span files and show the numbers; ``final``: the last update of the run."""
        self.scan.poll()
        if self.quiet:
            return
        now = time.monotonic()
        text = describe(self.scan, self.out_dir, now - self.t0)
        if self.tty:
            self.stream.write("\r" + text[:200].ljust(80) + "\x1b[K")
            self.stream.flush()
            self._drawn = True
            return
        core = text.split("|", 1)[1]
        due = final or now - self._last_print >= self.log_every_s
        if core != self._last_text.split("|", 1)[-1] and due:
            print(text, file=self.stream, flush=True)
            self._last_text, self._last_print = text, now

    def end_line(self) -> None:
        """Finish the redrawn line so later messages start on a fresh one."""
        if self._drawn and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def say(self, message: str) -> None:
        if not self.quiet:
            self.end_line()
            print(f"profkit capture: {message}", file=self.stream, flush=True)
