"""After an ``nsys profile`` run: find the report and export it to SQLite (what profkit reads).

The export runs here, once, so ``profkit analyze DIR`` needs no nsys binary later.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from .tools import nsys_export_command

EXPORT_TIMEOUT_S = 900


def find_report(stem: Path) -> Path | None:
    for suffix in (".nsys-rep", ".qdrep"):
        path = stem.with_name(stem.name + suffix)
        if path.is_file():
            return path
    return None


def export_sqlite(nsys: str, stem: Path) -> dict[str, Any]:
    """``{"report", "sqlite", "error"}`` (paths as str; error None when the export worked)."""
    report = find_report(stem)
    if report is None:
        leftovers = sorted(p.name for p in stem.parent.glob(stem.name + "*"))
        why = f"only {', '.join(leftovers)}" if leftovers else "nothing"
        return {"report": None, "sqlite": None,
                "error": f"nsys wrote no report at {stem}.nsys-rep ({why} in {stem.parent})"}
    sqlite = report.with_suffix(".sqlite")
    try:
        proc = subprocess.run(nsys_export_command(nsys, str(report), str(sqlite)), capture_output=True,
                              text=True, timeout=EXPORT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"report": str(report), "sqlite": None, "error": f"nsys export failed: {exc}"}
    if proc.returncode != 0 or not sqlite.is_file():
        lines = [ln for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        return {"report": str(report), "sqlite": None,
                "error": f"nsys export failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}"}
    return {"report": str(report), "sqlite": str(sqlite), "error": None}
