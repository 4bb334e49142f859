"""Straggler analysis: who arrives late at the sync points, how much the others wait, and why.

``straggler_table(events, steps)`` -> ``(per_rank, per_instance, lateness)``:

- ``per_rank`` (``OUT/stragglers.csv``): ``STRAGGLER_COLUMNS`` then ``STRAGGLER_EXTRA_COLUMNS``;
- ``per_instance``: one row per measured collective instance (``INSTANCE_COLUMNS``);
- ``lateness`` (``OUT/lateness.csv``, the rank x step heatmap): ``LATENESS_COLUMNS``.

Inputs must be on ONE timeline: events, steps and instances moved by ``profkit.align``
(``apply_alignment``); arrival skew between ranks is meaningless on raw clocks.

Definitions (int64 ns):

- arrival: a rank's start of its part of a collective instance (GPU kernel start, or the start
  of a blocking CPU collective span); instances are ``collectives.collective_instances`` rows,
  only complete ones inside the common window of their participants are measured (capture
  edges: a rank whose trace starts later or ends earlier makes the others "wait" for work
  outside the window; see ``straggler_arrivals``).
- ``late_ns`` of a rank at an instance: its arrival minus the median of the OTHER participants'
  arrivals (two ranks: minus the other one's). ``late_ns_p50/p99``: over the rank's instances.
- ``times_last``: instances where it arrived last; ``caused_wait_ns``: sum over those of every
  other participant's wait (last arrival - its arrival), as issue 6 asks. It credits only the
  very last rank: a second straggler late at the same moment gets nothing, so the verdict uses
  ``excess_ns`` instead.
- ``excess_ns``: sum over the rank's instances of its own-work excess (its work since its
  previous sync point minus the median of its peers'); lateness inherited from a late release
  at the previous sync point is a victim's and is not counted.
- ``score``: relative performance, 1.0 = the best rank: the best rank's own work (summed step
  time minus the time it waited at sync points) over this rank's. 0.8 = it needs 25% longer
  for the same steps. Equal step times do not hide a straggler: its peers' time is waiting.
- ``waited_for_rank`` / ``waited_for_ns``: the rank it waited for longest at sync points (the
  last arriver of the instances it waited at) and that wait. A victim (not a straggler, its
  largest excess under ``MIN_EXCESS_SHARE`` of the best rank's own work and under that wait) reads
  ``top_cause`` = ``waiting for rank k`` with that wait, as in ``causes.csv`` (its excess phase
  becomes ``second_cause``); so does a rank-step of ``lateness.csv`` that was last nowhere and
  waited longer than any own excess.
- ``top_cause``: the phase on the rank's own timeline (``straggler_phases``) with the largest
  excess over the same phase on its peers, summed over windows that tile the timeline once:
  on the host, from where the hosts last synchronized (a CPU collective such as the DP
  all-reduce, which may lie in the previous step; without one, the step start) to the next host
  sync; on the GPU (``gpu:<kernel>``), from one GPU collective's exit to the next arrival. Waits
  are never a cause. ``top_cause_ns`` is that excess: the time the cause cost this rank.
  Per instance, the last arriver's ``top_cause`` is the same comparison over its window
  before that arrival: the host's since the last host sync, or, where its GPU set the arrival
  (``gpu_gated``: the kernel waited in the stream queue), the GPU's since the last collective.
  ``host_excess_ns`` / ``gpu_excess_ns``: the excess summed over all host phases / all GPU
  phases (``gpu:<kernel>``, seen while the host waited on its GPU): extra host work (e.g. a
  uniformly slower host) and extra GPU work (e.g. hot experts) of the rank, each instant once.

Verdict (``straggler`` column, ``straggler_ranks``): a rank is a straggler when its excess is
significant on two counts:

- size: at least ``MIN_EXCESS_SHARE`` of the best rank's own work (``excess_share``; the step
  time without waiting, so that one big straggler does not dilute another one's share by
  stretching everyone's steps): worth reporting;
- evidence: at least ``MIN_EXCESS_Z`` robust standard errors above zero (``excess_z`` = mean
  per-step excess / (noise / sqrt(steps)); the noise is the robust spread of the OTHER ranks'
  per-step excess, or with fewer than four ranks the lower part of the rank's own, which late
  steps do not inflate): clearly above its peers, not step-to-step noise.

Evidence may also be dominance, for sparse stragglers whose few late steps the per-step noise
estimate discounts (a rank late in one step of four): it made the others wait at least
``DOMINANT_WAIT_RATIO`` times as long as any other rank did, and that wait
(``caused_wait_share``) is itself at least ``MIN_EXCESS_SHARE`` of the best rank's own work.
The size condition on its own excess still holds, so a victim is never a straggler.

Both are measured against the median peer, so when every rank is equally slow no one is a
straggler (the cause is shared; ``causes.csv`` shows it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from profkit import distinct
from profkit.analyze import straggler_arrivals as arr_mod
from profkit.analyze import straggler_phases as ph_mod
from profkit.keys import first_match, sorted_groups

STRAGGLER_COLUMNS = ["rank", "times_last", "late_ns_p50", "late_ns_p99", "caused_wait_ns", "score", "top_cause"]
STRAGGLER_EXTRA_COLUMNS = [
    "straggler", "n_instances", "excess_ns", "excess_share", "excess_z", "top_cause_ns", "top_cause_category",
    "second_cause", "second_cause_ns", "host_excess_ns", "gpu_excess_ns", "late_ns_total", "wait_ns", "own_work_ns",
    "step_total_ns", "caused_wait_share", "waited_for_rank", "waited_for_ns",
]
INSTANCE_COLUMNS = [
    "instance", "step", "group", "seq", "coll_name", "source_kind", "key", "n_ranks",
    "first_rank", "first_start_ns", "last_rank", "last_start_ns", "arrival_skew_ns", "last_late_ns",
    "caused_wait_ns", "end_spread_ns", "top_cause", "top_cause_ns",
]
LATENESS_COLUMNS = [
    "rank", "step", "late_ns", "late_max_ns", "excess_ns", "times_last", "caused_wait_ns", "wait_ns",
    "n_instances", "top_cause", "top_cause_ns",
]

MIN_EXCESS_SHARE = 0.05  # a straggler's own-work excess is at least 5% of the best rank's own work ...
MIN_EXCESS_Z = 4.0  # ... and this many robust standard errors above zero,
DOMINANT_WAIT_RATIO = 2.0  # ... or it caused at least twice the wait of any other rank (and >= 5% of work)
MIN_SCALE_NS = 10_000  # floor of the per-step noise scale (10 us): below, timing noise
MIN_PEERS_FOR_NOISE = 4  # ranks needed to measure per-step noise on the peers (else on the rank itself)
TAIL_WINDOW = -1  # id of the accounting window after the last host sync
WAIT_CATEGORY = "wait"


def straggler_table(
    events: pd.DataFrame,
    steps: pd.DataFrame | None,
    instances: pd.DataFrame | None = None,
    matched: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Per rank, per instance and per (rank, step) straggler tables (see the module docstring).

    ``instances``: ``collective_instances`` rows on the aligned clocks (e.g.
    ``apply_alignment(alignment.instances, alignment)``; incomplete rows welcome: they still
    mark sync points); computed from ``events`` when None. ``matched``: ``match_instances`` of
    them, for the group / sequence / end-spread columns (computed when None).
    ``per_rank.attrs["report"]`` counts measured and dropped instances.

    In three steps, so that the scale path can run the middle one per rank where the events
    are: ``plan_stragglers`` (cross-rank, small tables), ``rank_window_phases`` (per rank),
    ``finish_stragglers`` (cross-rank, small tables).
    """
    if instances is None:
        from profkit.analyze.collectives import collective_instances

        instances = collective_instances(events, complete_only=False)
    plan = plan_stragglers(instances, arr_mod.trace_windows(events), steps, matched)
    phases = (rank_window_phases(plan.windows(), *ph_mod.timeline_pieces(events, plan.extents, None, steps))
              if plan.measured else None)
    return finish_stragglers(plan, phases)


@dataclass
class StragglerPlan:
    """The cross-rank half before the per-rank phase sums: arrivals and the windows to sum over."""

    ranks: list[int]
    arrivals: pd.DataFrame
    report: dict
    extents: pd.DataFrame
    steps: pd.DataFrame | None
    instances: pd.DataFrame | None  # None once matched (``matched``): the pipeline lets it go
    matched: pd.DataFrame | None
    host_w: pd.DataFrame | None = None  # per (rank, instance): last host sync -> arrival
    gpu_w: pd.DataFrame | None = None  # per (rank, GPU instance): previous collective exit -> arrival
    acc_w: pd.DataFrame | None = None  # windows that tile each host timeline once
    acc_step: dict = field(default_factory=dict)
    # filled by ``finish_stragglers``: each rank's own work per step and phase (``PHASE_STEP_COLUMNS``)
    phase_steps: pd.DataFrame | None = None

    @property
    def measured(self) -> bool:
        return bool(len(self.arrivals))

    def windows(self, rank: int | None = None) -> dict[str, pd.DataFrame]:
        """The three window tables, or one rank's rows of them (what its worker needs)."""
        tables = {"host": self.host_w, "gpu": self.gpu_w, "acc": self.acc_w}
        if rank is None:
            return tables
        return {name: w[w["rank"].to_numpy(np.int64) == rank] for name, w in tables.items()}


_KINDS = ("host", "gpu", "acc")


@dataclass
class WindowPhases:
    """Time per phase inside each window (``straggler_phases.window_phases``) of the three kinds.

    Coded (``coded``, one rank's): ``phase`` and ``category`` are int64 codes into that table's
    own names (``vocab``), so a rank's tables cross to the driver without a string per row
    (millions of rows at DEP32 x 1000). Joined (``concat`` of coded parts): codes into
    ``names`` / ``categories``, exactly ``straggler_phases.phase_codes`` of the joined tables."""

    host: pd.DataFrame
    gpu: pd.DataFrame
    acc: pd.DataFrame
    vocab: dict[str, tuple[np.ndarray, np.ndarray]] | None = None  # kind -> (phase names, category names)
    names: np.ndarray | None = None  # joined: the phase names of every table (``phase_codes``')
    categories: np.ndarray | None = None

    def coded(self) -> "WindowPhases":
        """The tables with their names factorized, each against its own names."""
        got = {kind: _coded_table(getattr(self, kind)) for kind in _KINDS}
        return WindowPhases(got["host"][0], got["gpu"][0], got["acc"][0], {k: v[1] for k, v in got.items()})

    def codes(self) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
        """``straggler_phases.phase_codes`` of the three tables (read off when joined)."""
        tables = [getattr(self, k) for k in _KINDS]
        if self.names is not None:
            return ([(t["phase"].to_numpy(np.int64), t["category"].to_numpy(np.int64)) for t in tables],
                    self.names, self.categories)
        if self.vocab is None:
            return ph_mod.phase_codes(tables)
        return ph_mod.joined_codes([(t["phase"].to_numpy(np.int64),) + self.vocab[k]
                                    + (t["category"].to_numpy(np.int64),) for k, t in zip(_KINDS, tables)])

    @staticmethod
    def concat(parts: list["WindowPhases"]) -> "WindowPhases":
        """The ranks' tables one after the other (coded parts: joined, see the class)."""
        if parts and all(p.vocab is not None for p in parts):
            return _concat_coded(parts)

        def cat(name: str) -> pd.DataFrame:
            frames = [getattr(p, name) for p in parts if len(getattr(p, name))]
            return pd.concat(frames, ignore_index=True) if frames else ph_mod._empty(ph_mod.PHASE_COLUMNS)
        return WindowPhases(cat("host"), cat("gpu"), cat("acc"))

    @staticmethod
    def join(parts: list["WindowPhases"]) -> "WindowPhases | JoinedPhases":
        """The ranks' parts for ``finish_stragglers``: coded ones joined without copying their
        tables (``JoinedPhases``), others concatenated (``concat``)."""
        if parts and all(p.vocab is not None for p in parts):
            return JoinedPhases.of(parts)
        return WindowPhases.concat(parts)


def _coded_table(t: pd.DataFrame) -> tuple[pd.DataFrame, tuple[np.ndarray, np.ndarray]]:
    """A ``window_phases`` table with ``phase`` and ``category`` factorized, and their names."""
    p, pu = distinct.factorize(t["phase"])  # known where ``window_phases`` made them
    c, cu = distinct.factorize(t["category"])
    table = pd.DataFrame({"window": t["window"].to_numpy(np.int64), "rank": t["rank"].to_numpy(np.int64),
                          "phase": np.asarray(p, np.int64), "category": np.asarray(c, np.int64),
                          "ns": t["ns"].to_numpy(np.int64)}, copy=False)
    return table, (np.asarray(pu, dtype=object), np.asarray(cu, dtype=object))


@dataclass
class JoinedPhases:
    """Coded parts (``WindowPhases.coded``, one per rank) joined as ``WindowPhases.concat`` joins
    them, each kind's tables left as the parts they came in: per kind the list of part tables and
    of their codes against the joined names. What ``finish_stragglers`` reads of a ``WindowPhases``
    (``codes``, the three kinds' tables; ``straggler_phases.coded_phase_excess`` takes parts),
    without the joined tables made first: at DEP32 x 1,000 they are ~280 MB of fresh memory the
    driver wrote and faulted in (~0.6 s) only to take rows from them once."""

    host: list[pd.DataFrame]
    gpu: list[pd.DataFrame]
    acc: list[pd.DataFrame]
    part_codes: dict[str, list[tuple[np.ndarray, np.ndarray]]]
    names: np.ndarray
    categories: np.ndarray

    @staticmethod
    def of(parts: list[WindowPhases]) -> "JoinedPhases":
        """The coded ``parts`` joined (``WindowPhases.concat``'s names and codes)."""
        pieces, codes, names, cats = _joined_parts(parts)
        tables = {kind: [getattr(p, k) for k, p in pieces if k == kind] for kind in _KINDS}
        by_kind = {kind: [c for (k, _), c in zip(pieces, codes) if k == kind] for kind in _KINDS}
        return JoinedPhases(tables["host"], tables["gpu"], tables["acc"], by_kind, names, cats)

    def codes(self) -> tuple[list[tuple[list[np.ndarray], list[np.ndarray]]], np.ndarray, np.ndarray]:
        """``WindowPhases.codes`` with each kind's codes as the list of its parts' codes, handed
        over: the caller releases each kind's as it uses them (millions of rows at DEP32 x 1,000)."""
        codes = [([p for p, _ in self.part_codes[k]], [c for _, c in self.part_codes[k]]) for k in _KINDS]
        self.part_codes = {}
        return codes, self.names, self.categories


def _joined_parts(parts: list[WindowPhases]):
    """(kind, part) of every non-empty table, in kind then part order; their codes against the
    names of all of them (``straggler_phases.joined_codes``); the names and categories."""
    pieces = [(kind, p) for kind in _KINDS for p in parts if len(getattr(p, kind))]
    codes, names, cats = ph_mod.joined_codes([(getattr(p, kind)["phase"].to_numpy(np.int64),) + p.vocab[kind]
                                              + (getattr(p, kind)["category"].to_numpy(np.int64),)
                                              for kind, p in pieces])
    return pieces, codes, names, cats


def _concat_coded(parts: list[WindowPhases]) -> WindowPhases:
    """Coded parts joined: each kind's table in part order, codes against the names of every part
    and kind. Categories are named in order of first appearance over host, GPU, then accounting
    tables, each in part order: the order ``phase_codes`` finds them in the joined tables."""
    pieces, codes, names, cats = _joined_parts(parts)
    tables = {}
    for kind in _KINDS:
        mine = [(getattr(p, k), c) for (k, p), c in zip(pieces, codes) if k == kind]
        if not mine:
            tables[kind] = pd.DataFrame({c: np.zeros(0, np.int64) for c in ph_mod.PHASE_COLUMNS})
            continue
        tables[kind] = pd.DataFrame({
            "window": np.concatenate([f["window"].to_numpy(np.int64) for f, _ in mine]),
            "rank": np.concatenate([f["rank"].to_numpy(np.int64) for f, _ in mine]),
            "phase": np.concatenate([c[0] for _, c in mine]),
            "category": np.concatenate([c[1] for _, c in mine]),
            "ns": np.concatenate([f["ns"].to_numpy(np.int64) for f, _ in mine])}, copy=False)
    return WindowPhases(tables["host"], tables["gpu"], tables["acc"], names=names, categories=cats)


def plan_stragglers(instances: pd.DataFrame, extents: pd.DataFrame, steps: pd.DataFrame | None,
                    matched: pd.DataFrame | None = None, sync_ends: dict | None = None,
                    host_ends: dict | None = None) -> StragglerPlan:
    """Arrivals at the measured instances and every window whose phases must be summed
    (``sync_ends``, ``host_ends``: ``straggler_arrivals.sync_ends(instances)`` and
    ``host_sync_ends(instances)``, where already found)."""
    arrivals, report = arr_mod.arrival_rows(instances, extents, steps, sync_ends, host_ends)
    report["unmatched_rows"] = int(instances.attrs.get("report", {}).get("unmatched_rows", 0))
    ranks = sorted(set(extents["rank"].tolist()) | set(arrivals["rank"].tolist()))
    plan = StragglerPlan(ranks=ranks, arrivals=arrivals, report=report, extents=extents, steps=steps,
                         instances=instances, matched=matched)
    if not plan.measured:
        return plan
    plan.host_w = _host_windows(arrivals)
    kernel = (arrivals["source_kind"] == "kernel").to_numpy(bool)
    plan.gpu_w = _gpu_windows(arrivals.loc[kernel, ["instance", "rank", "work_start_ns", "start_ns"]])
    plan.acc_w, plan.acc_step = _accounting_windows(arrivals, steps, plan.host_w, extents)
    return plan


def rank_window_phases(windows: dict[str, pd.DataFrame], host_pieces: pd.DataFrame,
                       gpu_pieces: pd.DataFrame) -> WindowPhases:
    """Phase sums in the plan's windows (``StragglerPlan.windows``); given one rank's pieces and
    windows, that rank's sums (concatenated over ranks in rank order: the same table)."""
    got = {}
    for kind, pieces in (("host", host_pieces), ("gpu", gpu_pieces), ("acc", host_pieces)):
        coded = ph_mod.window_phases_coded(pieces, windows[kind])  # one rank's: codes without strings
        got[kind] = coded if coded is not None else _coded_table(ph_mod.window_phases(pieces, windows[kind]))
    return WindowPhases(got["host"][0], got["gpu"][0], got["acc"][0], {k: v[1] for k, v in got.items()})


def finish_stragglers(plan: StragglerPlan, phases: "WindowPhases | JoinedPhases | None",
                      released: Callable[[], None] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The three tables from the plan and the phase sums of every rank (``phases`` is consumed:
    its tables are released as soon as they are used; joined or left as the ranks' parts).
    ``released``: called each time a kind's tables were let go (the driver gives the memory back:
    the ranks' parts are scattered over its heap, where freeing alone would keep them)."""
    released = released or (lambda: None)
    arrivals, report, steps, extents = plan.arrivals, plan.report, plan.steps, plan.extents
    if not plan.measured or phases is None:
        per_rank = _per_rank(plan.ranks, arrivals, steps, extents, _empty_excess(), {})
        per_rank.attrs["report"] = report
        return per_rank, _empty(INSTANCE_COLUMNS), _empty(LATENESS_COLUMNS)
    explain = (arrivals["is_last"] | (arrivals["late_ns"] > 0)).to_numpy(bool)
    gated = arrivals["gpu_gated"].to_numpy(bool)
    # why each late arrival: its host's work since the hosts last synchronized, or for an arrival
    # its GPU set, its GPU's work since the previous collective; against the same on the peers
    host_w, gpu_w = plan.host_w, plan.gpu_w
    # phase names as integer codes shared by the three tables: the rows below are grouped by phase
    (host_c, gpu_c, acc_c), names, cats = phases.codes()
    host_x = ph_mod.coded_phase_excess(phases.host, *host_c, names, cats, host_w, explain & ~gated).causes_only()
    phases.host = host_c = None  # consumed: at DEP32 x 1000 steps each table is millions of rows
    released()
    # what each rank spent beyond its peers, each instant counted once: its host timeline cut at
    # host syncs (GPU names seen there dropped) and its GPU timeline cut at GPU collectives
    acc_step = dict(plan.acc_step)
    acc_x = ph_mod.coded_phase_excess(phases.acc, *acc_c, names, cats, plan.acc_w).causes_only()
    phases.acc = acc_c = None
    released()
    host_only = acc_x.rows["category"].to_numpy(np.int64) != _category_code(acc_x, ph_mod.GPU_CATEGORY)
    n_host = int(host_only.sum())
    # every GPU window's excess, written after the accounting rows' host ones: the two make the
    # accounting table without a join of millions of rows; the GPU rows alone are a slice of it
    acc_x = ph_mod.coded_phase_excess(phases.gpu, *gpu_c, names, cats, gpu_w, before=(acc_x, host_only))
    phases.gpu = gpu_c = None
    released()
    gpu_x = ph_mod.CodedExcess(acc_x.rows.iloc[n_host:], acc_x.phases, acc_x.categories)
    wanted = arrivals.loc[explain & gated, ["instance", "rank"]]
    if len(wanted):
        gx = gpu_x.rows
        span = int(max(arrivals["rank"].max(), gx["rank"].max() if len(gx) else 0)) + 1
        key = gx["window"].to_numpy(np.int64) * span + gx["rank"].to_numpy(np.int64)
        pick = np.isin(key, wanted["instance"].to_numpy(np.int64) * span + wanted["rank"].to_numpy(np.int64))
        why = ph_mod.concat_excess([host_x, gpu_x.take(pick).causes_only()])
    else:
        why = ph_mod.concat_excess([host_x])
    del host_x, gpu_x
    inst_steps = _instance_steps(arrivals)  # the accounting's and the instance table's
    acc_step.update(inst_steps.to_dict())
    per_rank = _per_rank(plan.ranks, arrivals, steps, extents, acc_x, report)
    matched = plan.matched if plan.matched is not None else _match(plan.instances)
    per_inst = _per_instance(arrivals, why, matched, inst_steps)
    acc_x.rows = acc_x.rows.assign(step=_map_ids(acc_x.rows["window"], acc_step))
    per_step = _step_phase_table(acc_x)
    lateness = _lateness(arrivals, acc_x, per_step)
    plan.phase_steps = _phase_steps(acc_x, per_step)
    per_rank.attrs["report"] = report
    return per_rank, per_inst, lateness


def straggler_ranks(per_rank: pd.DataFrame) -> list[int]:
    """The straggler verdict: ranks flagged in ``per_rank``, largest excess first."""
    if per_rank is None or not len(per_rank) or "straggler" not in per_rank:
        return []
    s = per_rank[per_rank["straggler"].astype(bool)].sort_values("excess_ns", ascending=False, kind="stable")
    return [int(r) for r in s["rank"]]


# ---- windows -------------------------------------------------------------------------------
def _host_windows(arrivals: pd.DataFrame) -> pd.DataFrame:
    """One window per (rank, instance): from the rank's last host sync to its arrival."""
    return pd.DataFrame({"window": arrivals["instance"].to_numpy(np.int64), "rank": arrivals["rank"].to_numpy(np.int64),
                         "start_ns": arrivals["host_start_ns"].to_numpy(np.int64),
                         "end_ns": arrivals["start_ns"].to_numpy(np.int64)})


def _gpu_windows(kernel_rows: pd.DataFrame) -> pd.DataFrame:
    """One window per (rank, GPU collective instance): from the exit of the rank's previous
    collective to its arrival (the GPU timeline between two collectives)."""
    return pd.DataFrame({"window": kernel_rows["instance"].to_numpy(np.int64),
                         "rank": kernel_rows["rank"].to_numpy(np.int64),
                         "start_ns": kernel_rows["work_start_ns"].to_numpy(np.int64),
                         "end_ns": kernel_rows["start_ns"].to_numpy(np.int64)})


def _accounting_windows(arrivals: pd.DataFrame, steps: pd.DataFrame | None, inst_windows: pd.DataFrame,
                        extents: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, int]]:
    """Windows that tile each rank's host timeline once: the host windows ending at CPU
    collectives plus the tail after the last one; else the steps (window id = step); else the
    instance windows. Returns the windows and each window's step."""
    cpu = (arrivals["source_kind"] == "cpu_span").to_numpy(bool)
    if cpu.any():
        w = inst_windows[cpu]
        steps_of = {int(k): int(v) for k, v in _instance_steps(arrivals[cpu]).items()}
        tail = _tail_windows(arrivals[cpu], steps, extents)
        if len(tail):
            steps_of[TAIL_WINDOW] = int(arrivals["step"].max())
            w = pd.concat([w, tail], ignore_index=True)
        return w, steps_of
    if steps is not None and len(steps):
        st = steps[steps.groupby("step")["rank"].transform("nunique") >= 2]
        w = pd.DataFrame({"window": st["step"].to_numpy(np.int64), "rank": st["rank"].to_numpy(np.int64),
                          "start_ns": st["start_ns"].to_numpy(np.int64), "end_ns": st["end_ns"].to_numpy(np.int64)})
        return w, {int(s): int(s) for s in w["window"].unique()}
    return inst_windows, {int(k): int(v) for k, v in _instance_steps(arrivals).items()}


def _tail_windows(cpu_rows: pd.DataFrame, steps: pd.DataFrame | None, extents: pd.DataFrame) -> pd.DataFrame:
    """After each rank's last measured CPU collective: its work up to the end of its last step
    (the traces' common end without steps). No sync closes it, but every rank does the same
    work there when all end with the same step (step-window captures do); else there is none."""
    last = cpu_rows.sort_values("end_ns").groupby("rank").tail(1).set_index("rank")["end_ns"]
    if steps is not None and len(steps):
        final = steps.sort_values("start_ns").groupby("rank").tail(1).set_index("rank").reindex(last.index)
        if final["step"].isna().any() or final["step"].nunique() != 1:
            return pd.DataFrame(columns=ph_mod.WINDOW_COLUMNS)  # ranks end in different steps: no common work
        end = final["end_ns"].to_numpy(np.int64)
    else:
        end = np.full(len(last), int(extents["trace_end_ns"].min()) if len(extents) else 0, np.int64)
    w = pd.DataFrame({"window": TAIL_WINDOW, "rank": last.index.to_numpy(np.int64),
                      "start_ns": last.to_numpy(np.int64), "end_ns": end})
    w = w[w["end_ns"] > w["start_ns"]]
    return w if len(w) >= 2 else w.iloc[:0]


def _instance_steps(arrivals: pd.DataFrame) -> pd.Series:
    """The step of each instance: the one most of its participants were in (lowest on a tie)."""
    n = arrivals.groupby(["instance", "step"], sort=True).size().reset_index(name="n")
    n = n.sort_values(["instance", "n", "step"], ascending=[True, False, True], kind="stable")
    return n.groupby("instance", sort=True)["step"].first().astype("int64")


# ---- tables --------------------------------------------------------------------------------
def _category_code(excess: ph_mod.CodedExcess, name: str) -> int:
    """The code of a category name in ``excess`` (-2, matching no row, when absent)."""
    hit = np.flatnonzero(excess.categories == name)
    return int(hit[0]) if hit.size else -2


def _map_ids(ids: pd.Series, mapping: dict[int, int]) -> pd.Series:
    """``ids.map(mapping)`` for integer ids and values (millions of rows), looked up as the phase
    windows are (``straggler_phases._WindowIndex``): int64 when every id is mapped, else float64
    with NaN where one is not, as ``Series.map``."""
    keys = np.fromiter(mapping.keys(), np.int64, len(mapping))
    values = np.fromiter(mapping.values(), np.int64, len(mapping))
    order = np.argsort(keys)
    keys, values = keys[order], values[order]
    v = ids.to_numpy(np.int64)
    # the windows' lookups: a table by id where the ids are numbered densely, else a search
    index = ph_mod._WindowIndex(keys, keys)
    found = index.wanted(v)
    mapped = values[np.minimum(index.positions(v), keys.size - 1)] if keys.size else np.zeros(v.size, np.int64)
    if found.all():
        return pd.Series(mapped, index=ids.index, dtype="int64")
    return pd.Series(np.where(found, mapped, np.nan), index=ids.index, dtype="float64")


def _per_rank(ranks: list[int], arrivals: pd.DataFrame, steps: pd.DataFrame | None, extents: pd.DataFrame,
              acc_excess: ph_mod.CodedExcess, report: dict) -> pd.DataFrame:
    out = pd.DataFrame({"rank": np.asarray(ranks, np.int64)}).set_index("rank")
    g = arrivals.groupby("rank")
    out["n_instances"] = g.size().reindex(out.index).fillna(0).astype("int64")
    out["times_last"] = g["is_last"].sum().reindex(out.index).fillna(0).astype("int64")
    out["late_ns_p50"] = _quantile_ns(g["late_ns"], 0.5).reindex(out.index).astype("Int64")
    out["late_ns_p99"] = _quantile_ns(g["late_ns"], 0.99).reindex(out.index).astype("Int64")
    out["caused_wait_ns"] = g["caused_wait_ns"].sum().reindex(out.index).fillna(0).astype("int64")
    late_pos = arrivals["late_ns"].clip(lower=0).groupby(arrivals["rank"]).sum()
    out["late_ns_total"] = late_pos.reindex(out.index).fillna(0).astype("int64")
    out["wait_ns"] = g["wait_ns"].sum().reindex(out.index).fillna(0).astype("int64")
    # whom the rank waited for most (its wait at instances, by their last arriver): a victim's
    # line reads "waiting for rank k", as its causes do
    whom = _waited_for(arrivals, ["rank"])
    waited = arrivals[["rank", "wait_ns"]].assign(last=arrivals["instance"].map(_last_of(arrivals)))
    waited = waited[waited["last"].to_numpy() == waited["rank"].map(whom).to_numpy()]
    out["waited_for_rank"] = whom.reindex(out.index).astype("Int64")
    out["waited_for_ns"] = waited.groupby("rank")["wait_ns"].sum().reindex(out.index).fillna(0).astype("int64")
    out["excess_ns"] = g["work_excess_ns"].sum().reindex(out.index).fillna(0).astype("int64")
    out["step_total_ns"] = _step_totals(out.index, steps, extents)
    out["own_work_ns"] = out["step_total_ns"] - out["wait_ns"]
    best = out.loc[out["own_work_ns"] > 0, "own_work_ns"].min() if (out["own_work_ns"] > 0).any() else np.nan
    out["score"] = np.where(out["own_work_ns"] > 0, best / out["own_work_ns"].where(out["own_work_ns"] > 0), np.nan)
    out["excess_share"] = out["excess_ns"] / best if best and best > 0 else np.nan
    out["excess_z"] = _excess_z(arrivals).reindex(out.index)
    out["caused_wait_share"] = out["caused_wait_ns"] / best if best and best > 0 else np.nan
    others_max = _max_of_others(out["caused_wait_ns"])
    significant = out["excess_z"] >= MIN_EXCESS_Z
    dominant = (out["caused_wait_share"] >= MIN_EXCESS_SHARE) & (out["caused_wait_ns"] >= DOMINANT_WAIT_RATIO * others_max)
    out["straggler"] = ((out["excess_share"] >= MIN_EXCESS_SHARE) & (significant | dominant)).fillna(False)
    acc = acc_excess.rows
    is_gpu = acc["category"].to_numpy(np.int64) == _category_code(acc_excess, ph_mod.GPU_CATEGORY)
    acc_rank, acc_ns = acc["rank"].to_numpy(np.int64), acc["excess_ns"].to_numpy(np.int64)
    listed = out.index.to_numpy(np.int64)  # sorted, distinct (``plan.ranks``)
    if acc_rank.size and listed.size and int(listed[0]) == 0 and int(listed[-1]) == listed.size - 1 \
            and int(acc_rank.min()) >= 0 and int(acc_rank.max()) < listed.size:
        listed_row, at = None, acc_rank  # ranks 0..n-1, every row's listed: its rank is its position
    else:
        listed_row, at = ph_mod._window_positions(acc_rank, listed, listed)  # each row's rank's position
    for col, mask in (("host_excess_ns", ~is_gpu), ("gpu_excess_ns", is_gpu)):
        sums = np.zeros(len(out), np.int64)  # per listed rank (0 for none), int64 as the rows
        if listed_row is not None:
            mask = mask & listed_row
        np.add.at(sums, at[mask], acc_ns[mask])  # a groupby of millions of rows: 0.1 s each
        out[col] = sums
    top = _top_causes(acc_excess)
    for c in ("top_cause", "top_cause_ns", "top_cause_category", "second_cause", "second_cause_ns"):
        out[c] = top[c].reindex(out.index) if len(top) else None
    out["top_cause_ns"] = out["top_cause_ns"].astype("Int64")
    out["second_cause_ns"] = out["second_cause_ns"].astype("Int64")
    # a victim: not a straggler, no own excess worth reporting, and it waited for someone: its
    # line says whom (its excess phase, noise, moves to second)
    small = out["top_cause_ns"].fillna(0).astype("float64") < MIN_EXCESS_SHARE * (best if best and best > 0 else 0)
    victim = ~out["straggler"].astype(bool) & small & out["waited_for_rank"].notna()
    victim &= out["waited_for_ns"] > out["top_cause_ns"].fillna(0).astype("int64")
    if victim.any():
        out["top_cause_category"] = out["top_cause_category"].astype(object)
        out["second_cause"] = out["second_cause"].astype(object)
        out.loc[victim, "second_cause"] = out.loc[victim, "top_cause"]
        out.loc[victim, "second_cause_ns"] = out.loc[victim, "top_cause_ns"]
        out.loc[victim, "top_cause"] = [f"waiting for rank {int(k)}" for k in out.loc[victim, "waited_for_rank"]]
        out.loc[victim, "top_cause_ns"] = out.loc[victim, "waited_for_ns"].astype("int64")
        out.loc[victim, "top_cause_category"] = WAIT_CATEGORY
    out = out.reset_index()
    return out[STRAGGLER_COLUMNS + STRAGGLER_EXTRA_COLUMNS]


def _max_of_others(values: pd.Series) -> pd.Series:
    """For each rank, the largest value among the other ranks (0 when it is alone)."""
    v = values.to_numpy(np.int64)
    if v.size < 2:
        return pd.Series(np.zeros(v.size, np.int64), index=values.index)
    order = np.argsort(v)
    top, second = v[order[-1]], v[order[-2]]
    return pd.Series(np.where(v == top, second, top), index=values.index)


def _quantile_ns(series_groups, q: float) -> pd.Series:
    return series_groups.quantile(q, interpolation="nearest").astype("int64")


def _step_totals(ranks: pd.Index, steps: pd.DataFrame | None, extents: pd.DataFrame) -> pd.Series:
    """Summed step time per rank; without steps, the common traced window of all ranks."""
    if steps is not None and len(steps):
        tot = (steps["end_ns"].astype("int64") - steps["start_ns"].astype("int64")).groupby(steps["rank"]).sum()
        return tot.reindex(ranks).fillna(0).astype("int64")
    if len(extents):
        span = int(extents["trace_end_ns"].min() - extents["trace_start_ns"].max())
        return pd.Series(max(span, 0), index=ranks, dtype="int64")
    return pd.Series(0, index=ranks, dtype="int64")


def _excess_z(arrivals: pd.DataFrame) -> pd.Series:
    """Robust z of each rank's mean per-step own-work excess (per instance without steps).

    The noise is what clean ranks show: with ``MIN_PEERS_FOR_NOISE`` or more ranks, the robust
    spread (1.4826 x MAD) of the OTHER ranks' per-step excess, pooled (a few stragglers among
    them barely move it); with fewer (DEP2: the other rank's excess is this one's mirror image),
    the lower part of the rank's own per-step excess (``_lower_scale``)."""
    unit = np.where(arrivals["step"].to_numpy() >= 0, arrivals["step"].to_numpy(), -1 - arrivals["instance"].to_numpy())
    per = arrivals.assign(_u=unit).groupby(["rank", "_u"])["work_excess_ns"].sum().unstack()
    mat = per.to_numpy(np.float64)
    out = {}
    for i, rank in enumerate(per.index):
        v = mat[i][~np.isnan(mat[i])]
        if not v.size:
            continue
        if per.shape[0] >= MIN_PEERS_FOR_NOISE:
            peers = np.delete(mat, i, axis=0)
            peers = peers[~np.isnan(peers)]
            scale = 1.4826 * float(np.median(np.abs(peers - np.median(peers))))
        else:
            scale = _lower_scale(v)
        out[int(rank)] = float(v.mean() * np.sqrt(v.size) / max(scale, MIN_SCALE_NS))
    return pd.Series(out, dtype="float64")


def _lower_scale(v: np.ndarray) -> float:
    """Noise scale (a standard deviation) from the lower part of the values: (40th - 10th
    percentile) / 1.028, the normal distribution's distance between them. Late steps, the thing
    looked for, are upward outliers: up to about half of the steps can be late without inflating
    it, and a constant shift (a persistently slow rank) does not change it either."""
    if v.size < 2:
        return 0.0
    q10, q40 = np.quantile(v, [0.10, 0.40])
    return float((q40 - q10) / 1.0283)


def _summed_by_key(key: np.ndarray, ns: np.ndarray, cat: np.ndarray, own_key: bool = False) -> tuple[np.ndarray, ...]:
    """Per distinct key (ascending): the sum of ``ns`` and the first category >= 0 (-1: none), as
    ``groupby(key, sort=True).agg(sum, first)`` gives them. Keys of a small range are summed in a
    table (a hash groupby of ~10^7 rows and its frame cost the driver ~0.4 s at DEP32 x 1,000).
    ``own_key``: ``key`` is the caller's to change (shifted in place: each fresh array of millions
    of rows costs its page faults, ~0.1 s here)."""
    if not key.size:
        return key, ns, cat
    lo, hi = int(key.min()), int(key.max())
    if hi - lo >= 1 << 24:  # a wide range: sorted groups (order of appearance kept within a key)
        order, starts = sorted_groups((key,))
        k, c = key[order], cat[order]
        pos = np.where(c >= 0, np.arange(k.size), k.size)
        first = np.minimum.reduceat(pos, starts)
        return k[starts], np.add.reduceat(ns[order], starts).astype(np.int64), \
            np.where(first < k.size, c[np.minimum(first, k.size - 1)], -1)
    if own_key:
        key -= lo
        at = key
    else:
        at = key - lo
    sums = np.zeros(hi - lo + 1, np.int64)
    np.add.at(sums, at, ns)
    seen = np.zeros(hi - lo + 1, bool)
    seen[at] = True
    first = np.full(hi - lo + 1, key.size, np.int64)
    if bool((cat >= 0).all()):  # every row has a category: the first row of each key
        np.minimum.at(first, at, np.arange(key.size, dtype=np.int64))
    else:
        valid = np.flatnonzero(cat >= 0)
        np.minimum.at(first, at[valid], valid)  # the first row with a category, per key
    keys = np.flatnonzero(seen)
    first = first[keys]
    return keys + lo, sums[keys], np.where(first < key.size, cat[np.minimum(first, key.size - 1)], -1)


def _top_causes(excess: ph_mod.CodedExcess) -> pd.DataFrame:
    """Per rank: the phases with the largest summed excess (first and second), if positive; the
    category is the first row's of the (rank, phase). Grouped on one integer key (rank, phase code)."""
    rows = excess.rows
    if not len(rows):
        return pd.DataFrame()
    v = np.int64(max(len(excess.phases), 1))
    key = rows["rank"].to_numpy(np.int64) * v  # (a fresh array: the phase is added in place)
    key += rows["phase"].to_numpy(np.int64)
    key, ns, cat = _summed_by_key(key, rows["excess_ns"].to_numpy(np.int64), rows["category"].to_numpy(np.int64),
                                  own_key=True)
    keep = ns > 0
    key, ns, cat = key[keep], ns[keep], cat[keep]
    rank, phase = key // v, key % v
    order = np.lexsort((phase, -ns, rank))  # by rank, largest excess first, then name (codes are in name order)
    rank, phase, ns, cat = rank[order], phase[order], ns[order], cat[order]
    start = np.r_[True, rank[1:] != rank[:-1]] if rank.size else np.zeros(0, bool)
    second = np.r_[False, start[:-1] & ~start[1:]] if rank.size else np.zeros(0, bool)
    idx = pd.Index(rank[start], name="rank")
    sec = pd.Index(rank[second], name="rank")
    cat_codes = cat[start]
    return pd.DataFrame({
        "top_cause": excess.phase_names(pd.Series(phase[start], index=idx), "str"),
        "top_cause_ns": pd.Series(ns[start], index=idx, dtype="int64"),
        "top_cause_category": excess.category_names(pd.Series(cat_codes, index=idx)),
        "second_cause": excess.phase_names(pd.Series(phase[second], index=sec), "str").reindex(idx),
        "second_cause_ns": pd.Series(ns[second], index=sec, dtype="int64").reindex(idx),
    })


def _per_instance(arrivals: pd.DataFrame, excess: ph_mod.CodedExcess, matched: pd.DataFrame | None,
                  inst_steps: pd.Series) -> pd.DataFrame:
    """``inst_steps``: ``_instance_steps(arrivals)`` (the caller's, made once)."""
    first, last = _first_and_last(arrivals)
    out = pd.DataFrame({
        "step": inst_steps,
        "coll_name": first["coll_name"], "source_kind": first["source_kind"], "key": first["key"],
        "n_ranks": first["n_ranks"],
        "first_rank": first["rank"], "first_start_ns": first["start_ns"],
        "last_rank": last["rank"], "last_start_ns": last["start_ns"],
        "last_late_ns": last["late_ns"], "caused_wait_ns": last["caused_wait_ns"],
    })
    out["arrival_skew_ns"] = out["last_start_ns"] - out["first_start_ns"]
    if matched is not None and len(matched) and "instance" in matched:
        m = matched.drop_duplicates("instance").set_index("instance")
        for c in ("group", "seq", "end_spread_ns"):
            out[c] = m[c].reindex(out.index) if c in m else None
    else:
        out["group"], out["seq"], out["end_spread_ns"] = None, None, None
    top = _best(_last_rows(excess.rows, last["rank"]), "window") if len(excess.rows) else pd.DataFrame()
    out["top_cause"] = excess.phase_names(top["phase"]).reindex(out.index) if len(top) else None
    out["top_cause_ns"] = (top["excess_ns"].reindex(out.index) if len(top) else pd.Series(index=out.index,
                                                                                           dtype="float64")).astype("Int64")
    out = out.reset_index()
    for c in ("seq", "end_spread_ns"):
        out[c] = out[c].astype("Int64")
    return out[INSTANCE_COLUMNS]


def _first_and_last(arrivals: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each instance's first and last arrival (by start, then rank), indexed by instance, as the
    stable sort by (instance, start, rank) and ``groupby("instance").head(1)`` / ``tail(1)`` give
    them: the rows at the bounds of each instance's run, read by position (``arrival_rows`` sorts
    its rows so already: no sort of the frame; a groupby's head and tail of ~10^5 instances and
    every column cost ~0.1 s)."""
    inst, start, rank = (arrivals[c].to_numpy(np.int64) for c in ("instance", "start_ns", "rank"))
    later = (inst[1:] > inst[:-1]) | ((inst[1:] == inst[:-1]) & (
        (start[1:] > start[:-1]) | ((start[1:] == start[:-1]) & (rank[1:] >= rank[:-1]))))
    if not later.all():
        order = np.lexsort((rank, start, inst))  # the stable sort of the three columns
        arrivals, inst = arrivals.take(order), inst[order]
    new = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]]) if inst.size else np.empty(0, np.int64)
    ends = np.r_[new[1:] - 1, inst.size - 1] if new.size else new
    return arrivals.iloc[new].set_index("instance"), arrivals.iloc[ends].set_index("instance")


def _last_rows(excess: pd.DataFrame, last_rank: pd.Series) -> pd.DataFrame:
    """The rows of each window's last arriver (``last_rank``: per instance, sorted), in their order."""
    ids, last = last_rank.index.to_numpy(np.int64), last_rank.to_numpy(np.int64)
    w = excess["window"].to_numpy(np.int64)
    j = np.minimum(np.searchsorted(ids, w), max(ids.size - 1, 0))
    hit = (ids[j] == w) & (last[j] == excess["rank"].to_numpy(np.int64)) if ids.size else np.zeros(w.size, bool)
    return excess[hit]


def _best(excess: pd.DataFrame, by) -> pd.DataFrame:
    """Row of the largest positive excess per group ``by``."""
    pos = excess[excess["excess_ns"] > 0]
    if not len(pos):
        return pd.DataFrame()
    pos = pos.sort_values("excess_ns", ascending=False, kind="stable")
    return pos.groupby(by, sort=False).head(1).set_index(by)


PHASE_STEP_COLUMNS = ["rank", "step", "cause", "ns"]


def _phase_steps(acc_excess: ph_mod.CodedExcess | None, per_step: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (rank, step, phase): the rank's own time in the phase in the windows of that step (its
    work since its previous sync point, up to each arrival of the step; waits are not phases).
    Episodes read their causes here: a GC at the end of step k makes the rank late at step k+1's
    sync, and the window of that sync holds it. ``per_step``: ``_step_phase_table`` of ``acc_excess``."""
    if acc_excess is None or not len(acc_excess.rows):
        return pd.DataFrame({"rank": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                             "cause": pd.Series(dtype=object), "ns": pd.Series(dtype="int64")})
    g = per_step if per_step is not None else _step_phase_table(acc_excess)
    own = g["n_own"].to_numpy() > 0
    rank, step = g["rank"].to_numpy()[own], g["step"].to_numpy()[own]
    phase, ns = g["phase"].to_numpy()[own], g["ns"].to_numpy(np.int64)[own]
    order = np.lexsort((phase, step, rank))  # codes sort as names
    # the names by their codes (Arrow takes the distinct names), not a Python string per row inferred
    cause = distinct.strings_at(np.asarray(acc_excess.phases, dtype=object), phase[order].astype(np.int64))
    g = pd.DataFrame({"rank": rank[order].astype(np.int64), "step": step[order].astype(np.int64), "cause": cause,
                      "ns": ns[order]})
    return g.astype({"cause": "str"})[PHASE_STEP_COLUMNS]


def _step_phase_table(excess: ph_mod.CodedExcess) -> pd.DataFrame:
    """Per (rank, step, phase code) of the rows with a step, in order of first appearance (as
    ``groupby([...], sort=False)`` orders them): the summed ``excess_ns``, the summed own time
    ``ns`` of the rows with ns > 0 and how many those are (``n_own``). One factorization of one
    int64 key serves both the lateness and the phase steps (millions of rows at DEP32 x 1000)."""
    x = excess.rows
    step = x["step"]
    keep = step.notna().to_numpy(bool)
    if keep.all():  # (the usual case: no copies of millions of rows)
        keep = slice(None)
    r, p = x["rank"].to_numpy(np.int64)[keep], x["phase"].to_numpy(np.int64)[keep]
    st = step.to_numpy()[keep].astype(np.int64, copy=False)
    cols = {"rank": r[:0], "step": st[:0], "phase": p[:0], "excess_ns": r[:0], "ns": r[:0], "n_own": r[:0]}
    if not r.size:
        return pd.DataFrame(cols).astype({"step": step.dtype})
    r0, s0 = int(r.min()), int(st.min())
    n_s, n_p = int(st.max()) - s0 + 1, max(len(excess.phases), 1)
    if (int(r.max()) - r0 + 1) * n_s * n_p >= 2 ** 62:  # no room in one int64: factorize the triples
        codes, _ = pd.factorize(pd.MultiIndex.from_arrays([r, st, p]))
    else:
        codes, _ = pd.factorize(((r - r0) * n_s + (st - s0)) * n_p + p)
    codes = np.asarray(codes, np.int64)
    n = int(codes.max()) + 1
    # one stable sort by code: each group's first row and its int64 sums (exact, unlike a float
    # bincount; ``np.add.at`` took seconds on millions of rows)
    order = np.argsort(codes, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(codes, minlength=n))[:-1]]  # factorize: every code has rows
    del codes
    first = order[bounds]
    excess_ns = np.add.reduceat(x["excess_ns"].to_numpy(np.int64)[keep][order], bounds)
    own_sorted = x["ns"].to_numpy(np.int64)[keep][order]
    del order
    ns = np.add.reduceat(np.where(own_sorted > 0, own_sorted, 0), bounds)
    n_own = np.add.reduceat((own_sorted > 0).astype(np.int64), bounds)
    del own_sorted
    return pd.DataFrame({"rank": r[first], "step": pd.Series(st[first]).astype(step.dtype).to_numpy(),
                         "phase": p[first], "excess_ns": excess_ns, "ns": ns, "n_own": n_own}, copy=False)


def _lateness(arrivals: pd.DataFrame, acc_excess: ph_mod.CodedExcess, per_step: pd.DataFrame | None = None
              ) -> pd.DataFrame:
    g = arrivals.assign(_late_pos=arrivals["late_ns"].clip(lower=0)).groupby(["rank", "step"], sort=True)
    out = pd.DataFrame({
        "late_ns": g["_late_pos"].sum().astype("int64"),
        "late_max_ns": g["late_ns"].max().astype("int64"),
        "excess_ns": g["work_excess_ns"].sum().astype("int64"),
        "times_last": g["is_last"].sum().astype("int64"),
        "caused_wait_ns": g["caused_wait_ns"].sum().astype("int64"),
        "wait_ns": g["wait_ns"].sum().astype("int64"),
        "n_instances": g.size().astype("int64"),
    })
    if len(acc_excess.rows):
        per = per_step if per_step is not None else _step_phase_table(acc_excess)
        per = per[["rank", "step", "phase", "excess_ns"]]
        top = _best(per, ["rank", "step"])
        out["top_cause"] = acc_excess.phase_names(top["phase"], "str").reindex(out.index) if len(top) else None
        out["top_cause_ns"] = (top["excess_ns"].reindex(out.index) if len(top) else np.nan)
    else:
        out["top_cause"], out["top_cause_ns"] = None, np.nan
    out["top_cause_ns"] = pd.Series(out["top_cause_ns"], index=out.index, dtype="float64").astype("Int64")
    # a rank-step that was last nowhere and waited longer than any own excess: a victim's step
    whom = _waited_for(arrivals, ["rank", "step"])
    victim = (out["times_last"] == 0) & (out["wait_ns"] > out["top_cause_ns"].fillna(0).astype("int64"))
    victim &= whom.reindex(out.index).notna()
    if victim.any():
        out["top_cause"] = out["top_cause"].astype(object)
        out.loc[victim, "top_cause"] = [f"waiting for rank {int(k)}" for k in whom.reindex(out.index)[victim]]
        out.loc[victim, "top_cause_ns"] = out.loc[victim, "wait_ns"]
    return out.reset_index()[LATENESS_COLUMNS]


def _last_of(arrivals: pd.DataFrame) -> pd.Series:
    """Each instance's last arriver (rank by instance), read from two columns (the rows hold strings)."""
    last = arrivals["is_last"].to_numpy(bool)
    return pd.Series(arrivals["rank"].to_numpy()[last], name="rank",
                     index=pd.Index(arrivals["instance"].to_numpy()[last], name="instance"))


def _waited_for(arrivals: pd.DataFrame, by: list[str]) -> pd.Series:
    """Per group ``by``: the rank waited for longest (the last arriver of the instances waited at;
    on a tie the lowest rank). Sorted integer keys, not a groupby and a sort of millions of rows."""
    last_of = _last_of(arrivals)
    j = first_match((last_of.index.to_numpy(np.int64),), (arrivals["instance"].to_numpy(np.int64),))
    has = j >= 0  # an instance without a last arriver: none
    last = last_of.to_numpy(np.int64)[np.maximum(j, 0)] if len(last_of) else np.zeros(j.size, np.int64)
    wait = arrivals["wait_ns"].to_numpy(np.int64)
    cols = [arrivals[c].to_numpy(np.int64) for c in by]
    waited = (wait > 0) & (~has | (last != arrivals["rank"].to_numpy(np.int64)))
    if not waited.any():
        return pd.Series(dtype="float64")
    keep = np.flatnonzero(waited & has)  # an instance without a last arriver is in no group
    cols, last, wait = [c[keep] for c in cols], last[keep], wait[keep]
    if not keep.size:  # waits, all at instances without a last arriver: no group, keyed as groups are
        return pd.Series(np.empty(0, np.float64), name="last", index=pd.MultiIndex.from_arrays(
            [np.empty(0, np.int64)] * len(by), names=by) if len(by) > 1 else pd.Index(np.empty(0, np.int64), name=by[0]))
    order, starts = sorted_groups((*cols, last))  # per (group, last arriver) the time waited for it
    total = np.add.reduceat(wait[order], starts)
    g_cols, g_last = [c[order[starts]] for c in cols], last[order[starts]]
    pick, first = sorted_groups(tuple(g_cols), within=(-total, g_last))  # the longest, then the lowest rank
    best = pick[first]
    index = pd.Index(g_cols[0][best], name=by[0]) if len(by) == 1 else \
        pd.MultiIndex.from_arrays([c[best] for c in g_cols], names=by)
    values = g_last[best] if has.all() else g_last[best].astype(np.float64)  # as a map with misses makes it
    return pd.Series(values, index=index, name="last")


def _match(instances: pd.DataFrame) -> pd.DataFrame | None:
    if instances is None or not len(instances):
        return None
    from profkit.collectives.instances import match_instances

    return match_instances(instances)


def _empty_excess() -> ph_mod.CodedExcess:
    rows = ph_mod._empty(ph_mod.EXCESS_COLUMNS).astype({"phase": "int64", "category": "int64"})
    return ph_mod.CodedExcess(rows, np.empty(0, dtype=object), np.empty(0, dtype=object))


def _empty(columns: list[str]) -> pd.DataFrame:
    text = {"top_cause", "coll_name", "source_kind", "key", "group", "top_cause_category", "second_cause"}
    return pd.DataFrame({c: pd.Series(dtype=object if c in text else "int64") for c in columns})
