"""What kind of time a cause name stands for: waiting for other ranks, device transfer, or host work.

Why one place: several analyses split step time by these kinds (the DP-imbalance price, the
scaling decomposition, GPU-only vs serving), and the overhead analyzer's cause names evolve
(``waiting for rank k`` after the last arriver is known, ``wait:<collective or span>`` before or
without that). Every split asks these functions, never a string test of its own.
"""
from __future__ import annotations

import re

import pandas as pd

_WAIT = re.compile(r"^(?:waiting for rank \d+|wait:.*)$")
_DEVICE = re.compile(r"^transfer:.*$")

WAIT, DEVICE, HOST = "wait", "device", "host"


def is_wait_cause(name: object) -> bool:
    """Time a rank spent waiting for other ranks at a sync point (a victim's time, never a cause of
    its own): ``waiting for rank k`` and ``wait:*``."""
    return isinstance(name, str) and bool(_WAIT.match(name))


def is_device_cause(name: object) -> bool:
    """Communication the last arriver itself spent in a collective (``transfer:*``): device work,
    not waiting and not host overhead."""
    return isinstance(name, str) and bool(_DEVICE.match(name))


def cause_kind(name: object) -> str:
    """``WAIT``, ``DEVICE`` or ``HOST`` (everything else a step's GPU-idle time is charged to)."""
    return WAIT if is_wait_cause(name) else DEVICE if is_device_cause(name) else HOST


def kinds_of(names: pd.Series) -> pd.Series:
    """``cause_kind`` of each name, computed once per distinct name."""
    uniq = pd.unique(names.astype(object))
    return names.map({n: cause_kind(n) for n in uniq})
