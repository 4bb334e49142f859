"""A self-contained HTML dashboard of the regression history (plotly.js inlined once, no network).

Panels come from a plain JSON spec users edit (``dashboards/default.json``, shipped in the package
as ``profkit/data/dashboards/default.json``, the default): per panel a metric
(``step_ns``, ``gpu_busy_ns``, ``gap_ns``, ``late_ns``, ``balancedness``, ``straggler_score``,
``cause:<name>`` or ``cause:*`` for the top causes), an aggregation (p50, p90, p99, mean, max),
and a threshold. Each run's value carries its noise band (bootstrap interval over its own steps);
a run whose change against the baseline run (the previous one, or the first) is a regression by
``profkit compare``'s rule is marked. Every name from a run (label, metadata, cause) is escaped
before it reaches HTML or plotly's text (plotly decodes entities into literal text).
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from profkit.analyze import compare as cmp

AGGREGATIONS = ("p50", "p90", "p99", "mean", "max")
SOURCES = ("step_ns", "gpu_busy_ns", "gap_ns", "late_ns", "balancedness", "straggler_score")
BASELINES = ("previous", "first")
MARK = {cmp.REGRESSED: ("#d62728", "x", "regressed"), cmp.IMPROVED: ("#2ca02c", "triangle-down", "improved")}


class SpecError(Exception):
    """The dashboard spec is unusable; ``str()`` names the file and the panel."""


@dataclass(frozen=True)
class Panel:
    title: str
    metric: str  # a source or cause:<name> / cause:*
    aggregation: str
    threshold: float
    top: int = 5


@dataclass(frozen=True)
class Spec:
    title: str
    panels: tuple[Panel, ...]
    x: str = "index"  # index | time
    baseline: str = "previous"
    confidence: float = 0.95
    resamples: int = 1000


def default_spec_path() -> Path:
    """The default panels, from the package (so an installed wheel has them; in a checkout the
    same file as ``dashboards/default.json``)."""
    from profkit.data import shipped

    return shipped("dashboards", "default.json")


def load_spec(path: str | Path | None = None) -> Spec:
    """Read and check a spec; unknown metrics and aggregations are errors, not empty plots."""
    p = Path(path) if path else default_spec_path()
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"{p}: unreadable: {exc}") from exc
    return parse_spec(doc, str(p))


def parse_spec(doc: dict, where: str = "spec") -> Spec:
    if not isinstance(doc, dict) or not isinstance(doc.get("panels"), list) or not doc["panels"]:
        raise SpecError(f"{where}: expected an object with a non-empty list 'panels'")
    panels = []
    for i, raw in enumerate(doc["panels"]):
        at = f"{where}: panel {i + 1}"
        if not isinstance(raw, dict) or not isinstance(raw.get("metric"), str):
            raise SpecError(f"{at}: expected an object with 'metric'")
        source = raw["metric"]
        if source not in SOURCES and not (source.startswith(cmp.CAUSE_PREFIX) and len(source) > len(cmp.CAUSE_PREFIX)):
            raise SpecError(f"{at}: unknown metric {source!r} (one of {', '.join(SOURCES)}, cause:<name>, cause:*)")
        agg = raw.get("aggregation") or cmp.metric(source.replace("*", "x")).stat
        if agg not in AGGREGATIONS:
            raise SpecError(f"{at}: unknown aggregation {agg!r} (one of {', '.join(AGGREGATIONS)})")
        try:
            threshold = cmp.parse_threshold(raw.get("threshold", "5%"))
        except ValueError as exc:
            raise SpecError(f"{at}: {exc}") from None
        title = str(raw.get("title") or cmp.default_title(source, agg))
        panels.append(Panel(title, source, agg, threshold, int(raw.get("top", 5))))
    x = doc.get("x", "index")
    baseline = doc.get("baseline", "previous")
    if x not in ("index", "time"):
        raise SpecError(f"{where}: x must be 'index' or 'time', not {x!r}")
    if baseline not in BASELINES:
        raise SpecError(f"{where}: baseline must be one of {', '.join(BASELINES)}, not {baseline!r}")
    return Spec(str(doc.get("title") or "profkit regression history"), tuple(panels), x, baseline,
                float(doc.get("confidence", 0.95)), int(doc.get("resamples", 1000)))


# ---- figures -------------------------------------------------------------------------------------
def _t(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _when(run) -> str:
    if run.created_ns is None:
        return ""
    return datetime.fromtimestamp(run.created_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def _x(spec: Spec, runs: list, i: int):
    if spec.x == "time" and runs[i].created_ns is not None:
        return datetime.fromtimestamp(runs[i].created_ns / 1e9, tz=timezone.utc).isoformat()
    return i


def _scale(m: cmp.Metric) -> tuple[float, str]:
    return (1.0, "") if m.unit == "ratio" else (1e6, " ms")


def panel_metrics(panel: Panel, samples: list[cmp.Samples]) -> list[cmp.Metric]:
    """The metrics one panel draws (``cause:*``: the causes largest on average over the runs)."""
    if panel.metric != "cause:*":
        m = cmp.metric(panel.metric, panel.aggregation)
        return [cmp.Metric(m.source, m.stat, m.better, m.relative_to, panel.title)]
    totals: dict[str, float] = {}
    for s in samples:
        for name in s.cause_order[: max(panel.top * 2, 10)]:
            v = s.point(cmp.metric(cmp.CAUSE_PREFIX + name, panel.aggregation))
            if math.isfinite(v):
                totals[name] = totals.get(name, 0.0) + v
    names = sorted(totals, key=lambda n: -totals[n])[: panel.top]
    return [cmp.metric(cmp.CAUSE_PREFIX + n, panel.aggregation) for n in names]


def panel_figure(panel: Panel, spec: Spec, runs: list, samples: list[cmp.Samples], seed: int) -> tuple[dict, list[str]]:
    """One panel's plotly figure (as a dict) and the regressions it found, as sentences."""
    import plotly.graph_objects as go

    fig = go.Figure()
    found: list[str] = []
    metrics = panel_metrics(panel, samples)
    colors = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
    ticks = [f"{_t(r.label)}<br>{_when(r)}" for r in runs]
    for k, m in enumerate(metrics):
        scale, unit = _scale(m)
        color = colors[k % len(colors)]
        name = _t(m.label if m.source.startswith(cmp.CAUSE_PREFIX) else panel.title)
        xs, ys, lo, hi, text, have = [], [], [], [], [], []
        for i, s in enumerate(samples):
            point, a, b = cmp.interval(s, m, spec.resamples, seed, spec.confidence)
            if not math.isfinite(point):
                continue
            have.append(i)
            xs.append(_x(spec, runs, i))
            ys.append(point / scale)
            lo.append((a if math.isfinite(a) else point) / scale)
            hi.append((b if math.isfinite(b) else point) / scale)
            band = f" [{a / scale:.3f}, {b / scale:.3f}]" if math.isfinite(a) else ""
            meta = " ".join(f"{k2}={v}" for k2, v in runs[i].meta.items())
            text.append(f"{_t(runs[i].name)}<br>{_when(runs[i])}<br>{_t(meta)}<br>{point / scale:.3f}{unit}{band}")
        if not have:
            continue
        fig.add_trace(go.Scatter(x=xs, y=hi, mode="lines", line={"width": 0}, hoverinfo="skip", showlegend=False,
                                 legendgroup=str(k)))
        fig.add_trace(go.Scatter(x=xs, y=lo, mode="lines", line={"width": 0}, fill="tonexty", hoverinfo="skip",
                                 fillcolor=_alpha(color, 0.18), name=f"{name} {spec.confidence:.0%} band",
                                 legendgroup=str(k), showlegend=False))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, line={"color": color},
                                 text=text, hovertemplate="%{text}<extra></extra>", legendgroup=str(k)))
        marks: dict[str, tuple[list, list, list]] = {v: ([], [], []) for v in MARK}
        for j in range(1, len(have)):
            i, ref = have[j], have[j - 1] if spec.baseline == "previous" else have[0]
            ch = cmp.change(samples[ref], samples[i], m, panel.threshold, spec.resamples, seed, spec.confidence)
            if ch.verdict in marks:
                mx, my, mt = marks[ch.verdict]
                mx.append(xs[j])
                my.append(ys[j])
                desc = cmp.describe(ch)
                mt.append(f"{_t(runs[i].name)}: {ch.verdict} vs {_t(runs[ref].name)}<br>{_t(desc)}")
                if ch.verdict == cmp.REGRESSED:
                    found.append(f"{runs[i].name} vs {runs[ref].name}: {desc}")
        for verdict, (mx, my, mt) in marks.items():
            if mx:
                c, symbol, word = MARK[verdict]
                fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", name=f"{name}: {word}",
                                         marker={"color": c, "symbol": symbol, "size": 13, "line": {"width": 2}},
                                         text=mt, hovertemplate="%{text}<extra></extra>", legendgroup=str(k)))
    unit = _scale(metrics[0])[1].strip() if metrics else ""
    layout: dict[str, Any] = {
        "title": {"text": _t(panel.title)}, "height": 380, "margin": {"l": 60, "r": 20, "t": 50, "b": 80},
        "yaxis": {"title": {"text": unit}, "rangemode": "tozero"}, "hovermode": "closest",
        "legend": {"orientation": "h", "y": -0.3}, "plot_bgcolor": "#fafafa",
    }
    if spec.x == "index":
        layout["xaxis"] = {"tickmode": "array", "tickvals": list(range(len(runs))), "ticktext": ticks, "title": {"text": "run"},
                           "range": [-0.5, max(len(runs), 1) - 0.5], "zeroline": False}
    else:
        layout["xaxis"] = {"title": {"text": "run time (UTC)"}}
    if not fig.data:
        layout["annotations"] = [{"text": "no data for this metric in these runs", "showarrow": False,
                                  "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]
    fig.update_layout(**layout)
    out = fig.to_plotly_json()
    out["layout"].pop("template", None)  # plotly.js defaults; the template would repeat ~40 kB per panel
    return out, found


def _alpha(hex_color: str, a: float) -> str:
    h = hex_color.lstrip("#")
    return f"rgba({int(h[0:2], 16)}, {int(h[2:4], 16)}, {int(h[4:6], 16)}, {a})"


# ---- page --------------------------------------------------------------------------------------
def build_dashboard(runs: list, spec: Spec, seed: int = 0, filters: str = "",
                    progress: Callable[[str], None] | None = None) -> str:
    """The whole page. ``runs``: RunData in time order; ``filters``: a description for the header."""
    from profkit.history import samples_of

    say = progress or (lambda msg: None)
    samples = [samples_of(r) for r in runs]
    figures, regressions = [], []
    for n, panel in enumerate(spec.panels, 1):
        say(f"panel {n}/{len(spec.panels)}: {panel.title}")
        fig, found = panel_figure(panel, spec, runs, samples, seed)
        figures.append(fig)
        regressions += found
    return render_page(spec, runs, figures, regressions, filters)


def _json_for_script(obj: Any) -> str:
    """JSON safe inside <script>: no '<', '>', '&' or line separators survive as such."""
    from plotly.utils import PlotlyJSONEncoder

    text = json.dumps(obj, cls=PlotlyJSONEncoder, separators=(",", ":"))
    for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(a, b)
    return text


def render_page(spec: Spec, runs: list, figures: list[dict], regressions: list[str], filters: str = "") -> str:
    from plotly.offline import get_plotlyjs

    rows = []
    for i, r in enumerate(runs):
        meta = ", ".join(f"{k}={v}" for k, v in r.meta.items())
        rows.append(f"<tr><td>{i}</td><td>{_t('#' + str(r.run_id) if r.run_id is not None else '')}</td><td>{_t(r.label)}</td>"
                    f"<td>{_t(_when(r))}</td><td>{r.n_ranks}</td><td>{len(r.steps)}</td><td>{_t(meta)}</td></tr>")
    regs = "".join(f"<li>{_t(s)}</li>" for s in regressions) or "<li>none</li>"
    panels = "\n".join(f'<section class="panel"><div id="panel-{i}" class="plot" data-title="{_t(p.title)}"></div></section>'
                       for i, p in enumerate(spec.panels))
    base = "the previous run" if spec.baseline == "previous" else "the first run"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:">
<title>{_t(spec.title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }} td, th {{ border: 1px solid #ddd; padding: 2px 8px; text-align: left; }}
.panel {{ margin: 1em 0; }} .note {{ color: #555; font-size: 0.9em; }}
</style></head><body>
<h1>{_t(spec.title)}</h1>
<p class="note">{len(runs)} run(s){_t(filters)}. Lines: each run's metric; bands: its {spec.confidence:.0%} bootstrap interval over its own steps;
red x: regressed beyond the panel's threshold against {base} (the interval of the change lies beyond it), green triangle: improved.</p>
<h2>Regressions</h2><ul id="regressions">{regs}</ul>
{panels}
<h2>Runs</h2>
<table id="runs"><tr><th>x</th><th>id</th><th>label</th><th>time (UTC)</th><th>ranks</th><th>step samples</th><th>meta</th></tr>
{''.join(rows)}</table>
<script>{get_plotlyjs()}</script>
<script type="application/json" id="figures">{_json_for_script(figures)}</script>
<script>
(function () {{
  var figs = JSON.parse(document.getElementById("figures").textContent);
  figs.forEach(function (f, i) {{
    Plotly.newPlot("panel-" + i, f.data, f.layout, {{displaylogo: false, responsive: true}});
  }});
}})();
</script>
</body></html>
"""
