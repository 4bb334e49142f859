"""Write an analysis to files: ``summary.json`` and ``steps.csv`` (names are a public contract)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from profkit.analyze.result import summary_document

STEPS_CSV_COLUMNS = ["rank", "step", "start_ns", "end_ns", "step_ns", "gpu_busy_ns", "gpu_kernel_ns", "gap_ns"]


def write_outputs(analysis, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(summary_document(analysis), indent=2) + "\n")
    steps_path = out / "steps.csv"
    steps = analysis.steps
    extra = [c for c in steps.columns if c not in STEPS_CSV_COLUMNS]
    steps[STEPS_CSV_COLUMNS + extra].to_csv(steps_path, index=False)
    from profkit.analyze.overhead import CAUSE_COLUMNS

    causes_path = out / "causes.csv"
    causes = analysis.causes
    extra = [c for c in causes.columns if c not in CAUSE_COLUMNS]
    causes[CAUSE_COLUMNS + extra].to_csv(causes_path, index=False)
    from profkit.analyze.compare import cause_step_table

    cause_steps_path = out / "cause_steps.csv"  # per (rank, step, cause): samples for compare's intervals
    cause_steps = getattr(analysis, "cause_steps", None)
    (cause_steps if cause_steps is not None else cause_step_table(analysis.charged)).to_csv(cause_steps_path, index=False)
    written = [summary_path, steps_path, causes_path, cause_steps_path]
    from profkit.analyze.stragglers import STRAGGLER_COLUMNS

    if analysis.stragglers is not None:
        per_rank = analysis.stragglers
        extra = [c for c in per_rank.columns if c not in STRAGGLER_COLUMNS]
        written.append(_csv(per_rank[STRAGGLER_COLUMNS + extra], out / "stragglers.csv"))
        written.append(_csv(analysis.lateness, out / "lateness.csv"))
        written.append(_csv(analysis.straggler_instances, out / "straggler_instances.csv"))
    sync_points = getattr(analysis, "sync_points", None)
    if isinstance(sync_points, pd.DataFrame):  # one row per (sync instance, rank): sync_table.SYNC_COLUMNS
        written.append(_csv(sync_points, out / "sync_points.csv"))
    episodes = getattr(analysis, "straggler_episodes", None)
    if isinstance(episodes, pd.DataFrame):  # one row per episode (straggler_episodes.EPISODE_COLUMNS)
        written.append(_csv(episodes, out / "straggler_episodes.csv"))
    impact = getattr(analysis, "impact", None)
    if impact is not None:  # what removing each cause would save (analyze.impact), and its per-step samples
        from profkit.analyze.impact import IMPACT_COLUMNS

        extra = [c for c in impact.table.columns if c not in IMPACT_COLUMNS]
        written.append(_csv(impact.table[IMPACT_COLUMNS + extra], out / "impact.csv"))
        written.append(_csv(impact.steps, out / "impact_steps.csv"))
    balance = analysis.balance or {}
    if "ep" in balance:
        written.append(_csv(balance["ep"], out / "balance.csv"))
    if "dp" in balance:
        written.append(_csv(balance["dp"], out / "dp_imbalance.csv"))
    from profkit.report.html import write_report

    written.append(write_report(analysis, out))
    return written


def _csv(frame: pd.DataFrame, path: Path) -> Path:
    frame.to_csv(path, index=False)
    return path
