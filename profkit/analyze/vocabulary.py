"""The cause vocabulary, in one place: the names idle GPU time is charged to, the categories and
GPU states of a charged interval, and what kind of time a cause stands for.

Why one place: the overhead attribution writes these names, and the straggler phases, episodes,
impact replay, consistency checks, comparisons and the DP-imbalance / scaling splits read them.
A new cause category is one line here (and its rule in ``overhead_rank``). The names are a public
contract (``causes.csv``, ``cause_steps.csv``, ``impact.csv``): never rename one.
"""
from __future__ import annotations

import re

import pandas as pd

# ---- cause names (the ``cause`` column) ------------------------------------------------------
GC_CAUSE = "gc"
LAUNCH_BOUND_CAUSE = "launch_bound"
HOST_SYNC_CAUSE = "host_sync"  # ``host_sync (<innermost span>)`` when it sits in one
UNATTRIBUTED_CAUSE = "unattributed (no host activity)"
BETWEEN_STEPS_CAUSE = "host work between steps"  # after a step annotation that covers part of the iteration
NO_HOST_CAUSE = "gpu idle (no host events)"

WAIT_PREFIX = "wait:"  # waiting in a collective, before (or without) knowing who arrived last
TRANSFER_PREFIX = "transfer:"  # the last arriver's own time in the collective: device work
WAITING_FOR_RANK = "waiting for rank"  # ``waiting for rank k``: k arrived last
VICTIM_PREFIXES = (WAITING_FOR_RANK, WAIT_PREFIX, TRANSFER_PREFIX)  # waiting for others: never a cause
HOST_SYNC_WAIT = WAIT_PREFIX + "collective (host sync)"  # straggler phase: the host blocked at a sync


def host_sync_cause(span: str) -> str:
    return f"{HOST_SYNC_CAUSE} ({span})"


def wait_cause(what: str) -> str:
    """``wait:<collective or span>``."""
    return WAIT_PREFIX + what


def waiting_for_rank(rank) -> str:
    """``waiting for rank k``."""
    return f"{WAITING_FOR_RANK} {rank}"


def transfer_cause(cause: str) -> str:
    """``wait:X`` of the last arriver itself -> ``transfer:X`` (other names unchanged)."""
    text = str(cause)
    return TRANSFER_PREFIX + text[len(WAIT_PREFIX):] if text.startswith(WAIT_PREFIX) else cause


WAITING_FOR_RANK_RE = re.compile(r"^waiting for rank (\d+)$")

# ---- categories of a charged interval (the ``category`` column) and GPU states -----------------
WAIT, GC, HOST_SYNC, LAUNCH_BOUND = "wait", "gc", "host_sync", "launch_bound"
SPAN, CPU_OP, PYTHON, SAMPLE, SELF = "span", "cpu_op", "python", "sample", "self"
UNATTRIBUTED, NO_HOST = "unattributed", "no_host"
BETWEEN_STEPS = "between_steps"
CATEGORIES = (WAIT, GC, HOST_SYNC, LAUNCH_BOUND, SPAN, CPU_OP, PYTHON, SAMPLE, SELF, UNATTRIBUTED, NO_HOST,
              BETWEEN_STEPS)
GPU_STATES = ("idle", "comm_only", "launch_run")
GPU_CATEGORY = "gpu"  # a straggler phase on the GPU (``gpu:<kernel>``)

# ---- cause kinds: waiting for other ranks, device transfer, or host work ------------------------
_WAIT = re.compile(r"^(?:waiting for rank \d+|wait:.*)$")
_DEVICE = re.compile(r"^transfer:.*$")

DEVICE, HOST = "device", "host"  # and WAIT


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
