"""Launch -> GPU activity pairs of one rank, joined by (pid, correlation) as the readers record them.

One pair per GPU row: under CUDA graphs one launch starts many kernels, so a launch may begin
several flows while each kernel ends exactly one. A GPU row whose launch is not in the window
(or not in the trace) gets no flow, so every flow written has both ends.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit import schema


def launch_flows(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(launch row positions, GPU row positions) of every pair, positions into ``events``."""
    empty = np.zeros(0, dtype=np.int64)
    if events.empty:
        return empty, empty
    kind = events["kind"].astype("string")
    has_corr = events["correlation"].notna().to_numpy(dtype=bool)
    frame = pd.DataFrame(
        {
            "pos": np.arange(len(events), dtype=np.int64),
            "pid": events["pid"].astype("Int64").fillna(-1).to_numpy(np.int64),
            "correlation": events["correlation"].astype("Int64").fillna(-1).to_numpy(np.int64),
            "start_ns": events["start_ns"].to_numpy(np.int64),
        }
    )
    is_launch = (kind == schema.RUNTIME).fillna(False).to_numpy(dtype=bool) & has_corr
    is_gpu = kind.isin(schema.GPU_KINDS).fillna(False).to_numpy(dtype=bool) & has_corr
    if not is_launch.any() or not is_gpu.any():
        return empty, empty
    launches = (
        frame[is_launch]
        .sort_values(["start_ns", "pos"])
        .drop_duplicates(["pid", "correlation"], keep="first")  # one launch per correlation
        .rename(columns={"pos": "launch_pos"})[["pid", "correlation", "launch_pos"]]
    )
    pairs = frame[is_gpu].merge(launches, on=["pid", "correlation"], how="inner").sort_values("pos")
    return pairs["launch_pos"].to_numpy(np.int64), pairs["pos"].to_numpy(np.int64)
