"""Baseline vs candidate: every headline metric with a bootstrap interval and a verdict.

Pure (tables in, numbers out). The bootstrap unit is the *step*: all ranks' rows of one step
are resampled together, because ranks synchronize every step and their rows are not independent.
Baseline and candidate are resampled independently (seeded), the statistic is recomputed per
resample (vectorized numpy), and the interval of the change is the percentile interval of the
per-resample differences.

Verdicts, with ``t`` the threshold (0.05 for ``--threshold 5%``) and ``[lo, hi]`` the interval of
the relative change (candidate vs baseline):

- lower-is-better metrics (times): ``regressed`` when ``lo > +t`` (the whole interval is a slowdown
  of more than t), ``improved`` when ``hi < -t``, else ``within noise``;
- higher-is-better metrics (balancedness): mirrored;
- a metric without per-step samples on either side is shown but ``not judged``.

The relative change of a step-level metric is against its own baseline value; that of a cause's
per-step time is against the baseline's step time p50 (a cause going from 0.01 to 0.1 ms/step is
+900% of itself but 0.4% of a step: the step is what the user pays). The overall verdict is
``regressed`` if any metric regressed, else ``improved`` if any improved, else ``within noise``.
With ~10 metrics at 95% each, a threshold of a few % keeps false alarms on equal runs rare.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from profkit import distinct
from profkit.analyze.vocabulary import WAITING_FOR_RANK_RE
from profkit.distinct import group_keys
from profkit.keys import sorted_groups

LOWER, HIGHER = "lower", "higher"
IMPROVED, REGRESSED, NOISE, UNJUDGED = "improved", "regressed", "within noise", "not judged"
STATS = ("p50", "p90", "p99", "mean", "max", "min")
STEP_SOURCES = ("step_ns", "gpu_busy_ns", "gap_ns")
CAUSE_PREFIX = "cause:"
DEFAULT_RESAMPLES = 2000
_WAITING_RE = WAITING_FOR_RANK_RE
_CHUNK_ELEMS = 4_000_000  # resampled values held at once (32 MB of float64)
_EXACT_LIMIT = 20_000_000  # resampled values above which quantiles come from histograms
_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


@dataclass(frozen=True)
class Metric:
    """What to measure: a statistic over one source of per-step samples."""

    source: str  # step_ns | gpu_busy_ns | gap_ns | cause:<name> | late_ns | balancedness | straggler_score
    stat: str = "p50"  # one of STATS
    better: str = LOWER
    relative_to: str = "self"  # "self" or "step": the baseline's step time p50
    title: str = ""

    @property
    def key(self) -> str:
        return self.source if self.source.startswith(CAUSE_PREFIX) else f"{self.source}_{self.stat}"

    @property
    def unit(self) -> str:
        return "ratio" if self.source in ("balancedness", "straggler_score") else "ns"

    @property
    def label(self) -> str:
        return self.title or default_title(self.source, self.stat)


def default_title(source: str, stat: str) -> str:
    names = {"step_ns": "step time", "gpu_busy_ns": "GPU-only time", "gap_ns": "gap (step - GPU)",
             "late_ns": "worst-rank lateness per step", "balancedness": "EP balancedness",
             "straggler_score": "straggler score (worst rank, 1 = best)"}
    if source.startswith(CAUSE_PREFIX):
        return source[len(CAUSE_PREFIX):]
    natural = {"late_ns": "mean", "straggler_score": "min", "balancedness": "mean"}
    return names.get(source, source) + ("" if natural.get(source) == stat else f" {stat}")


def metric(source: str, stat: str | None = None) -> Metric:
    """The metric for a source with its natural direction and reference (for specs and the CLI)."""
    if source.startswith(CAUSE_PREFIX):
        return Metric(source, stat or "mean", LOWER, "step")
    if source == "balancedness":
        return Metric(source, stat or "mean", HIGHER)
    if source == "late_ns":
        return Metric(source, stat or "mean", LOWER, "step")
    if source == "straggler_score":  # stragglers.csv: 1.0 = the best rank, 0.8 = needs 25% longer
        return Metric(source, stat or "min", HIGHER)
    return Metric(source, stat or "p50", LOWER)


# ---- samples ---------------------------------------------------------------------------------
@dataclass
class Samples:
    """One run's per-step samples: matrices with a row per step (the bootstrap unit) and a column
    per rank (or layer); NaN where a rank has no such step. ``points`` are values known without
    samples (a cause from causes.csv when cause_steps.csv is missing, the straggler score)."""

    matrices: dict[str, np.ndarray] = field(default_factory=dict)
    points: dict[str, float] = field(default_factory=dict)
    cause_order: list[str] = field(default_factory=list)  # largest per-step time first
    late_because: dict[int, str] = field(default_factory=dict)  # straggler rank -> its own top cause
    _cause_steps: pd.DataFrame | None = None
    _grid: tuple[np.ndarray, np.ndarray] | None = None  # steps and ranks of the step matrices

    def matrix(self, source: str) -> np.ndarray | None:
        if source in self.matrices:
            return self.matrices[source]
        if source.startswith(CAUSE_PREFIX) and self._cause_steps is not None and self._grid is not None:
            m = _cause_matrix(self._cause_steps, source[len(CAUSE_PREFIX):], *self._grid, self.matrices["step_ns"])
            self.matrices[source] = m
            return m
        return None

    def point(self, m: Metric) -> float:
        mat = self.matrix(m.source)
        if mat is not None and mat.size:
            return float(_stat(mat.reshape(1, -1), m.stat)[0])
        if m.key in self.points:
            return self.points[m.key]
        return math.nan

    @property
    def n_steps(self) -> int:
        m = self.matrices.get("step_ns")
        return 0 if m is None else int(m.shape[0])


def samples_from_tables(
    steps: pd.DataFrame,
    causes: pd.DataFrame | None = None,
    cause_steps: pd.DataFrame | None = None,
    lateness: pd.DataFrame | None = None,
    balance: pd.DataFrame | None = None,
    stragglers: pd.DataFrame | None = None,
) -> Samples:
    """Samples from the analysis tables (steps.csv columns rank, step, step_ns, gpu_busy_ns,
    gap_ns; cause_steps rank, step, cause, ns; lateness rank, step, late_ns; balance step,
    balancedness; causes and stragglers as in causes.csv / stragglers.csv)."""
    out = Samples()
    if steps is not None and len(steps):
        step_ids = np.sort(steps["step"].unique())
        rank_ids = np.sort(steps["rank"].unique())
        for col in STEP_SOURCES:
            out.matrices[col] = _pivot(steps, col, step_ids, rank_ids)
        out._grid = (step_ids, rank_ids)
    if cause_steps is not None and out._grid is not None:
        out._cause_steps = cause_steps
        per_step = cause_steps.groupby("cause")["ns"].sum() / max(len(steps), 1)
        out.cause_order = list(per_step.sort_values(ascending=False, kind="stable").index)
    if causes is not None and len(causes):
        ordered = causes.sort_values("per_step_ns", ascending=False, kind="stable")
        for name, ns in zip(ordered["cause"], ordered["per_step_ns"]):
            out.points[CAUSE_PREFIX + str(name)] = float(ns)
        if not out.cause_order:
            out.cause_order = [str(c) for c in ordered["cause"]]
    if lateness is not None and len(lateness):
        worst = lateness.groupby("step")["late_ns"].max().sort_index()
        out.matrices["late_ns"] = worst.to_numpy(np.float64).reshape(-1, 1)
    if balance is not None and len(balance):
        layers = np.sort(balance["layer"].unique())
        out.matrices["balancedness"] = _pivot(balance, "balancedness", np.sort(balance["step"].unique()), layers, key="layer")
    if stragglers is not None and len(stragglers) and stragglers["score"].notna().any():
        out.points[metric("straggler_score").key] = float(stragglers["score"].min())
    if stragglers is not None and "top_cause" in stragglers:
        for rank, why in zip(stragglers["rank"], stragglers["top_cause"]):
            if isinstance(why, str) and why and pd.notna(rank):
                out.late_because[int(rank)] = why
    return out


def _pivot(df: pd.DataFrame, col: str, step_ids: np.ndarray, col_ids: np.ndarray, key: str = "rank") -> np.ndarray:
    m = np.full((step_ids.size, col_ids.size), np.nan)
    i = np.searchsorted(step_ids, df["step"].to_numpy())
    j = np.searchsorted(col_ids, df[key].to_numpy())
    m[i, j] = df[col].to_numpy(np.float64)
    return m


def _cause_matrix(cause_steps: pd.DataFrame, cause: str, step_ids: np.ndarray, rank_ids: np.ndarray,
                  step_matrix: np.ndarray) -> np.ndarray:
    """Charged time of one cause per (step, rank): 0 where the step exists but nothing was charged."""
    m = np.where(np.isnan(step_matrix), np.nan, 0.0)
    rows = cause_steps[cause_steps["cause"] == cause]
    rows = rows[rows["step"].isin(step_ids) & rows["rank"].isin(rank_ids)]
    if len(rows):
        i = np.searchsorted(step_ids, rows["step"].to_numpy())
        j = np.searchsorted(rank_ids, rows["rank"].to_numpy())
        np.add.at(m, (i, j), rows["ns"].to_numpy(np.float64))
    return m


def cause_step_table(charged: pd.DataFrame) -> pd.DataFrame:
    """``cause_steps.csv`` from charged intervals (``overhead.attribute_gaps`` rows): charged time
    per (rank, step, cause), int64 ns, the samples behind each cause's interval."""
    if charged is None or not len(charged):
        return pd.DataFrame({"rank": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                             "cause": pd.Series(dtype="object"), "ns": pd.Series(dtype="int64")})
    # groupby(["rank", "step", "cause"], sort=True).sum() over integer codes (the causes' in name order)
    cause_c, causes = distinct.factorize(charged["cause"], sort=True)
    keep = np.flatnonzero(cause_c >= 0)  # a row without a cause is in no group, as groupby drops it
    rank = charged["rank"].to_numpy(np.int64)[keep]
    step = charged["step"].to_numpy(np.int64)[keep]
    cause_c = cause_c[keep]
    order, starts = sorted_groups((rank, step, cause_c))
    ns = np.add.reduceat(charged["dur_ns"].to_numpy(np.int64)[keep][order], starts) if starts.size else np.empty(0, np.int64)
    first = order[starts]
    return pd.DataFrame({"rank": rank[first], "step": step[first], "cause": group_keys(causes, cause_c[first]),
                         "ns": ns.astype(np.int64)})


def cause_step_samples(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``cause_step_table`` recomputed from aligned events and the step table, exactly as
    ``overhead.causes_table`` charges them (for analyses that did not keep their charged rows)."""
    from profkit.analyze import overhead

    return cause_step_table(overhead.charge(events, steps)[0])


# ---- bootstrap -------------------------------------------------------------------------------
def _stat(x: np.ndarray, stat: str) -> np.ndarray:
    """The statistic of each row of ``x`` (NaN = missing)."""
    nan = np.isnan(x).any()
    if stat in ("p50", "p90", "p99"):
        q = {"p50": 0.5, "p90": 0.9, "p99": 0.99}[stat]
        return np.nanquantile(x, q, axis=1) if nan else np.quantile(x, q, axis=1)
    fn = {"mean": (np.mean, np.nanmean), "max": (np.max, np.nanmax), "min": (np.min, np.nanmin)}.get(stat)
    if fn is None:
        raise ValueError(f"unknown statistic {stat!r} (one of {', '.join(STATS)})")
    return fn[1](x, axis=1) if nan else fn[0](x, axis=1)


def bootstrap(matrix: np.ndarray, stat: str, n_resamples: int, rng: np.random.Generator,
              idx: np.ndarray | None = None) -> np.ndarray:
    """The statistic over ``n_resamples`` resamples of the matrix's rows (steps), with replacement.

    Mean, max and min reduce each step first (exact, O(resamples x steps)). Quantiles are exact
    on small inputs; past ``_EXACT_LIMIT`` resampled values (DEP256 x 1000 steps) they are read
    from per-step histograms over the pooled data's own quantiles (4096 bins: the error is below
    one bin, tiny where the data are dense), so a comparison stays seconds, not minutes.
    ``idx``: the resamples' rows (``resample_rows``) where the caller draws them once for several
    matrices of as many rows from generators of one seed (the same draws); ``rng`` is then unused.
    """
    n_rows = matrix.shape[0]
    if idx is None:
        idx = resample_rows(rng, n_rows, n_resamples)
    present = ~np.isnan(matrix)
    if stat == "mean":
        sums, counts = np.where(present, matrix, 0.0).sum(axis=1), present.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            if present.all():  # every resample has all its values: the counts sum to n_rows x columns
                return sums[idx].sum(axis=1) / float(n_rows * matrix.shape[1])
            return sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    if stat in ("max", "min"):
        fill = -np.inf if stat == "max" else np.inf
        per_row = np.where(present, matrix, fill)
        per_row = per_row.max(axis=1) if stat == "max" else per_row.min(axis=1)
        out = per_row[idx].max(axis=1) if stat == "max" else per_row[idx].min(axis=1)
        return np.where(np.isfinite(out), out, np.nan)
    if matrix.size * n_resamples > _EXACT_LIMIT and stat in _QUANTILES:
        return _binned_quantiles(matrix, _QUANTILES[stat], idx)
    out = np.empty(n_resamples)
    per = max(1, _CHUNK_ELEMS // max(matrix.size, 1))
    for s in range(0, n_resamples, per):
        block = idx[s : s + per]
        out[s : s + len(block)] = _stat(matrix[block].reshape(len(block), -1), stat)
    return out


def resample_rows(rng: np.random.Generator, n_rows: int, n_resamples: int) -> np.ndarray:
    """The rows of each of ``bootstrap``'s resamples: ``n_resamples`` draws of ``n_rows`` rows."""
    return rng.integers(0, n_rows, size=(n_resamples, n_rows))


def _binned_quantiles(matrix: np.ndarray, q: float, idx: np.ndarray) -> np.ndarray:
    n_resamples, n_rows = idx.shape
    values = matrix[~np.isnan(matrix)]
    n_bins = int(np.clip(_CHUNK_ELEMS // max(n_rows, 1), 256, 4096))
    edges = np.unique(np.quantile(values, np.linspace(0.0, 1.0, n_bins + 1)))
    n_bins = max(edges.size - 1, 1)
    rows = np.broadcast_to(np.arange(n_rows)[:, None], matrix.shape)[~np.isnan(matrix)]
    bins = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, n_bins - 1)
    hist = np.bincount(rows * n_bins + bins, minlength=n_rows * n_bins).reshape(n_rows, n_bins).astype(np.float64)
    lower = edges[:-1] if edges.size > 1 else edges
    width = np.diff(edges) if edges.size > 1 else np.zeros(1)
    out = np.empty(n_resamples)
    per = max(1, _CHUNK_ELEMS // n_bins)
    for s in range(0, n_resamples, per):
        block = idx[s : s + per]
        b = len(block)
        counts = np.bincount((block + np.arange(b)[:, None] * n_rows).ravel(), minlength=b * n_rows).reshape(b, n_rows)
        pooled = counts.astype(np.float64) @ hist  # resampled histogram: [b, n_bins]
        cum = np.cumsum(pooled, axis=1)
        pos = q * (cum[:, -1] - 1)  # numpy's "linear" quantile: 0-based rank (n - 1) q
        k = np.minimum((cum <= pos[:, None]).sum(axis=1), n_bins - 1)
        before = np.where(k > 0, cum[np.arange(b), k - 1], 0.0)
        inside = pooled[np.arange(b), k]
        frac = np.clip((pos - before + 0.5) / np.maximum(inside, 1.0), 0.0, 1.0)
        out[s : s + b] = lower[k] + frac * width[k]
    return out


def _rng(seed: int, side: int, source: str) -> np.random.Generator:
    # one stream per (side, source): the same step resamples for every statistic of one source
    return np.random.default_rng([seed, side, zlib.crc32(source.encode())])


def interval(s: Samples, m: Metric, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
             confidence: float = 0.95) -> tuple[float, float, float]:
    """(point, lo, hi): the metric and its bootstrap percentile interval on one run (a noise band)."""
    point = s.point(m)
    mat = s.matrix(m.source)
    if mat is None or mat.shape[0] < 2:
        return point, math.nan, math.nan
    reps = bootstrap(mat, m.stat, n_resamples, _rng(seed, 0, m.source))
    lo, hi = _percentiles(reps, confidence)
    return point, lo, hi


def _percentiles(x: np.ndarray, confidence: float) -> tuple[float, float]:
    x = x[np.isfinite(x)]
    if not x.size:
        return math.nan, math.nan
    a = (1 - confidence) / 2
    lo, hi = np.quantile(x, [a, 1 - a])
    return float(lo), float(hi)


# ---- comparison ------------------------------------------------------------------------------
@dataclass
class MetricChange:
    metric: Metric
    base: float
    cand: float
    delta: float  # cand - base (ns for times)
    rel: float  # delta / reference (its own baseline value, or the baseline's step p50)
    delta_ci: tuple[float, float]
    rel_ci: tuple[float, float]
    verdict: str
    reference: float  # what rel is relative to
    note: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["metric"] = {"key": self.metric.key, "title": self.metric.label, **asdict(self.metric)}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def change(base: Samples, cand: Samples, m: Metric, threshold: float = 0.05,
           n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0, confidence: float = 0.95) -> MetricChange:
    """One metric, baseline vs candidate: change, its bootstrap interval, and the verdict."""
    b, c = base.point(m), cand.point(m)
    reference = base.point(metric("step_ns", "p50")) if m.relative_to == "step" else b
    delta = c - b
    rel = delta / reference if reference and math.isfinite(reference) else math.nan
    bm, cm = base.matrix(m.source), cand.matrix(m.source)
    if bm is None or cm is None or bm.shape[0] < 2 or cm.shape[0] < 2:
        why = "no per-step samples" if (bm is None or cm is None) else "fewer than 2 steps"
        return MetricChange(m, b, c, delta, rel, (math.nan, math.nan), (math.nan, math.nan), UNJUDGED, reference, why)
    rb = bootstrap(bm, m.stat, n_resamples, _rng(seed, 0, m.source))
    rc = bootstrap(cm, m.stat, n_resamples, _rng(seed, 1, m.source))
    deltas = rc - rb
    delta_ci = _percentiles(deltas, confidence)
    if m.relative_to == "step":
        rel_ci = (delta_ci[0] / reference, delta_ci[1] / reference) if reference else (math.nan, math.nan)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_ci = _percentiles(np.where(rb != 0, deltas / rb, np.nan), confidence)
    return MetricChange(m, b, c, delta, rel, delta_ci, rel_ci, judge(m, rel_ci, threshold), reference)


def judge(m: Metric, rel_ci: tuple[float, float], threshold: float) -> str:
    lo, hi = rel_ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return UNJUDGED
    worse, better = (lo > threshold, hi < -threshold) if m.better == LOWER else (hi < -threshold, lo > threshold)
    return REGRESSED if worse else IMPROVED if better else NOISE


def headline_metrics(base: Samples, cand: Samples, top_causes: int = 5) -> list[Metric]:
    """Step time p50/p90, GPU-only p50, gap p50, the top causes of either run, straggler lateness
    and score, balancedness: whatever both runs have."""
    out = [metric("step_ns", "p50"), metric("step_ns", "p90"), metric("gpu_busy_ns", "p50"), metric("gap_ns", "p50")]
    causes: list[str] = []
    for name in base.cause_order[:top_causes] + cand.cause_order[:top_causes]:
        if name not in causes:
            causes.append(name)
    cms = [metric(CAUSE_PREFIX + c) for c in causes]
    cms.sort(key=lambda m: -max(_nz(base.point(m)), _nz(cand.point(m))))
    out += cms
    for source in ("late_ns", "straggler_score", "balancedness"):
        m = metric(source)
        if math.isfinite(base.point(m)) and math.isfinite(cand.point(m)):
            out.append(m)
    return out


def _nz(x: float) -> float:
    return x if math.isfinite(x) else 0.0


@dataclass
class Comparison:
    changes: list[MetricChange]
    verdict: str
    headline: str
    top_cause: MetricChange | None
    threshold: float
    n_resamples: int
    seed: int
    confidence: float
    base_name: str = "base"
    cand_name: str = "cand"

    @property
    def regressed(self) -> bool:
        return self.verdict == REGRESSED

    def to_dict(self) -> dict:
        return {
            "base": self.base_name, "candidate": self.cand_name, "verdict": self.verdict, "headline": self.headline,
            "top_cause": self.top_cause.metric.label if self.top_cause else None,
            "threshold": self.threshold, "confidence": self.confidence, "n_resamples": self.n_resamples,
            "seed": self.seed, "metrics": [c.to_dict() for c in self.changes],
        }


def compare(base: Samples, cand: Samples, threshold: float = 0.05, n_resamples: int = DEFAULT_RESAMPLES,
            seed: int = 0, confidence: float = 0.95, metrics: list[Metric] | None = None,
            top_causes: int = 5, base_name: str = "base", cand_name: str = "cand") -> Comparison:
    ms = metrics if metrics is not None else headline_metrics(base, cand, top_causes)
    changes = [change(base, cand, m, threshold, n_resamples, seed, confidence) for m in ms]
    verdicts = {c.verdict for c in changes}
    overall = REGRESSED if REGRESSED in verdicts else IMPROVED if IMPROVED in verdicts else NOISE
    top = _top_cause(changes, overall)
    headline = _headline(changes, overall, top, threshold, confidence)
    waited = _WAITING_RE.match(top.metric.label) if top is not None else None
    if waited and int(waited[1]) in cand.late_because:
        headline += f" (rank {waited[1]} was late because of: {cand.late_because[int(waited[1])]})"
    return Comparison(changes, overall, headline, top,
                      threshold, n_resamples, seed, confidence, base_name, cand_name)


def _is_cause(c: MetricChange) -> bool:
    return c.metric.source.startswith(CAUSE_PREFIX)


def _top_cause(changes: list[MetricChange], overall: str) -> MetricChange | None:
    """The cause that moved most in the direction of the overall verdict (regressed first)."""
    causes = [c for c in changes if _is_cause(c) and math.isfinite(c.delta)]
    if not causes:
        return None
    sign = -1.0 if overall == IMPROVED else 1.0
    for pool in ([c for c in causes if c.verdict == overall], causes):
        pool = [c for c in pool if sign * c.delta > 0]
        if pool:
            return max(pool, key=lambda c: sign * c.delta)
    return None


def _headline(changes: list[MetricChange], overall: str, top: MetricChange | None, threshold: float, confidence: float) -> str:
    lead: MetricChange | None = None
    if overall == NOISE:
        text = f"within noise: no metric moved beyond {threshold:.0%} at {confidence:.0%} confidence"
    else:
        hits = [c for c in changes if c.verdict == overall]
        steps = [c for c in hits if c.metric.source in STEP_SOURCES]
        # the first step-level metric in headline order (step time p50 first), else the largest change
        lead = steps[0] if steps else max(hits, key=lambda c: abs(c.rel) if math.isfinite(c.rel) else 0.0)
        text = f"{overall}: {'top cause: ' if _is_cause(lead) else ''}{describe(lead)}"
        more = len(hits) - 1
        if more:
            text += f" (and {more} more)"
    if top is not None and top is not lead and overall != NOISE:
        tag = "" if top.verdict == overall else f" ({top.verdict})"
        text += f", top cause: {top.metric.label} {fmt_signed_ms(top.delta)} ms/step{tag}"
    return text


def describe(c: MetricChange) -> str:
    """``step time p50 +32% [+25%, +40%]``, or for a cause ``X +4.1 ms/step [+2.0, +6.3] (+18% of a step)``."""
    lo, hi = c.rel_ci
    if _is_cause(c):
        dlo, dhi = c.delta_ci
        ci = f" [{fmt_signed_ms(dlo)}, {fmt_signed_ms(dhi)}]" if math.isfinite(dlo) else ""
        return f"{c.metric.label} {fmt_signed_ms(c.delta)} ms/step{ci} ({fmt_pct(c.rel)} of a step)"
    ci = f" [{fmt_pct(lo)}, {fmt_pct(hi)}]" if math.isfinite(lo) else ""
    return f"{c.metric.label} {fmt_pct(c.rel)}{ci}"


def fmt_pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:+.1f}%"


def fmt_signed_ms(ns: float) -> str:
    return "-" if not math.isfinite(ns) else f"{ns / 1e6:+.2f}"


def parse_threshold(text: str) -> float:
    """``5%`` or ``5`` -> 0.05 (always percent)."""
    t = str(text).strip().rstrip("%").strip()
    try:
        value = float(t) / 100.0
    except ValueError:
        raise ValueError(f"threshold {text!r}: expected a percentage such as 5%") from None
    if not (0 <= value < 10):
        raise ValueError(f"threshold {text!r}: expected a percentage between 0% and 1000%")
    return value


# ---- impact changes --------------------------------------------------------------------------
IMPACT_CHANGE_COLUMNS = ["cause", "kind", "base_ns", "cand_ns", "delta_ns", "delta_lo_ns", "delta_hi_ns", "change"]


def impact_changes(base: pd.DataFrame | None, base_steps: pd.DataFrame | None, cand: pd.DataFrame | None,
                   cand_steps: pd.DataFrame | None, top: int = 5, n_resamples: int = DEFAULT_RESAMPLES,
                   seed: int = 0, confidence: float = 0.95) -> pd.DataFrame:
    """How each cause's impact (``impact.csv``: the mean step drop without it) changed between two
    runs: the top ``top`` causes of either run and the bounds, with a bootstrap interval of the
    change from the per-step samples (``impact_steps.csv``: step, step_ns, replayed_ns per cause;
    the two runs resampled independently over steps). ``change``: larger / smaller when the
    interval excludes 0, else within noise; ``not judged`` without samples on both sides."""
    if base is None or cand is None or not len(base) or not len(cand):
        return pd.DataFrame(columns=IMPACT_CHANGE_COLUMNS)
    names: list[str] = []
    for t in (base, cand):
        rows = t[t["kind"].astype(str) != "bound"].sort_values("impact_ns_per_step", ascending=False, kind="stable")
        names += [c for c in rows["cause"].astype(str).head(top) if c not in names]
    bounds = [c for c in base.loc[base["kind"].astype(str) == "bound", "cause"].astype(str) if c in set(cand["cause"])]
    b_idx, c_idx = base.set_index("cause"), cand.set_index("cause")
    out = []
    for name in names + bounds:
        b = float(b_idx["impact_ns_per_step"].get(name, 0.0)) if name in b_idx.index else 0.0
        c = float(c_idx["impact_ns_per_step"].get(name, 0.0)) if name in c_idx.index else 0.0
        kind = str((b_idx if name in b_idx.index else c_idx).loc[name, "kind"])
        lo, hi = _impact_delta_interval(base_steps, cand_steps, name, n_resamples, seed, confidence)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            verdict = UNJUDGED
        else:
            verdict = "larger" if lo > 0 else "smaller" if hi < 0 else NOISE
        out.append({"cause": name, "kind": kind, "base_ns": b, "cand_ns": c, "delta_ns": c - b,
                    "delta_lo_ns": lo, "delta_hi_ns": hi, "change": verdict})
    return pd.DataFrame(out, columns=IMPACT_CHANGE_COLUMNS)


def _impact_delta_interval(base_steps, cand_steps, name: str, n_resamples: int, seed: int,
                           confidence: float) -> tuple[float, float]:
    def drops(steps: pd.DataFrame | None) -> np.ndarray | None:
        if steps is None or not len(steps):
            return None
        rows = steps[steps["cause"].astype(str) == name]
        if len(rows) < 2:
            return None
        return (rows["step_ns"].astype("float64") - rows["replayed_ns"].astype("float64")).to_numpy().reshape(-1, 1)

    db, dc = drops(base_steps), drops(cand_steps)
    if db is None and dc is None:
        return math.nan, math.nan
    src = "impact:" + name
    rb = bootstrap(db, "mean", n_resamples, _rng(seed, 0, src)) if db is not None else np.zeros(n_resamples)
    rc = bootstrap(dc, "mean", n_resamples, _rng(seed, 1, src)) if dc is not None else np.zeros(n_resamples)
    return _percentiles(rc - rb, confidence)
