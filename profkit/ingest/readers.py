"""The readers profkit knows, one entry each: a kind, the file endings it owns, how a file is
recognized as its own, and the function that reads it (imported on first use: readers pull in
their own dependencies). ``loader.sniff`` and ``loader.read_file`` walk this table, so a new
format is one ``Reader`` here.

Recognition runs in table order, in two passes: first by name alone (``by_name``: an nsys report
is not opened here), then by the first 16 bytes (``by_head``); an entry's test may raise a
``TraceError`` that names the file and why it is not that format.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from profkit.errors import TraceError
from profkit.ingest.base import RankPart

_GZIP_MAGIC = b"\x1f\x8b"
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _span_file(path: Path, head: bytes) -> str | None:
    if not path.name.endswith(".jsonl"):
        return None
    from profkit.ingest.spans import is_span_file

    if is_span_file(path):
        return "profkit"
    raise TraceError(path, "JSON lines file that is not a profkit span file (no profkit_spans header)")


def _json_trace(path: Path, head: bytes) -> str | None:
    if not (head.startswith(_GZIP_MAGIC) or head.lstrip()[:1] in (b"{", b"[")):
        return None
    from profkit.ingest.kineto import sniff_json

    return sniff_json(path)  # kineto or chrome


@dataclass(frozen=True)
class Reader:
    kind: str
    suffixes: tuple[str, ...]
    read: str  # "module:function" taking (path) or, with ``by_pid``, (path, pid_to_rank=...)
    by_pid: bool = False  # takes the user's pid -> rank map (files that hold several processes)
    by_name: bool = False  # recognized by its ending alone
    by_head: Callable[[Path, bytes], str | None] | None = None  # the kind it recognizes, or None

    def reader(self) -> Callable[..., list[RankPart]]:
        module, _, function = self.read.partition(":")
        return getattr(importlib.import_module(module), function)


READERS: tuple[Reader, ...] = (
    Reader("nsys-rep", (".nsys-rep", ".qdrep"), "profkit.ingest.nsys:read_nsys_rep", by_pid=True, by_name=True),
    Reader("nsys", (".sqlite",), "profkit.ingest.nsys:read_nsys", by_pid=True,
           by_head=lambda path, head: "nsys" if head.startswith(_SQLITE_MAGIC) else None),
    Reader("profkit", (".jsonl",), "profkit.ingest.spans:read_spans", by_head=_span_file),
    Reader("kineto", (".json", ".json.gz"), "profkit.ingest.kineto:read_kineto", by_head=_json_trace),
    Reader("chrome", (".json", ".json.gz"), "profkit.ingest.chrome:read_chrome"),  # kineto's test decides
)
BY_KIND = {r.kind: r for r in READERS}
# every ending a trace file may have, in the order the messages name them
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep", ".qdrep", ".jsonl")
assert set(TRACE_SUFFIXES) == {s for r in READERS for s in r.suffixes}


def sniff(path: Path) -> str:
    """Which reader a file needs (a ``Reader.kind``): kineto | chrome | nsys | nsys-rep | profkit."""
    for r in READERS:
        if r.by_name and path.name.endswith(r.suffixes):
            return r.kind
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise TraceError(path, f"cannot open: {exc.strerror or exc}") from None
    if not head:
        raise TraceError(path, "empty file")
    for r in READERS:
        kind = r.by_head(path, head) if r.by_head is not None else None
        if kind is not None:
            return kind
    raise TraceError(path, "unknown format: not JSON, gzip'd JSON or an Nsight Systems SQLite export")


def preload(paths: list[Path]) -> None:
    """Import the readers the files' endings call for, once, in a process about to fork a pool's
    workers: each worker would otherwise import them on its first file (~20 ms)."""
    for r in READERS:
        if any(p.name.endswith(r.suffixes) for p in paths):
            r.reader()


def read_parts(path: Path, kind: str, pid_to_rank: dict[int, int] | None = None) -> list[RankPart]:
    """Parse one file of a known kind (no cache: ``loader.read_file`` is the way in)."""
    r = BY_KIND.get(kind)
    if r is None:  # pragma: no cover - sniff returns only the kinds above
        raise TraceError(path, f"no reader for {kind}")
    return r.reader()(path, pid_to_rank=pid_to_rank) if r.by_pid else r.reader()(path)
