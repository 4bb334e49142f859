"""Python's cyclic garbage collector told to look less often while profkit analyzes.

Why: the analysis keeps its data in numpy and Arrow buffers, where the collector finds next to no
cycles (tens of objects a run), yet it walked them all the time. Measured here (2 cores, a pool of
2 forked workers, time inside the collector during ``analyze_paths``; ``benchmarks/HISTORY.md``,
the twenty-fourth round):

- the driver of DEP32 x 100: 85-150 ms, one full pass (over every object the caller's imports
  made: pandas', pyarrow's, ~66k) taking 40-60 ms of it, in the middle of its reduces while
  the workers wait; the workers: 30-45 ms each;
- DEP32 x 1,000: driver 140 ms, workers 85-150 ms each (one full pass took 107 ms);
- with both changes below: the driver 10-30 ms, each worker ~1 ms.

What, for the length of one analysis (``scale.run.analyze_paths``, ``merge_paths``):

- the objects that exist when it starts are frozen (``gc.freeze``): never walked again, and the
  forked workers do not write their GC headers, so their pages stay shared (the use Python's
  documentation gives for ``gc.freeze`` before ``fork``);
- the young generation is collected every ``GEN0_THRESHOLD`` new containers, not every 700.

Both are undone when it returns. A caller that froze objects itself keeps its freeze (nothing is
frozen or unfrozen then; the threshold still applies). ``PROFKIT_ANALYSIS_GC=0`` leaves the
collector as it is. Results do not depend on it: the collector frees only cyclic garbage.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from profkit.flags import env_on

ENV = "PROFKIT_ANALYSIS_GC"
GEN0_THRESHOLD = 10_000  # new containers between young-generation passes (Python's default: 700)


@contextmanager
def fewer_collections() -> Iterator[bool]:
    """The collector as the module docstring says, inside the ``with``; yields whether it applies."""
    if not env_on(ENV):
        yield False
        return
    old = gc.get_threshold()
    frozen = gc.get_freeze_count() == 0  # the caller's own freeze is left alone
    if frozen:
        gc.freeze()
    gc.set_threshold(max(old[0], GEN0_THRESHOLD), *old[1:])
    try:
        yield True
    finally:
        gc.set_threshold(*old)
        if frozen:
            gc.unfreeze()


def in_worker() -> None:
    """A pool worker's young-generation threshold (a spawned worker does not inherit the caller's;
    a forked one has it already). Its objects are not frozen: it imports as it goes."""
    if env_on(ENV):
        old = gc.get_threshold()
        gc.set_threshold(max(old[0], GEN0_THRESHOLD), *old[1:])
