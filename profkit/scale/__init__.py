"""Scale: the analysis as a map over ranks and a reduce over small cross-rank tables.

    from profkit.scale import analyze_paths
    analysis = analyze_paths(["capture/"], executor="pool", workers=2)
    analysis.run_stats   # one row per task: stage, rank, worker, wall_s, peak_rss_bytes, events

Executors: "serial" (in this process, for debugging), "pool" (a local process pool, the default)
and "dask" (a Dask distributed cluster: ``scheduler="tcp://host:8786"`` or ``dask_local=N`` for a
LocalCluster). Every executor runs the same stage functions (``profkit.analyze.stages``), so the tables are the
same bit for bit; ``profkit.analyze.pipeline.analyze`` runs them serially on a loaded capture.
"""
from __future__ import annotations

from profkit.scale.executors import EXECUTORS, ScaleError, make_executor
from profkit.analyze.pipeline import analyze_capture  # noqa: F401 - read as profkit.scale.analyze_capture too
from profkit.scale.run import analyze_paths, merge_paths

__all__ = ["EXECUTORS", "ScaleError", "analyze_capture", "analyze_paths", "make_executor", "merge_paths"]
