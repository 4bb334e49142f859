"""``OUT/report.html``: the analysis as one self-contained page a serving engineer reads in a minute.

The verdict comes first (serving vs GPU-only step time, the top cause, the stragglers), then the
evidence: per-rank step time vs GPU busy time, causes by impact, lateness per rank and step,
balance, clock alignment quality, and for every finding the (rank, step, time) to open in the
merged Perfetto trace. Sections whose analyzer did not run say "not computed".

    from profkit.report.html import write_report
    write_report(analysis, "out/")   # -> out/report.html
"""
from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from profkit.report import html_data as data
from profkit.report import html_figures as figs
from profkit.report.html_data import ms, pct
from profkit.report.html_page import Figures, card, esc, missing, page, section, table

REPORT_NAME = "report.html"

SECTIONS = (
    ("impact", "Impact: what each cause costs the step"),
    ("steps", "Step time vs GPU-only time"),
    ("causes", "Causes by impact"),
    ("stragglers", "Stragglers"),
    ("lateness", "Lateness per rank and step"),
    ("balance", "Balance"),
    ("alignment", "Clock alignment"),
    ("findings", "Where to look in the trace"),
    ("inputs", "Inputs and warnings"),
)


def write_report(analysis, out_dir: str | Path) -> Path:
    """Write ``report.html`` into ``out_dir`` (created if needed) and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_NAME
    path.write_text(render_report(analysis), encoding="utf-8")
    return path


def render_report(analysis) -> str:
    figures = Figures()
    head = data.headline(analysis)
    parts = [_verdict(analysis, head), _nav()]
    for anchor, title in SECTIONS:
        build = _BUILDERS[anchor]
        parts.append(build(analysis, figures, anchor, title))
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    marker = f" (marker {esc(analysis.step_marker)})" if analysis.step_marker else ""
    meta = (
        f"{head.n_ranks} rank(s) · {head.n_steps:,} rank-steps{marker} · "
        f"{analysis.capture.event_count:,} events · profkit {esc(analysis.version)} · generated {generated}"
    )
    return page("profkit report", meta, "".join(parts), figures.count > 0)


# ---- verdict -------------------------------------------------------------------------------
def _straggler_phrase(ranks: list[int] | None) -> str:
    if ranks is None:
        return "stragglers not computed"
    if not ranks:
        return "<b>no straggler</b>"
    return ("straggler: " if len(ranks) == 1 else "stragglers: ") + f"<b>{esc(data.ranks_text(ranks))}</b>"


def _straggler_card(ranks: list[int] | None) -> str:
    if ranks is None:
        return '<span class="na">not computed</span>'
    return esc(data.ranks_text(ranks)) if ranks else "none"


def verdict_sentence(analysis, head: data.Headline) -> str:
    """One sentence (HTML, names escaped): serving vs GPU-only time, top cause, stragglers."""
    if head.n_steps:
        first = (
            f"Serving steps take <b>{ms(head.step_ns_p50)}</b> (median) against <b>{ms(head.gpu_busy_ns_p50)}</b> "
            f"of GPU-only time: the GPU sits idle <b>{pct(head.idle_share)}</b> of step time"
        )
    else:
        r = analysis.ranks
        window = float(r["window_ns"].sum()) if len(r) and "window_ns" in r else 0.0
        busy = float(r["gpu_busy_ns"].sum()) if len(r) and "gpu_busy_ns" in r else 0.0
        share = 1 - busy / window if window else float("nan")
        first = (
            "No serving steps were found (no step markers; try --step-pattern), so there is no step time; "
            f"over the traced window the GPU sits idle <b>{pct(share)}</b> of the time"
        )
    cause = head.top_cause
    if cause is not None:
        per_step = f"{ms(cause.get('per_step_ns'))} per step, {pct(cause.get('step_share'))} of step time"
        second = f"; the top cause is <b>{esc(cause['cause'])}</b> ({per_step})"
    else:
        second = "; no GPU-idle time was attributed to a cause"
    return f"{first}{second}; {_straggler_phrase(head.straggler_ranks)}."


def impact_sentence(analysis) -> str:
    """The report's first line (HTML, names escaped): what removing the cause with the largest
    impact would save, from the what-if replay; empty when no impact was computed."""
    from profkit.analyze import impact as imp_mod

    imp = getattr(analysis, "impact", None)
    if imp is None or not len(imp.table):
        return ""
    top = imp_mod.lead_row(imp.table)
    gpu = imp_mod.bound_row(imp.table, imp_mod.GPU_ONLY)
    if top is None:
        text = "No single cause moves the mean serving step in the what-if replay"
    else:
        ci = ""
        if pd.notna(top.get("impact_lo_ns")) and pd.notna(top.get("impact_hi_ns")):
            ci = f" (95% interval {ms(top['impact_lo_ns'])} to {ms(top['impact_hi_ns'])})"
        share = top.get("impact_share")
        gap = (f": {pct(share)} of the {ms(imp.gap_ns)} gap between the mean step and its GPU-only bound"
               if share is not None and pd.notna(share) and imp.gap_ns > 0 else "")
        text = (f"Removing <b>{esc(imp_mod.who(top))}</b> would cut the mean serving step by "
                f"<b>{ms(top['impact_ns_per_step'])}</b>{ci}{gap}")
    if gpu is not None:
        text += f"; with no host overhead at all the step would take {ms(gpu['replayed_step_ns'])}"
    return f'<p class="impact-verdict">{text}.</p>'


def _verdict(analysis, head: data.Headline) -> str:
    cards = [
        card("median serving step", ms(head.step_ns_p50), f"p90 {ms(head.step_ns_p90)}"),
        card("median GPU busy per step", ms(head.gpu_busy_ns_p50), "GPU-only time"),
        card("median gap per step", ms(head.gap_ns_p50), "step minus GPU busy"),
        card("GPU idle share of step time", pct(head.idle_share)),
        card("ranks", str(head.n_ranks), f"{head.n_steps:,} rank-steps"),
        card("stragglers", _straggler_card(head.straggler_ranks)),
    ]
    cards += _impact_cards(analysis)
    lines = getattr(analysis, "consistency", None) or []
    warn = "".join(f'<p class="consistency"><b>consistency:</b> {esc(line)}</p>' for line in lines)
    return (f'{impact_sentence(analysis)}<p class="verdict">{verdict_sentence(analysis, head)}</p>{warn}'
            f'<div class="cards">{"".join(cards)}</div>\n')



def _impact_cards(analysis) -> list[str]:
    from profkit.analyze import impact as imp_mod

    imp = getattr(analysis, "impact", None)
    if imp is None or not len(imp.table):
        return []
    out = []
    top = imp_mod.lead_row(imp.table)
    if top is not None:
        out.append(card("largest impact", ms(top["impact_ns_per_step"]), esc(imp_mod.who(top))))
    for name, title in ((imp_mod.MEDIAN_RANK, "straggler-free step"), (imp_mod.GPU_ONLY, "GPU-only bound step")):
        b = imp_mod.bound_row(imp.table, name)
        if b is not None and b.get("removed_ns", 1) != 0:  # nothing to remove (one rank): no card
            out.append(card(title, ms(b["replayed_step_ns"]), f"-{ms(b['impact_ns_per_step'])} per step"))
    return out


def _nav() -> str:
    return "<nav>" + "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in SECTIONS) + "</nav>\n"


# ---- sections ------------------------------------------------------------------------------
def _impact_section(analysis, figures: Figures, anchor: str, title: str) -> str:
    from profkit.analyze import impact as imp_mod

    imp = getattr(analysis, "impact", None)
    if imp is None:
        return section(anchor, title, missing("Not computed: this analysis has no impact table."))
    t = imp.table
    if not len(t):
        why = esc(imp.notes[0]) if imp.notes else "nothing to replay"
        return section(anchor, title, missing(f"No impact: {why}."))
    shown = t[t["kind"] != imp_mod.BOUND].head(data.MAX_PARETO_CAUSES)
    body = ""
    if len(shown):
        body += figures.embed(figs.impact_bars(shown, int(t["ranks"].max())),
                              "Bars: how much the mean serving step would drop without the cause (what-if replay "
                              "through the sync points), whiskers its 95% interval over steps; grey: the GPU-idle "
                              "time causes.csv charges to it per rank and step (its per_step_ns).")
    rows = []
    n_ranks = int(t["ranks"].max()) if len(t) else 1
    for x in t.to_dict("records"):
        ci = (f"{ms(x['impact_lo_ns'])} to {ms(x['impact_hi_ns'])}"
              if pd.notna(x.get("impact_lo_ns")) and pd.notna(x.get("impact_hi_ns")) else "-")
        charged = x.get("charged_ns")
        per_step = float(charged) / (x["n_steps"] * max(n_ranks, 1)) if pd.notna(charged) and x.get("n_steps") else None
        rows.append([esc(imp_mod.who(x)), esc(x["kind"]), ms(x["impact_ns_per_step"]), ci, ms(x["impact_p90_ns"]),
                     pct(x["impact_share"]), ms(per_step), ms(x["replayed_step_ns"])])
    body += table(["without", "kind", "mean step drop", "95% interval", "p90 drop", "of the gap to GPU-only",
                   "charged per rank-step", "step would take"], rows,
                  [False, False, True, True, True, True, True, True])
    notes = [f"Mean serving step {ms(imp.base_mean_ns)}; gap to the GPU-only bound {ms(imp.gap_ns)}; "
             f"{imp.n_points:,} replay points; baseline model residual {ms(imp.model_residual_ns)}."]
    notes += [esc(n) for n in imp.notes]
    body += "".join(f'<p class="caption">{n}</p>' for n in notes)
    lead = ("What removing each cause would save, found by replaying every rank's timeline through its sync points "
            "with that cause removed (the last arriver sets when a collective completes; waits are never removed, "
            "they follow). Unlike the charged time below, a pause on one rank counts once, and host work hidden "
            "behind the GPU or behind another rank's lateness counts nothing.")
    return section(anchor, title, body, lead)


def _steps_section(analysis, figures: Figures, anchor: str, title: str) -> str:
    steps = analysis.steps
    if not len(steps):
        return section(anchor, title, missing("No serving steps found: no per-step times to compare."))
    body = figures.embed(
        figs.rank_distribution(data.rank_quantiles(steps, "step_ns"), data.rank_quantiles(steps, "gpu_busy_ns")),
        "Per rank, over its steps: box = quartiles, line = median, dashed = mean, whiskers = min and max "
        "(computed from every step; drawn from those six numbers).",
    )
    body += "<h3>Where a step's time goes (mean per step)</h3>"
    body += figures.embed(figs.rank_breakdown(data.rank_breakdown(steps)),
                          "GPU busy + gap = mean serving step time of the rank.")
    body += _rank_table(analysis)
    lead = ("A serving step far above its GPU-busy time means the host (scheduling, input preparation, "
            "synchronization, waiting for other ranks) sets the pace, not the GPU.")
    return section(anchor, title, body, lead)


def _rank_table(analysis) -> str:
    r = analysis.ranks
    cols = ("n_steps", "step_ns_p50", "step_ns_p90", "gpu_busy_ns_p50", "gap_ns_p50", "step_gpu_idle_share")
    if not len(r) or not all(c in r.columns for c in cols):
        return ""
    rows = [
        [esc(int(x["rank"])), esc(int(x["n_steps"])), ms(x["step_ns_p50"]), ms(x["step_ns_p90"]),
         ms(x["gpu_busy_ns_p50"]), ms(x["gap_ns_p50"]), pct(x["step_gpu_idle_share"])]
        for x in r.sort_values("rank").to_dict("records")
    ]
    t = table(["rank", "steps", "step p50", "step p90", "GPU busy p50", "gap p50", "idle share"], rows,
              [True] * 7)
    return f"<details><summary>Per-rank numbers ({len(rows)} ranks)</summary>{t}</details>"


def _causes_section(analysis, figures: Figures, anchor: str, title: str) -> str:
    causes = data.sorted_causes(analysis)
    if not len(causes):
        return section(anchor, title, missing("No GPU-idle time was attributed (no causes table)."))
    p = data.pareto(causes)
    body = figures.embed(
        figs.pareto(p),
        f"Top {min(len(causes), data.MAX_PARETO_CAUSES)} of {len(causes)} causes"
        + (", the rest summed as 'other'" if len(causes) > data.MAX_PARETO_CAUSES else "")
        + ". Bars: average ms per rank and step; line: cumulative share of all GPU-idle time attributed.",
    )
    rows = []
    for x in causes.head(data.MAX_PARETO_CAUSES).to_dict("records"):
        rows.append([esc(x["cause"]), ms(x["per_step_ns"]), pct(x["step_share"]), ms(x["total_ns"]),
                     esc(x.get("ranks", "")), esc(x.get("category", ""))])
    body += table(["cause", "per step", "of step time", "total (all ranks)", "ranks", "kind"], rows,
                  [False, True, True, True, True, False])
    lead = ("Every GPU-idle interval inside a step is charged to what held the critical path on the host; "
            "causes ranked by total time over all ranks and steps. 'waiting for rank k' is a victim's wait: "
            "look at rank k.")
    return section(anchor, title, body, lead)


def _stragglers_section(analysis, figures: Figures, anchor: str, title: str) -> str:
    t = data.straggler_table(analysis)
    if t is None:
        return section(anchor, title, missing(
            "Not computed: this analysis has no straggler table (the straggler analyzer did not run)."))
    head = data.headline(analysis)
    body = f"<p>{_straggler_phrase(head.straggler_ranks).capitalize()}.</p>"
    fig = figs.stragglers(t)
    if fig is not None:
        body += figures.embed(fig, "Lateness at sync points (against the median of the other participants) "
                                   "and the total wait the rank caused the others.")
    cols = [c for c in ("rank", "times_last", "late_ns_p50", "late_ns_p99", "caused_wait_ns", "score", "top_cause")
            if c in t.columns]
    headers = {"rank": "rank", "times_last": "times last", "late_ns_p50": "late p50", "late_ns_p99": "late p99",
               "caused_wait_ns": "wait caused", "score": "score", "top_cause": "why late (top cause)"}
    rows = [[_cell(c, x[c]) for c in cols] for x in t.head(20).to_dict("records")]
    body += table([headers[c] for c in cols], rows, [c != "top_cause" for c in cols])
    if len(t) > 20:
        body += f'<p class="caption">Top 20 of {len(t)} ranks by score.</p>'
    return section(anchor, title, body, "Ranks ordered by straggler score (highest first).")


def _cell(column: str, value: object) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if column.endswith("_ns") or "_ns_" in column:
        return ms(value)
    if isinstance(value, float):
        return f"{value:.3g}"
    return esc(value)


def _lateness_section(analysis, figures: Figures, anchor: str, title: str) -> str:
    m = data.lateness_matrix(analysis)
    if m is None:
        return section(anchor, title, missing("No steps and no lateness table: nothing to map."))
    caption = esc(m.title) + (". " + esc(m.note) if m.note else ".")
    lead = ("Lateness of each rank at each step's sync points: a row lit across many steps is a straggler; "
            "a column lit on every rank is a slow step for all.")
    return section(anchor, title, figures.embed(figs.heatmap(m), caption), lead)


def _balance_section(analysis, figures: Figures, anchor: str, title: str) -> str:
    body = "<h3>EP balancedness (mean / max expert-rank load; 1.0 = balanced)</h3>"
    frames = data.balance_frames(analysis)
    if getattr(analysis, "balance", None) is None:
        body += missing("Not computed: this analysis has no balance table (expert loads unknown).")
    elif not frames:
        body += missing("The balance analyzer found no expert loads or token counts in this capture.")
    for name, frame in frames:
        series = data.balance_series(frame)
        vs_uniform = data.balance_vs_uniform(frame)
        if vs_uniform is not None:
            per_step, summary = vs_uniform
            body += f"<p>{esc(summary)}</p>"
            body += figures.embed(figs.balance_vs_uniform(per_step),
                                  f"{esc(name)}: real balancedness per step (mean over layers) against the same "
                                  "batches routed uniformly at random (mean and 95% band of seeded draws). Real minus "
                                  "uniform is the most that expert balancing (EPLB) can recover.")
        elif series is not None:
            metric, per_step = series
            body += figures.embed(figs.step_line(per_step, metric, metric, reference=1.0),
                                  f"{esc(name)}: {esc(metric)} per step (mean over layers where per layer).")
        else:
            body += f"<p>{esc(name)}</p>" + _frame_table(frame)
    body += "<h3>DP imbalance (max / mean tokens per rank; 1.0 = balanced)</h3>"
    dp = data.dp_imbalance(analysis.steps) if len(analysis.steps) else None
    if dp is None:
        body += missing("Not known: the step table has no token counts (num_tokens) on two or more ranks "
                        "(the step markers of this capture carry none).")
    else:
        body += (f"<p>Median imbalance {dp['imbalance'].median():.3f}, worst {dp['imbalance'].max():.3f} "
                 f"(step {int(dp.loc[dp['imbalance'].idxmax(), 'step'])}).</p>")
        body += figures.embed(figs.step_line(dp, "imbalance", "max / mean tokens", reference=1.0),
                              "From num_tokens of each rank's step marker.")
    return section(anchor, title, body)


def _frame_table(frame: pd.DataFrame, limit: int = 20) -> str:
    cols = list(frame.columns)[:10]
    rows = [[_cell(str(c), x[c]) for c in cols] for x in frame.head(limit).to_dict("records")]
    return table([esc(c) for c in cols], rows)


def _alignment_section(analysis, figures: Figures, anchor: str, title: str) -> str:
    t = data.alignment_table(analysis)
    if t is None:
        return section(anchor, title, missing("Not computed: no alignment (no events to align)."))
    body = ""
    if "residual_ns" in t.columns and t["residual_ns"].notna().any():
        worst = t.loc[t["residual_ns"].astype("float64").idxmax()]
        body += f"<p>Worst residual {_us(worst['residual_ns'])} (rank {esc(int(worst['rank']))})"
        if "error_bound_ns" in t.columns and t["error_bound_ns"].notna().any():
            body += f", largest error bound {_us(t['error_bound_ns'].max())}"
        step_p50 = analysis.steps["step_ns"].median() if len(analysis.steps) else None
        body += f"; median step {ms(step_p50)}.</p>" if step_p50 is not None else ".</p>"
        body += figures.embed(figs.alignment(t), "Bar: median distance of the rank's aligned collective ends "
                                                 "from the other participants'; whisker: error bound of its clock fit.")
    rows = []
    for x in t.to_dict("records"):
        rows.append([esc(int(x["rank"])), esc(x.get("method", "")), _us(x.get("offset_ns")),
                     f"{float(x.get('drift_ppm', float('nan'))):.3f}", _us(x.get("residual_ns")),
                     _us(x.get("error_bound_ns")), esc(x.get("n_points", ""))])
    body += "<details><summary>Per-rank clocks</summary>" + table(
        ["rank", "method", "offset", "drift ppm", "residual", "error bound", "points"], rows,
        [True, False, True, True, True, True, True]) + "</details>"
    warnings = list(getattr(analysis.alignment, "warnings", []) or [])
    if warnings:
        body += "<ul>" + "".join(f'<li class="warn">{esc(w)}</li>' for w in warnings[:20]) + "</ul>"
    lead = ("All ranks were moved onto one clock before any cross-rank comparison; residuals far below a step "
            "time mean lateness and waits on this page are real, not clock error.")
    return section(anchor, title, body, lead)


def _us(ns: object) -> str:
    if ns is None or ns is pd.NA or (isinstance(ns, float) and pd.isna(ns)):
        return "-"
    return f"{float(ns) / 1e3:.1f} µs"


def _findings_section(analysis, figures: Figures, anchor: str, title: str) -> str:
    ex = data.examples(analysis)
    body = ""
    worst = data.worst_late_steps(analysis, list(getattr(analysis, "straggler_ranks", None) or []))
    if worst:
        rows = [[esc(w["rank"]), esc(w["step"]), ms(w["late_ns"]), f'<code class="cmd">{esc(w["window"])}</code>']
                for w in worst]
        body += "<h3>Stragglers at their latest step</h3>" + table(
            ["rank", "step", "late by", "window"], rows, [True, True, True, False])
    if len(ex):
        rows = []
        for x in ex.to_dict("records"):
            at = "-" if x["into_step_ns"] is None else f"{ms(x['into_step_ns'])} into the step"
            rows.append([esc(x["cause"]), ms(x["per_step_ns"]), esc(x["rank"]), esc(x["step"] if x["step"] >= 0 else "-"),
                         at, f"<code>{esc(x['start_ns'])}</code>", ms(x["dur_ns"]),
                         f'<code class="cmd">{esc(x["window"]) or "(whole trace)"}</code>'])
        body += "<h3>One example of each cause</h3>" + table(
            ["cause", "per step", "rank", "step", "at", "t (ns, aligned)", "lasts", "window"], rows,
            [False, True, True, True, True, True, True, False])
    if not body:
        return section(anchor, title, missing("No findings with trace locations."))
    command = data.merge_command(data.trace_paths(analysis))
    lead = (f'Merge the window: <code class="cmd">{esc(command)} --steps S:S</code>, open merged.pftrace at '
            "ui.perfetto.dev (Open trace file), then go to the rank's process and the step on its steps track. "
            "t is the example's start on the aligned clock of the merged trace.")
    return section(anchor, title, body, lead)


def _inputs_section(analysis, figures: Figures, anchor: str, title: str) -> str:
    cap = analysis.capture
    parts = cap.parts
    body = ""
    if len(parts):
        cols = [c for c in ("rank", "source", "path", "n_events") if c in parts.columns]
        rows = [[esc(x[c]) for c in cols] for x in parts.head(50).to_dict("records")]
        body += f"<details><summary>{len(parts)} input(s)</summary>" + table(cols, rows) + (
            f'<p class="caption">First 50 of {len(parts)}.</p>' if len(parts) > 50 else "") + "</details>"
    skipped = list(cap.skipped)
    warnings = list(cap.warnings) + list(getattr(analysis, "warnings", []) or [])
    for label, items in (("skipped input(s)", skipped), ("warning(s)", warnings)):
        if items:
            lis = "".join(f"<li>{esc(s)}</li>" for s in items[:50])
            more = f"<li>... and {len(items) - 50} more (see summary.json)</li>" if len(items) > 50 else ""
            body += f'<h3 class="warn">{len(items)} {label}</h3><ul>{lis}{more}</ul>'
    if not skipped and not warnings:
        body += "<p>Every input was read; no warnings.</p>"
    return section(anchor, title, body)


_BUILDERS: dict[str, Callable[..., str]] = {
    "impact": _impact_section,
    "steps": _steps_section,
    "causes": _causes_section,
    "stragglers": _stragglers_section,
    "lateness": _lateness_section,
    "balance": _balance_section,
    "alignment": _alignment_section,
    "findings": _findings_section,
    "inputs": _inputs_section,
}
