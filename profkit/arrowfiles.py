"""Arrow IPC files (Feather V2) written and read on the calling thread, with pyarrow's default pool.

The parsed-trace cache and the scale store keep every table in such a file. ``pyarrow.feather``
writes and reads the same bytes, but it compresses the columns on Arrow's own thread pool and takes
its buffers from Arrow's C++ default pool (mimalloc), whatever pyarrow's default pool is. In a pool
worker (one process per core, ``profkit.scale.allocator``'s system pool) that cost: ``perf`` of a
DEP8 x 100 run put two thirds of the workers' page faults on Arrow's threads, in mimalloc's fresh
pages; a rank's 8.5 MB event table written with lz4 took 5-10 ms of CPU, 2.5-3.5 ms here. The file
is the same byte for byte (a test compares them).
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa


def write_arrow_file(table: pa.Table, path: str | Path, compression: str | None = None) -> None:
    """``feather.write_feather(table, path, compression=..., chunksize=table.num_rows)``: one record
    batch (a table of one chunk per column: ``Table.combine_chunks``), ``compression`` "lz4",
    "zstd" or None, on this thread."""
    options = pa.ipc.IpcWriteOptions(compression=compression, use_threads=False)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=max(table.num_rows, 1))


def read_arrow_file(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """The Arrow IPC file at ``path`` as ``feather.read_table(path, columns)`` reads it, on this thread,
    its buffers from pyarrow's default pool. ``columns``: only those, always in the order asked (as
    ``MemoryStore.get`` gives them; ``feather.read_table`` keeps the file's order where the names
    asked are in alphabetical order); a KeyError naming the file for one it lacks."""
    options = pa.ipc.IpcReadOptions(use_threads=False)
    with pa.OSFile(str(path)) as source:
        if columns is not None:
            schema = pa.ipc.open_file(source).schema
            missing = [c for c in columns if schema.get_field_index(c) < 0]
            if missing:
                raise KeyError(f"{path}: no column(s) {missing}")
            options = pa.ipc.IpcReadOptions(use_threads=False,
                                            included_fields=sorted({schema.get_field_index(c) for c in columns}))
        table = pa.ipc.open_file(source, options=options).read_all()
    return table if columns is None else table.select(list(columns))
