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
MATCH_COLUMNS = [
    "instance", "group", "seq", "coll_name", "source_kind", "key", "n_participants", "n_present", "complete",
    "ranks", "first_start_ns", "first_rank", "last_start_ns", "last_rank", "arrival_skew_ns",
    "first_end_ns", "last_end_ns", "end_spread_ns",
]


def instances_from_candidates(rows: pd.DataFrame, complete_only: bool = True) -> pd.DataFrame:
    """One row per (rank, collective instance), ``instance`` shared by the same instance on all
    ranks, from candidate rows of every rank (``candidates.collective_candidates``).

    ``complete_only`` drops instances some participant lacks (window edges, dropped events);
    alignment passes False, since two ranks that both saw an instance still share its end.
    ``df.attrs["report"]``: counts of instances, complete ones, dropped rows, and notes.
    """
    notes: list[str] = []
    if rows is None or rows.empty:
        out = _empty_instances()
        out.attrs["report"] = _report(out, 0, notes)
        return out
    matched, unmatched = _match(rows, notes)
    out = _finish(matched)
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
    df = inst.sort_values(["instance", "start_ns", "rank"], kind="stable")
    g = df.groupby("instance", sort=True)
    first = g.head(1).set_index("instance")
    last = df.sort_values(["instance", "start_ns", "rank"], ascending=[True, False, True], kind="stable")
    last = last.groupby("instance", sort=True).head(1).set_index("instance")
    out = pd.DataFrame({
        "group": first["group"],
        "seq": first["seq"],
        "coll_name": first["coll_name"],
        "source_kind": first["source_kind"],
        "key": first["key"],
        "n_participants": first["n_participants"],
        "n_present": g["rank"].size(),
        "complete": first["complete"],
        "ranks": _rank_tuples(df, first.index),
        "first_start_ns": first["start_ns"].astype("int64"),
        "first_rank": first["rank"].astype("int64"),
        "last_start_ns": last["start_ns"].astype("int64"),
        "last_rank": last["rank"].astype("int64"),
        "first_end_ns": g["end_ns"].min().astype("int64"),
        "last_end_ns": g["end_ns"].max().astype("int64"),
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
    """Give every candidate row an instance label; drop rows no other rank could be matched to."""
    rows = rows.copy()
    has_seq = rows["seq"].notna().to_numpy(dtype=bool) & rows["group"].notna().to_numpy(dtype=bool)
    out = []
    unmatched = 0
    if has_seq.any():
        s = rows[has_seq].copy()
        s["_prio"] = s["source_kind"].map(_PRIORITY)
        s = s.sort_values(["rank", "group", "seq", "_prio"], kind="stable")
        dup = s.duplicated(["rank", "group", "seq"])
        s = s[~dup].drop(columns="_prio")
        s["key"] = "seq|" + s["group"].astype(str)
        s["match"] = "seq"
        s["_label"] = s["key"] + "#" + s["seq"].astype("Int64").astype(str)
        s["_part"] = s["key"]
        out.append(s)
    o = rows[~has_seq].copy()
    if len(o):
        o["key"] = _order_key(o).to_numpy()
        labeled, lost = _match_by_order(o, notes)
        unmatched += lost
        out.append(labeled)
    matched = pd.concat(out, ignore_index=True) if out else rows.iloc[:0]
    return matched, unmatched


def _match_by_order(o: pd.DataFrame, notes: list[str]) -> tuple[pd.DataFrame, int]:
    """Label rows without sequence numbers: each rank's sequence per key against the key's anchor."""
    o = o.sort_values(["key", "rank", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    o["_idx"] = o.groupby(["key", "rank"]).cumcount()
    o["match"] = "order"
    label = np.full(len(o), None, dtype=object)
    anchors = o.groupby("key")["rank"].min()
    ends = {(k, r): g["end_ns"].to_numpy(dtype=np.int64) for (k, r), g in o.groupby(["key", "rank"], sort=False)}
    rows_of = {(k, r): g.index.to_numpy() for (k, r), g in o.groupby(["key", "rank"], sort=False)}
    kind_of = o.groupby("key")["source_kind"].first().to_dict()
    for key, anchor in anchors.items():
        idx = rows_of[(key, anchor)]
        label[idx] = [f"{key}#{i}" for i in range(len(idx))]
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
            label[rows] = [f"{k}#{i}" for i in ia]
            method[rows] = how
    o["match"] = method
    o["_label"] = label
    o["_part"] = o["key"]
    lost = int(pd.isna(o["_label"]).sum())
    return o[o["_label"].notna()].drop(columns="_idx"), lost


def _finish(m: pd.DataFrame) -> pd.DataFrame:
    if m.empty:
        return _empty_instances()
    participants = m.groupby("_part")["rank"].nunique()
    m = m.copy()
    m["n_participants"] = m["_part"].map(participants).astype("int64")
    m["n_present"] = m.groupby("_label")["rank"].transform("nunique").astype("int64")
    m["complete"] = m["n_present"] == m["n_participants"]
    # instance ids in order of the lowest present rank's start
    first = m.sort_values(["_label", "rank"], kind="stable").groupby("_label").head(1)
    order = first.sort_values(["start_ns", "_label"], kind="stable")["_label"].to_numpy()
    ids = pd.Series(np.arange(len(order), dtype=np.int64), index=order)
    m["instance"] = m["_label"].map(ids).astype("int64")
    m = m.sort_values(["instance", "rank"], kind="stable").reset_index(drop=True)
    for c in ("launch_ns", "host_start_ns", "host_end_ns", "seq", "device", "stream", "pid", "tid"):
        m[c] = m[c].astype("Int64")
    for c in ("arrive_ns", "exit_ns", "span_start_ns"):
        m[c] = m[c].astype("Int64").fillna(m["start_ns" if c != "exit_ns" else "end_ns"].astype("Int64")).astype("int64")
    for c in ("span_name", "evidence", "wait_name"):
        m[c] = m[c].astype(object).where(m[c].notna(), None)
    m["group"] = m["group"].astype(object).where(m["group"].notna(), None)
    return m[INSTANCE_COLUMNS]


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
