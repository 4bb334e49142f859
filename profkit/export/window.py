"""Which part of a capture to export: ``--steps A:B`` or ``--time T0:T1``.

``--steps A:B`` (inclusive; either side may be empty) keeps, per rank, what overlaps the span
from the start of its step A to the end of its step B, plus the GPU work launched in that span
that ran after it (kernels queued by the last step). Step numbers are the step table's.

``--time T0:T1`` keeps what overlaps [T0, T1] on the merged (aligned) timeline. Each side is
either seconds from the start of the merged trace (its earliest event): ``0.5``, ``2``,
``1.25s``, ``250ms``, ``40us``; or absolute nanoseconds: a plain integer of 13 or more digits
(``1795972928988048694``) or any integer with an ``ns`` suffix. Either side may be empty.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import numpy as np
import pandas as pd

from profkit import schema

ABSOLUTE_DIGITS = 13  # 10**12 ns is 16 minutes after an epoch: smaller plain numbers are seconds
_UNITS_NS = {"s": 10**9, "ms": 10**6, "us": 10**3}
_VALUE = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*(ns|us|ms|s)?\s*$")


class WindowError(ValueError):
    """A --steps / --time value that cannot be parsed (a user error)."""


@dataclass(frozen=True)
class StepWindow:
    first: int | None = None
    last: int | None = None

    def __str__(self) -> str:
        return f"steps {'' if self.first is None else self.first}:{'' if self.last is None else self.last}"


@dataclass(frozen=True)
class TimePoint:
    ns: int
    relative: bool  # ns after the merged trace's first event, else absolute


@dataclass(frozen=True)
class TimeWindow:
    start: TimePoint | None = None
    end: TimePoint | None = None

    def resolve(self, trace_start_ns: int) -> tuple[int | None, int | None]:
        """Absolute [start_ns, end_ns] (None = open) given the merged trace's first timestamp."""
        def absolute(point: TimePoint | None) -> int | None:
            if point is None:
                return None
            return trace_start_ns + point.ns if point.relative else point.ns
        return absolute(self.start), absolute(self.end)


def _split(text: str, flag: str) -> tuple[str, str]:
    if text.count(":") != 1:
        raise WindowError(f"{flag} {text!r}: expected A:B (either side may be empty)")
    left, right = text.split(":")
    return left.strip(), right.strip()


def parse_steps(text: str) -> StepWindow:
    left, right = _split(text, "--steps")
    try:
        first = int(left) if left else None
        last = int(right) if right else None
    except ValueError:
        raise WindowError(f"--steps {text!r}: step numbers must be integers") from None
    if first is not None and last is not None and last < first:
        raise WindowError(f"--steps {text!r}: the last step is before the first")
    return StepWindow(first, last)


def parse_time_point(text: str) -> TimePoint:
    m = _VALUE.match(text)
    if not m:
        raise WindowError(f"{text!r} is not a time: use seconds (0.5, 2s, 250ms, 40us) or absolute ns (13+ digits, or 123ns)")
    number, unit = m.group(1), m.group(2)
    if unit == "ns":
        if not re.fullmatch(r"[+-]?\d+", number):
            raise WindowError(f"{text!r}: absolute nanoseconds must be an integer")
        return TimePoint(int(number), relative=False)
    if unit is None and re.fullmatch(r"[+-]?\d+", number) and len(number.lstrip("+-")) >= ABSOLUTE_DIGITS:
        return TimePoint(int(number), relative=False)
    try:
        ns = Decimal(number) * _UNITS_NS[unit or "s"]
    except InvalidOperation:  # pragma: no cover - the regex admits only numbers
        raise WindowError(f"{text!r} is not a number") from None
    return TimePoint(int(ns.to_integral_value()), relative=True)


def parse_time(text: str) -> TimeWindow:
    left, right = _split(text, "--time")
    try:
        window = TimeWindow(parse_time_point(left) if left else None, parse_time_point(right) if right else None)
    except WindowError as exc:
        raise WindowError(f"--time {exc}") from None
    if window.start and window.end and window.start.relative == window.end.relative and window.end.ns < window.start.ns:
        raise WindowError(f"--time {text!r}: the end is before the start")
    return window


def overlapping(events: pd.DataFrame, lo_ns: int | None, hi_ns: int | None) -> np.ndarray:
    """Mask of events that overlap [lo_ns, hi_ns] (None = open side); instants on the edges count."""
    keep = np.ones(len(events), dtype=bool)
    if lo_ns is not None:
        keep &= events["end_ns"].to_numpy(np.int64) >= lo_ns
    if hi_ns is not None:
        keep &= events["start_ns"].to_numpy(np.int64) <= hi_ns
    return keep


def select_steps(steps: pd.DataFrame, window: StepWindow) -> pd.DataFrame:
    keep = np.ones(len(steps), dtype=bool)
    if window.first is not None:
        keep &= steps["step"].to_numpy(np.int64) >= window.first
    if window.last is not None:
        keep &= steps["step"].to_numpy(np.int64) <= window.last
    return steps[keep]


def with_launched_gpu_work(events: pd.DataFrame, keep: np.ndarray) -> np.ndarray:
    """Extend ``keep`` by GPU rows whose launch (same pid and correlation) is kept."""
    kind = events["kind"].astype("string")
    corr = events["correlation"]
    launch = keep & (kind == schema.RUNTIME).fillna(False).to_numpy(dtype=bool) & corr.notna().to_numpy(dtype=bool)
    if not launch.any():
        return keep
    gpu = ~keep & kind.isin(schema.GPU_KINDS).fillna(False).to_numpy(dtype=bool) & corr.notna().to_numpy(dtype=bool)
    if not gpu.any():
        return keep
    pid = events["pid"].astype("Int64").fillna(-1).to_numpy(np.int64)
    corr_ids = corr.astype("Int64").fillna(-1).to_numpy(np.int64)
    kept_keys = pd.MultiIndex.from_arrays([pid[launch], corr_ids[launch]])
    gpu_keys = pd.MultiIndex.from_arrays([pid[gpu], corr_ids[gpu]])
    extra = np.zeros(len(events), dtype=bool)
    extra[np.flatnonzero(gpu)[gpu_keys.isin(kept_keys)]] = True
    return keep | extra
