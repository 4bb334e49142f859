"""Episodic stragglers: a rank late on a few steps, by a cause that is unusual for it there.

The straggler verdict (``stragglers``) judges a rank's excess over the whole run. A rank that
is late only now and then (a slow scheduler pass every fourth step, a GC pause) can stay below
it: its few late steps are a small share of the run, and its ordinary steps pull its mean
excess back to zero. ``straggler_episodes`` looks at each (rank, step) instead.

``straggler_episodes(lateness, per_rank, cause_steps)`` -> one row per episode
(``EPISODE_COLUMNS``). Inputs, all from one analysis:

- ``lateness``: the per (rank, step) table of ``stragglers.straggler_table`` (``OUT/lateness.csv``,
  ``LATENESS_COLUMNS``);
- ``per_rank``: its per-rank table (``OUT/stragglers.csv``); ``rank``, ``own_work_ns`` (for the
  size condition below) and ``straggler`` (the whole-run verdict, copied onto the episodes: an
  episode is reported either way) are read;
- ``cause_steps``: the time of each cause per (rank, step), ``rank, step, cause, ns`` (int64 ns).
  The pipeline passes ``analysis.phase_steps``: each rank's own work per phase since its
  previous sync point, in the windows of the step whose sync it arrived at
  (``stragglers.PHASE_STEP_COLUMNS``), so a cause in the previous step counts (a GC at the end
  of step k makes the rank late at step k+1's sync: the episode is k+1, its cause the GC).
  ``compare.cause_step_table(analysis.charged)`` (``OUT/cause_steps.csv``, GPU-idle time per
  step) is the same kind of table, but cut at step boundaries. Waits (``waiting for rank k``,
  ``wait:...``, ``transfer:...``) are never a cause.

A (rank, step) is an episode when all four hold:

1. the rank arrived last at one sync point or more in that step (``times_last >= 1``): the
   others waited for it (``caused_wait_ns`` is that wait);
2. its lateness is far outside the step-to-step noise: ``late_max_ns`` (its largest lateness at
   one sync point in the step; a sum over the step's sync points would add up small noise) is
   at least ``MIN_LATE_Z`` robust standard deviations above the median over ALL rank-steps
   (``late_z``; the deviation is 1.4826 x the median absolute deviation, floored at
   ``MIN_SCALE_NS``; a few late rank-steps among many do not move either);
3. it is worth reporting: ``late_max_ns`` is at least ``MIN_STEP_SHARE`` of the best rank's
   own work per step (its ``own_work_ns``, step time without waiting, over its steps in
   ``lateness``; the whole-run verdict sizes excess against the same work). Timing noise with a
   heavy tail can lie many deviations out and still be a small part of a step;
4. one cause explains most of it: the cause with the largest excess over its baseline in that
   rank-step (``cause``, ``cause_ns`` its time there) exceeds its baseline
   (``cause_baseline_ns``) by at least ``MIN_CAUSE_SHARE`` of ``late_max_ns``. The baseline is
   the larger of the cause's median time on the rank's OTHER steps and its median on the OTHER
   ranks in the same step (a rank-step without the cause counts 0): what the cause usually
   costs this rank, and what it cost everyone at that step. So a rank that is always slower at
   something (a persistent straggler: the whole-run verdict's case) or a step where every rank
   did more of it is not an episode; a cause that is unusual for the rank at that step is.

Columns: ``rank, step``; ``late_ns``, ``late_max_ns``, ``times_last``, ``caused_wait_ns`` copied
from the lateness row (``late_ns`` sums the step's positive lateness, ``late_max_ns`` is the
largest, the one judged); ``late_z`` (condition 2); ``cause``, ``cause_ns``,
``cause_baseline_ns``, ``cause_excess_ns = cause_ns - cause_baseline_ns`` (condition 4);
``straggler``: the rank is also a whole-run straggler.

Injected faults on real captures pass every condition with room (DEP4 on H200, a 15 ms slow
scheduler pass: ``late_z`` 8.3-13.3, 0.54-0.89 of a step's work, the cause 0.74-1.0 of the
lateness); the largest clean rank-steps fail at least one (z 5.1 at 0.24 of a step on a clean
DEP2 capture; heavy-tailed simulated jitter up to z 6.1 but at most 0.13 of a step).

``episode_ranks(episodes)`` rolls episodes up per rank (``EPISODE_RANK_COLUMNS``: how many,
which steps, the wait they caused, the cause that cost most); ``report.terminal.episode_line``
writes the terminal line from them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.analyze import vocabulary as vc

EPISODE_COLUMNS = [
    "rank", "step", "late_ns", "late_max_ns", "late_z", "times_last", "caused_wait_ns", "cause", "cause_ns",
    "cause_baseline_ns", "cause_excess_ns", "straggler",
]
EPISODE_RANK_COLUMNS = ["rank", "episodes", "steps", "caused_wait_ns", "cause", "cause_excess_ns", "straggler"]

MIN_LATE_Z = 6.0  # an episode's lateness is this many robust standard deviations above the median rank-step
MIN_CAUSE_SHARE = 0.5  # ... and one cause's excess over its baseline is at least half of it
MIN_STEP_SHARE = 0.2  # ... and it is at least a fifth of the best rank's own work per step
MIN_SCALE_NS = 10_000  # floor of the lateness noise scale (10 us): below, timing noise
VICTIM_PREFIXES = vc.VICTIM_PREFIXES  # waiting for others: never a cause


def straggler_episodes(lateness: pd.DataFrame | None, per_rank: pd.DataFrame | None,
                       cause_steps: pd.DataFrame | None) -> pd.DataFrame:
    """Episodes of lateness (see the module docstring), ordered by rank and step."""
    if lateness is None or not len(lateness) or cause_steps is None or not len(cause_steps):
        return _empty()
    late = lateness[lateness["step"].astype("int64") >= 0]  # step -1: sync points outside every step
    if not len(late):
        return _empty()
    late_max = late["late_max_ns"].to_numpy(np.float64)
    centre = float(np.median(late_max))
    scale = max(1.4826 * float(np.median(np.abs(late_max - centre))), MIN_SCALE_NS)
    z = (late_max - centre) / scale
    big = late_max >= MIN_STEP_SHARE * _work_per_step(per_rank, late)
    cand = late[(late["times_last"].to_numpy(np.int64) >= 1) & (z >= MIN_LATE_Z) & big]
    if not len(cand):
        return _empty()
    z_of = pd.Series(z, index=late.index)
    table = _CauseTable(cause_steps, late)
    flagged = _flags(per_rank)
    rows = []
    for row in cand.itertuples():
        best = table.best(int(row.rank), int(row.step))
        if best is None:
            continue
        cause, ns, baseline = best
        if ns - baseline < MIN_CAUSE_SHARE * float(row.late_max_ns):
            continue
        rows.append({
            "rank": int(row.rank), "step": int(row.step), "late_ns": int(row.late_ns),
            "late_max_ns": int(row.late_max_ns), "late_z": round(float(z_of[row.Index]), 1),
            "times_last": int(row.times_last), "caused_wait_ns": int(row.caused_wait_ns), "cause": cause,
            "cause_ns": int(ns), "cause_baseline_ns": int(baseline), "cause_excess_ns": int(ns - baseline),
            "straggler": bool(flagged.get(int(row.rank), False)),
        })
    if not rows:
        return _empty()
    out = pd.DataFrame(rows).sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
    return out[EPISODE_COLUMNS]


def episode_ranks(episodes: pd.DataFrame | None) -> pd.DataFrame:
    """Per rank with episodes: their number, steps (a list), the wait they caused in all, the
    cause with the largest summed excess and that excess; most caused wait first."""
    if episodes is None or not len(episodes):
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("steps", "cause") else
                                          ("bool" if c == "straggler" else "int64")) for c in EPISODE_RANK_COLUMNS})
    rows = []
    for rank, g in episodes.groupby("rank", sort=True):
        by_cause = g.groupby("cause", sort=True)["cause_excess_ns"].sum().sort_values(ascending=False, kind="stable")
        rows.append({"rank": int(rank), "episodes": int(len(g)), "steps": [int(s) for s in g["step"]],
                     "caused_wait_ns": int(g["caused_wait_ns"].sum()), "cause": str(by_cause.index[0]),
                     "cause_excess_ns": int(by_cause.iloc[0]), "straggler": bool(g["straggler"].any())})
    out = pd.DataFrame(rows).sort_values(["caused_wait_ns", "rank"], ascending=[False, True], kind="stable")
    return out.reset_index(drop=True)[EPISODE_RANK_COLUMNS]


# ---- internals -------------------------------------------------------------------------------
class _CauseTable:
    """Cause time per (rank, step) as one rank x step matrix per cause (absent = 0), over the
    rank-steps of the lateness table."""

    def __init__(self, cause_steps: pd.DataFrame, late: pd.DataFrame):
        cs = cause_steps[~cause_steps["cause"].astype(str).str.startswith(VICTIM_PREFIXES).to_numpy(bool)]
        cs = cs[cs["step"].astype("int64") >= 0]
        self.ranks = np.unique(late["rank"].to_numpy(np.int64))
        self.steps = np.unique(late["step"].to_numpy(np.int64))
        r_of = {int(r): i for i, r in enumerate(self.ranks)}
        s_of = {int(s): j for j, s in enumerate(self.steps)}
        # the rank-steps measured (lateness rows): medians are over these only
        self.present = np.zeros((self.ranks.size, self.steps.size), bool)
        self.present[[r_of[int(r)] for r in late["rank"]], [s_of[int(s)] for s in late["step"]]] = True
        cs = cs[cs["rank"].astype("int64").isin(list(r_of)) & cs["step"].astype("int64").isin(list(s_of))]
        self.cells = cs.groupby(["rank", "step"], sort=False)
        self.r_of, self.s_of = r_of, s_of
        self._by_cause = {c: g for c, g in cs.groupby("cause", sort=False)}
        self._mat: dict[str, np.ndarray] = {}

    def _matrix(self, cause: str) -> np.ndarray:
        m = self._mat.get(cause)
        if m is None:
            g = self._by_cause[cause]
            m = np.zeros((self.ranks.size, self.steps.size), np.float64)
            np.add.at(m, ([self.r_of[int(r)] for r in g["rank"]], [self.s_of[int(s)] for s in g["step"]]),
                      g["ns"].to_numpy(np.float64))
            self._mat[cause] = m
        return m

    def best(self, rank: int, step: int) -> tuple[str, float, float] | None:
        """The cause with the largest excess over its baseline at (rank, step): (cause, ns, baseline)."""
        try:
            cell = self.cells.get_group((rank, step))
        except KeyError:
            return None
        i, j = self.r_of[rank], self.s_of[step]
        best = None
        for cause in cell["cause"].unique():
            m = self._matrix(cause)
            own_steps = self.present[i].copy()
            own_steps[j] = False
            peers = self.present[:, j].copy()
            peers[i] = False
            own = float(np.median(m[i][own_steps])) if own_steps.any() else 0.0
            peer = float(np.median(m[:, j][peers])) if peers.any() else 0.0
            baseline = max(own, peer)
            ns = float(m[i, j])
            if best is None or ns - baseline > best[1] - best[2]:
                best = (str(cause), ns, baseline)
        return best


def _work_per_step(per_rank: pd.DataFrame | None, late: pd.DataFrame) -> float:
    """The best rank's own work per step (0 when unknown: no size condition)."""
    if per_rank is None or not len(per_rank) or "own_work_ns" not in per_rank:
        return 0.0
    n = late.groupby("rank")["step"].nunique()
    own = per_rank.set_index("rank")["own_work_ns"].astype("float64")
    per = (own / n.reindex(own.index)).to_numpy(np.float64)
    per = per[np.isfinite(per) & (per > 0)]
    return float(per.min()) if per.size else 0.0


def _flags(per_rank: pd.DataFrame | None) -> dict[int, bool]:
    if per_rank is None or not len(per_rank) or "straggler" not in per_rank:
        return {}
    return {int(r): bool(s) for r, s in zip(per_rank["rank"], per_rank["straggler"].fillna(False))}


def _empty() -> pd.DataFrame:
    text, flag = {"cause"}, {"straggler"}
    return pd.DataFrame({c: pd.Series(dtype=object if c in text else ("bool" if c in flag else
                                                                     ("float64" if c == "late_z" else "int64")))
                         for c in EPISODE_COLUMNS})
