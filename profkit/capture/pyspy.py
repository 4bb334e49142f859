"""After a ``py-spy record --subprocesses`` run: one trace per rank, on wall-clock time.

py-spy writes one Chrome-trace array for every process it followed, with ``ts`` in µs since its
recorder started (CLOCK_MONOTONIC). We read a (wall, monotonic) anchor just before starting it,
so ``wall ≈ anchor_wall + ts``: early by py-spy's start-up latency (a few ms; the align stage can
refine it against profkit spans). Each rank's processes (pid -> rank from the span file headers)
go to ``pyspy/rank{r}.pyspy.json.gz`` with absolute epoch µs, which the Chrome reader places and
names by rank; the raw file (every process, original times) is kept as
``pyspy/all-processes.chrometrace.gz``, a name the loader does not read.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

RAW_NAME = "all-processes.chrometrace"


def split_by_rank(raw: Path, pid_rank: dict[int, int], anchor_wall_ns: int) -> dict[str, Any]:
    """Write the per-rank files beside ``raw``; returns facts for the manifest."""
    facts: dict[str, Any] = {"raw": None, "files": {}, "unranked_pids": [], "error": None,
                             "time_base": "anchor_wall_ns + ts (py-spy start-up latency not removed)"}
    if not raw.is_file() or raw.stat().st_size == 0:
        facts["error"] = f"py-spy wrote no trace at {raw}"
        return facts
    try:
        events = json.loads(raw.read_bytes())
    except ValueError as exc:
        facts["error"] = f"py-spy trace {raw} is not JSON: {exc}"
        return facts
    if not isinstance(events, list):
        facts["error"] = f"py-spy trace {raw}: expected a JSON array"
        return facts
    base_us = anchor_wall_ns // 1000
    by_rank: dict[int, list[dict]] = {}
    unranked: set[int] = set()
    for ev in events:
        if not isinstance(ev, dict):
            continue
        pid = ev.get("pid")
        rank = pid_rank.get(int(pid)) if isinstance(pid, int) else None
        if rank is None:
            unranked.add(pid)
            continue
        if isinstance(ev.get("ts"), (int, float)):
            ev = {**ev, "ts": ev["ts"] + base_us}
        by_rank.setdefault(rank, []).append(ev)
    for rank, rank_events in sorted(by_rank.items()):
        path = raw.parent / f"rank{rank}.pyspy.json.gz"
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as fh:
            json.dump(rank_events, fh, separators=(",", ":"))
        facts["files"][rank] = str(path)
    packed = raw.parent / f"{RAW_NAME}.gz"
    with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
        dst.write(src.read())
    raw.unlink()
    facts["raw"] = str(packed)
    facts["unranked_pids"] = sorted(p for p in unranked if isinstance(p, int))
    return facts
