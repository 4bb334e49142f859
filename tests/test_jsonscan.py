"""The compiled scanner (``jsonscan``, read through ``scanned``) against the typed reader.

``test_typedjson`` reads real and random traces all three ways; here the random events are of
the shapes the scanner takes (so most pieces are scanned, not declined), written the ways
writers write them: number literals of every form (exponents, 17+ digits, negative zero, big
integers), compact and indented JSON, raw UTF-8 and escapes, collective args of every kind,
unknown keys with nested values. And pieces it must decline: broken JSON, duplicate keys,
escaped keys, too deep nesting.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("numba")

from profkit.ingest import jsonio, scanned  # noqa: E402
from profkit.ingest.kineto import read_kineto  # noqa: E402
from profkit.ingest.typedjson import decode_piece  # noqa: E402

from test_typedjson import assert_same  # noqa: E402


def read_scanned_and_typed(path: Path, monkeypatch, chunk: int) -> tuple:
    """(scanned, typed) reads of one file with pieces of ``chunk`` bytes, and how many pieces the
    scanner read (not declined)."""
    count = {"scanned": 0, "declined": 0}
    scan = scanned.decode

    def counting(data):
        out = scan(data)
        count["scanned" if type(out) is scanned.ScannedPiece else "declined"] += 1
        return out

    with monkeypatch.context() as m:
        m.setattr(jsonio, "CHUNK_BYTES", chunk)
        m.setattr(scanned, "CHUNK_BYTES", chunk)
        m.setattr(scanned, "MIN_FILE_BYTES", 0)
        m.setattr(scanned, "decode", counting)
        [native] = read_kineto(path)
        m.setenv(scanned.NO_JIT_ENV, "1")
        [typed] = read_kineto(path)
    return native, typed, count


def _number(rng: random.Random, big: float = 1.0) -> str:
    """A JSON number literal as writers write them (``big``: the odds of a 19-digit integer, which
    as a time is out of range: its row is dropped, so its piece is declined)."""
    form = rng.randrange(9) if rng.random() < big else rng.randrange(8)
    if form == 0:
        return str(rng.randrange(0, 10**7))
    if form == 1:  # Kineto's relative µs with ns decimals
        return f"{rng.uniform(0, 1e10):.3f}"
    if form == 2:  # epoch µs with decimals: 19+ digits, past the exact fast path
        return f"{rng.randrange(1_600_000_000_000_000, 1_800_000_000_000_000)}.{rng.randrange(1000):03d}"
    if form == 3:
        return repr(rng.uniform(0, 1e4))  # shortest repr: up to 17 digits
    if form == 4:
        return f"{rng.uniform(0, 9):.{rng.randrange(1, 25)}f}"  # long fractions
    if form == 5:
        return f"{rng.randrange(1, 10**6)}e{rng.randrange(-30, 5)}"
    if form == 6:
        return f"{rng.uniform(1, 9):.6f}E+{rng.randrange(0, 4)}"
    if form == 7:
        return rng.choice(["0", "0.0", "-0.0", "-0", "1e0", "0.5e-3", "3999999999999999", "1234567890123.4567", "1.7976931348623157e-5"])
    return rng.choice([str(rng.randrange(0, 2**63)), "123456789012345678", "9007199254740993"])  # big integers


_NAMES = ["aten::mm", "ncclDevKernel_AllGather_RING_LL", "rcclKernel_Generic", "ncclKernel_AllReduce_RING_LL_Sum_float",
          "gemm", "núcleo_∑", "名前", "void at::native::k<float, 4>()"]
_ESCAPED = ['quote"d', "back\\slash", "tab\there"]  # names the scanner declines
_CATS = ["kernel", "cuda_runtime", "cpu_op", "user_annotation", "gpu_memcpy", "gpu_memset", "python_function",
         "gpu_user_annotation", "cuda_driver", "ac2g", "weird"]


def _value(rng: random.Random, kinds: str) -> object:
    """A random arg value: i int, n null, s string, o odd (float, bool, list, nested object)."""
    k = rng.choice(kinds)
    if k == "i":  # 10**18 - 1: the longest the scanner reads; x 16 bytes (ComplexDouble) is beyond int64
        return rng.choice([0, 3, 7, 12, 2**40, -1, 10**18 - 1])
    if k == "n":
        return None
    if k == "s":  # "_" names no collective (a kernel's name does)
        return rng.choice(["allreduce", "_allgather_base", "all_to_all", "Float", "c10::BFloat16", "0", "12", "x",
                           "_", "ComplexDouble"])
    return rng.choice([1.5, True, [1, 2], {"a": [1, {"b": None}]}, "esc\\u00e9"])


def _event(rng: random.Random) -> str:
    """One event's JSON text (numbers as raw literals)."""
    if rng.random() < 0.25:
        return json.dumps({"ph": rng.choice("stf"), "id": rng.randrange(100), "pid": 1, "tid": 2, "ts": 1.0,
                           "cat": "ac2g", "name": "", "bp": "e"})
    name = rng.choice(_ESCAPED if rng.random() < 0.002 else _NAMES)
    fields = {"ph": '"X"', "cat": json.dumps(rng.choice(_CATS)),
              "name": json.dumps(name, ensure_ascii=rng.random() < 0.002),
              "ts": _number(rng, 0.005), "dur": _number(rng, 0.005)}
    for key in ("pid", "tid"):
        r = rng.random()
        if r < 0.8:
            fields[key] = str(rng.randrange(0, 5000))
        elif r < 0.9:
            fields[key] = "null"
    if rng.random() < 0.95:
        args: dict = {}
        for key in ("device", "stream", "correlation"):
            if rng.random() < 0.7:
                args[key] = rng.choice([0, 1, 7, 2**31 + 5, None, -3])
        if rng.random() < 0.2:
            args["Collective name"] = _value(rng, "ssssnio")
            for key in ("Process Group Name", "dtype"):
                if rng.random() < 0.8:
                    args[key] = _value(rng, "sssssnio")
            for key in ("Seq", "Sequence number", "In msg nelems"):
                if rng.random() < 0.7:
                    args[key] = _value(rng, "iiiiinso")
        if rng.random() < 0.1:
            args["bytes"] = _value(rng, "iiiiinso")
        if rng.random() < 0.5:
            args["Input Dims"] = [[rng.randrange(9), 4], [], [[1.5e3, -2]]]
            args["Input type"] = ["float", "", "Scalar"]
        fields["args"] = json.dumps(args, ensure_ascii=rng.random() < 0.5)
    if rng.random() < 0.3:
        fields["extra"] = json.dumps({"nested": [True, False, None, {"deep": "x"}], "s": "a,b}{"})
    items = list(fields.items())
    rng.shuffle(items)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in items) + "}"


@pytest.mark.parametrize("seed", range(6))
def test_random_events_of_the_scanned_shapes_read_as_typed(tmp_path, monkeypatch, seed, kernel):
    """Random events (see ``_event``), compact or indented, cut into pieces of 2 KiB .. 1 MiB."""
    rng = random.Random(seed)
    events = [_event(rng) for _ in range(3000)]
    sep = rng.choice([",", ",\n  ", " , "])
    meta = '{"name": "process_labels", "ph": "M", "pid": 7, "tid": 0, "args": {"labels": "CPU"}}'
    text = '{"schemaVersion": 1, "traceEvents": [' + sep.join([meta, *events]) + '], "baseTimeNanoseconds": 1700000000000000000}'
    path = tmp_path / "random.json"
    path.write_text(text, encoding="utf-8")
    for chunk in (2 << 10, 64 << 10, 1 << 20):
        native, typed, count = read_scanned_and_typed(path, monkeypatch, chunk)
        assert_same(native, typed)
        if chunk == 2 << 10:  # ~8 events a piece: the few escaped names and out-of-range times decline some
            assert count["scanned"] >= 5 * count["declined"], count
    assert native.table.num_rows > 2000
    assert native.table["coll_name"].null_count < native.table.num_rows


# a byte that ends a run of plain string bytes (as written in JSON), or a plain one that looks special
_STRING_BYTES = ['\\"', "\\\\", "\\u00e9", "\\n", "é", "名", "\x7f", "!", "#", "[", "]"]


def test_strings_of_every_length_and_position_read_as_typed(tmp_path, monkeypatch, kernel):
    """The scanner skips strings 8 bytes at a time, jumping to the first quote, backslash or
    control byte of a word: every kind of byte at every position of strings of 0-40 bytes, in
    names (a name with an escape declines its piece), args keys, args values and unknown keys,
    read as the typed reader reads them (every piece scanned); and a raw control byte at any
    position is broken JSON."""
    events, broken = [], []
    for length in range(41):
        for at in range(max(length, 1)):
            for special in (_STRING_BYTES if length else [""]):
                text = "a" * at + special + "b" * max(length - at - 1, 0)
                plain = text if "\\" not in special else "a" * length  # names and keys with escapes decline a piece
                events.append('{"ph": "X", "cat": "kernel", "name": "' + plain + '", "ts": 1.5, "dur": 2, "pid": 0, '
                              '"tid": 7, "args": {"device": 0, "' + plain + 'x": "' + text + '", "stream": 3}, '
                              '"' + plain + 'y": ["' + text + '"]}')
            if length:
                broken.append("a" * at + "\x01" + "b" * (length - at - 1))
    path = tmp_path / "strings.json"
    path.write_text('{"traceEvents": [' + ",".join(events) + "]}", encoding="utf-8")
    for chunk in (4 << 10, 1 << 20):
        native, typed, count = read_scanned_and_typed(path, monkeypatch, chunk)
        assert_same(native, typed)
        assert not count["declined"] and native.table.num_rows == len(events), count
    for text in broken:
        for where in (f'"name": "{text}"', f'"args": {{"device": 0, "note": "{text}"}}'):
            data = _piece([ROW, ROW.replace('"name": "k"', where) if "name" in where else ROW.replace('"args": {"device": 0}', where)])
            assert scanned.decode(memoryview(data)) is None, where


def _row(cat: str, name: str, args: dict) -> str:
    return json.dumps({"ph": "X", "cat": cat, "name": name, "ts": 1.5, "dur": 2, "pid": 7, "tid": 1, "args": args})


# (cat, name, args) -> (coll_name, coll_group, coll_seq, bytes): each branch of the collective columns
_COLL_ROWS = [
    (("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", {"device": 0, "Collective name": None, "Seq": 5,
      "Sequence number": 9, "In msg nelems": 10, "dtype": "Float", "Process Group Name": "0"}),
     ("all_reduce", "0", 5, 40)),  # the kernel names it; Seq first
    (("kernel", "ncclDevKernel_AllGather_RING_LL", {"Collective name": "_", "Seq": None, "Sequence number": 3,
      "In msg nelems": 4}), ("all_gather", None, 3, None)),  # no dtype: no bytes
    (("kernel", "gemm", {"Collective name": None, "In msg nelems": 4, "dtype": "Half"}), (None, None, None, 8)),
    (("cpu_op", "record_param_comms", {"Collective name": "_allgather_base", "In msg nelems": 10**18 - 1,
      "dtype": "c10::ComplexDouble"}), ("all_gather", None, None, None)),  # beyond int64
    (("cpu_op", "record_param_comms", {"Collective name": "allreduce", "In msg nelems": -3, "dtype": "Weird",
      "Sequence number": 7, "Seq": None}), ("all_reduce", None, 7, None)),  # an unknown dtype
    (("cpu_op", "record_param_comms", {"Collective name": "broadcast", "In msg nelems": 10**17, "dtype": "Long",
      "Seq": 10**18 - 1}), ("broadcast", None, 10**18 - 1, 8 * 10**17)),
    (("cuda_runtime", "cudaLaunchKernel", {"correlation": 3, "Collective name": "allreduce", "Seq": 1}),
     (None, None, None, None)),  # neither a GPU nor a host row
    (("python_function", "f", {"Collective name": "allreduce", "bytes": 8}), (None, None, None, None)),
    (("gpu_memcpy", "Memcpy HtoD", {"device": 0, "bytes": 4096}), (None, None, None, 4096)),
    (("gpu_memcpy", "Memcpy HtoD", {"device": 0, "bytes": None}), (None, None, None, None)),
    (("kernel", "ncclKernel_SendRecv_RING", {"device": 0, "bytes": 12}), ("send_recv", None, None, None)),
    (("kernel", "ncclDevKernel_Broadcast_RING_LL", {"device": 0}), ("broadcast", None, None, None)),
    (("kernel", "rcclKernel_Generic", {"device": 0}), (None, None, None, None)),
    (("cpu_op", "aten::copy_", {"bytes": 5}), (None, None, None, None)),  # bytes of host rows are not read
    (("gpu_user_annotation", "nccl:all_to_all", {"device": 0, "Collective name": "alltoall",
      "Process Group Name": "pg1", "Sequence number": 2}), ("all_to_all", "pg1", 2, None)),
    (("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", {"device": 0, "Collective name": "allreduce",
      "Seq": "12", "In msg nelems": 2.0, "dtype": "Float"}), ("all_reduce", None, 12, 8)),  # odd: decoded alone
    (("gpu_memcpy", "Memcpy DtoD", {"device": 0, "bytes": "64"}), (None, None, None, 64)),  # odd too
]


def test_each_branch_of_the_collective_columns_reads_as_typed(tmp_path, monkeypatch, kernel):
    """The collective and bytes columns of a scanned piece (worked out per distinct value, with masks)
    against the typed reader's, row by row, for each branch: Seq before Sequence number, nelems x the
    dtype's size (no dtype, an unknown one, beyond int64), a kernel's name where the args name no
    collective, GPU-only bytes, rows that are neither GPU nor host, odd rows decoded alone."""
    rows = [_row(*event) for event, _ in _COLL_ROWS] * 3
    path = tmp_path / "colls.json"
    path.write_text('{"traceEvents": [' + ", ".join(rows) + "]}", encoding="utf-8")
    native, typed, count = read_scanned_and_typed(path, monkeypatch, 1 << 20)
    assert count == {"scanned": 1, "declined": 0}
    assert_same(native, typed)
    table = native.table.select(["coll_name", "coll_group", "coll_seq", "bytes"]).to_pylist()
    assert [tuple(row.values()) for row in table] == [want for _, want in _COLL_ROWS] * 3


def _piece(events: list[str]) -> bytearray:
    return bytearray(("[" + ", ".join(events) + "]").encode())


ROW = '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2, "pid": 0, "tid": 7, "args": {"device": 0}}'


@pytest.mark.parametrize("text", [
    '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2, "ts": 3}',  # a key given twice
    '{"ph": "X", "cat": "kernel", "name": "k", "\\u0074s": 1.5, "dur": 2}',  # an escaped key
    '{"ph": "X", "cat": "kernel", "name": "k\\"q", "ts": 1.5, "dur": 2}',  # an escaped name
    '{"ph": "i", "cat": "cpu_instant_event", "name": "k", "ts": 1.5}',  # another phase
    '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5}',  # no dur
    '{"ph": "X", "cat": "kernel", "name": "k", "ts": "1.5", "dur": 2}',  # ts a string
    '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": -2}',  # a row the reader drops
    '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2, "pid": 1.0}',  # a float id
    '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2, "args": null}',
    '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2, "x": ' + "[" * 70 + "]" * 70 + "}",  # deep
])
def test_pieces_the_scanner_declines_decode_as_before(text, kernel):
    """An element the scanner declines, at the head, in the middle or at the tail of a piece (or
    many of them: past ``MAX_DECLINED`` the rest of the piece is decoded as one): the piece reads
    as the same rows, counts and warnings as the typed decoder makes of it whole; the elements
    around it are still scanned."""
    many = [ROW, text] * (scanned.MAX_DECLINED + 2)
    for events in ([ROW, text], [text, ROW], [ROW, text, ROW, ROW], [text, text, ROW, text], many):
        data = _piece(events)
        got = scanned.decode(memoryview(data))
        assert type(got) is not scanned.ScannedPiece
        assert _rows_of(got) == _rows_of(decode_piece(memoryview(data)))
        if type(got) is scanned.SplitPiece:
            kinds = [type(p) is scanned.ScannedPiece for p in got.parts]
            assert kinds[0] == (events[0] == ROW) and True in kinds
            assert sum(p.rows for p in got.parts if type(p) is scanned.ScannedPiece) >= 1


def _rows_of(decoded) -> tuple:
    """The rows, skip counts and warnings ``EventColumns`` makes of one decoded piece."""
    from profkit.ingest.kineto import kineto_spec
    from profkit.ingest.traceevents import EventColumns

    cols = EventColumns(kineto_spec)
    cols.add(decoded)
    table, _, dropped = cols.table("kineto", 0, [])
    return table.to_pylist(), dict(cols.skipped), dropped


def test_declined_elements_keep_their_bytes(kernel):
    """A declined element cut inside one of its strings (the cut pattern ``},{`` in a name, with
    spaces) or nested objects: what follows is declined with it, so it decodes from its own bytes,
    never re-joined; a stretch that is not JSON declines the whole piece (None, as before)."""
    tricky = [
        '{"ph": "i", "cat": "cpu_instant_event", "name": "a} ,  {b", "ts": 1.5}',
        '{"ph": "M", "name": "x", "pid": 1, "args": {"l": [{"a": 1} , {"ph": "X"}]}}',
    ]
    # a row nested in a declined element: scanned as one of its own after a cut in the list, then
    # what follows it is no separator (or a run that is not JSON): the piece is decoded whole
    nested = ['{"ph": "M", "name": "x", "pid": 1, "args": {"l": [{"a": 1}, ' + ROW + "]}}",
              '{"ph": "M", "name": "x", "pid": 1, "args": {"l": [{"a": 1}, ' + ROW + ', {"b": 2}]}}']
    for text in tricky + nested:
        for events in ([ROW, text, ROW], [text, ROW], [ROW, text]):
            data = _piece(events)
            got = scanned.decode(memoryview(data))
            assert type(got) is (scanned.SplitPiece if text in tricky else list)
            assert _rows_of(got) == _rows_of(decode_piece(memoryview(data)))
    names = [r["name"] for r in _rows_of(scanned.decode(memoryview(_piece([ROW, tricky[0], ROW]))))[0]]
    assert names == ["k", "a} ,  {b", "k"]
    assert scanned.decode(memoryview(_piece([ROW, tricky[0][:-1] + ",}", ROW]))) is None


@pytest.mark.parametrize("text", [
    ROW[:-1],  # cut inside an event (a wrong cut)
    ROW.replace('"k"', '"k'),  # an open string
    ROW.replace("1.5", "1."),  # a number without digits after its point
    ROW.replace("1.5", "01"),  # a leading zero
    ROW.replace('"dur": 2', '"dur": 2,'),  # a trailing comma
    ROW.replace('"k"', '"k\x01"'),  # a control byte in a string
    ROW.replace("0}", "0]"),  # brackets that do not match
    ROW.replace("null", "nul").replace('"device": 0', '"device": nul'),
])
def test_broken_json_is_not_scanned(text, kernel):
    """A cut in the wrong place (or a broken file) must not read as events: the scanner declines
    and the typed decoder says None, as before."""
    data = _piece([ROW, text])
    assert scanned.decode(memoryview(data)) is None


def test_numbers_parse_exactly(kernel):
    """ts of every literal form: the scanner's floats equal Python's (correctly rounded) ones."""
    rng = random.Random(7)
    literals = [_number(rng) for _ in range(4000)] + ["1e-400", "0.1", "0.30000000000000004", "1e14", "1e-23",
                                                      "4503599627370497.5", "9007199254740992.0", "3.99e15"]
    literals = [lit for lit in literals if abs(float(lit)) < 4e15]  # rows beyond are dropped (declined here)
    events = [ROW.replace("1.5", lit) for lit in literals]
    piece = scanned.decode(memoryview(_piece(events)))
    assert type(piece) is scanned.ScannedPiece
    # as a JSON decoder reads them: an integer literal is an int ("-0" is 0), then a float
    expected = np.array([float(int(lit)) if lit.lstrip("-").isdigit() else float(lit) for lit in literals])
    assert np.array_equal(piece.start_us.view(np.int64), expected.view(np.int64))  # bit for bit (-0.0 too)


def test_scanner_is_used_for_large_files_only_until_loaded(monkeypatch, tmp_path):
    """Before the scanner is built (or loaded), a file below ``MIN_FILE_BYTES`` is read the usual
    way; a larger one builds it (else loads the JIT); then it reads every file; ``PROFKIT_NO_JIT``
    switches it off. (A private build folder: nothing is built in it, the build is stubbed.)"""
    from profkit import native
    from profkit.ingest import scanbuild

    monkeypatch.setattr(scanned, "_KERNEL", {})
    monkeypatch.setenv(scanbuild.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    builds = []
    monkeypatch.setattr(scanbuild, "build", lambda: builds.append(1))  # as if it failed: the JIT serves
    assert scanned.decoder(10) is None and not builds
    assert scanned.decoder(scanned.MIN_FILE_BYTES) is scanned.decode and builds == [1]
    assert scanned.decoder(10) is scanned.decode  # loaded by the line above
    monkeypatch.setenv(scanned.MIN_BYTES_ENV, "1e3")
    assert scanned.min_file_bytes() == 1000
    monkeypatch.setenv(scanned.MIN_BYTES_ENV, "many")  # not a number: the default
    assert scanned.min_file_bytes() == scanned.MIN_FILE_BYTES
    assert scanned.available()
    monkeypatch.setenv(scanned.NO_JIT_ENV, "1")
    assert scanned.decoder(scanned.MIN_FILE_BYTES) is None and not scanned.available()


def test_load_reads_large_files_on_threads_with_the_same_result(shared_traces, tmp_path, monkeypatch, kernel):
    """``profkit.load`` reads two or more files the JIT scanner takes on threads (the built one holds
    the GIL: one at a time): the same events, parts, warnings and skipped lines (in file order, a
    broken file among them) as one at a time."""
    import gzip
    import shutil

    from profkit.ingest import loader

    src = shared_traces / "hta/negative_queue_length_rank0.json.gz"
    for i in range(3):
        shutil.copy(src, tmp_path / f"rank{i}.json.gz")
    (tmp_path / "rank3.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": '))  # cut off
    monkeypatch.setenv("PROFKIT_CACHE", "0")
    monkeypatch.setenv(scanned.MIN_BYTES_ENV, "0")
    threads: list[str] = []
    one = loader.read_file

    def read_file(path, pid_to_rank=None):
        import threading

        threads.append(threading.current_thread().name)
        return one(path, pid_to_rank)

    monkeypatch.setattr(loader, "read_file", read_file)
    ranks = {f"rank{i}.json.gz": i for i in range(3)}
    together = loader.load(tmp_path, rank_map=ranks)
    assert any(name.startswith("profkit-read") for name in threads) == (kernel == "jit")
    monkeypatch.setattr(loader, "MAX_READ_THREADS", 1)
    threads.clear()
    alone = loader.load(tmp_path, rank_map=ranks)
    assert not any(name.startswith("profkit-read") for name in threads)
    pd.testing.assert_frame_equal(together.events, alone.events)
    pd.testing.assert_frame_equal(together.parts, alone.parts)
    assert together.skipped == alone.skipped and len(alone.skipped) == 1 and "rank3.json.gz" in alone.skipped[0]
    assert together.warnings == alone.warnings
    assert sorted(together.ranks) == [0, 1, 2]


def test_the_built_scanner_imports_without_numba(shared_traces):
    """Once built, a process reads with the scanner without importing numba (or LLVM): no ~100 MB
    and ~0.4 s of fixed cost, so it serves small files too."""
    import subprocess
    import sys

    from profkit.ingest import scanbuild

    if scanbuild.build() is None:
        pytest.skip("the scanner cannot be built ahead of time here")
    code = ("import sys; from profkit.ingest import scanned; from profkit.ingest.kineto import read_kineto; "
            "[p] = read_kineto(sys.argv[1]); "
            "print(scanned._loaded(), 'numba' in sys.modules, 'llvmlite' in sys.modules, p.table.num_rows)")
    out = subprocess.run([sys.executable, "-c", code, str(shared_traces / "hta/negative_queue_length_rank0.json.gz")],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "False", "67219"], out


def test_a_build_that_fails_is_remembered_and_the_jit_serves(monkeypatch, tmp_path, capsys):
    """No C compiler (or no ``numba.pycc``): the build fails once, says why in a marker file, is
    not tried again, and the decoder falls back to numba's JIT."""
    from profkit import native
    from profkit.ingest import scanbuild

    monkeypatch.setenv(scanbuild.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    calls = []

    def no_compiler(name, where):
        calls.append(name)
        raise OSError("no C compiler")

    monkeypatch.setattr(scanbuild, "_compile", no_compiler)
    assert scanbuild.build() is None and scanbuild.build() is None
    assert len(calls) == 1
    [marker] = tmp_path.glob("*.failed")
    assert "no C compiler" in marker.read_text()
    assert scanbuild.main() == 1  # ``python -m profkit.ingest.scanbuild`` says why
    assert "not built (OSError: no C compiler)" in capsys.readouterr().out
    monkeypatch.setattr(scanned, "_KERNEL", {})
    assert scanned.decoder(scanned.MIN_FILE_BYTES) is scanned.decode
    from profkit.ingest import jsonscan

    assert scanned._KERNEL["scan"] is jsonscan.scan_piece
    assert scanned.threads_help(scanned.MIN_FILE_BYTES)  # the JIT releases the GIL


def test_the_built_module_is_named_for_both_sources(monkeypatch, tmp_path):
    """The scanner compiles in ``scanlayout``'s constants: a change to either file names a new
    module (built again), never a stale one with the old layout."""
    from profkit.ingest import scanbuild

    scan, layout = tmp_path / "jsonscan.py", tmp_path / "scanlayout.py"
    scan.write_text("scanner")
    layout.write_text("C_PID = 8")
    monkeypatch.setattr(scanbuild, "_SOURCES", (scan, layout))
    names = []
    for text in ("C_PID = 8", "C_PID = 9"):
        layout.write_text(text)
        scanbuild._name.cache_clear()
        names.append(scanbuild._name())
    scanbuild._name.cache_clear()
    assert names[0] != names[1] and all(name.startswith("_profkit_jsonscan_") for name in names)


def test_the_built_module_is_named_for_every_profkit_module_the_scanner_imports():
    """Whatever of profkit the scanner's source imports is compiled into the built module with it
    (its layout constants): each such module's file must name the module (``scanbuild._SOURCES``),
    or a change to it would leave a stale build in use."""
    import ast
    import importlib.util

    from profkit.ingest import scanbuild

    tree = ast.parse(scanbuild._SOURCES[0].read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("profkit")}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.name.startswith("profkit")}
    assert imported, "the scanner reads its layout from a profkit module"
    files = {Path(importlib.util.find_spec(m).origin).resolve() for m in imported}
    assert files <= {Path(p).resolve() for p in scanbuild._SOURCES}, (imported, scanbuild._SOURCES)


def test_a_large_json_trace_builds_the_scanner_first_and_says_so(monkeypatch, tmp_path):
    """``load`` (and ``analyze_paths``, in the driver) build the scanner before reading when a JSON
    trace of ``MIN_FILE_BYTES`` or more needs it, with a progress line; never for smaller or other
    files, nor once it is built or its build failed. (A private build folder; the build stubbed.)"""
    from profkit import native
    from profkit.ingest import scanbuild

    monkeypatch.setenv(scanbuild.DIR_ENV, str(tmp_path / "native"))
    monkeypatch.setattr(native, "_loaded", {})
    builds: list[int] = []
    monkeypatch.setattr(scanbuild, "build", lambda: builds.append(1))
    small, big, sqlite = tmp_path / "r0.json.gz", tmp_path / "r1.pt.trace.json.gz", tmp_path / "r2.sqlite"
    for path, size in ((small, 1000), (big, scanned.MIN_FILE_BYTES), (sqlite, 2 * scanned.MIN_FILE_BYTES)):
        with open(path, "wb") as fh:
            fh.truncate(size)  # sparse: the size is all that is read
    said: list[str] = []
    scanned.build_for([small, sqlite], said.append)
    assert not builds and not said
    scanned.build_for([small, big], said.append)
    assert builds == [1] and said == ["building profkit's compiled JSON scanner (once per machine, ~20 s)"]
    (tmp_path / "native").mkdir()
    (tmp_path / "native" / f"{scanbuild._name()}.failed").write_text("OSError: no C compiler\n")
    scanned.build_for([big], said.append)
    assert builds == [1] and len(said) == 1
    monkeypatch.setenv(scanned.NO_JIT_ENV, "1")
    (tmp_path / "native" / f"{scanbuild._name()}.failed").unlink()
    scanned.build_for([big], said.append)
    assert builds == [1]


def test_a_built_scanner_is_loaded_before_the_workers_fork(monkeypatch, tmp_path):
    """``build_for`` (the driver, before a pool forks) loads a scanner built ahead of time, for small
    files too, so forked workers have it; where none is built it loads nothing (never numba's JIT:
    ~100 MB the driver would keep)."""
    import types

    from profkit.ingest import scanbuild

    small = tmp_path / "r0.json.gz"
    small.write_bytes(b"\x1f\x8b" + bytes(998))
    built = types.SimpleNamespace(scan_piece=object(), gather_into=object())
    for module in (None, built):
        monkeypatch.setattr(scanned, "_KERNEL", {})
        monkeypatch.setattr(scanbuild, "compiled", lambda module=module: module)
        monkeypatch.setattr(scanbuild, "build", lambda: pytest.fail("a small file never builds the scanner"))
        scanned.build_for([small])
        assert scanned._KERNEL == ({} if module is None else {"scan": built.scan_piece, "gather": built.gather_into,
                                                                "threads": False})


def test_preload_imports_the_readers_the_files_need(monkeypatch, tmp_path):
    """``readers.preload``: the reader modules for the files' endings are imported (forked workers
    inherit them), not the others."""
    import sys

    from profkit.ingest import readers

    for name in ("profkit.ingest.kineto", "profkit.ingest.nsys"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    readers.preload([tmp_path / "r0.pt.trace.json.gz"])
    assert "profkit.ingest.kineto" in sys.modules and "profkit.ingest.nsys" not in sys.modules


def test_pieces_are_larger_for_large_files_only(tmp_path, monkeypatch):
    """``scanned.chunk_bytes``: a file of ``LARGE_FILE_BYTES`` or more on disk is scanned in
    ``LARGE_CHUNK_BYTES`` pieces (each piece's fixed cost paid a quarter as often), a smaller one
    in ``CHUNK_BYTES`` pieces (the larger pieces' ~40 MB more held at once would weigh on a load
    of small files); ``kineto``'s piece decoder asks it by the file's size (the scanner stubbed:
    this test builds nothing)."""
    from profkit.ingest import kineto

    assert scanned.LARGE_CHUNK_BYTES > scanned.CHUNK_BYTES
    assert scanned.chunk_bytes(None) == scanned.CHUNK_BYTES
    assert scanned.chunk_bytes(scanned.LARGE_FILE_BYTES - 1) == scanned.CHUNK_BYTES
    assert scanned.chunk_bytes(scanned.LARGE_FILE_BYTES) == scanned.LARGE_CHUNK_BYTES
    monkeypatch.setattr(scanned, "decoder", lambda size_bytes=None: scanned.decode)
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    small.write_bytes(b"{}")
    with open(large, "wb") as fh:
        fh.truncate(scanned.LARGE_FILE_BYTES)  # sparse: its size is all that is read
    assert kineto._piece_decoder(small) == (scanned.decode, scanned.CHUNK_BYTES)
    assert kineto._piece_decoder(large) == (scanned.decode, scanned.LARGE_CHUNK_BYTES)
