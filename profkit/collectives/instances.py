"""Collective instances: the candidates of every rank (``collectives.candidates``) matched across
ranks, one row per (rank, collective instance), ``instance`` shared by all participants.

Matching across ranks:

- by (group, sequence number) where the source has sequence numbers;
- else per key (source kind, group, collective name, and the stream when the group is unknown),
  each rank's sequence against the key's anchor (its lowest rank):
  1. by order with a lag (a window edge cut instances off one rank): the lag whose end
     differences are most often constant between neighbours (first differences cancel any clock
     offset and all but ppm of drift);
  2. when no lag explains the ends (instances missing inside the window, e.g. sampled traces):
     votes on end differences pooled over the keys of the rank pair, then tracking along time
     with a line (offset + drift) refitted as matches grow.
  Both are invariant to a clock offset and drift, so matching runs before alignment. Periodic
  programs are ambiguous by whole periods; order matching assumes the windows start at the
  same instance (true for profkit's step-window captures), and says so in ``notes``.

An instance is complete when every participant has it (participants: the ranks that have that
group, or that key). ``instances_from_candidates`` keeps complete instances unless asked otherwise and
reports what it dropped in ``df.attrs["report"]``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.collectives.sequences import CPU_SPAN, KERNEL, LAUNCH_SPAN, TOL_NS, match_sequences

_PRIORITY = {KERNEL: 0, CPU_SPAN: 1, LAUNCH_SPAN: 2}

INSTANCE_COLUMNS = [
    "rank", "instance", "group", "seq", "coll_name", "source_kind", "key", "match",
    "start_ns", "end_ns", "launch_ns", "host_start_ns", "host_end_ns",
    "name", "device", "stream", "pid", "tid", "n_participants", "n_present", "complete",
    "arrive_ns", "exit_ns", "span_start_ns", "span_name", "evidence", "wait_name",
]
# the candidate columns matching reads: ``instances_from_candidates`` of only these gives the same
# instances (ids, participants, presence) with only the columns among them (the clock estimate's use)
MATCH_INPUT_COLUMNS = ["rank", "source_kind", "group", "seq", "coll_name", "stream", "start_ns", "end_ns"]
MATCH_COLUMNS = [
    "instance", "group", "seq", "coll_name", "source_kind", "key", "n_participants", "n_present", "complete",
    "ranks", "first_start_ns", "first_rank", "last_start_ns", "last_rank", "arrival_skew_ns",
    "first_end_ns", "last_end_ns", "end_spread_ns",
]


def instances_from_candidates(rows: pd.DataFrame, complete_only: bool = True,
                              columns: list[str] | None = None) -> pd.DataFrame:
    """One row per (rank, collective instance), ``instance`` shared by the same instance on all
    ranks, from candidate rows of every rank (``candidates.collective_candidates``).

    ``complete_only`` drops instances some participant lacks (window edges, dropped events);
    alignment passes False, since two ranks that both saw an instance still share its end.
    ``columns``: the only columns wanted (with ``instance``, ``key`` and ``complete``, which the
    report reads): the others are not taken in instance order (the clock estimate reads five of
    them; taking every rank's string columns row by row was ~0.3 s of its ~1.5 s at DEP32 x 1,000).
    ``df.attrs["report"]``: counts of instances, complete ones, dropped rows, and notes.
    """
    notes: list[str] = []
    if rows is None or rows.empty:
        out = _only(_empty_instances(), columns)
        out.attrs["report"] = _report(out, 0, notes)
        return out
    matched, unmatched = _match(rows, notes)
    out = _finish(matched, columns)
    n_all = int(out["instance"].nunique()) if len(out) else 0
    report = _report(out, unmatched, notes)
    if complete_only and len(out):
        out = out[out["complete"]].reset_index(drop=True)
    report["instances_returned"] = int(out["instance"].nunique()) if len(out) else 0
    report["instances_total"] = n_all
    out.attrs["report"] = report
    return out


def match_instances(inst: pd.DataFrame) -> pd.DataFrame:
    """One row per instance: participants, first / last arrival (start) and who, end spread.

    The straggler analysis reads ``last_rank`` and ``arrival_skew_ns`` (last start - first start);
    ``end_spread_ns`` shows how well the ends coincide (after alignment: the residual error).
    """
    if inst.empty:
        return pd.DataFrame(columns=MATCH_COLUMNS)
    iid = inst["instance"].to_numpy(np.int64)
    start, rank = inst["start_ns"].to_numpy(np.int64), inst["rank"].to_numpy(np.int64)
    # rows by (instance, start, rank): each instance's first arrival heads its run; the last one
    # heads it when sorted by start descending (rank ascending on ties), as before
    order = np.lexsort((rank, start, iid))
    heads = np.flatnonzero(np.r_[True, iid[order][1:] != iid[order][:-1]])
    first_rows, last_rows = order[heads], np.lexsort((rank, -start, iid))[heads]
    index = pd.Index(iid[first_rows], name="instance")
    first = inst[["group", "seq", "coll_name", "source_kind", "key", "n_participants", "complete"]]
    first = first.take(first_rows).set_axis(index)
    end = inst["end_ns"].to_numpy(np.int64)[order]
    out = pd.DataFrame({
        "group": first["group"],
        "seq": first["seq"],
        "coll_name": first["coll_name"],
        "source_kind": first["source_kind"],
        "key": first["key"],
        "n_participants": first["n_participants"],
        "n_present": pd.Series(np.diff(np.r_[heads, order.size]).astype(np.int64), index=index),
        "complete": first["complete"],
        "ranks": _rank_tuples(inst, index),
        "first_start_ns": pd.Series(start[first_rows], index=index),
        "first_rank": pd.Series(rank[first_rows], index=index),
        "last_start_ns": pd.Series(start[last_rows], index=index),
        "last_rank": pd.Series(rank[last_rows], index=index),
        "first_end_ns": pd.Series(np.minimum.reduceat(end, heads), index=index),
        "last_end_ns": pd.Series(np.maximum.reduceat(end, heads), index=index),
    })
    out["arrival_skew_ns"] = out["last_start_ns"] - out["first_start_ns"]
    out["end_spread_ns"] = out["last_end_ns"] - out["first_end_ns"]
    out = out.reset_index()
    return out[MATCH_COLUMNS]



def _rank_tuples(df: pd.DataFrame, instances: pd.Index) -> pd.Series:
    """Per instance (``instances``: every instance of ``df``, ascending), its ranks as a sorted tuple
    of ints; built from one sort, not a Python function per group (there are tens of thousands)."""
    inst = df["instance"].to_numpy(np.int64)
    rank = df["rank"].to_numpy(np.int64)
    order = np.lexsort((rank, inst))
    inst, ranks = inst[order], rank[order].tolist()
    bounds = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1], True]).tolist()
    tuples = [tuple(ranks[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    if len(tuples) != len(instances):
        raise ValueError("instances and their rows disagree")
    return pd.Series(tuples, index=instances, dtype=object)

# ---- matching ---------------------------------------------------------------------------------
def _order_key(rows: pd.DataFrame) -> pd.Series:
    stream = rows["stream"].astype("Int64").astype("string").fillna("")
    use_stream = (rows["source_kind"] == KERNEL) & rows["group"].isna()
    stream = stream.where(use_stream, "")
    stream = ("s" + stream).where(stream != "", "")
    group = rows["group"].astype("string").fillna("")
    return rows["source_kind"].astype(str) + "|" + group + "|" + rows["coll_name"].astype(str) + "|" + stream


def _match(rows: pd.DataFrame, notes: list[str]) -> tuple[pd.DataFrame, int]:
    """Give every candidate row an instance label, (``key``, ``_num``): its sequence number, or its
    index in the key's anchor sequence; drop rows no other rank could be matched to."""
    has_seq = rows["seq"].notna().to_numpy(dtype=bool) & rows["group"].notna().to_numpy(dtype=bool)
    out = []
    unmatched = 0
    if has_seq.any():
        s = rows if has_seq.all() else rows[has_seq]
        kind, kinds = pd.factorize(s["source_kind"])
        prio = np.array([_PRIORITY.get(k, np.nan) for k in kinds] + [np.nan], dtype=np.float64)[kind]
        group, groups = pd.factorize(s["group"], sort=True)  # codes in the order of the names
        seq, rank = s["seq"].to_numpy(np.int64), s["rank"].to_numpy(np.int64)
        # one row per (rank, group, seq): the kernel's, else the CPU span's, else the launch's
        order = np.lexsort((prio, seq, group, rank))
        rk, gr, sq = rank[order], group[order], seq[order]
        dup = np.r_[False, (rk[1:] == rk[:-1]) & (gr[1:] == gr[:-1]) & (sq[1:] == sq[:-1])]
        keep = order[~dup]
        s = s.iloc[keep]  # a new frame: its columns may be set
        keys = "seq|" + pd.Series(groups).astype(str)
        s["key"] = pd.Series(keys.array.take(group[keep]), index=s.index)
        s["match"] = "seq"
        s["_num"] = seq[keep]
        out.append(s)
    o = rows[~has_seq].copy() if not has_seq.all() else rows.iloc[:0]
    if len(o):
        o["key"] = _order_key(o).to_numpy()
        labeled, lost = _match_by_order(o, notes)
        unmatched += lost
        out.append(labeled)
    if len(out) > 1:
        return pd.concat(out, ignore_index=True), unmatched
    return (out[0].reset_index(drop=True) if out else rows.iloc[:0]), unmatched


def _match_by_order(o: pd.DataFrame, notes: list[str]) -> tuple[pd.DataFrame, int]:
    """Label rows without sequence numbers: each rank's sequence per key against the key's anchor."""
    o = o.sort_values(["key", "rank", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    o["match"] = "order"
    label = np.full(len(o), -1, dtype=np.int64)  # index in the anchor's sequence; -1: not matched
    anchors = o.groupby("key")["rank"].min()
    ends = {(k, r): g["end_ns"].to_numpy(dtype=np.int64) for (k, r), g in o.groupby(["key", "rank"], sort=False)}
    rows_of = {(k, r): g.index.to_numpy() for (k, r), g in o.groupby(["key", "rank"], sort=False)}
    kind_of = o.groupby("key")["source_kind"].first().to_dict()
    for key, anchor in anchors.items():
        idx = rows_of[(key, anchor)]
        label[idx] = np.arange(len(idx))
    method = np.array(["order"] * len(o), dtype=object)
    # pair each rank with its keys' anchors (usually one anchor: the lowest rank)
    by_pair: dict[tuple[int, int], list[str]] = {}
    for key, r in ends:
        a = int(anchors[key])
        if r != a:
            by_pair.setdefault((a, int(r)), []).append(key)
    for (a, r), keys in sorted(by_pair.items()):
        a_seq = {k: ends[(k, a)] for k in keys}
        b_seq = {k: ends[(k, r)] for k in keys}
        tol = {k: TOL_NS[kind_of[k]] for k in keys}
        pairs, how = match_sequences(a_seq, b_seq, tol)
        if how != "order":
            notes.append(f"rank {r} vs rank {a}: instances matched by {how} (order did not explain the ends)")
        for k in keys:
            ia, ib = pairs.get(k, (np.empty(0, np.int64), np.empty(0, np.int64)))
            rows = rows_of[(k, r)][ib]
            label[rows] = ia
            method[rows] = how
    o["match"] = method
    o["_num"] = label
    lost = int((label < 0).sum())
    return o[label >= 0], lost


_REPORTED = {"instance", "key", "complete"}  # what ``_report`` reads


def _only(frame: pd.DataFrame, columns: list[str] | None) -> pd.DataFrame:
    """``frame``'s ``columns`` and those the report reads, in its own order (all of them: None)."""
    if columns is None:
        return frame
    wanted = set(columns) | _REPORTED
    return frame[[c for c in frame.columns if c in wanted]]


def _finish(m: pd.DataFrame, columns: list[str] | None = None) -> pd.DataFrame:
    """Participants, presence and instance ids of the labelled rows, on integer codes: a label is
    (``key``, ``_num``), and the label strings ``key#num`` are made once per instance, where their
    order breaks ties. ``columns``: see ``instances_from_candidates``."""
    if m.empty:
        return _only(_empty_instances(), columns)
    part, parts = pd.factorize(m["key"])
    rank = m["rank"].to_numpy(np.int64)
    num = m["_num"].to_numpy(np.int64)
    rank0 = rank - rank.min()  # from 0: ranks and codes share one int64
    span = np.int64(rank0.max() + 1)
    lab, labels = pd.factorize(part * np.int64(num.max() - num.min() + 1) + (num - num.min()))
    n_participants = _distinct_ranks(part, rank0, span, len(parts))[part]
    by_rank = np.lexsort((rank, lab))
    ls, rs = lab[by_rank], rank[by_rank]
    new_lab = np.r_[True, ls[1:] != ls[:-1]]
    n_present = np.bincount(ls[new_lab | np.r_[True, rs[1:] != rs[:-1]]], minlength=labels.size)[lab]
    # instance ids in order of the lowest present rank's start (then of the label ``key#num``)
    first = by_rank[new_lab]  # per label, its lowest rank's first row
    names = [f"{k}#{n}" for k, n in zip(np.asarray(parts, dtype=object)[part[first]].tolist(), num[first].tolist())]
    name_rank = np.empty(len(names), np.int64)
    name_rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    ids = np.empty(labels.size, np.int64)
    ids[np.lexsort((name_rank, m["start_ns"].to_numpy(np.int64)[first]))] = np.arange(labels.size)
    instance = ids[lab]
    m = m.assign(n_participants=n_participants, n_present=n_present, complete=n_present == n_participants,
                 instance=instance)
    m = _only(m, columns)
    m = m.take(np.lexsort((rank, instance))).reset_index(drop=True)
    for c in ("launch_ns", "host_start_ns", "host_end_ns", "seq", "device", "stream", "pid", "tid"):
        if c in m and m[c].dtype != "Int64":
            m[c] = m[c].astype("Int64")
    for c in ("arrive_ns", "exit_ns", "span_start_ns"):
        if c in m and m[c].dtype != np.int64:  # an int64 column has no nulls to fill
            m[c] = m[c].astype("Int64").fillna(m["start_ns" if c != "exit_ns" else "end_ns"].astype("Int64")).astype("int64")
    for c in ("span_name", "evidence", "wait_name", "group"):
        if c in m:
            m[c] = _objects(m[c])
    return m[[c for c in INSTANCE_COLUMNS if c in m]]  # all of them from full candidate rows


def _distinct_ranks(code: np.ndarray, rank0: np.ndarray, span: np.int64, n: int) -> np.ndarray:
    """Per code (0..n-1): how many distinct ranks (``rank0``: from 0 to ``span``) its rows have."""
    if n * int(span) <= 16_000_000:  # a table of (code, rank) seen
        seen = np.zeros(n * int(span), bool)
        seen[code * span + rank0] = True
        return seen.reshape(n, int(span)).sum(axis=1).astype(np.int64)
    pairs = np.unique(code * span + rank0)
    return np.bincount(pairs // span, minlength=n).astype(np.int64)


def _objects(col: pd.Series) -> pd.Series:
    """``col`` as object, None where null; each distinct string one shared object."""
    codes, uniques = pd.factorize(col)
    values = np.append(np.asarray(uniques, dtype=object), None)
    return pd.Series(values[codes], index=col.index, dtype=object)


def _empty_instances() -> pd.DataFrame:
    out = pd.DataFrame({c: pd.Series(dtype=object) for c in INSTANCE_COLUMNS})
    for c in ("rank", "instance", "start_ns", "end_ns", "n_participants", "n_present", "arrive_ns", "exit_ns",
              "span_start_ns"):
        out[c] = out[c].astype("int64")
    for c in ("launch_ns", "host_start_ns", "host_end_ns", "seq", "device", "stream", "pid", "tid"):
        out[c] = out[c].astype("Int64")
    out["complete"] = out["complete"].astype(bool)
    return out


def _report(out: pd.DataFrame, unmatched_rows: int, notes: list[str]) -> dict:
    if out.empty:
        return {"instances": 0, "complete": 0, "incomplete": 0, "unmatched_rows": unmatched_rows,
                "by_key": {}, "notes": notes}
    inst = out.groupby("instance").agg(key=("key", "first"), complete=("complete", "first"))
    by_key = {}
    for key, g in inst.groupby("key"):
        by_key[str(key)] = {"instances": int(len(g)), "complete": int(g["complete"].sum()),
                            "incomplete": int((~g["complete"]).sum())}
    return {
        "instances": int(len(inst)),
        "complete": int(inst["complete"].sum()),
        "incomplete": int((~inst["complete"]).sum()),
        "unmatched_rows": int(unmatched_rows),
        "by_key": by_key,
        "notes": notes,
    }
