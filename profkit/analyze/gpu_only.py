"""GPU-only vs serving, across two runs: the serving step time minus the GPU-only time of the same batch.

Why: vLLM's ``vllm bench forward`` runs exact batch shapes back to back through the real
``execute_model`` with no scheduler, sampling or serving loop: its step time is what the batch
costs the GPU. Serving the same shapes takes longer; the difference is overhead nobody asked
for. One trace alone only compares step time with the GPU busy time inside it; a GPU-only run
is the reference that knows what the batch should cost.

Pairing: every serving step (rank, step) with a known shape (``num_tokens``, ``batch_size`` from
vLLM's step annotation) gets the median GPU-only step time of the same shape; where no GPU-only
step has that exact shape, the GPU-only shape nearest in tokens (ties: the nearer batch size);
steps without a token count stay unpaired. How many of each is reported.

Decomposition of the per-step gap (exact: the parts add up to the gap of every step):

    gap = serving step - GPU-only step
        = sum of the serving step's charged causes (cause_steps.csv: host work by name; waiting for
          other ranks and the last arriver's transfers each as one part)
          + (serving step - its charged time - GPU-only step)   # "GPU work: serving minus GPU-only"

Means over steps (ranks of a step averaged first), each with a bootstrap interval over steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit.analyze.jsonable import json_scalar

GPU_ROW = "GPU work: serving minus GPU-only"
WAIT_ROW = "waiting for other ranks"  # every wait cause (vocabulary.is_wait_cause), whoever was waited for
TRANSFER_ROW = "transfers (last arriver)"
OTHER_ROW = "other causes"
GPU_ONLY_COLUMNS = ["part", "mean_ns", "lo_ns", "hi_ns", "share_of_gap"]
_SOURCE = "gpu_only"


@dataclass
class GpuOnlyGap:
    available: bool
    headline: str
    serving_ns: float = math.nan
    gpu_only_ns: float = math.nan
    gap_ns: float = math.nan
    gap_ci: tuple[float, float] = (math.nan, math.nan)
    parts: list[dict] = field(default_factory=list)  # GPU_ONLY_COLUMNS
    pairing: dict = field(default_factory=dict)  # exact, nearest, unpaired, shapes, max_token_distance
    per_shape: pd.DataFrame | None = None  # num_tokens, batch_size, gpu_only_ns, n
    notes: list[str] = field(default_factory=list)
    confidence: float = 0.95

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.parts, columns=GPU_ONLY_COLUMNS)

    def to_dict(self) -> dict:
        clean = json_scalar

        return {"available": self.available, "headline": self.headline, "confidence": self.confidence,
                "serving_ns": clean(self.serving_ns), "gpu_only_ns": clean(self.gpu_only_ns),
                "gap_ns": clean(self.gap_ns), "gap_ci": [clean(x) for x in self.gap_ci],
                "pairing": self.pairing, "notes": self.notes,
                "parts": [{k: clean(v) for k, v in p.items()} for p in self.parts]}


def shape_times(gpu_steps: pd.DataFrame) -> pd.DataFrame:
    """Median GPU-only step time per batch shape: ``num_tokens, batch_size, gpu_only_ns, n``."""
    known = gpu_steps.dropna(subset=["num_tokens"])
    if not len(known):
        return pd.DataFrame({"num_tokens": pd.Series(dtype="int64"), "batch_size": pd.Series(dtype="int64"),
                             "gpu_only_ns": pd.Series(dtype="float64"), "n": pd.Series(dtype="int64")})
    k = known.assign(num_tokens=known["num_tokens"].astype("int64"),
                     batch_size=pd.to_numeric(known.get("batch_size"), errors="coerce").fillna(-1).astype("int64"))
    g = k.groupby(["num_tokens", "batch_size"])["step_ns"]
    return pd.DataFrame({"gpu_only_ns": g.median().astype("float64"), "n": g.size()}).reset_index()


def pair_shapes(serving: pd.DataFrame, shapes: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(GPU-only ns per serving row, how: "exact" / "nearest" / "unpaired")."""
    tok = pd.to_numeric(serving.get("num_tokens"), errors="coerce")
    bs = pd.to_numeric(serving.get("batch_size"), errors="coerce").fillna(-1)
    out = pd.Series(np.nan, index=serving.index)
    how = pd.Series("unpaired", index=serving.index, dtype=object)
    if not len(shapes):
        return out, how
    exact = shapes.set_index(["num_tokens", "batch_size"])["gpu_only_ns"]
    st, sb, sv = (shapes[c].to_numpy() for c in ("num_tokens", "batch_size", "gpu_only_ns"))
    for i, t, b in zip(serving.index, tok.to_numpy(), bs.to_numpy()):
        if not np.isfinite(t):
            continue
        key = (int(t), int(b))
        if key in exact.index:
            out[i], how[i] = exact[key], "exact"
            continue
        j = np.lexsort((np.abs(sb - b), np.abs(st - t)))[0]
        out[i], how[i] = sv[j], "nearest"
    return out, how


def gpu_only_gap(gpu_steps: pd.DataFrame, serving_steps: pd.DataFrame, serving_cause_steps: pd.DataFrame | None,
                 top_causes: int = 6, n_resamples: int = 2000, seed: int = 0,
                 confidence: float = 0.95) -> GpuOnlyGap:
    """The serving run's per-step gap over the GPU-only run of the same shapes, decomposed into causes."""
    from profkit.analyze.compare import _percentiles, _rng

    shapes = shape_times(gpu_steps)
    if not len(shapes):
        return GpuOnlyGap(False, "GPU-only vs serving: the GPU-only run has no batch shapes (num_tokens) in steps.csv: "
                                 "its steps need vLLM's execute_context_..._generation_... annotation", confidence=confidence)
    srv = serving_steps.reset_index(drop=True)
    ref, how = pair_shapes(srv, shapes)
    counts = how.value_counts()
    paired = how != "unpaired"
    pairing = {"exact": int(counts.get("exact", 0)), "nearest": int(counts.get("nearest", 0)),
               "unpaired": int(counts.get("unpaired", 0)), "gpu_only_shapes": int(len(shapes)),
               "gpu_only_steps": int(shapes["n"].sum())}
    if pairing["nearest"]:
        tok = pd.to_numeric(srv.loc[how == "nearest", "num_tokens"], errors="coerce").to_numpy()
        dist = [int(np.min(np.abs(shapes["num_tokens"].to_numpy() - t))) for t in tok]
        pairing["max_token_distance"] = max(dist)
    if paired.sum() < 2:
        return GpuOnlyGap(False, "GPU-only vs serving: fewer than 2 serving steps with a batch shape (num_tokens) to pair",
                          pairing=pairing, per_shape=shapes, confidence=confidence)
    rows = srv[paired].assign(gpu_only_ns=ref[paired].to_numpy())
    rows = rows[["rank", "step", "step_ns", "gpu_only_ns"]].copy()
    rows["gap"] = rows["step_ns"].astype("float64") - rows["gpu_only_ns"]
    cols = {}
    notes = []
    if serving_cause_steps is not None and len(serving_cause_steps):
        from profkit.analyze.vocabulary import DEVICE, WAIT, kinds_of

        cs = serving_cause_steps.merge(rows[["rank", "step"]], on=["rank", "step"])
        kind = kinds_of(cs["cause"])  # waits for whichever rank, and transfers, are one part each
        cs = cs.assign(cause=cs["cause"].where(kind == "host", kind.map({WAIT: WAIT_ROW, DEVICE: TRANSFER_ROW})))
        wide = cs.pivot_table(index=["rank", "step"], columns="cause", values="ns", aggfunc="sum", fill_value=0)
        wide = wide.reindex(pd.MultiIndex.from_frame(rows[["rank", "step"]]), fill_value=0).astype("float64")
        order = wide.mean().sort_values(ascending=False)
        keep = [c for c in order.index[:top_causes] if order[c] > 0]
        for c in keep:
            cols[str(c)] = wide[c].to_numpy()
        rest = wide.drop(columns=keep).sum(axis=1).to_numpy()
        if np.any(rest):
            cols[OTHER_ROW] = rest
        charged = wide.sum(axis=1).to_numpy()
    else:
        notes.append("no cause_steps.csv for the serving run: the gap is not decomposed")
        charged = None
    if charged is not None:
        cols[GPU_ROW] = rows["step_ns"].to_numpy(np.float64) - charged - rows["gpu_only_ns"].to_numpy()
    parts_df = pd.DataFrame(cols, index=rows.index)
    parts_df["__gap"] = rows["gap"].to_numpy()
    parts_df["__serving"] = rows["step_ns"].to_numpy(np.float64)
    parts_df["__gpu_only"] = rows["gpu_only_ns"].to_numpy()
    parts_df["step"] = rows["step"].to_numpy()
    per = parts_df.groupby("step", sort=True).mean()  # ranks of a step averaged: the bootstrap unit
    n = len(per)
    idx = _rng(seed, 0, _SOURCE).integers(0, n, size=(n_resamples, n))
    gap_mean = float(per["__gap"].mean())
    out = GpuOnlyGap(True, "", float(per["__serving"].mean()), float(per["__gpu_only"].mean()), gap_mean,
                     _percentiles(per["__gap"].to_numpy()[idx].mean(axis=1), confidence),
                     pairing=pairing, per_shape=shapes, notes=notes, confidence=confidence)
    for name in cols:
        v = per[name].to_numpy()
        lo, hi = _percentiles(v[idx].mean(axis=1), confidence)
        m = float(v.mean())
        out.parts.append({"part": name, "mean_ns": m, "lo_ns": lo, "hi_ns": hi,
                          "share_of_gap": m / gap_mean if gap_mean else math.nan})
    if pairing["nearest"]:
        out.notes.append(f"{pairing['nearest']} serving step(s) had no GPU-only step of the same shape and were paired "
                         f"with the nearest shape by tokens (at most {pairing.get('max_token_distance', 0)} tokens away)")
    if pairing["unpaired"]:
        out.notes.append(f"{pairing['unpaired']} serving step(s) without a token count were left out")
    lo, hi = out.gap_ci
    out.headline = (f"GPU-only vs serving: serving {out.serving_ns / 1e6:.3f} ms per step against {out.gpu_only_ns / 1e6:.3f} ms "
                    f"GPU-only for the same batch shapes: a gap of {gap_mean / 1e6:.3f} ms [{lo / 1e6:.3f}, {hi / 1e6:.3f}] "
                    f"({100 * gap_mean / out.serving_ns:.0f}% of the serving step)")
    top = sorted((p for p in out.parts if p["part"] not in (GPU_ROW, OTHER_ROW)), key=lambda p: -p["mean_ns"])
    if top:
        out.headline += f"; largest part: {top[0]['part']} {top[0]['mean_ns'] / 1e6:.3f} ms"
    return out
