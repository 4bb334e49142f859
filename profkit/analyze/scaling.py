"""Why a step got slower (or faster) from one deployment to another: GPU, host, or waiting.

Why: an unoptimized DEP32 can run slower per step than DEP16 although its GPU work is faster
(17.57 vs 13.84 ms with 1.1 ms less GPU time, in vLLM's DeepSeek-V4.1-Flash study): every step
waits for the slowest of more ranks, and a shorter GPU step hides less host work. Comparing
step times alone cannot tell those apart; this splits every step of each run into

    step_ns = gpu_ns + host_ns + wait_ns

per (rank, step), from the analysis tables: ``cause_steps`` charges each GPU-idle (or
communication-only) interval of a step to a cause; the causes that are waiting for other ranks
(``vocabulary.is_wait_cause``) give ``wait_ns``; the last arriver's own transfer
(``vocabulary.is_device_cause``) is device work and counts with the GPU; the rest is host
overhead; what is left of the step (the GPU computing, not charged to anything) is ``gpu_ns``.
The change of the mean step time between the runs is then the sum of the three changes, each
with a bootstrap interval over steps (each run's steps resampled independently, the same
resample for all three parts of one run, so they add up in every resample). Without
``cause_steps`` only ``gpu_busy_ns`` (all device activity, communication included) and the gap
are known, and waiting is not separated from host work.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit.analyze.vocabulary import DEVICE, WAIT, kinds_of
from profkit.analyze.jsonable import json_scalar

PARTS = ("step_ns", "gpu_ns", "host_ns", "wait_ns")
TITLES = {"step_ns": "step time", "gpu_ns": "GPU time (computing + own transfers)",
          "host_ns": "host overhead (not waiting)", "wait_ns": "waiting for other ranks"}
SCALING_COLUMNS = ["part", "base", "cand", "delta", "delta_lo", "delta_hi", "share_of_change"]
_SOURCE = "scaling"


def step_components(steps: pd.DataFrame, cause_steps: pd.DataFrame | None) -> pd.DataFrame:
    """Per (rank, step): ``step_ns, gpu_ns, host_ns, wait_ns`` (float ns; see the module docstring).
    Without ``cause_steps``: ``gpu_ns`` = gpu_busy_ns, ``host_ns`` = the gap, ``wait_ns`` NaN."""
    base = steps[["rank", "step", "step_ns"]].astype("int64").copy()
    if cause_steps is None:
        base["gpu_ns"] = steps["gpu_busy_ns"].to_numpy(np.float64) if "gpu_busy_ns" in steps else np.nan
        base["host_ns"] = base["step_ns"] - base["gpu_ns"]
        base["wait_ns"] = np.nan
        return base.astype({"step_ns": "float64"})
    cs = cause_steps[["rank", "step", "ns"]].copy()
    kind = kinds_of(cause_steps["cause"]).to_numpy()
    cs["charged"] = cs["ns"].astype("float64")
    cs["wait"] = np.where(kind == WAIT, cs["charged"], 0.0)
    cs["device"] = np.where(kind == DEVICE, cs["charged"], 0.0)
    per = cs.groupby(["rank", "step"])[["charged", "wait", "device"]].sum()
    idx = pd.MultiIndex.from_arrays([base["rank"], base["step"]])
    got = per.reindex(idx).fillna(0.0)
    charged, wait, device = (got[c].to_numpy() for c in ("charged", "wait", "device"))
    step = base["step_ns"].to_numpy(np.float64)
    out = base.astype({"step_ns": "float64"})
    out["gpu_ns"] = step - charged + device
    out["host_ns"] = charged - wait - device
    out["wait_ns"] = wait
    return out


@dataclass
class PartChange:
    part: str
    base: float
    cand: float
    delta: float
    delta_ci: tuple[float, float] = (math.nan, math.nan)
    share: float = math.nan  # delta / step-time delta

    def row(self) -> dict:
        return {"part": self.part, "base": self.base, "cand": self.cand, "delta": self.delta,
                "delta_lo": self.delta_ci[0], "delta_hi": self.delta_ci[1], "share_of_change": self.share}


@dataclass
class ScalingDecomposition:
    """BASE -> CAND: the mean step-time change as GPU + host + waiting changes."""

    available: bool
    headline: str
    parts: list[PartChange] = field(default_factory=list)
    n_ranks: tuple[int, int] = (0, 0)
    n_steps: tuple[int, int] = (0, 0)
    waits_known: bool = True
    confidence: float = 0.95
    notes: list[str] = field(default_factory=list)

    def get(self, part: str) -> PartChange | None:
        return next((p for p in self.parts if p.part == part), None)

    def to_frame(self) -> pd.DataFrame:
        if not self.parts:
            return pd.DataFrame({c: pd.Series(dtype="object") for c in SCALING_COLUMNS})
        return pd.DataFrame([p.row() for p in self.parts])[SCALING_COLUMNS]

    def to_dict(self) -> dict:
        clean = json_scalar

        return {"available": self.available, "headline": self.headline, "confidence": self.confidence,
                "n_ranks": list(self.n_ranks), "n_steps": list(self.n_steps), "waits_known": self.waits_known,
                "notes": self.notes, "parts": [{k: clean(v) for k, v in p.row().items()} for p in self.parts]}


def _per_step(comp: pd.DataFrame) -> pd.DataFrame:
    """Mean over ranks of each part, per step (the bootstrap unit: ranks of a step move together)."""
    return comp.groupby("step", sort=True)[list(PARTS)].mean()


def _resampled_means(per: pd.DataFrame, n_resamples: int, seed: int, side: int) -> dict[str, np.ndarray]:
    from profkit.analyze.compare import _rng

    n = len(per)
    idx = _rng(seed, side, _SOURCE).integers(0, n, size=(n_resamples, n))
    return {p: per[p].to_numpy(np.float64)[idx].mean(axis=1) for p in PARTS}


def scaling_decomposition(base_steps: pd.DataFrame, base_cause_steps: pd.DataFrame | None,
                          cand_steps: pd.DataFrame, cand_cause_steps: pd.DataFrame | None,
                          n_resamples: int = 2000, seed: int = 0, confidence: float = 0.95) -> ScalingDecomposition:
    """Decompose CAND's mean step time minus BASE's (e.g. DEP16 -> DEP32) into GPU, host and waiting."""
    from profkit.analyze.compare import _percentiles

    nr = (int(base_steps["rank"].nunique()) if len(base_steps) else 0,
          int(cand_steps["rank"].nunique()) if len(cand_steps) else 0)
    if not len(base_steps) or not len(cand_steps):
        return ScalingDecomposition(False, "scaling: no decomposition: a side has no steps", n_ranks=nr)
    pb = _per_step(step_components(base_steps, base_cause_steps))
    pc = _per_step(step_components(cand_steps, cand_cause_steps))
    out = ScalingDecomposition(True, "", n_ranks=nr, n_steps=(len(pb), len(pc)), confidence=confidence)
    out.waits_known = base_cause_steps is not None and cand_cause_steps is not None
    if not out.waits_known:
        out.notes.append("no cause_steps.csv on a side: GPU time is all device activity (communication included) and "
                         "waiting is not separated from host overhead")
    if len(pb) < 2 or len(pc) < 2:
        out.available = False
        out.headline = "scaling: no decomposition: fewer than 2 steps on a side"
        return out
    rb, rc = _resampled_means(pb, n_resamples, seed, 0), _resampled_means(pc, n_resamples, seed, 1)
    step_delta = float(pc["step_ns"].mean() - pb["step_ns"].mean())
    for p in PARTS:
        b, c = float(pb[p].mean()), float(pc[p].mean())
        ch = PartChange(p, b, c, c - b)
        d = rc[p] - rb[p]
        if np.isfinite(d).any():
            ch.delta_ci = _percentiles(d, confidence)
        if step_delta:
            ch.share = (c - b) / step_delta
        out.parts.append(ch)
    out.headline = _headline(out)
    return out


def _ms(x: float) -> str:
    return f"{x / 1e6:+.3f}"


def _headline(d: ScalingDecomposition) -> str:
    step = d.get("step_ns")
    assert step is not None
    lo, hi = step.delta_ci
    size = f"{d.n_ranks[0]} -> {d.n_ranks[1]} ranks"
    significant = math.isfinite(lo) and (lo > 0 or hi < 0)
    text = (f"scaling ({size}): step time {step.base / 1e6:.3f} -> {step.cand / 1e6:.3f} ms, "
            f"{_ms(step.delta)} ms [{_ms(lo)}, {_ms(hi)}]")
    parts = [p for p in d.parts if p.part != "step_ns" and math.isfinite(p.delta)]
    text += " = " + " + ".join(f"{TITLES[p.part].split(' (')[0]} {_ms(p.delta)}" for p in parts)
    sign = 1.0 if step.delta > 0 else -1.0
    top = max(parts, key=lambda p: sign * p.delta, default=None)
    if top is not None and sign * top.delta > 0:
        text += f"; {'slower' if sign > 0 else 'faster'} mostly because of {TITLES[top.part].split(' (')[0]}"
        gpu = d.get("gpu_ns")
        if gpu is not None and top.part != "gpu_ns" and math.isfinite(gpu.delta) and sign * gpu.delta < 0:
            text += f", although the GPU time changed by {_ms(gpu.delta)} ms"
    if not significant:
        text += " (the step-time change itself is within noise: more steps would tell)"
    return text
