"""Impact: how much faster the serving step would be without each cause (``OUT/impact.csv``).

``causes.csv`` ranks causes by the GPU-idle time charged to them, summed over ranks. That is
not what removing a cause buys: a 40 ms GC pause on one rank of DEP32 is charged 40 ms to ``gc``
and 31 x 40 ms to ``waiting for rank k``, yet removing it saves about 40 ms of step time; host
work that overlaps GPU work costs nothing until it is on the critical path; a rank late by 5 ms
behind another rank's 8 ms costs nothing either. Impact is measured by a what-if replay
(``impact_program``: the model; ``impact_replay``: the engine): every rank's timeline re-timed
through its sync points with the cause removed, every step's end recomputed.

Scenarios (one row of ``impact.csv`` each, ``kind``):

- ``cause``: one cause removed on every rank that has it: its host time (the host timeline's
  phase of that name, ``straggler_phases``; for ``host_sync (X)`` also the sync's wait on the
  GPU: the sync is gone). Waits are never removed, they follow (``impact_program.is_wait``).
  The causes of ``causes.csv`` (waits excepted, the largest ``MAX_CAUSES``) and the host phases
  with the most time although no GPU-idle time was charged to them (host work that delays a sync
  point while its own GPU is busy).
- ``rank_phase``: a straggler rank's top phases (``X on rank 7``, from ``stragglers.csv``): that
  phase on that rank cut, step by step, to the median over the other ranks of their time in it
  (its excess, removed where it happened; ``gpu:<kernel>`` phases on the rank's GPU).
- ``spikes``: a cause cut, step by step on each rank, to its median per step (``X spikes (above
  its median step)``): GC pauses, sleeps, rare slow passes on top of a steady part.
- ``bound``: ``all host overhead removed (GPU-only bound)`` (every host phase but waits and the
  host's waits on its GPU), ``every rank as fast as the median rank (straggler-free bound)``
  (each rank's work before each sync point cut to the median over the participants), ``every
  cause at its median step (spike-free bound)`` (every phase as ``spikes``).
- ``combined``: several removed together (``what_if`` only; not in the default table).

Step time: a rank's step costs the deployment its **period**, from its start to the rank's
next step start (the last step: its own span); the serving step time of a step is the mean of
its periods over ranks. Ranks synchronize every step, so a late rank's delay lands in its
peers' next step, and time moved between a step and the gap before the next one is not saved.
Where steps follow each other back to back the period is ``steps.csv``'s ``step_ns``; the mean
over steps of the per-step mean is the time each step costs. Columns (int64 ns unless said):

- ``impact_ns_per_step``: drop of the mean step time (observed minus replayed), with
  ``impact_lo_ns`` / ``impact_hi_ns`` its 95% bootstrap interval over steps;
- ``impact_p90_ns``: drop of the p90 over steps of the step time;
- ``impact_share`` (ratio): ``impact_ns_per_step`` over the step-time gap to the GPU-only bound
  (mean step time minus the GPU-only bound's replayed mean): the share of the host overhead this
  cause explains (1.0 = all of it); ``step_share``: over the mean step time itself;
- ``charged_ns``: what ``causes.csv`` charges today (total over ranks and steps; for a
  ``rank_phase`` row that rank's charge, for the GPU-only bound every non-wait cause, for the
  straggler-free bound every wait; empty for spikes); ``removed_ns``: the time the replay
  removed (all ranks and steps); ``base_step_ns`` / ``replayed_step_ns``: the mean step time
  before and after; ``ranks`` / ``ranks_list``: the ranks the cause was removed on.

Rows: ``cause``, ``rank_phase`` and ``spikes`` ranked by impact, then the three bounds.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit.analyze import impact_program as prog
from profkit.analyze import impact_replay as rp

IMPACT_COLUMNS = ["cause", "ranks", "impact_ns_per_step", "impact_p90_ns", "impact_share", "charged_ns"]
IMPACT_EXTRA_COLUMNS = ["kind", "ranks_list", "impact_lo_ns", "impact_hi_ns", "step_share", "removed_ns",
                        "base_step_ns", "replayed_step_ns", "n_steps"]
IMPACT_STEP_COLUMNS = ["cause", "step", "step_ns", "replayed_ns"]
CAUSE, RANK_PHASE, SPIKES, BOUND, COMBINED = "cause", "rank_phase", "spikes", "bound", "combined"
GPU_ONLY = "all host overhead removed (GPU-only bound)"
MEDIAN_RANK = "every rank as fast as the median rank (straggler-free bound)"
MEDIAN_STEP = "every cause at its median step (spike-free bound)"
MAX_CAUSES = 30  # cause scenarios from causes.csv (largest charge first)
MAX_EXTRA_PHASES = 10  # host phases not in causes.csv, by total host time
RANK_PHASES = 2  # straggler phases per straggler rank (top and second cause)
MAX_SPIKES = 5  # "X spikes" rows (the part of a cause above its median per step)
MIN_SPIKE_SHARE = 0.2  # ... when the spikes are at least this share of the cause's time
SCENARIO_BLOCK_BYTES = 1 << 26  # cut and shift matrices per replay pass (scenarios are done in blocks)
NUMPY_BLOCK_BYTES = 1 << 28  # the numpy replay pays its rounds once per pass: fewer, larger blocks
REPLAY_THREADS = 4  # compiled blocks replayed at once (the kernel runs without the GIL; the workers are idle then)
N_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Scenario:
    """What one replay removes. ``name`` is the ``cause`` column."""

    name: str
    kind: str
    phase: str | None = None  # cause / rank_phase / spikes: the phase removed
    rank: int | None = None  # rank_phase: the rank
    parts: tuple["Scenario", ...] = ()  # combined: everything its parts remove


@dataclass
class Impact:
    """``impact.csv`` (``table``), the per-step samples behind it (``steps``) and facts for the
    summary and the verdict."""

    table: pd.DataFrame
    steps: pd.DataFrame
    base_mean_ns: float = math.nan
    gap_ns: float = math.nan  # mean step minus the GPU-only bound's
    model_residual_ns: int = 0
    n_points: int = 0
    released_early: int = 0
    notes: list[str] = field(default_factory=list)
    # kept for ``what_if`` (not written to files): the replay graph and the tables it came from
    graph: rp.ReplayGraph | None = field(default=None, repr=False)
    steps_table: pd.DataFrame | None = field(default=None, repr=False)
    causes: pd.DataFrame | None = field(default=None, repr=False)
    cause_steps: pd.DataFrame | None = field(default=None, repr=False)

    def to_summary(self, top: int = 10) -> dict:
        """``summary.json``'s ``impact``: the top rows (bounds apart), the bounds by name."""
        t = self.table
        rows = t[t["kind"] != BOUND].head(top) if len(t) else t
        bounds = {str(r["cause"]): {"impact_ns_per_step": _num(r["impact_ns_per_step"]),
                                    "replayed_step_ns": _num(r["replayed_step_ns"])}
                  for r in t[t["kind"] == BOUND].to_dict("records")} if len(t) else {}
        return {
            "step_time_ns_mean": _num(self.base_mean_ns), "gap_to_gpu_only_ns": _num(self.gap_ns),
            "model_residual_ns": int(self.model_residual_ns), "points": int(self.n_points),
            "instances_released_early": int(self.released_early),
            "rows": [{k: _num(v) for k, v in r.items()} for r in rows.to_dict("records")],
            "bounds": bounds,
            "notes": list(self.notes),
        }


def _num(v):
    if v is None or v is pd.NA:
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def empty_table() -> pd.DataFrame:
    cols = IMPACT_COLUMNS + IMPACT_EXTRA_COLUMNS
    text = {"cause", "kind", "ranks_list"}
    return pd.DataFrame({c: pd.Series(dtype=object if c in text else "float64") for c in cols})


def empty_impact(note: str | None = None) -> Impact:
    return Impact(empty_table(), pd.DataFrame({c: pd.Series(dtype=object if c == "cause" else "int64")
                                               for c in IMPACT_STEP_COLUMNS}), notes=[note] if note else [])


# ---- scenarios -----------------------------------------------------------------------------
def scenarios_for(work: rp.WorkArrays, causes: pd.DataFrame | None, stragglers: pd.DataFrame | None,
                  straggler_ranks: list[int] | None) -> list[Scenario]:
    """The scenarios worth replaying for this capture (see the module docstring)."""
    out, names = base_scenarios(work, causes)
    return out + straggler_scenarios(work, names, stragglers, straggler_ranks)


def base_scenarios(work: rp.WorkArrays, causes: pd.DataFrame | None) -> tuple[list[Scenario], list[str]]:
    """The scenarios that need no straggler verdict (``scenarios_for``'s first ones: the bounds,
    causes and spikes) and the phases they remove as causes: a replay of these can start while
    the verdicts are made (``pipeline.run_stages``)."""
    out = [Scenario(GPU_ONLY, BOUND), Scenario(MEDIAN_RANK, BOUND), Scenario(MEDIAN_STEP, BOUND)]
    host = work.lane == prog.HOST
    tot = np.bincount(work.code[host], weights=work.ns[host].astype(np.float64), minlength=work.names.size)
    have = {str(work.names[c]) for c in np.flatnonzero(tot > 0)}
    names: list[str] = []
    if causes is not None and len(causes):
        for c in causes.sort_values("total_ns", ascending=False, kind="stable")["cause"].astype(str):
            if c in have and c not in names and not prog.is_wait(c):
                names.append(c)
            if len(names) >= MAX_CAUSES:
                break
    order = np.argsort(-tot, kind="stable")
    extra = [str(work.names[c]) for c in order if tot[c] > 0 and str(work.names[c]) not in names
             and not prog.is_wait(str(work.names[c]))][:MAX_EXTRA_PHASES]
    names += extra
    out += [Scenario(n, CAUSE, phase=n) for n in names]
    out += _spike_scenarios(work, names)
    return out, names


def straggler_scenarios(work: rp.WorkArrays, names: list[str], stragglers: pd.DataFrame | None,
                        straggler_ranks: list[int] | None) -> list[Scenario]:
    """``scenarios_for``'s ``rank_phase`` rows: the straggler ranks' top phases (``names``: the
    phases ``base_scenarios`` removes as causes)."""
    out: list[Scenario] = []
    if stragglers is not None and len(stragglers) and straggler_ranks and work.size:
        by_rank = stragglers.set_index("rank")
        for r in straggler_ranks:
            if r not in by_rank.index:
                continue
            row = by_rank.loc[r]
            for col, ns_col in (("top_cause", "top_cause_ns"), ("second_cause", "second_cause_ns"))[:RANK_PHASES]:
                phase, excess = row.get(col), row.get(ns_col)
                if not isinstance(phase, str) or prog.is_wait(phase) and not phase.startswith("gpu:"):
                    continue
                if excess is None or pd.isna(excess) or float(excess) <= 0:
                    continue
                of_phase = work.code == work.code_of(phase)
                if not (of_phase & (work.rank == int(r))).any():
                    continue
                if set(np.unique(work.rank[of_phase]).tolist()) == {int(r)} and phase in names:
                    continue  # the cause's own row already removes it on that rank alone
                out.append(Scenario(f"{phase} on rank {int(r)}", RANK_PHASE, phase=phase, rank=int(r)))
    return out


def straggler_gpu_phases(stragglers: pd.DataFrame | None) -> set[str]:
    """The ``gpu:<kernel>`` phases a ``rank_phase`` scenario may remove (the straggler ranks' top
    causes on their GPU): the only GPU work the programs need to carry."""
    if stragglers is None or not len(stragglers):
        return set()
    out = set()
    for col in ("top_cause", "second_cause")[:RANK_PHASES]:
        if col in stragglers:
            out |= {str(p) for p in stragglers[col].dropna() if str(p).startswith("gpu:")}
    return out


DROP = 1 << 58  # cut on a wait's edge that removes the wait itself (the sync is gone)


def _spike_scenarios(work: rp.WorkArrays, names: list[str]) -> list[Scenario]:
    """Causes whose time comes in spikes (a GC pause, a sleep, a rare slow pass) on top of a
    steady part: a row for the part above the cause's median per step (on each rank), when it is
    at least ``MIN_SPIKE_SHARE`` of the cause's time and not all of it (then the cause's own row
    says the same)."""
    if not work.size or not names:
        return []
    host = work.lane == prog.HOST
    share = _median_step_share(work)
    spike = np.bincount(work.code[host], weights=(work.ns * share)[host], minlength=work.names.size)
    total = np.bincount(work.code[host], weights=work.ns[host].astype(np.float64), minlength=work.names.size)
    out = []
    for name in names:
        c = work.code_of(name)
        sp, tot = (float(spike[c]), float(total[c])) if c >= 0 else (0.0, 0.0)
        if tot > 0 and MIN_SPIKE_SHARE * tot <= sp < 0.98 * tot:
            out.append((sp, Scenario(f"{name} spikes (above its median step)", SPIKES, phase=name)))
    out.sort(key=lambda x: -x[0])
    return [sc for _, sc in out[:MAX_SPIKES]]


def _cuts(g: rp.ReplayGraph, scen: list[Scenario]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(edge cuts, point cuts or None, removed ns per scenario) for a block of scenarios.

    Work rows on a lane are removed (in part, for a share); a sync's wait row (``WAIT_ON_GPU``)
    is removed whole or not at all: removing ``host_sync (X)`` removes the sync, so the host no
    longer waits for its GPU there. Each scenario touches only the rows it removes any of
    (``_share_rows``: one phase's, most of them), never every work row or edge again: at DEP32 x
    1,000 a block is one scenario over 2.9 M work rows and edges, replayed beside the others on
    threads, and what is done here holds the GIL."""
    w = g.work
    cut = np.zeros((len(g.edges), len(scen)), np.int64)
    # one scenario's cuts, filled contiguous, then copied into ``cut`` (a block of one: its column itself)
    col = cut[:, 0] if len(scen) == 1 else np.zeros(len(g.edges), np.int64)
    node_cut = None
    removed = np.zeros(len(scen), np.int64)
    is_wait_row = w.wait_rows()
    ctx: dict = {}
    for j, s in enumerate(scen):
        nc = _node_cut(g, s, ctx)
        if nc is not None:
            node_cut = np.zeros((g.n, len(scen)), np.int64) if node_cut is None else node_cut
            node_cut[:, j] = nc
            removed[j] += int(nc.sum())
        if not w.size:
            continue
        rows, share = _share_rows(s, w, ctx)  # the rows it removes any of: most scenarios remove one phase's
        ns, edge, wait = w.ns[rows], w.edge[rows], is_wait_row[rows]
        amount = ns if share is None else np.rint(ns * share).astype(np.int64)  # None: whole rows
        lane_rows = ~wait & (amount > 0)
        np.add.at(col, edge[lane_rows], amount[lane_rows])
        drop = wait if share is None else wait & (share >= 0.5)
        col[edge[drop]] = DROP
        if len(scen) > 1:
            cut[edge, j] = col[edge]  # the only entries this scenario set (a whole column would write every
            col[edge] = 0  # row of the matrix once per scenario: most of a small capture's replay)
        removed[j] += int(amount[lane_rows].sum() + ns[drop].sum())
    return cut, node_cut, removed


def _node_cut(g: rp.ReplayGraph, s: Scenario, ctx: dict) -> np.ndarray | None:
    """Point cuts of a scenario (only the straggler-free bound has them), or None."""
    if s.name == MEDIAN_RANK:
        if "median_rank" not in ctx:
            ctx["median_rank"] = _median_rank_cut(g)
        return ctx["median_rank"]
    if s.kind == COMBINED:
        cuts = [c for c in (_node_cut(g, p, ctx) for p in s.parts) if c is not None]
        return np.maximum.reduce(cuts) if cuts else None
    return None


def _share(s: Scenario, w: rp.WorkArrays, ctx: dict) -> np.ndarray:
    """The share of each work row a scenario removes (0..1)."""
    if s.kind == COMBINED:
        shares = [_share(p, w, ctx) for p in s.parts]
        return np.maximum.reduce(shares) if shares else np.zeros(w.size)
    if s.name == MEDIAN_RANK:
        return np.zeros(w.size)
    if s.name == GPU_ONLY:
        return np.where(w.lane == prog.HOST, 1.0, 0.0)
    if s.name == MEDIAN_STEP or s.kind == SPIKES:
        if "median_step" not in ctx:
            ctx["median_step"] = _median_step_share(w)
        if s.name == MEDIAN_STEP:
            return ctx["median_step"]
    hit = w.code == w.code_of(str(s.phase))
    if s.kind == SPIKES:
        return np.where(hit, ctx["median_step"], 0.0)
    if s.kind == RANK_PHASE:
        hit &= w.rank == s.rank
        return np.where(hit, _peer_step_share(w, hit, s.rank, w.code_of(str(s.phase))), 0.0)
    return np.where(hit, 1.0, 0.0)


def _share_rows(s: Scenario, w: rp.WorkArrays, ctx: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """``(rows, share[rows])`` for ``share = _share(s, w, ctx)`` and ``rows = np.flatnonzero(share)``,
    without a share for every work row where the scenario removes whole rows of one phase (or the
    host lane): their rows found from a mask, and None for their share (all 1: a row's ns, an
    int64 far below 2^53, is then its amount as ``rint(ns * 1.0)`` would give it)."""
    if s.kind != COMBINED and s.name not in (MEDIAN_RANK, MEDIAN_STEP):
        if s.name == GPU_ONLY:
            return np.flatnonzero(w.lane == prog.HOST), None
        if s.kind not in (SPIKES, RANK_PHASE):
            return np.flatnonzero(w.code == w.code_of(str(s.phase))), None
    share = _share(s, w, ctx)
    rows = np.flatnonzero(share)
    return rows, share[rows]


def _median_rank_cut(g: rp.ReplayGraph) -> np.ndarray:
    """Per arrival: its work since the rank's previous sync exit beyond the median of the
    instance's participants' (each rank's work before each sync point cut to the median)."""
    out = np.zeros(g.n, np.int64)
    nodes = g.nodes
    t = nodes["time_ns"].to_numpy(np.int64)
    kind = nodes["kind"].to_numpy(np.int64)
    work_start = np.zeros(g.n, np.int64)
    for a, b in zip(g.offsets[:-1], g.offsets[1:]):
        k = kind[a:b]
        first_step = t[a:b][k == prog.STEP_START].min() if (k == prog.STEP_START).any() else t[a]
        # a work window starts at the previous sync exit, never before the rank's first step
        mark = np.where(k == prog.EXIT, t[a:b], np.iinfo(np.int64).min)
        work_start[a:b] = np.maximum(np.maximum.accumulate(mark), first_step)
    arr = g.arr_nodes
    if not arr.size:
        return out
    w = np.maximum(t[arr] - work_start[arr], 0)
    out[arr] = np.maximum(w - np.rint(_group_medians(w, g.arr_bounds)).astype(np.int64), 0)
    return out


def _group_medians(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Per row, ``np.median`` of its group (``bounds``: CSR offsets over ``values``), for all
    groups in one sort: the two middle values of each group, averaged as ``np.median`` does."""
    sizes = np.diff(bounds)
    group = np.repeat(np.arange(sizes.size), sizes)
    ordered = values[np.lexsort((values, group))]
    full = sizes > 0
    lo = bounds[:-1][full] + (sizes[full] - 1) // 2
    hi = bounds[:-1][full] + sizes[full] // 2
    med = np.zeros(sizes.size, np.float64)
    med[full] = (ordered[lo].astype(np.float64) + ordered[hi].astype(np.float64)) / 2.0
    return np.repeat(med, sizes)


_STEP_BITS = 24  # packing (rank, phase, step) into one int64 key: steps below 16 M
_CODE_BITS = 20


def _peer_step_share(w: rp.WorkArrays, hit: np.ndarray, rank: int, code: int) -> np.ndarray:
    """Per work row of phase ``code`` on ``rank`` (``hit``): the share of that rank's time in the
    phase, step by step, above the median over the other ranks with that step (a rank without the
    phase in the step counts 0): the rank's excess in the phase, removed where it happened."""
    lane_rows = (w.lane != prog.WAIT_ON_GPU) & (w.step >= 0)
    out = np.zeros(w.size, np.float64)
    if not (hit & lane_rows).any():
        return out
    steps_u, s_pos = np.unique(w.step[lane_rows], return_inverse=True)
    ranks_u, r_pos = np.unique(w.rank[lane_rows], return_inverse=True)
    present = np.zeros((steps_u.size, ranks_u.size), bool)
    present[s_pos, r_pos] = True  # the rank recorded something in that step
    t = np.zeros((steps_u.size, ranks_u.size), np.float64)
    of_phase = w.code[lane_rows] == code
    np.add.at(t, (s_pos[of_phase], r_pos[of_phase]), w.ns[lane_rows][of_phase].astype(np.float64))
    me = int(np.searchsorted(ranks_u, rank))
    others = np.where(present, t, np.nan)
    others[:, me] = np.nan
    if ranks_u.size > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a step no other rank has: NaN -> 0
            peer = np.nan_to_num(np.nanmedian(others, axis=1), nan=0.0)
    else:
        peer = np.zeros(steps_u.size)
    own = t[:, me]
    share = np.where(own > 0, np.clip((own - peer) / np.where(own > 0, own, 1.0), 0.0, 1.0), 0.0)
    rows = np.flatnonzero(hit & (w.step >= 0))
    pos = np.searchsorted(steps_u, w.step[rows])
    ok = (pos < steps_u.size) & (steps_u[np.minimum(pos, steps_u.size - 1)] == w.step[rows])
    out[rows[ok]] = share[pos[ok]]
    return out


def _median_step_share(w: rp.WorkArrays) -> np.ndarray:
    """``_median_step_share_of`` computed once per work table (it sorts every row)."""
    if w.median_share is None:
        w.median_share = _median_step_share_of(w)
    return w.median_share


def _sorted_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` by hashing (millions of rows, few distinct
    values: no sort of every row)."""
    codes, uniques = pd.factorize(values, sort=True)
    return np.asarray(uniques, dtype=values.dtype), np.asarray(codes, np.int64)


def _median_step_share_of(w: rp.WorkArrays) -> np.ndarray:
    """Per work row: the share of its time above its phase's median per step on its rank (steps
    of the rank without the phase count 0; time outside every step is never removed). A sync's
    wait row gets the share of its sync's own time in that step."""
    out = np.zeros(w.size, np.float64)
    lane_rows = (w.lane != prog.WAIT_ON_GPU) & (w.step >= 0)
    if not lane_rows.any():
        return out
    step_ids, step_of = _sorted_codes(w.step)  # dense step numbers: they fit the key
    rank_ids, rank_of = _sorted_codes(w.rank)
    if step_ids.size >= 1 << _STEP_BITS or w.names.size >= 1 << _CODE_BITS:
        raise ValueError("impact: too many steps or phases to pack")
    # (rank, phase, step) of every row as one key; the lanes' rows are the ones medians are taken over
    all_key = (rank_of << (_CODE_BITS + _STEP_BITS)) | (w.code << _STEP_BITS) | step_of
    del rank_of, step_of  # (every array here is one int64 per work row: millions at DEP256)
    key = all_key[lane_rows]
    uniq, inv = _sorted_codes(key)
    own = np.bincount(inv, weights=w.ns[lane_rows].astype(np.float64))
    del inv
    u_rank = uniq >> (_CODE_BITS + _STEP_BITS)
    group = uniq >> _STEP_BITS  # (rank, phase)
    step_mask = np.int64((1 << _STEP_BITS) - 1)
    rank_steps = np.sort(pd.unique(((key >> (_CODE_BITS + _STEP_BITS)) << _STEP_BITS) | (key & step_mask))) >> _STEP_BITS
    del key
    ranks_u, n_of_rank = np.unique(rank_steps, return_counts=True)  # steps each rank has
    order = np.lexsort((own, group))
    g_sorted, v_sorted = group[order], own[order]
    first = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
    k = np.diff(np.r_[first, g_sorted.size])  # steps with the phase
    n = n_of_rank[np.searchsorted(ranks_u, u_rank[order][first])]
    z = np.maximum(n - k, 0)  # steps without it: zeros, sorted first

    def at(i):  # the i-th smallest of a group's values, its zeros included
        return np.where(i < z, 0.0, v_sorted[np.clip(first + i - z, 0, v_sorted.size - 1)])

    med_sorted = np.repeat((at((n - 1) // 2) + at(n // 2)) / 2.0, k)
    med = np.empty_like(med_sorted)
    med[order] = med_sorted
    share_u = np.where(own > 0, np.clip((own - med) / np.where(own > 0, own, 1.0), 0.0, 1.0), 0.0)
    # every row of a (rank, phase, step), the sync's wait rows too, gets that key's share
    pos = np.searchsorted(uniq, all_key)
    ok = (w.step >= 0) & (pos < uniq.size)
    ok[ok] &= uniq[pos[ok]] == all_key[ok]
    out[ok] = share_u[pos[ok]]
    return out


# ---- the table -----------------------------------------------------------------------------
def impact_from_programs(programs: list[prog.RankProgram], steps: pd.DataFrame, causes: pd.DataFrame | None = None,
                         cause_steps: pd.DataFrame | None = None, stragglers: pd.DataFrame | None = None,
                         straggler_ranks: list[int] | None = None, scenarios: list[Scenario] | None = None,
                         n_resamples: int = N_RESAMPLES, seed: int = 0) -> Impact:
    """Replay every scenario over the ranks' programs and rank the scenarios by impact.
    ``scenarios``: the ones to replay (default ``scenarios_for`` this capture); the GPU-only
    bound is always replayed (``impact_share`` is relative to it)."""
    if steps is None or not len(steps):
        return empty_impact("no steps: impact needs step times")
    return impact_from_graph(rp.build_graph(programs), steps, causes, cause_steps, stragglers, straggler_ranks,
                             scenarios, n_resamples, seed)


def impact_from_graph(g: rp.ReplayGraph, steps: pd.DataFrame, causes: pd.DataFrame | None = None,
                      cause_steps: pd.DataFrame | None = None, stragglers: pd.DataFrame | None = None,
                      straggler_ranks: list[int] | None = None, scenarios: list[Scenario] | None = None,
                      n_resamples: int = N_RESAMPLES, seed: int = 0, replayed: Replayed | None = None) -> Impact:
    """``impact_from_programs`` over programs already joined (``impact_replay.build_graph``): the
    caller can let the per-rank programs go before the replay's matrices are made. ``replayed``:
    scenarios already replayed over this graph without GPU-lane work and the same steps
    (``replay_scenarios``, by a worker beside the verdicts): only the others are replayed here."""
    if steps is None or not len(steps):
        return empty_impact("no steps: impact needs step times")
    if not g.n:
        return empty_impact("no points to replay")
    scen = scenarios if scenarios is not None else scenarios_for(g.work, causes, stragglers, straggler_ranks)
    if not any(s.name == GPU_ONLY for s in scen):
        scen = [Scenario(GPU_ONLY, BOUND)] + list(scen)
    imp = _evaluate(g, steps, scen, causes, cause_steps, n_resamples, seed, replayed)
    imp.graph, imp.steps_table, imp.causes, imp.cause_steps = g, steps, causes, cause_steps
    return imp


@dataclass
class Replayed:
    """Scenarios replayed over a graph (``replay_scenarios``): per step row that has replay points
    (``step_rows`` of the steps table) and scenario, the rank's replayed period."""

    scenarios: list[Scenario]
    shape: tuple[int, int, int]  # the graph's points, edges and work rows off the GPU lane (``graph_shape``)
    step_rows: np.ndarray
    base_rank: np.ndarray  # (len(step_rows),) the observed period
    replayed: np.ndarray  # (len(step_rows), len(scenarios)) int64
    removed: np.ndarray  # ns removed per scenario
    released: int  # instances released early (the same in every replay of one graph)


def replay_scenarios(g: rp.ReplayGraph, steps: pd.DataFrame, scen: list[Scenario],
                     done: Replayed | None = None) -> Replayed:
    """Every scenario replayed over ``g``: a rank's step period is from its start to the next
    step's start (the last one: to its end), so time moved between a gap and a wait is not
    counted as saved. ``done``: scenarios replayed already over this graph without its GPU-lane
    work (``_taken``): their columns are taken as they are (each scenario's replay is independent
    of the others'), the rest replayed here."""
    start_pt, end_pt, step_rows, next_pt = _step_points(g, steps)
    taken = _taken(done, g, scen, step_rows)
    replayed = np.zeros((step_rows.size, len(scen)), np.int64)
    removed = np.zeros(len(scen), np.int64)
    released = 0
    if taken:
        mine, theirs = np.array(list(taken), np.int64), np.array(list(taken.values()), np.int64)
        replayed[:, mine], removed[mine], released = done.replayed[:, theirs], done.removed[theirs], done.released
    t_pts = g.nodes["time_ns"].to_numpy(np.int64)
    base_rank = t_pts[next_pt] - t_pts[start_pt]  # the step's period on its rank (see _step_points)
    todo = [j for j in range(len(scen)) if j not in taken]
    if not step_rows.size or not todo:
        return Replayed(list(scen), graph_shape(g), step_rows, base_rank, replayed, removed, released)
    compiled = rp.compiled(g)
    block_bytes = SCENARIO_BLOCK_BYTES if compiled else NUMPY_BLOCK_BYTES
    per_block = max(1, block_bytes // max(8 * (len(g.edges) + g.n), 1))
    threads = min(REPLAY_THREADS, os.cpu_count() or 1, len(todo))
    threads = threads if threads > 1 and rp.releases_gil(g) else 1  # numba's JIT kernel runs without the GIL
    n_blocks = max(-(-len(todo) // per_block), threads)  # even blocks, at least one per thread
    per_block = -(-len(todo) // n_blocks)

    def run_block(a: int) -> int:
        cols = todo[a:a + per_block]
        cut, node_cut, rem = _cuts(g, [scen[j] for j in cols])
        delta, forced = rp.replay(g, cut, node_cut)
        replayed[:, cols] = base_rank[:, None] + delta[next_pt] - delta[start_pt]
        removed[cols] = rem
        return forced

    starts = range(0, len(todo), per_block)
    if threads > 1:  # blocks replay side by side
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            released = max(released, *pool.map(run_block, starts))
    else:
        released = max(released, *(run_block(a) for a in starts))
    return Replayed(list(scen), graph_shape(g), step_rows, base_rank, replayed, removed, released)


def graph_shape(g: rp.ReplayGraph) -> tuple[int, int, int]:
    """Points, edges and work rows off the GPU lane: a graph built from the same programs agrees,
    whether or not the straggler ranks' GPU work was joined to them (it only adds GPU-lane rows)."""
    return int(g.n), int(len(g.edges)), int(np.count_nonzero(g.work.lane != prog.GPU))


def _taken(done: Replayed | None, g: rp.ReplayGraph, scen: list[Scenario], step_rows: np.ndarray) -> dict[int, int]:
    """Which of ``scen`` (position -> column of ``done``) ``done`` replayed over this graph, of
    those whose cuts do not change with ``g``'s GPU-lane work (``_blind_to_gpu_work``); none where
    ``done`` was replayed over another graph or step table. Its graph must have had no GPU-lane
    rows (``stages.replay_task``'s)."""
    if done is None or done.shape != graph_shape(g) or not np.array_equal(done.step_rows, step_rows):
        return {}
    gpu_lane = g.work.lane == prog.GPU
    gpu_phases = {str(g.work.names[c]) for c in np.unique(g.work.code[gpu_lane])} if gpu_lane.any() else set()
    column = {s: j for j, s in enumerate(done.scenarios)}
    return {i: column[s] for i, s in enumerate(scen) if s in column and _blind_to_gpu_work(s, gpu_phases)}


def _blind_to_gpu_work(s: Scenario, gpu_phases: set[str]) -> bool:
    """Whether a scenario removes the same with or without the GPU-lane work of ``gpu_phases``
    (``_share``): the GPU-only bound takes the host lane, the straggler-free bound no work row, a
    cause its phase's rows whole. Not the spikes nor the spike-free bound: their medians count a
    rank's steps over every lane (``_median_step_share_of``)."""
    if not gpu_phases or s.name in (GPU_ONLY, MEDIAN_RANK):
        return True
    if s.kind == CAUSE:
        return str(s.phase) not in gpu_phases
    if s.kind == COMBINED:
        return all(_blind_to_gpu_work(p, gpu_phases) for p in s.parts)
    return False


def what_if(imp: Impact, scenarios: list[Scenario], n_resamples: int = N_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """Replay other scenarios over an analysis's programs (kept in ``imp.graph``): rows as in
    ``impact.csv`` (``impact_share`` against the same GPU-only bound)."""
    if imp.graph is None:
        raise ValueError("this impact keeps no replay graph (read from files?): analyze the capture again")
    got = _evaluate(imp.graph, imp.steps_table, [Scenario(GPU_ONLY, BOUND)] + list(scenarios), imp.causes,
                    imp.cause_steps, n_resamples, seed)
    return got.table[got.table["cause"].isin([s.name for s in scenarios])].reset_index(drop=True)


def _evaluate(g: rp.ReplayGraph, steps: pd.DataFrame, scen: list[Scenario], causes, cause_steps,
              n_resamples: int, seed: int, done: Replayed | None = None) -> Impact:
    rep = replay_scenarios(g, steps, scen, done)
    if not rep.step_rows.size:
        return empty_impact("no step of the step table has replay points")
    st = steps.iloc[rep.step_rows]
    base_rank = rep.base_rank
    step_ids = st["step"].to_numpy(np.int64)
    uniq_steps, step_pos = np.unique(step_ids, return_inverse=True)
    replayed, removed, released = rep.replayed, rep.removed, rep.released
    # per step: the mean over ranks
    counts = np.bincount(step_pos).astype(np.float64)
    base_step = np.bincount(step_pos, weights=base_rank.astype(np.float64)) / counts
    rep_step = np.stack([np.bincount(step_pos, weights=replayed[:, j].astype(np.float64)) / counts
                         for j in range(len(scen))], axis=1)
    base_mean = float(base_step.mean())
    gpu_j = [i for i, s in enumerate(scen) if s.name == GPU_ONLY][0]
    gap = base_mean - float(rep_step[:, gpu_j].mean())
    charged = _charged(scen, causes, cause_steps)
    all_ranks = sorted(int(r) for r in g.ranks)
    rows = []
    draws: dict = {}
    for j, s in enumerate(scen):
        d = base_step - rep_step[:, j]
        imp = float(d.mean())
        lo, hi = _interval(d, n_resamples, seed, draws)
        p90 = float(np.quantile(base_step, 0.9) - np.quantile(rep_step[:, j], 0.9))
        ranks = _ranks_of(s, g.work, all_ranks)
        rows.append({
            "cause": s.name, "ranks": len(ranks), "impact_ns_per_step": int(round(imp)),
            "impact_p90_ns": int(round(p90)), "impact_share": imp / gap if gap > 0 else math.nan,
            "charged_ns": charged[j], "kind": s.kind, "ranks_list": " ".join(str(r) for r in ranks),
            "impact_lo_ns": _round(lo), "impact_hi_ns": _round(hi),
            "step_share": imp / base_mean if base_mean > 0 else math.nan, "removed_ns": int(removed[j]),
            "base_step_ns": int(round(base_mean)), "replayed_step_ns": int(round(float(rep_step[:, j].mean()))),
            "n_steps": int(uniq_steps.size),
        })
    table = pd.DataFrame(rows)
    table["_b"] = (table["kind"] == BOUND).astype(int)
    table = table.sort_values(["_b", "impact_ns_per_step", "cause"], ascending=[True, False, True], kind="stable")
    table = table.drop(columns="_b").reset_index(drop=True)[IMPACT_COLUMNS + IMPACT_EXTRA_COLUMNS]
    for c in ("impact_lo_ns", "impact_hi_ns", "charged_ns"):
        table[c] = table[c].astype("Int64")
    samples = pd.DataFrame({
        "cause": np.repeat(np.array([s.name for s in scen], dtype=object), uniq_steps.size),
        "step": np.tile(uniq_steps, len(scen)),
        "step_ns": np.tile(np.rint(base_step).astype(np.int64), len(scen)),
        "replayed_ns": np.rint(rep_step.T.reshape(-1)).astype(np.int64),
    })
    notes = list(g.notes)
    if released:
        notes.append(f"{released} sync instance(s) released before all arrivals (clocks disagreed about their order)")
    return Impact(table=table, steps=samples, base_mean_ns=base_mean, gap_ns=gap,
                  model_residual_ns=int(g.residual_ns), n_points=g.n, released_early=released, notes=notes)


def _round(x: float):
    return int(round(x)) if math.isfinite(x) else pd.NA


def _interval(d: np.ndarray, n_resamples: int, seed: int, draws: dict | None = None) -> tuple[float, float]:
    """95% bootstrap interval of the mean of per-step drops (steps resampled). ``draws``: the
    resampled rows by (seed, steps, resamples), shared by the scenarios of one evaluation (each
    would draw the same ones from a generator of the same seed)."""
    from profkit.analyze.compare import _percentiles, bootstrap, resample_rows

    if d.size < 2:
        return math.nan, math.nan
    rng = np.random.default_rng([seed, 17])
    key = (seed, d.size, n_resamples)
    idx = None
    if draws is not None:
        idx = draws.get(key)
        if idx is None:
            idx = draws[key] = resample_rows(rng, d.size, n_resamples)
    reps = bootstrap(d.reshape(-1, 1).astype(np.float64), "mean", n_resamples, rng, idx=idx)
    return _percentiles(reps, CONFIDENCE)


def _step_points(g: rp.ReplayGraph, steps: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """Global ids of each step's start and end points, the rows of ``steps`` that have both, and
    the point that closes each step's share of its rank's timeline (the next step's start)."""
    nodes = g.nodes
    kind = nodes["kind"].to_numpy(np.int64)
    key_r, key_s = nodes["rank"].to_numpy(np.int64), nodes["step"].to_numpy(np.int64)
    gid = nodes["gid"].to_numpy(np.int64)
    is_s, is_e = kind == prog.STEP_START, kind == prog.STEP_END
    starts = pd.Series(gid[is_s], index=pd.MultiIndex.from_arrays([key_r[is_s], key_s[is_s]]))
    ends = pd.Series(gid[is_e], index=pd.MultiIndex.from_arrays([key_r[is_e], key_s[is_e]]))
    starts = starts[~starts.index.duplicated()]
    ends = ends[~ends.index.duplicated()]
    idx = pd.MultiIndex.from_arrays([steps["rank"].to_numpy(np.int64), steps["step"].to_numpy(np.int64)])
    s = starts.reindex(idx).to_numpy(np.float64)
    e = ends.reindex(idx).to_numpy(np.float64)
    ok = ~np.isnan(s) & ~np.isnan(e)
    rows = np.flatnonzero(ok)
    s, e = s[ok].astype(np.int64), e[ok].astype(np.int64)
    # the next step's start on the same rank (by start time); the last step of a rank: its own end
    r = steps["rank"].to_numpy(np.int64)[rows]
    t0 = steps["start_ns"].to_numpy(np.int64)[rows]
    order = np.lexsort((t0, r))
    nxt = e.copy()
    same = r[order][1:] == r[order][:-1]
    nxt[order[:-1][same]] = s[order[1:][same]]
    return s, e, rows, nxt


def _ranks_of(s: Scenario, w: rp.WorkArrays, all_ranks: list[int]) -> list[int]:
    if s.kind == RANK_PHASE:
        return [int(s.rank)]
    if s.kind in (BOUND, COMBINED):
        return all_ranks
    ranks = w.rank[w.code == w.code_of(str(s.phase))]
    if ranks.size and ranks.min() >= 0:  # ranks are small counts: which are present, without a sort
        return np.flatnonzero(np.bincount(ranks)).tolist()
    return sorted(int(r) for r in np.unique(ranks))


def _charged(scen: list[Scenario], causes: pd.DataFrame | None, cause_steps: pd.DataFrame | None) -> list:
    """``charged_ns`` per scenario (see the module docstring)."""
    total = {}
    if causes is not None and len(causes):
        total = dict(zip(causes["cause"].astype(str), causes["total_ns"].astype("int64")))
    waits = sum(v for k, v in total.items() if prog.is_wait(k))
    others = sum(v for k, v in total.items() if not prog.is_wait(k))
    per_rank = None
    if cause_steps is not None and len(cause_steps):
        per_rank = cause_steps.groupby(["rank", "cause"])["ns"].sum()
    out = []
    for s in scen:
        if s.name == GPU_ONLY:
            out.append(int(others))
        elif s.name == MEDIAN_RANK:
            out.append(int(waits))
        elif s.kind == RANK_PHASE:
            out.append(int(per_rank.get((s.rank, s.phase), 0)) if per_rank is not None else pd.NA)
        elif s.kind == CAUSE:
            out.append(int(total.get(s.phase, 0)))
        else:
            out.append(pd.NA)
    return out


# ---- words ---------------------------------------------------------------------------------
def lead_row(table: pd.DataFrame) -> dict | None:
    """The non-bound row with the largest impact (positive), for the verdict."""
    if table is None or not len(table):
        return None
    rows = table[(table["kind"] != BOUND) & (table["impact_ns_per_step"] > 0)]
    if not len(rows):
        return None
    return rows.sort_values("impact_ns_per_step", ascending=False, kind="stable").iloc[0].to_dict()


def bound_row(table: pd.DataFrame, name: str) -> dict | None:
    if table is None or not len(table):
        return None
    rows = table[table["cause"] == name]
    return rows.iloc[0].to_dict() if len(rows) else None


def who(row: dict) -> str:
    """``gc (rank 0)``, ``Scheduler.schedule (all 8 ranks)``, ``update_from_output on rank 7``."""
    if row.get("kind") != CAUSE:
        return str(row["cause"])
    ranks = str(row.get("ranks_list") or "").split()
    if len(ranks) == 1:
        return f"{row['cause']} (rank {ranks[0]})"
    if ranks and len(ranks) <= 3:
        return f"{row['cause']} (ranks {', '.join(ranks)})"
    return f"{row['cause']} ({len(ranks)} ranks)" if ranks else str(row["cause"])


def verdict_line(imp: Impact | None) -> str:
    """``impact: removing gc (rank 0) would cut the mean step by 38.2 ms [36.1, 40.0] (95% of the
    40.2 ms gap to GPU-only); straggler-free bound -3.1 ms; GPU-only bound -40.2 ms``."""
    if imp is None or not len(imp.table):
        why = f" ({imp.notes[0]})" if imp is not None and imp.notes else ""
        return "impact: not computed" + why
    top = lead_row(imp.table)
    parts = []
    if top is not None:
        ci = ""
        if pd.notna(top.get("impact_lo_ns")) and pd.notna(top.get("impact_hi_ns")):
            ci = f" [95% interval {_ms(top['impact_lo_ns'])}, {_ms(top['impact_hi_ns'])}]"
        share = top.get("impact_share")
        gap = f" ({100 * share:.0f}% of the {_ms(imp.gap_ns)} ms gap to GPU-only)" if share is not None and \
            pd.notna(share) and imp.gap_ns > 0 else ""
        parts.append(f"removing {who(top)} would cut the mean step by {_ms(top['impact_ns_per_step'])} ms{ci}{gap}")
    else:
        parts.append("no single cause moves the mean step")
    for name, label in ((MEDIAN_RANK, "straggler-free bound"), (MEDIAN_STEP, "spike-free bound"),
                        (GPU_ONLY, "GPU-only bound")):
        b = bound_row(imp.table, name)
        if b is not None and b.get("removed_ns", 1) != 0:  # a bound with nothing to remove says nothing
            parts.append(f"{label} -{_ms(b['impact_ns_per_step'])} ms")
    return "impact: " + "; ".join(parts)


def verdict_lines(imp: Impact | None, more: int = 3) -> list[str]:
    """``verdict_line`` and, when there are, the next causes by impact:
    ``  next: gc (rank 3) -1.92 ms, prepare_inputs (8 ranks) -0.44 ms``."""
    lines = [verdict_line(imp)]
    if imp is None or not len(imp.table):
        return lines
    top = lead_row(imp.table)
    rows = imp.table[(imp.table["kind"] != BOUND) & (imp.table["impact_ns_per_step"] > 0)]
    rows = rows.sort_values("impact_ns_per_step", ascending=False, kind="stable")
    nxt = [r for r in rows.to_dict("records") if top is None or r["cause"] != top["cause"]][:more]
    if nxt:
        lines.append("  next: " + ", ".join(f"{who(r)} -{_ms(r['impact_ns_per_step'])} ms" for r in nxt))
    return lines


def _ms(ns) -> str:
    """ms with one decimal from 10 ms up, two below."""
    if ns is None or pd.isna(ns):
        return "-"
    return f"{float(ns) / 1e6:.1f}" if abs(float(ns)) >= 1e7 else f"{float(ns) / 1e6:.2f}"
