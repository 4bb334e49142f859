"""Writing one process's span file: ``spans-pid{pid}.jsonl`` (format ``profkit_spans`` 1).

Every line is one JSON object, written with a single ``os.write`` on an ``O_APPEND`` descriptor,
so a process killed at any moment leaves only whole lines (at worst a torn last one, which the
reader skips with a warning). Lines:

- header: ``{"profkit_spans": 1, "pid", "host", "rank", "rank_origin", "dp_rank", "dp_size",
  "ep_rank", "tp_rank", "pp_rank", "local_rank", "global_rank", "process_name", "role", "clock":
  "monotonic", "anchors": [[wall_ns, mono_ns], ...], "profkit_version", "python"}``; written
  first, and again whenever the identity changes (the rank is learned lazily): the last wins.
- batch: ``{"anchor": [wall_ns, mono_ns], "names": {"id": "text", ...}, "spans": [[name_id,
  category_id, start_mono_ns, end_mono_ns, tid], ...]}``; ``names`` defines the ids (names and
  categories share one table) that this line uses and no earlier line defined. A span may carry
  a 6th element, an object of extra facts (GC spans: ``{"collected": n, "uncollectable": n}``).
  ``anchor`` is taken when the line is written; anchor-only lines mark a flush with no spans.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Sequence

from .strings import StringTable

FORMAT_VERSION = 1
HEADER_KEY = "profkit_spans"
#: spans per line: bounds how long one encode holds the GIL in the writer thread (~40 us with orjson)
CHUNK_SPANS = 512


def _dumps_stdlib(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _pick_dumps() -> Callable[[Any], bytes]:
    """orjson where installed (a profkit dependency; ~4x faster, so the writer thread holds the
    GIL ~75 ns per span instead of ~300), else the standard library. Imported in the writer only."""
    try:
        import orjson

        return orjson.dumps
    except ImportError:
        return _dumps_stdlib


def file_name(pid: int) -> str:
    return f"spans-pid{pid}.jsonl"


def _profkit_version() -> str:
    mod = sys.modules.get("profkit")
    return str(getattr(mod, "__version__", "unknown"))


class SpanFile:
    """Append-only writer of one process's span file (not thread-safe: the recorder locks)."""

    def __init__(self, out_dir: str, pid: int, strings: StringTable, start_anchor: tuple[int, int]):
        self.out_dir = out_dir
        self.pid = pid
        self.path = os.path.join(out_dir, file_name(pid))
        self.host = os.uname().nodename
        self._strings = strings
        self._start_anchor = start_anchor
        self._fd: int | None = None
        self._created = False
        self._defined: set[int] = set()
        self._identity: dict[str, Any] | None = None
        self.lines = 0
        self.error: str | None = None
        self._dumps: Callable[[Any], bytes] | None = None

    def write(self, spans: Sequence[tuple], identity: dict[str, Any], anchor: tuple[int, int],
              yield_gil: bool = False) -> None:
        """Append a header (if the identity changed) and ``spans`` in lines of CHUNK_SPANS."""
        if self.error is not None:
            return
        try:
            if identity != self._identity:
                self._write_line(self._header(identity, anchor))
                self._identity = dict(identity)
            if not spans:
                self._write_line(f'{{"anchor":[{anchor[0]},{anchor[1]}]}}\n'.encode())
                return
            dumps = self._dumps or self._set_dumps()
            for i in range(0, len(spans), CHUNK_SPANS):
                chunk = spans[i:i + CHUNK_SPANS]
                ids = {rec[0] for rec in chunk}
                ids.update(rec[1] for rec in chunk)
                new = ids - self._defined
                line: dict[str, Any] = {}
                if i == 0:
                    line["anchor"] = anchor
                line["names"] = {str(k): self._strings.text(k) for k in sorted(new)}
                line["spans"] = chunk
                self._write_line(dumps(line) + b"\n")
                self._defined |= new  # only once on disk: a crash mid-batch never orphans an id
                if yield_gil:
                    time.sleep(0)  # let the step loop run between chunks
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}"
            print(f"profkit: span file not written any more: {self.error}", file=sys.stderr)

    def _header(self, identity: dict[str, Any], anchor: tuple[int, int]) -> bytes:
        header = {HEADER_KEY: FORMAT_VERSION, "pid": self.pid, "host": self.host, **identity,
                  "clock": "monotonic", "anchors": [list(self._start_anchor), list(anchor)],
                  "profkit_version": _profkit_version(), "python": sys.version.split()[0]}
        return _dumps_stdlib(header) + b"\n"

    def _set_dumps(self) -> Callable[[Any], bytes]:
        self._dumps = _pick_dumps()
        return self._dumps

    def _write_line(self, data: bytes) -> None:
        if self._fd is None:
            os.makedirs(self.out_dir, exist_ok=True)
            # truncate once: a file with our pid is from an earlier process that had the same pid
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if self._created else os.O_TRUNC)
            self._fd = os.open(self.path, flags, 0o644)
            self._created = True
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        self.lines += 1

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
