"""Errors that name the input and the problem, so one bad file never hides the others."""
from __future__ import annotations

from pathlib import Path


class TraceError(Exception):
    """A trace file could not be read. ``str()`` is one line: ``<path>: <problem>``."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = " ".join(str(problem).split())[:500]  # one line, bounded
        super().__init__(f"{self.path}: {self.problem}")


class DuplicateRankError(TraceError):
    """Two inputs claim the same rank."""

    def __init__(self, rank: int, first: str, second: str):
        self.rank = rank
        self.first = first
        self.second = second
        super().__init__(second, f"claims rank {rank}, which {first} already claims")


class ScaleError(RuntimeError):
    """A task of an analysis run failed; the message names it (rank, stage, file) and why."""
