"""``syncpoints.decide_sync_names`` against the frame spelling it replaced (each rank's samples of
a name sorted with ``DataFrame.sort_values``, every rank sorted, then the lowest 16 compared): the
same names decided, on samples with more ranks than are compared, ties in the starts, names whose
ends line up and names whose ends do not."""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.collectives import syncpoints as sp
from profkit.collectives.sequences import match_sequences


def _aligned_ends_frames(g: pd.DataFrame) -> bool:
    """The earlier spelling, kept here as the reference."""
    ranks = sorted(g["rank"].unique())[:sp.MAX_SAMPLE_RANKS]
    if len(ranks) < 2:
        return False
    by = {r: x.sort_values("start_ns") for r, x in g.groupby("rank")}
    ref = by[ranks[0]]
    ref_e, ref_s = ref["end_ns"].to_numpy(np.int64), ref["start_ns"].to_numpy(np.int64)
    if ref_e.size < sp.MIN_INSTANCES:
        return False
    ends, starts = [ref_e.astype(np.float64)], [ref_s.astype(np.float64)]
    for r in ranks[1:]:
        o = by[r]
        oe, os_ = o["end_ns"].to_numpy(np.int64), o["start_ns"].to_numpy(np.int64)
        pairs, _ = match_sequences({"k": ref_e}, {"k": oe}, {"k": sp.END_TOL_NS})
        ia, ib = pairs.get("k", (np.empty(0, np.int64), np.empty(0, np.int64)))
        if ia.size < sp.MATCHED_SHARE * min(ref_e.size, oe.size):
            return False
        col_e, col_s = np.full(ref_e.size, np.nan), np.full(ref_e.size, np.nan)
        col_e[ia], col_s[ia] = oe[ib], os_[ib]
        ends.append(col_e)
        starts.append(col_s)
    E, S = np.vstack(ends), np.vstack(starts)
    both = (~np.isnan(E)).sum(axis=0) >= 2
    if both.sum() < sp.MIN_INSTANCES:
        return False
    end_spread = np.nanmax(E[:, both], axis=0) - np.nanmin(E[:, both], axis=0)
    start_spread = np.nanmax(S[:, both], axis=0) - np.nanmin(S[:, both], axis=0)
    typical = float(np.median(end_spread))
    if typical > sp.END_TOL_NS:
        return False
    spread = start_spread >= max(sp.SPREAD_RATIO * typical, sp.MIN_START_SPREAD_NS)
    if spread.sum() < max(sp.MIN_INSTANCES, sp.MIN_SPREAD_SHARE * spread.size):
        return False
    return bool(np.median(end_spread[spread] / start_spread[spread]) <= 1.0 / sp.SPREAD_RATIO)


def _samples(rng: np.random.Generator, ranks: int, per_rank: int) -> pd.DataFrame:
    """Four names on ``ranks`` ranks, rows shuffled: ``sync`` ends line up while its starts spread
    (a sync point); ``steady`` spreads at both ends; ``jitter`` ends spread beyond the tolerance;
    ``ties`` lines up with starts repeated within a rank (equal keys for the sort)."""
    rows = []
    period = 10_000_000
    for name in ("sync", "steady", "jitter", "ties"):
        for r in range(ranks):
            k = np.arange(per_rank, dtype=np.int64)
            common_end = 1_000_000_000 + k * period
            if name == "steady":
                shift = rng.integers(0, 3_000_000, per_rank)
                end = common_end + shift
                start = end - 2_000_000
            elif name == "jitter":
                end = common_end + rng.integers(0, 5_000_000, per_rank)
                start = end - rng.integers(1_000_000, 4_000_000, per_rank)
            else:
                end = common_end + rng.integers(0, 50_000, per_rank)
                start = common_end - rng.integers(100_000, 4_000_000, per_rank)
                if name == "ties":
                    start[1::2] = start[::2][: start[1::2].size]  # pairs of equal starts
            rows.append(pd.DataFrame({"rank": r, "name": name, "start_ns": start, "end_ns": end}))
    out = pd.concat(rows, ignore_index=True)
    return out.iloc[rng.permutation(len(out))].reset_index(drop=True)


def _facts(samples: pd.DataFrame) -> pd.DataFrame:
    g = samples.groupby(["rank", "name"], sort=True).size().reset_index(name="n")
    return pd.DataFrame({"rank": g["rank"].astype("int64"), "name": g["name"], "n": g["n"].astype("int64"),
                         "total_ns": np.int64(1_000_000), "blocked_ns": np.int64(0), "with_collective": np.int64(0)})


def test_decided_as_the_frame_spelling_decides():
    rng = np.random.default_rng(7)
    decided = []
    for ranks, per_rank in ((2, 3), (4, 20), (20, 40), (32, 64)):
        samples = _samples(rng, ranks, per_rank)
        got = sp.decide_sync_names(_facts(samples), samples)
        want = {str(n): sp.ALIGNED_ENDS for n, g in samples.groupby("name", sort=True) if _aligned_ends_frames(g)}
        assert got == want, (ranks, per_rank)
        decided.append(got)
    # the cases cut both ways: a sync point found wherever there are enough instances, and names left out
    assert decided[0] == {}  # 3 instances a rank: too few spread starts to judge
    assert all(d.get("sync") == sp.ALIGNED_ENDS and "steady" not in d and "jitter" not in d for d in decided[1:])


def test_one_name_judged_on_its_arrays():
    rng = np.random.default_rng(11)
    for ranks in (1, 2, 17, 40):
        samples = _samples(rng, ranks, 16)
        for _, g in samples.groupby("name"):
            arrays = (g["rank"].to_numpy(np.int64), g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
            assert sp._aligned_ends(*arrays) == _aligned_ends_frames(g)
