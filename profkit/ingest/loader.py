"""Find trace files, pick a reader for each, reconcile ranks, and build one event table.

One bad file never hides the others: its error is recorded in ``Capture.skipped`` (one
line naming the file and the problem) and everything readable is still loaded.
"""
from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd
import pyarrow as pa

from profkit import schema
from profkit.errors import DuplicateRankError, TraceError
from profkit.ingest import cache, scanned
from profkit.ingest.base import RankPart
from profkit.ingest.readers import TRACE_SUFFIXES, read_parts, sniff  # noqa: F401 - loader.sniff too

# files a capture folder holds that are not traces
NOT_TRACES = re.compile(
    r"^(manifest|truth|summary|alignment|expert_loads)\.json$|\.timings\.|^steps\.|^causes\.|^stragglers\."
    r"|^rank\d+\.(engine|worker)\.json$"  # the bundled engine's per-process identity files
)
RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?=[^0-9]|$)", re.IGNORECASE)


def discover(paths: Iterable[str | Path]) -> tuple[list[Path], list[str]]:
    """Expand folders into trace files (sorted); return (files, problems)."""
    files: list[Path] = []
    problems: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and _looks_like_trace(f))
            if not found:
                problems.append(f"{p}: folder holds no trace files ({', '.join(TRACE_SUFFIXES)})")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            problems.append(f"{p}: no such file or folder")
    # an .nsys-rep beside its own SQLite export is the same data: read the export only
    exports = {f.resolve() for f in files if f.suffix == ".sqlite"}
    files = [f for f in files if not (f.suffix in (".nsys-rep", ".qdrep") and f.with_suffix(".sqlite").resolve() in exports)]
    seen: set[Path] = set()
    unique = []
    for f in files:
        r = f.resolve()
        if r not in seen:
            seen.add(r)
            unique.append(f)
    return unique, problems


def _looks_like_trace(path: Path) -> bool:
    if not path.name.endswith(TRACE_SUFFIXES) or NOT_TRACES.search(path.name):
        return False
    if path.name.endswith(".jsonl"):  # only profkit span files; other JSON lines are side files
        from profkit.ingest.spans import is_span_file

        return is_span_file(path)
    return True


def read_file(path: Path, pid_to_rank: dict[int, int] | None = None) -> list[RankPart]:
    """Parse one file with the right reader (``readers.READERS``; through the parsed-trace cache)."""
    options = {"pid_to_rank": sorted(pid_to_rank.items())} if pid_to_rank else None
    cached = cache.load(path, options)
    if cached is not None:
        return cached
    parts = read_parts(path, sniff(path), pid_to_rank)
    cache.store(path, parts, options)
    return parts


@dataclass
class RankMap:
    """User's explicit rank assignments: ``FILE=RANK`` or ``FILE:PID=RANK`` (FILE may be a name)."""

    by_file: dict[str, int] = field(default_factory=dict)
    by_file_pid: dict[tuple[str, int], int] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> "RankMap":
        out = cls()
        for spec in specs:
            target, sep, rank = spec.rpartition("=")
            if not sep or not rank.strip().isdigit() or not target:
                raise ValueError(f"--rank {spec!r}: expected FILE=RANK or FILE:PID=RANK")
            head, colon, pid = target.rpartition(":")
            if colon and pid.isdigit() and head:
                out.by_file_pid[(head, int(pid))] = int(rank)
            else:
                out.by_file[target] = int(rank)
        return out

    def _match(self, path: Path, table: dict):
        for key, value in table.items():
            name = key[0] if isinstance(key, tuple) else key
            if name in (str(path), path.name) or Path(name).resolve() == path.resolve():
                yield key, value

    def for_file(self, path: Path) -> int | None:
        return next((v for _, v in self._match(path, self.by_file)), None)

    def pids_for_file(self, path: Path) -> dict[int, int]:
        return {k[1]: v for k, v in self._match(path, self.by_file_pid)}


def rank_from_filename(path: Path) -> int | None:
    m = RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


@dataclass
class Capture:
    """Everything loaded: the event table, which part became which rank, and what was skipped.
    (``profkit.load`` returns ``profkit.analyze.capture.Capture``: this, with a step table and a
    GPU timeline at hand.)"""

    events: pd.DataFrame
    parts: pd.DataFrame  # one row per loaded part: rank, source, path, key, rank_origin, n_events
    meta: dict[int, list[dict]]  # rank -> meta of each of its parts
    skipped: list[str]  # one line per input that could not be read: "<file>: <problem>"
    warnings: list[str]
    n_events: int | None = None  # set when ``events`` is not held (the scale path)
    # processes that are no rank and were left out (front ends, API servers, the DP coordinator
    # of a multi-rank capture): path, key, role, pids, n_events
    unranked: list[dict] = field(default_factory=list)

    @property
    def event_count(self) -> int:
        return int(self.n_events) if self.n_events is not None else len(self.events)

    @property
    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.parts["rank"].unique()) if len(self.parts) else []


def load(
    *paths: str | Path,
    rank_map: RankMap | dict[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Capture:
    """Read every trace under ``paths`` into one Capture (never raises for one bad file).

    Ranks come from trace metadata, else the file name (``rank3``, ``rank-3``,
    ``_rank3.``), else the order of the inputs; an explicit ``rank_map`` wins over all.
    Two inputs of one source claiming one rank: the second is skipped with an error
    naming both files.
    """
    if isinstance(rank_map, dict):
        rank_map = RankMap(by_file=dict(rank_map))
    rank_map = rank_map or RankMap()
    files, skipped = discover(paths)
    from profkit.ingest.manifest import manifest_facts

    manifest = manifest_facts(files)
    loaded: list[RankPart] = []
    scanned.build_for(files, progress)
    for got in _read_all(files, rank_map, progress):
        if isinstance(got, str):
            skipped.append(got)
        else:
            loaded.extend(got)
    unranked: list[dict] = []
    kept, warnings = resolve_ranks(loaded, rank_map, skipped, manifest, unranked)
    capture = _assemble(kept, skipped, warnings)
    capture.unranked = unranked
    return capture


def _read_all(files: list[Path], rank_map: RankMap,
              progress: Callable[[str], None] | None) -> list[list[RankPart] | str]:
    """Each file's parts, or the line saying why it was skipped, in file order. Read on threads
    (one per core) when two or more files are large enough for the compiled scanner and numba's
    JIT serves it, which releases the GIL while it scans; msgspec's decoding and the scanner built
    ahead of time hold it, so those reads stay serial (threads would only hold more in memory)."""

    def one(path: Path) -> list[RankPart] | str:
        if progress:
            progress(f"reading {path}")
        try:
            return read_file(path, rank_map.pids_for_file(path) or None)
        except TraceError as exc:
            return str(exc)
        except MemoryError:
            return f"{path}: out of memory while reading"

    threads = min(len(files), os.cpu_count() or 1, MAX_READ_THREADS)
    if threads > 1:
        large = [size for size in map(scanned.file_size, files) if size >= scanned.min_file_bytes()]
        if len(large) < 2 or not scanned.threads_help(max(large)):
            threads = 1
    if threads <= 1:
        return [one(path) for path in files]
    with ThreadPoolExecutor(threads, thread_name_prefix="profkit-read") as pool:
        return list(pool.map(one, files))


MAX_READ_THREADS = 8


UNRANKED_ROLES = ("frontend", "coordinator")  # vLLM's API server / offline front end, DP coordinator


def resolve_ranks(parts: list, rank_map: RankMap, skipped: list[str], manifest=None,
                  unranked: list[dict] | None = None) -> tuple[list, list[str]]:
    """Give every part its rank: mapping > metadata > file name > the capture manifest's pids >
    input order; drop conflicts.

    ``parts``: ``RankPart`` s, or any objects with the same attributes whose ``gpu_events`` and
    ``pids`` are known without a table (the scale path's part descriptors). Parts of one file
    come together, in input order. Returns the kept parts and the warnings; a conflicting part
    is skipped with a line in ``skipped`` naming both files.

    Processes that are no rank never get one by order (``manifest``: ``ingest.manifest.ManifestFacts``):
    a part without a rank whose process the capture listed as unranked, whose role is a front
    end or the DP coordinator, or that is a profkit span file without GPU work (its process never
    learned a rank: an offline ``LLM`` front end). Such a part serves the ranks: with exactly one
    rank it joins that rank (``rank_origin`` ``serves``, as vLLM's engine-core process joins its
    worker's); otherwise it is left out and described in ``unranked``.
    """
    warnings: list[str] = []
    loaded: list = []
    by_file: dict[str, list] = {}
    for part in parts:
        by_file.setdefault(part.path, []).append(part)
    for path, file_parts in by_file.items():
        forced = rank_map.for_file(Path(path))
        for part in file_parts:
            if forced is not None and len(file_parts) == 1:
                part.rank, part.rank_origin = forced, "mapping"
            elif part.rank is None:
                from_name = rank_from_filename(Path(path)) if len(file_parts) == 1 else None
                if from_name is not None:
                    part.rank, part.rank_origin = from_name, "filename"
            warnings.extend(f"{part.label}: {w}" for w in part.warnings)
            loaded.append(part)
    # the capture manifest knows the pids of each rank
    for part in loaded:
        if part.rank is None and manifest is not None and manifest.rank_of_pid:
            found = {manifest.rank_of_pid[p] for p in _process_ids(part) if p in manifest.rank_of_pid}
            if len(found) == 1:
                part.rank, part.rank_origin = found.pop(), "manifest"
    if manifest is not None:
        warnings.extend(manifest.warnings)
    # processes outside any rank (vLLM's front end, API servers, DP coordinator) are not given one
    # by order; a span file that never learned its rank is one of them only beside ranked parts
    # (alone, or among other unranked inputs, it is a program that never said its rank)
    outside = [p for p in loaded if p.rank is None and _not_a_rank(p, manifest, strict=True)]
    if any(p.rank is not None for p in loaded):
        outside += [p for p in loaded if p.rank is None and not any(p is o for o in outside)
                    and _not_a_rank(p, manifest, strict=False)]
    loaded = [p for p in loaded if not any(p is o for o in outside)]
    # inputs that still have no rank get the lowest free ones, in input order
    used = {p.rank for p in loaded if p.rank is not None}
    next_free = 0
    for part in loaded:
        if part.rank is None:
            while next_free in used:
                next_free += 1
            part.rank, part.rank_origin = next_free, "order"
            used.add(next_free)
            warnings.append(f"{part.label}: no rank in metadata or file name; assigned rank {next_free} by input order")
    kept: list = []
    for part in loaded:
        owner = next((k for k in kept if _conflict(k, part)), None)
        if owner is not None:
            skipped.append(str(DuplicateRankError(part.rank, owner.label, part.label)))
            continue
        kept.append(part)
    ranks = sorted({int(p.rank) for p in kept})
    for part in outside:
        role = _role(part, manifest) or "process"
        if len(ranks) == 1:
            part.rank, part.rank_origin = ranks[0], "serves"
            kept.append(part)
            warnings.append(f"{part.label}: {role} outside any rank; joined to rank {ranks[0]}, the only rank it serves")
            continue
        warnings.append(f"{part.label}: {role} outside any rank; left out (not a rank: listed as unranked)")
        if unranked is not None:
            unranked.append({"path": part.path, "key": part.key, "source": part.source, "role": _role(part, manifest),
                             "pids": sorted(_process_ids(part)), "n_events": part_n_events(part)})
    return kept, warnings


def _process_ids(part) -> set[int]:
    """The part's pids, and the one its header names (a span file without spans has no rows)."""
    pid = part.meta.get("pid")
    return part_pids(part) | ({int(pid)} if isinstance(pid, int) else set())


def _role(part, manifest) -> str | None:
    role = part.meta.get("role")
    if role is None and manifest is not None:
        role = next((manifest.unranked[p] for p in _process_ids(part) if p in manifest.unranked), None)
    return role


def _not_a_rank(part, manifest, strict: bool) -> bool:
    """A part without a rank that is a process serving the ranks (see ``resolve_ranks``):
    ``strict``, by its role or the capture's word; else also a profkit span file without GPU work."""
    if part.meta.get("role") in UNRANKED_ROLES:
        return True
    if manifest is not None and _process_ids(part) & set(manifest.unranked):
        return True
    return not strict and part.source == "profkit" and not part_gpu_events(part)


def _conflict(a, b) -> bool:
    """Two parts of one source claim one rank in a way that cannot be merged.

    One DP rank legitimately spans processes (vLLM's engine-core process schedules, its
    worker runs the GPU), so parts merge unless both carry GPU activity or share a process.
    """
    if a.rank != b.rank or a.source != b.source:
        return False
    if part_gpu_events(a) and part_gpu_events(b):
        return True
    return bool(part_pids(a) & part_pids(b))


def part_gpu_events(part) -> int:
    """GPU events of a part (a descriptor says it; a ``RankPart`` is counted once)."""
    if getattr(part, "table", None) is None:
        return int(part.gpu_events)
    return _gpu_event_count(part.table)


def part_n_events(part) -> int:
    if getattr(part, "table", None) is None:
        return int(part.n_events)
    return part.table.num_rows


def part_pids(part) -> set[int]:
    if getattr(part, "table", None) is None:
        return set(part.pids)
    return _pids(part.table)


_MAX_OS_PID = 1 << 22  # Linux pid_max ceiling; larger values are readers' hashes of names like "Spans"


def _pids(table: pa.Table) -> set[int]:
    import pyarrow.compute as pc

    return {p for p in pc.unique(table["pid"]).to_pylist() if p is not None and 0 < p <= _MAX_OS_PID}


def _gpu_event_count(table: pa.Table) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(pc.is_in(table["kind"], value_set=pa.array(schema.GPU_KINDS))).as_py() or 0)


def describe_parts(parts: list, warnings: list[str]) -> tuple[pd.DataFrame, dict[int, list[dict]]]:
    """Which part became which rank (``Capture.parts``) and each rank's parts' meta; appends the
    warnings for parts without events and ranks without GPU events. ``parts``: ``RankPart`` s or
    the scale path's descriptors (``part_gpu_events`` / ``part_n_events`` read either)."""
    gpu_by_rank: dict[int, int] = {}
    for p in parts:
        gpu_by_rank[p.rank] = gpu_by_rank.get(p.rank, 0) + part_gpu_events(p)
        if part_n_events(p) == 0:
            warnings.append(f"{p.label}: no events (rank {p.rank})")
    for rank, n_gpu in sorted(gpu_by_rank.items()):
        if n_gpu == 0:
            files = ", ".join(p.label for p in parts if p.rank == rank)
            warnings.append(f"{files}: no GPU events (rank {rank}): host-side facts only, no GPU timeline")
    rows = [{"rank": p.rank, "source": p.source, "path": p.path, "key": p.key, "rank_origin": p.rank_origin,
             "n_events": part_n_events(p)} for p in parts]
    parts_df = pd.DataFrame(rows, columns=["rank", "source", "path", "key", "rank_origin", "n_events"])
    meta: dict[int, list[dict]] = {}
    for p in parts:
        meta.setdefault(int(p.rank), []).append({"path": p.path, "source": p.source, "key": p.key, **p.meta})
    return parts_df, meta


def _assemble(parts: list[RankPart], skipped: list[str], warnings: list[str]) -> Capture:
    parts_df, meta = describe_parts(parts, warnings)
    tables = [cache.table_with_rank(p.table, p.rank) for p in parts]
    table = pa.concat_tables(tables) if tables else schema.ARROW_SCHEMA.empty_table()
    return Capture(events=schema.to_frame(table), parts=parts_df, meta=meta, skipped=skipped, warnings=warnings)
