"""How much of the recoverable EP imbalance a second run recovered (e.g. with EPLB on).

Why: the study this reproduces reports expert balancing as a share of what was there to gain:
EPLB took the target model from 0.35 to 0.94 balancedness against 0.96 for uniform routing of
the same batches, i.e. 97% of the gap. Inputs are two ``balance.csv`` tables (per step and MoE
layer: ``balancedness`` and the uniform baseline ``uniform_balancedness``); the BASE run (no
balancing) defines the gap, ``uniform - real``. Every number is a mean over steps of the per-step
mean over layers; the interval of the share comes from resampling each run's steps
independently (seeded).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit.analyze.uniform import recovered_share
from profkit.analyze.jsonable import json_scalar

EP_RECOVERY_COLUMNS = ["metric", "base", "cand", "delta", "delta_lo", "delta_hi"]
_SOURCE = "ep_recovery"


@dataclass
class EpRecovery:
    available: bool
    headline: str
    real: tuple[float, float] = (math.nan, math.nan)  # base, cand
    uniform: tuple[float, float] = (math.nan, math.nan)
    real_ci: tuple[float, float] = (math.nan, math.nan)  # interval of cand - base
    share: float = math.nan
    share_ci: tuple[float, float] = (math.nan, math.nan)
    n_steps: tuple[int, int] = (0, 0)
    significant: bool = False  # CAND's balancedness differs from BASE's beyond noise
    notes: list[str] = field(default_factory=list)
    confidence: float = 0.95

    def to_frame(self) -> pd.DataFrame:
        rows = [
            {"metric": "balancedness", "base": self.real[0], "cand": self.real[1], "delta": self.real[1] - self.real[0],
             "delta_lo": self.real_ci[0], "delta_hi": self.real_ci[1]},
            {"metric": "uniform_balancedness", "base": self.uniform[0], "cand": self.uniform[1],
             "delta": self.uniform[1] - self.uniform[0], "delta_lo": math.nan, "delta_hi": math.nan},
            {"metric": "recoverable_gap", "base": self.uniform[0] - self.real[0], "cand": self.uniform[1] - self.real[1],
             "delta": (self.uniform[1] - self.real[1]) - (self.uniform[0] - self.real[0]),
             "delta_lo": math.nan, "delta_hi": math.nan},
            {"metric": "recovered_share", "base": math.nan, "cand": self.share, "delta": self.share,
             "delta_lo": self.share_ci[0], "delta_hi": self.share_ci[1]},
        ]
        return pd.DataFrame(rows, columns=EP_RECOVERY_COLUMNS)

    def to_dict(self) -> dict:
        clean = json_scalar

        return {"available": self.available, "headline": self.headline, "confidence": self.confidence,
                "n_steps": list(self.n_steps), "notes": self.notes, "significant": self.significant,
                "rows": [{k: clean(v) for k, v in r.items()} for r in self.to_frame().to_dict("records")]}


def _per_step(balance: pd.DataFrame) -> pd.DataFrame:
    known = balance.dropna(subset=["balancedness", "uniform_balancedness"])
    return known.groupby("step", sort=True)[["balancedness", "uniform_balancedness"]].mean()


def has_uniform(balance: pd.DataFrame | None) -> bool:
    return balance is not None and {"step", "balancedness", "uniform_balancedness"} <= set(balance.columns) \
        and balance["uniform_balancedness"].notna().any()


def ep_recovery(base: pd.DataFrame | None, cand: pd.DataFrame | None, n_resamples: int = 2000, seed: int = 0,
                confidence: float = 0.95) -> EpRecovery:
    """BASE (no balancing) and CAND (balanced) ``balance.csv`` tables -> the recovered share."""
    from profkit.analyze.compare import _percentiles, _rng

    missing = [n for n, b in (("BASE", base), ("CAND", cand)) if not has_uniform(b)]
    if missing:
        return EpRecovery(False, f"EP balance vs uniform: {' and '.join(missing)} without the uniform-routing baseline in "
                                 "balance.csv (expert loads with known experts and top-k: `profkit analyze --experts E "
                                 "--topk K`)", confidence=confidence)
    pb, pc = _per_step(base), _per_step(cand)
    if len(pb) < 2 or len(pc) < 2:
        return EpRecovery(False, "EP balance vs uniform: fewer than 2 steps with loads on a side", confidence=confidence)
    rb, ub = float(pb["balancedness"].mean()), float(pb["uniform_balancedness"].mean())
    rc, uc = float(pc["balancedness"].mean()), float(pc["uniform_balancedness"].mean())
    ib = _rng(seed, 0, _SOURCE).integers(0, len(pb), size=(n_resamples, len(pb)))
    ic = _rng(seed, 1, _SOURCE).integers(0, len(pc), size=(n_resamples, len(pc)))
    rb_s = pb["balancedness"].to_numpy()[ib].mean(1)
    ub_s = pb["uniform_balancedness"].to_numpy()[ib].mean(1)
    rc_s = pc["balancedness"].to_numpy()[ic].mean(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.where(ub_s > rb_s, (rc_s - rb_s) / (ub_s - rb_s), np.nan)
    out = EpRecovery(True, "", (rb, rc), (ub, uc), _percentiles(rc_s - rb_s, confidence),
                     recovered_share(rb, rc, ub), _percentiles(shares, confidence), (len(pb), len(pc)),
                     confidence=confidence)
    if abs(uc - ub) > 0.02:
        out.notes.append(f"the runs' uniform baselines differ ({ub:.3f} vs {uc:.3f}): different batch sizes, ranks or "
                         "routing; the share is against BASE's")
    lo_r, hi_r = out.real_ci
    if math.isfinite(lo_r) and lo_r <= 0 <= hi_r:
        out.headline = (f"EP balance vs uniform: no significant change of balancedness ({rb:.3f} -> {rc:.3f}, change "
                        f"[{lo_r:+.3f}, {hi_r:+.3f}]) against {ub:.3f} for uniform routing: nothing recovered; BASE's "
                        f"recoverable gap is {ub - rb:.3f}")
        return out
    out.significant = True
    if not math.isfinite(out.share):
        out.headline = (f"EP balance vs uniform: BASE is already at the uniform baseline ({rb:.3f} vs {ub:.3f}): "
                        f"nothing to recover; CAND {rc:.3f}")
        return out
    lo, hi = out.share_ci
    if rc < rb:
        out.headline = (f"EP balance vs uniform: CAND is LESS balanced than BASE ({rb:.3f} -> {rc:.3f}, uniform "
                        f"routing {ub:.3f}): nothing recovered (expected BASE = no balancing, CAND = balanced)")
        return out
    out.headline = (f"EP balance vs uniform: balancedness {rb:.3f} -> {rc:.3f} against {ub:.3f} for uniform routing "
                    f"of the same batches: {100 * out.share:.0f}% [{100 * lo:.0f}%, {100 * hi:.0f}%] of the "
                    f"recoverable gap ({ub - rb:.3f}) recovered")
    return out
