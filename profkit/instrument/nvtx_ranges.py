"""NVTX ranges in a ``profkit`` domain, with attributes built once per (name, category).

On only when the ``nvtx`` package imports and ``PROFKIT_NVTX`` is not ``0``. With no tool
attached nvtx's calls are no-ops costing ~40 ns per push/pop pair; under Nsight Systems they
become ranges on the thread, which is how profkit's spans and nsys's timeline are matched.
"""
from __future__ import annotations

import threading
from typing import Any

from profkit.flags import env_on

DOMAIN = "profkit"
_PALETTE = ("blue", "green", "orange", "purple", "cyan", "red", "yellow", "magenta")


class NvtxRanges:
    """Bound ``push``/``pop`` (nested, per thread) and ``start``/``end`` (async-safe) of one domain."""

    def __init__(self, nvtx_module: Any):
        self.domain = nvtx_module.get_domain(DOMAIN)
        self.push = self.domain.push_range
        self.pop = self.domain.pop_range
        self.start = self.domain.start_range
        self.end = self.domain.end_range
        self._attrs: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def attributes(self, name: str, category: str) -> Any:
        key = (name, category)
        attr = self._attrs.get(key)
        if attr is None:
            with self._lock:
                attr = self._attrs.get(key)
                if attr is None:
                    color = _PALETTE[sum(category.encode()) % len(_PALETTE)]
                    attr = self.domain.get_event_attributes(message=name, color=color, category=category)
                    self._attrs[key] = attr
        return attr


_state: dict[str, Any] = {}


def enabled_by_env() -> bool:
    return env_on("PROFKIT_NVTX")


def ranges() -> NvtxRanges | None:
    """The process's NVTX ranges, or None when disabled or ``nvtx`` is missing (decided once)."""
    if "ranges" not in _state:
        found: NvtxRanges | None = None
        if enabled_by_env():
            try:
                import nvtx

                if nvtx.enabled():
                    found = NvtxRanges(nvtx)
            except Exception:  # noqa: BLE001 - a broken nvtx install must not break the rank
                found = None
        _state["ranges"] = found
    return _state["ranges"]


def mark_rank(rank: int | None) -> bool:
    """An NVTX mark ``profkit rank=N`` in the profkit domain: how an nsys export learns each pid's rank.

    Emitted when a capture window opens (nsys with ``--capture-range=cudaProfilerApi`` records
    nothing before), so every process with GPU work in the window names its own rank.
    """
    found = ranges()
    if found is None or rank is None:
        return False
    try:
        found.domain.mark(found.attributes(f"profkit rank={int(rank)}", "identity"))
    except Exception:  # noqa: BLE001 - never break the rank
        return False
    return True


def reset() -> None:
    """Decide again on next use (tests toggle ``PROFKIT_NVTX``)."""
    _state.clear()
