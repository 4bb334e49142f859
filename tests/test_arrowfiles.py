"""``profkit.arrowfiles`` writes the bytes ``pyarrow.feather`` writes and reads what it reads, on the
calling thread, with pyarrow's default pool (the system allocator inside an analysis)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pytest

from profkit.arrowfiles import read_arrow_file, write_arrow_file
from profkit.ingest.loader import read_file
from profkit.scale.allocator import system_arrow_pool

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "sample_traces/engine-dep2-h200/torch_clean/trace/rank1.pt.trace.json.gz"


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> pa.Table:
    """A real rank's event table (strings, dictionaries, nulls), with schema metadata."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        [part] = read_file(TRACE)
    table = part.table.combine_chunks()
    assert table.num_rows > 1000
    return table.replace_schema_metadata({b"profkit.test": b"kept"})


@pytest.mark.parametrize("compression", ["lz4", None])
def test_same_bytes_as_feather(events, tmp_path, compression):
    ours, theirs = tmp_path / "ours.arrow", tmp_path / "theirs.arrow"
    write_arrow_file(events, ours, compression)
    feather.write_feather(events, theirs, compression=compression or "uncompressed", chunksize=events.num_rows)
    assert ours.read_bytes() == theirs.read_bytes()
    if compression:  # compressed indeed (the table is repetitive): the option reached the writer
        assert ours.stat().st_size < 0.5 * events.nbytes


def test_reads_what_feather_reads(events, tmp_path):
    path = tmp_path / "t.arrow"
    write_arrow_file(events, path, "lz4")
    whole = read_arrow_file(path)
    assert whole.equals(feather.read_table(path)) and whole.schema.metadata == events.schema.metadata
    assert [c.num_chunks for c in whole.columns] == [1] * whole.num_columns
    names = events.column_names
    for asked in ([names[3], names[0], names[5]], sorted([names[3], names[0], names[5]])):
        part = read_arrow_file(path, asked)
        # always in the order asked, as ``MemoryStore.get`` gives them (``feather.read_table`` gives
        # the file's order where the names asked happen to be in alphabetical order)
        assert part.column_names == asked
        assert part.equals(feather.read_table(path, columns=asked).select(asked))
        assert part.schema.metadata == events.schema.metadata


def test_missing_column_names_the_file(events, tmp_path):
    path = tmp_path / "t.arrow"
    write_arrow_file(events, path)
    with pytest.raises(KeyError, match=r"t\.arrow.*no_such_column"):
        read_arrow_file(path, ["name", "no_such_column"])


def test_buffers_come_from_pyarrows_default_pool(events, tmp_path):
    """Inside an analysis (``system_arrow_pool``) the read's buffers are the system allocator's:
    ``feather.read_table`` would take them from mimalloc, Arrow's C++ default."""
    path = tmp_path / "t.arrow"
    write_arrow_file(events, path, "lz4")
    system = pa.system_memory_pool()
    with system_arrow_pool() as changed:
        if not changed:
            pytest.skip("pyarrow's default pool is the system allocator already (or PROFKIT_MALLOC=0)")
        before = system.bytes_allocated()
        table = read_arrow_file(path)
        assert system.bytes_allocated() - before >= 0.9 * table.nbytes
