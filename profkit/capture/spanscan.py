"""Incremental reading of the span files being written (``spans-pid*.jsonl``), standard library only.

Why not ``profkit.ingest.spans``: the launcher polls every second while ranks append, needs only
counts and headers, and must not need pyarrow/numpy (the capture side runs where only the
serving stack is installed). Each poll reads the bytes appended since the last one; a trailing
line without its newline is held back (still being written, or torn if the process died).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPAN_FILE_GLOB = "spans-pid*.jsonl"
_PID_RE = re.compile(r"spans-pid(\d+)\.jsonl$")
#: profkit's step markers (as ``profkit.analyze.steps``), and the worker-side step calls
STEP_NAMES = frozenset({"EngineCore.step", "EngineCore.step_with_batch_queue", "profkit.step"})
WORKER_STEP_NAMES = frozenset({"Worker.execute_model", "Worker.execute_dummy_batch"})
GC_CATEGORY = "gc"
HEADER_KEY = "profkit_spans"
READ_LIMIT = 64 << 20  # bytes per file per poll: progress stays responsive on huge files


@dataclass
class SpanFileState:
    """What one process's span file says so far."""

    path: Path
    offset: int = 0
    partial: bytes = b""
    header: dict[str, Any] = field(default_factory=dict)
    anchors: list[list[int]] = field(default_factory=list)  # first and latest [wall_ns, mono_ns]
    names: dict[int, str] = field(default_factory=dict)
    spans: int = 0
    steps: int = 0
    worker_steps: int = 0
    gc_spans: int = 0
    last_end_mono_ns: int | None = None
    bad_lines: int = 0
    lines: int = 0

    @property
    def pid(self) -> int | None:
        pid = self.header.get("pid")
        if pid is not None:
            return int(pid)
        m = _PID_RE.search(self.path.name)
        return int(m.group(1)) if m else None

    @property
    def rank(self) -> int | None:
        rank = self.header.get("rank")
        return int(rank) if rank is not None else None

    @property
    def torn(self) -> bool:
        """A last line without its newline (meaningful once the process is gone)."""
        return bool(self.partial.strip())

    def poll(self) -> bool:
        """Read what was appended; True if anything new was parsed."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return False
        if size < self.offset:  # truncated: a new process reused the pid
            self.__init__(self.path)  # type: ignore[misc]
        if size == self.offset:
            return False
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(min(size - self.offset, READ_LIMIT))
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        for line in complete:
            if line.strip():
                self._take(line)
        return bool(complete)

    def _take(self, line: bytes) -> None:
        try:
            obj = json.loads(line)
        except ValueError:
            self.bad_lines += 1
            return
        if not isinstance(obj, dict):
            self.bad_lines += 1
            return
        self.lines += 1
        if HEADER_KEY in obj:
            self.header.update({k: v for k, v in obj.items() if k not in ("anchors",)})
            for anchor in obj.get("anchors") or ():
                self._anchor(anchor)
        if "anchor" in obj:
            self._anchor(obj["anchor"])
        for key, text in (obj.get("names") or {}).items():
            try:
                self.names[int(key)] = str(text)
            except ValueError:
                continue
        for span in obj.get("spans") or ():
            try:
                name = self.names.get(int(span[0]), "")
                category = self.names.get(int(span[1]), "")
                end = int(span[3])
            except (TypeError, ValueError, IndexError):
                self.bad_lines += 1
                continue
            self.spans += 1
            if name in STEP_NAMES:
                self.steps += 1
            elif name in WORKER_STEP_NAMES:
                self.worker_steps += 1
            if category == GC_CATEGORY:
                self.gc_spans += 1
            if self.last_end_mono_ns is None or end > self.last_end_mono_ns:
                self.last_end_mono_ns = end

    def _anchor(self, anchor: Any) -> None:
        try:
            pair = [int(anchor[0]), int(anchor[1])]
        except (TypeError, ValueError, IndexError):
            return
        if not self.anchors:
            self.anchors.append(pair)
        elif len(self.anchors) == 1:
            if pair != self.anchors[0]:
                self.anchors.append(pair)
        elif pair[1] >= self.anchors[-1][1]:
            self.anchors[-1] = pair


class SpanScan:
    """All span files of a capture folder, polled together."""

    def __init__(self, out_dir: str | os.PathLike[str]):
        self.out_dir = Path(out_dir)
        self.files: dict[Path, SpanFileState] = {}

    def poll(self) -> bool:
        changed = False
        for path in sorted(self.out_dir.glob(SPAN_FILE_GLOB)):
            state = self.files.get(path)
            if state is None:
                state = self.files[path] = SpanFileState(path)
                changed = True
            changed |= state.poll()
        return changed

    def processes(self) -> list[SpanFileState]:
        return sorted(self.files.values(), key=lambda s: (s.rank is None, s.rank or 0, s.pid or 0))

    def steps_by_rank(self) -> dict[int, int]:
        """Steps seen per rank: engine step spans, or worker step calls where a rank has none."""
        marker: dict[int, int] = {}
        worker: dict[int, int] = {}
        for state in self.files.values():
            if state.rank is None:
                continue
            marker[state.rank] = max(marker.get(state.rank, 0), state.steps)
            worker[state.rank] = max(worker.get(state.rank, 0), state.worker_steps)
        return {r: marker[r] or worker[r] for r in sorted(marker)}
