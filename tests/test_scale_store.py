"""A rank read from one file keeps its stored part as its events (moved, not converted and written
again), on both stores, and a retried prepare task finds it already moved."""
from __future__ import annotations

from pathlib import Path

import pytest

from profkit import schema
from profkit.ingest.loader import read_file
from profkit.analyze import stages
from profkit.analyze.store import DiskStore, MemoryStore

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "sample_traces/engine-dep2-h200/torch_clean/trace/rank1.pt.trace.json.gz"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("PROFKIT_CACHE_DIR", str(cache))
        [part] = read_file(TRACE)
    return part


@pytest.mark.parametrize("store_kind", ["disk", "memory"])
def test_one_part_becomes_the_rank_events(result, store_kind, tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    store = DiskStore(tmp_path / "scratch") if store_kind == "disk" else MemoryStore()
    out = stages.read_file_task(0, str(TRACE), None, store)
    [info] = out.parts
    prep = stages.prepare_task(7, [info.store_key], store, None)
    assert not store.has(info.store_key) and store.has(stages.events_key(7))  # moved, not copied
    events = stages.rank_events(store, 7)
    schema.validate(events)
    assert prep.n_events == len(events) == result.table.num_rows
    assert set(events["rank"].tolist()) == {7}  # filled on load: the part was stored before ranks were known
    expected = schema.to_frame(result.table)
    for column in ("kind", "name", "start_ns", "end_ns", "pid", "correlation"):
        assert events[column].equals(expected[column]), column
    again = stages.prepare_task(7, [info.store_key], store, None)  # a retried task: the part is gone
    assert again.n_events == prep.n_events and again.markers == prep.markers
    store.close()


def _inode(path: Path) -> int:
    return path.stat().st_ino


def test_a_cached_part_is_the_store_file_cold_and_warm_and_copied_across_file_systems(result, tmp_path, monkeypatch):
    """The read task hands the store the parsed-trace cache's own file (a hard link: no second
    encode and write of the table, and a warm run reads nothing); where a link cannot be made
    (another file system) its bytes are copied; without a cache the table is written as before.
    Each way the rank's events are the reader's table."""
    import os

    cache = tmp_path / "cache"
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(cache))
    expected = schema.to_frame(result.table)

    def events_of(store: DiskStore, rank: int) -> Path:
        out = stages.read_file_task(0, str(TRACE), None, store)
        [info] = out.parts
        stored = store.root / f"{info.store_key}.arrow"
        inode, links = _inode(stored), stored.stat().st_nlink
        stages.prepare_task(rank, [info.store_key], store, None)
        events = stages.rank_events(store, rank)
        for column in schema.COLUMNS:
            if column != "rank":
                assert events[column].equals(expected[column]), column
        assert set(events["rank"].tolist()) == {rank}
        return inode, links

    cold = events_of(DiskStore(tmp_path / "cold"), 1)
    [cached] = list(cache.rglob("part-0.arrow"))
    assert cold == (_inode(cached), 2)  # the cache's file, linked
    warm = events_of(DiskStore(tmp_path / "warm"), 2)
    assert warm[0] == _inode(cached) and warm[1] == 3  # a cache hit: linked again, nothing decoded or written

    def no_link(src, dst):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    copied = events_of(DiskStore(tmp_path / "copied"), 3)
    assert copied[0] != _inode(cached) and copied[1] == 1
    monkeypatch.undo()
    monkeypatch.setenv("PROFKIT_CACHE", "0")
    written = events_of(DiskStore(tmp_path / "uncached"), 4)
    assert written[1] == 1


def _prepare_facts(p, clock) -> tuple:
    return p.rank, p.n_events, p.markers, clock.rank, clock.window, clock.warnings


def test_the_read_task_prepares_a_one_part_file_and_the_prepare_stage_adopts_it_only_as_its_rank(tmp_path, monkeypatch):
    """A file of one part that names its rank is prepared inside its read task; the prepare stage
    adopts that (moving its tables to the rank's keys) where the part alone became that rank, and
    prepares the rank as usual where the resolution made the part another rank. Either way the
    facts are those of a plain prepare of the same rank."""
    import pandas as pd

    from profkit.analyze.pipeline import prepare_ranks
    from profkit.ingest.loader import Capture

    monkeypatch.setenv("PROFKIT_CACHE", "0")
    ex = stages.SerialExecutor()
    no_capture = Capture(events=schema.empty_frame(), parts=pd.DataFrame(), meta={}, skipped=[], warnings=[])  # align=False: unread

    def read(store, prepare: bool):
        out = stages.read_file_task(0, str(TRACE), None, store, None, prepare)
        [info] = out.parts
        return info, out.prepared

    def plain(rank: int):
        store = DiskStore(tmp_path / f"plain-{rank}")
        info, prepared = read(store, False)
        assert prepared == {}
        p = stages.prepare_task(rank, [info.store_key], store, None)
        cands = store.get(stages.candidates_key(rank))
        store.close()
        return p, cands

    def files(store) -> list[str]:
        return sorted(x.name for x in store.root.iterdir())

    store = DiskStore(tmp_path / "adopted")
    info, prepared = read(store, True)
    spec = prepared[info.store_key]
    named, clock = spec.rank, spec.clock  # the rank the trace names; its clock facts (the driver drops them)
    [p], _ = prepare_ranks(no_capture, {named: [info.store_key]}, store, ex, None, align=False, prepared=prepared)
    assert p is spec  # adopted: not prepared twice
    assert files(store) == sorted([f"{stages.events_key(named)}.arrow", f"{stages.candidates_key(named)}.arrow"])
    ref, ref_cands = plain(named)
    assert _prepare_facts(p, clock) == _prepare_facts(ref, ref.clock)
    assert clock.sources.equals(ref.clock.sources) and clock.candidates.equals(ref.clock.candidates)
    assert store.get(stages.candidates_key(named)).equals(ref_cands)
    assert p.span_facts.equals(ref.span_facts) and p.span_samples.equals(ref.span_samples)
    assert stages.rank_events(store, named).equals(stages.rank_events(_stored(tmp_path / "events", named), named))

    other = named + 5  # the resolution gave the part another rank: prepared again, as that rank
    store = DiskStore(tmp_path / "not-adopted")
    info, prepared = read(store, True)
    [p], _ = prepare_ranks(no_capture, {other: [info.store_key]}, store, ex, None, align=False, prepared=prepared)
    ref, ref_cands = plain(other)
    assert p is not prepared[info.store_key] and (p.rank, p.n_events, p.markers) == (other, ref.n_events, ref.markers)
    assert store.get(stages.candidates_key(other)).equals(ref_cands)
    assert files(store) == sorted([f"{stages.events_key(other)}.arrow", f"{stages.candidates_key(other)}.arrow"])


def _stored(root: Path, rank: int) -> DiskStore:
    """The rank's events as the prepare stage stores them without a read task's help."""
    store = DiskStore(root)
    [info] = stages.read_file_task(0, str(TRACE), None, store).parts
    stages.prepare_task(rank, [info.store_key], store, None)
    return store


def _every_kind(n: int):
    """A frame of every column type the stages store (and rarer ones that take pandas' own way)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    rng = np.random.default_rng(n)
    names = np.array(["nccl:all_reduce", "<script>alert(1)</script>", "ünïcode", ""], dtype=object)
    obj = names[rng.integers(0, 4, n)].copy()
    obj[::3] = None
    return pd.DataFrame({
        "rank": rng.integers(0, 64, n, dtype=np.int64),
        "small": rng.integers(0, 9, n).astype(np.uint8),
        "share": np.where(rng.random(n) < 0.2, np.nan, rng.random(n)),
        "flag": rng.random(n) < 0.5,
        "where": obj,
        "str": pd.array(obj, dtype="str"),
        "string": pd.array(obj, dtype="string"),
        "python_string": pd.array(obj, dtype=pd.StringDtype("python")),
        "seq": pd.array(np.where(rng.random(n) < 0.3, None, rng.integers(0, 9, n)), dtype="Int64"),
        "ok": pd.array(np.where(rng.random(n) < 0.3, None, rng.random(n) < 0.5), dtype="boolean"),
        "phase": pd.Categorical(names[rng.integers(0, 3, n)]),
        "when": pd.to_datetime(rng.integers(0, 10**12, n)),
        "name": pd.array(obj, dtype=pd.ArrowDtype(pa.string())),
        "ns": pd.array(np.where(rng.random(n) < 0.3, None, rng.integers(0, 9, n)), dtype=pd.ArrowDtype(pa.int64())),
        "nothing": pd.Series([None] * n, dtype=object),
    })


def _by_pandas(frame):
    """The store's conversion before it went column by column: pandas' own both ways, Arrow-typed
    columns read back as ``ArrowDtype``, object columns' missing values as None."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    table = pa.Table.from_pandas(frame, preserve_index=False)
    out = table.to_pandas()
    for c in frame.columns:
        if isinstance(frame[c].dtype, pd.ArrowDtype):
            out[c] = table.select([c]).to_pandas(types_mapper=pd.ArrowDtype)[c]
        elif frame[c].dtype == object:
            out[c] = pd.Series(np.asarray(table.column(c).to_numpy(zero_copy_only=False), dtype=object), dtype=object)
    return out


@pytest.mark.parametrize("n", [0, 1, 257])
@pytest.mark.parametrize("store_kind", ["disk", "memory"])
def test_store_round_trip_is_pandas_own_for_every_column_type(n, store_kind, tmp_path):
    """The store converts columns one by one (pandas' conversion costs ~1-3 ms a table, on every
    round trip of every rank); what comes back is what ``to_pandas`` of ``Table.from_pandas`` gives,
    dtypes, missing values and None included, one column type at a time and all together."""
    import pandas as pd

    from profkit.analyze.store import frame_to_table, table_to_frame

    frame = _every_kind(n)
    store = DiskStore(tmp_path / "scratch") if store_kind == "disk" else MemoryStore()
    for cols in [[c] for c in frame.columns] + [list(frame.columns)]:
        part = frame[cols]
        by_pandas = _by_pandas(part)
        store.put_table("t", frame_to_table(part))
        back = table_to_frame(store.get_table("t"))
        pd.testing.assert_frame_equal(back, by_pandas, check_exact=True)
        for c in part.columns:
            if part[c].dtype == object:  # None stays None (not NaN), as the stages test it
                assert [v is None for v in back[c]] == [v is None for v in part[c]], c
    store.close()


def test_store_reads_a_table_without_profkits_kinds_and_refuses_duplicate_names():
    import pandas as pd
    import pyarrow as pa

    from profkit.analyze.store import frame_to_table, table_to_frame

    plain = pa.table({"a": [1, 2], "b": ["x", None]})
    pd.testing.assert_frame_equal(table_to_frame(plain), plain.to_pandas())
    with pytest.raises(ValueError, match="column names must differ"):  # as pandas' conversion refused them
        frame_to_table(pd.DataFrame([[1, 2], [3, 4]], columns=["a", "a"]))


@pytest.mark.parametrize("store_kind", ["disk", "memory"])
@pytest.mark.parametrize("n", [0, 1, 300])
def test_coded_text_columns_come_back_as_the_text_columns_with_their_codes_known(store_kind, n, tmp_path):
    """``as_strings`` columns (``distinct.coded`` Categoricals, as the rank task makes its pieces and
    charged rows) come back from either store as the very columns ``distinct.strings_at`` makes
    (dtype, values, missing ones), and ``distinct.codes`` / ``distinct.factorize`` of them, read
    off the stored codes, are pandas' own factorize of those columns, sorted or not."""
    import numpy as np
    import pandas as pd

    from profkit import distinct

    rng = np.random.default_rng(n)
    names = np.array(["wait:all_reduce", "cpu_op", "Zeta", "gpu:gemm", "ünïcode"], dtype=object)
    codes = rng.integers(-1, len(names), n)
    frame = pd.DataFrame({"rank": np.arange(n, dtype=np.int64), "phase": distinct.coded(names, codes),
                          "kept": distinct.coded(names, np.maximum(codes, 0))})
    want = frame.assign(phase=distinct.strings_at(names, codes))  # "kept" not listed: stored as it is
    store = DiskStore(tmp_path / "scratch") if store_kind == "disk" else MemoryStore()
    store.put("t", frame, as_strings=("phase", "absent"))
    back = store.get("t")
    pd.testing.assert_frame_equal(back.drop(columns="kept"), want.drop(columns="kept"), check_exact=True)
    assert isinstance(back["kept"].dtype, pd.CategoricalDtype)  # pandas' own round trip, as before
    assert back["kept"].astype(object).tolist() == frame["kept"].astype(object).tolist()
    for sort in (False, True):
        got_c, got_u = distinct.factorize(back["phase"], sort=sort)
        want_c, want_u = pd.factorize(want["phase"], sort=sort, use_na_sentinel=True)
        assert np.array_equal(got_c, want_c)
        pd.testing.assert_index_equal(got_u, want_u)
    assert np.array_equal(distinct.text_objects(back["phase"]), want["phase"].astype(str).to_numpy(dtype=object)) \
        or (codes < 0).any()
    only = store.get("t", ["phase"])  # a selection keeps the codes too
    pd.testing.assert_series_equal(only["phase"], want["phase"])
    store.close()


def test_small_tables_are_stored_as_they_are_and_large_ones_compressed(tmp_path):
    """``store.COMPRESS_MIN_BYTES``: under it a table is written without lz4 (its fixed cost per
    column is more than it saves there), from it on with lz4; both read back the same."""
    import numpy as np
    import pandas as pd

    from profkit.analyze import store as store_mod

    disk = DiskStore(tmp_path)
    rows = store_mod.COMPRESS_MIN_BYTES // 8
    for key, n in (("small", rows // 4), ("large", rows * 2)):
        frame = pd.DataFrame({"ns": np.zeros(n, np.int64)})
        disk.put(key, frame)
        pd.testing.assert_frame_equal(disk.get(key), frame)
    small, large = (disk._path(k).stat().st_size for k in ("small", "large"))
    assert small >= rows // 4 * 8  # the bytes as they are
    assert large < rows * 2 * 8 // 20  # zeros: lz4 makes them a small fraction


CAPTURE = REPO / "sample_traces/engine-dep4-h200-capture/torch_faults"  # a profkit capture: spans + torch per rank


def test_a_rank_of_two_files_is_prepared_once_after_its_parts_are_joined(monkeypatch):
    """A profkit capture writes each rank a span file and a torch trace; each names its rank, but
    the rank's events are both. The read tasks prepare neither file as the rank (that prepare
    would be thrown away: the prepare stage joins the parts and prepares the rank again); a file
    whose rank has no other file read is still prepared in its read task. The tables are the same
    either way (every output: ``tests/test_analyze_golden.py``)."""
    from profkit.ingest.manifest import manifest_facts
    from profkit.scale import analyze_paths

    files = sorted([*CAPTURE.glob("spans-pid*.jsonl"), *(CAPTURE / "torch").glob("*.pt.trace.json.gz")])
    assert len(files) == 8
    facts = manifest_facts(files)
    assert facts.files_of_shared_ranks(files) == {p.resolve() for p in files}
    torch_only = [p for p in files if p.parent.name == "torch"]
    assert facts.files_of_shared_ranks(torch_only) == set()  # read alone, each trace is its rank

    monkeypatch.setenv("PROFKIT_CACHE", "0")
    prepared: list[int] = []
    real = stages._prepare_events

    def counted(rank, *args, **kwargs):
        prepared.append(rank)
        return real(rank, *args, **kwargs)

    monkeypatch.setattr(stages, "_prepare_events", counted)
    whole = analyze_paths([CAPTURE], executor="serial")
    assert sorted(prepared) == [0, 1, 2, 3], prepared  # once a rank (12 before: each file, then the rank)
    prepared.clear()
    alone = analyze_paths([CAPTURE / "torch"], executor="serial")
    assert sorted(prepared) == [0, 1, 2, 3], prepared  # in the read tasks, adopted
    assert whole.ranks["rank"].tolist() == alone.ranks["rank"].tolist() == [0, 1, 2, 3]


def test_files_of_shared_ranks_reads_each_manifest_s_ranks_on_their_own(tmp_path):
    """The same rank number in two captures is two ranks; a rank's files count only where they are
    read; a manifest that is not profkit's, or a rank without files, gives none."""
    import json

    from profkit.ingest.manifest import manifest_facts

    def capture(name: str, ranks: dict[int, list[str]]) -> list[Path]:
        folder = tmp_path / name
        paths = []
        for files in ranks.values():
            for f in files:
                (folder / f).parent.mkdir(parents=True, exist_ok=True)
                (folder / f).write_text("{}")
                paths.append(folder / f)
        doc = {"profkit_capture": 1, "ranks": [{"rank": r, "pids": [], "files": f} for r, f in ranks.items()]}
        (folder / "manifest.json").write_text(json.dumps(doc))
        return paths

    a = capture("a", {0: ["spans-pid1.jsonl", "torch/rank0.pt.trace.json.gz"], 1: ["spans-pid2.jsonl"]})
    b = capture("b", {0: ["spans-pid3.jsonl"]})
    facts = manifest_facts([*a, *b])
    assert facts.files_of_shared_ranks([*a, *b]) == {a[0].resolve(), a[1].resolve()}
    assert facts.files_of_shared_ranks([a[0], a[2], *b]) == set()  # rank 0's trace not read
    (tmp_path / "b" / "manifest.json").write_text(json.dumps({"ranks": [{"rank": 0, "files": ["spans-pid3.jsonl"]}]}))
    assert manifest_facts(b).rank_files == {}  # not a profkit capture's manifest
