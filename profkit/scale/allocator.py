"""glibc's allocator told to keep what the analysis frees, in the processes profkit owns.

Why: the analysis makes and drops arrays of tens to hundreds of MB many times a rank (sorts,
takes, masks over a rank's 10^5-10^6 events). glibc serves every block above its mmap threshold
(128 KB, rising with use to at most 32 MB) with a fresh ``mmap`` and gives it back with
``munmap`` when freed, so each such array pays its page faults again, and the heap's free top is
trimmed back to the OS as soon as it passes the trim threshold. With both thresholds raised, a
freed block is reused by the next array of the rank or of the next rank. Measured side by side on
DEP32 x 1,000 (``benchmarks/scale.py``; ``benchmarks/HISTORY.md``, "Issue #16's thirteenth
round"): the workers' CPU 52.9 -> 48.5 s (8%), the wall time 37.9 -> 36.2 s; small captures unchanged.

What it costs: a process keeps its peak heap until it ends (or calls ``malloc_trim``), so a
worker's peak memory is unchanged but held while it waits for its next task. Applied only to the
process pool's workers, which end with the analysis: never to the caller's process (a library
call must not change its allocator for good; the driver's own CPU did not change when it was
tried there) nor to Dask's workers (a shared cluster's nanny tunes its own allocator).
``PROFKIT_MALLOC=0`` leaves glibc as it is.
"""
from __future__ import annotations

import ctypes
import sys

from profkit.flags import env_on

ENV = "PROFKIT_MALLOC"
_M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
# blocks below this come from the heap, freed ones are reused; glibc takes an int here
MMAP_THRESHOLD_BYTES = 1 << 30
TRIM_THRESHOLD_BYTES = (1 << 31) - 1

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds in this process (once); False where this is not
    glibc on Linux, ``PROFKIT_MALLOC=0`` says not to, or glibc refused a value."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux") or not env_on(ENV):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, or no C library by that name
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                                      TRIM_THRESHOLD_BYTES))
    return _applied
