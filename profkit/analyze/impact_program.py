"""The replay's input: each rank's timeline as two lanes of points joined at the sync points.

``impact_replay`` answers "how much faster would the step be without cause X" by replaying every
rank's timeline with X removed. What it replays is built here, one rank at a time (on the
executors of the scale path), as a small graph of **points** with observed times:

- the **host lane** (the rank's launching threads, one sequence of host time): the rank's
  start, step starts and ends, arrivals at and exits from blocking CPU sync points (Gloo, the DP
  padding all-reduce), the host **anchors** of each GPU point (launches that gate it) and the
  host's **resume** from each host sync (a synchronize, ``.item()``, a blocking copy);
- the **GPU lane** (the rank's device, all streams): arrivals at and exits from GPU collectives
  (NCCL / DeepEP kernels), and for each host sync the point where the GPU had finished what was
  launched before it.

Each point's time in a replay is the max over its incoming edges of (source's replayed time +
the edge's observed length - the time removed on it), which in shift form (``delta`` = replayed
minus observed time) reads ``delta(dst) = max_e(delta(src_e) - cut_e - slack_e)``:

- host lane edge (previous host point -> this one): the host worked all along (``slack`` 0),
  except into a resume, whose edge has the host's wait on the GPU as slack (an earlier host
  waits longer); its removable time is the host's own work in between (``straggler_phases``
  host pieces, each instant named once; waits and host time blocked on the GPU never);
- GPU lane edge (previous GPU point -> this one): ``slack`` = the GPU's idle time in between (a
  GPU path that gets earlier first fills that idle time); removable: GPU work of a named kernel
  (``gpu:<kernel>`` pieces, e.g. a hot expert's extra GEMM time), for straggler rows;
- anchor edges (host anchor -> GPU point): the GPU point cannot come before a launch plus the
  GPU work from that kernel on. Two per point: the launch with the latest such bound (0 slack
  when the GPU sat idle waiting for it) and the segment's first launch (the bound left when the
  host's work between launches goes); GPU work removed after the kernel shortens them too;
- GPU done -> resume: a host sync returns when the GPU has finished (slack: how long the GPU had
  already been idle). Removing ``host_sync (X)`` removes the sync: that edge is dropped;
- sync exit: every participant leaves an instance when its last participant arrives plus the
  instance's own transfer time (measured: observed exit minus last arrival), i.e. ``delta(exit)
  = max_q(delta(arrive_q) - (last arrival - arrive_q))``.

So removing host time shifts the rest of that host's work earlier up to its next wait; the GPU
follows only where it was waiting for that host; a rank that arrives earlier at a collective
helps only if it was the last one, by what it led the next one. Nothing is removed outside the
rank's steps (before the first, after the last). The ``slack`` of a point's edges is
normalized so that the smallest is 0, so the baseline replay (nothing removed) reproduces every
observed time exactly; ``residual_ns`` is what that normalization removed (0 when every point
is explained by one of its paths, as on the simulator and the H200 captures).

Limits, by construction: one host lane per rank (vLLM's engine-core and worker processes are
merged, so work they overlap counts as sequential); a GPU point's bound from the host is kept
for two launches, not all; sync points are only those ``syncs`` lists (a wait the analysis did
not recognize as a sync is host work that can be removed).

Inputs (all int64 ns on the aligned clock, one rank's rows each):

- ``syncs``: ``SYNC_COLUMNS``, one row per (instance, rank) sync point the rank takes part in:
  ``lane`` ``host`` (a blocking CPU collective) or ``gpu`` (a GPU collective), the rank's
  ``arrive_ns`` (its own part done) and ``exit_ns`` (it leaves). ``syncs_from_arrivals`` is the
  one adapter from profkit's tables (``straggler_arrivals.arrival_rows``) to it;
- ``steps``: ``rank, step, start_ns, end_ns``;
- ``host_pieces`` / ``gpu_pieces``: ``straggler_phases.timeline_pieces``;
- ``gpu_ops``: ``gpu_ops`` of the rank's events (GPU activity with the host time of its launch).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from profkit import distinct, schema
from profkit import intervals as iv
from profkit.keys import first_match
from profkit.analyze import straggler_phases as ph_mod
from profkit.names import is_comm_kernel
from profkit.layers import split_at
from profkit.analyze.vocabulary import HOST_SYNC_WAIT

HOST, GPU = 0, 1
WAIT_ON_GPU = 2  # ``work`` rows of a host's wait on its GPU: removing the sync removes the wait
LANE_NAMES = {"host": HOST, "gpu": GPU}
# point kinds
START, STEP_START, STEP_END, ARRIVE, EXIT, ANCHOR, GPU_DONE, RESUME = range(8)
KIND_NAMES = ("start", "step_start", "step_end", "arrive", "exit", "anchor", "gpu_done", "resume")
# edge kinds: along a lane (carries removable work), across lanes, a sync completion
LANE, CROSS, SYNC = 0, 1, 2
NO_SRC = -1  # a SYNC edge's source is the instance's completion, not a point

SYNC_COLUMNS = ["instance", "rank", "lane", "arrive_ns", "exit_ns"]
GPU_OP_COLUMNS = ["start_ns", "end_ns", "launch_ns", "comm"]
NODE_COLUMNS = ["rank", "node", "time_ns", "lane", "kind", "instance", "step"]
EDGE_COLUMNS = ["rank", "edge", "dst", "src", "kind", "slack_ns"]
WORK_COLUMNS = ["rank", "edge", "step", "lane", "phase", "ns"]
NO_LAUNCH = -1

# ties at one instant, per lane: what must come first
_HOST_TIE = {START: 0, EXIT: 1, RESUME: 2, STEP_END: 3, STEP_START: 4, ANCHOR: 5, ARRIVE: 6}
_GPU_TIE = {START: 0, EXIT: 1, GPU_DONE: 2, ARRIVE: 3}


# ---- the adapter ---------------------------------------------------------------------------
def syncs_from_arrivals(arrivals: pd.DataFrame) -> pd.DataFrame:
    """The replay's sync points from ``straggler_arrivals.arrival_rows`` (the measured complete
    instances inside the capture window): the ONE place that turns profkit's arrival table into
    ``SYNC_COLUMNS``. A GPU collective kernel is a GPU-lane point (start = arrival on the GPU,
    end = exit); a blocking CPU collective span a host-lane point."""
    if arrivals is None or not len(arrivals):
        return empty_syncs()
    kind = arrivals["source_kind"]
    # each distinct kind tested once (a Python string per row of ~10^6 rows was most of the time)
    gpu = distinct.isin(kind, "kernel") if distinct.is_text(kind) else kind.astype(str).to_numpy() == "kernel"
    instance, rank = arrivals["instance"].to_numpy(np.int64), arrivals["rank"].to_numpy(np.int64)
    arrive = arrivals["start_ns"].to_numpy(np.int64)
    exit_ = np.maximum(arrivals["end_ns"].to_numpy(np.int64), arrive)
    # ``sort_values(["rank", "arrive_ns", "instance"], kind="stable")``: the same stable lexsort
    order = np.lexsort((instance, arrive, rank))
    lane = distinct.strings_at(np.array(["host", "gpu"], dtype=object), gpu[order].astype(np.int64))
    return pd.DataFrame({"instance": instance[order], "rank": rank[order], "lane": lane,
                         "arrive_ns": arrive[order], "exit_ns": exit_[order]})


def empty_syncs() -> pd.DataFrame:
    out = pd.DataFrame({c: pd.Series(dtype="int64") for c in SYNC_COLUMNS})
    out["lane"] = out["lane"].astype(object)
    return out


# ---- per-rank GPU activity with launches -----------------------------------------------------
def gpu_ops(events: pd.DataFrame, gpu: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rank's GPU activity (kernels, copies, memsets) with the host time of the call that
    launched each (joined by correlation within its process; ``NO_LAUNCH`` when unknown) and
    whether it is communication. Sorted by start. ``gpu``: ``straggler_phases.gpu_rows(events)``
    when the caller has it."""
    if events is None or not len(events):
        return _empty_ops()
    kinds = events["kind"]
    # only the columns read below: filtering every Arrow column of the rank's events costs more
    g = gpu if gpu is not None else ph_mod.gpu_rows(events)
    if not len(g):
        return _empty_ops()
    rt = np.flatnonzero(distinct.isin(kinds, (schema.RUNTIME,)) & events["correlation"].notna().to_numpy(dtype=bool))
    launch = np.full(len(g), NO_LAUNCH, np.int64)
    corr = g["correlation"]
    has = corr.notna().to_numpy(dtype=bool)
    if rt.size and has.any():  # the three columns read, each taken at the runtime rows (not a frame of them)
        launch = launch_times(events["pid"].iloc[rt].fillna(-1).to_numpy(np.int64),
                              events["correlation"].iloc[rt].to_numpy(np.int64),
                              events["start_ns"].iloc[rt].to_numpy(np.int64), g["pid"].fillna(-1).to_numpy(np.int64),
                              corr.fillna(-1).to_numpy(np.int64), has)
    comm = np.zeros(len(g), bool)
    is_k = (g["kind"] == schema.KERNEL).to_numpy(dtype=bool)
    if is_k.any():  # ``is_comm_kernel`` of each distinct name once
        codes, uniques = pd.factorize(g["name"], use_na_sentinel=True)
        comm_u = np.r_[is_comm_kernel(pd.Series(uniques)), False]
        comm[is_k] = comm_u[np.asarray(codes, np.int64)[is_k]] | g["coll_name"].notna().to_numpy(dtype=bool)[is_k]
    start, end = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
    order = np.lexsort((end, start))  # by start, then end; ties in row order (a stable sort of both)
    return pd.DataFrame({"start_ns": start[order], "end_ns": end[order], "launch_ns": launch[order],
                         "comm": comm[order]})


def launch_times(rt_pid: np.ndarray, rt_corr: np.ndarray, rt_start: np.ndarray, pid: np.ndarray, corr: np.ndarray,
                 has: np.ndarray) -> np.ndarray:
    """Per GPU op (its pid and correlation, -1 where missing; ``has``: it has a correlation) the
    start of the first runtime call of the same (pid, correlation), ``NO_LAUNCH`` where none: a
    kernel's pid may be its device's, so an op with a correlation and no match takes the one call
    of that correlation where only one (pid, correlation) holds it. Sorted arrays (``keys.first_match``):
    a merge of two frames cost a rank of 390k events ~40 ms of pandas' own work."""
    order = np.lexsort((rt_start, rt_corr, rt_pid))  # per (pid, correlation), the first call first
    kp, kc, ks = rt_pid[order], rt_corr[order], rt_start[order]
    out = np.full(pid.size, NO_LAUNCH, np.int64)
    at = first_match((kp, kc), (pid, corr))
    hit = at >= 0
    out[hit] = ks[at[hit]]
    first = np.r_[True, (kp[1:] != kp[:-1]) | (kc[1:] != kc[:-1])]
    kc, ks = kc[first], ks[first]  # one row per (pid, correlation), sorted by both
    miss = ~hit & has
    if miss.any():
        by_c = np.argsort(kc, kind="stable")
        c, t = kc[by_c], ks[by_c]
        one = np.r_[True, c[1:] != c[:-1]] & np.r_[c[1:] != c[:-1], True]  # held by a single pid
        c, t = c[one], t[one]
        if c.size:
            j = np.minimum(np.searchsorted(c, corr[miss]), c.size - 1)
            ok = c[j] == corr[miss]
            rows = np.flatnonzero(miss)[ok]
            out[rows] = t[j[ok]]
    return out


def _empty_ops() -> pd.DataFrame:
    out = pd.DataFrame({c: pd.Series(dtype="int64") for c in GPU_OP_COLUMNS})
    out["comm"] = out["comm"].astype(bool)
    return out


# ---- the per-rank program ------------------------------------------------------------------
@dataclass
class RankProgram:
    """One rank's points, their incoming edges and the removable work on each edge (small tables:
    tens of points per step). ``residual_ns``: slack normalized away (see the module docstring)."""

    rank: int
    nodes: pd.DataFrame  # NODE_COLUMNS, in the rank's evaluation order (node = position)
    edges: pd.DataFrame  # EDGE_COLUMNS
    work: pd.DataFrame  # WORK_COLUMNS: removable time per (edge, phase); phases by name
    residual_ns: int = 0
    notes: tuple[str, ...] = ()
    gpu_work_at: int = -1  # built with ``defer_gpu``: where its GPU-lane rows go in ``work`` (-1: they are in)
    gpu_windows: pd.DataFrame | None = None  # built with ``defer_gpu``: GPU_WINDOW_COLUMNS, for ``gpu_work_rows``


def gpu_work_rows(rank: int, windows: pd.DataFrame, gpu_pieces: pd.DataFrame,
                  gpu_phases: set[str] | frozenset[str]) -> pd.DataFrame:
    """The GPU-lane ``work`` rows of a program built with ``defer_gpu`` (its ``gpu_windows``), of
    the kernels in ``gpu_phases`` only: the rows ``rank_program(..., gpu_phases=gpu_phases)`` has.

    Why deferred: which kernels' time a replay may remove is known only once the straggler
    verdicts are made; the programs are built beside them (``pipeline.run_stages``), and summing
    every kernel's pieces over every GPU edge would cost more than the whole rest of a program."""
    gp = _rank_rows(gpu_pieces, rank)
    if len(gp):
        gp = gp[gp["phase"].isin(list(gpu_phases)).to_numpy(dtype=bool)]
    parts = _gpu_parts(windows, _pieces_arrays(gp))
    if not parts:
        return _compact(_empty_work(), WORK_DTYPES)
    edge = np.concatenate([p[0] for p in parts])
    step_of = np.full(int(windows["edge"].max()) + 1, -1, np.int64)
    step_of[windows["edge"].to_numpy(np.int64)] = windows["step"].to_numpy(np.int64)
    rows = pd.DataFrame({"rank": np.full(edge.size, rank, np.int64), "edge": edge, "step": step_of[edge],
                         "lane": np.full(edge.size, GPU, np.int64),
                         "phase": pd.Series(np.concatenate([p[1] for p in parts]), dtype=object),
                         "ns": np.concatenate([p[2] for p in parts])})
    return _compact(rows, WORK_DTYPES)


def join_gpu_work(program: RankProgram, gpu_rows: pd.DataFrame | None) -> RankProgram:
    """A program built with ``defer_gpu`` with its GPU-lane rows (``gpu_work_rows``) in place:
    the program ``rank_program`` builds with the same ``gpu_phases``."""
    if program.gpu_work_at < 0:  # built with its GPU work (``gpu_phases`` given): nothing to put in
        if gpu_rows is not None and len(gpu_rows):
            raise ValueError(f"rank {program.rank}: the program's GPU work was not deferred")
        return program
    at, work = program.gpu_work_at, program.work
    if gpu_rows is not None and len(gpu_rows):
        work = pd.concat([work.iloc[:at], gpu_rows, work.iloc[at:]], ignore_index=True)
    return replace(program, work=work, gpu_work_at=-1, gpu_windows=None)


# phases of the host timeline that are the host waiting, never work to remove
def is_wait(phase: str, category: str | None = None) -> bool:
    """The ONE classification of wait causes: time spent waiting for another rank or for the GPU
    (``waiting for rank k``, ``wait:*``, ``transfer:*``, the host blocked while its GPU computes
    ``gpu:*`` seen from the host). Waits are never removed by a replay: they shrink or grow as
    a consequence of what is removed elsewhere."""
    return ph_mod.is_victim_phase(phase, category) or category == ph_mod.GPU_CATEGORY


def _waiting_on_gpu(phase: np.ndarray, category: np.ndarray) -> np.ndarray:
    """Host pieces where the host is blocked while its GPU works (compute or communication)."""
    return (category == ph_mod.GPU_CATEGORY) | (phase == HOST_SYNC_WAIT)


def _blocked(phase: np.ndarray, category: np.ndarray) -> np.ndarray:
    """Host pieces inside a blocking call on the GPU (waiting, or the sync call itself)."""
    return _waiting_on_gpu(phase, category) | (category == "host_sync")


def rank_program(rank: int, syncs: pd.DataFrame, steps: pd.DataFrame, host_pieces: pd.DataFrame,
                 gpu_ops_table: pd.DataFrame, gpu_pieces: pd.DataFrame,
                 gpu_phases: set[str] | frozenset[str] | None = None, defer_gpu: bool = False) -> RankProgram:
    """Build one rank's replay program (see the module docstring) from its own tables.

    ``gpu_phases``: the ``gpu:<kernel>`` phases whose time to keep as removable work (the ones a
    scenario may remove: the stragglers' GPU phases); None keeps every kernel's. The GPU lane's
    structure (points, busy and idle time, anchors) does not depend on it. ``defer_gpu``: leave
    the GPU-lane work rows out, and keep the windows they are summed over (``gpu_windows``) for
    ``gpu_work_rows`` and ``join_gpu_work`` once the phases are known."""
    hp, gp = _rank_rows(host_pieces, rank), _rank_rows(gpu_pieces, rank)
    if gpu_phases is not None and len(gp):
        gp = gp[gp["phase"].isin(list(gpu_phases)).to_numpy(dtype=bool)]
    st = steps[steps["rank"].to_numpy(np.int64) == rank] if steps is not None and len(steps) else None
    sy = syncs[syncs["rank"].to_numpy(np.int64) == rank] if len(syncs) else syncs
    ops = gpu_ops_table
    h_s, h_e = hp["start_ns"].to_numpy(np.int64), hp["end_ns"].to_numpy(np.int64)
    h_ph, ph_codes, ph_names = _text_column(hp["phase"])
    h_cat, cat_codes, cat_names = _text_column(hp["category"])
    times = [h_s[:1], ops["start_ns"].to_numpy(np.int64)[:1], sy["arrive_ns"].to_numpy(np.int64)]
    if st is not None and len(st):
        times.append(st["start_ns"].to_numpy(np.int64))
    t0 = int(min((int(t.min()) for t in times if t.size), default=0))

    b = _Builder(rank, t0)
    b.host_codes = (ph_codes, ph_names, cat_codes, cat_names)
    b.defer_gpu = defer_gpu
    # sync points
    sy_lane = sy["lane"].astype(str).to_numpy()
    for lane_name, lane in LANE_NAMES.items():
        rows = sy[sy_lane == lane_name]
        inst, a = rows["instance"].to_numpy(np.int64), rows["arrive_ns"].to_numpy(np.int64)
        x = np.maximum(rows["exit_ns"].to_numpy(np.int64), a + 1)  # strictly after its arrival
        b.add_pairs(lane, (ARRIVE, EXIT), a, x, instance=inst)
    # steps (read-off points on the host lane)
    if st is not None and len(st):
        s, e = st["start_ns"].to_numpy(np.int64), st["end_ns"].to_numpy(np.int64)
        b.add_pairs(HOST, (STEP_START, STEP_END), s, np.maximum(e, s), step=st["step"].to_numpy(np.int64))
    # the host waiting on its GPU: a GPU-done point and the host's resume
    cpu_sync = _cpu_sync_intervals(sy)
    busy = iv.union(ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64))
    waits = _gpu_waits(h_s, h_e, h_ph, h_cat, cpu_sync, busy)
    if waits:
        ws = np.array([w[0] for w in waits], np.int64)
        wg = np.array([w[1] for w in waits], np.int64)
        at = np.maximum(ws, wg)  # the sync's condition holds: the host is in it and the GPU is done
        done, resume = b.add_pairs(None, (GPU_DONE, RESUME), wg, at, lanes=(GPU, HOST))
        b.resume_of.update(zip(resume.tolist(), zip(done.tolist(), (at - ws).tolist(), (at - wg).tolist())))
        for r, (_, _, sync_phase) in zip(resume.tolist(), waits):
            if sync_phase:
                b.sync_phase[r] = sync_phase
    program = b.finish(ops, h_s, h_e, h_ph, h_cat, gp, st)
    return program


def _cpu_sync_intervals(sy: pd.DataFrame) -> iv.Intervals:
    rows = sy[sy["lane"].astype(str).to_numpy() == "host"]
    return iv.union(rows["arrive_ns"].to_numpy(np.int64), rows["exit_ns"].to_numpy(np.int64))


def _gpu_waits(h_s, h_e, h_ph, h_cat, cpu_sync: iv.Intervals,
               busy: iv.Intervals) -> list[tuple[int, int, str | None]]:
    """(start, GPU done, the sync's name) of each host sync: a run of touching blocked host
    pieces (a synchronize, a blocking copy, event polling). The host resumes when the GPU has
    finished what was launched before: the end of the run's last piece during which the GPU
    still worked, or, for a sync that found the GPU idle, the end of the GPU's last activity
    before it (a dependency all the same: in a replay where the host gets there earlier, it
    waits). The name is the run's ``host_sync (<span>)`` piece, None without one. Runs inside a
    blocking CPU collective are not syncs with the GPU."""
    if not h_s.size:
        return []
    blocked = _blocked(h_ph, h_cat)
    waiting = _waiting_on_gpu(h_ph, h_cat)
    if cpu_sync[0].size:  # inside a CPU collective the host waits for other ranks, not its GPU
        j = np.searchsorted(cpu_sync[0], h_s, side="right") - 1
        inside = (j >= 0) & (h_s < cpu_sync[1][np.maximum(j, 0)])
        blocked &= ~inside
        waiting &= ~inside
    idx = np.flatnonzero(blocked)
    if not idx.size:
        return []
    new = np.r_[True, (idx[1:] != idx[:-1] + 1) | (h_s[idx[1:]] != h_e[idx[:-1]])]
    first = np.flatnonzero(new)
    run_s = h_s[idx[first]]
    g_wait = np.maximum.reduceat(np.where(waiting[idx], h_e[idx], np.iinfo(np.int64).min), first)
    is_sync = h_cat[idx] == "host_sync"
    pos = np.where(is_sync, np.arange(idx.size), idx.size)
    first_sync = np.minimum.reduceat(pos, first)
    # a sync that found the GPU idle: the GPU was done when its last activity before ended
    b_s, b_e = busy
    j = np.searchsorted(b_e, run_s, side="right") - 1
    g_idle = np.where(j >= 0, b_e[np.maximum(j, 0)], np.iinfo(np.int64).min) if b_e.size else \
        np.full(run_s.size, np.iinfo(np.int64).min, np.int64)
    g = np.where(g_wait > np.iinfo(np.int64).min, g_wait, g_idle)
    out = []
    for k in np.flatnonzero(g > np.iinfo(np.int64).min):
        name = str(h_ph[idx[first_sync[k]]]) if first_sync[k] < idx.size else None
        out.append((int(run_s[k]), int(g[k]), name))
    return out


class _Builder:
    """Collects points, orders them, wires the edges and sums the removable work per edge."""

    def __init__(self, rank: int, t0: int):
        self.rank = rank
        self.t0 = t0
        # the points' columns, as chunks of arrays (``_column`` joins them): lane, kind, time, instance, step
        self.cols: dict[str, list[np.ndarray]] = {c: [np.array([v], np.int64)] for c, v in (
            ("lane", HOST), ("kind", START), ("time", t0), ("instance", -1), ("step", -1))}
        self.n = 1
        self.host_codes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None  # ``_text_column``s
        self.resume_of: dict[int, tuple[int, int, int]] = {}  # resume -> (its GPU-done point, host wait, GPU idle)
        self.sync_phase: dict[int, str] = {}  # resume point -> the name of the sync it waited in
        self.notes: list[str] = []
        self.defer_gpu = False  # ``rank_program``'s: GPU-lane work rows left for ``gpu_work_rows``
        self.gpu_windows: pd.DataFrame | None = None
        self.gpu_at = -1

    def add(self, lane: int, kind: int, t: int, instance: int = -1, step: int = -1) -> int:
        for c, v in (("lane", lane), ("kind", kind), ("time", max(int(t), self.t0)), ("instance", instance),
                     ("step", step)):
            self.cols[c].append(np.array([v], np.int64))
        self.n += 1
        return self.n - 1

    def add_pairs(self, lane: int | None, kinds: tuple[int, int], first: np.ndarray, second: np.ndarray,
                  instance: np.ndarray | None = None, step: np.ndarray | None = None,
                  lanes: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``add`` of two points per row (kinds[0] at ``first``, then kinds[1] at ``second``), in
        row order, as a loop of ``add`` calls would: returns the two points' ids per row."""
        m = int(np.asarray(first).size)
        lane_pair = lanes if lanes is not None else (lane, lane)
        both = np.empty(2 * m, np.int64)
        both[0::2], both[1::2] = first, second
        self.cols["lane"].append(np.tile(np.asarray(lane_pair, np.int64), m))
        self.cols["kind"].append(np.tile(np.asarray(kinds, np.int64), m))
        self.cols["time"].append(np.maximum(both, self.t0))
        for c, values in (("instance", instance), ("step", step)):
            self.cols[c].append(np.full(2 * m, -1, np.int64) if values is None
                                else np.repeat(np.asarray(values, np.int64), 2))
        ids = self.n + np.arange(2 * m, dtype=np.int64)
        self.n += 2 * m
        return ids[0::2], ids[1::2]

    def _column(self, name: str) -> np.ndarray:
        parts = self.cols[name]
        if len(parts) > 1:
            parts[:] = [np.concatenate(parts)]
        return parts[0]

    # -- anchors of the GPU points -------------------------------------------------------------
    def _anchors(self, ops: pd.DataFrame, gpu_pts: np.ndarray, prev_t: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per GPU point (arrival or GPU done) at ``t`` with the previous GPU point at ``prev_t``:
        the GPU's busy time in between, and the launches that gate it. For each op starting in
        [prev_t, t]: ``h_j = launch_j + latency_j + busy(start_j, t)`` (latency: the observed one
        where the GPU sat idle waiting for that op, else the rank's typical minimum), the
        earliest the point could be if the GPU ran from op j on without a gap. Two anchors are
        kept: the op with the largest ``h_j`` (the launch that set the point; its slack is ~0
        when the GPU waited for it) and the segment's first op (what bounds the point when the
        host's work between launches is removed: every later launch moves with it). Returns
        (busy, anchor times (n, 2) or NO_LAUNCH, their slacks (n, 2), their ops' starts (n, 2))."""
        t = self._column("time")[gpu_pts]
        n = t.size
        s, e = ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
        busy_iv = iv.union(s, e)
        busy = iv.covered_between(busy_iv, prev_t, t) if n else np.empty(0, np.int64)
        anchor_t = np.full((n, 2), NO_LAUNCH, np.int64)
        anchor_slack = np.zeros((n, 2), np.int64)
        anchor_s = np.zeros((n, 2), np.int64)
        launch = ops["launch_ns"].to_numpy(np.int64)
        ok = (launch != NO_LAUNCH) & (launch <= s)
        if not n or not ok.any():
            return busy, anchor_t, anchor_slack, anchor_s
        s, launch = s[ok], launch[ok]
        # the GPU was idle until this op started (a busy block starts there): it waited for the launch
        at = np.minimum(np.searchsorted(busy_iv[0], s), busy_iv[0].size - 1)  # block starts: sorted, distinct
        gated = busy_iv[0][at] == s
        lat = s - launch
        lat_min = max(int(np.quantile(lat[gated], 0.05)) if gated.any() else int(lat.min()), 0)
        lat = np.where(gated, lat, np.minimum(lat, lat_min))
        # the GPU point each op leads to: the first GPU point at or after its start
        order = np.argsort(t, kind="stable")
        ts = t[order]
        seg = np.searchsorted(ts, s, side="left")
        inside = seg < n
        seg = np.where(inside, seg, 0)
        pt = order[seg]
        inside &= s >= prev_t[pt]
        if not inside.any():
            return busy, anchor_t, anchor_slack, anchor_s
        s, launch, lat, pt = s[inside], launch[inside], lat[inside], pt[inside]
        h = launch + lat + iv.covered_between(busy_iv, s, t[pt])
        for col, key in ((0, -h), (1, s)):  # per point: the largest h; the earliest op
            best = np.lexsort((key, pt))
            first = np.r_[True, pt[best][1:] != pt[best][:-1]]
            pick = best[first]
            anchor_t[pt[pick], col] = launch[pick]
            anchor_slack[pt[pick], col] = np.maximum(t[pt[pick]] - h[pick], 0)
            anchor_s[pt[pick], col] = s[pick]
        same = anchor_t[:, 1] == anchor_t[:, 0]
        anchor_t[same, 1] = NO_LAUNCH
        return busy, anchor_t, anchor_slack, anchor_s

    def finish(self, ops, h_s, h_e, h_ph, h_cat, gp, st) -> RankProgram:
        lane, kind, time = self._column("lane"), self._column("kind"), self._column("time")
        # GPU lane order, then anchors for its arrivals and GPU-done points
        gpu_idx = np.flatnonzero((lane == GPU) | (kind == START))
        gpu_idx = gpu_idx[np.lexsort((_tie(_GPU_TIE, kind[gpu_idx]), time[gpu_idx]))]
        gpu_prev = np.r_[-1, gpu_idx[:-1]]
        need = np.isin(kind[gpu_idx], (ARRIVE, GPU_DONE))
        pts, prevs = gpu_idx[need], gpu_prev[need]
        busy, a_t, a_slack, a_s = self._anchors(ops, pts, time[prevs])
        # anchor points, in the order of (point, which): ids after the points already there
        has_a = a_t != NO_LAUNCH  # (n, 2)
        a_pt, a_k = np.nonzero(has_a)  # row-major: per point, which 0 before 1
        a_time = np.maximum(np.minimum(a_t[a_pt, a_k], time[pts[a_pt]]), self.t0)
        a_id = self.n + np.arange(a_pt.size, dtype=np.int64)
        for c, v in (("lane", np.full(a_pt.size, HOST, np.int64)), ("kind", np.full(a_pt.size, ANCHOR, np.int64)),
                     ("time", a_time.astype(np.int64)), ("instance", np.full(a_pt.size, -1, np.int64)),
                     ("step", np.full(a_pt.size, -1, np.int64))):
            self.cols[c].append(v)
        self.n += a_pt.size
        lane, kind, time = self._column("lane"), self._column("kind"), self._column("time")
        n = kind.size
        host_idx = np.flatnonzero((lane == HOST) & (kind != START))
        host_idx = np.r_[0, host_idx[np.lexsort((_tie(_HOST_TIE, kind[host_idx]), time[host_idx]))]]

        # incoming edges per point (old ids), as up to three slots per point: (src, kind, slack,
        # lane of work or -1, anchor op start, which). Slot 0: the lane edge (a SYNC edge from the
        # instance's completion for an exit); slot 1: a resume's cross edge from its GPU-done
        # point, or an anchor (which 0); slot 2: an anchor (which 1).
        e_src = np.full((n, 3), NO_SRC, np.int64)
        e_kind = np.full((n, 3), -1, np.int64)
        e_slack = np.zeros((n, 3), np.int64)
        e_lane = np.full((n, 3), -1, np.int64)
        e_from = np.full((n, 3), -1, np.int64)
        e_which = np.full((n, 3), -1, np.int64)
        prev = np.full(n, NO_SRC, np.int64)
        prev[host_idx[1:]] = host_idx[:-1]
        prev[gpu_idx[1:]] = gpu_idx[:-1]
        busy_at = np.zeros(n, np.int64)
        busy_at[pts] = busy
        res = np.fromiter(self.resume_of.keys(), np.int64, len(self.resume_of))
        res_vals = np.array(list(self.resume_of.values()), np.int64).reshape(-1, 3)
        is_exit = kind == EXIT
        is_host = (lane == HOST) & ~is_exit
        is_host[0] = False
        is_gpu = (lane != HOST) & ~is_exit
        is_gpu[0] = False
        e_kind[1:, 0] = np.where(is_exit[1:], SYNC, LANE)
        gap = time - time[np.maximum(prev, 0)]
        e_src[is_host | is_gpu, 0] = prev[is_host | is_gpu]
        e_lane[is_host, 0] = HOST
        e_lane[is_gpu, 0] = GPU
        e_slack[is_gpu, 0] = np.maximum(gap - busy_at, 0)[is_gpu]
        if res.size:  # a resume: its lane slack is what the host waited (at most the gap), and a cross edge
            e_slack[res, 0] = np.maximum(np.minimum(res_vals[:, 1], gap[res]), 0)
            e_src[res, 1], e_kind[res, 1], e_slack[res, 1] = res_vals[:, 0], CROSS, np.maximum(res_vals[:, 2], 0)
        slot = np.where((a_k == 1) & has_a[a_pt, 0], 2, 1)  # anchor 1 follows anchor 0 when both are there
        a_dst = pts[a_pt]
        e_src[a_dst, slot], e_kind[a_dst, slot] = a_id, CROSS
        e_slack[a_dst, slot] = a_slack[a_pt, a_k]
        e_from[a_dst, slot], e_which[a_dst, slot] = a_s[a_pt, a_k], a_k
        alive = e_kind >= 0
        alive[0] = False
        order = self._order(n, time, e_src, e_kind, alive, host_idx, gpu_idx)
        new_id = np.empty(n, np.int64)
        new_id[order] = np.arange(n)
        # normalize: the smallest slack into each point is 0 (the baseline reproduces observed times)
        slack_or_max = np.where(alive, e_slack, np.iinfo(np.int64).max)
        m = slack_or_max.min(axis=1)
        residual = int(m[order[1:]].sum())
        q_pt, q_slot = np.nonzero(alive[order])  # edges in evaluation order of their points, slots in order
        q_old = order[q_pt]
        n_e = q_pt.size
        src_old = e_src[q_old, q_slot]
        edges = _typed({"rank": np.full(n_e, self.rank, np.int64), "edge": np.arange(n_e, dtype=np.int64),
                        "dst": q_pt.astype(np.int64),
                        "src": np.where(src_old != NO_SRC, new_id[np.maximum(src_old, 0)], NO_SRC),
                        "kind": e_kind[q_old, q_slot], "slack_ns": e_slack[q_old, q_slot] - m[q_old]}, EDGE_DTYPES)
        nodes = _typed({"rank": np.full(len(order), self.rank, np.int64),
                        "node": np.arange(len(order), dtype=np.int64),
                        "time_ns": time[order], "lane": lane[order], "kind": kind[order],
                        "instance": self._column("instance")[order],
                        "step": self._column("step")[order]}, NODE_DTYPES)
        anchor_ops = (e_from[q_old, q_slot], e_which[q_old, q_slot])
        work = self._work(nodes, edges, e_lane[q_old, q_slot], anchor_ops, h_s, h_e, h_ph, h_cat, gp, st)
        if self.sync_phase:  # the waits of named syncs: gone when the sync is removed
            cross = np.flatnonzero(edges["kind"].to_numpy(np.int64) == CROSS)
            cross_into = dict(zip(q_pt[cross].tolist(), cross.tolist()))  # the last edge into each point
            rows = []
            for p, name in self.sync_phase.items():
                e = cross_into.get(int(new_id[p]))
                if e is not None:
                    rows.append((e, name, self.resume_of[p][1], int(time[p])))
            if rows:
                ids, names, ns, at = (np.asarray(x) for x in zip(*rows))
                extra = pd.DataFrame({"rank": np.full(len(rows), self.rank, np.int64), "edge": ids.astype(np.int64),
                                      "step": _step_at(st, at.astype(np.int64)), "lane": WAIT_ON_GPU,
                                      "phase": pd.Series(names.astype(object), dtype=object),
                                      "ns": ns.astype(np.int64)})
                work = pd.concat([work, extra], ignore_index=True) if len(work) else extra
        return RankProgram(self.rank, nodes, edges, _compact(work, WORK_DTYPES), int(residual), tuple(self.notes),
                           gpu_work_at=self.gpu_at, gpu_windows=self.gpu_windows)

    def _order(self, n, time, e_src, e_kind, alive, host_idx, gpu_idx) -> np.ndarray:
        """Merge the two lanes into one evaluation order in which every source comes first
        (by time; a point whose cross-lane source is not yet placed waits for it). ``alive``:
        the edge slots in use (a cross edge dropped here is marked dead in it).

        ``_merged_order`` proposes the order with array operations and checks it is the one the
        step-by-step merge (``_order_loop``) makes; where it is not (clocks disagree about an
        instant: a cross edge must be dropped), the loop runs."""
        got = _merged_order(n, time, e_src, e_kind, alive, host_idx, gpu_idx)
        return got if got is not None else self._order_loop(n, time, e_src, e_kind, alive, host_idx, gpu_idx)

    def _order_loop(self, n, time, e_src, e_kind, alive, host_idx, gpu_idx) -> np.ndarray:
        """``_order`` one point at a time: at each step the earlier of the two lanes' next points
        whose cross-lane sources are placed (the host's at equal times); when neither's are, the
        cross edges of the earlier one are dropped."""
        hl = host_idx.tolist()
        gl = gpu_idx[1:].tolist()  # START is host_idx[0]
        time = time.tolist()
        # a lane edge's source is the lane's previous point, always placed first: only cross
        # edges can hold a point back (point -> [(slot, source)])
        cross: dict[int, list[tuple[int, int]]] = {}
        for p, k in zip(*(a.tolist() for a in np.nonzero(alive & (e_kind == CROSS)))):
            cross.setdefault(p, []).append((k, int(e_src[p, k])))
        placed = [False] * n
        out = [0]
        placed[0] = True

        def ready(p: int) -> bool:
            for _, src in cross.get(p, ()):
                if not placed[src]:
                    return False
            return True

        i, j, n_h, n_g = 1, 0, len(hl), len(gl)
        forced = 0
        while i < n_h or j < n_g:
            hp = hl[i] if i < n_h else -1
            gp = gl[j] if j < n_g else -1
            h_ok = hp >= 0 and (hp not in cross or ready(hp))
            g_ok = gp >= 0 and (gp not in cross or ready(gp))
            if h_ok and (not g_ok or time[hp] <= time[gp]):  # the earlier head; the host's at equal times
                out.append(hp)
                placed[hp] = True
                i += 1
            elif g_ok:
                out.append(gp)
                placed[gp] = True
                j += 1
            else:  # clocks disagree about an instant: drop the cross edge of the earlier head
                heads = [(time[hp], 0, hp)] if hp >= 0 else []
                heads += [(time[gp], 1, gp)] if gp >= 0 else []
                _, _, p = min(heads)
                keep = []
                for k, src in cross.get(p, ()):
                    if placed[src]:
                        keep.append((k, src))
                    else:
                        alive[p, k] = False
                cross[p] = keep
                forced += 1
        if forced:
            self.notes.append(f"rank {self.rank}: {forced} cross-lane edge(s) dropped where clocks disagreed")
        return np.asarray(out, np.int64)

    def _work(self, nodes, edges, e_lane, anchor_ops, h_s, h_e, h_ph, h_cat, gp, st) -> pd.DataFrame:
        """Removable time per (edge, phase): host pieces on host-lane edges (waits left out),
        ``gpu:<kernel>`` pieces on GPU-lane edges, each clipped to the edge's time range, and on
        each anchor edge the ``gpu:<kernel>`` pieces from its op's start to its point (GPU work
        removed there also shortens the path from that launch)."""
        t = nodes["time_ns"].to_numpy(np.int64)
        dst, src = edges["dst"].to_numpy(np.int64), edges["src"].to_numpy(np.int64)
        eid = edges["edge"].to_numpy(np.int64)
        lo_t, hi_t = t[src].copy(), t[dst].copy()
        if st is not None and len(st):  # nothing is removed before the first step or after the last
            first, last = int(st["start_ns"].min()), int(st["end_ns"].max())
            lo_t, hi_t = np.maximum(lo_t, first), np.minimum(hi_t, last)
        parts = []
        m = (e_lane == HOST) & (src >= 0)
        if m.any() and h_s.size:
            coded = self.host_codes
            keep = ~(_wait_mask(h_ph, h_cat, coded) | _waiting_on_gpu(h_ph, h_cat))
            got = _window_sums(h_s[keep], h_e[keep], h_ph[keep], lo_t[m], hi_t[m], eid[m],
                               (coded[0][keep], coded[1]) if coded is not None else None)
            if got is not None:
                parts.append((HOST,) + got)
        windows = _gpu_windows(e_lane, src, edges["kind"].to_numpy(np.int64), anchor_ops, lo_t, hi_t, eid)
        if self.defer_gpu:
            self.gpu_at = int(sum(p[1].size for p in parts))
            self.gpu_windows = windows.assign(step=_step_at(st, t[dst[windows["edge"].to_numpy(np.int64)]]))
        else:
            parts += [(GPU,) + got for got in _gpu_parts(windows, _pieces_arrays(gp))]
        if not parts:
            return _empty_work()
        lane = np.concatenate([np.full(p[1].size, p[0], np.int64) for p in parts])
        edge = np.concatenate([p[1] for p in parts])
        phase = np.concatenate([p[2] for p in parts])
        ns = np.concatenate([p[3] for p in parts])
        step = _step_at(st, t[dst[edge]])  # edge ids are row numbers of ``edges``
        return pd.DataFrame({"rank": np.full(edge.size, self.rank, np.int64), "edge": edge, "step": step,
                             "lane": lane, "phase": pd.Series(phase, dtype=object), "ns": ns})


GPU_WINDOW_COLUMNS = ["kind", "edge", "lo_ns", "hi_ns", "step"]  # kind: 0 a GPU-lane edge, 1 and 2 the anchors


def _gpu_windows(e_lane, src, kinds, anchor_ops, lo_t, hi_t, eid) -> pd.DataFrame:
    """The time ranges ``gpu:<kernel>`` pieces are summed over: each GPU-lane edge's, and each
    anchor edge's from its op's start to its point (GPU work removed there also shortens the path
    from that launch). No window at all without a GPU-lane edge."""
    m = (e_lane == GPU) & (src >= 0)
    if not m.any():
        return pd.DataFrame({c: np.empty(0, np.int64) for c in GPU_WINDOW_COLUMNS[:4]})
    sel = [(0, m, lo_t[m])]
    for which in (0, 1):  # anchors of one kind have disjoint windows
        a = (kinds == CROSS) & (anchor_ops[1] == which)
        sel.append((1 + which, a, np.maximum(anchor_ops[0][a], lo_t[a])))
    return pd.DataFrame({"kind": np.concatenate([np.full(int(a.sum()), k, np.int64) for k, a, _ in sel]),
                         "edge": np.concatenate([eid[a] for _, a, _ in sel]),
                         "lo_ns": np.concatenate([lo for _, _, lo in sel]),
                         "hi_ns": np.concatenate([hi_t[a] for _, a, _ in sel])})


def _gpu_parts(windows: pd.DataFrame, pieces: tuple[np.ndarray, ...]) -> list[tuple[np.ndarray, ...]]:
    """(edge, phase, ns) of the pieces inside each kind of ``_gpu_windows``, in kind order."""
    ps, pe, ph, _ = pieces
    if not len(windows) or not ps.size:
        return []
    kind = windows["kind"].to_numpy(np.int64)
    edge, lo, hi = (windows[c].to_numpy(np.int64) for c in ("edge", "lo_ns", "hi_ns"))
    out = []
    for k in (0, 1, 2):
        w = kind == k
        got = _window_sums(ps, pe, ph, lo[w], hi[w], edge[w]) if w.any() else None
        if got is not None:
            out.append(got)
    return out


def _merged_order(n: int, time: np.ndarray, e_src: np.ndarray, e_kind: np.ndarray, alive: np.ndarray,
                  host_idx: np.ndarray, gpu_idx: np.ndarray) -> np.ndarray | None:
    """The evaluation order ``_Builder._order_loop`` makes, built with array operations, or None
    where it cannot be shown to be that order (then the loop decides).

    Each host point goes after the GPU points that are earlier than it (ties: the host first) and
    after its cross-lane sources; each GPU point after the host points at or before it and after
    its sources; the two views are raised until they agree. The proposal is then checked step by
    step against the loop's rule: the point placed has its sources placed, and the other lane's
    next point was either not ready or not earlier (at equal times the host goes first). A
    proposal that passes every step is the loop's order (the loop's choice at each step is
    determined by what is placed before it), with no cross edge dropped."""
    hs, gs = host_idx[1:], gpu_idx[1:]  # the START point (both lanes' first) is placed first
    nh, ng = hs.size, gs.size
    if nh + ng + 1 != n or not nh or not ng:
        return None
    th, tg = time[hs], time[gs]
    is_host = np.zeros(n, bool)
    is_host[hs] = True
    lane_pos = np.zeros(n, np.int64)
    lane_pos[hs] = np.arange(nh)
    lane_pos[gs] = np.arange(ng)
    p, k = np.nonzero(alive & (e_kind == CROSS))
    src = e_src[p, k]
    if ((src != 0) & (is_host[p] == is_host[src])).any():
        return None  # a cross edge within a lane: not this proposal's case
    real = src != 0  # START is placed first: no constraint
    p, src = p[real], src[real]
    need_g = np.full(nh, -1, np.int64)  # per host point: the last GPU point it waits for
    need_h = np.full(ng, -1, np.int64)
    ph = is_host[p]
    np.maximum.at(need_g, lane_pos[p[ph]], lane_pos[src[ph]])
    np.maximum.at(need_h, lane_pos[p[~ph]], lane_pos[src[~ph]])
    # GPU points before each host point, host points before each GPU point
    before_h = np.maximum.accumulate(np.maximum(np.searchsorted(tg, th, side="left"), need_g + 1))
    before_g = np.maximum.accumulate(np.maximum(np.searchsorted(th, tg, side="right"), need_h + 1))
    ih, ig = np.arange(nh), np.arange(ng)
    for _ in range(64):
        new_h = np.maximum(before_h, np.searchsorted(before_g, ih, side="right"))
        new_g = np.maximum(before_g, np.searchsorted(new_h, ig, side="right"))
        if np.array_equal(new_h, before_h) and np.array_equal(new_g, before_g):
            break
        before_h, before_g = new_h, new_g
    else:
        return None
    if before_h[-1] > ng:
        return None
    slot_h = ih + before_h  # strictly increasing: before_h never decreases
    free = np.ones(nh + ng, bool)
    free[slot_h] = False
    merged = np.empty(nh + ng, np.int64)
    merged[slot_h] = hs
    merged[free] = gs
    out = np.r_[0, merged]
    # check every step against the loop's rule
    pos = np.empty(n, np.int64)
    pos[out] = np.arange(n)
    last_src = np.full(n, -1, np.int64)
    np.maximum.at(last_src, p, pos[src])
    step = np.arange(1, n)
    chosen = out[1:]
    if (last_src[chosen] >= step).any():
        return None  # a point placed before one of its sources
    c_host = is_host[chosen]
    h_before = np.cumsum(c_host) - c_host  # host points placed before each step
    g_before = (step - 1) - h_before
    other = np.where(c_host, gs[np.minimum(g_before, ng - 1)], hs[np.minimum(h_before, nh - 1)])
    has_other = np.where(c_host, g_before < ng, h_before < nh)
    ready = last_src[other] < step
    t_c, t_o = time[chosen], time[other]
    fine = ~has_other | ~ready | np.where(c_host, t_c <= t_o, t_c < t_o)
    return out if fine.all() else None


def _window_sums(ps, pe, ph, ws, we, wid, coded: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Time per phase of sorted disjoint pieces inside each window (windows sorted and disjoint:
    consecutive edges of one lane), as (window id, phase, ns) arrays. ``coded``: ``ph`` as codes
    of a column and its distinct values (``_text_column``), to factorize integers, not strings."""
    ok = we > ws
    ws, we, wid = ws[ok], we[ok], wid[ok]
    if not ps.size or not ws.size:
        return None
    cuts = iv.unique_sorted(np.concatenate([ws, we]))
    s, e, owner = split_at(ps, pe, cuts)
    w = np.searchsorted(ws, s, side="right") - 1
    inside = (w >= 0) & (e > s)
    inside[inside] &= e[inside] <= we[w[inside]]
    if not inside.any():
        return None
    if coded is None:
        codes, names = pd.factorize(pd.Series(ph, dtype=object))
    else:  # the same codes (first appearance in ``ph``) and names, factorizing the column's codes
        codes, first = distinct.first_appearance(coded[0], len(coded[1]))
        names = np.asarray(coded[1], dtype=object)[first]
    key = w[inside] * np.int64(max(len(names), 1)) + codes[owner[inside]]
    uniq, inv = np.unique(key, return_inverse=True)
    ns = np.bincount(inv, weights=(e[inside] - s[inside]).astype(np.float64)).astype(np.int64)
    k = max(len(names), 1)
    return wid[uniq // k], np.asarray(names, dtype=object)[uniq % k], ns


def _tie(order: dict[int, int], kinds: np.ndarray) -> np.ndarray:
    """Each point kind's tie-break rank (``_HOST_TIE`` / ``_GPU_TIE``), looked up per kind."""
    lookup = np.full(max(order) + 1, -1, np.int64)
    lookup[list(order)] = list(order.values())
    return lookup[kinds]


def _wait_mask(ph: np.ndarray, cat: np.ndarray, coded: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
    """``is_wait`` of each piece, decided once per distinct (phase, category). ``coded``: the
    two columns' codes and distinct values (``_text_column``), when the caller has them."""
    if not ph.size:
        return np.zeros(0, bool)
    # decided per distinct (phase, category) pair: the two codes combined into one
    if coded is not None:
        pc, pu, cc, cu = coded
    else:
        pc, pu = _str_factorize(ph)
        cc, cu = _str_factorize(cat)
    k = max(len(cu), 1)
    inverse, pairs = pd.factorize(np.asarray(pc, np.int64) * k + np.asarray(cc, np.int64))
    flags = np.array([is_wait(str(pu[v // k]), str(cu[v % k])) for v in pairs.tolist()], bool)
    return flags[inverse]


def _rank_rows(pieces: pd.DataFrame, rank: int) -> pd.DataFrame:
    """The rank's rows of ``pieces``: the table itself where they are all its (a rank task's
    pieces), not a copy whose text columns ``distinct.codes`` would factorize again."""
    if not len(pieces):
        return pieces
    mine = pieces["rank"].to_numpy(np.int64) == rank
    return pieces if mine.all() else pieces[mine]


def _text_column(col: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``col.astype(str).to_numpy(dtype=object)``, its codes and distinct values as
    ``_str_factorize`` gives them: from one factorize of the column (Arrow's hash of its strings,
    then one Python string per distinct value, shared by its rows; a text column's ``distinct.codes``)."""
    if distinct.is_text(col):
        codes, names = distinct.codes(col)
        if not (codes < 0).any():
            return (names[codes] if codes.size else np.empty(0, dtype=object)), codes, names
    codes, uniques = pd.factorize(col, use_na_sentinel=True)
    codes = np.asarray(codes, np.int64)
    if (codes < 0).any() or not all(type(u) is str for u in uniques):  # as pandas spells them
        objects = col.astype(str).to_numpy(dtype=object)
        c, u = _str_factorize(objects)
        return objects, np.asarray(c, np.int64), np.asarray(u, dtype=object)
    names = np.array([str(u) for u in uniques], dtype=object)
    return (names[codes] if codes.size else np.empty(0, dtype=object)), codes, names


def _str_factorize(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(a.astype(str))``: an object array of Python strings (``_pieces_arrays``) is
    factorized as it is (``astype(str)`` would first copy every row into fixed-width unicode)."""
    if a.dtype == object:
        codes, uniques = pd.factorize(a)
        if all(type(u) is str for u in uniques) and not (codes < 0).any():
            return codes, uniques
    return pd.factorize(a.astype(str))


def _pieces_arrays(p: pd.DataFrame) -> tuple[np.ndarray, ...]:
    if p is None or not len(p):
        z = np.empty(0, np.int64)
        return z, z, np.empty(0, object), np.empty(0, object)
    return (p["start_ns"].to_numpy(np.int64), p["end_ns"].to_numpy(np.int64),
            distinct.text_objects(p["phase"]), distinct.text_objects(p["category"]))


def _step_at(st: pd.DataFrame | None, t: np.ndarray) -> np.ndarray:
    """The step each time falls in (start <= t <= end; -1 outside every step)."""
    out = np.full(t.size, -1, np.int64)
    if st is None or not len(st) or not t.size:
        return out
    s = st.sort_values("start_ns")
    ss, se, sn = (s["start_ns"].to_numpy(np.int64), s["end_ns"].to_numpy(np.int64), s["step"].to_numpy(np.int64))
    j = np.searchsorted(ss, t, side="right") - 1
    ok = (j >= 0) & (t <= se[np.maximum(j, 0)])
    out[ok] = sn[j[ok]]
    return out


# what a program's tables hold at most: tens of points per step, so int32 ids and steps; times int64
NODE_DTYPES = {"rank": "int32", "node": "int32", "time_ns": "int64", "lane": "int8", "kind": "int8",
               "instance": "int64", "step": "int64"}
EDGE_DTYPES = {"rank": "int32", "edge": "int32", "dst": "int32", "src": "int32", "kind": "int8", "slack_ns": "int64"}
WORK_DTYPES = {"rank": "int32", "edge": "int32", "step": "int64", "lane": "int8", "ns": "int64"}


def _typed(columns: dict[str, np.ndarray], dtypes: dict[str, str]) -> pd.DataFrame:
    """A program table made in its small integer types at once (``_compact``'s of int64 arrays:
    the frame is not made twice)."""
    return pd.DataFrame({c: v.astype(dtypes[c]) if c in dtypes else v for c, v in columns.items()})


def _compact(df: pd.DataFrame, dtypes: dict[str, str]) -> pd.DataFrame:
    """The table in small integer types (the driver holds every rank's); phases stay shared
    Python strings (one object per distinct name, pickled once)."""
    want = {c: t for c, t in dtypes.items() if c in df.columns}
    if all(isinstance(df[c].dtype, np.dtype) and df[c].dtype.kind in "iub" for c in want):
        # the usual: numpy integer columns, cast array by array (a frame's astype of a dict of dtypes
        # has ~0.5 ms more fixed work, three tables a rank); floats go through astype, which refuses NaN
        out = pd.DataFrame({c: df[c].to_numpy().astype(want[c]) if c in want else df[c] for c in df.columns},
                           index=df.index)
    else:
        out = df.astype(want)
    if "phase" in out:
        codes, names = pd.factorize(out["phase"].to_numpy(dtype=object))
        out["phase"] = pd.Series(np.asarray(list(names), dtype=object)[codes] if len(out) else [], dtype=object,
                                 index=out.index)
    return out


def _empty_work() -> pd.DataFrame:
    out = pd.DataFrame({c: pd.Series(dtype="int64") for c in WORK_COLUMNS})
    out["phase"] = out["phase"].astype(object)
    return out
