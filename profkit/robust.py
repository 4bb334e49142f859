"""Robust straight-line fit for clock offsets and drift.

Why robust: a few collective instances end far from the others (a mismatched instance, a
preempted kernel, a Gloo span closed late by its thread); least squares would let them move a
whole rank. Start from Theil-Sen (median of pairwise slopes), then iteratively reweighted least
squares: Huber weights to settle, Tukey biweights to reject (weight 0) what lies beyond ~4.7
robust sigmas. Every step is regression-equivariant: adding ``A + B x`` to ``y`` moves the fit by
exactly ``(A, B)``, so a shifted or drifting rank is recovered exactly, whatever the noise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HUBER_C = 1.345
TUKEY_C = 4.685
MAD_TO_SIGMA = 1.4826
THEIL_SEN_POINTS = 64


@dataclass(frozen=True)
class LineFit:
    """``y ~ offset + slope * x``; residual scale and weights in units of the prior weights."""

    offset: float
    slope: float
    scale: float  # robust sigma of standardized residuals (residual * sqrt(prior weight))
    x: np.ndarray  # the x values (for standard errors)
    residuals: np.ndarray  # y - fit, every point
    weights: np.ndarray  # final robust weights in [0, 1]; 0 = rejected
    prior: np.ndarray  # prior weights given (1 / sigma^2 of each point's kind, relative)
    fit_slope: bool

    @property
    def n_used(self) -> int:
        return int((self.weights > 0).sum())

    def stderr_at(self, x) -> np.ndarray:
        """Standard error of the fitted line at ``x`` (same units as y)."""
        w = self.weights * self.prior
        sw = w.sum()
        x = np.asarray(x, dtype=np.float64)
        if sw <= 0:
            return np.full(x.shape, np.inf)
        var0 = self.scale**2 / sw
        if not self.fit_slope:
            return np.full(x.shape, np.sqrt(var0))
        xm = (w * self.x).sum() / sw
        sxx = (w * (self.x - xm) ** 2).sum()
        if sxx <= 0:
            return np.full(x.shape, np.inf)
        return np.sqrt(var0 + self.scale**2 * (x - xm) ** 2 / sxx)

    @property
    def slope_stderr(self) -> float:
        if not self.fit_slope:
            return float("nan")
        w = self.weights * self.prior
        sw = w.sum()
        if sw <= 0:
            return float("inf")
        xm = (w * self.x).sum() / sw
        sxx = (w * (self.x - xm) ** 2).sum()
        return float(self.scale / np.sqrt(sxx)) if sxx > 0 else float("inf")


def median(a: np.ndarray) -> float:
    """``float(np.median(a))`` of a 1-D array in half its time (its axis handling and ``mean`` call
    are most of a median of a few thousand values, and a robust line takes two a pass, 20 passes
    a rank): the same partition, the middle value(s) added and halved as ``mean`` adds them (from
    the first, plus a sum of the rest from 0.0), NaN where any value is NaN."""
    n = a.size
    if n == 0:
        return float(np.median(a))  # its warning and NaN
    k = n // 2
    if n % 2:
        part = np.partition(a, (k, n - 1))
        mid = part[k] + 0.0  # ``mean`` of one value: the value plus a sum of none (-0.0 becomes 0.0)
    else:
        part = np.partition(a, (k - 1, k, n - 1))
        mid = (part[k - 1] + (0.0 + part[k])) / 2.0  # ``mean`` of two: the first plus a sum of the other, halved
    return float("nan") if np.isnan(part[-1]) else float(mid)


def theil_sen(x: np.ndarray, y: np.ndarray, forward_only: bool = False) -> tuple[float, float]:
    """Median of pairwise slopes over at most THEIL_SEN_POINTS points spread evenly in x.

    ``forward_only``: take only the pairs whose later point (in the order given) has the larger x.
    The same as all pairs when x is sorted or thinned (thinning sorts); on unsorted x it drops
    about half of them. The collective sequence matching has always fitted that way (its start
    line, ``line_fit``); kept so that its outputs do not move.
    """
    if len(x) > THEIL_SEN_POINTS:
        pick = np.linspace(0, len(x) - 1, THEIL_SEN_POINTS).round().astype(np.int64)
        order = np.argsort(x, kind="stable")[pick]
        xs, ys = x[order], y[order]
    else:
        xs, ys = x, y
    i, j = np.triu_indices(len(xs), k=1)
    dx = xs[j] - xs[i]
    ok = dx > 0 if forward_only else dx != 0
    slope = median((ys[j] - ys[i])[ok] / dx[ok]) if ok.any() else 0.0
    return median(y - slope * x), slope


def _solve(x: np.ndarray, y: np.ndarray, w: np.ndarray, fit_slope: bool) -> tuple[float, float]:
    sw = w.sum()
    if sw <= 0:
        return median(y), 0.0
    ym = (w * y).sum() / sw
    if not fit_slope:
        return float(ym), 0.0
    xm = (w * x).sum() / sw
    sxx = (w * (x - xm) ** 2).sum()
    if sxx <= 0:
        return float(ym), 0.0
    slope = float((w * (x - xm) * (y - ym)).sum() / sxx)
    return float(ym - slope * xm), slope


def _scale(std_resid: np.ndarray, floor: float) -> float:
    mad = median(np.abs(std_resid - median(std_resid))) if len(std_resid) else 0.0
    return max(MAD_TO_SIGMA * mad, floor)


def robust_line(
    x, y, prior=None, fit_slope: bool = True, scale_floor: float = 100.0, iterations: int = 20
) -> LineFit:
    """Fit ``y = offset + slope * x`` (float64 inputs; keep x small: relative to a reference time).

    ``prior``: per-point weights (1/sigma^2, relative) when points differ in exactness (GPU
    kernel ends vs Gloo span ends). ``scale_floor`` (units of y) keeps exact data from giving a
    zero scale.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    prior = np.ones(len(x)) if prior is None else np.asarray(prior, dtype=np.float64)
    if len(x) == 0:
        raise ValueError("robust_line needs at least one point")
    sq = np.sqrt(prior)
    if fit_slope and len(x) >= 2:
        offset, slope = theil_sen(x, y)
    else:
        fit_slope = False
        offset, slope = median(y), 0.0
    weights = np.ones(len(x))
    scale = scale_floor
    half = iterations // 2
    for it in range(iterations):
        r = (y - offset - slope * x) * sq
        if it < half:  # Huber phase: the scale follows all residuals (MAD), then stays fixed
            scale = _scale(r, scale_floor)
            u = np.abs(r) / scale
            weights = np.where(u <= HUBER_C, 1.0, HUBER_C / np.maximum(u, 1e-300))
        else:
            u = np.abs(r) / scale
            weights = np.where(u < TUKEY_C, (1.0 - (u / TUKEY_C) ** 2) ** 2, 0.0)
        new = _solve(x, y, weights * prior, fit_slope)
        done = it > half and abs(new[0] - offset) < 0.01 and abs(new[1] - slope) * (np.ptp(x) + 1) < 0.01
        offset, slope = new
        if done:
            break
    residuals = y - offset - slope * x
    return LineFit(offset, slope, scale, x, residuals, weights, prior, fit_slope)
