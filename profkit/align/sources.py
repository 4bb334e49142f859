"""Within one rank: the relative offset of its sources (Kineto / nsys vs profkit spans / py-spy).

Why: the sources of one run share the host clock only through each one's anchors (Kineto's
``baseTimeNanoseconds``, nsys ``utcEpochNs``, profkit's wall/monotonic pairs), each a few µs to
ms off. When a span appears in two sources (a profkit span that is also an NVTX range or a
``record_function``), its two copies happened at one moment: the median difference of their starts
and ends is the offset between the sources. The primary source (most GPU events) stays put.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit import distinct, schema
from profkit.collectives.sequences import match_sequences
from profkit.distinct import str_objects

SPAN_KINDS = (schema.CPU_SPAN, schema.CPU_OP, schema.GC)
MIN_PAIRS = 3
PAIR_TOL_NS = 20_000  # the two copies of one span start within a few µs of each other
MAX_NAMES = 200  # common span names used per source pair (the most frequent)
DENSE_KEYS = 1 << 16  # (rank, source) pairs up to which ``_source_counts`` counts in an array of them all

SOURCE_COLUMNS = ["rank", "source", "primary", "offset_ns", "n_pairs", "residual_ns", "method"]


def source_offsets(events: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One row per (rank, source): offset of the source's clock against the rank's primary source.

    method: ``primary``, ``common_spans`` (offset from shared spans), or ``anchors`` (no shared
    spans: left on its own anchors, offset 0).
    """
    rows: list[dict] = []
    warnings: list[str] = []
    if events.empty:
        return pd.DataFrame(columns=SOURCE_COLUMNS), warnings
    one = _one_rank_one_source(events)
    if one is not None:  # the common case (a rank's events from one profiler trace): nothing to count or pair
        rows.append({"rank": one[0], "source": one[1], "primary": True, "offset_ns": 0, "n_pairs": 0,
                     "residual_ns": None, "method": "primary"})
        return _source_table(rows), warnings
    counts = _source_counts(events)
    for rank, per in counts.groupby(level="rank", sort=True):
        per = per.droplevel("rank").sort_index()
        primary = per.sort_values(["gpu", "n"], ascending=False, kind="stable").index[0]
        rows.append({"rank": int(rank), "source": primary, "primary": True, "offset_ns": 0, "n_pairs": 0,
                     "residual_ns": None, "method": "primary"})
        if len(per) == 1:
            continue
        mine = events.loc[((events["rank"] == rank) & events["kind"].isin(SPAN_KINDS)).to_numpy(dtype=bool),
                          ["source", "name", "start_ns", "end_ns"]]
        base = mine[mine["source"] == primary]
        for source in per.index:
            if source == primary:
                continue
            other = mine[mine["source"] == source]
            offset, n_pairs, resid = _pair_offset(base, other)
            if n_pairs < MIN_PAIRS:
                warnings.append(f"rank {rank}: source {source} shares no spans with {primary}: "
                                f"kept on its own clock anchors")
                rows.append({"rank": int(rank), "source": source, "primary": False, "offset_ns": 0,
                             "n_pairs": n_pairs, "residual_ns": None, "method": "anchors"})
            else:
                rows.append({"rank": int(rank), "source": source, "primary": False, "offset_ns": offset,
                             "n_pairs": n_pairs, "residual_ns": resid, "method": "common_spans"})
    return _source_table(rows), warnings


def _source_table(rows: list[dict]) -> pd.DataFrame:
    out = pd.DataFrame(rows, columns=SOURCE_COLUMNS)
    out["offset_ns"] = out["offset_ns"].astype("int64")
    out["residual_ns"] = out["residual_ns"].astype("Int64")
    return out


def _one_rank_one_source(events: pd.DataFrame) -> tuple[int, str] | None:
    """(rank, source) where every event has that one rank and that one source (none missing),
    read off the columns' codes; None otherwise."""
    codes, uniques = distinct.codes(events["source"])
    if uniques.size != 1 or codes.min() < 0:
        return None
    rank = events["rank"].to_numpy(dtype=np.int64)
    if rank.min() != rank.max():
        return None
    return int(rank[0]), str(uniques[0])


def _source_counts(events: pd.DataFrame) -> pd.DataFrame:
    """Events (``n``) and GPU events (``gpu``) per (rank, source), indexed as groupby sorts them:
    counted on the source column's codes (a Python string per row costs more than the rest)."""
    codes, uniques = distinct.codes(events["source"])
    gpu = distinct.isin(events["kind"], schema.GPU_KINDS)
    rank = events["rank"].to_numpy(dtype=np.int64)
    if not codes.size or codes.min() < 0:  # a missing source: grouped as strings, as before
        return pd.DataFrame({"rank": rank, "source": str_objects(events["source"]), "gpu": gpu}).groupby(
            ["rank", "source"]).agg(n=("gpu", "size"), gpu=("gpu", "sum"))
    names = np.array([str(u) for u in uniques], dtype=object)
    by_text = np.argsort(names, kind="stable")  # sorted position -> code
    pos = np.empty(names.size, np.int64)
    pos[by_text] = np.arange(names.size)
    lo = int(rank.min())
    span = (int(rank.max()) - lo + 1) * names.size
    if span <= DENSE_KEYS:  # (rank, source) keys counted in place: np.unique would sort every row
        dense = (rank - lo) * np.int64(names.size) + pos[codes]
        n_all = np.bincount(dense, minlength=span)
        key = np.flatnonzero(n_all)
        n = n_all[key].astype(np.int64)
        on_gpu = np.bincount(dense[gpu], minlength=span)[key].astype(np.int64)
        key = key + lo * np.int64(names.size)
    else:
        key, inv = np.unique(rank * np.int64(names.size) + pos[codes], return_inverse=True)
        inv = inv.reshape(-1)
        n = np.bincount(inv, minlength=key.size).astype(np.int64)
        on_gpu = np.bincount(inv[gpu], minlength=key.size).astype(np.int64)
    index = pd.MultiIndex.from_arrays([key // names.size, names[by_text[key % names.size]]], names=["rank", "source"])
    return pd.DataFrame({"n": n, "gpu": on_gpu}, index=index)


def _pair_offset(base: pd.DataFrame, other: pd.DataFrame) -> tuple[int, int, int | None]:
    """Median (other - base) over matched copies of common spans: starts and ends pooled."""
    common = set(base["name"].dropna().unique()) & set(other["name"].dropna().unique())
    if not common:
        return 0, 0, None
    freq = other[other["name"].isin(common)]["name"].value_counts()
    names = [str(n) for n in freq.index[:MAX_NAMES]]
    b = {n: g.sort_values("start_ns") for n, g in base[base["name"].isin(names)].groupby("name", observed=True)}
    o = {n: g.sort_values("start_ns") for n, g in other[other["name"].isin(names)].groupby("name", observed=True)}
    keys = [str(n) for n in b if n in o]
    a_seq = {k: b[k]["start_ns"].to_numpy(dtype=np.int64) for k in keys}
    b_seq = {k: o[k]["start_ns"].to_numpy(dtype=np.int64) for k in keys}
    pairs, _ = match_sequences(a_seq, b_seq, {k: PAIR_TOL_NS for k in keys})
    diffs = []
    for k, (ia, ib) in pairs.items():
        if len(ia) == 0:
            continue
        bs, be = b[k]["start_ns"].to_numpy(np.int64)[ia], b[k]["end_ns"].to_numpy(np.int64)[ia]
        os_, oe = o[k]["start_ns"].to_numpy(np.int64)[ib], o[k]["end_ns"].to_numpy(np.int64)[ib]
        diffs.append(os_ - bs)
        diffs.append(oe - be)
    if not diffs:
        return 0, 0, None
    d = np.concatenate(diffs)
    offset = int(np.rint(np.median(d)))
    return offset, len(d) // 2, int(np.rint(np.median(np.abs(d - offset))))


def apply_source_offsets(events: pd.DataFrame, sources: pd.DataFrame) -> pd.DataFrame:
    """Events with each non-primary source moved onto its rank's primary source clock."""
    if sources is None or sources.empty or not (sources["offset_ns"] != 0).any() or "source" not in events:
        return events
    from profkit.align.clock import shift_columns

    return shift_columns(events, row_offsets(events, sources), np.zeros(len(events)), 0)


def row_offsets(events: pd.DataFrame, sources: pd.DataFrame) -> np.ndarray:
    """Each row's source offset (int64; 0 where ``sources`` has no row for its rank and source).

    Looked up once per distinct (rank, source) and taken by the source column's codes: a
    MultiIndex of every row and a reindex cost ~20 ms a call at ~200k rows, twice per rank of two
    sources (its candidates, then its alignment). Rows without a source go the way that spells
    them (``str_objects``: as ``astype(str)`` does)."""
    rank = events["rank"].to_numpy(dtype=np.int64)
    codes, names = distinct.codes(events["source"])
    if not rank.size or (codes < 0).any():
        key = sources.set_index(["rank", "source"])["offset_ns"]
        idx = pd.MultiIndex.from_arrays([rank, str_objects(events["source"])])
        return key.reindex(idx).fillna(0).to_numpy(dtype=np.int64)
    known = {(int(r), str(s)): int(o) for r, s, o in zip(sources["rank"].to_numpy(dtype=np.int64),
                                                        sources["source"].to_numpy(dtype=object),
                                                        sources["offset_ns"].to_numpy(dtype=np.int64))}
    n = max(len(names), 1)
    lo, hi = int(rank.min()), int(rank.max())
    if lo == hi:  # one rank's events (a rank's task): a table by source code
        return np.array([known.get((lo, str(name)), 0) for name in names], dtype=np.int64)[codes]
    pairs, inverse = np.unique((rank - lo) * np.int64(n) + codes, return_inverse=True)
    values = [known.get((int(k // n) + lo, str(names[k % n])), 0) for k in pairs.tolist()]
    return np.asarray(values, dtype=np.int64)[inverse.reshape(-1)]
