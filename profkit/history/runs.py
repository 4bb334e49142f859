"""One run as the history and ``profkit compare`` see it: headline tables plus per-step samples.

Read from an analysis folder (what ``profkit analyze -o OUT`` writes) or from the database. Only
``summary.json`` and ``steps.csv`` are required; ``causes.csv``, ``cause_steps.csv`` (charged
time per rank, step and cause: what makes a cause's bootstrap interval possible),
``stragglers.csv``, ``lateness.csv`` and ``balance.csv`` are used when present.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

STEP_SAMPLE_COLUMNS = ["rank", "step", "step_ns", "gpu_busy_ns", "gap_ns"]
CAUSE_SAMPLE_COLUMNS = ["rank", "step", "cause", "ns"]
CAUSE_COLUMNS = ["cause", "total_ns", "per_step_ns", "step_share", "ranks", "category"]
STRAGGLER_COLUMNS = ["rank", "times_last", "late_ns_p50", "late_ns_p99", "caused_wait_ns", "score", "top_cause"]
LATENESS_COLUMNS = ["rank", "step", "late_ns"]
BALANCE_COLUMNS = ["step", "layer", "balancedness"]

# column names accepted for a per-step lateness value in lateness.csv, most specific first
_LATE_VALUE_COLUMNS = ("late_ns", "late_ns_max", "late_ns_sum", "late_ns_p50")


class RunError(Exception):
    """An analysis folder or stored run cannot be used. ``str()`` names it and says what is wrong."""


@dataclass
class RunData:
    label: str
    source: str
    summary: dict
    steps: pd.DataFrame  # STEP_SAMPLE_COLUMNS, int64
    causes: pd.DataFrame  # CAUSE_COLUMNS
    cause_steps: pd.DataFrame | None = None  # CAUSE_SAMPLE_COLUMNS, non-zero rows only
    stragglers: pd.DataFrame | None = None  # STRAGGLER_COLUMNS
    lateness: pd.DataFrame | None = None  # LATENESS_COLUMNS
    balance: pd.DataFrame | None = None  # BALANCE_COLUMNS
    meta: dict[str, str] = field(default_factory=dict)
    run_id: int | None = None
    created_ns: int | None = None
    notes: list[str] = field(default_factory=list)  # what was missing or skipped, for the user

    @property
    def n_ranks(self) -> int:
        return int(self.steps["rank"].nunique()) if len(self.steps) else int(self.summary.get("n_ranks") or 0)

    @property
    def name(self) -> str:
        """How a run is named in tables: its label, with the id when it came from the database."""
        return f"{self.label} (#{self.run_id})" if self.run_id is not None else self.label


def is_analysis_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "summary.json").is_file() and (p / "steps.csv").is_file()


def read_analysis_dir(path: str | Path, label: str | None = None) -> RunData:
    """Load an ``profkit analyze -o OUT`` folder; ``RunError`` names the file when it is unusable."""
    out = Path(path)
    if not out.is_dir():
        raise RunError(f"{out}: not a folder")
    if not (out / "summary.json").is_file() or not (out / "steps.csv").is_file():
        hint = " (a trace folder? run `profkit analyze PATH -o OUT` first)" if any(out.iterdir()) else ""
        raise RunError(f"{out}: not an analysis folder: summary.json and steps.csv are required{hint}")
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        raise RunError(f"{out / 'summary.json'}: unreadable: {exc}") from exc
    notes: list[str] = []
    steps = _read_csv(out / "steps.csv", STEP_SAMPLE_COLUMNS, required=True)
    steps = steps[STEP_SAMPLE_COLUMNS].astype("int64")
    causes = _read_csv(out / "causes.csv", ["cause", "total_ns", "per_step_ns"], required=False)
    if causes is None:
        notes.append("no causes.csv: no cause metrics")
        causes = empty_causes()
    else:
        causes = _complete(causes, CAUSE_COLUMNS)
    cause_steps = _read_csv(out / "cause_steps.csv", CAUSE_SAMPLE_COLUMNS, required=False)
    if cause_steps is not None:
        cause_steps = cause_steps[CAUSE_SAMPLE_COLUMNS].astype({"rank": "int64", "step": "int64", "cause": "object", "ns": "int64"})
        cause_steps = cause_steps[cause_steps["ns"] != 0].reset_index(drop=True)
    elif len(causes):
        notes.append("no cause_steps.csv: cause changes get no confidence interval")
    stragglers = _read_csv(out / "stragglers.csv", ["rank"], required=False)
    if stragglers is not None:
        stragglers = _complete(stragglers, STRAGGLER_COLUMNS)
    return RunData(
        label=label or out.resolve().name,
        source=str(out),
        summary=summary,
        steps=steps,
        causes=causes,
        cause_steps=cause_steps,
        stragglers=stragglers,
        lateness=_read_lateness(out / "lateness.csv", notes),
        balance=_read_balance(out / "balance.csv", notes),
        notes=notes,
    )


def empty_causes() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object" if c in ("cause", "category") else "float64") for c in CAUSE_COLUMNS})


def _read_csv(path: Path, needed: list[str], required: bool) -> pd.DataFrame | None:
    if not path.is_file():
        if required:
            raise RunError(f"{path}: missing")
        return None
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: unreadable CSV: {exc}") from exc
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise RunError(f"{path}: missing column(s) {', '.join(missing)}")
    if required and df[needed].isna().any().any():
        raise RunError(f"{path}: empty values in {', '.join(needed)}")
    return df


def _complete(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    out = df.copy()
    for c in columns:
        if c not in out:
            out[c] = np.nan
    return out[columns].reset_index(drop=True)


def _read_lateness(path: Path, notes: list[str]) -> pd.DataFrame | None:
    df = _read_csv(path, ["rank", "step"], required=False)
    if df is None:
        return None
    value = next((c for c in _LATE_VALUE_COLUMNS if c in df.columns), None)
    if value is None:
        notes.append(f"{path.name}: no late_ns column, lateness ignored")
        return None
    df = df[["rank", "step", value]].dropna().rename(columns={value: "late_ns"})
    df = df.groupby(["rank", "step"], as_index=False)["late_ns"].sum()  # one row per (rank, step)
    return df.astype("int64")[LATENESS_COLUMNS]


def _read_balance(path: Path, notes: list[str]) -> pd.DataFrame | None:
    df = _read_csv(path, ["balancedness"], required=False)
    if df is None:
        return None
    df = df.dropna(subset=["balancedness"]).copy()
    if "step" not in df:
        notes.append(f"{path.name}: no step column, each row taken as one step")
        df["step"] = np.arange(len(df))
    if "layer" not in df:
        df["layer"] = -1
    return df[BALANCE_COLUMNS].astype({"step": "int64", "layer": "int64", "balancedness": "float64"}).reset_index(drop=True)


def run_from_analysis(analysis, label: str, source: str = "") -> RunData:
    """A run straight from an in-memory ``Analysis`` (notebooks, tests): the same tables the
    analysis folder would hold, with per-step cause samples recomputed when the analysis did not
    keep them (``Analysis.cause_steps``)."""
    from profkit.analyze.compare import cause_step_samples
    from profkit.analyze.result import summary_document

    steps = analysis.steps[STEP_SAMPLE_COLUMNS].astype("int64").reset_index(drop=True)
    cause_steps = getattr(analysis, "cause_steps", None)
    if cause_steps is None:
        cause_steps = cause_step_samples(analysis.events, analysis.steps)
    stragglers = getattr(analysis, "stragglers", None)
    lateness = getattr(analysis, "lateness", None)
    if isinstance(lateness, pd.DataFrame) and {"rank", "step"} <= set(lateness.columns):
        value = next((c for c in _LATE_VALUE_COLUMNS if c in lateness.columns), None)
        lateness = (lateness[["rank", "step", value]].dropna().rename(columns={value: "late_ns"})
                    .groupby(["rank", "step"], as_index=False)["late_ns"].sum().astype("int64")) if value else None
    else:
        lateness = None
    return RunData(
        label=label,
        source=source,
        summary=json.loads(json.dumps(summary_document(analysis), default=str)),
        steps=steps,
        causes=_complete(analysis.causes, CAUSE_COLUMNS),
        cause_steps=cause_steps[cause_steps["ns"] != 0].reset_index(drop=True),
        stragglers=_complete(stragglers, STRAGGLER_COLUMNS) if isinstance(stragglers, pd.DataFrame) else None,
        lateness=lateness,
    )
