"""The communication kernels' candidate rows made on arrays (issue #16's twentieth round) are the
rows the frame spelling made: the same values, dtypes, missing values and linked spans.

``_comm_kernels`` / ``_link_launches`` / ``_kernel_frame`` take each column at the kernels'
positions and make the frame once; the reference below is the frame spelling they replaced
(kept here as it was). Compared on random ranks: kernels with and without their collective,
group, sequence number, pid or correlation, launches on threads inside nested collective spans
(which fill what a kernel lacks), launches outside any span, and frames of Arrow and of numpy
columns. The 29 public traces and real captures gave equal candidates too (checked when the
change was made; ``test_analyze_golden.py`` keeps their analyses).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings, strategies as st
from pandas.testing import assert_frame_equal

from profkit import schema
from profkit.collectives import candidates
from profkit.collectives.candidates import (
    KERNEL,
    _equals,
    _identity_columns,
    _int64_array,
    _take,
    kernel_coll_name,
)
from profkit.collectives.syncpoints import (
    _thread_key,
    column_codes,
    column_ints,
    missing_ints,
    sharing,
    texts_at,
)
from profkit.distinct import codes_in, regex_flags
from profkit.intervals import nesting_parents
from profkit.keys import first_match
from profkit.names import COMM_KERNEL_RE


# ---- the frame spelling (as it was before the arrays) -------------------------------------------
_KERNEL_COLUMNS = ("rank", "name", "start_ns", "end_ns", "device", "stream", "pid", "correlation", "coll_name",
                   "coll_group", "coll_seq")


def _comm_kernels_pandas(events: pd.DataFrame) -> pd.DataFrame:
    kind_c, kind_u = column_codes(events, "kind")
    is_kernel = codes_in(kind_u, kind_c, schema.KERNEL)
    # ``names.is_comm_kernel`` of each distinct name once, on the whole column (codes, no rows taken)
    codes, uniques = column_codes(events, "name")
    comm = is_kernel & (regex_flags(uniques, codes, COMM_KERNEL_RE, "search", missing=None)
                        | events["coll_name"].notna().to_numpy(dtype=bool))
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


def _link_launches_pandas(events: pd.DataFrame, kernels: pd.DataFrame, span_rows: np.ndarray) -> tuple[pd.DataFrame, set]:
    """Kernel -> its launch call (correlation) -> the innermost host collective span around the call.

    ``span_rows``: positions in ``events`` of the host spans that may hold a launch. Returns kernels
    with launch_ns, tid, host_start_ns/host_end_ns and group/seq/coll filled from the span chain
    where the kernel lacks them, and the index labels of the linked spans. Arrays taken at
    positions throughout: a frame's rows, merge and groupby cost milliseconds each, per rank.
    """
    n = len(kernels)
    kernels = kernels.assign(launch_ns=missing_ints(n),
                             host_start_ns=missing_ints(n),
                             host_end_ns=missing_ints(n))
    if n == 0:
        return kernels.drop(columns="correlation"), set()
    # the runtime calls of these kernels' correlations only: the first call per (rank, pid,
    # correlation), in the events' order, is each kernel's launch (a missing pid matches a missing one)
    kind_c, kind_u = column_codes(events, "kind")
    corr, corr_missing = column_ints(events, "correlation")
    is_rt = codes_in(kind_u, kind_c, schema.RUNTIME) & ~corr_missing
    k_corr = kernels["correlation"]
    wanted = np.unique(k_corr[k_corr.notna()].to_numpy(dtype=np.int64))
    rt = np.flatnonzero(is_rt)
    rt = rt[np.isin(corr[rt], wanted)]
    none = np.iinfo(np.int64).min  # a missing id's key (no real id is int64's minimum)
    pid, pid_missing = column_ints(events, "pid")
    k_pid = kernels["pid"]
    k_pid = np.where(k_pid.isna().to_numpy(bool), none, k_pid.to_numpy(dtype=np.int64, na_value=0))
    k_corr = np.where(k_corr.isna().to_numpy(bool), none, k_corr.to_numpy(dtype=np.int64, na_value=0))
    match = first_match((column_ints(events, "rank")[0][rt], np.where(pid_missing[rt], none, pid[rt]), corr[rt]),
                         (kernels["rank"].to_numpy(np.int64), k_pid, k_corr))
    has = match >= 0
    at = rt[np.maximum(match, 0)] if rt.size else np.zeros(n, np.int64)  # row 0 where none: masked by ``has``
    starts, ends = column_ints(events, "start_ns")[0], column_ints(events, "end_ns")[0]
    tid, tid_missing = column_ints(events, "tid")
    rt_start, rt_end = np.where(has, starts[at], 0), np.where(has, ends[at], 0)
    rt_tid = np.where(has, tid[at], -1)
    kernels["launch_ns"] = pd.arrays.IntegerArray(np.where(has, rt_start, 1), ~has)
    no_tid = ~has | tid_missing[at]
    kernels["tid"] = pd.arrays.IntegerArray(np.where(no_tid, 1, rt_tid), no_tid).to_numpy()
    linked: set = set()
    if not has.any() or not span_rows.size:
        return kernels.drop(columns="correlation"), linked
    # innermost host collective span on the launching thread around each launch call
    sp_key = _thread_key({"rank": column_ints(events, "rank")[0][span_rows], "pid": pid[span_rows],
                          "tid": tid[span_rows]})
    sp_start, sp_end = starts[span_rows], ends[span_rows]
    sp_group = texts_at(events, "coll_group", span_rows)
    seq, seq_missing = column_ints(events, "coll_seq")
    sp_seq = np.where(seq_missing[span_rows], None, seq[span_rows].astype(object))  # Python ints, None where missing
    sp_coll = texts_at(events, "coll_name", span_rows)
    sp_labels = events.index[span_rows].to_numpy()
    rows_all = np.flatnonzero(has)
    ln_key = _thread_key({"rank": kernels["rank"].to_numpy(np.int64)[has],
                          "pid": kernels["pid"].to_numpy(dtype=np.int64, na_value=-1)[has], "tid": rt_tid[has]})
    group = kernels["group"].to_numpy(dtype=object).copy()
    seq = kernels["seq"].to_numpy(dtype=object).copy()
    coll = kernels["coll_name"].to_numpy(dtype=object).copy()
    # what each kernel lacks, tested once (not per thread and level): a filled field takes the
    # span's value, whose own tests are made once per span. Missing is any missing value: pandas 3
    # gives numpy an Int64 column's missing values as NaN, and a string column's too once any row
    # has a string, which an identity test for None / NA took for a value (the kernel kept none,
    # and a span without one hid its enclosing span's)
    g_none = pd.isna(group)
    q_none = pd.isna(seq)
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
    kernels["group"] = group
    kernels["seq"] = _int64_array(seq)
    kernels["coll_name"] = coll
    kernels["host_start_ns"] = pd.arrays.IntegerArray(np.maximum(hs, 0), hs < 0)
    kernels["host_end_ns"] = pd.arrays.IntegerArray(np.maximum(he, 0), he < 0)
    return kernels.drop(columns="correlation"), linked


def _with_sync_columns_pandas(rows: pd.DataFrame, evidence: str) -> pd.DataFrame:
    """GPU collectives in the sync-point vocabulary: the rank arrives when its kernel starts (its
    launch, for a launch span) and is released when it ends; the host span is the launch's."""
    if not len(rows):
        return rows
    host = rows["host_start_ns"].astype("Int64")
    return rows.assign(arrive_ns=rows["start_ns"].to_numpy(np.int64), exit_ns=rows["end_ns"].to_numpy(np.int64),
                       span_start_ns=host.fillna(rows["start_ns"].astype("Int64")).to_numpy(np.int64),
                       span_name=None, evidence=evidence, wait_name=rows["coll_name"].to_numpy(dtype=object))



# ---- random ranks ------------------------------------------------------------------------------
_KERNEL_NAMES = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 "void deep_ep::internode::dispatch<8>(int*)", "cross_device_reduce_1stage<bf16>",
                 "ncclDevKernel_Generic", "gemm_bf16", "void at::native::all_to_all_kernel(float*)"]
_SPAN_NAMES = ["record_param_comms", "nccl:all_reduce", "c10d::allreduce_", "forward", "nccl:_all_gather_base"]
_COLLS = [None, None, "all_reduce", "nccl", "comm", "all_gather"]
_GROUPS = [None, None, "0", "1", "dp"]
_SEQS = [None, None, 3, 7, 2**60 + 1]  # past float64's integers: a missing one sends them through it


def _rank_rows(rng: np.random.Generator, rank: int, n_kernels: int, n_spans: int) -> list[dict]:
    rows = []
    tids = [11, 12]
    for i in range(n_spans):  # nested collective spans on two threads, some without a field
        tid = tids[i % 2]
        start = int(rng.integers(0, 2_000))
        rows.append({"rank": rank, "kind": schema.CPU_OP, "name": _SPAN_NAMES[int(rng.integers(len(_SPAN_NAMES)))],
                     "start_ns": start, "end_ns": start + int(rng.integers(1, 900)), "pid": 5, "tid": tid,
                     "coll_name": _COLLS[int(rng.integers(len(_COLLS)))], "coll_group": _GROUPS[int(rng.integers(len(_GROUPS)))],
                     "coll_seq": _SEQS[int(rng.integers(len(_SEQS)))]})
    for i in range(n_kernels):
        corr = None if rng.random() < 0.15 else 1_000 + i
        pid = None if rng.random() < 0.1 else 5
        launch = int(rng.integers(0, 2_400))
        if corr is not None and rng.random() < 0.85:  # its launch call (some correlations have none)
            rows.append({"rank": rank, "kind": schema.RUNTIME, "name": "cudaLaunchKernel", "start_ns": launch,
                         "end_ns": launch + int(rng.integers(1, 30)), "pid": pid,
                         "tid": None if rng.random() < 0.1 else tids[int(rng.integers(2))], "correlation": corr})
        name = _KERNEL_NAMES[int(rng.integers(len(_KERNEL_NAMES)))]
        coll = _COLLS[int(rng.integers(len(_COLLS)))]
        rows.append({"rank": rank, "kind": schema.KERNEL, "name": name, "start_ns": launch + 50,
                     "end_ns": launch + 50 + int(rng.integers(1, 400)), "pid": pid, "tid": None,
                     "device": None if rng.random() < 0.1 else 0, "stream": 7, "correlation": corr,
                     "coll_name": coll, "coll_group": _GROUPS[int(rng.integers(len(_GROUPS)))],
                     "coll_seq": _SEQS[int(rng.integers(len(_SEQS)))]})
    return rows


def _both(events: pd.DataFrame) -> None:
    with sharing(events):
        kind_c, kind_u = column_codes(events, "kind")
        host = np.flatnonzero(codes_in(kind_u, kind_c, (schema.CPU_OP, schema.CPU_SPAN)))
        want, want_linked = _link_launches_pandas(events, _comm_kernels_pandas(events), host)
        want = _with_sync_columns_pandas(want, candidates.COLLECTIVE_KERNEL)
        got, got_linked = candidates._link_launches(events, candidates._comm_kernels(events), host)
        got = candidates._kernel_frame(got)
    assert got_linked == want_linked
    if not len(want):
        assert not len(got)
        return
    assert_frame_equal(got, want, check_exact=True)
    for c in want.columns:  # None stays None (not NaN), an int an int
        w, g = want[c].to_numpy(dtype=object), got[c].to_numpy(dtype=object)
        assert [type(v) for v in g] == [type(v) for v in w], c


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), ranks=st.integers(1, 2), n_kernels=st.integers(0, 25),
       n_spans=st.integers(0, 12), numpy_columns=st.booleans())
def test_kernel_candidates_are_the_frame_spellings(seed, ranks, n_kernels, n_spans, numpy_columns):
    rng = np.random.default_rng(seed)
    rows = [r for rank in range(ranks) for r in _rank_rows(rng, rank, n_kernels, n_spans)]
    events = schema.from_records(rows) if rows else schema.empty_frame()
    if numpy_columns:  # a frame of numpy-backed columns (a caller's own), not Arrow's: masked ints, objects
        events = pd.DataFrame({c: events[c].astype("Int64") if events[c].dtype.kind in "iu"
                               else events[c].to_numpy(dtype=object) for c in events.columns})
    _both(events)


def test_every_field_filled_from_the_enclosing_spans():
    """A kernel without group, sequence number and collective takes them from the spans around its
    launch (the innermost first); one whose launch is outside any span keeps what it has."""
    rows = [{"rank": 0, "kind": schema.CPU_OP, "name": "record_param_comms", "start_ns": 0, "end_ns": 100,
             "pid": 1, "tid": 2, "coll_group": "dp", "coll_seq": 9, "coll_name": "all_gather"},
            {"rank": 0, "kind": schema.CPU_OP, "name": "nccl:all_gather", "start_ns": 10, "end_ns": 50,
             "pid": 1, "tid": 2},
            {"rank": 0, "kind": schema.RUNTIME, "name": "cudaLaunchKernel", "start_ns": 20, "end_ns": 25,
             "pid": 1, "tid": 2, "correlation": 1},
            {"rank": 0, "kind": schema.KERNEL, "name": "ncclDevKernel_Generic", "start_ns": 30, "end_ns": 90,
             "pid": 1, "correlation": 1},
            {"rank": 0, "kind": schema.KERNEL, "name": "ncclDevKernel_Generic", "start_ns": 300, "end_ns": 390,
             "pid": 1, "correlation": 2}]
    events = schema.from_records(rows)
    _both(events)
    with sharing(events):
        kind_c, kind_u = column_codes(events, "kind")
        host = np.flatnonzero(codes_in(kind_u, kind_c, (schema.CPU_OP,)))
        got = candidates._kernel_frame(candidates._link_launches(events, candidates._comm_kernels(events), host)[0])
    assert got["group"].tolist()[0] == "dp" and got["seq"].tolist()[0] == 9
    assert got["coll_name"].tolist() == ["all_gather", "nccl"]
    assert got["host_start_ns"].tolist()[0] == 10 and got["host_start_ns"].isna().tolist() == [False, True]


def test_a_nameless_kernel_of_a_collective_is_a_candidate():
    """A kernel without a name but with its collective (a reader's field) is a candidate named as
    missing; the frame spelling raised on it (it derived a collective from every name)."""
    rows = [{"rank": 0, "kind": schema.KERNEL, "name": None, "start_ns": 30, "end_ns": 90, "pid": 1,
             "coll_name": "all_reduce"},
            {"rank": 0, "kind": schema.KERNEL, "name": None, "start_ns": 100, "end_ns": 190, "pid": 1},
            {"rank": 0, "kind": schema.KERNEL, "name": "ncclDevKernel_Generic", "start_ns": 200, "end_ns": 290}]
    got = candidates.collective_candidates(schema.from_records(rows))
    assert got["coll_name"].tolist() == ["all_reduce", "nccl"]
    assert got["name"].isna().tolist() == [True, False]
