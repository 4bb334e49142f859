"""Plotly figures of the HTML report, built from the small tables of ``html_data``.

Plotly renders a subset of HTML in every label and hover text, so each name that came from a
trace goes through ``label`` (``html.escape``): plotly decodes the entities back and shows the
name as typed, never as markup. Times are in ms, like the rest of the page.
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profkit.report.html_data import Matrix

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
GPU_COLOR = "#2e7d32"
STEP_COLOR = "#1f5fa8"
GAP_COLOR = "#e0822a"
LINE_COLOR = "#b3261e"


def label(name: object, limit: int = 48) -> str:
    """A trace-supplied name as plotly text: shortened, then entity-escaped."""
    text = str(name)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=True)


def unique_labels(names: list[object], limit: int = 48) -> list[str]:
    """Escaped, shortened labels, made distinct: a category axis merges equal labels."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for name in names:
        text = label(name, limit)
        n = seen.get(text, 0)
        seen[text] = n + 1
        out.append(text if n == 0 else f"{text} ({n + 1})")
    return out


def _layout(fig: go.Figure, height: int, **kwargs) -> go.Figure:
    fig.update_layout(
        template="plotly_white",
        height=height,
        margin=dict(l=70, r=30, t=30, b=60),
        font=dict(family=FONT, size=12),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
        **kwargs,
    )
    return fig


def _rank_axis(n: int) -> dict:
    return dict(title="rank", type="category", tickangle=0, nticks=min(n, 40))


def rank_distribution(step_q: pd.DataFrame, busy_q: pd.DataFrame) -> go.Figure:
    """Per rank: serving step time next to GPU-busy time, as boxes from precomputed quartiles."""
    fig = go.Figure()
    for q, name, color in ((step_q, "serving step", STEP_COLOR), (busy_q, "GPU busy (GPU-only time)", GPU_COLOR)):
        fig.add_trace(
            go.Box(
                name=name,
                x=[str(r) for r in q["rank"]],
                q1=q["q1"], median=q["median"], q3=q["q3"],
                lowerfence=q["min"], upperfence=q["max"], mean=q["mean"],
                marker_color=color, boxpoints=False,
            )
        )
    return _layout(fig, 380, boxmode="group", xaxis=_rank_axis(len(step_q)), yaxis=dict(title="ms per step", rangemode="tozero"))


def rank_breakdown(bd: pd.DataFrame) -> go.Figure:
    """Mean step per rank split into GPU busy and GPU-idle gap (stacked: adds up to the step)."""
    x = [str(r) for r in bd["rank"]]
    fig = go.Figure(
        [
            go.Bar(name="GPU busy", x=x, y=bd["gpu_busy_ms"], marker_color=GPU_COLOR,
                   hovertemplate="rank %{x}: GPU busy %{y:.2f} ms<extra></extra>"),
            go.Bar(name="gap (GPU idle)", x=x, y=bd["gap_ms"], marker_color=GAP_COLOR,
                   hovertemplate="rank %{x}: gap %{y:.2f} ms<extra></extra>"),
        ]
    )
    return _layout(fig, 340, barmode="stack", xaxis=_rank_axis(len(bd)), yaxis=dict(title="mean ms per step"))


def pareto(p: pd.DataFrame) -> go.Figure:
    """Causes by impact: bars (ms per step) and the cumulative share of all attributed time."""
    names = unique_labels(list(p["cause"]))
    full = [label(c, 200) for c in p["cause"]]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Bar(
            name="ms per rank-step", x=names, y=p["per_step_ns"].astype("float64") / 1e6,
            customdata=np.stack([full, (100 * p["step_share"].astype("float64")).round(1)], axis=-1),
            marker_color=GAP_COLOR,
            hovertemplate="%{customdata[0]}<br>%{y:.3f} ms per step, %{customdata[1]}% of step time<extra></extra>",
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            name="cumulative share", x=names, y=100 * p["cum_share"].astype("float64"), mode="lines+markers",
            line=dict(color=LINE_COLOR), hovertemplate="cumulative %{y:.1f}%<extra></extra>",
        ),
        secondary_y=True,
    )
    fig.update_yaxes(title_text="ms per step (avg over ranks and steps)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="cumulative share of attributed idle time", range=[0, 105], secondary_y=True,
                     showgrid=False, tickmode="array", tickvals=[0, 25, 50, 75, 100],
                     ticktext=["0%", "25%", "50%", "75%", "100%"])
    fig.update_xaxes(tickangle=-30, automargin=True)
    return _layout(fig, 440)


def impact_bars(t: pd.DataFrame, n_ranks: int = 1) -> go.Figure:
    """Impact per cause (mean step drop with its interval) beside the time charged to it per rank
    and step (``causes.csv``'s per_step_ns)."""
    from profkit.analyze.impact import who

    rows = t.to_dict("records")
    names = unique_labels([who(r) for r in rows], 60)[::-1]
    imp = t["impact_ns_per_step"].astype("float64").to_numpy()[::-1] / 1e6
    lo = pd.to_numeric(t["impact_lo_ns"], errors="coerce").astype("float64").to_numpy()[::-1] / 1e6
    hi = pd.to_numeric(t["impact_hi_ns"], errors="coerce").astype("float64").to_numpy()[::-1] / 1e6
    n_steps = t["n_steps"].astype("float64").replace(0, np.nan).to_numpy()[::-1]
    charged = pd.to_numeric(t["charged_ns"], errors="coerce").astype("float64").to_numpy()[::-1] / n_steps \
        / max(n_ranks, 1) / 1e6
    fig = go.Figure([
        go.Bar(name="charged per rank-step (causes.csv)", y=names, x=charged, orientation="h", marker_color="#b0b7c3",
               hovertemplate="%{y}: %{x:.3f} ms charged per rank and step<extra></extra>"),
        go.Bar(name="mean step drop without it", y=names, x=imp, orientation="h", marker_color=STEP_COLOR,
               error_x=dict(type="data", symmetric=False, array=np.nan_to_num(hi - imp),
                            arrayminus=np.nan_to_num(imp - lo), color=LINE_COLOR),
               hovertemplate="%{y}: step %{x:.3f} ms shorter<extra></extra>"),
    ])
    fig.update_yaxes(automargin=True)
    fig.update_xaxes(title_text="ms per step")
    return _layout(fig, 120 + 26 * len(rows), barmode="group")


def heatmap(m: Matrix) -> go.Figure:
    """Rank x step matrix; height grows with the rank count up to a readable cap."""
    height = int(min(900, max(260, 60 + 14 * len(m.ranks))))
    fig = go.Figure(
        go.Heatmap(
            z=m.z, x=m.steps, y=m.ranks, colorscale="YlOrRd", colorbar=dict(title="ms"),
            hovertemplate="rank %{y}, step %{x}: %{z:.3f} ms<extra></extra>", hoverongaps=False,
        )
    )
    return _layout(
        fig, height,
        xaxis=dict(title="step", type="category", nticks=min(len(m.steps), 30)),
        yaxis=dict(title="rank", type="category", autorange="reversed", nticks=min(len(m.ranks), 40)),
    )


def stragglers(table: pd.DataFrame) -> go.Figure | None:
    """Per rank: lateness p50/p99 (bars) and the wait it caused the others (markers)."""
    if "rank" not in table.columns:
        return None
    t = table.sort_values("rank")
    x = [str(r) for r in t["rank"]]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for col, name, color in (("late_ns_p50", "late p50", "#f2b880"), ("late_ns_p99", "late p99", GAP_COLOR)):
        if col in t.columns:
            fig.add_trace(go.Bar(name=name, x=x, y=t[col].astype("float64") / 1e6, marker_color=color,
                                 hovertemplate=f"rank %{{x}}: {name} %{{y:.3f}} ms<extra></extra>"), secondary_y=False)
    if "caused_wait_ns" in t.columns:
        fig.add_trace(go.Scatter(name="wait caused to others (total)", x=x, y=t["caused_wait_ns"].astype("float64") / 1e6,
                                 mode="markers", marker=dict(color=LINE_COLOR, size=9 if len(t) <= 32 else 5, symbol="diamond"),
                                 hovertemplate="rank %{x}: caused %{y:.2f} ms of waiting<extra></extra>"),
                      secondary_y=True)
    if not fig.data:
        return None
    fig.update_yaxes(title_text="lateness ms", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="wait caused, ms", secondary_y=True, rangemode="tozero", showgrid=False)
    fig.update_xaxes(**_rank_axis(len(t)))
    return _layout(fig, 340, barmode="group")


def step_line(per_step: pd.DataFrame, column: str, title: str, reference: float | None = None) -> go.Figure:
    """A per-step metric as a line (balancedness, DP imbalance); ``reference`` draws the ideal."""
    mode = "lines+markers" if len(per_step) <= 100 else "lines"
    fig = go.Figure(go.Scatter(x=per_step["step"], y=per_step[column].astype("float64"), mode=mode,
                               line=dict(color=STEP_COLOR), name=label(title),
                               hovertemplate="step %{x}: %{y:.3f}<extra></extra>"))
    if reference is not None:
        fig.add_hline(y=reference, line_dash="dot", line_color="#888")
    return _layout(fig, 300, xaxis=dict(title="step"), yaxis=dict(title=label(title)), showlegend=False)


def balance_vs_uniform(per_step: pd.DataFrame) -> go.Figure:
    """Real EP balancedness per step against the uniform-routing baseline of the same batches
    (its mean and 95% band over draws): the distance between them is what balancing can recover."""
    x = per_step["step"]
    mode = "lines+markers" if len(per_step) <= 100 else "lines"
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=per_step["uniform_hi"], mode="lines", line=dict(width=0), showlegend=False,
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=per_step["uniform_lo"], mode="lines", line=dict(width=0), fill="tonexty",
                             fillcolor="rgba(46,125,50,0.18)", name="uniform routing, 95% of draws",
                             hovertemplate="step %{x}: %{y:.3f}<extra>uniform 2.5%</extra>"))
    fig.add_trace(go.Scatter(x=x, y=per_step["uniform_balancedness"], mode="lines", line=dict(color=GPU_COLOR, dash="dash"),
                             name="uniform routing (mean)", hovertemplate="step %{x}: %{y:.3f}<extra>uniform</extra>"))
    fig.add_trace(go.Scatter(x=x, y=per_step["balancedness"], mode=mode, line=dict(color=STEP_COLOR), name="real routing",
                             hovertemplate="step %{x}: %{y:.3f}<extra>real</extra>"))
    return _layout(fig, 320, xaxis=dict(title="step"), yaxis=dict(title="mean / max rank load"))


def alignment(table: pd.DataFrame) -> go.Figure:
    """Residual clock error per rank (µs: these are far below a step) with its error bound."""
    x = [str(r) for r in table["rank"]]
    res = table["residual_ns"].astype("float64") / 1e3
    bound = table["error_bound_ns"].astype("float64") / 1e3 if "error_bound_ns" in table.columns else None
    methods = [label(m) for m in table.get("method", pd.Series([""] * len(table)))]
    fig = go.Figure(
        go.Bar(
            name="residual (median)", x=x, y=res.fillna(0), marker_color=STEP_COLOR, customdata=methods,
            error_y=None if bound is None else dict(type="data", array=bound.fillna(0), visible=True, color="#555"),
            hovertemplate="rank %{x} (%{customdata}): residual %{y:.1f} µs<extra></extra>",
        )
    )
    return _layout(fig, 300, xaxis=_rank_axis(len(table)), yaxis=dict(title="µs", rangemode="tozero"),
                   showlegend=False)
