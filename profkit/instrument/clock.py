"""The one clock spans are timed with, and (wall, monotonic) anchors that place it.

Spans use ``time.monotonic_ns`` (CLOCK_MONOTONIC on Linux): never steps backwards, is shared
by every process of a host (so an engine-core process and its worker compare directly), and is
the clock py-spy and the bundled engine's own timings use. ``perf_counter_ns`` reads the same
clock on Linux at the same cost, but Python documents its reference point as undefined.
Wall time (``time_ns``) is only read for anchors: one when the recorder starts and one at every
flush, so a reader can map monotonic to wall time piecewise and measure drift (NTP slews).
"""
from __future__ import annotations

import time

now_ns = time.monotonic_ns
CLOCK_NAME = "monotonic"


def anchor() -> tuple[int, int]:
    """(wall_ns, mono_ns) read back to back: the tightest of three tries, mono at the midpoint."""
    best: tuple[int, int, int] | None = None
    for _ in range(3):
        m0 = now_ns()
        wall = time.time_ns()
        m1 = now_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, wall, (m0 + m1) // 2)
    assert best is not None
    return best[1], best[2]
