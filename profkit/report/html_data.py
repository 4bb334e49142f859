"""Numbers behind the HTML report: small, aggregated tables cut from an ``Analysis``.

Pure pandas/numpy; no plotly, no HTML. Everything here is O(ranks) or capped (heatmaps are
binned), so a 256-rank x 1000-step capture makes a page of the same size as a 2-rank one.
Optional analyzers (stragglers, balance) are read with ``getattr``: an absent attribute is
"not computed", never an error.
"""
from __future__ import annotations

import math
import os
import shlex
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

MAX_HEATMAP_STEPS = 200  # step columns kept in a heatmap (wider: binned, max per bin)
MAX_HEATMAP_RANKS = 256  # rank rows kept in a heatmap (taller: binned, max per bin)
MAX_PARETO_CAUSES = 15  # bars in the Pareto chart; the rest become one "other" bar
MAX_EXAMPLES = 20  # findings listed with a trace command


def ms(ns: float | int | None) -> str:
    """``12.34 ms`` (3 decimals under 1 ms): the unit serving engineers read step times in."""
    if ns is None or ns is pd.NA or (isinstance(ns, float) and math.isnan(ns)):
        return "-"
    value = float(ns) / 1e6
    return f"{value:.3f} ms" if abs(value) < 1 else f"{value:.2f} ms"


def pct(x: float | None) -> str:
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * float(x):.1f}%"


def ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    shown = ", ".join(str(r) for r in ranks[:12])
    more = f" and {len(ranks) - 12} more" if len(ranks) > 12 else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + shown + more


# ---- headline ------------------------------------------------------------------------------
@dataclass
class Headline:
    n_ranks: int
    n_steps: int  # (rank, step) rows
    step_ns_p50: float
    step_ns_p90: float
    gpu_busy_ns_p50: float
    gap_ns_p50: float
    idle_share: float  # sum of gaps / sum of step times
    top_cause: dict | None  # a causes row
    straggler_ranks: list[int] | None  # None: not computed


def headline(analysis) -> Headline:
    steps = analysis.steps
    causes = sorted_causes(analysis)
    total_step = float(steps["step_ns"].sum()) if len(steps) else 0.0
    stragglers = getattr(analysis, "straggler_ranks", None)
    return Headline(
        n_ranks=len(analysis.ranks),
        n_steps=len(steps),
        step_ns_p50=float(steps["step_ns"].median()) if len(steps) else float("nan"),
        step_ns_p90=float(steps["step_ns"].quantile(0.9)) if len(steps) else float("nan"),
        gpu_busy_ns_p50=float(steps["gpu_busy_ns"].median()) if len(steps) else float("nan"),
        gap_ns_p50=float(steps["gap_ns"].median()) if len(steps) else float("nan"),
        idle_share=float(steps["gap_ns"].sum()) / total_step if total_step else float("nan"),
        top_cause=causes.iloc[0].to_dict() if len(causes) else None,
        straggler_ranks=None if stragglers is None else [int(r) for r in stragglers],
    )


def sorted_causes(analysis) -> pd.DataFrame:
    causes = getattr(analysis, "causes", None)
    if causes is None or not len(causes):
        return pd.DataFrame(columns=["cause", "total_ns", "per_step_ns", "step_share"])
    return causes.sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)


# ---- per-rank distributions ----------------------------------------------------------------
def rank_quantiles(steps: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per rank: min, q1, median, q3, max, mean of ``column`` in ms (a box drawn from 6 numbers
    instead of every step, so 256 ranks x 1000 steps stay small)."""
    g = steps.groupby("rank")[column]
    out = pd.DataFrame(
        {
            "min": g.min(),
            "q1": g.quantile(0.25),
            "median": g.median(),
            "q3": g.quantile(0.75),
            "max": g.max(),
            "mean": g.mean(),
        }
    )
    return (out.astype("float64") / 1e6).reset_index()


def rank_breakdown(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank: mean GPU busy and mean gap per step (ms); they add up to the mean step time."""
    g = steps.groupby("rank")
    return pd.DataFrame(
        {
            "gpu_busy_ms": g["gpu_busy_ns"].mean() / 1e6,
            "gap_ms": g["gap_ns"].mean() / 1e6,
            "step_ms": g["step_ns"].mean() / 1e6,
        }
    ).reset_index()


# ---- causes --------------------------------------------------------------------------------
def pareto(causes: pd.DataFrame, limit: int = MAX_PARETO_CAUSES) -> pd.DataFrame:
    """Top causes by total time plus one "other" row; ``cum_share`` is of all attributed time."""
    if not len(causes):
        return pd.DataFrame(columns=["cause", "total_ns", "per_step_ns", "step_share", "cum_share"])
    top = causes.head(limit)[["cause", "total_ns", "per_step_ns", "step_share"]].copy()
    rest = causes.iloc[limit:]
    if len(rest):
        other = {
            "cause": f"other ({len(rest)} causes)",
            "total_ns": rest["total_ns"].sum(),
            "per_step_ns": rest["per_step_ns"].sum(),
            "step_share": rest["step_share"].sum(),
        }
        top = pd.concat([top, pd.DataFrame([other])], ignore_index=True)
    total = float(causes["total_ns"].sum())
    top["cum_share"] = top["total_ns"].cumsum().astype("float64") / total if total else 0.0
    return top


# ---- heatmaps ------------------------------------------------------------------------------
@dataclass
class Matrix:
    """A rank x step matrix (values in ms), possibly binned; ``note`` says how."""

    z: np.ndarray  # float32, rows = ranks, columns = steps; NaN where unknown
    ranks: list[str]  # row labels ("3" or "0-7" when binned)
    steps: list[str]  # column labels ("12" or "10-19")
    title: str
    note: str


def _bin_axis(n: int, limit: int) -> int:
    return max(1, math.ceil(n / limit))


def _labels(values: np.ndarray, width: int) -> list[str]:
    out = []
    for i in range(0, len(values), width):
        chunk = values[i : i + width]
        out.append(str(chunk[0]) if len(chunk) == 1 else f"{chunk[0]}-{chunk[-1]}")
    return out


def _binned_max(z: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Max over blocks of ``rows`` x ``cols`` cells (NaN-aware): spikes survive the binning."""
    r, c = z.shape
    pad_r, pad_c = (-r) % rows, (-c) % cols
    padded = np.pad(z, ((0, pad_r), (0, pad_c)), constant_values=np.nan)
    blocks = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN blocks stay NaN, silently
        return np.nanmax(blocks, axis=(1, 3))


def matrix(long: pd.DataFrame, value: str, title: str, unit_scale: float = 1e-6) -> Matrix:
    """Pivot a long (rank, step, value) table into a binned rank x step matrix of ms."""
    wide = long.pivot_table(index="rank", columns="step", values=value, aggfunc="max")
    wide = wide.sort_index().sort_index(axis=1)
    z = wide.to_numpy(dtype="float64") * unit_scale
    ranks, steps = wide.index.to_numpy(), wide.columns.to_numpy()
    rb, sb = _bin_axis(len(ranks), MAX_HEATMAP_RANKS), _bin_axis(len(steps), MAX_HEATMAP_STEPS)
    note = ""
    if rb > 1 or sb > 1:
        z = _binned_max(z, rb, sb)
        parts = []
        if sb > 1:
            parts.append(f"{sb} consecutive steps")
        if rb > 1:
            parts.append(f"{rb} consecutive ranks")
        note = (
            f"{len(ranks)} ranks x {len(steps)} steps binned: each cell is the max over "
            + " and ".join(parts) + "."
        )
    return Matrix(z.astype("float32"), _labels(ranks, rb), _labels(steps, sb), title, note)


def lateness_matrix(analysis) -> Matrix | None:
    """Lateness per rank and step from the straggler analyzer (long or wide table), or, when it
    is absent, each step's GPU-idle gap as a labeled fallback."""
    lateness = getattr(analysis, "lateness", None)
    if isinstance(lateness, pd.DataFrame) and len(lateness):
        long = _lateness_long(lateness)
        if long is not None:
            return matrix(long, "late_ns", "Lateness at sync points (ms)")
    steps = analysis.steps
    if not len(steps):
        return None
    m = matrix(steps[["rank", "step", "gap_ns"]], "gap_ns", "GPU-idle gap per step (ms)")
    m.note = ("Fallback: lateness was not computed, so this shows each step's GPU-idle gap "
              "(step time minus GPU busy time). " + m.note).strip()
    return m


def _lateness_long(lateness: pd.DataFrame) -> pd.DataFrame | None:
    """(rank, step, late_ns) from either a long table or a wide rank x step one."""
    cols = list(lateness.columns)
    if "rank" in cols and "step" in cols:
        value = next((c for c in ("late_ns", "lateness_ns", "late_ns_max", "late_ns_p50") if c in cols), None)
        value = value or next((c for c in cols if "late" in str(c)), None)
        if value is None:
            return None
        return lateness[["rank", "step", value]].rename(columns={value: "late_ns"})
    wide = lateness.set_index("rank") if "rank" in cols else lateness
    long = wide.rename_axis(index="rank", columns="step").stack().rename("late_ns").reset_index()
    long["step"] = pd.to_numeric(long["step"], errors="coerce")
    return long.dropna(subset=["step"]).astype({"rank": "int64", "step": "int64"})


# ---- balance -------------------------------------------------------------------------------
def dp_imbalance(steps: pd.DataFrame) -> pd.DataFrame | None:
    """Per step: max / mean tokens over ranks (1.0 = balanced), from ``num_tokens`` when known."""
    if "num_tokens" not in steps.columns:
        return None
    known = steps.dropna(subset=["num_tokens"])
    if not len(known):
        return None
    tokens = known.assign(num_tokens=known["num_tokens"].astype("float64"))
    g = tokens.groupby("step")["num_tokens"]
    out = pd.DataFrame({"mean_tokens": g.mean(), "max_tokens": g.max(), "n_ranks": g.size()}).reset_index()
    out = out[out["n_ranks"] > 1]
    if not len(out):
        return None
    out["imbalance"] = out["max_tokens"] / out["mean_tokens"].where(out["mean_tokens"] > 0)
    return out


def balance_frames(analysis) -> list[tuple[str, pd.DataFrame]]:
    """The balance analyzer's tables, whatever container it returns (a DataFrame, a dict of
    them, or an object with DataFrame attributes)."""
    balance = getattr(analysis, "balance", None)
    if balance is None:
        return []
    if isinstance(balance, pd.DataFrame):
        return [("balance", balance)]
    items = balance.items() if isinstance(balance, dict) else getattr(balance, "__dict__", {}).items()
    return [(str(k), v) for k, v in items if isinstance(v, pd.DataFrame) and len(v)]


def balance_series(frame: pd.DataFrame) -> tuple[str, pd.DataFrame] | None:
    """(metric, per-step mean of it) for a balance table that has a step column and a
    balancedness / imbalance metric; None when it has neither."""
    metric = next((c for c in frame.columns if "balanced" in str(c) or "imbalance" in str(c)), None)
    if metric is None or "step" not in frame.columns:
        return None
    per_step = frame.groupby("step")[metric].mean().reset_index()
    return str(metric), per_step


def balance_vs_uniform(frame: pd.DataFrame) -> tuple[pd.DataFrame, str] | None:
    """(per-step means over layers of real and uniform-routing balancedness and its band, a
    one-line summary) for an EP balance table with the uniform baseline; None without it."""
    cols = ["balancedness", "uniform_balancedness", "uniform_lo", "uniform_hi"]
    if "step" not in frame.columns or any(c not in frame.columns for c in cols):
        return None
    known = frame.dropna(subset=cols)
    if not len(known):
        return None
    per_step = known.groupby("step")[cols].mean().reset_index()
    real, uni = float(known["balancedness"].mean()), float(known["uniform_balancedness"].mean())
    summary = (f"EP balancedness {real:.3f} (mean over steps and layers) against {uni:.3f} for the same batches "
               f"routed uniformly: a recoverable gap of {uni - real:.3f}.")
    return per_step, summary


# ---- alignment -----------------------------------------------------------------------------
def alignment_table(analysis) -> pd.DataFrame | None:
    alignment = getattr(analysis, "alignment", None)
    if alignment is None or alignment.ranks is None or not len(alignment.ranks):
        return None
    cols = [c for c in ("rank", "method", "offset_ns", "drift_ppm", "residual_ns", "residual_p90_ns",
                        "error_bound_ns", "n_points") if c in alignment.ranks.columns]
    return alignment.ranks[cols].sort_values("rank").reset_index(drop=True)


# ---- findings ------------------------------------------------------------------------------
def trace_paths(analysis) -> list[str]:
    """The inputs to name in a ``profkit merge`` command: one folder when all share one."""
    parts = analysis.capture.parts
    paths = sorted({str(p) for p in parts["path"]}) if len(parts) and "path" in parts.columns else []
    if len(paths) > 1:
        try:
            common = os.path.commonpath(paths)
        except ValueError:
            common = ""
        if common and common not in (os.sep, "."):
            return [common]
    return paths[:3] + (["..."] if len(paths) > 3 else [])


def merge_command(paths: list[str]) -> str:
    """The merge command for this capture, without a window (rows add ``--steps S:S``)."""
    files = " ".join(shlex.quote(p) if p != "..." else p for p in paths) or "TRACES"
    return f"profkit merge {files} -o merged.pftrace"


def steps_window(step: int) -> str:
    return f"--steps {step}:{step}" if step >= 0 else ""


def examples(analysis, limit: int = MAX_EXAMPLES) -> pd.DataFrame:
    """One row per top cause: where to look (rank, step, ms into the step) and the command."""
    causes = sorted_causes(analysis).head(limit)
    if not len(causes) or "example_rank" not in causes.columns:
        return pd.DataFrame()
    steps = analysis.steps
    starts = (
        steps.set_index(["rank", "step"])["start_ns"].to_dict() if len(steps) else {}
    )
    rows = []
    for row in causes.to_dict("records"):
        rank, step, at = int(row["example_rank"]), int(row["example_step"]), int(row["example_start_ns"])
        step_start = starts.get((rank, step))
        rows.append(
            {
                "cause": str(row["cause"]),
                "per_step_ns": row.get("per_step_ns"),
                "step_share": row.get("step_share"),
                "rank": rank,
                "step": step,
                "start_ns": at,
                "into_step_ns": None if step_start is None else at - int(step_start),
                "dur_ns": row.get("example_dur_ns"),
                "window": steps_window(step),
            }
        )
    return pd.DataFrame(rows)


def straggler_table(analysis) -> pd.DataFrame | None:
    table = getattr(analysis, "stragglers", None)
    if not isinstance(table, pd.DataFrame):
        return None
    if "score" in table.columns:
        table = table.sort_values("score", ascending=False, kind="stable")
    return table.reset_index(drop=True)


def worst_late_steps(analysis, ranks: list[int]) -> list[dict]:
    """For each straggler rank, the step it was latest at (a finding to open in the trace)."""
    lateness = getattr(analysis, "lateness", None)
    if not isinstance(lateness, pd.DataFrame) or not len(lateness) or not ranks:
        return []
    long = _lateness_long(lateness)
    if long is None:
        return []
    out = []
    for rank in ranks:
        mine = long[(long["rank"] == rank)].dropna(subset=["late_ns"])
        if not len(mine):
            continue
        worst = mine.loc[mine["late_ns"].idxmax()]
        step = int(worst["step"])
        out.append({"rank": rank, "step": step, "late_ns": float(worst["late_ns"]),
                    "window": steps_window(step)})
    return out
