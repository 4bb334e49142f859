"""Per-rank summary of a capture: whole-trace GPU timeline plus step statistics."""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.analyze.gpu import TIMELINE_FIELDS

RANK_SUMMARY_FIELDS = (
    "rank",
    "n_steps",
    *TIMELINE_FIELDS,
    "step_ns_p50",
    "step_ns_p90",
    "gpu_busy_ns_p50",
    "gap_ns_p50",
    "step_gpu_idle_share",
)


def rank_summary(timelines: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Join the per-rank GPU timeline with per-rank step medians.

    ``step_gpu_idle_share`` is the share of all step time the GPU sat idle
    (sum of gaps / sum of step times), the number that says "CPU-bound".
    """
    ranks = sorted(set(timelines["rank"]).union(steps["rank"].unique() if len(steps) else []))
    out = pd.DataFrame({"rank": pd.Series(ranks, dtype="int64")}).merge(
        timelines.astype({"rank": "int64"}), on="rank", how="left")
    if len(steps):
        g = steps.groupby("rank")
        agg = pd.DataFrame(
            {
                "n_steps": g.size(),
                "step_ns_p50": g["step_ns"].median(),
                "step_ns_p90": g["step_ns"].quantile(0.9),
                "gpu_busy_ns_p50": g["gpu_busy_ns"].median(),
                "gap_ns_p50": g["gap_ns"].median(),
                "step_gpu_idle_share": g["gap_ns"].sum() / g["step_ns"].sum().replace(0, np.nan),
            }
        ).reset_index()
        out = out.merge(agg, on="rank", how="left")
    for col in RANK_SUMMARY_FIELDS:
        if col not in out:
            out[col] = np.nan
    out["n_steps"] = out["n_steps"].fillna(0).astype("int64")
    return out[list(RANK_SUMMARY_FIELDS)]
