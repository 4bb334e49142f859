"""Arrivals at collective instances on one (aligned) timeline: who came late, by how much, why not.

One row per (rank, instance). Lateness is measured against the MEDIAN of the OTHER
participants' arrivals: a rank is late by what it trails a typical peer, so one straggler does
not make every other rank look early (the first arrival would), and the straggler's own
arrival does not move its reference (the median of all would, with two ranks). With two
ranks it is simply the difference of the two arrivals.

Lateness splits into the rank's own work since its previous sync point (``work_excess_ns``:
its work window, from the exit of its previous collective to this arrival, minus the median of
the other participants' windows) and what it inherited (``inherited_ns``: it was released
late from its previous sync point, e.g. by a straggler of another group; a victim's lateness,
never charged to it).

``gpu_gated``: the arrival at a GPU collective was set by the rank's GPU (its kernel waited in
the stream queue after the launch), not by its host.

Capture edges: a rank whose trace starts later (or ends earlier) makes the others "wait" at
the first (last) instances for work outside the window. Only instances inside the common
window of all their participants are kept (first arrival at or after every participant's
trace start, last exit at or before every participant's trace end), and work windows never
start before the common window.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit import distinct, schema

# Source kinds whose start is a rank's arrival at a sync point. ``launch_span`` (the host launch
# of a GPU collective on a trace without kernels) is asynchronous: the host never waits there.
ARRIVAL_KINDS = ("kernel", "cpu_span")
NO_STEP = -1

ARRIVAL_COLUMNS = [
    "instance", "rank", "step", "key", "coll_name", "source_kind", "n_ranks",
    "start_ns", "end_ns", "work_start_ns", "work_ns", "host_start_ns",
    "late_ns", "work_excess_ns", "inherited_ns", "wait_ns", "is_last", "caused_wait_ns", "gpu_gated",
]
# A GPU collective whose kernel started this long after its launch call waited in the stream
# queue: the rank's GPU, not its host, set the arrival (launch -> start on an idle GPU: 8-40 us).
GPU_GATED_NS = 100_000
WINDOW_COLUMNS = ["rank", "trace_start_ns", "trace_end_ns"]
_EDGE_KINDS = (schema.INSTANT, schema.OTHER)  # zero-length markers and metadata: not the trace's extent


def trace_windows(events: pd.DataFrame) -> pd.DataFrame:
    """Each rank's traced extent (first event start, last event end; instants and metadata skipped)."""
    if events is None or not len(events):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in WINDOW_COLUMNS})
    keep = ~distinct.isin(events["kind"], _EDGE_KINDS)
    rank = events["rank"]
    if keep.any() and not rank.hasnans and rank.min() == rank.max():  # one rank's events (a rank task): no groupby
        return pd.DataFrame({"rank": [int(rank.iloc[0])],
                             "trace_start_ns": [int(events["start_ns"].to_numpy(np.int64)[keep].min())],
                             "trace_end_ns": [int(events["end_ns"].to_numpy(np.int64)[keep].max())]}, dtype="int64")
    ev = events.loc[keep, ["rank", "start_ns", "end_ns"]]
    g = ev.groupby("rank", observed=True)
    out = pd.DataFrame({"trace_start_ns": g["start_ns"].min(), "trace_end_ns": g["end_ns"].max()}).reset_index()
    return out.astype("int64")[WINDOW_COLUMNS]


def arrival_rows(inst: pd.DataFrame, windows: pd.DataFrame, steps: pd.DataFrame | None,
                 ends: dict[int, np.ndarray] | None = None,
                 host_ends: dict[int, np.ndarray] | None = None) -> tuple[pd.DataFrame, dict]:
    """Per (rank, instance) arrivals of the complete instances inside the capture window.

    ``inst``: ``collective_instances`` rows on aligned clocks (incomplete rows may be included:
    they still mark sync points on their ranks, but are not measured). Returns the table
    (``ARRIVAL_COLUMNS``) and counts of what was dropped and why. ``ends``: ``sync_ends(inst)``,
    ``host_ends``: ``host_sync_ends(inst)``, where they were computed already.
    """
    report = {"instances": 0, "dropped_incomplete": 0, "dropped_edge": 0, "dropped_async": 0, "dropped_single": 0}
    if inst is None or not len(inst):
        return _empty(), report
    inst = _typed(inst)
    sync_ends = ends if ends is not None else _sync_ends(inst)
    per = inst.groupby("instance", sort=True)
    total = int(per.ngroups)
    complete = inst["complete"].astype(bool) if "complete" in inst else pd.Series(True, index=inst.index)
    ok_complete = complete.groupby(inst["instance"]).all()
    kinds = per["source_kind"].first()
    n_ranks = per["rank"].nunique()
    # capture edges: the common window of each instance's participants
    win = windows.set_index("rank") if len(windows) else pd.DataFrame(columns=["trace_start_ns", "trace_end_ns"])
    lo = inst["rank"].map(win["trace_start_ns"]).fillna(np.iinfo(np.int64).min).astype("int64")
    hi = inst["rank"].map(win["trace_end_ns"]).fillna(np.iinfo(np.int64).max).astype("int64")
    common_lo = lo.groupby(inst["instance"]).max()
    common_hi = hi.groupby(inst["instance"]).min()
    inside = (per["start_ns"].min() >= common_lo) & (per["end_ns"].max() <= common_hi)
    keep = ok_complete & inside & kinds.isin(ARRIVAL_KINDS) & (n_ranks >= 2)
    report.update(
        instances=int(keep.sum()),
        dropped_incomplete=int((~ok_complete).sum()),
        dropped_edge=int((ok_complete & ~inside).sum()),
        dropped_async=int((ok_complete & inside & ~kinds.isin(ARRIVAL_KINDS)).sum()),
        dropped_single=int((ok_complete & inside & kinds.isin(ARRIVAL_KINDS) & (n_ranks < 2)).sum()),
        instances_seen=total,
    )
    sel = np.flatnonzero(inst["instance"].map(keep).to_numpy(dtype=bool))
    if not sel.size:
        return _empty(), report
    # sorted by instance, start, rank; only the columns read below are taken (the rest are strings)
    sel = sel[np.lexsort(tuple(inst[c].to_numpy(np.int64)[sel] for c in ("rank", "start_ns", "instance")))]
    cols = [c for c in ("instance", "rank", "start_ns", "end_ns", "key", "coll_name", "source_kind", "launch_ns")
            if c in inst]
    rows = inst[cols].take(sel).reset_index(drop=True)
    start = rows["start_ns"].to_numpy(np.int64)
    rank = rows["rank"].to_numpy(np.int64)
    # work window: from the exit of the rank's previous sync point (any collective of its groups,
    # measured or not), never before the instance's common window start
    prev_end = np.empty(len(rows), np.int64)
    for r in np.unique(rank):
        m = rank == r
        ends = sync_ends[int(r)]
        j = np.searchsorted(ends, start[m], side="right") - 1
        prev_end[m] = np.where(j >= 0, ends[np.maximum(j, 0)], np.iinfo(np.int64).min)
    floor = rows["instance"].map(common_lo).to_numpy(np.int64).copy()
    first = prev_end == np.iinfo(np.int64).min  # the rank's first sync: its window reaches back to its start-up
    floor[first] = np.maximum(floor[first], _serving_start(rank[first], start[first], steps))
    work_start = np.maximum(prev_end, floor)
    host_start = np.maximum(_host_sync_before(inst, rank, start, steps, host_ends), floor)
    work = start - work_start
    bounds = _group_bounds(rows["instance"].to_numpy(np.int64))
    late = start - _median_of_others(start, bounds, presorted=True)
    work_excess = work - _median_of_others(work, bounds, presorted=False)
    last_start = np.repeat(start[bounds[1] - 1], bounds[1] - bounds[0])
    is_last = np.zeros(len(rows), bool)
    is_last[bounds[1] - 1] = True
    wait = last_start - start
    total_wait = np.add.reduceat(wait, bounds[0]) if len(rows) else np.empty(0, np.int64)
    caused = np.zeros(len(rows), np.int64)
    caused[bounds[1] - 1] = total_wait  # the others' waits, charged to the last arriver
    launch = rows["launch_ns"].astype("Int64").to_numpy(dtype=np.int64, na_value=np.iinfo(np.int64).max) \
        if "launch_ns" in rows else np.full(len(rows), np.iinfo(np.int64).max, np.int64)
    kind = rows["source_kind"]
    is_kernel = _kind_is(kind, "kernel")
    gated = is_kernel & (launch < start - GPU_GATED_NS)
    out = pd.DataFrame({
        "instance": rows["instance"].to_numpy(np.int64),
        "rank": rank,
        "step": _step_of(rank, start, steps),
        "key": _strings(rows["key"], str),
        "coll_name": _strings(rows["coll_name"], object),
        "source_kind": _strings(kind, str),
        "n_ranks": np.repeat(bounds[1] - bounds[0], bounds[1] - bounds[0]).astype(np.int64),
        "start_ns": start,
        "end_ns": rows["end_ns"].to_numpy(np.int64),
        "work_start_ns": work_start,
        "work_ns": work,
        "host_start_ns": host_start,
        "late_ns": late,
        "work_excess_ns": work_excess,
        "inherited_ns": late - work_excess,
        "wait_ns": wait,
        "is_last": is_last,
        "caused_wait_ns": caused,
        "gpu_gated": gated,
    }, copy=False)  # fresh arrays (or views of ``rows``, dropped here): not copied into blocks again
    return out[ARRIVAL_COLUMNS], report


def _is_str(col: pd.Series) -> bool:
    """Whether ``col`` has the dtype pandas gives a column of Python strings (pandas 3: ``str``)."""
    return isinstance(col.dtype, pd.StringDtype) and col.dtype == distinct.STR_DTYPE


def _kind_is(kind: pd.Series, name: str) -> np.ndarray:
    """``kind.astype(str) == name`` as a bool array: a ``str`` column tested per distinct value."""
    return distinct.isin(kind, name) if _is_str(kind) else (kind.astype(str) == name).to_numpy(bool)


def _strings(col: pd.Series, as_type: type):
    """``col.astype(as_type).to_numpy(dtype=object)`` as a frame column would hold it: a ``str``
    column is that already (missing values stay missing), and is kept as it is; converting its
    ~10^5-10^6 rows to Python objects and inferring ``str`` again cost the driver ~0.1 s a column."""
    return col.array if _is_str(col) else col.astype(as_type).to_numpy(dtype=object)


def _typed(inst: pd.DataFrame) -> pd.DataFrame:
    return inst.assign(rank=inst["rank"].astype("int64"), start_ns=inst["start_ns"].astype("int64"),
                       end_ns=inst["end_ns"].astype("int64"))


def sync_ends(inst: pd.DataFrame | None) -> dict[int, np.ndarray]:
    """``arrival_rows``' sync exits per rank (``_sync_ends``): they need only the instances, so
    the driver finds them while the workers analyze the ranks (``pipeline._collectives``)."""
    return _sync_ends(_typed(inst)) if inst is not None and len(inst) else {}


def host_sync_ends(inst: pd.DataFrame | None) -> dict[int, np.ndarray]:
    """``_host_sync_before``'s marks where the instances hold CPU collectives ({} where they hold
    none: the steps' starts stand in then): they need only the instances, so the driver finds them
    with ``sync_ends``, while the workers analyze the ranks, not in the straggler plan."""
    return _cpu_sync_ends(_typed(inst)) if inst is not None and len(inst) else {}


_SYNC_END_COLUMNS = ("instance", "rank", "key", "start_ns", "end_ns", "exit_ns")  # what ``_sync_ends`` reads


def _cpu_sync_ends(inst: pd.DataFrame) -> dict[int, np.ndarray]:
    """``_sync_ends`` of the CPU collectives (blocking: they synchronize hosts) among ``inst``
    (``_typed``); {} where there are none."""
    # only the columns ``_sync_ends`` reads are taken (every instance row's strings are not)
    cpu = inst.loc[_kind_is(inst["source_kind"], "cpu_span"), [c for c in _SYNC_END_COLUMNS if c in inst]]
    return _sync_ends(cpu) if len(cpu) else {}


def _sync_ends(inst: pd.DataFrame) -> dict[int, np.ndarray]:
    """Per rank, the exits of every collective instance of the keys (groups) it takes part in,
    sorted: the instance's common exit (the median of its ranks' ends), but never after the
    rank's own release (``exit_ns`` where known, else its end): a peer whose end was recorded
    late (a Gloo worker thread descheduled on a loaded host) must not place the exit after this
    rank already went on to its next collective, which would make two work windows overlap. An
    instance missing on a rank that belongs to its group (events dropped, the rank's part not
    matched) still released it at the common exit: without this, its next work window would
    reach back one sync point further and its work look longer than its peers'."""
    own = inst["end_ns"].to_numpy(np.int64)
    if "exit_ns" in inst:
        own = np.maximum(own, inst["exit_ns"].astype("Int64").fillna(inst["end_ns"].astype("Int64"))
                         .to_numpy(np.int64))
    exits = inst.groupby("instance").agg(key=("key", "first"), end_ns=("end_ns", "median"))
    ids, exit_end = exits.index.to_numpy(np.int64), exits["end_ns"].astype("int64").to_numpy(np.int64)
    at = np.searchsorted(ids, inst["instance"].to_numpy(np.int64))  # each row's instance
    own = np.minimum(own, exit_end[at])
    # ... and never at or before the rank's own arrival at it: aligned clocks a millisecond off
    # (calling threads only, a loaded host) can put the common exit there, and the instance
    # would then close the late arriver's own work window (its GC before it read as none)
    own = np.maximum(own, inst["start_ns"].to_numpy(np.int64) + 1)
    # keys as codes (rows and instances alike; -1: none), ranks from 0
    row_key, keys = pd.factorize(inst["key"].astype(str))
    code_of = {k: i for i, k in enumerate(keys)}
    exit_key = np.array([code_of.get(str(k), -1) if pd.notna(k) else -1 for k in exits["key"]], dtype=np.int64)
    ranks, rank_at = np.unique(inst["rank"].to_numpy(np.int64), return_inverse=True)
    rank_at = rank_at.reshape(-1)
    n_ids, n_keys = np.int64(ids.size), np.int64(max(len(keys), 1))
    # the instances of each key the rank takes part in that it does not have: released at the common exit
    pairs = np.unique(rank_at[row_key >= 0] * n_keys + row_key[row_key >= 0])
    by_key = np.argsort(exit_key, kind="stable")
    sorted_keys = exit_key[by_key]
    lo = np.searchsorted(sorted_keys, pairs % n_keys, side="left")
    cnt = np.searchsorted(sorted_keys, pairs % n_keys, side="right") - lo
    cand_rank = np.repeat(pairs // n_keys, cnt)
    cand = by_key[np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))]
    missing = ~np.isin(cand_rank * n_ids + cand, rank_at * n_ids + at)
    rank_of = np.concatenate([rank_at, cand_rank[missing]])
    value = np.concatenate([own, exit_end[cand[missing]]])
    order = np.lexsort((value, rank_of))
    rank_of, value = rank_of[order], value[order]
    bounds = np.searchsorted(rank_of, np.arange(ranks.size + 1))
    return {int(r): value[bounds[i]:bounds[i + 1]] for i, r in enumerate(ranks.tolist())}


def _host_sync_before(inst: pd.DataFrame, rank: np.ndarray, t: np.ndarray, steps: pd.DataFrame | None,
                      cpu_ends: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """Per arrival: when its rank's host last synchronized with the others before it.

    Blocking CPU collectives (Gloo, DP sync spans) synchronize hosts; GPU collectives do not
    (the host launches them and runs on). Without any CPU collective in the capture, the start
    of the rank's step stands in for it (every rank starts the same step's work). ``cpu_ends``:
    ``_cpu_sync_ends(inst)`` where it was computed already (``host_sync_ends``).
    """
    out = np.full(rank.size, np.iinfo(np.int64).min, np.int64)
    marks = _cpu_sync_ends(inst) if cpu_ends is None else cpu_ends
    if not marks:
        if steps is None or not len(steps):
            return out
        marks = {int(r): np.sort(g["start_ns"].to_numpy(np.int64)) for r, g in steps.groupby("rank")}
    for r in np.unique(rank):
        ends = marks.get(int(r))
        if ends is None or not ends.size:
            continue
        m = rank == r
        j = np.searchsorted(ends, t[m], side="right") - 1
        out[m] = np.where(j >= 0, ends[np.maximum(j, 0)], np.iinfo(np.int64).min)
    return out


def _group_bounds(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[first, end) row of each run of equal values in a sorted array."""
    if not groups.size:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    first = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    return first, np.r_[first[1:], groups.size]


def _median_of_others(values: np.ndarray, bounds: tuple[np.ndarray, np.ndarray], presorted: bool) -> np.ndarray:
    """Per row: the median of the other rows of its group (int64, lower-rounded mean of the two
    middle values when they are an even number). Vectorized over groups of any size >= 2."""
    first, end = bounds
    n = end - first
    size = np.repeat(n, n)
    base = np.repeat(first, n)
    if presorted:
        order = np.arange(values.size)
        sv = values
    else:  # sort within groups, keep where each row went
        order = _sorted_within(values, first, n)
        sv = values[order]
    pos = np.empty(values.size, np.int64)
    pos[order] = np.arange(values.size) - base  # rank of each row inside its group
    m = size - 1  # number of others
    lo_i = (m - 1) // 2  # index among the others of the lower middle
    hi_i = m // 2

    def other_at(i: np.ndarray) -> np.ndarray:  # i-th smallest of the others (skip the row itself)
        j = i + (i >= pos)
        return sv[base + np.minimum(j, size - 1)]

    a, b = other_at(lo_i), other_at(hi_i)
    return a + (b - a) // 2


def _sorted_within(values: np.ndarray, first: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The stable order of ``values`` by (group, value), groups being the runs [first, first + n)
    that tile it: where every group has the same size (every rank at every sync point, most
    often), one small sort per row of a (groups x size) table, ~9x faster than the lexsort of
    both keys (544k arrivals at DEP32 x 1,000: 10 ms against 91 ms)."""
    k = int(n[0]) if n.size else 0
    if k and bool((n == k).all()) and int(first[0]) == 0 and first.size * k == values.size:
        order = np.argsort(values.reshape(first.size, k), axis=1, kind="stable")
        order += (np.arange(first.size, dtype=np.int64) * k)[:, None]
        return order.reshape(-1)
    return np.lexsort((values, np.repeat(np.arange(first.size), n)))


def _serving_start(rank: np.ndarray, t: np.ndarray, steps: pd.DataFrame | None) -> np.ndarray:
    """Per arrival: the start of its rank's first step, if the arrival comes after it (else the
    int64 minimum). Floors the window of a rank's first sync point: what a process did before
    its first step (imports, model load, process group set-up) is start-up, not serving work. A
    span file covers it, and its rank-to-rank spread (hundreds of ms on a loaded host, seconds
    of model loading on a real server) would otherwise count as the first window's own work."""
    out = np.full(rank.size, np.iinfo(np.int64).min, np.int64)
    if steps is None or not len(steps):
        return out
    first = steps.groupby("rank")["start_ns"].min()
    begin = pd.Series(rank).map(first).fillna(np.iinfo(np.int64).max).to_numpy(np.int64)
    after = t >= begin
    out[after] = begin[after]
    return out


def _step_of(rank: np.ndarray, t: np.ndarray, steps: pd.DataFrame | None) -> np.ndarray:
    """The step of each arrival: the rank's last step starting at or before it (NO_STEP if none).
    Each rank's steps in row order sorted by start as ``sort_values`` sorts them (quicksort: equal
    starts keep its order), on arrays (a pandas group and sort per rank cost ~1.5 ms a rank)."""
    out = np.full(rank.size, NO_STEP, np.int64)
    if steps is None or not len(steps):
        return out
    by_rank = np.argsort(rank, kind="stable")  # each rank's arrivals as one slice, not a mask per rank
    sorted_rank = rank[by_rank]
    s_rank = steps["rank"].to_numpy(np.int64)
    s_start = steps["start_ns"].to_numpy(np.int64)
    s_step = steps["step"].to_numpy(np.int64)
    rows_by_rank = np.argsort(s_rank, kind="stable")  # each rank's steps, in row order (as groupby keeps them)
    s_sorted = s_rank[rows_by_rank]
    for r in np.unique(s_sorted).tolist():
        m = by_rank[np.searchsorted(sorted_rank, r, "left"):np.searchsorted(sorted_rank, r, "right")]
        if not m.size:
            continue
        rows = rows_by_rank[np.searchsorted(s_sorted, r, "left"):np.searchsorted(s_sorted, r, "right")]
        rows = rows[np.argsort(s_start[rows], kind="quicksort")]
        j = np.searchsorted(s_start[rows], t[m], side="right") - 1
        out[m] = np.where(j >= 0, s_step[rows][np.maximum(j, 0)], NO_STEP)
    return out


def _empty() -> pd.DataFrame:
    out = pd.DataFrame({c: pd.Series(dtype="int64") for c in ARRIVAL_COLUMNS})
    for c in ("key", "coll_name", "source_kind"):
        out[c] = out[c].astype(object)
    out["is_last"] = out["is_last"].astype(bool)
    out["gpu_gated"] = out["gpu_gated"].astype(bool)
    return out
