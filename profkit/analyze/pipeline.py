"""One analysis of a capture: the tables every face of profkit (terminal, files, report) reads.

Every rank is first moved onto one clock (``profkit.align``); steps, GPU timelines and causes
are computed on the aligned events, so cross-rank facts (who waited for whom) are comparable.
The analysis is a map over ranks (the stage functions of ``profkit.analyze.stages``) and a reduce
over small cross-rank tables (``run_stages``, here). ``analyze`` runs the stages serially in
memory on a loaded capture; ``profkit.scale`` runs the same ``run_stages`` over files on a process
pool or Dask, so both give the same tables. The result, ``Analysis``, is defined in
``profkit.analyze.result`` (read as ``pipeline.Analysis`` too).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from profkit import schema
from profkit.align import Alignment, apply_alignment
from profkit.align.clock import TIME_COLUMNS
from profkit.align.estimate import estimate_from_ranks, one_host
from profkit.analyze import impact_replay as rp
from profkit.analyze import overhead, stages
from profkit.analyze.balance import dp_imbalance, ep_balance
from profkit.analyze.compare import cause_step_table
from profkit.analyze.consistency import verdict_consistency
from profkit.analyze.result import Analysis
from profkit.analyze.stages import SerialExecutor
from profkit.analyze.steps import choose_step_marker
from profkit.analyze.store import MemoryStore
from profkit.analyze.straggler_arrivals import host_sync_ends, sync_ends
from profkit.analyze.straggler_episodes import straggler_episodes
from profkit.analyze.stragglers import WindowPhases, finish_stragglers, plan_stragglers, straggler_ranks
from profkit.analyze.summary import rank_summary
from profkit.analyze.sync_table import sync_point_table
from profkit.collectives.instances import instances_from_candidates, match_instances
from profkit.errors import ScaleError
from profkit.ingest.loader import Capture


def analyze(capture: Capture, step_pattern: str | None = None, expert_loads: pd.DataFrame | None = None) -> Analysis:
    """``expert_loads``: rows ``rank, step, layer, tokens`` (see ``balance.parse_expert_loads``).

    Runs the same per-rank stages as ``profkit.scale.analyze_paths`` (serially, in memory), so
    an analysis of a loaded capture and of files on a cluster are the same tables.
    """
    return analyze_capture(capture, step_pattern, expert_loads)


def analyze_capture(capture: Capture, step_pattern: str | None = None,
                    expert_loads: pd.DataFrame | None = None) -> Analysis:
    """The same stages, serially, on a capture already in memory (``analyze``)."""
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


def run_stages(capture: Capture, keys: dict[int, list[str]], store, ex, step_pattern: str | None,
               expert_loads: pd.DataFrame | None, keep_aligned: bool = False, stats: list | None = None,
               progress: Callable[[str], None] | None = None, prepared: dict | None = None) -> Analysis:
    """The maps and reduces of ``stages`` over the ranks in ``keys`` (rank -> its parts' store keys);
    ``prepared``: parts the read tasks prepared already (``stages.read_file_task``)."""
    say = progress or (lambda msg: None)
    stats = list(stats or [])
    ranks = sorted(keys)
    labels = [f"rank {r}" for r in ranks]
    _warm_up_replay(capture)
    trim = _trim if capture.event_count >= TRIM_MIN_EVENTS else _keep
    # map 1 + reduce: clocks and the step marker
    # the raw-clock instances are kept only with the aligned events; the aligned ones are matched again below
    prep, alignment = prepare_ranks(capture, keys, store, ex, step_pattern, prepared=prepared,
                                    keep_instances=keep_aligned, keep_candidates=True)
    stats += [p.stats for p in prep]
    trim()
    warnings = [f"alignment: {w}" for w in alignment.warnings] if alignment is not None else []
    chosen = choose_step_marker([p.markers for p in prep], step_pattern)
    sync_names = _sync_names(prep, alignment)
    movable = _movable_candidates(prep, alignment, sync_names)
    say(f"aligned {len(ranks)} rank(s); analyzing each rank")
    # map 2 + reduce: per-rank facts on the common clock, then who arrived last where; the
    # collective instances are matched here meanwhile where the driver can move the candidates
    rank_alignments = stages.rank_alignments(alignment, ranks) if alignment is not None else {}
    ranking = ex.submit(stages.rank_task,
                        [(r, rank_alignments.get(r), chosen, step_pattern, store, keep_aligned, sync_names,
                          movable is not None and r in movable) for r in ranks], labels)
    moved = _moved(movable, alignment, rank_alignments) if movable is not None else None
    del rank_alignments
    del movable
    early = _collectives([] if moved.joined is None else [moved.joined]) if moved is not None else None
    rr = ranking.results()
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
    if early is not None and all(r.candidates is None if r.rank in moved.ranks
                                 else r.candidates is None or not len(r.candidates) for r in rr):
        instances, matched, arrivals, sync_points, ends = early  # every rank's candidates were the moved ones
    else:  # a rank dropped events after all (or nothing was moved): its candidates came back
        moved = moved or _Moved(None, frozenset())
        cands = [r.candidates if r.candidates is not None else moved.of(r.rank) for r in rr]
        instances, matched, arrivals, sync_points, ends = _collectives([c for c in cands if c is not None and len(c)])
        del cands
    del early, moved
    for r in rr:
        r.candidates = None
    # map 3: the causes, on the workers while the straggler windows are planned here
    by_rank = dict(iter(arrivals.groupby("rank", sort=False))) if arrivals is not None else {}
    causing = ex.submit(stages.causes_task, [(r, by_rank.get(r), store, keep_aligned) for r in ranks], labels)
    del arrivals, by_rank
    if windows is None:
        windows = overhead.analysis_windows(schema.empty_frame(), steps)
    if timelines is None:
        from profkit.analyze.gpu import gpu_timelines

        timelines = gpu_timelines(schema.empty_frame())
    if extents is None:
        from profkit.analyze.straggler_arrivals import trace_windows

        extents = trace_windows(schema.empty_frame())
    plan = plan_stragglers(instances, extents, steps, matched, *ends)
    del ends
    if matched is not None:  # finish_stragglers reads the instances only to match them: they are matched
        plan.instances = None  # every rank's collective rows: the largest table the driver would keep
    del instances
    # maps 4 and 5, submitted together: phase sums in the straggler windows (the verdicts are
    # made of them here, while the workers go on to the map after), then each rank's replay
    # program (but its GPU work: which kernels are the stragglers' is a verdict)
    finishing = ex.submit(stages.finish_task, [(r, plan.windows(r), store) for r in ranks], labels) \
        if plan.measured else None
    in_store = capture.event_count >= PROGRAMS_IN_STORE_EVENTS
    programs = _submit_programs(plan, steps, store, ex, ranks, labels, in_store=in_store)
    caused = causing.results()
    stats += [c.stats for c in caused]
    causes = overhead.rank_causes_from_summaries([c.causes for c in caused], windows)
    cause_steps = _concat([c.cause_steps for c in caused], cause_step_table(None))
    del caused
    fin = finishing.results() if finishing is not None else []
    stats += [f.stats for f in fin]
    # the replay of what needs no verdict, by a worker once the programs are in (map 6)
    beside = _replay_beside(programs, steps, causes, store, ex) if in_store else None
    try:
        phases = WindowPhases.join([f.phases for f in fin]) if plan.measured else None
        for f in fin:
            f.phases = None
        trim()
        per_rank, per_instance, lateness = finish_stragglers(plan, phases, released=trim)
        del phases
        del fin
        plan.host_w = plan.gpu_w = plan.acc_w = None  # the windows were summed: the verdicts are made
        plan.arrivals = None  # every rank's arrival rows (hundreds of MB at DEP256): the programs hold what is left to use
        trim()
        episodes = straggler_episodes(lateness, per_rank, plan.phase_steps if plan.phase_steps is not None else cause_steps)
        # what needs no replay, made while the last programs are still being built (the replay
        # reads the step table as it was: the tokens are added to a new one)
        tokens = _concat([r.tokens for r in rr], None)
        with_tokens = _with_tokens(steps, tokens)  # batch facts of the annotation inside each step, where the marker has none
        summary = rank_summary(timelines, with_tokens)
        balance = {"dp": dp_imbalance(with_tokens)}
        if expert_loads is not None and len(expert_loads):
            balance["ep"] = ep_balance(expert_loads)
        verdict = straggler_ranks(per_rank)
        consistency = verdict_consistency(per_rank, verdict, cause_steps)
        # reduce of map 5: the what-if replay over every rank's program
        impact = _impact(programs, steps, causes, cause_steps, per_rank, store, ex, stats, beside, trim)
    finally:
        if beside is not None:
            beside.cancel()  # (failed before it was used: no task is submitted to a closing executor)
    charged = None
    if keep_aligned:
        charged = _concat([store.get(stages.charged_key(r)) for r in ranks], overhead._empty_charged())
    for r in ranks:
        stages.drop_rank_tables(store, r)
    steps = with_tokens
    marker = str(steps["marker"].iloc[0]) if len(steps) else None
    return Analysis(
        capture=capture,
        events=None,
        alignment=alignment,
        steps=steps,
        timelines=timelines,
        ranks=summary,
        step_marker=marker,
        causes=causes,
        charged=charged,
        cause_steps=cause_steps,
        stragglers=per_rank,
        straggler_instances=per_instance,
        lateness=lateness,
        straggler_ranks=verdict,
        straggler_episodes=episodes,
        impact=impact,
        balance=balance,
        warnings=warnings,
        run_stats=stages.stats_frame(stats),
        sync_points=sync_points,
        phase_steps=plan.phase_steps,
        consistency=consistency,
    )


def prepare_ranks(capture: Capture, keys: dict[int, list[str]], store, ex, step_pattern: str | None,
                  align: bool = True, prepared: dict | None = None, keep_instances: bool = True,
                  keep_candidates: bool = False) -> tuple[list, Alignment | None]:
    """Map 1 (each rank's events joined in the store, its clock facts) and the alignment over
    them (None: not asked for, or no rank has events). The parts and the matched candidates are
    released: the driver keeps only what the next stages need.

    ``prepared``: by part store key, what a read task prepared of a file of one part, as the rank
    the file names; adopted where that part alone became that rank (its tables are moved to the
    rank's keys), the rank prepared as usual otherwise. ``keep_instances``: keep the raw-clock
    collective instances in ``alignment.instances`` (``estimate_from_ranks``); ``keep_candidates``:
    each rank's candidates on its own clock in its result's ``candidates`` (``_movable_candidates``)."""
    ranks = sorted(keys)
    prepared = prepared or {}
    adopted = {r: prepared[keys[r][0]] for r in ranks
               if len(keys[r]) == 1 and keys[r][0] in prepared and prepared[keys[r][0]].rank == r}
    prep = ex.map(stages.prepare_task, [(r, keys[r], store, step_pattern, r in adopted) for r in ranks],
                  [f"rank {r}" for r in ranks])
    prep = [adopted.get(p.rank, p) for p in prep]
    for part_keys in keys.values():
        for k in part_keys:
            store.drop(k)
    for k in prepared:  # what was prepared as a rank the resolution did not make it
        store.drop(stages.prepared_candidates_key(k))
    clocks = [p.clock for p in prep if p.clock is not None]
    alignment = estimate_from_ranks(clocks, same_clock=one_host(capture.meta), keep_instances=keep_instances) \
        if align and clocks else None
    del clocks
    for p in prep:
        if keep_candidates and p.clock is not None:
            p.candidates = p.clock.candidates
        p.clock = None
    return prep, alignment


def _movable_candidates(prep: list, alignment: Alignment | None, sync_names: dict[str, str]) -> dict | None:
    """By rank (ascending), its prepared candidates, which ``rank_task`` will only move onto the
    common clock (it drops no event, and no span name is a sync point by cross-rank evidence: it
    would find the candidates again on the aligned events then), so the driver can move them
    itself and match the instances while the ranks are analyzed; None unless every rank is such
    (``stages.one_stream``). Releases the prepared candidates from ``prep``."""
    raw = {p.rank: p.candidates for p in sorted(prep, key=lambda p: p.rank) if p.candidates is not None}
    can = alignment is not None and not sync_names and all(p.one_stream for p in prep if p.candidates is not None)
    for p in prep:
        p.candidates = None
    return raw if can and raw else None


@dataclass
class _Moved:
    """The movable candidates on the common clock (``_moved``): every rank's rows in one table, in
    rank order (None where no rank has any), and the ranks whose candidates were moved."""

    joined: pd.DataFrame | None
    ranks: frozenset

    def of(self, rank: int) -> pd.DataFrame | None:
        """One rank's moved candidates, index from 0 (None: none): the fall-back's, where another
        rank's candidates came back after all."""
        if self.joined is None or rank not in self.ranks:
            return None
        return self.joined[self.joined["rank"].to_numpy(np.int64) == rank].reset_index(drop=True)


def _moved(movable: dict, alignment: Alignment, rank_alignments: dict[int, Alignment]) -> _Moved:
    """``_movable_candidates`` on the common clock, as ``rank_task`` moves them (each with the
    ``stages.rank_alignments`` entry its task was given, or all at once with ``alignment``), joined
    in rank order. Joined first and moved at once where every rank's table has the same columns and
    dtypes and no time column is a float or object one: each row moves by its own rank's clock, so
    the numbers and dtypes are those of each rank's moved alone and joined after (32 tables moved
    one by one and joined cost ~31 ms at DEP32 x 100, on the driver while the rank tasks run; ~7.5
    ms so). A float time column becomes Int64 only on the ranks with a missing value: those go one
    by one."""
    frames = [c for c in movable.values() if len(c)]
    if not frames:
        return _Moved(None, frozenset(movable))
    first = frames[0].dtypes
    alike = all(f.dtypes.equals(first) for f in frames[1:]) and not any(
        first[c].kind in "fO" for c in TIME_COLUMNS if c in first.index)
    if alike:
        joined = apply_alignment(pd.concat(frames, ignore_index=True), alignment)
    else:
        joined = pd.concat([apply_alignment(c, rank_alignments[r]) for r, c in movable.items() if len(c)],
                           ignore_index=True)
    return _Moved(joined, frozenset(movable))


def _collectives(cands: list[pd.DataFrame]) -> tuple:
    """The collective instances of every rank's candidates on the common clock (in rank order),
    matched: (instances, one row per instance or None, the complete ones' arrivals or None, the
    sync point table, each rank's sync exits for the straggler plan: ``straggler_arrivals.sync_ends``
    and ``host_sync_ends``, a pair)."""
    instances = instances_from_candidates(pd.concat(cands, ignore_index=True) if cands else None, complete_only=False)
    matched = match_instances(instances) if len(instances) else None
    arrivals = None
    if matched is not None:
        arrivals = overhead.arrivals_from_match(instances[instances["complete"].astype(bool)], matched)
    ends = (sync_ends(instances), host_sync_ends(instances))
    return instances, matched, arrivals, sync_point_table(instances, matched), ends


def _sync_names(prep: list, alignment: Alignment | None) -> dict[str, str]:
    """Span names that are sync points by cross-rank evidence (blocking OS calls, aligned ends),
    from every rank's small span facts, the samples moved onto the common clock."""
    from profkit.collectives.syncpoints import decide_sync_names

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


# captures of this many events or more keep their replay programs in the store until the straggler
# verdicts are made (``stages.impact_task``): ~20 MB of programs per million events, which would
# otherwise reach the driver while ``finish_stragglers`` holds its tables (DEP32 x 1,000: +240 MB)
PROGRAMS_IN_STORE_EVENTS = 4_000_000


def _submit_programs(plan, steps: pd.DataFrame, store, ex, ranks: list[int], labels: list[str],
                     in_store: bool = False):
    """Map 5 submitted: each rank's replay program (``stages.impact_task``) from its sync points
    and steps, its GPU work left for ``_impact`` (only the stragglers' kernels are summed);
    ``in_store``: the programs' tables kept in the store."""
    from profkit.analyze import impact_program

    syncs = impact_program.syncs_from_arrivals(plan.arrivals)
    by_rank = dict(iter(syncs.groupby("rank", sort=False))) if len(syncs) else {}
    del syncs
    steps_by_rank = dict(iter(steps.groupby("rank", sort=False))) if len(steps) else {}
    none = impact_program.empty_syncs()  # one for every rank without sync points (not made per rank)
    return ex.submit(stages.impact_task,
                     [(r, by_rank.get(r, none), steps_by_rank.get(r), store, None, in_store) for r in ranks],
                     labels)


def _impact(programs, steps, causes, cause_steps, per_rank, store, ex, stats, beside: "_Then | None" = None,
            trim: Callable[[], None] | None = None):
    """The impact table: the per-rank programs (``_submit_programs``) with the GPU work of the
    straggler ranks' GPU phases (a small map, where they have any), the replay on the driver;
    ``beside``: the scenarios a worker replayed meanwhile (``_replay_beside``), taken where the
    straggler ranks' GPU work joined here does not change them (``impact._taken``). ``trim``: how
    the driver gives freed memory back once the graph is built (``_trim``, or ``_keep`` on a small
    capture: ``TRIM_MIN_EVENTS``)."""
    from profkit.analyze import impact as impact_mod
    from profkit.analyze import impact_program

    if beside is not None:
        beside.first_in()  # its thread asks for ``programs`` first
    res = programs.results()
    stats += [x.stats for x in res]
    gpu_phases = frozenset(impact_mod.straggler_gpu_phases(per_rank))
    ranks = [x.rank for x in res]
    gpu = ex.map(stages.impact_gpu_task, [(r, store, gpu_phases) for r in ranks], [f"rank {r}" for r in ranks]) \
        if gpu_phases else []
    stats += [g.stats for g in gpu]
    rows = {g.rank: g.rows for g in gpu}
    del gpu
    # beside a replay task the tables stay in the store until it has read them (``drop_rank_tables`` drops them)
    programs = [impact_program.join_gpu_work(stages.load_program(store, x.program, keep=beside is not None),
                                             rows.get(x.rank)) for x in res]
    del rows
    for x in res:
        x.program = None
    straggler_list = straggler_ranks(per_rank)
    try:
        graph = rp.build_graph(programs, consume=True)
        del programs  # the joined graph holds the same points: the replay's matrices come after
        (trim or _trim)()  # the graph holds the points now: the programs' memory goes back
        early = _beside_results(beside)  # built meanwhile: wait for the worker now
        if early is not None:
            stats.append(early.stats)
        if early is not None and early.replayed is None:
            early = None  # it could not replay: every scenario here (the same error, if any)
        scenarios = None
        if early is not None:
            scenarios = early.scenarios + impact_mod.straggler_scenarios(graph.work, early.names, per_rank, straggler_list)
        return impact_mod.impact_from_graph(graph, steps, causes=causes, cause_steps=cause_steps,
                                            stragglers=per_rank, straggler_ranks=straggler_list,
                                            scenarios=scenarios, replayed=early.replayed if early is not None else None)
    except (ValueError, IndexError) as exc:  # a replay that cannot be built must not cost the other tables
        return impact_mod.empty_impact(f"impact not computed: {exc}")


def _beside_results(beside: "_Then | None"):
    """The replay task's result; None without one, or where it failed (the driver replays every
    scenario itself then: the same table)."""
    try:
        return beside.results() if beside is not None else None
    except ScaleError:
        return None


# the replay beside the verdicts only where its graph fits a worker: the graph is ~240 bytes a point
# and the worker's peak grows ~0.4 KB a point while it is built and replayed (DEP32 x 1,000: 2.05 M
# points, 0.5 -> 1.3 GB); DEP256 x 200 (3.3 M points) stays on the driver, within issue #16's 3 GB
REPLAY_BESIDE_MAX_POINTS = 2_500_000


class _Then:
    """A batch submitted from a thread once another batch's results are in (``then`` makes it of
    them, or returns None): the driver goes on with its own work meanwhile. ``results()`` is that
    batch's results (None where there was none), or what either batch raised."""

    def __init__(self, first, then: Callable) -> None:
        import threading

        self._box: dict = {}
        self._first = threading.Event()
        self._lock = threading.Lock()
        self._cancelled = False

        def run() -> None:
            try:
                res = first.results()
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                self._box["error"] = exc
                return
            finally:
                self._first.set()
            try:
                with self._lock:
                    if not self._cancelled:
                        self._box["batch"] = then(res)
            except BaseException as exc:  # noqa: BLE001
                self._box["error"] = exc

        self._thread = threading.Thread(target=run, name="profkit-then", daemon=True)
        self._thread.start()

    def first_in(self) -> None:
        """Wait until the first batch's results are in (then they may be asked for again here)."""
        self._first.wait()

    def cancel(self) -> None:
        """No batch is submitted from now on (one already submitted runs on: the executor's close
        waits for it or cancels it)."""
        with self._lock:
            self._cancelled = True

    def results(self):
        self._thread.join()
        if "error" in self._box:
            raise self._box["error"]
        batch = self._box.get("batch")
        return None if batch is None else batch.results()[0]


def _replay_beside(programs, steps: pd.DataFrame, causes: pd.DataFrame | None, store, ex) -> _Then | None:
    """Once the programs are in the store, the scenarios that need no verdict replayed by a worker
    (``stages.replay_task``) while the driver makes the verdicts (the workers are idle then: at
    DEP32 x 1,000 ~1.3 s of the driver's replay moves there). Not with the serial executor (its
    tasks are the driver's own), nor on a graph too large for a worker (``REPLAY_BESIDE_MAX_POINTS``)."""
    if ex.name == "serial" or steps is None or not len(steps):
        return None

    def submit(res: list):
        if sum(x.points for x in res) > REPLAY_BESIDE_MAX_POINTS:
            return None
        return ex.submit(stages.replay_task, [([x.program for x in res], store, steps, causes)], ["replay"])

    return _Then(programs, submit)


def _warm_up_replay(capture: Capture) -> None:
    """On a large capture, get a compiled replay ready in a background thread while the workers
    prepare and analyze the ranks (``impact_replay.warm_up``: the kernel built ahead of time, once
    per machine; else numba's JIT loaded, which the driver would otherwise wait ~2 s for at the end)."""
    parts = capture.parts
    if parts is None or not len(parts) or "n_events" not in parts:
        return
    if int(parts.groupby("rank")["n_events"].sum().max()) < rp.WARM_UP_EVENTS:
        return
    import threading

    def warm() -> None:
        try:
            rp.warm_up()
        except Exception:  # noqa: BLE001 - the replay falls back to numpy, or compiles when it runs
            pass

    threading.Thread(target=warm, name="profkit-replay-warm-up", daemon=True).start()


# captures of this many events or more give the driver's freed memory back between stages; below,
# its heap is a few hundred MB at most (DEP32 x 100, 1.2 M events: 320-350 MB) and the 5-7 trims
# cost more than they give back (9 ms a run at DEP8 x 100, 25 ms at DEP32 x 100, mostly while the
# workers wait for the driver)
TRIM_MIN_EVENTS = 2_000_000


def _trim() -> None:
    """Give freed memory back to the OS between stages (glibc keeps it otherwise, and the next
    stage's peak stacks on top): the driver's peak is what the benchmark and the user see."""
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _keep() -> None:
    """``_trim`` where the capture is small (``TRIM_MIN_EVENTS``): the freed memory is kept."""


@functools.lru_cache(maxsize=1)
def _libc():
    import ctypes

    return ctypes.CDLL("libc.so.6")


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
