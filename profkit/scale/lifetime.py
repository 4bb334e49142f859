"""What a run leaves behind when its driver is stopped from outside.

A driver that raises (Ctrl-C included) closes its pool and removes its scratch folder on the way
out (``run.analyze_paths``). Two ways out skipped that, both measured on a DEP32 x 1,000 run:
- ``kill``/``timeout``/a scheduler's SIGTERM to the driver alone: Python's default action ends
  it at once, no ``finally`` runs;
- SIGKILL (the kernel's OOM killer picks the largest process: often the driver).
Either way the pool's forked workers lived on for good, each blocked on a task queue nobody
writes to, holding its peak heap (``allocator`` keeps what they free), and the scratch folder
(every rank's tables: GBs at DEP256) stayed in the temporary directory.

Here: a worker leaves when its parent is gone (``exit_with_parent``); the CLI's runs turn SIGTERM
into an exception so they clean up as Ctrl-C does (``profkit.cli.terminate``); a scratch folder
whose owner died is removed by the next run (``profkit.analyze.scratch``); a parsed-trace cache
entry half written by a worker ended mid-write is removed then, or by a writer an hour later
(``profkit.ingest.cache``).
"""
from __future__ import annotations

import os
import threading
import time

PARENT_POLL_S = 0.5  # how often a worker looks for its parent: two wake-ups a second, nothing measurable
ORPHAN_EXIT_CODE = 75  # a worker that outlived its driver (nobody reads it: for ``ps`` and tests)


def exit_with_parent(interval_s: float = PARENT_POLL_S) -> bool:
    """In a pool worker: end this process once its parent has gone (re-parented, ``getppid``
    changes). A thread that polls, not ``PR_SET_PDEATHSIG``: that signal follows the parent
    *thread* that forked, and a pool re-made after a worker's death is forked from whichever
    thread submitted next (``pipeline._Then`` submits from its own). False where there is no
    ``getppid`` to watch."""
    if not hasattr(os, "getppid"):
        return False
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(ORPHAN_EXIT_CODE)  # mid-task: its result has nobody to go to

    threading.Thread(target=watch, name="profkit-parent-watch", daemon=True).start()
    return True
