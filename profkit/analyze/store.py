"""Where a rank's tables live between the stages of a run: in this process, or in a scratch folder.

Workers of a process pool or a Dask cluster share nothing but the scratch folder, so each stage
reads its rank's tables from the store and writes what the next stage needs back. Tables are
Arrow IPC files (lz4 from ``COMPRESS_MIN_BYTES`` up): our own intermediate tables, never pickles.
On a multi-machine cluster the folder must be one every worker can reach (a shared file system),
as with Nsight's multi-report recipes.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from profkit import distinct, schema
from profkit.analyze.scratch import OwnedFolder
from profkit.arrowfiles import read_arrow_file, write_arrow_file

_KINDS_KEY = schema.FRAME_KINDS_KEY
# tables under this size are written as they are: lz4 costs a fixed ~20-50 us per column both ways,
# more than the bytes it saves (a DEP32 x 100 rank's 0.2-1 MB intermediate tables: 0.4-1 ms to write
# and 0.2-0.4 ms to read each, against half that uncompressed); larger ones (a rank's events, any
# table of a long capture) keep lz4, so the scratch folder stays ~3x smaller where it is large
COMPRESS_MIN_BYTES = 2 << 20
_STRINGS = "strings"  # a text column stored as codes and names (``frame_to_table``'s ``as_strings``)


def _column_kind(dtype) -> str:
    """How a column is stored and comes back: ``arrow`` (``pd.ArrowDtype``), ``object`` (None for
    missing), ``numpy:<dtype>`` (a plain numeric or bool column), ``ext:<name>`` (a pandas
    extension type that reads itself from Arrow and is named by that name alone: ``Int64``, ``str``),
    else ``native`` (through pandas' own metadata: categoricals, dates, anything rarer)."""
    if isinstance(dtype, pd.ArrowDtype):
        return "arrow"
    if isinstance(dtype, np.dtype) and dtype.kind == "O":
        return "object"
    if isinstance(dtype, np.dtype):
        return f"numpy:{dtype.str}" if dtype.kind in "iufb" else "native"
    if isinstance(dtype, pd.CategoricalDtype) or not hasattr(dtype, "__from_arrow__"):
        return "native"
    try:
        same = pd.api.types.pandas_dtype(str(dtype)) == dtype  # e.g. python-backed strings are not "string"
    except TypeError:
        same = False
    return f"ext:{dtype}" if same else "native"


def frame_to_table(frame: pd.DataFrame, as_strings: tuple[str, ...] = ()) -> pa.Table:
    """A DataFrame as an Arrow table that ``table_to_frame`` turns back into the same frame.

    Columns are converted one by one from their arrays: pandas' own conversion (``Table.from_pandas``,
    and ``to_pandas`` reading its metadata back) costs ~1-3 ms a table whatever its size, paid on
    every store round trip of every rank; it is kept only for the rare ``native`` columns.

    ``as_strings``: columns that are Categoricals of distinct strings (``distinct.coded``) standing
    for text columns: stored as their codes and names (an Arrow dictionary), and read back as the
    text column ``distinct.strings_at`` makes of them, its codes known (``distinct.strings_from_codes``).
    A rank's timeline pieces name ~10^5 rows with a few hundred phases: their strings were most
    of the bytes written and read, and each reader factorized them again."""
    names = [str(c) for c in frame.columns]
    if len(set(names)) != len(names):
        raise ValueError(f"a stored table's column names must differ: {names}")
    kinds = {name: _column_kind(dtype) for name, dtype in zip(names, frame.dtypes)}
    for name in as_strings:
        if name in kinds and isinstance(frame[name].dtype, pd.CategoricalDtype):
            kinds[name] = _STRINGS
    legacy = [c for c, name in zip(frame.columns, names) if kinds[name] == "native"]
    pandas_made = pa.Table.from_pandas(frame[legacy], preserve_index=False) if legacy else None
    columns = dict(zip(pandas_made.column_names, pandas_made.columns)) if pandas_made is not None else {}
    for c, name in zip(frame.columns, names):
        kind = kinds[name]
        if kind == "arrow":
            columns[name] = frame[c].array.__arrow_array__()
        elif kind == "object":
            columns[name] = pa.array(frame[c].to_numpy(), from_pandas=True)
        elif kind.startswith("numpy:"):
            columns[name] = pa.array(frame[c].to_numpy())
        elif kind.startswith("ext:"):
            columns[name] = pa.array(frame[c].array)
        elif kind == _STRINGS:
            cat = frame[c].array
            codes = np.asarray(cat.codes, np.int32)
            columns[name] = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0),
                                                           pa.array(list(cat.categories), pa.large_string()))
    meta = dict(pandas_made.schema.metadata or {}) if pandas_made is not None else {}  # the native columns' dtypes
    meta[_KINDS_KEY] = json.dumps(kinds).encode()
    return pa.Table.from_arrays([columns[name] for name in names], names=names, metadata=meta)


def arrow_frame_table(table: pa.Table) -> pa.Table:
    """An Arrow table (e.g. a reader's event table) marked so ``table_to_frame`` gives every column an
    ``ArrowDtype``, as ``frame_to_table`` of its ``schema.to_frame`` would: a part stored this way can
    be read back as a frame without converting it in between."""
    return schema.as_arrow_frame(table)


def table_to_frame(table: pa.Table) -> pd.DataFrame:
    """The frame ``frame_to_table`` stored: same columns, dtypes and values (a fresh 0..n-1 index).
    A table without profkit's kinds (or its ``native`` columns) goes through pandas' conversion."""
    raw = (table.schema.metadata or {}).get(_KINDS_KEY)
    kinds: dict[str, str] = json.loads(raw) if raw else {}
    names = table.column_names
    if not names:
        return pd.DataFrame(index=range(table.num_rows))
    native = [c for c in names if kinds.get(c, "native") == "native"]
    parts: dict = dict(table.select(native).to_pandas().items()) if native else {}
    for name, col in zip(names, table.columns):
        kind = kinds.get(name, "native")
        if kind == "arrow":
            parts[name] = pd.arrays.ArrowExtensionArray(col)
        elif kind == "object":
            values = col.to_numpy(zero_copy_only=False) if col.num_chunks else np.empty(0, dtype=object)
            parts[name] = pd.Series(np.asarray(values, dtype=object), dtype=object, copy=False)  # not inferred as str
        elif kind.startswith("numpy:"):  # a copy: the frame's arrays are writable, as pandas' conversion makes them
            parts[name] = np.array(col.to_numpy(zero_copy_only=False) if col.num_chunks else [], dtype=np.dtype(kind[6:]))
        elif kind.startswith("ext:"):
            parts[name] = pd.api.types.pandas_dtype(kind[4:]).__from_arrow__(col)
        elif kind == _STRINGS:
            parts[name] = _strings_column(col)
    return pd.DataFrame({c: parts[c] for c in names}, index=pd.RangeIndex(table.num_rows), copy=False)


def _strings_column(col: pa.ChunkedArray):
    """A stored ``strings`` column (a dictionary of names) as the text column it stands for."""
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    indices = col.indices.to_numpy(zero_copy_only=False) if col.null_count == 0 else \
        col.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    return distinct.strings_from_codes(np.asarray(col.dictionary.to_pylist(), dtype=object), indices)


def _decoded(frame: pd.DataFrame, as_strings: tuple[str, ...]) -> pd.DataFrame:
    """``frame`` with its ``as_strings`` Categoricals made the text columns they stand for."""
    coded = [c for c in as_strings if c in frame.columns and isinstance(frame[c].dtype, pd.CategoricalDtype)]
    if not coded:
        return frame
    return frame.assign(**{c: distinct.from_coded(frame[c]) for c in coded})


class MemoryStore:
    """Tables kept in this process (the serial in-memory path of ``pipeline.analyze``)."""

    kind = "memory"

    def __init__(self) -> None:
        self._frames: dict[str, pd.DataFrame] = {}
        self._tables: dict[str, pa.Table] = {}

    def put(self, key: str, frame: pd.DataFrame, as_strings: tuple[str, ...] = ()) -> None:
        self._frames[key] = _decoded(frame, as_strings).reset_index(drop=True)

    def get(self, key: str, columns: list[str] | None = None) -> pd.DataFrame:
        if key not in self._frames and key in self._tables:  # a table put as a frame's (``arrow_frame_table``)
            table = self._tables[key]
            return table_to_frame(table.select(list(columns)) if columns is not None else table)
        frame = self._frames[key]
        return frame[list(columns)] if columns is not None else frame

    def put_table(self, key: str, table: pa.Table) -> None:
        self._tables[key] = table

    def get_table(self, key: str) -> pa.Table:
        return self._tables[key]

    def put_file(self, key: str, path: str | Path) -> bool:  # noqa: ARG002 - the caller puts the table
        return False

    def drop(self, key: str) -> None:
        self._frames.pop(key, None)
        self._tables.pop(key, None)

    def has(self, key: str) -> bool:
        return key in self._frames or key in self._tables

    def rename(self, old: str, new: str) -> bool:
        """Move the table under ``old`` to ``new`` (False when ``old`` holds nothing)."""
        if old in self._tables:
            self._tables[new] = self._tables.pop(old)
        elif old in self._frames:
            self._frames[new] = self._frames.pop(old)
        else:
            return False
        return True

    def close(self) -> None:
        self._frames.clear()
        self._tables.clear()


class DiskStore:
    """Arrow IPC files in a scratch folder (a new temporary one unless ``root`` is given)."""

    kind = "disk"

    def __init__(self, root: str | Path | None = None) -> None:
        # a folder of its own is locked while this process (or a worker it forked) lives, and a
        # later run removes it if this one is killed before ``close`` (``scratch``)
        self._owner = OwnedFolder() if root is None else None
        self.root = self._owner.path if self._owner is not None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.arrow"

    def put(self, key: str, frame: pd.DataFrame, as_strings: tuple[str, ...] = ()) -> None:
        self.put_table(key, frame_to_table(frame, as_strings))

    def get(self, key: str, columns: list[str] | None = None) -> pd.DataFrame:
        return table_to_frame(self.get_table(key, columns))

    def put_table(self, key: str, table: pa.Table) -> None:
        path = self._path(key)
        tmp = path.with_suffix(".partial")
        # one record batch: read back, every column is one chunk, which the tasks' many row takes
        # of string columns want (``stages._one_chunk`` would combine the chunks after each read)
        table = table.combine_chunks()
        write_arrow_file(table, tmp, "lz4" if table.nbytes >= COMPRESS_MIN_BYTES else None)
        tmp.replace(path)  # a reader never sees half a file, a retried task overwrites cleanly

    def put_file(self, key: str, path: str | Path) -> bool:
        """Hold the Arrow file at ``path`` (one ``put_table`` wrote, or the parsed-trace cache's) under
        ``key``: a hard link where the folders share a file system, else a copy of its bytes, never
        decoded and written again. False when neither works (the caller puts the table)."""
        dest = self._path(key)
        tmp = dest.with_suffix(".partial")
        tmp.unlink(missing_ok=True)
        try:
            try:
                os.link(path, tmp)
            except OSError:  # another file system, or links not allowed: the bytes
                shutil.copyfile(path, tmp)
            tmp.replace(dest)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False
        return True

    def get_table(self, key: str, columns: list[str] | None = None) -> pa.Table:
        return read_arrow_file(self._path(key), columns)

    def drop(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def has(self, key: str) -> bool:
        return self._path(key).is_file()

    def rename(self, old: str, new: str) -> bool:
        """Move the file under ``old`` to ``new`` (atomic; False when ``old`` holds nothing)."""
        try:
            self._path(old).replace(self._path(new))
        except FileNotFoundError:
            return False
        return True

    def close(self) -> None:
        if self._owner is not None:  # removed, then unlocked (a worker's copy owns nothing)
            self._owner.release()
            self._owner = None

    def __getstate__(self) -> dict:  # workers get the folder, never the ownership
        return {"root": str(self.root)}

    def __setstate__(self, state: dict) -> None:
        self.root, self._owner = Path(state["root"]), None
