"""What a rank did between its previous sync point and its arrival, phase by phase.

Lateness is compared on the HOST timeline first: in a host-bound DEP deployment a rank arrives
late because its host (scheduler, GC, input preparation, launches) ran longer than its peers'
since the last moment all hosts were synchronized. Each instant of a rank's traced extent gets
one phase, from the critical-path point of view of its launching threads:

1. inside a launch-bound run of tiny kernels: ``launch_bound`` (found as the overhead
   attribution finds them, ``overhead_host.launch_runs``);
2. the host blocked on the GPU (a synchronize, a blocking copy, event polling, or a copy call
   longer than ``BLOCKING_COPY_NS``: ``cudaMemcpyAsync`` to pageable memory blocks): what the GPU
   was doing then: ``gpu:<kernel>`` while compute runs (a GPU-side cause, e.g. hot experts),
   ``wait:<collective>`` while only communication runs (waiting for other ranks: a victim),
   else ``host_sync (<span>)`` (the sync itself, e.g. an injected stall);
3. otherwise the host activity the overhead attribution names (``overhead.attribute_gaps`` with
   the GPU left out, so GPU-busy time is named too): ``gc``, the innermost span
   (``Scheduler.schedule``), a step span's self time (``EngineCore.step``), time blocked in a
   host-blocking collective as ``wait:<name>`` (from the rank's arrival to its release,
   ``collectives.syncpoints``: a victim phase whatever span it sits in), ``unattributed (no host activity)``.

The GPU timeline gets its own pieces (``gpu_pieces``): compute-busy time named ``gpu:<kernel>``
after the kernel running, for arrivals the GPU set (a kernel that waited in the stream queue).

Phase time is summed per window and compared with the median of the other participants' time in
the same phase and the same window (a peer without the phase counts 0). Waits are victim time
and are never a cause (``is_victim_phase``).

Why the host and not the GPU-idle view of ``causes.csv``: while a straggler's GPU idles waiting
for its late host, its peers' GPUs wait inside the collective; charging only GPU-idle time would
hand the straggler's ordinary launch work (the peers' matching idle being "wait") as excess.
The host's own work is the same on every rank unless something is really slower.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

from profkit import distinct, schema
from profkit import intervals as iv
from profkit.analyze import overhead as ov
from profkit.analyze import overhead_host as host_mod
from profkit.analyze import vocabulary as vc
from profkit.distinct import strings_at
from profkit.layers import covering, make_layer, split_at
from profkit.names import is_comm_kernel, kernel_short_name

if TYPE_CHECKING:
    from profkit.analyze.overhead_rank import EventArrays

GPU_PREFIX = "gpu:"
WAIT_PREFIXES = vc.VICTIM_PREFIXES
GPU_CATEGORY = vc.GPU_CATEGORY
PIECE_COLUMNS = ["rank", "start_ns", "end_ns", "phase", "category"]
WINDOW_COLUMNS = ["window", "rank", "start_ns", "end_ns"]
BLOCKING_COPY_NS = 50_000  # a copy call this long blocked the host (async copies return in ~10 us)
PHASE_COLUMNS = ["window", "rank", "phase", "category", "ns"]
EXCESS_COLUMNS = ["window", "rank", "phase", "category", "ns", "peer_ns", "excess_ns"]
# the columns each step reads: a rank's events are ~16 Arrow columns, and filtering rows of all
# of them (one Arrow take per column) costs more than the analysis of the rows kept
GPU_ROW_COLUMNS = ("rank", "kind", "name", "coll_name", "pid", "correlation", "start_ns", "end_ns")


def is_victim_phase(phase: str, category: str | None = None) -> bool:
    """Time spent waiting for other ranks: never the cause of one's own lateness."""
    return category == ov.WAIT or str(phase).startswith(WAIT_PREFIXES)


def kernel_label(name: str) -> str:
    """``gpu:`` + the kernel's short name (no ``void``, namespaces, templates or arguments)."""
    return GPU_PREFIX + (kernel_short_name(str(name)).strip() or "kernel")


# ---- labelling -----------------------------------------------------------------------------
def timeline_pieces(events: pd.DataFrame, extents: pd.DataFrame, sync_waits: pd.DataFrame | None = None,
                    steps: pd.DataFrame | None = None, arrays=None,
                    gpu: pd.DataFrame | None = None, coded: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Host pieces (``labelled_pieces``) and GPU pieces (``gpu_pieces``) of every rank.
    ``arrays``: ``overhead.event_arrays(events)`` and ``gpu``: ``gpu_rows(events)``, when the
    caller has them (the rank task shares them with the causes and the replay's GPU ops).
    ``coded``: one rank's pieces, their ``phase`` and ``category`` as ``distinct.coded``
    Categoricals, for the store (``PIECE_TEXT``); several ranks' are text columns whatever it says."""
    if events is None or not len(events) or not len(extents):
        return _empty_pieces(), _empty_pieces()
    g = _GpuArrays.build(gpu if gpu is not None else gpu_rows(events))
    return labelled_pieces(events, extents, g, sync_waits, steps, arrays, coded), gpu_pieces(g, coded)


def gpu_rows(events: pd.DataFrame, arrays: "EventArrays | None" = None) -> pd.DataFrame:
    """The GPU rows (kernels, copies, memsets), only the columns the GPU pieces and
    ``impact_program.gpu_ops`` read: taken once for both (rows of string columns are the slow part).

    ``arrays``: ``overhead.event_arrays(events)``, when the caller has them: the kernel names are
    then a categorical of the names the arrays factorized already (the same values; a rank's
    ~10^5 kernel names are neither copied nor hashed again by each reader)."""
    mask = distinct.isin(events["kind"], schema.GPU_KINDS)
    named = arrays.factorized_names(events) if arrays is not None and "name" in events else None
    codes = named[0][mask] if named is not None else None
    categories = pd.Index(named[1], dtype=object) if named is not None else None
    if codes is None or (codes < 0).any() or not categories.is_unique:  # a row without a name, or
        return _rows(events, mask, GPU_ROW_COLUMNS)  # names that are not all distinct strings: as they are
    out = _rows(events, mask, tuple(c for c in GPU_ROW_COLUMNS if c != "name"))
    names = pd.Categorical.from_codes(codes, categories=categories)
    out.insert(GPU_ROW_COLUMNS.index("name"), "name", pd.Series(names, index=out.index))
    return out


def _rows(events: pd.DataFrame, mask: np.ndarray, columns: tuple[str, ...]) -> pd.DataFrame:
    """The rows of ``mask``, only ``columns`` (those present)."""
    return events.loc[mask, [c for c in columns if c in events.columns]]


def _match_flags(names: pd.Series, regex) -> np.ndarray:
    """``regex.match`` of each name (False for a missing one), tested once per distinct name."""
    codes, uniques = pd.factorize(names, use_na_sentinel=True)
    flags = np.array([bool(regex.match(str(u))) for u in uniques] + [False], dtype=bool)
    return flags[np.asarray(codes, np.int64)]


def _factorize_str(names: pd.Series) -> tuple[np.ndarray, object]:
    """``pd.factorize(names.astype(str))``: a column of strings without nulls is factorized as it
    is (same codes and values; ``astype(str)`` would copy every row's string first)."""
    dtype = names.dtype
    if isinstance(dtype, pd.CategoricalDtype) and not names.hasnans:  # ``gpu_rows`` from the arrays' codes
        return pd.factorize(names)
    strings = (isinstance(dtype, pd.ArrowDtype) and pa.types.is_string(dtype.pyarrow_dtype)) or (
        isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow")
    if strings and not names.hasnans:
        return pd.factorize(names)
    return pd.factorize(names.astype(str))


def gpu_pieces(g: "_GpuArrays", coded: bool = False) -> pd.DataFrame:
    """The GPU timeline of each rank: compute-busy time (not communication) cut where kernels
    start and end, each piece named ``gpu:<kernel>`` after the kernel running there."""
    parts = []
    for rank, r in ((rk, g.of(rk)) for rk in g.bounds):
        keep = ~g.comm[r]
        s, e = g.start[r][keep], g.end[r][keep]
        if not s.size:
            continue
        layer = g.compute_layer(rank)
        busy = iv.union(s, e)
        ps, pe, _ = split_at(busy[0], busy[1], iv.unique_sorted(np.concatenate([layer.starts, layer.ends])))
        j = covering(layer, ps)
        ok = (j >= 0) & (pe > ps)
        parts.append(_merge_labels(rank, ps[ok], pe[ok], layer.codes[j[ok]], g.vocab, coded))
    return _joined_pieces(parts)


def labelled_pieces(events: pd.DataFrame, extents: pd.DataFrame, gpu_arrays: "_GpuArrays | None" = None,
                    sync_waits: pd.DataFrame | None = None, steps: pd.DataFrame | None = None,
                    arrays=None, coded: bool = False) -> pd.DataFrame:
    """Disjoint phase pieces per rank over ``extents`` (``rank, trace_start_ns, trace_end_ns``):
    ``PIECE_COLUMNS``, sorted by rank and start (see the module docstring for the rules).
    ``sync_waits``: the host-blocking collectives (``sync_table.wait_intervals``; found in
    ``events`` when None): time blocked in one is a wait, a victim phase, whatever span it is in.
    ``steps``: where a step annotation ends before its step does (``steps.iteration_periods``),
    unnamed host time after it is ``host work between steps``, as in ``causes.csv``.
    ``arrays``: ``overhead.event_arrays(events)`` when already built."""
    if events is None or not len(events) or not len(extents):
        return _empty_pieces()
    windows = _tiled_windows(extents, steps)
    if sync_waits is None:
        sync_waits = ov.sync_wait_intervals(events)  # from all events: GPU collectives are not host-blocking
    if arrays is None:
        arrays = ov.event_arrays(events)
    host = ov.attribute_coded(events, windows, sync_waits, arrays=arrays, with_gpu=False)  # GPU left out
    gpu_ev = gpu_arrays if gpu_arrays is not None else _GpuArrays.build(gpu_rows(events))
    runs = _launch_runs_coded(arrays, gpu_ev) if _correlations_unsigned(events) else _launch_runs(events, gpu_ev)
    copies = _blocking_copies_coded(arrays)
    parts = []
    if host is not None:
        charges, vocab = host
        causes = vocab.array()
        for r, h in charges:
            parts.append(_rank_pieces(r, h, causes, runs.get(r, iv.empty()), copies.get(r, iv.empty()), gpu_ev, coded))
    return _joined_pieces(parts)


PIECE_TEXT = ("phase", "category")  # the pieces' text columns (Categoricals where ``coded``)


def _joined_pieces(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The ranks' pieces one after the other; coded ones (``distinct.coded``) stay coded only
    alone: each rank names its own phases, so several ranks' are made text columns first."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return _empty_pieces()
    if len(parts) > 1:
        parts = [p.assign(**{c: distinct.from_coded(p[c]) for c in PIECE_TEXT
                             if isinstance(p[c].dtype, pd.CategoricalDtype)}) for p in parts]
    elif isinstance(parts[0].index, pd.RangeIndex) and parts[0].index.start == 0 and parts[0].index.step == 1:
        one = parts[0]  # one rank's (the rank task's): the frame itself, not a copy of it
        return one if list(one.columns) == PIECE_COLUMNS else one[PIECE_COLUMNS]
    return pd.concat(parts, ignore_index=True)[PIECE_COLUMNS]


class _GpuArrays:
    """GPU activity as numpy, sorted by rank: compute ops coded by their ``gpu:`` label, and
    communication kernels."""

    def __init__(self, rank, start, end, code, comm, corr, vocab):
        self.rank, self.start, self.end, self.code, self.comm, self.vocab = rank, start, end, code, comm, vocab
        self.corr = corr
        self._compute: dict[int, object] = {}
        present, first = np.unique(rank, return_index=True)
        last = np.r_[first[1:], rank.size]
        self.bounds = {int(r): (int(a), int(b)) for r, a, b in zip(present, first, last)}

    @classmethod
    def build(cls, g: pd.DataFrame) -> "_GpuArrays":
        rank = g["rank"].to_numpy(np.int64)
        order = np.argsort(rank, kind="stable")
        codes, uniques = _factorize_str(g["name"])  # each distinct name tested and labelled once
        comm = np.zeros(len(g), bool)
        is_k = (g["kind"] == schema.KERNEL).to_numpy(dtype=bool)
        if is_k.any():
            comm_u = is_comm_kernel(pd.Series(uniques, dtype=object))
            comm[is_k] = comm_u[np.asarray(codes, np.int64)[is_k]] | g["coll_name"].notna().to_numpy(bool)[is_k]
        labels = np.array([kernel_label(u) for u in uniques], dtype=object)
        vocab, label_code = np.unique(labels, return_inverse=True) if labels.size else (labels, np.empty(0, np.int64))
        code = label_code[codes] if codes.size else np.empty(0, np.int64)
        corr = g["correlation"].fillna(-1).to_numpy(np.int64) if len(g) else np.empty(0, np.int64)
        return cls(rank[order], g["start_ns"].to_numpy(np.int64)[order], g["end_ns"].to_numpy(np.int64)[order],
                   np.asarray(code, np.int64)[order], comm[order], corr[order], vocab)

    def of(self, rank: int) -> slice:
        a, b = self.bounds.get(rank, (0, 0))
        return slice(a, b)

    def compute_layer(self, rank: int):
        """The rank's compute ops (not communication) as a layer coded by label: built once for
        the host pieces and the GPU pieces (its nesting over ~10^5 kernels is the costly part)."""
        got = self._compute.get(rank)
        if got is None:
            r = self.of(rank)
            keep = ~self.comm[r]
            got = self._compute[rank] = make_layer(self.start[r][keep], self.end[r][keep], self.code[r][keep])
        return got


def _launch_runs(events: pd.DataFrame, g: "_GpuArrays") -> dict[int, iv.Intervals]:
    """Launch-bound runs per rank, as the overhead attribution finds them (kernel launches joined
    to their single kernel by correlation, ``overhead_host.launch_runs`` per launching thread),
    minus the time non-tiny compute kernels and communication kernels run."""
    rt = _rows(events, distinct.isin(events["kind"], (schema.RUNTIME,))
               & events["correlation"].notna().to_numpy(dtype=bool), ("rank", "name", "pid", "tid", "correlation", "start_ns"))
    if not len(rt) or not g.rank.size:
        return {}
    rt = rt[_match_flags(rt["name"], host_mod.KERNEL_LAUNCH_RE)]
    if len(rt) < host_mod.RUN_MIN_LAUNCHES:
        return {}
    thread = host_mod.thread_keys(rt["pid"], rt["tid"])
    lr, lc, ls = rt["rank"].to_numpy(np.int64), rt["correlation"].to_numpy(np.int64), rt["start_ns"].to_numpy(np.int64)
    out: dict[int, iv.Intervals] = {}
    for rank in np.unique(lr):
        m = lr == rank
        if m.sum() < host_mod.RUN_MIN_LAUNCHES:
            continue
        runs = _rank_runs(g, int(rank), lc[m], ls[m], thread[m])
        if runs is not None:
            out[int(rank)] = runs
    return out


def _rank_runs(g: "_GpuArrays", rank: int, corr: np.ndarray, start: np.ndarray, thread: np.ndarray
               ) -> iv.Intervals | None:
    """One rank's launch-bound runs from its kernel launches (correlation, start, launching
    thread), minus the time its non-tiny compute and its communication kernels run (None: no run)."""
    r = g.of(rank)
    k_ok = ~g.comm[r] & (g.corr[r] >= 0)
    runs = host_mod.launch_runs_by_thread(g.corr[r][k_ok], g.start[r][k_ok], g.end[r][k_ok], corr, start, thread)
    if not runs[0].size:
        return None
    gs, ge, comm = g.start[r], g.end[r], g.comm[r]
    big = (~comm) & ((ge - gs) > host_mod.TINY_KERNEL_MAX_NS)
    return iv.subtract(iv.subtract(runs, iv.union(gs[big], ge[big])), iv.union(gs[comm], ge[comm]))


def _correlations_unsigned(events: pd.DataFrame) -> bool:
    """No negative correlation id: ``EventArrays.corr`` (-1 for none) tells a missing one apart."""
    corr = events["correlation"]
    return not len(corr) or corr.isna().all() or int(corr.min()) >= 0


def _name_flags(uniques: np.ndarray, regex) -> np.ndarray:
    """``regex.match`` of each of ``EventArrays.uniques`` (its "" for a missing name never matches
    these patterns, as ``_match_flags`` leaves a missing name False)."""
    return distinct.regex_flags([str(u) for u in uniques], np.arange(len(uniques)), regex)


def _launch_runs_coded(ea, g: "_GpuArrays") -> dict[int, iv.Intervals]:
    """``_launch_runs`` from the attribution's arrays (``overhead.event_arrays``): no rows of the
    event table's string columns taken. Needs correlation ids >= 0 (-1 there means none)."""
    if not g.rank.size or ea.uniques is None:
        return {}
    kernel_launch = _name_flags(ea.uniques, host_mod.KERNEL_LAUNCH_RE)
    out: dict[int, iv.Intervals] = {}
    for rank in sorted(ea.rank_bounds):
        a, b = ea.rank_bounds[rank]
        rows = slice(a, b)
        corr = ea.corr[rows]
        launch = ea.is_kind(rows, schema.RUNTIME) & (corr >= 0) & kernel_launch[ea.name[rows]]
        if int(launch.sum()) < host_mod.RUN_MIN_LAUNCHES:
            continue
        runs = _rank_runs(g, int(rank), corr[launch], ea.start[rows][launch], ea.thread[rows][launch])
        if runs is not None:
            out[int(rank)] = runs
    return out


def _blocking_copies_coded(ea) -> dict[int, iv.Intervals]:
    """``_blocking_copies`` from the attribution's arrays (``overhead.event_arrays``)."""
    if ea.uniques is None:
        return {}
    copy = _name_flags(ea.uniques, host_mod.COPY_LAUNCH_RE)
    out: dict[int, iv.Intervals] = {}
    for rank, (a, b) in ea.rank_bounds.items():
        rows = slice(a, b)
        s, e = ea.start[rows], ea.end[rows]
        m = ea.is_kind(rows, schema.RUNTIME) & ((e - s) >= BLOCKING_COPY_NS) & copy[ea.name[rows]]
        if m.any():
            out[int(rank)] = iv.union(s[m], e[m])
    return out


def _blocking_copies(events: pd.DataFrame) -> dict[int, iv.Intervals]:
    """Copy calls long enough to have blocked the host (``cudaMemcpyAsync`` to pageable memory,
    ``.item()``/``.tolist()``: the call returns when the GPU got there), per rank."""
    rt = _rows(events, distinct.isin(events["kind"], (schema.RUNTIME,)), ("rank", "name", "start_ns", "end_ns"))
    if not len(rt):
        return {}
    dur = (rt["end_ns"] - rt["start_ns"]).to_numpy(np.int64)
    rt = rt[dur >= BLOCKING_COPY_NS]
    if not len(rt):
        return {}
    rt = rt[_match_flags(rt["name"], host_mod.COPY_LAUNCH_RE)]
    return {int(r): iv.union(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
            for r, g in rt.groupby("rank", sort=False)}


def _rank_pieces(rank: int, host, causes: np.ndarray, run_iv: iv.Intervals, copy_iv: iv.Intervals,
                 g: _GpuArrays, coded: bool = False) -> pd.DataFrame:
    """One rank's host pieces (``overhead.attribute_coded``'s charges of the rank: ``host``, cause
    ids naming ``causes``, never without a cause or category), cut and relabelled where the host
    ran launch-bound or was blocked on its GPU. Phases and categories are integer codes of one
    vocabulary (each name one code) until the frame is made: pieces are compared and merged as
    integers, and each new name is spelled once."""
    hs, he = np.asarray(host.start, np.int64), np.asarray(host.end, np.int64)
    names = [str(n) for n in causes]
    ids = {n: i for i, n in enumerate(names)}

    def code(name: str) -> int:
        if name not in ids:
            ids[name] = len(names)
            names.append(name)
        return ids[name]

    phase = np.asarray(host.cause, np.int64)
    cat = np.array([code(str(n)) for n in ov.per_rank.CATEGORIES], np.int64)[np.asarray(host.category, np.int64)]
    r = g.of(rank)
    gs, ge, comm = g.start[r], g.end[r], g.comm[r]
    compute = g.compute_layer(rank)
    comm_iv = iv.union(gs[comm], ge[comm])
    cuts = iv.unique_sorted(np.concatenate([run_iv[0], run_iv[1], copy_iv[0], copy_iv[1], compute.starts, compute.ends,
                                     comm_iv[0], comm_iv[1]]))
    ps, pe, owner = split_at(hs, he, cuts)
    ph, ct = phase[owner].copy(), cat[owner].copy()
    in_run = _inside(run_iv, ps)
    ph[in_run], ct[in_run] = code(ov.LAUNCH_BOUND), code(ov.LAUNCH_BOUND)
    blocked = _inside(copy_iv, ps) & ~in_run & (ct != code(ov.GC))
    sync = ((ct == code(ov.HOST_SYNC)) | blocked) & ~in_run
    if sync.any():
        j = covering(compute, ps)
        busy = sync & (j >= 0)
        labels = np.array([code(str(x)) for x in g.vocab], np.int64)
        ph[busy] = labels[compute.codes[j[busy]]]
        ct[busy] = code(GPU_CATEGORY)
        waiting = sync & ~busy & _inside(comm_iv, ps)
        ph[waiting] = code(vc.HOST_SYNC_WAIT)
        ct[waiting] = code(ov.WAIT)
        copy_idle = blocked & ~busy & ~waiting & (ct != code(ov.HOST_SYNC))
        if copy_idle.any():  # "host_sync (<phase>)", spelled once per distinct phase
            was, inv = np.unique(ph[copy_idle], return_inverse=True)
            ph[copy_idle] = np.array([code(f"{ov.HOST_SYNC} ({names[c]})") for c in was], np.int64)[inv.reshape(-1)]
        ct[copy_idle] = code(ov.HOST_SYNC)
    return _merge_codes(rank, ps, pe, ph, ct, np.array(names, dtype=object), coded)


def _merge_codes(rank: int, ps, pe, ph, ct, names: np.ndarray, coded: bool = False) -> pd.DataFrame:
    """``_merge`` of pieces whose phase and category are codes into ``names`` (distinct);
    ``coded``: the columns as ``distinct.coded`` Categoricals, not strings."""
    if not ps.size:
        return _empty_pieces()
    order = np.argsort(ps, kind="stable")
    ps, pe, ph, ct = ps[order], pe[order], ph[order], ct[order]
    same = (pe[:-1] == ps[1:]) & (ph[:-1] == ph[1:]) & (ct[:-1] == ct[1:])
    first = np.flatnonzero(np.r_[True, ~same])
    last = np.r_[first[1:] - 1, ps.size - 1]
    text = distinct.coded if coded else strings_at
    return pd.DataFrame({"rank": np.int64(rank), "start_ns": ps[first], "end_ns": pe[last],
                         "phase": text(names, ph[first]), "category": text(names, ct[first])})


def _tiled_windows(extents: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """Each rank's traced extent as one window, or, where step annotations end before their
    steps, cut at the steps so each keeps its annotation's end (``marker_end_ns``)."""
    base = pd.DataFrame({"rank": extents["rank"].to_numpy(np.int64), "step": np.int64(-1),
                         "start_ns": extents["trace_start_ns"].to_numpy(np.int64),
                         "end_ns": extents["trace_end_ns"].to_numpy(np.int64)}, index=extents.index)
    if steps is None or not len(steps) or "marker_end_ns" not in steps:
        return base
    short = steps["marker_end_ns"].to_numpy(np.int64) < steps["end_ns"].to_numpy(np.int64)
    if not short.any():
        return base
    by_rank = {int(r): g.sort_values("start_ns") for r, g in steps[short].groupby("rank")}
    rows = []
    for rank, lo, hi in zip(base["rank"], base["start_ns"], base["end_ns"]):
        cursor = int(lo)
        g = by_rank.get(int(rank))
        if g is not None:
            for s, e, me in zip(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64),
                                g["marker_end_ns"].to_numpy(np.int64)):
                s, e = max(int(s), cursor), min(int(e), int(hi))
                if e <= s:
                    continue
                if s > cursor:
                    rows.append((rank, cursor, s, s))
                rows.append((rank, s, e, min(max(int(me), s), e)))
                cursor = e
        if cursor < hi:
            rows.append((rank, cursor, int(hi), int(hi)))
    out = pd.DataFrame(rows, columns=["rank", "start_ns", "end_ns", "marker_end_ns"]).astype("int64")
    out.insert(1, "step", np.int64(-1))
    return out


def _inside(merged: iv.Intervals, t: np.ndarray) -> np.ndarray:
    s, e = merged
    if not s.size:
        return np.zeros(t.size, bool)
    j = np.searchsorted(s, t, side="right") - 1
    return (j >= 0) & (t < e[np.maximum(j, 0)])


def _merge(rank: int, ps, pe, ph, ct) -> pd.DataFrame:
    """Join touching pieces with the same phase and category."""
    if not ps.size:
        return _empty_pieces()
    order = np.argsort(ps, kind="stable")
    ps, pe, ph, ct = ps[order], pe[order], ph[order], ct[order]
    if not ps.size:
        return _empty_pieces()
    same = (pe[:-1] == ps[1:]) & (ph[:-1] == ph[1:]) & (ct[:-1] == ct[1:])
    first = np.flatnonzero(np.r_[True, ~same])
    last = np.r_[first[1:] - 1, ps.size - 1]
    return pd.DataFrame({"rank": np.int64(rank), "start_ns": ps[first], "end_ns": pe[last],
                         "phase": ph[first], "category": ct[first]})


def _merge_labels(rank: int, ps, pe, codes, vocab: np.ndarray, coded: bool = False) -> pd.DataFrame:
    """``_merge`` of GPU pieces labelled ``vocab[codes]`` (distinct labels, so codes compare as
    the labels do), category ``GPU_CATEGORY``: the strings are made per distinct label
    (``coded``: the columns as ``distinct.coded`` Categoricals)."""
    if not ps.size or not all(type(v) is str for v in vocab):
        return _merge(rank, ps, pe, vocab[codes], np.full(ps.size, GPU_CATEGORY, dtype=object))
    order = np.argsort(ps, kind="stable")
    ps, pe, ph = ps[order], pe[order], np.asarray(codes, np.int64)[order]
    same = (pe[:-1] == ps[1:]) & (ph[:-1] == ph[1:])
    first = np.flatnonzero(np.r_[True, ~same])
    last = np.r_[first[1:] - 1, ps.size - 1]
    text = distinct.coded if coded else strings_at
    return pd.DataFrame({"rank": np.int64(rank), "start_ns": ps[first], "end_ns": pe[last],
                         "phase": text(vocab, ph[first]),
                         "category": text(np.array([GPU_CATEGORY], dtype=object), np.zeros(first.size, np.int64))})


def _empty_pieces() -> pd.DataFrame:
    return pd.DataFrame({"rank": pd.Series(dtype="int64"), "start_ns": pd.Series(dtype="int64"),
                         "end_ns": pd.Series(dtype="int64"), "phase": pd.Series(dtype=object),
                         "category": pd.Series(dtype=object)})


# ---- per window ----------------------------------------------------------------------------
def window_phases(pieces: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Time per phase inside each window (``WINDOW_COLUMNS``: window id, rank, [start, end)).
    One row per (window, rank, phase) in order of first appearance (a name seen under two
    categories, e.g. span and self, is one phase: its first category, its time summed)."""
    if not len(pieces) or not len(windows):
        return _empty(PHASE_COLUMNS)
    if _has_missing(pieces["phase"]) or _has_missing(pieces["category"]):
        return _window_phases_grouped(pieces, windows)  # the groupby's null rules, rarely needed
    w_rank = windows["rank"].to_numpy(np.int64)
    if (w_rank == w_rank[0]).all():  # one rank's windows (the finish task's)
        one = _window_phases_one_rank(pieces, windows, int(w_rank[0]))
        if one is not None:
            return one
    cols: dict[str, list[np.ndarray]] = {c: [] for c in PHASE_COLUMNS}
    by_rank = {int(r): g for r, g in pieces.groupby("rank", sort=False)}
    for r, w in windows.groupby("rank", sort=False):
        p = by_rank.get(int(r))
        if p is None:
            continue
        hit = _window_hits(p, w)
        if hit is None:
            continue
        win, idx, dur = hit
        # group by (window, phase) with integer codes: the phase strings are compared once
        pcode, pnames = pd.factorize(p["phase"])  # no nulls here (see above)
        wcode, wids = pd.factorize(w["window"].to_numpy(np.int64)[win])
        group, _ = pd.factorize(wcode * np.int64(max(len(pnames), 1)) + pcode[idx])
        first = np.unique(group, return_index=True)[1]  # codes number groups in order of first appearance
        order = np.argsort(group, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(group[order]) != 0])
        cols["window"].append(np.asarray(wids, np.int64)[wcode[first]])
        cols["rank"].append(np.full(first.size, r, np.int64))
        cols["phase"].append(np.asarray(pnames, dtype=object)[pcode[idx[first]]])
        cols["category"].append(p["category"].iloc[idx[first]].to_numpy(dtype=object))
        cols["ns"].append(np.add.reduceat(dur[order], starts))
    if not cols["window"]:
        return _empty(PHASE_COLUMNS)
    return pd.DataFrame({c: np.concatenate(v) for c, v in cols.items()})[PHASE_COLUMNS]


def _has_missing(col: pd.Series) -> bool:
    """``col.isna().any()``; a text column's from its codes (shared by the next reader)."""
    return bool((distinct.codes(col)[0] < 0).any()) if _is_text(col) else bool(col.isna().any())


_is_text = distinct.is_text


def window_phases_coded(pieces: pd.DataFrame, windows: pd.DataFrame) -> "tuple[pd.DataFrame, tuple] | None":
    """``window_phases`` of one rank's windows with ``phase`` and ``category`` as int64 codes in
    order of first appearance, and their names (what ``pd.factorize`` of the text table's columns
    gives): the finish task's tables, made without a string per row. None where the text table
    decides (nulls, several ranks' windows, names that are not strings, nothing inside)."""
    if not len(pieces) or not len(windows) or _has_missing(pieces["phase"]) or _has_missing(pieces["category"]):
        return None
    w_rank = windows["rank"].to_numpy(np.int64)
    if not (w_rank == w_rank[0]).all():
        return None
    return _window_phases_one_rank(pieces, windows, int(w_rank[0]), coded=True)


def _window_phases_one_rank(pieces: pd.DataFrame, windows: pd.DataFrame, rank: int, coded: bool = False):
    """``window_phases`` of windows all of ``rank``: its pieces taken only when other ranks' are
    there too, the phase and category strings made per distinct name (not inferred row by row).
    None where the names are not all strings (the general path then decides). ``coded``: the
    table of ``window_phases_coded`` and its names instead (None where nothing is inside)."""
    pr = pieces["rank"].to_numpy(np.int64)
    mine = pr == rank
    p = pieces if mine.all() else pieces[mine]
    if not len(p):
        return None if coded else _empty(PHASE_COLUMNS)
    # no nulls here (checked by the caller); a rank's host pieces serve its host and its
    # accounting windows: Arrow strings are factorized once for both (``distinct.codes``)
    if _is_text(p["phase"]) and _is_text(p["category"]):
        (pcode, pnames), (ccode, cnames) = distinct.codes(p["phase"]), distinct.codes(p["category"])
    else:
        pcode, pnames = pd.factorize(p["phase"])
        ccode, cnames = pd.factorize(p["category"])
        pnames, cnames = np.asarray(pnames, dtype=object), np.asarray(cnames, dtype=object)
        if not all(type(x) is str for x in pnames) or not all(type(x) is str for x in cnames):
            return None
    hit = _window_hits(p, windows)
    if hit is None:
        return None if coded else _empty(PHASE_COLUMNS)
    win, idx, dur = hit
    # window ids coded in order of first appearance: ``win`` never decreases, so that is the
    # order of the windows' rows (factorized per window, not per hit)
    rows = np.flatnonzero(np.r_[True, win[1:] != win[:-1]])
    row_code, wids = pd.factorize(windows["window"].to_numpy(np.int64)[win[rows]])
    wcode = np.repeat(np.asarray(row_code, np.int64), np.diff(np.r_[rows, win.size]))
    # (window, phase) groups by one stable sort: each group's first hit is its first occurrence,
    # and groups in order of those are groups in order of first appearance
    key = wcode * np.int64(max(len(pnames), 1)) + pcode[idx]
    order = np.argsort(key, kind="stable")
    sk = key[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    by_first = np.argsort(order[starts], kind="stable")
    first = order[starts][by_first]
    ns = np.add.reduceat(dur[order], starts)[by_first]
    if coded:
        phase, p_order = distinct.first_appearance(pcode[idx[first]], len(pnames))
        category, c_order = distinct.first_appearance(ccode[idx[first]], len(cnames))
        table = pd.DataFrame({"window": np.asarray(wids, np.int64)[wcode[first]],
                              "rank": np.full(first.size, rank, np.int64), "phase": phase, "category": category,
                              "ns": np.asarray(ns, np.int64)}, copy=False)
        return table, (_texts(pnames)[p_order], _texts(cnames)[c_order])
    return pd.DataFrame({"window": np.asarray(wids, np.int64)[wcode[first]],
                         "rank": np.full(first.size, rank, np.int64),
                         "phase": distinct.strings_from_codes(pnames, pcode[idx[first]]),  # coded next
                         "category": distinct.strings_from_codes(cnames, ccode[idx[first]]),
                         "ns": ns})[PHASE_COLUMNS]


def _texts(names) -> np.ndarray:
    """The names as an object array of Python strings (as ``pd.factorize`` of a text column gives them)."""
    return np.array([str(x) for x in np.asarray(names, dtype=object)], dtype=object)


def _window_hits(p: pd.DataFrame, w: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Overlaps of one rank's sorted disjoint pieces with its windows: (window row, piece row, ns),
    windows in order and pieces in order within each; None when nothing overlaps."""
    ps, pe = p["start_ns"].to_numpy(np.int64), p["end_ns"].to_numpy(np.int64)
    ws, we = w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)
    lo = np.searchsorted(pe, ws, side="right")  # first piece ending after the window start
    hi = np.searchsorted(ps, we, side="left")  # pieces starting before the window end
    cnt = np.maximum(hi - lo, 0)
    total = int(cnt.sum())
    if not total:
        return None
    win = np.repeat(np.arange(len(w)), cnt)
    idx = np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(total)
    dur = np.minimum(pe[idx], we[win]) - np.maximum(ps[idx], ws[win])
    ok = dur > 0
    if not ok.any():
        return None
    return win[ok], idx[ok], dur[ok]


def _window_phases_grouped(pieces: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """``window_phases`` through a pandas groupby (null phases dropped, the first non-null category)."""
    out = []
    by_rank = {int(r): g for r, g in pieces.groupby("rank", sort=False)}
    for r, w in windows.groupby("rank", sort=False):
        p = by_rank.get(int(r))
        hit = _window_hits(p, w) if p is not None else None
        if hit is None:
            continue
        win, idx, dur = hit
        out.append(pd.DataFrame({
            "window": w["window"].to_numpy(np.int64)[win],
            "rank": np.int64(r),
            "phase": p["phase"].to_numpy(dtype=object)[idx],
            "category": p["category"].to_numpy(dtype=object)[idx],
            "ns": dur,
        }))
    if not out:
        return _empty(PHASE_COLUMNS)
    df = pd.concat(out, ignore_index=True)
    return df.groupby(["window", "rank", "phase"], sort=False, as_index=False).agg(
        category=("category", "first"), ns=("ns", "sum"))[PHASE_COLUMNS]


MAX_PAIR_ROWS = 500_000  # (window, rank, phase) rows built at once: bounds the peak memory at DEP256


@dataclass
class CodedExcess:
    """``phase_excess`` rows with ``phase`` and ``category`` as int64 codes into ``phases`` (the
    names sorted: code order is name order) and ``categories`` (-1: no category). The driver groups
    and sorts millions of these rows at DEP32 x 1000 steps: integers cost a fraction of strings."""

    rows: pd.DataFrame  # EXCESS_COLUMNS, phase and category as codes
    phases: np.ndarray  # object
    categories: np.ndarray  # object

    def frame(self) -> pd.DataFrame:
        """The rows with their names (``phase_excess``'s table)."""
        return self.rows.assign(phase=self.phase_names(self.rows["phase"]),
                                category=self.category_names(self.rows["category"]))[EXCESS_COLUMNS]

    def phase_names(self, codes: pd.Series, dtype="object") -> pd.Series:
        """Names of phase codes (object: shared strings, never one object per row; ``"str"`` for
        names that stand where a groupby on the names would have put its keys)."""
        return pd.Series(self.phases[codes.to_numpy(np.int64)], index=codes.index, dtype=dtype)

    def category_names(self, codes: pd.Series) -> pd.Series:
        c = codes.to_numpy(np.int64)
        names = np.append(self.categories, np.nan).astype(object)  # -1: the null category
        return pd.Series(names[np.where(c < 0, names.size - 1, c)], index=codes.index, dtype=object)

    def take(self, mask: np.ndarray) -> "CodedExcess":
        return CodedExcess(self.rows[mask], self.phases, self.categories)

    def causes_only(self) -> "CodedExcess":
        """Rows that can be a cause (victim phases dropped: ``causes_only``)."""
        victim_p = np.array([str(p).startswith(WAIT_PREFIXES) for p in self.phases], dtype=bool)
        victim_c = np.append(np.array([c == ov.WAIT for c in self.categories], dtype=bool), False)
        c = self.rows["category"].to_numpy(np.int64)
        victim = victim_p[self.rows["phase"].to_numpy(np.int64)] | victim_c[np.where(c < 0, victim_c.size - 1, c)]
        return self.take(~victim)


def concat_excess(parts: list[CodedExcess]) -> CodedExcess:
    """Coded excess tables of the same names, one after the other (a fresh index)."""
    rows = [p.rows for p in parts]
    out = pd.concat(rows, ignore_index=True) if len(rows) > 1 else rows[0].reset_index(drop=True)
    return CodedExcess(out, parts[0].phases, parts[0].categories)


def phase_codes(tables: list[pd.DataFrame]) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """Phase and category codes of each ``window_phases`` table against names shared by all of them
    (phases sorted, a null phase last; categories in order of appearance, -1 for none): each string
    column is factorized once. Returns ``[(phase codes, category codes)]``, the phase and category names."""
    coded = []
    for t in tables:
        p, pu = pd.factorize(t["phase"])
        c, cu = pd.factorize(t["category"])
        coded.append((np.asarray(p, np.int64), np.asarray(pu, dtype=object), np.asarray(cu, dtype=object),
                      np.asarray(c, np.int64)))
    return joined_codes(coded)


def joined_codes(tables: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
                 ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """``phase_codes`` from tables already factorized, each as (phase codes, their names, category
    names, category codes; -1: null): the driver joins the ranks' coded tables with it."""
    names: list = sorted({str(x) for _, pu, _, _ in tables for x in pu})
    if any((p < 0).any() for p, *_ in tables):
        names.append(None)  # window_phases drops null phases: only a table made elsewhere has one
    cats = list(dict.fromkeys(str(x) for _, _, cu, _ in tables for x in cu))
    p_of = {x: i for i, x in enumerate(names)}
    c_of = {x: i for i, x in enumerate(cats)}
    out = []
    for p, pu, cu, c in tables:
        pmap = np.array([p_of[str(x)] for x in pu] + [len(names) - 1], dtype=np.int64)  # -1: the null phase
        cmap = np.array([c_of[str(x)] for x in cu] + [-1], dtype=np.int64)  # -1 stays -1
        out.append((pmap[p], cmap[c]))
    return out, np.array(names, dtype=object), np.array(cats, dtype=object)


def phase_excess(phases: pd.DataFrame, windows: pd.DataFrame, rows: np.ndarray | None = None) -> pd.DataFrame:
    """Per wanted (window, rank) and phase: the rank's time in it (``ns``), the median of the
    other participants' time in it (``peer_ns``, a participant without the phase counts 0) and
    the excess. Every phase any participant had in that window is listed, negative excess too.

    ``windows``: every participant's window (``window, rank``); ``rows``: boolean mask over it of
    the rows to explain (default: all). Rows come out in the order of the wanted windows, then of
    the phases' first appearance among the window's phase rows.
    """
    [(p, c)], names, cats = phase_codes([phases])
    return coded_phase_excess(phases, p, c, names, cats, windows, rows).frame()


def coded_phase_excess(phases: pd.DataFrame | list[pd.DataFrame], p_codes: np.ndarray | list[np.ndarray],
                       c_codes: np.ndarray | list[np.ndarray], names: np.ndarray,
                       categories: np.ndarray, windows: pd.DataFrame, rows: np.ndarray | None = None,
                       before: "tuple[CodedExcess, np.ndarray] | None" = None) -> CodedExcess:
    """``phase_excess`` with the names as codes (``phase_codes``). Vectorized in numpy: the phase
    rows are sorted once by (window, phase, ns) and every wanted (window, rank) meets the phases
    of its window as a range of that order; per (window, phase) the absent participants are zeros
    in front of the present values, and the median of the others is read at two positions.

    ``phases`` may be the table's parts one after the other (lists of tables and of their codes,
    ``stragglers.JoinedPhases``): each part's rows of a window are taken from it, never the
    whole table joined first (at DEP32 x 1,000 the ranks' tables are ~280 MB together).

    ``before``: another coded excess table of the same names and a mask of its rows: those rows
    come first, in the same columns (``concat_excess`` of them and this table, without writing
    either table's rows twice: the straggler accounting joins millions of GPU rows so)."""
    parts = list(zip(phases, p_codes, c_codes)) if isinstance(phases, list) else [(phases, p_codes, c_codes)]
    want = windows if rows is None else windows[rows]
    if not sum(len(t) for t, _, _ in parts) or not len(want):
        return _front_only(before, names, categories)
    w_ids, n_per = _counts(windows["window"].to_numpy(np.int64))
    want_w = want["window"].to_numpy(np.int64)
    index = _WindowIndex(w_ids, want_w)
    sort = _SortKey.of(parts, index, len(names), int(w_ids.size))
    del parts, index
    if sort is None:
        return _front_only(before, names, categories)
    seen, order, group_key, ns, pr, cc = sort.seen, sort.order, sort.group_key, sort.ns, sort.rank, sort.category
    del sort
    new = np.r_[True, group_key[1:] != group_key[:-1]]
    g_first = np.flatnonzero(new)  # (window, phase) groups: first row, size, participants
    gid = np.cumsum(new)
    gid -= 1
    del new
    g_k = np.diff(np.r_[g_first, ns.size])
    g_wcode = group_key[g_first] // np.int64(seen.size)
    g_w = w_ids[g_wcode]
    g_n = n_per[g_wcode]
    g_p = seen[group_key[g_first] % np.int64(seen.size)]
    g_c = cc[order[g_first]]
    del order, group_key, cc, g_wcode
    pos_in = np.arange(ns.size)
    pos_in -= g_first[gid]
    span = int(max(pr.max(), want["rank"].to_numpy(np.int64).max())) + 1
    own_key = gid * np.int64(span)
    del gid
    own_key += pr
    del pr
    own_row_of = _RowOf(own_key, g_first.size * span)
    del own_key
    # each wanted (window, rank) meets its window's groups, a contiguous range of them
    want_r = want["rank"].to_numpy(np.int64)
    lo = np.searchsorted(g_w, want_w, side="left")
    cnt = np.searchsorted(g_w, want_w, side="right") - lo
    bounds = np.r_[0, np.cumsum(cnt)]
    # the rows are written into columns made once (not chunks joined after: at DEP256 the
    # table is millions of rows, and a join would hold it twice)
    front = int(before[1].sum()) if before is not None else 0
    cols = {c: np.empty(front + int(bounds[-1]), np.int64) for c in EXCESS_COLUMNS}
    if front:
        for c, out in cols.items():
            np.compress(before[1], before[0].rows[c].to_numpy(np.int64), out=out[:front])
    bounds = bounds + front
    cut = np.searchsorted(bounds, np.arange(front, bounds[-1], MAX_PAIR_ROWS), side="right") - 1
    for a, b in zip(cut, np.r_[cut[1:], want_w.size]):
        if a >= b:
            continue
        k = cnt[a:b]
        total = int(k.sum())
        if not total:
            continue
        at = slice(int(bounds[a]), int(bounds[a]) + total)
        wi = np.repeat(np.arange(a, b), k)
        g = np.repeat(lo[a:b] - np.cumsum(k) + k, k) + np.arange(total)
        r = want_r[wi]
        del wi
        found, own_row = own_row_of(g * np.int64(span) + r)
        own_ns = np.where(found, ns[own_row], 0)
        n = g_n[g]
        z = n - g_k[g]  # participants without the phase: zeros, sorted first
        pos = np.where(found, z + pos_in[own_row], 0)
        del found, own_row
        first_row = g_first[g]
        m = n - 1  # number of others
        lo_v = _other_at(np.maximum((m - 1) // 2, 0), pos, n, z, first_row, ns)
        hi_v = _other_at(np.maximum(m // 2, 0), pos, n, z, first_row, ns)
        peer = np.where(m > 0, lo_v + (hi_v - lo_v) // 2, 0)
        del lo_v, hi_v, pos, first_row, n, z
        cols["window"][at] = g_w[g]
        cols["rank"][at] = r
        cols["phase"][at] = g_p[g]
        cols["category"][at] = g_c[g]
        cols["ns"][at] = own_ns
        cols["peer_ns"][at] = peer
        cols["excess_ns"][at] = own_ns - peer
        del g, r, own_ns, peer, m
    if bounds[-1] == front:
        return _front_only(before, names, categories)
    return CodedExcess(pd.DataFrame(cols, copy=False), names, categories)


def _front_only(before: "tuple[CodedExcess, np.ndarray] | None", names: np.ndarray,
                categories: np.ndarray) -> CodedExcess:
    """``coded_phase_excess`` without rows of its own: the ``before`` rows alone, else the empty table."""
    if before is None or not before[1].any():
        return _empty_coded(names, categories)
    return concat_excess([before[0].take(before[1])])


@dataclass
class _SortKey:
    """The kept phase rows of ``coded_phase_excess`` sorted by (window, phase in order of first
    appearance, ns): ``order`` (each sorted row's kept row), the sorted ``group_key`` (window
    position x phases seen + phase) and ``ns`` and ``rank``, the kept rows' ``category`` as they
    were kept (read at ``order``), ``seen`` (the phase codes in order of first appearance)."""

    seen: np.ndarray
    order: np.ndarray
    group_key: np.ndarray
    ns: np.ndarray
    rank: np.ndarray
    category: np.ndarray

    @staticmethod
    def of(parts: list, index: "_WindowIndex", n_names: int, n_windows: int) -> "_SortKey | None":
        """Each part's kept rows taken on their own, twice (the phases seen, then straight into the
        sort key): part-sized pieces, whose memory the allocator hands on from one part to the
        next. Columns of every kept row taken first and combined after were ~5 fresh int64 arrays
        of millions of rows (DEP32 x 1,000), and a first touch of fresh memory costs ~2.5 ms a MB
        on a VM: more than the arithmetic. None where no row is kept."""
        # each part's columns read once (views of its arrays): ~10 reads a part, 3 x 32 parts at DEP32
        cols = [tuple(t[c].to_numpy(np.int64) for c in ("window", "ns", "rank")) for t, _, _ in parts]
        kept = [index.wanted(w) & (ns > 0) for w, ns, _ in cols]
        sizes = [int(k.sum()) for k in kept]
        total = sum(sizes)
        if not total:
            return None
        # pd.unique of each part's uniques in part order: the phases in order of first appearance
        seen = pd.unique(np.concatenate([pd.unique(np.asarray(pc, np.int64)[k]) for (_, pc, _), k in zip(parts, kept)]))
        local = np.zeros(max(n_names, 1), np.int64)
        local[seen] = np.arange(seen.size)
        top = max(int(np.max(ns, where=k, initial=0)) for (_, ns, _), k in zip(cols, kept)) + 1
        low = min(int(r.min()) for (_, _, r), n in zip(cols, sizes) if n)
        high = max(int(r.max()) for (_, _, r), n in zip(cols, sizes) if n)
        small = np.iinfo(np.int32)
        rank = np.empty(total, np.int32 if small.min <= low and high <= small.max else np.int64)
        category = np.empty(total, np.int32)  # codes of a few categories, -1 for none
        # group keys are below n_windows x seen; where key x top + ns fits an int64, one stable sort
        # of one key orders both (as the lexsort by both does, ties kept in row order)
        wide = n_windows * int(seen.size) >= np.iinfo(np.int64).max // top
        key = np.empty(total, np.int64)
        ns_wide = np.empty(total, np.int64) if wide else None
        a = 0
        for (_, pc, cc), (w, part_ns, r), k, n in zip(parts, cols, kept, sizes):
            if not n:
                continue
            at = slice(a, a + n)
            gk = index.positions(w[k])
            gk *= np.int64(seen.size)
            gk += local[np.asarray(pc, np.int64)[k]]
            ns = part_ns[k]
            if wide:
                key[at], ns_wide[at] = gk, ns
            else:
                gk *= np.int64(top)
                gk += ns
                key[at] = gk
            rank[at] = r[k]
            category[at] = np.asarray(cc, np.int64)[k]
            a += n
            del gk, ns
        del kept, local, cols
        if wide:
            order = np.lexsort((ns_wide, key))
            group_key, ns = key[order], ns_wide[order]
        else:
            order = np.argsort(key, kind="stable")
            group_key = key[order]
            del key
            ns = group_key % np.int64(top)
            group_key //= np.int64(top)
        return _SortKey(seen, order, group_key, ns, rank[order], category)


class _RowOf:
    """The row of each (group, rank) key among ``keys`` (one per row; a key appears at most once
    where the phase rows are summed per window, rank and phase, as ``rank_window_phases`` makes
    them): ``(found, row)`` of asked keys, some valid row where not found (the caller masks it
    with ``found``). A table indexed by key where the keys' range (``size``: groups x ranks) is
    at most ``_ROW_TABLE_PER_ROW`` times the rows (a few int32 per row: every rank has most
    phases in most windows), else a binary search in the keys sorted once (where a key repeats:
    its first row)."""

    def __init__(self, keys: np.ndarray, size: int) -> None:
        self.table = None
        if keys.size and size <= _ROW_TABLE_PER_ROW * keys.size and keys.size < np.iinfo(np.int32).max:
            table = np.full(size, -1, np.int32)
            table[keys] = np.arange(keys.size, dtype=np.int32)
            if int(np.count_nonzero(table >= 0)) == keys.size:  # no key repeats (else: the search below)
                self.table = table
                return
            del table
        self.by_key = np.argsort(keys, kind="stable")
        self.sorted = keys[self.by_key]

    def __call__(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.table is not None:
            row = self.table[key].astype(np.int64)
            found = row >= 0
            return found, np.maximum(row, 0)
        j = np.minimum(np.searchsorted(self.sorted, key), self.sorted.size - 1)
        return self.sorted[j] == key, self.by_key[j]


_ROW_TABLE_PER_ROW = 4


def _counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_counts=True)``, without its sort where the values are sorted
    already (the windows tables are, by window)."""
    if values.size and bool((values[1:] >= values[:-1]).all()):
        first = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
        return values[first], np.diff(np.r_[first, values.size])
    return np.unique(values, return_counts=True)


def _window_positions(pw: np.ndarray, w_ids: np.ndarray, want_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(whether each phase row's window is one of ``want_w``, the position of its window in
    ``w_ids``: sorted, distinct, holding every wanted one): ``np.isin`` and ``np.searchsorted``,
    read from a table indexed by window id where the ids are dense (they are numbered from 0)."""
    index = _WindowIndex(w_ids, want_w)
    if not index.dense:
        return index.wanted(pw), index.positions(pw)
    at = index._at(pw)
    return index.is_wanted[at], index.pos_of[at]


class _WindowIndex:
    """``_window_positions``' two lookups, each on its own, over tables made once for the
    windows: ``coded_phase_excess`` asks every rank's part which rows are wanted, then where
    the kept ones' windows are."""

    def __init__(self, w_ids: np.ndarray, want_w: np.ndarray) -> None:
        self.w_ids, self.want_w = w_ids, want_w
        self.first = int(w_ids[0]) if w_ids.size else 0
        self.span = int(w_ids[-1]) - self.first + 1 if w_ids.size else 0
        self.dense = bool(w_ids.size) and self.span <= 4 * w_ids.size + 4096  # else a table would be mostly empty
        if self.dense:
            self.pos_of = np.zeros(self.span + 1, np.int64)  # the last slot: ids outside w_ids' range
            self.pos_of[w_ids - self.first] = np.arange(w_ids.size)
            self.is_wanted = np.zeros(self.span + 1, bool)
            self.is_wanted[want_w - self.first] = True

    def _at(self, pw: np.ndarray) -> np.ndarray:
        at = pw - self.first
        at[(at < 0) | (at >= self.span)] = self.span
        return at

    def wanted(self, pw: np.ndarray) -> np.ndarray:
        if not self.w_ids.size:
            return np.zeros(pw.size, bool)
        return self.is_wanted[self._at(pw)] if self.dense else np.isin(pw, self.want_w)

    def positions(self, pw: np.ndarray) -> np.ndarray:
        if not self.w_ids.size:
            return np.zeros(pw.size, np.int64)
        return self.pos_of[self._at(pw)] if self.dense else np.searchsorted(self.w_ids, pw)


def _other_at(i: np.ndarray, pos: np.ndarray, n: np.ndarray, z: np.ndarray, first_row: np.ndarray,
              ns: np.ndarray) -> np.ndarray:
    """The ``i``-th smallest time of each row's others in its (window, phase) group: the row itself
    (at ``pos``) skipped, the ``z`` participants without the phase first as zeros, then the group's
    sorted times from ``first_row`` of ``ns``; ``n`` participants in all."""
    jj = np.minimum(i + (i >= pos), n - 1)
    return np.where(jj >= z, ns[np.clip(first_row + jj - z, 0, ns.size - 1)], 0)


def _empty_coded(names: np.ndarray, categories: np.ndarray) -> CodedExcess:
    return CodedExcess(_empty(EXCESS_COLUMNS).astype({"phase": "int64", "category": "int64"}), names, categories)


def causes_only(excess: pd.DataFrame) -> pd.DataFrame:
    """Excess rows that can be a cause (victim phases dropped)."""
    if not len(excess):
        return excess
    victim = excess["phase"].astype(str).str.startswith(WAIT_PREFIXES).to_numpy(bool) | (
        excess["category"] == ov.WAIT).to_numpy(bool)
    return excess[~victim]


def _empty(columns: list[str]) -> pd.DataFrame:
    out = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    for c in ("phase", "category"):
        if c in out:
            out[c] = out[c].astype(object)
    return out
