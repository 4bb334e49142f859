"""The driver: plan the tasks, run them on an executor, reduce the small tables into an Analysis.

The driver holds part descriptors, per-rank results (steps, collective candidates, cause
summaries, phase sums in the straggler windows: small next to the events) and the cross-rank
tables; never a rank's events, unless the in-memory path (``analyze_capture``) already holds them.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from profkit import schema
from profkit.align import Alignment
from profkit.align.estimate import estimate_from_ranks, one_host
from profkit.analyze import overhead
from profkit.analyze.balance import dp_imbalance, ep_balance
from profkit.analyze.compare import cause_step_table
from profkit.analyze.collectives import instances_from_candidates, match_instances
from profkit.analyze.result import Analysis
from profkit.analyze.steps import choose_step_marker
from profkit.analyze.straggler_episodes import straggler_episodes
from profkit.analyze.stragglers import WindowPhases, finish_stragglers, plan_stragglers, straggler_ranks
from profkit.analyze.consistency import verdict_consistency
from profkit.analyze.summary import rank_summary
from profkit.analyze.syncpoints import sync_point_table
from profkit.ingest.loader import Capture, RankMap, describe_parts, discover, resolve_ranks
from profkit.scale import stages
from profkit.scale.executors import SerialExecutor, make_executor
from profkit.scale.store import DiskStore, MemoryStore


SMALL_CAPTURE_BYTES = 64 << 20  # below this, the default pool runs in-process (unless --workers is given)


def _read(files: list[Path], skipped: list[str], rank_map, store, ex, say) -> tuple[Capture, dict[int, list[str]], list]:
    """Map over files: read each (cache), resolve ranks over the part descriptors."""
    say(f"reading {len(files)} file(s) on {ex.name} ({ex.workers} worker(s))")
    read = ex.map(stages.read_file_task,
                  [(i, str(f), rank_map.pids_for_file(f) or None, store) for i, f in enumerate(files)],
                  [f"file {f}" for f in files])
    parts = []
    for r in read:
        if r.skipped:
            skipped.append(r.skipped)
        parts.extend(r.parts)
    from profkit.ingest.manifest import manifest_facts

    unranked: list[dict] = []
    kept, warnings = resolve_ranks(parts, rank_map, skipped, manifest_facts(files), unranked)
    for p in parts:
        if p not in kept:
            store.drop(p.store_key)
    keys: dict[int, list[str]] = {}
    for p in kept:
        keys.setdefault(int(p.rank), []).append(p.store_key)
    capture = _capture_of(kept, skipped, warnings)
    capture.unranked = unranked
    return capture, keys, [r.stats for r in read]


def _setup(paths, executor, workers, scheduler, dask_local, rank_map, scratch):
    """The files (and the inputs already skipped), the rank map, the store and the executor."""
    if isinstance(rank_map, dict):
        rank_map = RankMap(by_file=dict(rank_map))
    rank_map = rank_map or RankMap()
    files, skipped = discover(paths)
    if executor == "pool" and not (scheduler or dask_local):
        small = sum(f.stat().st_size for f in files) < SMALL_CAPTURE_BYTES
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
    files, skipped, rank_map, store, ex = _setup(paths, executor, workers, scheduler, dask_local, rank_map, scratch)
    try:
        capture, keys, stats = _read(files, skipped, rank_map, store, ex, say)
        analysis = run_stages(capture, keys, store, ex, step_pattern, expert_loads, keep_aligned=keep_aligned,
                              stats=stats, progress=say)
    finally:
        ex.close()
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
    files, skipped, rank_map, store, ex = _setup(paths, executor, workers, scheduler, dask_local, rank_map, scratch)
    try:
        capture, keys, _ = _read(files, skipped, rank_map, store, ex, say)
        if not keys:
            return None, capture
        prep, alignment = _prepare(capture, keys, store, ex, None, align=align)
        ex.close()  # the merge itself runs here, one rank at a time: the workers are done
        with_events = [p.rank for p in prep if p.n_events]
        result = merge_ranks(StoreSource(store, capture, with_events), out_path, alignment=alignment,
                             progress=progress, **merge_options)
        if not align:
            result.notes = [NOT_ALIGNED.format(why="alignment was switched off")
                            if n.startswith("clocks not aligned") else n for n in result.notes]
    finally:
        ex.close()
        store.close()
    return result, capture


def analyze_capture(capture: Capture, step_pattern: str | None = None,
                    expert_loads: pd.DataFrame | None = None) -> Analysis:
    """The same stages, serially, on a capture already in memory (``pipeline.analyze``)."""
    store = MemoryStore()
    keys: dict[int, list[str]] = {}
    if len(capture.events):
        for rank, events in capture.events.groupby("rank", sort=True, observed=True):
            store.put(stages.events_key(int(rank)), events)
            keys[int(rank)] = []
    analysis = run_stages(capture, keys, store, SerialExecutor(), step_pattern, expert_loads, keep_aligned=True)
    frames = [store.get(stages.aligned_key(r)) for r in sorted(keys)]
    analysis.events = pd.concat(frames, ignore_index=True) if frames else capture.events
    store.close()
    return analysis


def _prepare(capture: Capture, keys: dict[int, list[str]], store, ex, step_pattern: str | None,
             align: bool = True) -> tuple[list, Alignment | None]:
    """Map 1 (each rank's events joined in the store, its clock facts) and the alignment over
    them (None: not asked for, or no rank has events). The parts and the matched candidates are
    released: the driver keeps only what the next stages need."""
    ranks = sorted(keys)
    prep = ex.map(stages.prepare_task, [(r, keys[r], store, step_pattern) for r in ranks],
                  [f"rank {r}" for r in ranks])
    for part_keys in keys.values():
        for k in part_keys:
            store.drop(k)
    clocks = [p.clock for p in prep if p.clock is not None]
    alignment = estimate_from_ranks(clocks, same_clock=one_host(capture.meta)) if align and clocks else None
    del clocks
    for p in prep:
        p.clock = None
    return prep, alignment


def run_stages(capture: Capture, keys: dict[int, list[str]], store, ex, step_pattern: str | None,
               expert_loads: pd.DataFrame | None, keep_aligned: bool = False, stats: list | None = None,
               progress: Callable[[str], None] | None = None) -> Analysis:
    say = progress or (lambda msg: None)
    stats = list(stats or [])
    ranks = sorted(keys)
    labels = [f"rank {r}" for r in ranks]
    # map 1 + reduce: clocks and the step marker
    prep, alignment = _prepare(capture, keys, store, ex, step_pattern)
    stats += [p.stats for p in prep]
    if alignment is not None and not keep_aligned:
        alignment.instances = None  # the raw-clock instances; the aligned ones are matched again below
    _trim()
    warnings = [f"alignment: {w}" for w in alignment.warnings] if alignment is not None else []
    chosen = choose_step_marker([p.markers for p in prep], step_pattern)
    sync_names = _sync_names(prep, alignment)
    say(f"aligned {len(ranks)} rank(s); analyzing each rank")
    # map 2 + reduce: per-rank facts on the common clock, then who arrived last where
    rr = ex.map(stages.rank_task,
                [(r, stages.rank_alignment(alignment, r) if alignment is not None else None, chosen, step_pattern,
                  store, keep_aligned, sync_names) for r in ranks], labels)
    stats += [r.stats for r in rr]
    steps = _concat([r.steps for r in rr], rr[0].steps if rr else None)
    if steps is None:
        from profkit.analyze.steps import step_table

        steps = step_table(schema.empty_frame())
    steps = steps.reset_index(drop=True)
    dropped_steps = {r.rank: r.dropped_steps for r in rr if r.dropped_steps}
    steps.attrs["dropped_steps"] = dropped_steps
    duplicates = {k: v for r in rr for k, v in r.duplicates.items()}
    if duplicates:
        counts = ", ".join(f"rank {r} {src}: {n}" for (r, src), n in sorted(duplicates.items()))
        warnings.append(f"duplicate spans dropped (kept the profkit span file's copy): {counts}")
    for r in rr:
        if r.cut:
            warnings.append(f"rank {r.rank}: {r.cut} event(s) outside the window every source recorded left out")
    for rank, n in sorted(dropped_steps.items()):
        warnings.append(f"rank {rank}: {n} step(s) left out: not recorded whole by every source "
                        "(outside or at the edge of a profiler window)")
    timelines = _concat([r.timelines for r in rr], None)
    windows = _concat([r.windows for r in rr], None)
    extents = _concat([r.extents for r in rr], None)
    cands = [r.candidates for r in rr if len(r.candidates)]
    for r in rr:
        r.candidates = None
    instances = instances_from_candidates(pd.concat(cands, ignore_index=True) if cands else None, complete_only=False)
    del cands
    matched = match_instances(instances) if len(instances) else None
    arrivals = None
    if matched is not None:
        arrivals = overhead.arrivals_from_match(instances[instances["complete"].astype(bool)], matched)
    if windows is None:
        windows = overhead.analysis_windows(schema.empty_frame(), steps)
    if timelines is None:
        from profkit.analyze.gpu import gpu_timelines

        timelines = gpu_timelines(schema.empty_frame())
    if extents is None:
        from profkit.analyze.straggler_arrivals import trace_windows

        extents = trace_windows(schema.empty_frame())
    plan = plan_stragglers(instances, extents, steps, matched)
    sync_points = sync_point_table(instances, matched)
    # map 3 + reduce: phase sums in the straggler windows and the causes, then the verdicts
    by_rank = dict(iter(arrivals.groupby("rank", sort=False))) if arrivals is not None else {}
    fin = ex.map(stages.finish_task,
                 [(r, plan.windows(r) if plan.measured else None, by_rank.get(r), store, keep_aligned)
                  for r in ranks], labels)
    stats += [f.stats for f in fin]
    phases = WindowPhases.concat([f.phases for f in fin]) if plan.measured else None
    for f in fin:
        f.phases = None
    _trim()
    per_rank, per_instance, lateness = finish_stragglers(plan, phases)
    del phases
    causes = overhead.rank_causes_from_summaries([f.causes for f in fin], windows)
    cause_steps = _concat([f.cause_steps for f in fin], cause_step_table(None))
    episodes = straggler_episodes(lateness, per_rank, plan.phase_steps if plan.phase_steps is not None else cause_steps)
    # map 4 + reduce: each rank's replay program, then the what-if replay over all of them
    impact = _impact(plan, steps, causes, cause_steps, per_rank, store, ex, ranks, labels, stats)
    charged = None
    if keep_aligned:
        charged = _concat([store.get(stages.charged_key(r)) for r in ranks], overhead._empty_charged())
    for r in ranks:
        stages.drop_rank_tables(store, r)
    tokens = _concat([r.tokens for r in rr], None)
    steps = _with_tokens(steps, tokens)  # batch facts of the annotation inside each step, where the marker has none
    balance = {"dp": dp_imbalance(steps)}
    if expert_loads is not None and len(expert_loads):
        balance["ep"] = ep_balance(expert_loads)
    marker = str(steps["marker"].iloc[0]) if len(steps) else None
    return Analysis(
        capture=capture,
        events=None,
        alignment=alignment,
        steps=steps,
        timelines=timelines,
        ranks=rank_summary(timelines, steps),
        step_marker=marker,
        causes=causes,
        charged=charged,
        cause_steps=cause_steps,
        stragglers=per_rank,
        straggler_instances=per_instance,
        lateness=lateness,
        straggler_ranks=straggler_ranks(per_rank),
        straggler_episodes=episodes,
        impact=impact,
        balance=balance,
        warnings=warnings,
        run_stats=stages.stats_frame(stats),
        sync_points=sync_points,
        phase_steps=plan.phase_steps,
        consistency=verdict_consistency(per_rank, straggler_ranks(per_rank), cause_steps),
    )


def _sync_names(prep: list, alignment: Alignment | None) -> dict[str, str]:
    """Span names that are sync points by cross-rank evidence (blocking OS calls, aligned ends),
    from every rank's small span facts, the samples moved onto the common clock."""
    from profkit.align import apply_alignment
    from profkit.analyze.syncpoints import decide_sync_names

    facts = [p.span_facts for p in prep if p.span_facts is not None and len(p.span_facts)]
    samples = [p.span_samples for p in prep if p.span_samples is not None and len(p.span_samples)]
    for p in prep:
        p.span_facts = p.span_samples = None
    if not facts:
        return {}
    sample = pd.concat(samples, ignore_index=True) if samples else None
    if sample is not None and alignment is not None:
        sample = apply_alignment(sample, alignment.ranks)
    return decide_sync_names(pd.concat(facts, ignore_index=True), sample)


def _impact(plan, steps, causes, cause_steps, per_rank, store, ex, ranks, labels, stats):
    """The impact table: per-rank programs on the executor, the replay on the driver."""
    from profkit.analyze import impact as impact_mod
    from profkit.analyze import impact_program

    syncs = impact_program.syncs_from_arrivals(plan.arrivals)
    by_rank = dict(iter(syncs.groupby("rank", sort=False))) if len(syncs) else {}
    steps_by_rank = dict(iter(steps.groupby("rank", sort=False))) if len(steps) else {}
    gpu_phases = frozenset(impact_mod.straggler_gpu_phases(per_rank))
    res = ex.map(stages.impact_task,
                 [(r, by_rank.get(r, impact_program.empty_syncs()), steps_by_rank.get(r), store, gpu_phases)
                  for r in ranks], labels)
    stats += [x.stats for x in res]
    programs = [x.program for x in res]
    for x in res:
        x.program = None
    straggler_list = straggler_ranks(per_rank)
    try:
        return impact_mod.impact_from_programs(programs, steps, causes=causes, cause_steps=cause_steps,
                                               stragglers=per_rank, straggler_ranks=straggler_list)
    except (ValueError, IndexError) as exc:  # a replay that cannot be built must not cost the other tables
        return impact_mod.empty_impact(f"impact not computed: {exc}")


def _trim() -> None:
    """Give freed memory back to the OS between stages (glibc keeps it otherwise, and the next
    stage's peak stacks on top): the driver's peak is what the benchmark and the user see."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _concat(frames: list[pd.DataFrame], empty: pd.DataFrame | None) -> pd.DataFrame | None:
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return empty
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].reset_index(drop=True)


def _with_tokens(steps: pd.DataFrame, tokens: pd.DataFrame | None) -> pd.DataFrame:
    """The step table with each step's token count and batch size as ``balance.step_tokens`` found them
    per rank (kept where the step table had them already)."""
    if tokens is None or not len(steps):
        return steps
    idx = pd.MultiIndex.from_arrays([steps["rank"].astype("int64"), steps["step"].astype("int64")])
    keyed = tokens.set_index(["rank", "step"])
    out = {}
    for col in ("num_tokens", "batch_size"):
        if col not in keyed:
            continue
        found = pd.array(keyed[col].reindex(idx).to_numpy(), dtype="Int64")
        have = pd.array(steps[col], dtype="Int64") if col in steps else pd.array([pd.NA] * len(steps), dtype="Int64")
        out[col] = pd.Series(have).fillna(pd.Series(found)).array
    return steps.assign(**out)


def _capture_of(parts: list, skipped: list[str], warnings: list[str]) -> Capture:
    """A Capture without events: which part became which rank, their meta, what was skipped."""
    parts_df, meta = describe_parts(parts, warnings)
    return Capture(events=schema.empty_frame(), parts=parts_df, meta=meta, skipped=skipped, warnings=warnings,
                   n_events=int(sum(p.n_events for p in parts)))
