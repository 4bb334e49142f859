"""GC pauses as spans (category ``gc``, name ``gc.gen{generation}``) through ``gc.callbacks``.

Gen-2 pauses are a known cause of frozen steps on wide-EP ranks; each pause becomes a span with
its collected/uncollectable counts (the 6th element in the span file), and an NVTX range so the
pause shows in Nsight Systems too.
"""
from __future__ import annotations

import gc
from typing import Any

from . import nvtx_ranges
from .clock import now_ns
from .recorder import CURRENT, GC_CATEGORY
from .strings import STRINGS


class GcSpans:
    """The ``gc.callbacks`` entry. Collections never nest or overlap (they hold the GIL)."""

    def __init__(self) -> None:
        self.category_id = STRINGS.id(GC_CATEGORY)
        self.name_ids = {gen: STRINGS.id(f"gc.gen{gen}") for gen in range(3)}
        ranges = nvtx_ranges.ranges()
        self._push = ranges.push if ranges is not None else None
        self._pop = ranges.pop if ranges is not None else None
        self._attrs = ({gen: ranges.attributes(f"gc.gen{gen}", GC_CATEGORY) for gen in range(3)}
                       if ranges is not None else {})
        self._t0 = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if self._push is not None:
                self._push(self._attrs.get(info.get("generation", 2), self._attrs[2]))
            self._t0 = now_ns()
            return
        t1 = now_ns()
        if self._pop is not None:
            self._pop()
        gen = info.get("generation", 2)
        name_id = self.name_ids.get(gen)
        if name_id is None:
            name_id = self.name_ids[gen] = STRINGS.id(f"gc.gen{gen}")
        CURRENT.rec.add_args(name_id, self.category_id, self._t0, t1,
                             {"collected": info.get("collected", 0),
                              "uncollectable": info.get("uncollectable", 0)})


_installed: list[GcSpans] = []


def install() -> GcSpans:
    """Add the callback once per process (idempotent)."""
    if not _installed:
        cb = GcSpans()
        gc.callbacks.append(cb)
        _installed.append(cb)
    return _installed[0]


def uninstall() -> None:
    for cb in _installed:
        try:
            gc.callbacks.remove(cb)
        except ValueError:
            pass
    _installed.clear()
