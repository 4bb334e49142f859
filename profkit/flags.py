"""Switches read from the environment (``PROFKIT_CACHE``, ``PROFKIT_GC``, ``PROFKIT_NVTX``,
``PROFKIT_MALLOC``, ``PROFKIT_ANALYSIS_GC``): one reading of "off" for all of them, so a user's
``OFF`` or ``False`` turns any of them off alike. A base module: the instrumentation inside every
rank reads it too."""
from __future__ import annotations

import os

OFF = ("0", "false", "no", "off")


def env_on(name: str, default: bool = True) -> bool:
    """Whether switch ``name`` is on: off for ``0``, ``false``, ``no`` or ``off`` (any case, spaces
    around ignored), on for any other value; ``default`` where it is unset or empty."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in OFF
