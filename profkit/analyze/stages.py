"""The analysis as maps over files and ranks and reduces over small cross-rank tables.

    read_file_task (per file)  -> part descriptors; each part's table in the store; a file of one
                                  part that names its rank is prepared there too (as prepare_task)
    prepare_task   (per rank)  -> clock facts (source offsets, collective candidates), step markers
                                  (for a rank read task prepared: its tables moved to the rank's keys)
    reduce: the alignment (``align.estimate_from_ranks``) and the step marker of all ranks
    rank_task      (per rank)  -> steps, GPU timeline, aligned collective candidates, extents,
                                  tokens; charged intervals and timeline pieces kept in the store
    reduce: collective instances, last arrivers
    causes_task    (per rank)  -> charged waits named after the last arriver, summarized per cause
                                  and per (step, cause): submitted before the windows below are planned
    reduce: straggler windows (``stragglers.plan_stragglers``)
    finish_task    (per rank)  -> time per phase in those windows
    reduce: causes, stragglers, lateness, balance
    impact_task    (per rank)  -> the rank's replay program (``analyze.impact_program``): tens of
                                  points per step, from its timeline pieces and GPU activity
    reduce: the what-if replay over all ranks' programs (``analyze.impact``)

Every task is a plain function of picklable arguments and a store, so the serial loop, a
process pool and Dask run the same code on the same inputs: the tables are the same bit for bit.
Each task also reports its wall time, its process's peak memory and its event count.
"""
from __future__ import annotations

import os
import resource
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from profkit import distinct, schema
from profkit.align import Alignment, apply_alignment, drop_duplicate_spans
from profkit.align.dedupe import DEDUPE_KINDS
from profkit.align.estimate import RankClockFacts, prepare_rank
from profkit.analyze import impact_program
from profkit.analyze import overhead
from profkit.analyze import straggler_phases as ph_mod
from profkit.analyze.balance import step_tokens
from profkit.analyze.gpu import gpu_timelines
from profkit.analyze.steps import marker_regex, step_marker_facts, step_table
from profkit.analyze.straggler_arrivals import trace_windows
from profkit.analyze.stragglers import WindowPhases, rank_window_phases
from profkit.analyze.sync_table import wait_intervals
from profkit.analyze.window import clip_to_recorded
from profkit.collectives.candidates import collective_candidates
from profkit.collectives.syncpoints import shared_context, span_facts
from profkit.errors import ScaleError, TraceError
from profkit.ingest.cache import table_with_rank
from profkit.analyze.store import arrow_frame_table, table_to_frame

KILL_ENV = "PROFKIT_TEST_KILL_TASK"  # tests only: "stage:rank[:flagfile]" makes that task's process die


@dataclass
class TaskStats:
    stage: str
    rank: int | None
    worker: str
    wall_s: float
    peak_rss_bytes: int
    events: int
    cpu_s: float = 0.0  # this process's CPU time in the task (threads included): wall time alone misleads on a busy machine


def _peak_rss_bytes() -> int:
    """This process's peak resident memory: ``VmHWM`` on Linux (``ru_maxrss`` of a forked or
    spawned worker starts at its parent's size), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _clock() -> tuple[float, float]:
    """(wall, CPU) now: a task's start, for ``_stats``."""
    return time.perf_counter(), time.process_time()


def _stats(stage: str, rank: int | None, t0: tuple[float, float], events: int) -> TaskStats:
    return TaskStats(stage=stage, rank=rank, worker=f"{socket.gethostname()}:{os.getpid()}",
                     wall_s=time.perf_counter() - t0[0], peak_rss_bytes=_peak_rss_bytes(), events=int(events),
                     cpu_s=time.process_time() - t0[1])


def _maybe_die(stage: str, rank: int | None) -> None:
    """Test hook: ``PROFKIT_TEST_KILL_TASK=stage:rank[:flagfile]`` kills this worker process in
    that task (once, when a flag file is named: it is created first, so the retry survives)."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    want_stage, want_rank, *flag = spec.split(":", 2)
    if want_stage != stage or str(rank) != want_rank:
        return
    if flag:
        path = Path(flag[0])
        if path.exists():
            return
        path.write_text("killed once\n")
    os._exit(17)


# ---- stage 0: read each file ------------------------------------------------------------------
@dataclass
class PartInfo:
    """A ``RankPart`` without its table (kept in the store under ``store_key``)."""

    path: str
    source: str
    rank: int | None
    rank_origin: str
    key: str
    meta: dict
    warnings: list[str]
    gpu_events: int
    pids: set[int]
    n_events: int
    store_key: str
    table = None  # the loader's rank resolution reads facts, not tables

    @property
    def label(self) -> str:
        return f"{self.path}[{self.key}]" if self.key else self.path


@dataclass
class FileResult:
    index: int
    path: str
    parts: list[PartInfo] = field(default_factory=list)
    skipped: str | None = None
    stats: TaskStats | None = None
    # by part store key: the part prepared as the rank its file names (``prepare_task`` adopts it
    # when the driver's rank resolution agrees; otherwise the rank is prepared as usual)
    prepared: dict[str, "PrepareResult"] = field(default_factory=dict)


def read_file_task(index: int, path: str, pid_to_rank: dict[int, int] | None, store, step_pattern: str | None = None,
                   prepare: bool = False) -> FileResult:
    """Read one trace file (through the parsed-trace cache) and keep each part's table in the store.

    ``prepare``: a file of one part that names its rank (the common case: a rank's Kineto trace) is
    also prepared here, as the rank it names, while its table is in memory: the prepare stage
    would read it back from the store (and wait for every file to be read first)."""
    from profkit.ingest.loader import part_gpu_events, part_pids, read_file

    t0 = _clock()
    _maybe_die("read", index)
    out = FileResult(index=index, path=path)
    try:
        parts = read_file(Path(path), pid_to_rank)
    except TraceError as exc:
        out.skipped = str(exc)
        out.stats = _stats("read", None, t0, 0)
        return out
    except MemoryError:
        out.skipped = f"{path}: out of memory while reading"
        out.stats = _stats("read", None, t0, 0)
        return out
    n = 0
    for j, part in enumerate(parts):
        key = f"part-{index}-{j}"
        if not (part.cache_file and store.put_file(key, part.cache_file)):  # the cache's file is the table
            part.table = part.table.combine_chunks()  # once: the store's one batch, and the prepare below
            store.put_table(key, arrow_frame_table(part.table))  # readable as the rank's events as it is
        n += part.table.num_rows
        out.parts.append(PartInfo(path=part.path, source=part.source, rank=part.rank, rank_origin=part.rank_origin,
                                  key=part.key, meta=part.meta, warnings=list(part.warnings),
                                  gpu_events=part_gpu_events(part), pids=part_pids(part),
                                  n_events=part.table.num_rows, store_key=key))
    out.stats = _stats("read", None, t0, n)
    if prepare and len(parts) == 1 and parts[0].rank is not None:
        t1, rank, key = _clock(), int(parts[0].rank), out.parts[0].store_key
        events = _with_rank(_one_chunk(table_to_frame(arrow_frame_table(parts[0].table))), rank)
        del parts
        done = _prepare_events(rank, events, store, step_pattern, prepared_candidates_key(key))
        done.stats = _stats("prepare", rank, t1, done.n_events)
        out.prepared[key] = done
    return out


def prepared_candidates_key(part_key: str) -> str:
    """Where a read task keeps the candidates of the part it prepared, until ``prepare_task`` adopts them."""
    return f"candidates-{part_key}"


# ---- stage 1: per rank, before alignment ------------------------------------------------------
def events_key(rank: int) -> str:
    return f"events-{rank}"


def rank_events(store, rank: int, columns: list[str] | None = None) -> pd.DataFrame:
    """The rank's events from the store, with its rank column filled (a single part is stored as the
    reader made it, before ranks were resolved)."""
    return _with_rank(_one_chunk(store.get(events_key(rank), columns)), rank)


def _with_rank(events: pd.DataFrame, rank: int) -> pd.DataFrame:
    """The rank column filled (a part is stored as the reader made it, before ranks were resolved)."""
    if "rank" in events.columns and len(events) and events["rank"].hasnans:
        events = events.assign(rank=pd.array(np.full(len(events), rank, dtype=np.int32),
                                             dtype=pd.ArrowDtype(pa.int32())))
    return events


def _one_chunk(events: pd.DataFrame) -> pd.DataFrame:
    """Each Arrow column in one chunk (the store's file holds one record batch per ~64k rows):
    the tasks take rows of the string columns many times, and a take from many chunks costs
    several times one from a single chunk (~5 ms against ~1 ms for 16k names of a 390k-event
    rank; combining once costs ~4 ms). Same values, same dtypes."""
    combined = {}
    for c, dtype in events.dtypes.items():
        if isinstance(dtype, pd.ArrowDtype):
            chunked = events[c].array.__arrow_array__()
            if chunked.num_chunks > 1:
                combined[c] = pd.arrays.ArrowExtensionArray(chunked.combine_chunks())
    return events.assign(**combined) if combined else events


def candidates_key(rank: int) -> str:
    return f"candidates-{rank}"


@dataclass
class PrepareResult:
    rank: int
    clock: RankClockFacts | None  # None: the rank has no events
    markers: dict[str, bool]
    n_events: int
    stats: TaskStats | None = None
    # ``syncpoints.span_facts`` on the rank's own clock: per span name its time, blocked time and
    # whether it holds a collective; a block of its ends (the driver decides sync points by name)
    span_facts: pd.DataFrame | None = None
    span_samples: pd.DataFrame | None = None
    # one source, its host spans one stream: ``rank_task`` drops nothing from such a rank
    # (``one_stream``), so its candidates on the common clock are these moved (the driver can)
    one_stream: bool = False
    candidates: pd.DataFrame | None = None  # the driver's: the clock's candidates (``pipeline.prepare_ranks``)


def prepare_task(rank: int, part_keys: list[str], store, step_pattern: str | None,
                 adopt: bool = False) -> PrepareResult:
    """Join the rank's parts into its event table (kept in the store) and take its clock facts.

    ``adopt``: the read task prepared the rank's one part already (``read_file_task``): its table
    and candidates are moved to the rank's keys, and the result (without clock facts: the driver
    holds the read task's) only says so."""
    t0 = _clock()
    _maybe_die("prepare", rank)
    if adopt:
        [key] = part_keys
        moved = store.rename(key, events_key(rank)) or store.has(events_key(rank))  # a retried task: moved
        if not moved:
            raise ScaleError(f"rank {rank}: its events (part {key!r}) are not in the store")
        store.rename(prepared_candidates_key(key), candidates_key(rank))  # none for a rank without events
        return PrepareResult(rank=rank, clock=None, markers={}, n_events=0)
    if len(part_keys) == 1 and (store.rename(part_keys[0], events_key(rank)) or store.has(events_key(rank))):
        # one part (the common case): it is the rank's events as stored (rank column left null:
        # ``rank_events`` fills it); a retried task finds it already moved
        events = rank_events(store, rank)
    elif part_keys:
        tables = [table_with_rank(store.get_table(k).replace_schema_metadata(None), rank) for k in part_keys]
        events = schema.to_frame(pa.concat_tables(tables))
        store.put(events_key(rank), events)  # the parts are dropped by the driver: a retried task reads them again
    else:
        events = rank_events(store, rank)
    out = _prepare_events(rank, events, store, step_pattern, candidates_key(rank))
    out.stats = _stats("prepare", rank, t0, len(events))
    return out


def _prepare_events(rank: int, events: pd.DataFrame, store, step_pattern: str | None,
                    candidates_at: str) -> PrepareResult:
    """The rank's clock facts, step markers and span facts; its candidates kept in the store."""
    with shared_context(events):  # the candidates' sync points and the span facts read one thread context
        clock = prepare_rank(events) if len(events) else None
        facts, samples = span_facts(events, marker_regex(step_pattern)) if len(events) else (None, None)
    if clock is not None:
        store.put(candidates_at, clock.candidates)  # reused on the common clock by rank_task
    return PrepareResult(rank=rank, clock=clock, markers=step_marker_facts(events, step_pattern), n_events=len(events),
                         span_facts=facts, span_samples=samples, one_stream=one_stream(events))


def one_stream(events: pd.DataFrame) -> bool:
    """Whether ``rank_task`` can drop nothing from these events, whatever the clocks: they come
    from one source (``clip_to_recorded`` cuts only between sources) and their host spans from one
    (source, category) stream (``drop_duplicate_spans`` compares streams). Counted over every
    host span row, a superset of those the dedupe compares: False may be too careful, never wrong."""
    if not len(events) or "source" not in events:
        return False
    if distinct.codes(events["source"])[1].size > 1:
        return False
    host = distinct.isin(events["kind"], DEDUPE_KINDS)
    if not host.any():
        return True
    category = events["category"][host] if "category" in events else pd.Series([""] * int(host.sum()))
    return distinct.codes(category.fillna(""))[1].size <= 1


# ---- stage 2: per rank, on the common clock ---------------------------------------------------
def aligned_key(rank: int) -> str:
    return f"aligned-{rank}"


@dataclass
class RankResult:
    rank: int
    steps: pd.DataFrame
    dropped_steps: int
    timelines: pd.DataFrame
    windows: pd.DataFrame  # the windows charged (``overhead.analysis_windows``); the charged rows stay in the store
    candidates: pd.DataFrame | None  # collective candidates on the common clock (None: the driver moved them)
    extents: pd.DataFrame  # ``straggler_arrivals.trace_windows``
    tokens: pd.DataFrame  # ``balance.step_tokens``
    duplicates: dict  # {(rank, source): dropped}
    cut: int  # events outside the window every source recorded
    n_events: int
    stats: TaskStats | None = None


def rank_alignment(alignment: Alignment, rank: int) -> Alignment:
    """The rows of ``alignment`` one rank's worker needs (the rest stay with the driver)."""
    return rank_alignments(alignment, [rank])[rank]


def rank_alignments(alignment: Alignment, ranks: list[int]) -> dict[int, Alignment]:
    """``rank_alignment`` of each of ``ranks``, the tables split by rank once (not filtered once per
    rank: ~0.5 ms a rank, on the driver while the workers wait for their first rank task)."""
    def split(table: pd.DataFrame) -> dict[int, pd.DataFrame]:
        if not len(table):
            return {}
        return {int(r): rows.reset_index(drop=True) for r, rows in table.groupby("rank", sort=False)}

    by_rank, by_source = split(alignment.ranks), split(alignment.sources)
    none_ranks = alignment.ranks.iloc[:0].reset_index(drop=True)  # a rank without rows: empty, typed alike
    none_sources = alignment.sources.iloc[:0].reset_index(drop=True)
    return {r: Alignment(ranks=by_rank.get(r, none_ranks), sources=by_source.get(r, none_sources), t0_ns=alignment.t0_ns)
            for r in ranks}


def rank_task(rank: int, alignment: Alignment | None, chosen: tuple[str, bool] | None, step_pattern: str | None,
              store, keep_aligned: bool = False, sync_names: dict[str, str] | None = None,
              driver_moves: bool = False) -> RankResult:
    """Everything one rank's events say on their own, on the common clock. ``sync_names``: span
    names the driver recognized as sync points across ranks (``syncpoints.decide_sync_names``).
    ``driver_moves``: the driver moves the rank's prepared candidates onto the common clock
    itself (``pipeline._movable_candidates``): where they are those, none come back."""
    t0 = _clock()
    _maybe_die("rank", rank)
    events = rank_events(store, rank)
    duplicates: dict = {}
    if alignment is not None and len(events):
        events, duplicates = drop_duplicate_spans(apply_alignment(events, alignment))
    steps = step_table(events, step_pattern, chosen)
    dropped_steps = int(steps.attrs.get("dropped_steps", {}).get(rank, 0))
    events, cut = clip_to_recorded(events)
    moved = alignment is not None and not duplicates and not cut and not sync_names
    if moved:  # nothing was dropped: the collectives found before alignment, moved onto the common clock
        candidates = apply_alignment(store.get(candidates_key(rank)), alignment)
    else:
        candidates = collective_candidates(events, sync_names)
    waits = wait_intervals(candidates)  # where the host was blocked in a collective
    # the events as the attribution's arrays and the GPU rows: built once for the causes, the
    # timeline pieces (the host attributed again over the whole extent) and the replay's GPU ops
    arrays = overhead.event_arrays(events) if len(events) else None
    gpu = ph_mod.gpu_rows(events, arrays)
    if chosen is not None and not len(steps):  # other ranks have steps: this one has no windows
        windows = overhead.analysis_windows(events.iloc[:0], steps)
        charged = overhead.attribute_gaps(events.iloc[:0], steps, waits.iloc[:0])
    else:
        windows = overhead.analysis_windows(events, steps)
        charged = overhead.attribute_gaps(events, windows, waits, arrays=arrays, coded=True)
    extents = trace_windows(events)
    # the pieces' names go to the store as codes, and come back as text with their codes known
    host_pieces, gpu_pieces = ph_mod.timeline_pieces(events, extents, waits, steps, arrays=arrays, gpu=gpu, coded=True)
    store.put(charged_key(rank), charged, as_strings=overhead.CHARGED_TEXT)  # waits not yet named after the last arriver
    store.put(f"host-pieces-{rank}", host_pieces, as_strings=ph_mod.PIECE_TEXT)
    store.put(f"gpu-pieces-{rank}", gpu_pieces, as_strings=ph_mod.PIECE_TEXT)
    store.put(gpu_ops_key(rank), impact_program.gpu_ops(events, gpu))
    if keep_aligned:
        store.put(aligned_key(rank), events)
    out = RankResult(rank=rank, steps=steps, dropped_steps=dropped_steps, timelines=gpu_timelines(events, arrays),
                     windows=windows, candidates=None if moved and driver_moves else candidates, extents=extents,
                     tokens=step_tokens(steps, events, arrays), duplicates=duplicates, cut=int(cut.get(rank, 0)),
                     n_events=len(events))
    out.stats = _stats("rank", rank, t0, len(events))
    return out


# ---- stage 3: per rank, the causes, then phases in the straggler windows ---------------------
def charged_key(rank: int) -> str:
    return f"charged-{rank}"


@dataclass
class CauseResult:
    rank: int
    causes: dict  # ``overhead.cause_summary`` of its charged rows
    cause_steps: pd.DataFrame  # ``compare.cause_step_table`` of them
    stats: TaskStats | None = None


def causes_task(rank: int, arrivals: pd.DataFrame | None, store, keep_charged: bool = False) -> CauseResult:
    """The rank's charged waits named after the last arriver (``arrivals``: the rank's rows of
    ``overhead.arrivals_from_match``), summarized. Its own map: the arrivals are known before
    the straggler windows are, so the workers summarize while the driver plans the windows
    (``stragglers.plan_stragglers``), where they would wait for it."""
    from profkit.analyze.compare import cause_step_table

    t0 = _clock()
    _maybe_die("causes", rank)
    # only what the summaries read, unless the rows are kept (the spans they fell in are not)
    charged = store.get(charged_key(rank), None if keep_charged else overhead.SUMMARIZED_COLUMNS)
    if arrivals is not None and len(arrivals):
        charged = overhead.refine_waits(charged, arrivals)
    if keep_charged:
        store.put(charged_key(rank), charged)
    out = CauseResult(rank=rank, causes=overhead.cause_summary(charged), cause_steps=cause_step_table(charged))
    out.stats = _stats("causes", rank, t0, len(charged))
    return out


@dataclass
class FinishResult:
    rank: int
    phases: WindowPhases
    stats: TaskStats | None = None


def finish_task(rank: int, windows: dict[str, pd.DataFrame], store) -> FinishResult:
    """Time per phase in the rank's straggler windows (``StragglerPlan.windows``)."""
    t0 = _clock()
    _maybe_die("finish", rank)
    host, gpu = store.get(f"host-pieces-{rank}"), store.get(f"gpu-pieces-{rank}")
    out = FinishResult(rank=rank, phases=rank_window_phases(windows, host, gpu))
    out.stats = _stats("finish", rank, t0, len(host) + len(gpu))
    return out


# ---- stage 4: per rank, the replay program for the impact -------------------------------------
def gpu_ops_key(rank: int) -> str:
    return f"gpu-ops-{rank}"


@dataclass
class ImpactResult:
    rank: int
    program: "impact_program.RankProgram"
    stats: TaskStats | None = None
    points: int = 0  # the program's points (its tables may be in the store)


def gpu_windows_key(rank: int) -> str:
    return f"gpu-windows-{rank}"


def impact_task(rank: int, syncs: pd.DataFrame, steps: pd.DataFrame | None, store,
                gpu_phases: frozenset[str] | None = None, program_in_store: bool = False) -> ImpactResult:
    """The rank's replay program (``impact_program.rank_program``): its sync points (``syncs``,
    the rank's rows), steps, timeline pieces and GPU activity, as a few points per sync point.
    Removable GPU work only of ``gpu_phases`` (the stragglers' GPU phases); None (they are not
    known yet: the task runs beside the straggler verdicts): none, the windows it is summed over
    kept in the store for ``impact_gpu_task`` (the program's ``gpu_work_at`` says where it goes).
    ``program_in_store``: the program's tables go to the store, not back with the result
    (``load_program``)."""
    t0 = _clock()
    _maybe_die("impact", rank)
    host, gpu, ops = store.get(f"host-pieces-{rank}"), store.get(f"gpu-pieces-{rank}"), store.get(gpu_ops_key(rank))
    program = impact_program.rank_program(rank, syncs, steps if steps is not None else pd.DataFrame(), host, ops, gpu,
                                          gpu_phases=gpu_phases, defer_gpu=gpu_phases is None)
    points = len(program.nodes)
    if program.gpu_windows is not None:
        store.put(gpu_windows_key(rank), program.gpu_windows)
        program.gpu_windows = None
    if program_in_store:
        _put_program(store, program)
    out = ImpactResult(rank=rank, program=program, points=points)
    out.stats = _stats("impact", rank, t0, len(host) + len(gpu) + len(ops))
    return out


_PROGRAM_TABLES = ("nodes", "edges", "work")


def _program_key(rank: int, table: str) -> str:
    return f"program-{table}-{rank}"


def _put_program(store, program: "impact_program.RankProgram") -> None:
    """The program's tables into the store, out of the result: they reach the driver when it
    reads them (``load_program``), after the straggler verdicts, not while it makes them (at
    DEP256 x 200 every rank's program together is hundreds of MB; a store round trip costs
    ~20-50 ms a program, so small captures' come with their results). Phases go as a category, so
    they come back as shared strings, one per distinct name (as ``impact_program._compact`` made)."""
    for table in _PROGRAM_TABLES:
        frame = getattr(program, table)
        if "phase" in frame:
            frame = frame.assign(phase=pd.Categorical(frame["phase"].to_numpy(dtype=object)))
        store.put(_program_key(program.rank, table), frame)
        setattr(program, table, None)


def load_program(store, program: "impact_program.RankProgram", keep: bool = False) -> "impact_program.RankProgram":
    """The program ``impact_task`` returned with its tables read back from the store (and dropped
    there, unless ``keep``); one whose tables came with it is returned as it is. Phases stay a
    category (the replay graph stacks and codes them as such: ``impact_replay._stacked_text``)."""
    if program.nodes is not None:
        return program
    for table in _PROGRAM_TABLES:
        key = _program_key(program.rank, table)
        frame = store.get(key)
        if not keep:
            store.drop(key)
        setattr(program, table, frame)
    return program


@dataclass
class ReplayResult:
    scenarios: list  # ``impact.base_scenarios``' (empty: the graph could not be replayed)
    names: list[str]  # the phases they remove as causes
    replayed: Any  # ``impact.Replayed``, or None
    stats: TaskStats | None = None


def replay_task(programs: list["impact_program.RankProgram"], store, steps: pd.DataFrame,
                causes: pd.DataFrame | None) -> ReplayResult:
    """The scenarios that need no straggler verdict (``impact.base_scenarios``: the bounds, the
    causes, the spikes) replayed over every rank's program, the programs' tables read from the
    store and left there, while the driver makes the verdicts. Their GPU work is left out: the
    driver takes the columns of the scenarios that the straggler ranks' GPU work, joined to its
    own graph, leaves as they are (``impact._taken``) and replays the others itself."""
    from profkit.analyze import impact as impact_mod
    from profkit.analyze import impact_replay as rp

    t0 = _clock()
    _maybe_die("replay", None)
    joined = [impact_program.join_gpu_work(load_program(store, p, keep=True), None) for p in programs]
    out = ReplayResult(scenarios=[], names=[], replayed=None)
    points = 0
    try:
        g = rp.build_graph(joined, consume=True)
        del joined
        points = g.n
        if g.n and steps is not None and len(steps):
            out.scenarios, out.names = impact_mod.base_scenarios(g.work, causes)
            out.replayed = impact_mod.replay_scenarios(g, steps, out.scenarios)
    except (ValueError, IndexError):  # the driver builds the graph again, and says why it cannot
        out.scenarios, out.names, out.replayed = [], [], None
    out.stats = _stats("impact", None, t0, points)
    return out


@dataclass
class GpuWorkResult:
    rank: int
    rows: pd.DataFrame
    stats: TaskStats | None = None


def impact_gpu_task(rank: int, store, gpu_phases: frozenset[str]) -> GpuWorkResult:
    """The GPU work of ``gpu_phases`` on the rank's program's GPU edges (``impact_program.gpu_work_rows``),
    for ``impact_program.join_gpu_work``: a handful of kernels' pieces, once the verdicts name them."""
    t0 = _clock()
    gpu = store.get(f"gpu-pieces-{rank}")
    rows = impact_program.gpu_work_rows(rank, store.get(gpu_windows_key(rank)), gpu, gpu_phases)
    return GpuWorkResult(rank=rank, rows=rows, stats=_stats("impact", rank, t0, len(gpu)))


def drop_rank_tables(store, rank: int) -> None:
    for key in (events_key(rank), charged_key(rank), candidates_key(rank), f"host-pieces-{rank}",
                f"gpu-pieces-{rank}", gpu_ops_key(rank), gpu_windows_key(rank),
                *(_program_key(rank, t) for t in _PROGRAM_TABLES)):
        store.drop(key)


def stats_frame(stats: list[TaskStats | None]) -> pd.DataFrame:
    rows = [s.__dict__ for s in stats if s is not None]
    cols = ["stage", "rank", "worker", "wall_s", "peak_rss_bytes", "events", "cpu_s"]
    out = pd.DataFrame(rows, columns=cols)
    out["rank"] = out["rank"].astype("Int64")
    out["peak_rss_bytes"] = out["peak_rss_bytes"].astype(np.int64)
    out["events"] = out["events"].astype(np.int64)
    return out


def stage_name(fn: Callable) -> str:
    """A task function's stage, as errors name it (``rank_task`` -> ``rank``)."""
    return fn.__name__.removesuffix("_task")


class Batch:
    """A stage's tasks handed to an executor (``submit``): ``results()`` waits for them and returns
    their results in call order, or raises the ``ScaleError`` that ``map`` would."""

    def __init__(self, collect: Callable[[], list[Any]]) -> None:
        self._collect = collect
        self._out: list[Any] | None = None

    def results(self) -> list[Any]:
        if self._out is None:
            self._out = self._collect()
            self._collect = None
        return self._out


class SerialExecutor:
    """Every task in this process, in order: the in-memory path (``pipeline.analyze``), and
    debugging. The process pool and Dask executors of ``profkit.scale`` take the same ``map``
    and ``submit``."""

    name = "serial"
    workers = 1

    def map(self, fn: Callable, calls: Sequence[tuple], labels: Sequence[str]) -> list[Any]:
        return self.submit(fn, calls, labels).results()

    def submit(self, fn: Callable, calls: Sequence[tuple], labels: Sequence[str]) -> Batch:
        """The tasks of ``map``, started now where the executor has workers, so the driver can do
        its own work while they run (a later batch queues behind the earlier ones); here they run
        when their results are asked for, one after the other."""
        calls, labels = list(calls), list(labels)

        def run() -> list[Any]:
            out = []
            for args, label in zip(calls, labels):
                try:
                    out.append(fn(*args))
                except Exception as exc:  # noqa: BLE001 - re-raised with what failed
                    raise ScaleError(f"{label}: stage {stage_name(fn)!r} failed: {exc!r}") from exc
            return out

        return Batch(run)

    def close(self, wait: bool = True) -> None:  # noqa: ARG002 - its tasks ran in this process
        pass

    def stop(self) -> None:
        """``close`` after an interrupt: an executor with workers ends their running tasks first."""
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
