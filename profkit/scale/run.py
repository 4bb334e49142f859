"""The driver over files: read them on an executor, then ``analyze.pipeline.run_stages`` on it.

Reading is a map over files on the executor; the analysis is the same ``run_stages`` that the
in-memory ``analyze`` runs serially, here on a process pool or Dask with a scratch-folder store.
The driver holds part descriptors, per-rank results and the cross-rank tables; never a rank's events.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from profkit import schema
from profkit.analyze import stages
from profkit.analyze.pipeline import prepare_ranks, run_stages
from profkit.analyze.result import Analysis
from profkit.analyze.store import DiskStore
from profkit.ingest import readers, scanned
from profkit.ingest.loader import Capture, RankMap, describe_parts, discover, resolve_ranks
from profkit.scale.allocator import system_arrow_pool
from profkit.scale.collector import fewer_collections
from profkit.scale.executors import make_executor, start_method


# below these many bytes of trace files the default pool runs in this process (unless workers are
# given): ``small_capture_bytes``
SMALL_CAPTURE_BYTES = 64 << 20  # where the pool's workers would spawn
SMALL_FORKED_CAPTURE_BYTES = 1 << 20  # where they fork


def small_capture_bytes() -> int:
    """The size below which the default pool runs a capture in this process. Forked workers start in
    milliseconds with what this process imported (``executors.start_method``) and pay back from
    about a megabyte of traces (measured side by side, median of 3, this process against 2 forked
    workers: 0.3-0.6 MB captures of 2-4 ranks even or 0.04 s slower, DEP8 x 10 (1.3 MB) 0.78 ->
    0.62 s, a real 4-rank GPU capture (16 MB) 2.37 -> 1.70 s, DEP8 x 100 (12 MB) 1.36 -> 1.08 s,
    DEP32 x 100 (48 MB) 5.68 -> 3.78 s); spawned ones import pandas and the analysis again first
    (~0.8 s before the first task on 2 cores), which only a larger capture pays back."""
    return SMALL_FORKED_CAPTURE_BYTES if start_method() == "fork" else SMALL_CAPTURE_BYTES


def _read(files: list[Path], skipped: list[str], rank_map, store, ex, say, step_pattern: str | None = None
          ) -> tuple[Capture, dict[int, list[str]], list, dict]:
    """Map over files: read each (cache), resolve ranks over the part descriptors. Returns the capture
    without events, each rank's part keys, the tasks' stats and the parts the read tasks prepared."""
    from profkit.ingest.manifest import manifest_facts

    scanned.build_for(files, say)  # here, once, before the workers start
    readers.preload(files)  # forked workers inherit them
    facts = manifest_facts(files)
    # a file of one part is prepared in its read task as the rank it names, unless the capture's
    # manifest gives that rank another of these files (its span file beside its torch trace): the
    # rank is prepared once its parts are joined then, and a read task's prepare would be thrown away
    joined = facts.files_of_shared_ranks(files)
    say(f"reading {len(files)} file(s) on {ex.name} ({ex.workers} worker(s))")
    read = ex.map(stages.read_file_task,
                  [(i, str(f), rank_map.pids_for_file(f) or None, store, step_pattern, f.resolve() not in joined)
                   for i, f in enumerate(files)],
                  [f"file {f}" for f in files])
    parts, prepared = [], {}
    for r in read:
        prepared.update(r.prepared)
        r.prepared = None
        if r.skipped:
            skipped.append(r.skipped)
        parts.extend(r.parts)
    unranked: list[dict] = []
    kept, warnings = resolve_ranks(parts, rank_map, skipped, facts, unranked)
    for p in parts:
        if p not in kept:
            store.drop(p.store_key)
    keys: dict[int, list[str]] = {}
    for p in kept:
        keys.setdefault(int(p.rank), []).append(p.store_key)
    capture = _capture_of(kept, skipped, warnings)
    capture.unranked = unranked
    return capture, keys, [r.stats for r in read], prepared


def _setup(paths, executor, workers, scheduler, dask_local, rank_map, scratch):
    """The files (and the inputs already skipped), the rank map, the store and the executor."""
    if isinstance(rank_map, dict):
        rank_map = RankMap(by_file=dict(rank_map))
    rank_map = rank_map or RankMap()
    files, skipped = discover(paths)
    if executor == "pool" and not (scheduler or dask_local):
        small = sum(f.stat().st_size for f in files) < small_capture_bytes()
        if len(files) < 2 or (workers is None and small):
            executor = "serial"  # starting worker processes would cost more than they save
        workers = max(1, min(workers or os.cpu_count() or 1, len(files)))  # no more processes than files
    return files, skipped, rank_map, DiskStore(scratch), make_executor(executor, workers, scheduler, dask_local)


def analyze_paths(
    paths: Iterable[str | Path],
    *,
    executor: str = "pool",
    workers: int | None = None,
    scheduler: str | None = None,
    dask_local: int | None = None,
    step_pattern: str | None = None,
    expert_loads: pd.DataFrame | None = None,
    rank_map: RankMap | dict[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    scratch: str | Path | None = None,
    keep_aligned: bool = False,
) -> Analysis:
    """Read and analyze the traces under ``paths`` as maps over files and ranks.

    ``scratch``: the folder for intermediate tables (default: a new temporary folder, removed at
    the end; on a multi-machine Dask cluster, a folder every worker can reach). ``keep_aligned``
    keeps each rank's aligned events there (``analysis.store``).
    """
    paths = list(paths)
    say = progress or (lambda msg: None)
    t_start = time.perf_counter()
    with fewer_collections(), system_arrow_pool():  # set before the pool's workers fork: see collector, allocator
        files, skipped, rank_map, store, ex = _setup(paths, executor, workers, scheduler, dask_local, rank_map, scratch)
        try:
            capture, keys, stats, prepared = _read(files, skipped, rank_map, store, ex, say, step_pattern)
            analysis = run_stages(capture, keys, store, ex, step_pattern, expert_loads, keep_aligned=keep_aligned,
                                  stats=stats, progress=say, prepared=prepared)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM in the CLI: stop now, not after the running tasks
            ex.stop()
            raise
        except BaseException:
            ex.close()
            raise
        else:
            ex.close(wait=False)  # every task is done: the workers exit while the caller goes on
        finally:
            if not keep_aligned:
                store.close()
    analysis.store = store if keep_aligned else None
    say(f"analyzed in {time.perf_counter() - t_start:.1f} s")
    return analysis


class StoreSource:
    """``export.merge_ranks``' source over the prepared ranks in a store: one rank read at a time
    (on its own clocks; the merge applies the alignment), the first pass from a few columns."""

    def __init__(self, store, capture: Capture, ranks: list[int]) -> None:
        self.store, self.ranks, self.meta, self.parts = store, list(ranks), capture.meta, capture.parts

    def events(self, rank: int) -> pd.DataFrame:
        return stages.rank_events(self.store, rank)

    def summary(self, rank: int):
        from profkit.export.source import SUMMARY_COLUMNS, summarize_rank

        return summarize_rank(rank, stages.rank_events(self.store, rank, list(SUMMARY_COLUMNS)))


def merge_paths(
    paths: Iterable[str | Path],
    out_path: str | Path,
    *,
    align: bool = True,
    executor: str = "pool",
    workers: int | None = None,
    scheduler: str | None = None,
    dask_local: int | None = None,
    rank_map: RankMap | dict[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    scratch: str | Path | None = None,
    **merge_options,
):
    """``profkit merge`` without holding the capture: files read and ranks prepared on the
    executor (their clocks estimated as ``analyze_paths`` does), then written one rank at a time.
    Returns (``MergeResult``, the Capture without events: parts, skipped, warnings); the result is
    None when no file could be read (nothing is written)."""
    from profkit.export.merge import NOT_ALIGNED, merge_ranks

    paths = list(paths)
    say = progress or (lambda msg: None)
    with fewer_collections(), system_arrow_pool():
        files, skipped, rank_map, store, ex = _setup(paths, executor, workers, scheduler, dask_local, rank_map, scratch)
        try:
            capture, keys, _, prepared = _read(files, skipped, rank_map, store, ex, say)
            if not keys:
                return None, capture
            prep, alignment = prepare_ranks(capture, keys, store, ex, None, align=align, prepared=prepared,
                                            keep_instances=False)  # the merge reads the clocks only
            ex.close()  # the merge itself runs here, one rank at a time: the workers are done
            with_events = [p.rank for p in prep if p.n_events]
            result = merge_ranks(StoreSource(store, capture, with_events), out_path, alignment=alignment,
                                 progress=progress, **merge_options)
            if not align:
                result.notes = [NOT_ALIGNED.format(why="alignment was switched off")
                                if n.startswith("clocks not aligned") else n for n in result.notes]
        except KeyboardInterrupt:
            ex.stop()
            raise
        finally:
            ex.close()
            store.close()
    return result, capture


def _capture_of(parts: list, skipped: list[str], warnings: list[str]) -> Capture:
    """A Capture without events: which part became which rank, their meta, what was skipped."""
    parts_df, meta = describe_parts(parts, warnings)
    return Capture(events=schema.empty_frame(), parts=parts_df, meta=meta, skipped=skipped, warnings=warnings,
                   n_events=int(sum(p.n_events for p in parts)))
