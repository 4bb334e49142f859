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
call must not change its allocator for good: glibc has no way back to its sliding threshold; tried
on the driver in the twenty-fifth round, its CPU at DEP32 x 100 fell 11% but the wall time ~2%,
within the noise) nor to Dask's workers (a shared cluster's nanny tunes its own allocator).
``PROFKIT_MALLOC=0`` leaves glibc as it is.

Arrow's buffers come from the system allocator too, for the length of an analysis
(``system_arrow_pool``; set for good in the pool's workers, whose glibc keeps what they free).
pyarrow's default pool, mimalloc, hands the pages it frees back to the OS and takes fresh,
zeroed ones again (``perf`` of a DEP8 x 100 run on 2 forked workers: its page faults, 2 MB huge
pages zeroed whole, were ~7% of all samples). Measured side by side (``benchmarks/HISTORY.md``,
the twenty-fifth round): DEP32 x 100 3.25 -> 3.12 s and the driver's CPU 1.16 -> 1.07 s (medians
of 5); alternated with the code before, DEP8 x 100 1.02 -> 0.97 s, DEP32 x 100 3.05 -> 3.00 s
(medians of 7). A user's own ``ARROW_DEFAULT_MEMORY_POOL`` is always kept, and ``PROFKIT_MALLOC=0``
leaves Arrow's pool as it is.
"""
from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from profkit.flags import env_on

ENV = "PROFKIT_MALLOC"
ARROW_ENV = "ARROW_DEFAULT_MEMORY_POOL"  # the user's choice of Arrow's pool (pyarrow reads it at import)
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


def _arrow_pool_is_ours() -> bool:
    """Whether profkit may choose Arrow's pool here: not switched off, not chosen by the user."""
    return env_on(ENV) and not os.environ.get(ARROW_ENV, "").strip()


@contextmanager
def system_arrow_pool() -> Iterator[bool]:
    """Arrow's default memory pool is the system allocator inside the ``with`` (the module
    docstring says why); the caller's pool is back on return. Yields whether it was changed.
    Buffers made inside stay valid after: each keeps the pool it came from."""
    if not _arrow_pool_is_ours():
        yield False
        return
    import pyarrow as pa

    old = pa.default_memory_pool()
    system = pa.system_memory_pool()
    if old.backend_name == system.backend_name:
        yield False
        return
    pa.set_memory_pool(system)
    try:
        yield True
    finally:
        pa.set_memory_pool(old)


def system_arrow_pool_for_good() -> bool:
    """``system_arrow_pool`` for the rest of this process: a pool worker's (spawned ones do not
    inherit the caller's setting; forked ones have it already)."""
    if not _arrow_pool_is_ours():
        return False
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    return True
