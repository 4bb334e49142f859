"""``.nsys-rep`` -> SQLite through the user's own ``nsys export`` (the report format is private).

The export is cached by (absolute path, size, mtime), so reading a report twice runs nsys once.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from profkit.errors import TraceError

NSYS_ENV = "PROFKIT_NSYS"  # path to an nsys binary, if it is not on PATH
CACHE_ENV = "PROFKIT_CACHE_DIR"
EXPORT_TIMEOUT_S = 1800


def find_nsys() -> str | None:
    explicit = os.environ.get(NSYS_ENV)
    if explicit:
        return explicit if Path(explicit).is_file() and os.access(explicit, os.X_OK) else None
    return shutil.which("nsys")


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    sub = "nsys" if os.environ.get(CACHE_ENV) else "profkit/nsys"
    return Path(root) / sub


def cached_sqlite_path(rep: Path) -> Path:
    st = rep.stat()
    key = f"{rep.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()
    return cache_dir() / f"{rep.stem}-{hashlib.sha256(key).hexdigest()[:16]}.sqlite"


def export_to_sqlite(rep: Path) -> Path:
    """Run ``nsys export --type sqlite`` once per report version; return the SQLite path."""
    if not rep.is_file():
        raise TraceError(rep, "no such file")
    nsys = find_nsys()
    if nsys is None:
        where = f"${NSYS_ENV} ({os.environ[NSYS_ENV]}) is not an executable" if os.environ.get(NSYS_ENV) \
            else f"no nsys on PATH and ${NSYS_ENV} is unset"
        raise TraceError(rep, f"cannot read .nsys-rep directly ({where}); export it first with "
                              f"'nsys export --type sqlite -o {rep.with_suffix('.sqlite').name} {rep.name}' "
                              "and pass the .sqlite file")
    out = cached_sqlite_path(rep)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.stem}.tmp{os.getpid()}.sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(tmp), str(rep)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        tmp.unlink(missing_ok=True)
        raise TraceError(rep, f"running {nsys} export failed: {exc}") from exc
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        lines = [ln for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        last = lines[-1] if lines else "no output"
        raise TraceError(rep, f"nsys export failed (exit {proc.returncode}): {last}")
    os.replace(tmp, out)
    return out
