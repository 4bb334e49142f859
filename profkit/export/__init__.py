"""Export a capture as one merged trace: Perfetto protobuf (default) or Chrome JSON.

    from profkit.export import merge_capture, parse_steps
    merge_capture(profkit.load("traces/"), "merged.pftrace", steps=parse_steps("10:12"))

Exporters lay out and encode events; they never compute metrics (step facts come from
``profkit.analyze.steps``, clock offsets from ``profkit.align``).
"""
from __future__ import annotations

from profkit.export.merge import AUTO, FORMATS, MergeResult, merge_capture, profkit_aligner
from profkit.export.window import StepWindow, TimeWindow, WindowError, parse_steps, parse_time

__all__ = [
    "AUTO", "FORMATS", "MergeResult", "StepWindow", "TimeWindow", "WindowError",
    "merge_capture", "parse_steps", "parse_time", "profkit_aligner",
]
