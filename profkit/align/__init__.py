"""One timeline for every rank and source (pure functions over the event table).

    from profkit.align import estimate, apply_alignment
    alignment = estimate(capture.events)          # Alignment: .ranks, .sources, .warnings
    aligned = apply_alignment(capture.events, alignment)

Within a rank, sources share the host clock through their anchors and are refined by spans seen
in two sources (``sources.py``). Across ranks, clocks are fitted to the ends of collective
instances shared by several ranks, never to their starts, so arrival skew survives (``ranks.py``).
A span recorded by several sources of one rank (profkit span file, NVTX, ``record_function``) is
kept once by ``drop_duplicate_spans`` on the aligned events (``dedupe.py``).
The clock convention is the simulator's truth.json convention (``clock.py``).
"""
from __future__ import annotations

from profkit.align.clock import to_host, to_reference
from profkit.align.dedupe import drop_duplicate_spans
from profkit.align.estimate import Alignment, apply_alignment, estimate, estimate_alignment
from profkit.align.ranks import ANCHOR_ERROR_NS, RANK_COLUMNS
from profkit.align.sources import SOURCE_COLUMNS

__all__ = [
    "ANCHOR_ERROR_NS", "Alignment", "RANK_COLUMNS", "SOURCE_COLUMNS", "apply_alignment", "drop_duplicate_spans",
    "estimate", "estimate_alignment", "to_host", "to_reference",
]
