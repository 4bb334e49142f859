"""``align.ranks.exit_lag_ns`` and ``last_arriver_flags`` on sorted arrays, against the pandas
spelling they replaced (kept here as the oracle): the same flags, lag and support, exactly, on
random instances built to hit every branch (ties in start, instances of one row, no clear last
arriver, rank pairs with too few instances one way, ranks the clock table lacks)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from profkit.align import ranks as R
from profkit.align.clock import to_reference


def _flags_pandas(obs: pd.DataFrame, table: pd.DataFrame, t0_ns: int) -> tuple[np.ndarray, np.ndarray]:
    by = table.set_index("rank")
    r = obs["rank"].to_numpy()
    start = to_reference(obs["start_ns"].to_numpy(np.int64), by["offset_ns"].reindex(r).fillna(0).to_numpy(np.int64),
                         by["drift_ppm"].reindex(r).fillna(0.0).to_numpy(), t0_ns)
    df = pd.DataFrame({"instance": obs["instance"].to_numpy(), "start": start})
    df = df.sort_values(["instance", "start"], kind="stable")
    pos_from_end = df.groupby("instance").cumcount(ascending=False).to_numpy()
    last_start = df.groupby("instance")["start"].transform("max").to_numpy()
    second = df["start"].where(pos_from_end == 1).groupby(df["instance"]).transform("max").to_numpy()
    clear = (last_start - second) >= R.EXIT_MARGIN_NS
    pos = df.index.to_numpy()
    clear_s = np.zeros(len(obs), dtype=bool)
    last_s = np.zeros(len(obs), dtype=bool)
    clear_s[pos] = clear
    last_s[pos] = pos_from_end == 0
    return clear_s, last_s


def _lag_pandas(obs: pd.DataFrame, table: pd.DataFrame, t0_ns: int) -> tuple[int | None, int]:
    k = obs[obs["tier"].to_numpy() == R.KERNEL_TIER]
    if k.empty:
        return None, 0
    clear, last = _flags_pandas(k, table, t0_ns)
    by = table.set_index("rank")
    r = k["rank"].to_numpy()
    end = to_reference(k["end_ns"].to_numpy(np.int64), by["offset_ns"].reindex(r).fillna(0).to_numpy(np.int64),
                       by["drift_ppm"].reindex(r).fillna(0.0).to_numpy(), t0_ns)
    df = pd.DataFrame({"instance": k["instance"].to_numpy(), "rank": r, "end": end, "clear": clear, "last": last})
    df = df[df["clear"]]
    lasts = df[df["last"]][["instance", "rank", "end"]].rename(columns={"rank": "last_rank", "end": "last_end"})
    pairs = df[~df["last"]].merge(lasts, on="instance")
    if pairs.empty:
        return None, 0
    pairs["d"] = pairs["end"] - pairs["last_end"]
    per = pairs.groupby(["rank", "last_rank"])["d"].agg(["median", "size"]).reset_index()
    rev = per.rename(columns={"rank": "last_rank", "last_rank": "rank", "median": "median_rev", "size": "size_rev"})
    both = per.merge(rev, on=["rank", "last_rank"])
    both = both[(both["rank"] < both["last_rank"]) & (both["size"] >= R.MIN_EXIT_PAIRS)
                & (both["size_rev"] >= R.MIN_EXIT_PAIRS)]
    if both.empty:
        return None, int(len(pairs))
    lag = 0.5 * (both["median"] + both["median_rev"])
    weight = np.minimum(both["size"], both["size_rev"]).to_numpy()
    order = np.argsort(lag.to_numpy())
    cum = np.cumsum(weight[order])
    median = float(lag.to_numpy()[order][np.searchsorted(cum, cum[-1] / 2.0)])
    return int(np.rint(median)), int(weight.sum())


def _random_case(seed: int) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Instances on the reference clock, written on each rank's host clock (``to_host``) with the
    clock table the flags undo: a late arrival stays late, by the skew drawn, once aligned."""
    from profkit.align.clock import to_host

    rng = np.random.default_rng(seed)
    mode = seed % 3  # 0: ranks 0 and 1 take turns arriving last (a lag); 1: anyone; 2: never clearly last
    n_ranks = int(rng.integers(2, 9))
    # epoch nanoseconds (float64 rounds them to 256 ns), or small times on drift-free clocks, where an
    # arrival exactly EXIT_MARGIN_NS after the others happens
    epoch = seed % 2 == 0
    t = 1_700_000_000_000_000_000 + int(rng.integers(0, 10**9)) if epoch else int(rng.integers(0, 10**6))
    known = sorted(rng.choice(n_ranks, size=max(1, n_ranks - int(rng.integers(0, 2))), replace=False).tolist())
    table = pd.DataFrame({"rank": known, "offset_ns": rng.integers(-10**6, 10**6, len(known)),
                          "drift_ppm": rng.normal(0, 20, len(known)) if epoch else np.zeros(len(known))})
    clock = {int(r): (int(o), float(d)) for r, o, d in table.itertuples(index=False)}
    skews = [0, 5_000, 15_000] if mode == 2 else [0, 5_000, 17_000, 17_001, 16_999, 40_000, 200_000]
    rows = []
    for inst in range(int(rng.integers(1, 120))):
        ranks = rng.choice(n_ranks, size=int(rng.integers(1, n_ranks + 1)), replace=False)
        if mode == 0:
            ranks = np.unique(np.r_[0, 1, ranks])
        base = t + inst * 1_000_000
        late = int(rng.choice([0, 1] if mode == 0 else ranks))
        skew = int(rng.choice(skews))
        lag = int(rng.integers(5_000, 15_000))
        for r in ranks.tolist():
            start = base + int(rng.choice([0, 0, 0, 100, int(rng.integers(0, 3_000))]))  # ties in start
            if r == late:
                start = base + 3_000 + skew
            end = base + 300_000 + (0 if r == late else lag) + int(rng.integers(-500, 500))
            off, drift = clock.get(r, (0, 0.0))
            host_start, host_end = (int(x) for x in to_host(np.array([start, end]), off, drift, t))
            tier = R.KERNEL_TIER if rng.random() < 0.9 else R.CPU_TIER
            rows.append((r, inst, host_start, host_end, tier))
    obs = pd.DataFrame(rows, columns=["rank", "instance", "start_ns", "end_ns", "tier"])
    obs = obs.sample(frac=1.0, random_state=seed).reset_index(drop=True)  # rows not in instance order
    return obs, table, t


@pytest.mark.parametrize("seed", range(60))
def test_flags_and_lag_equal_the_pandas_spelling(seed):
    obs, table, t0 = _random_case(seed)
    for got, want in zip(R.last_arriver_flags(obs, table, t0), _flags_pandas(obs, table, t0)):
        np.testing.assert_array_equal(got, want)
    assert R.exit_lag_ns(obs, table, t0) == _lag_pandas(obs, table, t0)


def test_the_cases_reach_every_outcome():
    """The random cases above are not all alike: some find a lag, some see pairs but no pair both
    ways often enough, some no clear last arriver at all."""
    outcomes = {("lag" if lag is not None else "pairs" if n else "none")
                for lag, n in (_lag_pandas(*_random_case(s)) for s in range(60))}
    assert outcomes == {"lag", "pairs", "none"}


def test_no_kernel_rows_and_one_row_instances():
    obs = pd.DataFrame({"rank": [0, 1], "instance": [0, 1], "start_ns": [5, 6], "end_ns": [9, 9],
                        "tier": [R.CPU_TIER, R.KERNEL_TIER]})
    table = pd.DataFrame({"rank": [0, 1], "offset_ns": [0, 0], "drift_ppm": [0.0, 0.0]})
    assert R.exit_lag_ns(obs.iloc[:1], table, 0) == (None, 0)
    clear, last = R.last_arriver_flags(obs, table, 0)
    assert not clear.any() and last.all()  # alone in its instance: last, never clearly so
