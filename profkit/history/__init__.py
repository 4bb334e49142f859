"""Regression history: runs of ``profkit analyze`` recorded in an SQLite file (WAL, versioned
schema, concurrent writers wait instead of failing), with the per-step samples that give every
metric a bootstrap interval in ``profkit compare`` and ``profkit dashboard``."""
from __future__ import annotations

from profkit.history.db import HistoryDB, samples_of
from profkit.history.runs import RunData, RunError, is_analysis_dir, read_analysis_dir, run_from_analysis
from profkit.history.schema import LATEST as SCHEMA_VERSION
from profkit.history.schema import SchemaError

__all__ = ["HistoryDB", "RunData", "RunError", "SchemaError", "SCHEMA_VERSION", "is_analysis_dir",
           "read_analysis_dir", "resolve_run", "run_from_analysis", "samples_of"]


def resolve_run(ref: str, db: "HistoryDB | None" = None) -> RunData:
    """An analysis folder, or ``#ID`` / a label in the history database (the latest with that label)."""
    from pathlib import Path

    if Path(ref).is_dir():
        return read_analysis_dir(ref)
    if db is None:
        raise RunError(f"{ref}: no such analysis folder (give --db to look it up as a label in the history)")
    run_id = db.find(ref)
    if run_id is None:
        raise RunError(f"{ref}: neither an analysis folder nor a run in {db.path} (labels: see `profkit history list`)")
    return db.load(run_id)
