"""``profkit capture -- CMD ...``: run a command with profkit switched on in all its processes.

Launcher side (this process): the environment that instruments every Python child
(:mod:`.environment`), optional wrappers (Nsight Systems, py-spy; :mod:`.tools`), the child in its
own session with Ctrl-C forwarding and no orphans (:mod:`.process`), progress from the span files
(:mod:`.spanscan`, :mod:`.progress`), post-processing (:mod:`.nsys`, :mod:`.pyspy`) and
``DIR/manifest.json`` (:mod:`.manifest`). :func:`.runner.run_capture` ties them together.

In-process side (inside every child, standard library only): :mod:`.agent` records how each
process ends (``DIR/.capture/pid{pid}.status``) and opens the CUDA profiler window by step
(:mod:`.cuda_steps`); :mod:`.bootstrap` is the ``sitecustomize`` that starts it.
"""
from __future__ import annotations

CAPTURE_FORMAT = 1
MANIFEST = "manifest.json"
STATUS_DIR = ".capture"  # not a trace suffix: the loader never reads it
