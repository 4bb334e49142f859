"""The sync points of a capture as one table, and the time each rank spent blocked in them.

``sync_point_table`` is the one table per capture that the rest reads (``OUT/sync_points.csv``):
per (instance, rank) the span start, arrival, release, common exit, the instance's last arriver
and the evidence. ``wait_intervals`` gives what attribution charges as waiting before instances
are matched (``wait:<name>``). The sync points themselves are found from evidence by
``profkit.collectives.syncpoints``. Pure functions over tables (int64 ns).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.collectives.syncpoints import COLLECTIVE_KERNEL, COLLECTIVE_LAUNCH, empty_table

SYNC_COLUMNS = [
    "instance", "rank", "key", "coll_name", "source_kind", "evidence", "span_name", "span_start_ns", "arrive_ns",
    "exit_ns", "end_ns", "blocked_ns", "last_rank", "last_arrive_ns", "is_last", "complete", "pid", "tid",
]


# ---- per rank: the sync intervals (what attribution charges as waiting) ----------------------
WAIT_INTERVAL_COLUMNS = ["rank", "start_ns", "end_ns", "cause"]


def wait_intervals(candidates: pd.DataFrame | None) -> pd.DataFrame:
    """``[arrive_ns, exit_ns)`` of every host-blocking collective in ``candidates`` (one rank's or
    several), with its unmatched wait label ``wait:<name>``."""
    if candidates is None or not len(candidates) or "exit_ns" not in candidates:
        return pd.DataFrame({"rank": pd.Series(dtype="int64"), "start_ns": pd.Series(dtype="int64"),
                             "end_ns": pd.Series(dtype="int64"), "cause": pd.Series(dtype=object)})
    rows = np.flatnonzero((candidates["source_kind"] == "cpu_span").to_numpy(bool))  # the four columns read, taken
    return pd.DataFrame({
        "rank": candidates["rank"].iloc[rows].to_numpy(np.int64),
        "start_ns": candidates["arrive_ns"].iloc[rows].to_numpy(np.int64),
        "end_ns": candidates["exit_ns"].iloc[rows].to_numpy(np.int64),
        "cause": _wait_labels(candidates["wait_name"].iloc[rows]),
    })


def _wait_labels(names: pd.Series) -> np.ndarray:
    """``wait:<cause_name(name)>`` of each name (object array): each distinct name named once (a
    rank waits in the same few collectives thousands of times), a missing one row by row."""
    from profkit.analyze.overhead_names import cause_name
    from profkit.analyze.vocabulary import wait_cause

    codes, uniques = pd.factorize(names, use_na_sentinel=True)
    labels = np.array([wait_cause(cause_name(u)) for u in uniques] + [None], dtype=object)
    out = labels[np.asarray(codes, np.int64)] if len(names) else np.empty(0, dtype=object)
    missing = np.flatnonzero(np.asarray(codes) < 0)
    if missing.size:
        out[missing] = [wait_cause(cause_name(w)) for w in names.iloc[missing]]
    return out


# ---- the table ---------------------------------------------------------------------------------
def sync_point_table(instances: pd.DataFrame | None, matched: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (instance, rank) of every sync point (``SYNC_COLUMNS``), on the aligned clock.

    ``instances``: ``collectives.collective_instances`` rows (aligned; incomplete rows kept, with
    ``complete`` False); the last arriver is the rank with the latest ``arrive_ns`` of the instance.
    ``blocked_ns`` = ``exit_ns - arrive_ns``: time the rank spent in the collective (its wait, or
    on the last arriver the transfer itself). This is the table a what-if replay starts from:
    remove a cause from a rank's work before ``arrive_ns``, recompute each instance's release.
    """
    if instances is None or not len(instances):
        return empty_table(SYNC_COLUMNS)
    df = instances
    arrive = _filled(df["arrive_ns"] if "arrive_ns" in df else df["start_ns"], df["start_ns"])
    exit_ = _filled(df["exit_ns"] if "exit_ns" in df else df["end_ns"], df["end_ns"])
    span_start = df["span_start_ns"] if "span_start_ns" in df else df["host_start_ns"]
    out = pd.DataFrame({
        "instance": df["instance"].astype("int64"), "rank": df["rank"].astype("int64"),
        "key": df["key"].astype(str), "coll_name": df["coll_name"].astype(object),
        "source_kind": df["source_kind"].astype(str),
        "evidence": (df["evidence"] if "evidence" in df else pd.Series(None, index=df.index)).astype(object),
        "span_name": (df["span_name"] if "span_name" in df else df["name"]).astype(object),
        "span_start_ns": _filled(span_start, arrive),
        "arrive_ns": arrive, "exit_ns": np.maximum(exit_, arrive), "end_ns": df["end_ns"].astype("int64"),
        "complete": df["complete"].astype(bool) if "complete" in df else True,
        "pid": df["pid"].astype("Int64"), "tid": df["tid"].astype("Int64"),
    })
    kinds = out["source_kind"].to_numpy(dtype=object)
    out.loc[out["evidence"].isna() & (kinds == "kernel"), "evidence"] = COLLECTIVE_KERNEL
    out.loc[out["evidence"].isna() & (kinds == "launch_span"), "evidence"] = COLLECTIVE_LAUNCH
    out["blocked_ns"] = out["exit_ns"] - out["arrive_ns"]
    # the last arriver: latest arrival, lowest rank on a tie
    iid, arr, rank = (out[c].to_numpy(np.int64) for c in ("instance", "arrive_ns", "rank"))
    srt = np.lexsort((rank, -arr, iid))
    heads = srt[np.r_[True, iid[srt][1:] != iid[srt][:-1]]]  # per instance, ascending
    at = np.searchsorted(iid[heads], iid)
    out["last_rank"] = rank[heads][at]
    out["last_arrive_ns"] = arr[heads][at]
    if matched is not None and len(matched) and "last_rank" in matched:
        # the straggler analysis' last arriver (same rule: latest start; start = arrival)
        lr = matched.drop_duplicates("instance").set_index("instance")["last_rank"]
        got = out["instance"].map(lr)
        out["last_rank"] = got.fillna(out["last_rank"]).astype("int64")
    out["is_last"] = out["rank"] == out["last_rank"]
    if not _sorted_by(iid, rank):  # instance tables come sorted by (instance, rank): no take then
        out = out.sort_values(["instance", "rank"], kind="stable")
    return out.reset_index(drop=True)[SYNC_COLUMNS]


def _filled(col: pd.Series, fallback: pd.Series) -> pd.Series:
    """``col`` as int64, nulls filled from ``fallback`` (an int64 column has none: kept as it is)."""
    if col.dtype == np.int64:
        return col
    return col.astype("Int64").fillna(fallback.astype("Int64")).astype("int64")


def _sorted_by(major: np.ndarray, minor: np.ndarray) -> bool:
    """Whether rows are in (major, minor) order."""
    return bool(np.all((major[1:] > major[:-1]) | ((major[1:] == major[:-1]) & (minor[1:] >= minor[:-1]))))
