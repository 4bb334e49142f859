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
    _names_at,
    _thread_key,
    column_codes,
    column_ints,
    host_sync_rows,
    missing_ints,
    sharing,
    texts_at,
)
from profkit.distinct import codes_in, regex_flags
from profkit.ingest.collectives import coll_from_kernel, normalize_coll_name
from profkit.intervals import nesting_parents
from profkit.keys import first_match
from profkit.names import COMM_KERNEL_RE

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
    host_rows = np.flatnonzero(codes_in(kind_u, kind_c, _HOST_KINDS))
    name_c, name_u = column_codes(events, "name")
    cat_c, cat_u = column_codes(events, "category")
    coll_c, _ = column_codes(events, "coll_name")
    hn = name_c[host_rows]
    ncclish = regex_flags(name_u, hn, _NCCLISH_RE) | codes_in(cat_u, cat_c[host_rows], "NCCL", missing="")
    has_coll = coll_c[host_rows] >= 0
    c10d = regex_flags(name_u, hn, COLL_OP_RE)
    like = ncclish | has_coll | c10d
    like_rows = host_rows[like]  # host spans that may launch or be a collective (positions)
    kernels, linked_ids = _link_launches(events, kernels, like_rows)
    gpu_groups = {str(g) for g in pd.unique(kernels["group"]) if not pd.isna(g)}
    frames = [_kernel_frame(kernels)]

    # host collective spans not linked to a kernel
    like_labels = events.index[like_rows]
    unlinked = ~like_labels.isin(linked_ids)
    lk = like_rows[unlinked]
    lk_nccl = ncclish[like][unlinked]
    group_c, group_u = column_codes(events, "coll_group")
    lk_gpu_group = codes_in(group_u, group_c[lk], gpu_groups)
    is_launch = lk_nccl | lk_gpu_group | _holds_nccl_span(events, lk, host_rows[ncclish])
    ranks_with_kernels = np.unique(kernels["rank"])
    lk_c10d = c10d[like][unlinked]
    lk_rank = column_ints(events, "rank")[0][lk]
    launch_spans = lk[is_launch & ~lk_c10d & ~np.isin(lk_rank, ranks_with_kernels)]
    if launch_spans.size:
        spans = _take(events, _mask(len(events), launch_spans), _HOST_COLUMNS)
        frames.append(_with_sync_columns(_launch_rows(spans), COLLECTIVE_LAUNCH))

    # host-blocking collectives (ops of groups that run no GPU kernel, Gloo worker spans, sync
    # spans recognized by evidence): ``syncpoints``
    op_labels = like_labels[unlinked][~is_launch & ((coll_c[lk] >= 0) | lk_c10d)]
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


def _sync_columns(start: np.ndarray, end: np.ndarray, host_start: np.ndarray, host_missing: np.ndarray,
                  coll: np.ndarray, evidence: str) -> dict:
    """GPU collectives in the sync-point vocabulary: the rank arrives when its kernel starts (its
    launch, for a launch span) and is released when it ends; the host span is the launch's (the
    start where there is none)."""
    return {"arrive_ns": start, "exit_ns": end, "span_start_ns": np.where(host_missing, start, host_start),
            "span_name": None, "evidence": evidence, "wait_name": coll}


def _with_sync_columns(rows: pd.DataFrame, evidence: str) -> pd.DataFrame:
    """``rows`` (a frame of candidates) with the ``_sync_columns``."""
    if not len(rows):
        return rows
    host = rows["host_start_ns"].astype("Int64")
    return rows.assign(**_sync_columns(rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64),
                                       host.to_numpy(np.int64, na_value=0), host.isna().to_numpy(bool),
                                       rows["coll_name"].to_numpy(dtype=object), evidence))


_HOST_COLUMNS = HOST_COLUMNS


def _take(events: pd.DataFrame, mask: np.ndarray, columns: tuple[str, ...]) -> pd.DataFrame:
    """Rows of ``mask``, only ``columns``: filtering the whole wide Arrow table costs seconds."""
    return events.loc[mask, list(columns)]


def _comm_kernels(events: pd.DataFrame) -> dict[str, np.ndarray]:
    """The communication kernels of ``events`` as arrays, one per column (``_kernel_frame``
    makes the candidates' frame of them once): each column taken at the kernels' positions from
    the rank's converted columns (``column_ints``, ``column_codes``), each distinct name tested
    once. A frame of their rows, its ``astype`` and ``where`` cost ~10 ms a rank."""
    kind_c, kind_u = column_codes(events, "kind")
    is_kernel = codes_in(kind_u, kind_c, schema.KERNEL)
    # ``names.is_comm_kernel`` of each distinct name once, on the whole column (codes, no rows taken)
    codes, uniques = column_codes(events, "name")
    coll_c, _ = column_codes(events, "coll_name")
    rows = np.flatnonzero(is_kernel & (regex_flags(uniques, codes, COMM_KERNEL_RE, "search", missing=None)
                                       | (coll_c >= 0)))
    names = _names_at(events, rows)
    coll = texts_at(events, "coll_name", rows)
    lacks = pd.isna(coll)
    if lacks.any():  # from the name (each distinct one once): only a named kernel lacks its collective here
        derived = {n: kernel_coll_name(n) for n in pd.unique(names[lacks])}
        coll[lacks] = [derived[n] for n in names[lacks]]
    out = {
        "rank": column_ints(events, "rank")[0][rows], "group": texts_at(events, "coll_group", rows),
        "seq": _ints_at(events, "coll_seq", rows), "coll_name": coll,
        "start_ns": column_ints(events, "start_ns")[0][rows], "end_ns": column_ints(events, "end_ns")[0][rows],
        "name": names,
    }
    for c in ("device", "stream", "pid", "correlation"):
        out[c] = _ints_at(events, c, rows)
    return out


def _ints_at(events: pd.DataFrame, col: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An integer column's (values, missing) at ``rows`` (``column_ints``: -1 where missing)."""
    values, missing = column_ints(events, col)
    return values[rows], missing[rows]


def _as_numpy(ints: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """``col.astype("Int64").to_numpy()`` of (values, missing): int64 where none is missing, else
    float64 with NaN where missing (as pandas 3 gives numpy a masked integer column)."""
    values, missing = ints
    if not missing.any():
        return values
    out = values.astype(np.float64)
    out[missing] = np.nan
    return out


def _kernel_frame(k: dict) -> pd.DataFrame:
    """The kernels' candidate rows in the sync-point vocabulary (``_sync_columns``), made at once
    from their columns; the empty frame where there are none."""
    n = len(k["rank"])
    if not n:
        return pd.DataFrame()
    start, end = k["start_ns"], k["end_ns"]
    hs, hs_missing = k["host_start_ns"]
    he, he_missing = k["host_end_ns"]
    launch, launch_missing = k["launch_ns"]
    return pd.DataFrame({
        "rank": k["rank"], "source_kind": KERNEL, "group": k["group"],
        "seq": k["seq"],
        "coll_name": k["coll_name"], "start_ns": start, "end_ns": end, "name": k["name"],
        "device": _as_numpy(k["device"]), "stream": _as_numpy(k["stream"]), "pid": _as_numpy(k["pid"]),
        "tid": k["tid"],
        "launch_ns": pd.arrays.IntegerArray(launch, launch_missing),
        "host_start_ns": pd.arrays.IntegerArray(hs, hs_missing),
        "host_end_ns": pd.arrays.IntegerArray(he, he_missing),
        **_sync_columns(start, end, hs, hs_missing, k["coll_name"], COLLECTIVE_KERNEL),
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


def _link_launches(events: pd.DataFrame, k: dict, span_rows: np.ndarray) -> tuple[dict, set]:
    """Kernel -> its launch call (correlation) -> the innermost host collective span around the call.

    ``k``: the kernels' columns (``_comm_kernels``); ``span_rows``: positions in ``events`` of the
    host spans that may hold a launch. Returns the kernels' columns with launch_ns, tid,
    host_start_ns/host_end_ns ((values, missing) pairs) and group/seq/coll filled from the span
    chain where the kernel lacks them, and the index labels of the linked spans. Arrays taken at
    positions throughout: a frame's rows, merge and groupby cost milliseconds each, per rank.
    """
    n = len(k["rank"])
    k = dict(k)
    lacking = (np.ones(n, np.int64), np.ones(n, bool))
    k["launch_ns"] = k["host_start_ns"] = k["host_end_ns"] = lacking
    k["tid"] = missing_ints(n)
    corr_v, corr_miss = k.pop("correlation")
    q_none = k["seq"][1].copy()
    k["seq"] = _as_numpy(k["seq"])  # as a frame of the kernels holds it: float64 where any is missing
    if n == 0:
        return k, set()
    # the runtime calls of these kernels' correlations only: the first call per (rank, pid,
    # correlation), in the events' order, is each kernel's launch (a missing pid matches a missing one)
    kind_c, kind_u = column_codes(events, "kind")
    corr, corr_missing = column_ints(events, "correlation")
    is_rt = codes_in(kind_u, kind_c, schema.RUNTIME) & ~corr_missing
    wanted = np.unique(corr_v[~corr_miss])
    rt = np.flatnonzero(is_rt)
    rt = rt[np.isin(corr[rt], wanted)]
    none = np.iinfo(np.int64).min  # a missing id's key (no real id is int64's minimum)
    pid, pid_missing = column_ints(events, "pid")
    k_pid_v, k_pid_miss = k["pid"]
    k_pid = np.where(k_pid_miss, none, k_pid_v)
    k_corr = np.where(corr_miss, none, corr_v)
    match = first_match((column_ints(events, "rank")[0][rt], np.where(pid_missing[rt], none, pid[rt]), corr[rt]),
                         (k["rank"], k_pid, k_corr))
    has = match >= 0
    at = rt[np.maximum(match, 0)] if rt.size else np.zeros(n, np.int64)  # row 0 where none: masked by ``has``
    starts, ends = column_ints(events, "start_ns")[0], column_ints(events, "end_ns")[0]
    tid, tid_missing = column_ints(events, "tid")
    rt_start, rt_end = np.where(has, starts[at], 0), np.where(has, ends[at], 0)
    rt_tid = np.where(has, tid[at], -1)
    k["launch_ns"] = (np.where(has, rt_start, 1), ~has)
    no_tid = ~has | tid_missing[at]
    k["tid"] = _as_numpy((np.where(no_tid, 1, rt_tid), no_tid))
    linked: set = set()
    if not has.any() or not span_rows.size:
        return k, linked
    # innermost host collective span on the launching thread around each launch call
    sp_key = _thread_key({"rank": column_ints(events, "rank")[0][span_rows], "pid": pid[span_rows],
                          "tid": tid[span_rows]})
    sp_start, sp_end = starts[span_rows], ends[span_rows]
    sp_group = texts_at(events, "coll_group", span_rows)
    ev_seq, ev_seq_missing = column_ints(events, "coll_seq")
    sp_seq = np.where(ev_seq_missing[span_rows], None, ev_seq[span_rows].astype(object))  # Python ints, None where missing
    sp_coll = texts_at(events, "coll_name", span_rows)
    sp_labels = events.index[span_rows].to_numpy()
    rows_all = np.flatnonzero(has)
    ln_key = _thread_key({"rank": k["rank"][has], "pid": np.where(k_pid_miss, -1, k_pid_v)[has], "tid": rt_tid[has]})
    group = k["group"].copy()
    coll = k["coll_name"].copy()
    # what each kernel lacks, tested once (not per thread and level): a filled field takes the
    # span's value, whose own tests are made once per span. Missing is any missing value (None,
    # NaN, NA): a span without one must not hide its enclosing span's
    g_none = pd.isna(group)
    seq = k["seq"].astype(object)  # as the frame gave them: Python floats where any is missing (``_int64_array``)
    c_weak = pd.isna(coll) | _equals(coll, "nccl") | _equals(coll, "comm")
    hs = np.full(n, -1, dtype=np.int64)
    he = np.full(n, -1, dtype=np.int64)
    for thread in np.unique(ln_key):
        on = np.flatnonzero(sp_key == thread)
        if not on.size:
            continue
        on = on[np.lexsort((-sp_end[on], sp_start[on]))]  # by start, longest first (stable)
        starts_t, ends_t = sp_start[on], sp_end[on]
        parent = nesting_parents(starts_t, ends_t)
        mine = ln_key == thread
        t0, t1 = rt_start[has][mine], rt_end[has][mine]
        cand = np.searchsorted(starts_t, t0, side="right") - 1
        for _ in range(8):  # climb to the first span that encloses the call
            bad = (cand >= 0) & (ends_t[np.maximum(cand, 0)] < t1)
            if not bad.any():
                break
            cand = np.where(bad, parent[np.maximum(cand, 0)], cand)
        ok = (cand >= 0) & (ends_t[np.maximum(cand, 0)] >= t1)
        rows = rows_all[mine][ok]
        inner = cand[ok]
        hs[rows] = starts_t[inner]
        he[rows] = ends_t[inner]
        s_group, s_seq, s_coll = sp_group[on], sp_seq[on], sp_coll[on]
        labels = sp_labels[on]
        # the span's fields tested once per span, not per kernel and level
        g_has, c_has = ~pd.isna(s_group), ~pd.isna(s_coll)
        q_has = ~pd.isna(s_seq)
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
    k["group"] = group
    k["seq"] = _int64_array(seq)
    k["coll_name"] = coll
    k["host_start_ns"] = (np.maximum(hs, 0), hs < 0)
    k["host_end_ns"] = (np.maximum(he, 0), he < 0)
    return k, linked


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


def _equals(values: np.ndarray, text: str) -> np.ndarray:
    """``v == text`` for each object, as Python's ``in (..., text)`` compares (identity, then ==);
    missing values (None, NaN, NA) are not ``text``."""
    values = np.asarray(values, dtype=object)
    out = np.zeros(len(values), dtype=bool)
    ok = ~pd.isna(values)
    if ok.any():
        out[ok] = np.asarray(values[ok] == text, dtype=bool)
    return out


def _holds_nccl_span(events: pd.DataFrame, spans: np.ndarray, nccl: np.ndarray) -> np.ndarray:
    """True for spans (positions) with an NCCL span (``nccl:*`` record function, NCCL NVTX range;
    positions ``nccl``) starting inside them on the same thread: torch's record_param_comms of a
    NCCL group, even with no kernel seen."""
    out = np.zeros(spans.size, dtype=bool)
    if not spans.size or not nccl.size:
        return out
    none = np.iinfo(np.int64).min  # a missing id is its own thread id (as grouping with dropna=False)

    def thread(rows: np.ndarray) -> np.ndarray:
        ids = {}
        for c in ("rank", "pid", "tid"):
            v, miss = column_ints(events, c)
            ids[c] = np.where(miss[rows], none, v[rows])
        return _thread_key(ids)
    starts = column_ints(events, "start_ns")[0]
    ends = column_ints(events, "end_ns")[0]
    n_key, s_key = thread(nccl), thread(spans)
    for k in np.unique(n_key):
        inner = np.sort(starts[nccl[n_key == k]])
        m = s_key == k
        lo = np.searchsorted(inner, starts[spans[m]], side="left")
        hi = np.searchsorted(inner, ends[spans[m]], side="right")
        out[m] = hi > lo
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
