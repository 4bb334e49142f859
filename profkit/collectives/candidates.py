"""Collective candidates: every collective one rank's events show, before matching across ranks.

Why: the only events that happen at one real moment on several ranks are the ends of one
collective (every participant leaves when the last one's data has arrived). Clock alignment
(``profkit.align``) fits clocks to those ends; the straggler analysis reads who arrived last.

What counts as a collective (whatever the trace has):

- ``kernel``: a GPU kernel of a collective: NCCL/RCCL (``coll_name`` set by the readers),
  DeepEP dispatch/combine, vLLM custom all-reduce. start = the rank's arrival on the GPU,
  end = the common exit. ``launch_ns`` is the CUDA launch call (joined by correlation), and the
  host span around that call (``record_param_comms``, ``nccl:*``, an NCCL NVTX range) gives
  ``host_start_ns``/``host_end_ns`` and the group / sequence number the kernel may lack.
- ``cpu_span``: a host-blocking collective, found from evidence by ``profkit.collectives.syncpoints``
  (a collective op of a group that runs no GPU kernel, e.g. Gloo's ``c10d::allreduce_``, with
  its Gloo worker span; a span where blocking OS calls or aligned ends across ranks show a sync;
  DP-sync hook names only as extra evidence). Overlapping members of one process are one
  instance: start = the arrival (``arrive_ns``: the op's start), end = the best estimate of the
  common exit (the Gloo span's end, else ``exit_ns``: when the calling thread ran again).
- ``launch_span``: the host span of a GPU collective on a rank whose trace has no collective
  kernels at all. Its end is when the launch returned, not a common moment: never aligned on.

Cross-rank matching of the candidates: ``profkit.collectives.instances``.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profkit import schema
from profkit.collectives.sequences import KERNEL, LAUNCH_SPAN
from profkit.collectives.syncpoints import (
    COLL_OP_RE,
    COLLECTIVE_KERNEL,
    COLLECTIVE_LAUNCH,
    HOST_COLUMNS,
    code_flags,
    column_codes,
    host_sync_rows,
    missing_ints,
    sharing,
)
from profkit.ingest.collectives import coll_from_kernel, normalize_coll_name
from profkit.intervals import nesting_parents
from profkit.names import is_comm_kernel

_HOST_KINDS = (schema.CPU_OP, schema.CPU_SPAN)

_DEEPEP_RE = re.compile(r"(?:dpsk::ep|deep_ep|deepep)[\w:]*?::(\w+)\s*[<(]", re.IGNORECASE)
_CUSTOM_AR_RE = re.compile(
    r"cross_device_reduce|multimem_all_reduce|one_shot_all_reduce|two_shot_all_reduce|all_reduce|allreduce",
    re.IGNORECASE,
)
_NCCLISH_RE = re.compile(r"^(?:nccl|rccl)", re.IGNORECASE)


def collective_candidates(events: pd.DataFrame, sync_names: dict[str, str] | None = None) -> pd.DataFrame:
    """Every collective seen in ``events`` before matching: computed on one rank's events at a
    time (the scale path's map), then ``instances_from_candidates`` of them all (its reduce).
    ``sync_names``: span names recognized as sync points across ranks
    (``syncpoints.decide_sync_names``), decided by the driver."""
    return _candidates(events, sync_names)


# ---- candidates -------------------------------------------------------------------------------
def kernel_coll_name(name: str) -> str:
    """Collective of a communication kernel, from its name (NCCL, DeepEP, custom all-reduce)."""
    base = name[5:] if name.startswith("void ") else name
    coll = coll_from_kernel(base)
    if coll:
        return coll
    m = _DEEPEP_RE.search(name)
    if m:
        return "ep_" + m.group(1)
    if _NCCLISH_RE.match(base):
        return "nccl"  # ncclDevKernel_Generic and friends: the op is not in the name
    if _CUSTOM_AR_RE.search(name):
        return "all_reduce"
    return "comm"


def _candidates(events: pd.DataFrame, sync_names: dict[str, str] | None = None) -> pd.DataFrame:
    """Every collective seen on every rank (kernels with their launch link, CPU collectives)."""
    with sharing(events):  # one thread context for every test below (the columns' codes: ``distinct.codes``)
        return _candidates_coded(events, sync_names)


def _candidates_coded(events: pd.DataFrame, sync_names: dict[str, str] | None) -> pd.DataFrame:
    kernels = _comm_kernels(events)
    kind_c, kind_u = column_codes(events, "kind")
    host_rows = np.flatnonzero(code_flags(kind_u, kind_c, lambda u: u.isin(list(_HOST_KINDS)), missing=None))
    name_c, name_u = column_codes(events, "name")
    cat_c, cat_u = column_codes(events, "category")
    hn = name_c[host_rows]
    ncclish = code_flags(name_u, hn, lambda u: u.str.match(_NCCLISH_RE), as_string=True) | code_flags(
        cat_u, cat_c[host_rows], lambda u: u == "NCCL", as_string=True)
    has_coll = events["coll_name"].notna().to_numpy(dtype=bool)[host_rows]
    c10d = code_flags(name_u, hn, lambda u: u.str.match(COLL_OP_RE), as_string=True)
    like = ncclish | has_coll | c10d
    launch_like = _take(events, _mask(len(events), host_rows[like]), _HOST_COLUMNS)
    kernels, linked_ids = _link_launches(events, kernels, launch_like)
    gpu_groups = {str(g) for g in pd.unique(kernels["group"].to_numpy(dtype=object)) if not pd.isna(g)} \
        if len(kernels) else set()
    frames = [_with_sync_columns(kernels, COLLECTIVE_KERNEL)]

    # host collective spans not linked to a kernel
    unlinked = ~launch_like.index.isin(linked_ids)
    lk = launch_like[unlinked]
    lk_nccl = ncclish[like][unlinked]
    lk_gpu_group = lk["coll_group"].astype("string").isin(gpu_groups).to_numpy(dtype=bool)
    host_nccl = _take(events, _mask(len(events), host_rows[ncclish]), ("rank", "pid", "tid", "start_ns", "end_ns"))
    is_launch = lk_nccl | lk_gpu_group | _holds_nccl_span(lk, host_nccl)
    ranks_with_kernels = set(kernels["rank"].unique().tolist())
    lk_c10d = c10d[like][unlinked]
    launch_spans = lk[is_launch & ~lk_c10d & ~lk["rank"].isin(ranks_with_kernels).to_numpy(dtype=bool)]
    if len(launch_spans):
        frames.append(_with_sync_columns(_launch_rows(launch_spans), COLLECTIVE_LAUNCH))

    # host-blocking collectives (ops of groups that run no GPU kernel, Gloo worker spans, sync
    # spans recognized by evidence): ``syncpoints``
    op_labels = lk.index[~is_launch & (lk["coll_name"].notna().to_numpy(dtype=bool) | lk_c10d)]
    cpu = host_sync_rows(events, host_rows, op_labels, sync_names)
    if len(cpu):
        frames.append(cpu)
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def _mask(n: int, rows: np.ndarray) -> np.ndarray:
    out = np.zeros(n, bool)
    out[rows] = True
    return out


def _with_sync_columns(rows: pd.DataFrame, evidence: str) -> pd.DataFrame:
    """GPU collectives in the sync-point vocabulary: the rank arrives when its kernel starts (its
    launch, for a launch span) and is released when it ends; the host span is the launch's."""
    if not len(rows):
        return rows
    host = rows["host_start_ns"].astype("Int64")
    return rows.assign(arrive_ns=rows["start_ns"].to_numpy(np.int64), exit_ns=rows["end_ns"].to_numpy(np.int64),
                       span_start_ns=host.fillna(rows["start_ns"].astype("Int64")).to_numpy(np.int64),
                       span_name=None, evidence=evidence, wait_name=rows["coll_name"].to_numpy(dtype=object))


_HOST_COLUMNS = HOST_COLUMNS
_KERNEL_COLUMNS = ("rank", "name", "start_ns", "end_ns", "device", "stream", "pid", "correlation", "coll_name",
                   "coll_group", "coll_seq")
_RUNTIME_COLUMNS = ("rank", "pid", "tid", "correlation", "start_ns", "end_ns")


def _take(events: pd.DataFrame, mask: np.ndarray, columns: tuple[str, ...]) -> pd.DataFrame:
    """Rows of ``mask``, only ``columns``: filtering the whole wide Arrow table costs seconds."""
    return events.loc[mask, list(columns)]


def _comm_kernels(events: pd.DataFrame) -> pd.DataFrame:
    kind_c, kind_u = column_codes(events, "kind")
    is_kernel = code_flags(kind_u, kind_c, lambda u: u == schema.KERNEL, missing=None)
    # ``is_comm_kernel`` of each distinct name once, on the whole column (codes, no rows taken)
    codes, uniques = column_codes(events, "name")
    comm_u = np.r_[is_comm_kernel(pd.Series(uniques, dtype=object)), False]
    comm = is_kernel & (comm_u[codes] | events["coll_name"].notna().to_numpy(dtype=bool))
    k = _take(events, comm, _KERNEL_COLUMNS)
    names = k["name"].astype(str)
    derived = names.map({n: kernel_coll_name(n) for n in names.unique()})
    coll = k["coll_name"].astype(object).where(k["coll_name"].notna(), derived)
    return pd.DataFrame({
        **_identity_columns(k, KERNEL, coll, names),
        "device": k["device"].astype("Int64").to_numpy(),
        "stream": k["stream"].astype("Int64").to_numpy(),
        "pid": k["pid"].astype("Int64").to_numpy(),
        "tid": missing_ints(len(k)),
        "correlation": k["correlation"].astype("Int64").to_numpy(),
    })


def _identity_columns(rows: pd.DataFrame, kind: str, coll: pd.Series, names: pd.Series) -> dict:
    """The columns every candidate has, in candidate order: rank, source kind, group, sequence,
    collective, start, end and the event's name."""
    return {
        "rank": rows["rank"].to_numpy(dtype=np.int64),
        "source_kind": kind,
        "group": rows["coll_group"].astype(object).where(rows["coll_group"].notna(), None).to_numpy(dtype=object),
        "seq": rows["coll_seq"].astype("Int64").to_numpy(),
        "coll_name": coll.to_numpy(dtype=object),
        "start_ns": rows["start_ns"].to_numpy(dtype=np.int64),
        "end_ns": rows["end_ns"].to_numpy(dtype=np.int64),
        "name": names.to_numpy(dtype=object),
    }


def _link_launches(events: pd.DataFrame, kernels: pd.DataFrame, spans: pd.DataFrame) -> tuple[pd.DataFrame, set]:
    """Kernel -> its launch call (correlation) -> the innermost host collective span around the call.

    Returns kernels with launch_ns, tid, host_start_ns/host_end_ns and group/seq/coll filled from
    the span chain where the kernel lacks them, and the index labels of the linked spans.
    """
    n = len(kernels)
    kernels = kernels.assign(launch_ns=missing_ints(n),
                             host_start_ns=missing_ints(n),
                             host_end_ns=missing_ints(n))
    if n == 0:
        return kernels.drop(columns="correlation"), set()
    # the runtime calls of these kernels' correlations only (the merge below matches on it): the
    # same first call per (rank, pid, correlation) as over every runtime call
    kind_c, kind_u = column_codes(events, "kind")
    is_rt = code_flags(kind_u, kind_c, lambda u: u == schema.RUNTIME, missing=None)
    is_rt &= events["correlation"].notna().to_numpy(dtype=bool)
    k_corr = kernels["correlation"]
    wanted = pd.Index(np.unique(k_corr[k_corr.notna()].to_numpy(dtype=np.int64)))
    rows = np.flatnonzero(is_rt)
    rows = rows[wanted.get_indexer(events["correlation"].to_numpy(dtype=np.int64, na_value=-1)[rows]) >= 0]
    rt = _take(events, _mask(len(events), rows), _RUNTIME_COLUMNS)
    rt = pd.DataFrame({
        "rank": rt["rank"].to_numpy(dtype=np.int64),
        "pid": rt["pid"].astype("Int64").to_numpy(),
        "correlation": rt["correlation"].astype("Int64").to_numpy(),
        "rt_tid": rt["tid"].astype("Int64").to_numpy(),
        "rt_start": rt["start_ns"].to_numpy(dtype=np.int64),
        "rt_end": rt["end_ns"].to_numpy(dtype=np.int64),
    }).drop_duplicates(["rank", "pid", "correlation"])
    key = kernels[["rank", "pid", "correlation"]].reset_index()
    joined = key.merge(rt, on=["rank", "pid", "correlation"], how="left").set_index("index").reindex(kernels.index)
    has = joined["rt_start"].notna().to_numpy(dtype=bool)
    kernels.loc[has, "launch_ns"] = joined.loc[has, "rt_start"].astype("int64").to_numpy()
    kernels["tid"] = joined["rt_tid"].astype("Int64").to_numpy()
    linked: set = set()
    if not has.any() or spans.empty:
        return kernels.drop(columns="correlation"), linked
    # innermost host collective span on the launching thread around each launch call
    sp = pd.DataFrame({
        "label": spans.index.to_numpy(),
        "rank": spans["rank"].to_numpy(dtype=np.int64),
        "pid": spans["pid"].to_numpy(dtype=np.int64, na_value=-1),
        "tid": spans["tid"].to_numpy(dtype=np.int64, na_value=-1),
        "start": spans["start_ns"].to_numpy(dtype=np.int64),
        "end": spans["end_ns"].to_numpy(dtype=np.int64),
        "group": spans["coll_group"].astype(object).where(spans["coll_group"].notna(), None).to_numpy(dtype=object),
        "seq": spans["coll_seq"].astype("Int64").to_numpy(),
        "coll": spans["coll_name"].astype(object).where(spans["coll_name"].notna(), None).to_numpy(dtype=object),
    })
    ln = pd.DataFrame({
        "row": np.flatnonzero(has),
        "rank": kernels["rank"].to_numpy()[has],
        "pid": kernels["pid"].to_numpy(dtype=np.int64, na_value=-1)[has],
        "tid": joined["rt_tid"].to_numpy(dtype=np.int64, na_value=-1)[has],
        "start": joined["rt_start"].to_numpy(dtype=np.int64, na_value=0)[has],
        "end": joined["rt_end"].to_numpy(dtype=np.int64, na_value=0)[has],
    })
    group = kernels["group"].to_numpy(dtype=object).copy()
    seq = kernels["seq"].to_numpy(dtype=object).copy()
    coll = kernels["coll_name"].to_numpy(dtype=object).copy()
    # what each kernel lacks, tested once (not per thread and level): a filled field takes the
    # span's value, whose own tests are made once per span
    g_none = _is_none(group)
    q_none = _is_none(seq) | _is(seq, pd.NA)
    c_weak = _is_none(coll) | _equals(coll, "nccl") | _equals(coll, "comm")
    hs = np.full(n, -1, dtype=np.int64)
    he = np.full(n, -1, dtype=np.int64)
    span_groups = {k: v for k, v in sp.groupby(["rank", "pid", "tid"], sort=False)}
    for thread, launches in ln.groupby(["rank", "pid", "tid"], sort=False):
        s = span_groups.get(thread)
        if s is None:
            continue
        s = s.sort_values(["start", "end"], ascending=[True, False], kind="stable")
        starts, ends = s["start"].to_numpy(), s["end"].to_numpy()
        parent = nesting_parents(starts, ends)
        t0, t1 = launches["start"].to_numpy(), launches["end"].to_numpy()
        cand = np.searchsorted(starts, t0, side="right") - 1
        for _ in range(8):  # climb to the first span that encloses the call
            bad = (cand >= 0) & (ends[np.maximum(cand, 0)] < t1)
            if not bad.any():
                break
            cand = np.where(bad, parent[np.maximum(cand, 0)], cand)
        ok = (cand >= 0) & (ends[np.maximum(cand, 0)] >= t1)
        rows = launches["row"].to_numpy()[ok]
        inner = cand[ok]
        hs[rows] = starts[inner]
        he[rows] = ends[inner]
        s_group, s_seq, s_coll = s["group"].to_numpy(), s["seq"].to_numpy(dtype=object), s["coll"].to_numpy()
        labels = s["label"].to_numpy()
        # the span's fields tested once per span, not per kernel and level
        g_has, c_has = ~_is_none(s_group), ~_is_none(s_coll)
        q_has = ~(_is_none(s_seq) | _is(s_seq, pd.NA))
        c_weak_s = _equals(s_coll, "nccl") | _equals(s_coll, "comm")
        cur = inner.copy()
        for _ in range(8):  # the chain of enclosing spans fills what the kernel lacks
            live = cur >= 0
            if not live.any():
                break
            linked.update(labels[cur[live]].tolist())
            r, c = rows[live], cur[live]  # each kernel once per level: the rows are distinct
            fill = g_none[r] & g_has[c]
            group[r[fill]] = s_group[c[fill]]
            g_none[r[fill]] = False
            fill = q_none[r] & q_has[c]
            seq[r[fill]] = s_seq[c[fill]]
            q_none[r[fill]] = False
            fill = c_weak[r] & c_has[c]
            coll[r[fill]] = s_coll[c[fill]]
            c_weak[r[fill]] = c_weak_s[c[fill]]
            cur = np.where(live, parent[np.maximum(cur, 0)], -1)
    kernels["group"] = group
    kernels["seq"] = _int64_array(seq)
    kernels["coll_name"] = coll
    kernels["host_start_ns"] = pd.arrays.IntegerArray(np.maximum(hs, 0), hs < 0)
    kernels["host_end_ns"] = pd.arrays.IntegerArray(np.maximum(he, 0), he < 0)
    return kernels.drop(columns="correlation"), linked


def _int64_array(values: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """``pd.array([None if v is pd.NA else v for v in values], dtype="Int64")``: built from the
    missing mask and the ints at once where every other value is an int, else as written."""
    miss = pd.isna(values)
    rest = values[~miss]
    if all(type(v) is int for v in pd.unique(rest)):  # each distinct value tested once
        ints = np.zeros(values.size, np.int64)
        ints[~miss] = rest.astype(np.int64)
        return pd.arrays.IntegerArray(ints, miss)
    return pd.array([None if v is pd.NA else v for v in values], dtype="Int64")


def _is(values: np.ndarray, obj) -> np.ndarray:
    """``v is obj`` for each object of ``values``, for a missing-value marker ``obj`` (None, pd.NA):
    only values ``pd.isna`` calls missing can be one (tested one by one), the rest are not."""
    values = np.asarray(values, dtype=object)
    out = np.zeros(len(values), dtype=bool)
    miss = np.flatnonzero(pd.isna(values))
    if miss.size:
        out[miss] = [v is obj for v in values[miss].tolist()]
    return out


def _is_none(values: np.ndarray) -> np.ndarray:
    return _is(values, None)


def _equals(values: np.ndarray, text: str) -> np.ndarray:
    """``v == text`` for each object, as Python's ``in (..., text)`` compares (identity, then ==);
    missing values (None, NaN, NA) are not ``text``."""
    values = np.asarray(values, dtype=object)
    out = np.zeros(len(values), dtype=bool)
    ok = ~pd.isna(values)
    if ok.any():
        out[ok] = np.asarray(values[ok] == text, dtype=bool)
    return out


def _holds_nccl_span(spans: pd.DataFrame, nccl: pd.DataFrame) -> np.ndarray:
    """True for spans with an NCCL span (``nccl:*`` record function, NCCL NVTX range) starting inside
    them on the same thread: torch's record_param_comms of a NCCL group, even with no kernel seen."""
    out = np.zeros(len(spans), dtype=bool)
    if spans.empty or nccl.empty:
        return out
    keys = ["rank", "pid", "tid"]
    inner = {k: np.sort(g["start_ns"].to_numpy(np.int64)) for k, g in nccl.groupby(keys, dropna=False, sort=False)}
    pos = pd.Series(np.arange(len(spans)), index=spans.index)
    for k, g in spans.groupby(keys, dropna=False, sort=False):
        starts = inner.get(k)
        if starts is None:
            continue
        lo = np.searchsorted(starts, g["start_ns"].to_numpy(np.int64), side="left")
        hi = np.searchsorted(starts, g["end_ns"].to_numpy(np.int64), side="right")
        out[pos[g.index].to_numpy()] = hi > lo
    return out


def _launch_rows(spans: pd.DataFrame) -> pd.DataFrame:
    """Host spans of GPU collectives on a rank without kernels; nested ones (nccl:* inside
    record_param_comms) are the same op: the outermost stays."""
    spans = spans.sort_values(["rank", "pid", "tid", "start_ns", "end_ns"], ascending=[True] * 4 + [False],
                              kind="stable")
    thread = spans[["rank", "pid", "tid"]].astype("Int64").fillna(-1).to_numpy(dtype=np.int64)
    same = np.r_[False, (thread[1:] == thread[:-1]).all(axis=1)]
    ends = spans["end_ns"].to_numpy(np.int64)
    block = np.cumsum(~same)
    run_end = pd.Series(ends).groupby(block).cummax().to_numpy()
    nested = same & (ends <= np.r_[0, run_end[:-1]])
    spans = spans[~nested]
    names = spans["name"].astype(str)
    coll = spans["coll_name"].astype(object).where(
        spans["coll_name"].notna(), names.map(lambda s: normalize_coll_name(s.split(":", 1)[-1].removeprefix("nccl"))))
    n = len(spans)
    return pd.DataFrame({
        **_identity_columns(spans, LAUNCH_SPAN, coll, names),
        "device": missing_ints(n),
        "stream": missing_ints(n),
        "pid": spans["pid"].astype("Int64").to_numpy(),
        "tid": spans["tid"].astype("Int64").to_numpy(),
        "launch_ns": missing_ints(n),
        "host_start_ns": spans["start_ns"].astype("Int64").to_numpy(),
        "host_end_ns": spans["end_ns"].astype("Int64").to_numpy(),
    })
