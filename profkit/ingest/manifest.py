"""What a ``profkit capture`` folder's ``manifest.json`` says about processes and ranks.

The loader reads it for one reason: which processes are NOT ranks. A real vLLM capture holds span
files of processes that serve the ranks without being one (the front end of an offline ``LLM``,
API servers, the DP coordinator); the capture knew it (``unranked_processes``), and a process that
is not a rank must never become "rank 1 by input order". The manifest also names each rank's
pids, which places a part whose own metadata has no rank.

A missing manifest is normal (plain trace files); an unreadable one is a warning, never an error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

MANIFEST = "manifest.json"
_LEVELS = 2  # a trace file sits at most this deep below its capture folder (torch/, nsys/)


@dataclass
class ManifestFacts:
    """Processes by pid: the rank each belongs to, or the role of one that is no rank."""

    rank_of_pid: dict[int, int] = field(default_factory=dict)
    unranked: dict[int, str | None] = field(default_factory=dict)  # pid -> role (None if unknown)
    manifests: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # (manifest, rank) -> the files the capture wrote for the rank (span files, torch traces, the
    # nsys report it shares with the others), resolved
    rank_files: dict[tuple[str, int], set[Path]] = field(default_factory=dict)

    def merge(self, path: Path) -> None:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            self.warnings.append(f"{path}: capture manifest not read ({exc}); ranks come from the traces")
            return
        if not isinstance(doc, dict) or "profkit_capture" not in doc:
            return
        self.manifests.append(str(path))
        for rank in doc.get("ranks") or []:
            if not isinstance(rank, dict) or rank.get("rank") is None:
                continue
            for pid in rank.get("pids") or []:
                if isinstance(pid, int):
                    self.rank_of_pid[pid] = int(rank["rank"])
            files = {(path.parent / f).resolve() for f in rank.get("files") or [] if isinstance(f, str)}
            if files:
                self.rank_files.setdefault((str(path), int(rank["rank"])), set()).update(files)
        for proc in doc.get("unranked_processes") or []:
            if isinstance(proc, dict) and isinstance(proc.get("pid"), int):
                self.unranked[int(proc["pid"])] = proc.get("role")

    def files_of_shared_ranks(self, paths: Iterable[str | Path]) -> set[Path]:
        """Of ``paths``, those whose rank has another of them among its files (resolved): a rank whose
        events come from more than one file, e.g. a capture's span file and torch trace, is
        prepared once its parts are joined, not each file alone as the rank (``stages.read_file_task``)."""
        read = {Path(p).resolve() for p in paths}
        out: set[Path] = set()
        for files in self.rank_files.values():
            mine = files & read
            if len(mine) > 1:
                out |= mine
        return out


def manifest_facts(paths: Iterable[str | Path]) -> ManifestFacts:
    """Facts of every capture manifest found at or above (up to two levels) the given paths."""
    facts = ManifestFacts()
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        start = p if p.is_dir() else p.parent
        for folder in [start, *list(start.parents)[:_LEVELS]]:
            cand = folder / MANIFEST
            if cand.is_file():
                r = cand.resolve()
                if r not in seen:
                    seen.add(r)
                    facts.merge(cand)
                break
    return facts
