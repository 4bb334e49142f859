"""A run's own scratch folder: made locked, and removed by a later run once its owner has died.

Why: a driver killed outright (SIGKILL, the OOM killer) removes nothing, and its scratch folder
holds every rank's tables (GBs at DEP256; ``profkit.scale.lifetime`` says how it was found). The
folder holds a lock file, ``flock``-ed for the owner's life. The kernel drops a ``flock`` when the
last process holding it ends, however it ends; forked pool workers share it, so a folder stays
locked while any of them still runs. A new folder sweeps its siblings: one whose lock it can take
has no owner left, and goes.

Only folders this module made (``PREFIX``, the lock file inside) are ever removed, only when the
lock is free and older than ``STALE_AFTER_S`` (a folder is made, then locked: a sweep between
the two must not take it), and never a folder the caller named (``DiskStore(root)``). Where
``flock`` is missing (Windows) or refused (some network file systems), nothing is locked or swept.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

PREFIX = "profkit-scale-"
LOCK_NAME = ".profkit-owner.lock"
STALE_AFTER_S = 60.0


class OwnedFolder:
    """A new folder under the temporary directory, locked until ``release``."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX))
        self._fd: int | None = _lock(self.path / LOCK_NAME)
        sweep_dead(self.path.parent, keep=self.path)

    def release(self) -> None:
        """The folder removed, then the lock let go (in that order: a sweep never races the owner)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _lock(path: Path) -> int | None:
    """``path`` created and ``flock``-ed by this process (not inherited by programs it runs); its
    descriptor, or None where locks are unavailable."""
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def sweep_dead(parent: Path, keep: Path | None = None, stale_after_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the folders under ``parent`` whose owner has died (module docstring); the list removed."""
    if fcntl is None:
        return []
    removed = []
    now = time.time()
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(PREFIX) and p != keep]
    except OSError:
        return []
    for folder in candidates:
        lock = folder / LOCK_NAME
        try:
            if now - lock.stat().st_mtime < stale_after_s:
                continue
            fd = os.open(lock, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError:  # no lock file (not ours, or an older profkit's), or another user's folder
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner, or one of its workers, is alive
            os.close(fd)
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed
