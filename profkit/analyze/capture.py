"""The capture users hold (``profkit.load``): the loaded events with two quick looks at them.

Why here and not in ``profkit.ingest.loader``: a step table and a GPU timeline are analysis, and
readers never analyze. ``profkit.load`` returns this ``Capture``; everything of the loaded data
itself (events, parts, meta, skipped, warnings) is the reader's ``ingest.loader.Capture``.
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Callable

import pandas as pd

from profkit.analyze.gpu import gpu_timelines
from profkit.analyze.steps import step_table
from profkit.ingest import loader


class Capture(loader.Capture):
    """A loaded capture (``ingest.loader.Capture``) with ``steps()`` and ``gpu_timeline()``."""

    def steps(self, step_pattern: str | None = None) -> pd.DataFrame:
        """One row per (rank, step): ``analyze.steps.step_table`` of the events."""
        return step_table(self.events, step_pattern)

    def gpu_timeline(self) -> pd.DataFrame:
        """Busy GPU intervals per (rank, device): ``analyze.gpu.gpu_timelines`` of the events."""
        return gpu_timelines(self.events)

    @classmethod
    def of(cls, capture: loader.Capture) -> "Capture":
        """The same data (no copy), with the quick looks."""
        return cls(**{f.name: getattr(capture, f.name) for f in fields(capture)})


def load(*paths: str | Path, rank_map: loader.RankMap | dict[str, int] | None = None,
         progress: Callable[[str], None] | None = None) -> Capture:
    """``ingest.loader.load`` (every trace under ``paths``, never raising for one bad file),
    as a ``Capture`` with ``steps()`` and ``gpu_timeline()``. Ranks come from trace metadata, else
    the file name, else the order of the inputs; an explicit ``rank_map`` wins over all."""
    return Capture.of(loader.load(*paths, rank_map=rank_map, progress=progress))


