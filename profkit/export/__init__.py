"""Export a capture as one merged trace: Perfetto protobuf (default) or Chrome JSON.

    from profkit.export import merge_capture, parse_steps
    merge_capture(profkit.load("traces/"), "merged.pftrace", steps=parse_steps("10:12"))
    merge_ranks(source, "merged.pftrace", alignment=alignment)   # one rank in memory at a time

``merge_ranks`` reads a ``RankSource`` (``profkit.export.source``: ``ranks``, ``meta``,
``events(rank)``, ``summary(rank)``) one rank at a time; ``merge_capture`` is the same over a
loaded capture.

Exporters lay out and encode events; they never compute metrics (step facts come from
``profkit.analyze.steps``, clock offsets from ``profkit.align``).
"""
from __future__ import annotations

from profkit.export.merge import AUTO, FORMATS, MergeResult, merge_capture, merge_ranks, profkit_aligner
from profkit.export.source import SUMMARY_COLUMNS, FrameSource, RankSource, RankSummary, summarize_rank
from profkit.export.window import StepWindow, TimeWindow, WindowError, parse_steps, parse_time

__all__ = [
    "AUTO", "FORMATS", "SUMMARY_COLUMNS", "FrameSource", "MergeResult", "RankSource", "RankSummary", "StepWindow",
    "TimeWindow", "WindowError", "merge_capture", "merge_ranks", "parse_steps", "parse_time", "profkit_aligner",
    "summarize_rank",
]
