"""The attribution engine of one rank: idle-for-attribution intervals, host layers, the
first-match-wins decision per piece (rules in ``profkit.analyze.overhead``'s docstring).

Columns are turned into numpy once for the whole capture (``EventArrays``: names factorized
and classified once, not per rank); a rank is a slice of those arrays. Causes are integer ids
into one ``Vocab`` until the final table, so merging pieces compares integers, not strings.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from profkit import distinct, schema
from profkit import intervals as iv
from profkit.analyze import overhead_host as host
from profkit.analyze import overhead_names as nm
from profkit.analyze import vocabulary as vc
from profkit.layers import (AT_BOUNDS_FROM, Layer, at_bounds, codes_at, covering, innermost, make_layer,
                            split_at)
from profkit.analyze.vocabulary import (
    BETWEEN_STEPS, CPU_OP, GC, HOST_SYNC, LAUNCH_BOUND, NO_HOST, PYTHON, SAMPLE, SELF, SPAN, UNATTRIBUTED, WAIT,
)
from profkit.names import is_comm_kernel

# categories of a charged interval and GPU states (the ``category`` / ``gpu_state`` columns): vocabulary
CATEGORIES = np.array(vc.CATEGORIES, dtype=object)
_CAT = {c: i for i, c in enumerate(CATEGORIES)}
IDLE, COMM_ONLY, LAUNCH_RUN = 0, 1, 2
STATES = np.array(vc.GPU_STATES, dtype=object)
_MIN = np.iinfo(np.int64).min


class Vocab:
    """Cause strings <-> int ids, shared by all ranks of one attribution."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self.names: list[str] = []

    def id(self, name: str) -> int:
        got = self._ids.get(name)
        if got is None:
            got = self._ids[name] = len(self.names)
            self.names.append(name)
        return got

    def ids(self, names) -> np.ndarray:
        return np.fromiter((self.id(str(n)) for n in names), dtype=np.int64, count=len(names))

    def array(self) -> np.ndarray:
        return np.array(self.names, dtype=object)


@dataclass
class EventArrays:
    """The event table as numpy arrays, sorted by rank (a rank is ``rows(rank)``)."""

    kind: np.ndarray  # int code into KINDS
    name: np.ndarray  # int code into the unique names
    start: np.ndarray
    end: np.ndarray
    thread: np.ndarray  # (pid, tid) key, see overhead_host.thread_keys
    corr: np.ndarray  # -1 = none
    coll: np.ndarray  # int code into coll_uniques, -1 = none
    rank_bounds: dict[int, tuple[int, int]]
    # per unique name
    cause_id: np.ndarray  # cause of the name itself (span / op / frame)
    sync_id: np.ndarray  # "host_sync (<name>)"
    container: np.ndarray
    gc: np.ndarray
    builtin: np.ndarray
    comm: np.ndarray  # communication kernel name
    comm_wait_id: np.ndarray  # "wait:<collective of the kernel>"
    kernel_launch: np.ndarray
    launch: np.ndarray
    sync: np.ndarray
    poll: np.ndarray
    coll_wait_id: np.ndarray  # per coll_uniques: "wait:<coll_name>"
    uniques: np.ndarray | None = None  # the unique names (``name`` codes index it)
    step_names: frozenset[str] = frozenset()  # the step spans ``container`` was decided with
    vocab: Vocab | None = None  # the vocabulary of the cause ids
    memo: dict = field(default_factory=dict)  # per rank, what does not depend on the windows (``_rank_host``)

    def with_step_names(self, step_names: frozenset[str]) -> "EventArrays":
        """The same arrays with ``container`` decided for other step spans (the only per-name
        fact that depends on them): one table's arrays serve attributions over other windows."""
        if step_names == self.step_names or self.uniques is None:
            return self
        return replace(self, container=nm.classify_names(self.uniques, step_names)["container"],
                       step_names=step_names)

    def factorized_names(self, events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
        """``pd.factorize(events["name"], use_na_sentinel=True)`` (codes, the distinct names as
        Python strings) from these arrays, where they were built from ``events`` of one rank (rows
        in order): the rank task's readers of the names take them instead of hashing ~10^5 names
        again. None otherwise."""
        if self.uniques is None or self.name.size != len(events):
            return None
        if len(self.rank_bounds) > 1 or any(b != (0, len(events)) for b in self.rank_bounds.values()):
            return None  # several ranks: the arrays are sorted by rank
        missing = self.uniques.size - 1  # ``_factorize`` appends "" for a missing name
        return np.where(self.name == missing, -1, self.name), self.uniques[:-1]

    @classmethod
    def build(cls, events: pd.DataFrame, step_names: frozenset[str], vocab: Vocab) -> "EventArrays":
        ranks = events["rank"].to_numpy(np.int64)
        in_order = ranks.size < 2 or bool((ranks[1:] >= ranks[:-1]).all())  # one rank: no rows to take
        order = np.arange(ranks.size) if in_order else np.argsort(ranks, kind="stable")
        ranks = ranks[order]
        present, first = np.unique(ranks, return_index=True)
        last = np.r_[first[1:], ranks.size]
        bounds = {int(r): (int(a), int(b)) for r, a, b in zip(present, first, last)}

        def col(name: str) -> pd.Series:
            return events[name].iloc[order] if order.size and not in_order else events[name]

        kind_codes = _codes(col("kind"), schema.KINDS)
        name_codes, uniques = _factorize(col("name"))
        coll_codes, coll_uniques = _factorize(col("coll_name"), missing=-1)
        info = nm.classify_names(uniques, step_names)
        flags = host.runtime_flags(uniques)
        comm = is_comm_kernel(pd.Series(uniques, dtype=object))
        return cls(
            kind=kind_codes,
            name=name_codes,
            start=col("start_ns").to_numpy(np.int64),
            end=col("end_ns").to_numpy(np.int64),
            thread=host.thread_keys(col("pid"), col("tid")),
            corr=col("correlation").fillna(-1).to_numpy(np.int64),
            coll=coll_codes,
            rank_bounds=bounds,
            cause_id=vocab.ids(info["cause"]),
            sync_id=vocab.ids([vc.host_sync_cause(c) for c in info["cause"]]),
            container=info["container"],
            gc=info["gc"],
            builtin=info["builtin"],
            comm=comm,
            comm_wait_id=vocab.ids([vc.wait_cause(nm.collective_of_kernel(u)) if c else ""
                                    for u, c in zip(uniques, comm)]),
            kernel_launch=flags["kernel_launch"],
            launch=flags["launch"],
            sync=flags["sync"],
            poll=flags["poll"],
            coll_wait_id=vocab.ids([vc.wait_cause(str(c)) for c in coll_uniques]),
            uniques=uniques,
            step_names=step_names,
            vocab=vocab,
        )

    def is_kind(self, rows: slice, *kinds: str) -> np.ndarray:
        codes = [schema.KINDS.index(k) for k in kinds]
        k = self.kind[rows]
        out = k == codes[0]
        for c in codes[1:]:  # a few comparisons: cheaper than np.isin over every row
            out |= k == c
        return out


def _codes(series: pd.Series, known: tuple[str, ...]) -> np.ndarray:
    codes, uniques = distinct.codes(series)
    lookup = np.array([known.index(u) if u in known else len(known) for u in uniques] + [len(known)], dtype=np.int64)
    return lookup[codes]


def _factorize(series: pd.Series, missing: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Codes and unique strings; nulls get code ``missing`` (default: an extra "" entry)."""
    codes, uniques = distinct.codes(series)  # shared with the rank task's other readers of the column
    if missing is None:
        uniques = np.append(uniques, "").astype(object)
        codes = np.where(codes < 0, uniques.size - 1, codes)
    else:
        codes = np.where(codes < 0, missing, codes)
    return codes, uniques


@dataclass
class RankCharges:
    """Merged charged intervals of one rank (cause / where are vocab ids; where -1 = none)."""

    step: np.ndarray
    start: np.ndarray
    end: np.ndarray
    cause: np.ndarray
    category: np.ndarray
    state: np.ndarray
    where: np.ndarray


def attribute_rank(ea: EventArrays, rank: int, ws: np.ndarray, we: np.ndarray, step_ids: np.ndarray,
                   vocab: Vocab, waits: Layer | None = None, marker_ends: np.ndarray | None = None,
                   gpu: bool = True) -> RankCharges | None:
    """Charge every idle-for-attribution piece of ``rank`` inside the windows [ws, we).

    ``waits``: the rank's sync intervals (``sync_table.wait_intervals``: arrival to release at
    each host-blocking collective), coded with their ``wait:<name>`` cause ids. ``marker_ends``:
    per window, where its step annotation ended (``steps.iteration_periods``): unnamed idle time
    after it is ``host work between steps``. ``gpu`` False: the GPU rows are left out (as if the
    table held none: every instant of the windows is idle, no communication kernel runs)."""
    a, b = ea.rank_bounds.get(rank, (0, 0))
    r = slice(a, b)
    if gpu:
        state_s, state_e, state = _idle_for_attribution(ea, r, ws, we)
    else:  # ``_idle_for_attribution`` without GPU rows: the windows, merged, all idle
        state_s, state_e = iv.union(ws, we)
        state = np.full(state_s.size, IDLE, np.int64)
    if state_s.size == 0:
        return None

    any_host, layers, gc_layer, (sync_s, sync_e), sync_layer = _rank_host(ea, rank)
    comm_layer = _comm_layer(ea, r) if gpu else make_layer(np.empty(0, np.int64), np.empty(0, np.int64),
                                                           np.empty(0, np.int64))
    wait_layer = waits if waits is not None else make_layer(np.empty(0, np.int64), np.empty(0, np.int64),
                                                            np.empty(0, np.int64))

    me = marker_ends if marker_ends is not None else we
    cuts = iv.unique_sorted(np.concatenate(
        [ws, we, np.clip(me, ws, we), sync_s, sync_e, gc_layer.starts, gc_layer.ends, comm_layer.starts, comm_layer.ends,
         wait_layer.starts, wait_layer.ends]
        + [x for group in layers.values() for layer in group for x in (layer.starts, layer.ends)]
    ))
    ps, pe, owner = split_at(state_s, state_e, cuts)
    pstate = state[owner]
    win = np.clip(np.searchsorted(ws, ps, side="right") - 1, 0, None)
    step = step_ids[win]
    t = ps

    d = _Decider(ps.size)
    comm_j = covering(comm_layer, t)
    coll_wait = codes_at(comm_layer, comm_j, vocab.id(vc.wait_cause("collective")))
    d.assign(pstate == COMM_ONLY, coll_wait, WAIT)
    in_sync = covering(wait_layer, t)  # the host is blocked in a collective: waiting, whatever span it is in
    d.assign(in_sync >= 0, codes_at(wait_layer, in_sync), WAIT)
    d.assign(covering(gc_layer, t) >= 0, vocab.id(vc.GC_CAUSE), GC)

    named_p = _group(layers["named_p"], t, innermost)
    beside = named_p < 0  # where a piece is under no span of the launching threads
    named_o = _group_at(layers["named_o"], t, np.flatnonzero(beside), innermost)  # the rest: below
    where = np.where(named_p >= 0, named_p, named_o)  # name code of the innermost named span
    where_id = np.where(where >= 0, ea.cause_id[np.maximum(where, 0)], -1)
    sync_label = np.where(where >= 0, ea.sync_id[np.maximum(where, 0)], vocab.id(vc.HOST_SYNC_CAUSE))
    d.assign(covering(sync_layer, t) >= 0, sync_label, HOST_SYNC)
    d.assign(pstate == LAUNCH_RUN, vocab.id(vc.LAUNCH_BOUND_CAUSE), LAUNCH_BOUND)

    def named(code: np.ndarray) -> None:
        c = np.maximum(code, 0)
        ok = (code >= 0) & ~ea.container[c]
        d.assign(ok & ea.gc[c], vocab.id(vc.GC_CAUSE), GC)
        d.assign(ok, ea.cause_id[c], SPAN)

    def deeper(suffix: str) -> None:
        """Ops, frames, samples: asked only at the pieces no earlier rule charged (the rest would
        be ignored; under named spans few are left: 0.8% on a CPU engine capture)."""
        rules = (("op", CPU_OP, covering), ("py", PYTHON, innermost), ("sample", SAMPLE, innermost))
        for key, category, query in rules:
            at = np.flatnonzero(d.open)
            if not at.size:
                return
            code = _group_at(layers[f"{key}_{suffix}"], t, at, query)
            d.assign(code >= 0, ea.cause_id[np.maximum(code, 0)], category)

    named(named_p)
    deeper("p")
    later = np.flatnonzero(d.open & ~beside)  # under a launching thread's span, still uncharged
    if later.size:
        named_o[later] = _group(layers["named_o"], t[later], innermost)
    named(named_o)
    deeper("o")
    for code in (named_p, named_o):  # the step-level span's self time
        d.assign(code >= 0, ea.cause_id[np.maximum(code, 0)], SELF)
    d.assign(t >= me[win], vocab.id(vc.BETWEEN_STEPS_CAUSE), BETWEEN_STEPS)
    if any_host:
        d.assign(np.ones(ps.size, bool), vocab.id(vc.UNATTRIBUTED_CAUSE), UNATTRIBUTED)
    else:
        d.assign(np.ones(ps.size, bool), vocab.id(vc.NO_HOST_CAUSE), NO_HOST)
    return _merge(step, ps, pe, d.cause, d.category, pstate, where_id)


def _rank_host(ea: EventArrays, rank: int) -> tuple[bool, dict[str, list[Layer]], Layer, iv.Intervals, Layer]:
    """The rank's host side, whatever the windows: whether it has host events, the span / op /
    frame layers per thread group, the GC pauses of its launching processes and its syncs on the
    GPU (intervals and layer). Kept in ``ea.memo``: the causes and the timeline pieces attribute
    one rank's events over two window sets."""
    got = ea.memo.get(("host", rank))
    if got is not None:
        return got
    a, b = ea.rank_bounds.get(rank, (0, 0))
    r = slice(a, b)
    starts, ends, names, threads = ea.start[r], ea.end[r], ea.name[r], ea.thread[r]
    hosty = ea.is_kind(r, schema.CPU_SPAN, schema.CPU_OP, schema.PYTHON, schema.SAMPLE, schema.GC, schema.RUNTIME)
    is_rt = ea.is_kind(r, schema.RUNTIME)
    launching = host.launching_threads(is_rt & ea.launch[names], threads)
    host_threads = [int(t) for t in pd.unique(threads[hosty])]
    primary = launching or host_threads
    others = [t for t in host_threads if t not in set(primary)]

    layers = _host_layers(ea, r, primary, others)
    gc_mask = (ea.is_kind(r, schema.GC) | (ea.is_kind(r, schema.CPU_SPAN) & ea.gc[names]))
    gc_mask &= np.isin(threads >> 32, list({t >> 32 for t in primary}))
    gc_layer = make_layer(starts[gc_mask], ends[gc_mask], np.zeros(int(gc_mask.sum()), np.int64))
    rt = is_rt & np.isin(threads, primary)
    sync_s, sync_e = host.sync_intervals(rt & ea.sync[names], rt & ea.poll[names], starts, ends)
    sync_layer = make_layer(sync_s, sync_e, np.zeros(sync_s.size, np.int64))
    got = ea.memo[("host", rank)] = (bool(hosty.any()), layers, gc_layer, (sync_s, sync_e), sync_layer)
    return got


def _idle_for_attribution(ea: EventArrays, r: slice, ws: np.ndarray, we: np.ndarray):
    """Disjoint, sorted intervals inside the windows, each with a GPU state (IDLE: nothing runs;
    COMM_ONLY: only communication kernels; LAUNCH_RUN: a launch-bound run, idle and tiny kernels)."""
    starts, ends, names = ea.start[r], ea.end[r], ea.name[r]
    is_gpu = ea.is_kind(r, *schema.GPU_KINDS)
    is_comm = ea.is_kind(r, schema.KERNEL) & ea.comm[names]
    compute_mask = is_gpu & ~is_comm
    big_mask = compute_mask & ((ends - starts) > host.TINY_KERNEL_MAX_NS)
    busy = iv.union(starts[is_gpu], ends[is_gpu])
    compute = iv.union(starts[compute_mask], ends[compute_mask])
    comm = iv.union(starts[is_comm], ends[is_comm])
    big = iv.union(starts[big_mask], ends[big_mask])
    windows = iv.union(ws, we)
    comm_only = iv.intersect(iv.subtract(comm, compute), windows)
    launch = iv.subtract(iv.subtract(iv.intersect(_launch_runs(ea, r, is_comm), windows), big), comm)
    idle = iv.subtract(iv.subtract(windows, busy), launch)
    s = np.concatenate([idle[0], comm_only[0], launch[0]])
    e = np.concatenate([idle[1], comm_only[1], launch[1]])
    st = np.repeat(np.array([IDLE, COMM_ONLY, LAUNCH_RUN], np.int64), [idle[0].size, comm_only[0].size, launch[0].size])
    order = np.argsort(s, kind="stable")
    return s[order], e[order], st[order]


def _launch_runs(ea: EventArrays, r: slice, is_comm: np.ndarray) -> iv.Intervals:
    """Launch-bound runs on every thread (kernel launches joined to their kernels by correlation;
    a graph replay, one launch with many kernels, is never a run)."""
    names, corr = ea.name[r], ea.corr[r]
    is_launch = ea.is_kind(r, schema.RUNTIME) & ea.kernel_launch[names] & (corr >= 0)
    is_kernel = ea.is_kind(r, schema.KERNEL) & ~is_comm & (corr >= 0)
    if is_launch.sum() < host.RUN_MIN_LAUNCHES or not is_kernel.any():
        return iv.empty()
    return host.launch_runs_by_thread(corr[is_kernel], ea.start[r][is_kernel], ea.end[r][is_kernel],
                                      corr[is_launch], ea.start[r][is_launch], ea.thread[r][is_launch])


def _host_layers(ea: EventArrays, r: slice, primary: list[int], others: list[int]) -> dict[str, list[Layer]]:
    """Per thread group (p: launching threads, o: the others) and kind: one nested layer per thread."""
    names, threads = ea.name[r], ea.thread[r]
    masks = {
        "named": ea.is_kind(r, schema.CPU_SPAN, schema.GC),
        "op": ea.is_kind(r, schema.CPU_OP),
        "py": ea.is_kind(r, schema.PYTHON) & ~ea.builtin[names],
        "sample": ea.is_kind(r, schema.SAMPLE) & ~ea.builtin[names],
    }
    any_mask = masks["named"] | masks["op"] | masks["py"] | masks["sample"]
    rows = np.flatnonzero(any_mask)
    by_thread = pd.Series(rows).groupby(threads[rows]).indices if rows.size else {}
    out: dict[str, list[Layer]] = {f"{k}_{s}": [] for k in masks for s in "po"}
    for suffix, group in (("p", primary), ("o", others)):
        for thread in group:
            idx = by_thread.get(thread)
            if idx is None:
                continue
            sel = rows[idx]
            for key, mask in masks.items():
                m = sel[mask[sel]]
                if m.size:
                    out[f"{key}_{suffix}"].append(make_layer(ea.start[r][m], ea.end[r][m], names[m]))
    return out


def _comm_layer(ea: EventArrays, r: slice) -> Layer:
    """Communication kernels, coded with their "wait:<collective>" cause id (coll_name, else the
    collective read from the kernel name)."""
    names = ea.name[r]
    m = ea.is_kind(r, schema.KERNEL) & ea.comm[names]
    coll = ea.coll[r][m]
    by_kernel = ea.comm_wait_id[names[m]]
    codes = np.where(coll >= 0, ea.coll_wait_id[np.maximum(coll, 0)], by_kernel) if coll.size else by_kernel
    return make_layer(ea.start[r][m], ea.end[r][m], codes)


def _group_at(layers: list[Layer], t: np.ndarray, at: np.ndarray, query) -> np.ndarray:
    """``_group`` at the positions ``at`` of ``t``, -1 at the others: where the caller reads
    the answers only there (the pieces not charged yet), the others are not asked."""
    code = np.full(t.size, -1, np.int64)
    if at.size:
        code[at] = _group(layers, t[at], query)
    return code


def _group(layers: list[Layer], t: np.ndarray, query) -> np.ndarray:
    """Answer of a thread group: per time, the code of the interval begun last across threads.

    Where the times are many times the threads' intervals (a 4-rank CPU engine capture of 380
    steps: ~427k pieces against five launching threads' ~10k spans per rank), the group is asked
    at the threads' starts and ends only, and each time reads the answer of the last one at or
    before it: between two of them no thread's answer changes."""
    if len(layers) == 1:
        return codes_at(layers[0], query(layers[0], t))
    total = sum(layer.size for layer in layers)
    if total and t.size > AT_BOUNDS_FROM * total:
        # every thread's answer changes only at its own starts and ends: answer at all of them
        # (each thread searched once per bound, not once per time), each time reads its bound's
        bounds = iv.unique_sorted(np.concatenate([layer.bounds for layer in layers if layer.size]))
        return at_bounds(bounds, t, lambda b: _group_each(layers, b, query))
    return _group_each(layers, t, query)


def _group_each(layers: list[Layer], t: np.ndarray, query) -> np.ndarray:
    """``_group`` by asking every thread about the times: each only between its first start and
    its last end (where ``t`` is sorted, as the pieces' starts are: a slice), the only times it can
    answer, and only its answers written."""
    code = np.full(t.size, -1, np.int64)
    best = np.full(t.size, _MIN, np.int64)
    ordered = t.size < 2 or bool((t[1:] >= t[:-1]).all())
    for layer in layers:
        if layer.size == 0:
            continue
        a, b = 0, t.size
        if ordered:  # no interval of the layer holds a time before its first start or from its last end on
            a, b = np.searchsorted(t, [layer.starts[0], layer.reach[0][-1]], side="left")
        j = query(layer, t[a:b])
        hit = np.flatnonzero(j >= 0)
        if not hit.size:
            continue
        j = j[hit]
        st = layer.starts[j]
        at = hit + a
        better = st > best[at]
        at = at[better]
        code[at] = layer.codes[j[better]]
        best[at] = st[better]
    return code


class _Decider:
    """First match wins: each assign() only fills pieces no earlier rule has charged."""

    def __init__(self, n: int):
        self.cause = np.full(n, -1, np.int64)
        self.category = np.full(n, -1, np.int64)
        self.open = np.ones(n, dtype=bool)

    def assign(self, mask: np.ndarray, cause, category: str) -> None:
        m = mask & self.open
        if not m.any():
            return
        self.cause[m] = cause[m] if isinstance(cause, np.ndarray) else cause
        self.category[m] = _CAT[category]
        self.open &= ~m


def _merge(step, ps, pe, cause, category, state, where) -> RankCharges:
    """Join touching pieces of one step that share cause, category, GPU state and context."""
    same = pe[:-1] == ps[1:]
    for k in (step, cause, category, state, where):
        same &= k[:-1] == k[1:]
    first = np.flatnonzero(np.r_[True, ~same])
    last = np.r_[first[1:] - 1, ps.size - 1]
    return RankCharges(step[first], ps[first], pe[last], cause[first], category[first], state[first], where[first])
