"""Readable terminal summary of an analysis (plain text, fits 100 columns)."""
from __future__ import annotations

import math

import pandas as pd


def _ms(ns) -> str:
    if ns is None or (isinstance(ns, float) and math.isnan(ns)) or ns is pd.NA:
        return "-"
    return f"{float(ns) / 1e6:.3f}"


def _pct(x) -> str:
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * float(x):.1f}%"


def render_summary(analysis) -> str:
    cap = analysis.capture
    lines: list[str] = []
    n_ranks = len(analysis.ranks)
    lines.append(f"profkit {analysis.version}: {n_ranks} rank(s), {cap.event_count:,} events")
    impact = getattr(analysis, "impact", None)
    if impact is not None:  # the verdict leads with what removing the largest cause would save
        from profkit.analyze.impact import verdict_lines

        lines.extend(verdict_lines(impact))
    steps = analysis.steps
    if len(steps):
        total_step = steps["step_ns"].sum()
        total_gap = steps["gap_ns"].sum()
        lines.append(
            f"steps found by marker '{analysis.step_marker}': {len(steps)} in all; "
            f"median step {_ms(steps['step_ns'].median())} ms vs median GPU busy "
            f"{_ms(steps['gpu_busy_ns'].median())} ms; the GPU sat idle for "
            f"{_pct(total_gap / total_step if total_step else float('nan'))} of step time"
        )
    else:
        lines.append("no serving steps found (no step markers; try --step-pattern REGEX); whole-trace GPU timeline only")
    per_rank = getattr(analysis, "stragglers", None)
    if per_rank is not None and len(per_rank):
        lines.append(straggler_line(per_rank, getattr(analysis, "straggler_ranks", None) or []))
    episodes = getattr(analysis, "straggler_episodes", None)
    if isinstance(episodes, pd.DataFrame) and len(episodes):
        lines.append(episode_line(episodes))
    for line in getattr(analysis, "consistency", None) or []:  # the verdict and the causes disagree
        lines.append(f"consistency: {line}")
    causes = getattr(analysis, "causes", None)
    if causes is not None and len(causes):
        lines.append("top causes of GPU-idle step time (all ranks and steps):")
        for row in causes.head(5).to_dict("records"):
            lines.append(
                f"  {_ms(row['total_ns']):>10} ms  {_pct(row['step_share']):>6} of step time  "
                f"{row['cause'][:60]}  (e.g. rank {row['example_rank']}, step {row['example_step']})"
            )
    lines.append("")
    header = (
        f"{'rank':>4} {'steps':>6} {'step p50 ms':>12} {'GPU busy p50':>13} {'gap p50 ms':>11} "
        f"{'idle share':>10} | {'window ms':>10} {'busy ms':>10} {'idle ms':>10}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for row in analysis.ranks.to_dict("records"):
        lines.append(
            f"{int(row['rank']):>4} {int(row['n_steps']):>6} {_ms(row['step_ns_p50']):>12} "
            f"{_ms(row['gpu_busy_ns_p50']):>13} {_ms(row['gap_ns_p50']):>11} {_pct(row['step_gpu_idle_share']):>10} | "
            f"{_ms(row['window_ns']):>10} {_ms(row['gpu_busy_ns']):>10} {_ms(row['gpu_idle_ns']):>10}"
        )
    if cap.skipped:
        lines.append("")
        lines.append(f"skipped {len(cap.skipped)} input(s):")
        lines.extend(f"  {s}" for s in cap.skipped)
    warnings = list(cap.warnings) + list(getattr(analysis, "warnings", []))
    if warnings:
        lines.append("")
        lines.append(f"{len(warnings)} warning(s):")
        lines.extend(f"  {w}" for w in warnings[:20])
        if len(warnings) > 20:
            lines.append(f"  ... and {len(warnings) - 20} more (see summary.json)")
    return "\n".join(lines)


def straggler_line(per_rank: pd.DataFrame, ranks: list[int]) -> str:
    """``stragglers: rank 1 (EngineCore.step +76.6 ms, Scheduler.schedule +37.7 ms; score 0.72)``."""
    if not ranks:
        return "stragglers: none (no rank makes the others wait beyond the noise)"
    parts = []
    for rank in ranks:
        row = per_rank[per_rank["rank"] == rank].iloc[0]
        why = [f"{row['top_cause']} +{_ms(row.get('top_cause_ns'))} ms"] if isinstance(row["top_cause"], str) else []
        if isinstance(row.get("second_cause"), str):
            why.append(f"{row['second_cause']} +{_ms(row.get('second_cause_ns'))} ms")
        parts.append(f"rank {rank} ({', '.join(why)}; score {float(row['score']):.2f})")
    return "stragglers: " + "; ".join(parts)


def episode_line(episodes: pd.DataFrame, max_ranks: int = 4) -> str:
    """``episodes: rank 2 late at steps 14, 18 (Scheduler.schedule +15.1 ms per step)``: per rank
    with episodes (``analyze.straggler_episodes``; most caused wait first) its steps and main
    cause with the median excess over the cause's baseline per episode."""
    from profkit.analyze.straggler_episodes import episode_ranks

    per = episode_ranks(episodes)
    if not len(per):
        return "episodes: none"
    parts = []
    for row in per.head(max_ranks).itertuples():
        mine = episodes[episodes["rank"] == row.rank]
        excess = mine.loc[mine["cause"] == row.cause, "cause_excess_ns"].median()
        others = sorted(set(mine["cause"]) - {row.cause})
        also = f"; also {', '.join(others)}" if others else ""
        steps = ", ".join(str(s) for s in row.steps)
        parts.append(f"rank {row.rank} late at step{'s' if len(row.steps) > 1 else ''} {steps} "
                     f"({row.cause} +{float(excess) / 1e6:.1f} ms per step{also})")
    more = f"; and {len(per) - max_ranks} more rank(s)" if len(per) > max_ranks else ""
    return "episodes: " + "; ".join(parts) + more
