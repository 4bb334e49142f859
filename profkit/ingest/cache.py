"""Cache of parsed traces (Arrow IPC files), so a second analysis of the same files does not parse again.

Keyed by the file's absolute path, size, mtime and the schema/reader versions: an edited
or replaced file misses the cache. Lives under ``$PROFKIT_CACHE_DIR`` (default
``$XDG_CACHE_HOME/profkit`` or ``~/.cache/profkit``) because trace folders are often
read-only. Disable with ``PROFKIT_CACHE=0``.

Why Arrow IPC (Feather v2, lz4) and not Parquet: every cold run writes the cache, so its cost
is paid on every first look at a capture. Measured on a simulated rank of 389k events (CPU
time, pyarrow 26): Parquet zstd 141 ms to write and 86 ms to read back (3.8 MB); Arrow IPC lz4
50 ms and 38 ms (13.3 MB, about the size of the gzip'd JSON it replaces). Entries written by
the Parquet versions (reader version 1) are simply not found (the key changed).

Each part is one record batch, its schema marked as the scale store marks an event table
(``schema.as_arrow_frame``): ``profkit.scale`` links the cache's file into its store as the
part's table (``DiskStore.put_file``) rather than encoding and writing the table again, so a
warm run decodes nothing in its read stage (reader version 3; older entries are not found).

An entry is written in a temporary folder and renamed into place; one interrupted mid-write is
removed (Ctrl-C), or, where its writer was killed, by the next process that writes to the cache
once an hour old (``sweep_stale_tmp``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from profkit import schema
from profkit.arrowfiles import read_arrow_file, write_arrow_file
from profkit.flags import env_on
from profkit.ingest.base import RankPart

READER_VERSION = 3  # 3: one record batch, marked for the scale store (2: Arrow IPC, 1: Parquet)
_META_KEY = b"profkit.part"
_TMP_PREFIX = ".tmp-"
# an entry is written in seconds (a GB-sized rank's in a few): a temporary folder this old is a
# writer's that was killed (a run's workers are ended at once when it is stopped: ``scale.lifetime``)
STALE_TMP_S = 3600.0
_swept: set[Path] = set()  # cache roots this process has swept


def cache_dir() -> Path:
    explicit = os.environ.get("PROFKIT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "profkit"


def enabled() -> bool:
    return env_on("PROFKIT_CACHE")


def cache_key(path: Path, options: dict | None = None) -> str:
    st = path.stat()
    ident = json.dumps(
        [str(path.resolve()), st.st_size, st.st_mtime_ns, schema.SCHEMA_VERSION, READER_VERSION, options or {}],
        sort_keys=True,
    )
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def load(path: Path, options: dict | None = None) -> list[RankPart] | None:
    """Cached parts of ``path``, or None on a miss (or an unreadable cache entry)."""
    if not enabled():
        return None
    entry = cache_dir() / cache_key(path, options)
    done = entry / "parts.json"
    if not done.is_file():
        return None
    try:
        n_parts = json.loads(done.read_text())["n_parts"]
        parts = []
        for i in range(n_parts):
            # one thread (``arrowfiles``): a thread pool per small buffer cost ~7x the CPU (0.20 s vs
            # 0.07 s for 8 ranks of 67k events, when the file held a record batch per 16k rows)
            table = read_arrow_file(entry / f"part-{i}.arrow")
            info = json.loads(table.schema.metadata[_META_KEY])
            # the entry is keyed by the resolved path; its parts name the file as this caller does
            # (as a fresh parse would), not as whoever filled the cache did (relative, absolute)
            stored, given = str(info.get("path") or ""), str(path)
            if stored and stored != given:
                info["path"] = given
                info["warnings"] = [w.replace(stored, given) for w in info.get("warnings") or []]
            file = entry / f"part-{i}.arrow"
            table = table.replace_schema_metadata(None).cast(schema.ARROW_SCHEMA)
            parts.append(RankPart(table=table, cache_file=str(file), **info))
        return parts
    except Exception:  # a damaged cache entry is a miss, never an error
        shutil.rmtree(entry, ignore_errors=True)
        return None


def store(path: Path, parts: list[RankPart], options: dict | None = None) -> None:
    """Write parts atomically (temp dir + rename); failures to cache are ignored."""
    if not enabled():
        return
    root = cache_dir()
    tmp: Path | None = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        entry = root / cache_key(path, options)
        if root not in _swept:
            _swept.add(root)
            sweep_stale_tmp(root)
        tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=root))
        for i, part in enumerate(parts):
            info = {
                "path": part.path,
                "source": part.source,
                "rank": part.rank,
                "rank_origin": part.rank_origin,
                "key": part.key,
                "meta": part.meta,
                "warnings": part.warnings,
            }
            # one record batch, marked as the scale store marks an event table: the store can link
            # this file as the part's table (``DiskStore.put_file``), and every column reads back in
            # one chunk, which the analysis's row takes of string columns want
            part.table = part.table.combine_chunks()  # the same values; its later readers want one chunk too
            table = schema.as_arrow_frame(part.table, {_META_KEY: json.dumps(info, default=str).encode()})
            write_arrow_file(table, tmp / f"part-{i}.arrow", "lz4")
        (tmp / "parts.json").write_text(json.dumps({"n_parts": len(parts)}))
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
        for i, part in enumerate(parts):
            part.cache_file = str(entry / f"part-{i}.arrow")
    except BaseException as exc:  # the half-written entry goes; a failure to cache is ignored, Ctrl-C goes on
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(exc, OSError):
            raise


def sweep_stale_tmp(root: Path, older_than_s: float = STALE_TMP_S) -> list[Path]:
    """Remove the temporary folders of writers killed mid-write (``STALE_TMP_S``); the list removed.
    Once per cache root and process (``store``): a cache holds an entry per file ever read."""
    now, removed = time.time(), []
    try:
        tmps = [p for p in root.iterdir() if p.name.startswith(_TMP_PREFIX)]
    except OSError:
        return removed
    for p in tmps:
        try:
            if now - p.stat().st_mtime < older_than_s:
                continue
        except OSError:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def table_with_rank(table: pa.Table, rank: int) -> pa.Table:
    idx = table.schema.get_field_index("rank")
    return table.set_column(idx, "rank", pa.array(np.full(table.num_rows, rank, dtype=np.int32)))
