"""Typed decoding (msgspec structs) and the compiled scanner read every trace exactly as the dict
path (orjson) does.

The reader decodes each piece of the event array into ``typedjson.TraceEvent`` structs and falls
back to orjson dicts for a piece with a field of another shape; the dict path is the defining one.
Where numba is installed, large files are read by ``jsonscan`` into columns instead, and a piece
it declines is decoded the typed way. These tests read the same bytes all three ways (the scanner
forced on, whatever the file's size) and compare everything the reader returns.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from profkit.ingest import jsonio, kineto, scanned
from profkit.ingest.kineto import read_kineto
from profkit.ingest.typedjson import MetaArgs, TraceArgs, TraceEvent, args_dict, decode_piece, event_dict, is_typed

REPO = Path(__file__).resolve().parents[1]


def read_both(path: Path, monkeypatch, chunk: int | None = None):
    """(typed, dict-path) parts of one file, read with the same piece size; the file read by the
    scanner too (its piece size ``chunk`` as well) must give the same as the typed read. Without
    numba the typed and dict reads are still compared."""
    native = None
    with monkeypatch.context() as m:
        if chunk:
            m.setattr(jsonio, "CHUNK_BYTES", chunk)
            m.setattr(scanned, "CHUNK_BYTES", chunk)
        if scanned.available():
            m.setattr(scanned, "MIN_FILE_BYTES", 0)
            [native] = read_kineto(path)
        m.setenv(scanned.NO_JIT_ENV, "1")
        [typed] = read_kineto(path)
        m.setattr(kineto, "decode_piece", jsonio._orjson_list)
        [plain] = read_kineto(path)
    if native is not None:
        assert_same(native, typed)
    return typed, plain


def assert_same(typed, plain) -> None:
    assert typed.table.equals(plain.table), "the two reads give different tables"
    assert typed.warnings == plain.warnings
    assert json.dumps(typed.meta, sort_keys=True, default=str) == json.dumps(plain.meta, sort_keys=True, default=str)
    assert (typed.rank, typed.rank_origin) == (plain.rank, plain.rank_origin)


@pytest.mark.parametrize("rel", [
    "hta/negative_queue_length_rank0.json.gz",
    "tracelens/sglang_qwen3-8b_decode/sglang_Qwen3-8B_decode.json.gz",
    "tracelens/vllm_b200_tp8_eager/eager_trace.json.gz",
])
def test_real_traces_read_the_same_both_ways(shared_traces, rel, monkeypatch, kernel):
    typed, plain = read_both(shared_traces / rel, monkeypatch)
    assert_same(typed, plain)
    assert typed.table.num_rows > 1000


def test_real_capture_with_collectives_reads_the_same_in_small_pieces(monkeypatch):
    path = REPO / "sample_traces/engine-dep4-h200-capture/torch_faults/torch/rank1-pid1831.pt.trace.json.gz"
    typed, plain = read_both(path, monkeypatch, chunk=16 << 10)
    assert_same(typed, plain)
    assert typed.table["coll_name"].null_count < typed.table.num_rows  # collectives were read


def test_typed_pieces_are_structs_and_odd_shapes_fall_back_to_dicts():
    good = b'[{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2, "pid": 1, "tid": "s",' \
           b' "args": {"device": 0, "Collective name": null, "Input Dims": [[1, 2]]}}]'
    [e] = decode_piece(good)
    assert type(e) is TraceEvent and type(e.args) is TraceArgs
    assert args_dict(e.args) == {"device": 0, "Collective name": None}  # presence of a null key is kept
    for odd in (b'[{"ph": "X", "ts": [1]}]', b'[{"ph": "X", "pid": 18446744073709551616}]', b'[3, {"ph": "X"}]',
                b'[{"ph": "X", "args": {"Seq": {"a": 1}}}]', b'[{"ph": "X", "ph": "f"}]', b'[{"ph": "Q"}]', b'[{"ts": 1}]',
                b'[{"ph": 1}]'):
        events = decode_piece(odd)
        assert events is not None and not is_typed(events) and all(type(x) is not TraceEvent for x in events), odd
    assert decode_piece(b'[{"ph": "X", "name": "cut') is None  # not JSON: the caller tries another cut


def test_metadata_args_apart_and_unread_args_skipped(tmp_path, monkeypatch):
    """M events' args decode to MetaArgs (names only), X and instant args to TraceArgs; the args of
    phases no reader reads (B/E, counters) are skipped unbuilt, so odd values there keep the piece
    typed. Read both ways, the file gives the same table, names and warnings."""
    events = [
        {"ph": "M", "name": "process_labels", "pid": 1, "args": {"labels": "CPU", "device": [1]}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main", "Seq": {"a": 1}}},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 5, "args": {"Seq": [1, 2]}},
        {"ph": "B", "name": "span", "cat": "user_annotation", "pid": 1, "tid": 2, "ts": 1, "args": {"x": {}}},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 9, "args": [1]},
        {"ph": "i", "name": "mark", "pid": 1, "tid": 2, "ts": 3, "args": {"Collective name": "allreduce", "Seq": 3}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 2, "dur": 1,
         "args": {"device": 0, "stream": 7, "correlation": 1, "name": [1]}},
    ]
    piece = decode_piece(json.dumps(events).encode())
    assert is_typed(piece)
    assert type(piece[0].args) is MetaArgs and args_dict(piece[0].args) == {"labels": "CPU"}
    assert args_dict(piece[1].args) == {"name": "main"}
    assert "args" not in event_dict(piece[2]) and "args" not in event_dict(piece[3])
    assert type(piece[5].args) is TraceArgs and args_dict(piece[5].args) == {"Collective name": "allreduce", "Seq": 3}
    assert args_dict(piece[6].args) == {"device": 0, "stream": 7, "correlation": 1}
    path = tmp_path / "phases.json"
    path.write_text(json.dumps({"traceEvents": events}))
    typed, plain = read_both(path, monkeypatch)
    assert_same(typed, plain)
    assert typed.table.num_rows == 3 and typed.meta["metadata_events"] == 2  # span, instant, kernel
    # rows in file order, the B/E span last: the instant's collective args are read
    assert typed.table["coll_name"].to_pylist() == ["all_reduce", None, None]
    assert typed.table["coll_seq"].to_pylist() == [3, None, None]


def test_hypothesis_random_events_read_the_same_both_ways(tmp_path_factory, monkeypatch):
    """Events with fields of every shape (missing, null, numbers as strings, huge ints, bools, lists),
    first-seen categories, collectives, instants, B/E pairs, flows and metadata: same table, warnings, meta."""
    from hypothesis import HealthCheck, example, given, settings
    from hypothesis import strategies as st

    # shapes the typed decoder takes (most pieces), and shapes that send a piece to the dict path
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.integers(-5, 5),
                       st.floats(allow_nan=False, allow_infinity=False, width=64), st.text(max_size=6),
                       st.sampled_from(["12", "stream 7", "GPU 0", "Float", "BFloat16", "allreduce", "_allgather_base"]))
    odd = st.one_of(st.integers(2**63, 2**70), st.lists(st.integers(0, 3), max_size=2),
                    st.dictionaries(st.sampled_from("ab"), st.integers(), max_size=1))

    def events_of(value):
        arg_keys = st.sampled_from(["device", "stream", "correlation", "bytes", "Collective name", "Process Group Name",
                                    "Seq", "Sequence number", "In msg nelems", "dtype", "name", "labels"])
        args = st.one_of(st.none(), st.just({}), st.lists(st.integers(0, 3), max_size=2), value,
                         st.dictionaries(arg_keys, value, max_size=5).map(lambda d: {**d, "Input Dims": [[1, 2], []]}))
        cats = st.sampled_from(["kernel", "cuda_runtime", "cpu_op", "user_annotation", "gpu_memcpy", "python_function",
                                "ac2g", "Trace", "weird", 7, None])
        names = st.one_of(st.sampled_from(["ncclDevKernel_AllReduce_Sum", "rcclKernel_x", "process_labels",
                                           "thread_name", "gemm", "aten::mm"]), value)
        return st.fixed_dictionaries(
            {"ph": st.sampled_from(["X", "X", "X", "X", "i", "B", "E", "s", "f", "M", "C", None, 1])},
            optional={"cat": cats, "name": names, "ts": st.one_of(st.floats(0, 1e7), st.integers(0, 10**7), value),
                      "dur": st.one_of(st.floats(0, 1e3), st.integers(-2, 10**3), value),
                      "pid": st.one_of(st.integers(0, 3), value), "tid": st.one_of(st.integers(0, 3), value),
                      "args": args, "id": st.integers(0, 9)},
        )

    clean = events_of(scalar)
    any_shape = events_of(st.one_of(scalar, odd))
    small = st.one_of(st.integers(0, 3), st.none(), st.sampled_from(["12", "stream 7"]), scalar)
    typical = st.fixed_dictionaries({  # the common shape: the reader's fast path
        "ph": st.just("X"),
        "cat": st.sampled_from(["kernel", "cuda_runtime", "cpu_op", "user_annotation", "gpu_memcpy", "gpu_memset",
                                "python_function", "cuda_driver", "weird"]),
        "name": st.sampled_from(["ncclDevKernel_AllReduce_Sum", "ncclKernel_Generic", "gemm", "record_param_comms"]),
        "ts": st.floats(0, 1e7), "dur": st.one_of(st.floats(0, 1e3), st.integers(0, 10)),
        "pid": small, "tid": small,
        "args": st.dictionaries(st.sampled_from(["device", "stream", "correlation", "bytes", "Collective name",
                                                 "Process Group Name", "Seq", "Sequence number", "In msg nelems",
                                                 "dtype"]), small, max_size=6),
    })
    pieces = {"typed": 0, "dicts": 0, "scanned": 0}

    def counting(data):
        out = decode_piece(data)
        if out:
            pieces["typed" if is_typed(out) else "dicts"] += 1
        return out

    scan = scanned.decode

    def counting_scans(data):
        out = scan(data)
        pieces["scanned"] += type(out) is scanned.ScannedPiece
        return out

    monkeypatch.setattr(kineto, "decode_piece", counting)
    monkeypatch.setattr(scanned, "decode", counting_scans)
    folder = tmp_path_factory.mktemp("typed")

    # two fixed examples always run, so both decoding paths are exercised whatever the random draws:
    # common kernel rows in 1 KiB pieces (typed) and the same rows with a pid past int64 (dict fallback)
    rows = [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": float(i), "dur": 1.0, "pid": 0, "tid": 7,
             "args": {"device": 0, "stream": 7, "correlation": i}} for i in range(80)]
    odd_rows = [{**row, "pid": 2**64 + 1} if i % 8 == 0 else row for i, row in enumerate(rows)]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @example(events=rows, chunk=1 << 10, base=None)
    @example(events=odd_rows, chunk=1 << 10, base=1_700_000_000_000_000_000)
    @given(events=st.one_of(st.lists(st.one_of(typical, typical, typical, clean), max_size=80),
                            st.lists(any_shape, max_size=40)),
           chunk=st.sampled_from([1 << 10, 4 << 10, 1 << 20]),
           base=st.sampled_from([None, 1_700_000_000_000_000_000]))
    def check(events, chunk, base):
        doc = {"traceEvents": events}
        if base is not None:
            doc["baseTimeNanoseconds"] = base
        path = folder / "t.json"
        path.write_text(json.dumps(doc))
        typed, plain = read_both(path, monkeypatch, chunk=chunk)
        assert_same(typed, plain)

    check()
    # every path was exercised: the fixed examples alone give 8+ typed and 8+ dict pieces (two reads
    # each), and the scanner reads the common rows' pieces (the odd rows' pieces it declines)
    assert pieces["typed"] >= 8 and pieces["dicts"] >= 8, pieces
    assert pieces["scanned"] >= 8 if scanned.available() else pieces["scanned"] == 0, pieces  # numba: the fast extra


_MISSING = object()


def _with(args: dict, **values) -> dict:
    out = dict(args)
    for key, value in values.items():
        if value is not _MISSING:
            out[key.replace("_", " ")] = value
    return out


def test_every_combination_of_collective_and_device_args_reads_the_same_both_ways(tmp_path, monkeypatch):
    """The args a reader interprets, every combination of missing / null / number / numeric string /
    bool / float / other string, on host and GPU rows: the typed fast path equals the dict path."""
    import itertools

    M = _MISSING
    events = [{"ph": "X", "cat": cat, "name": "warm-up", "ts": 0.0, "dur": 1.0, "pid": 1, "tid": 1, "args": {}}
              for cat in ("cpu_op", "kernel", "user_annotation", "gpu_memcpy", "cuda_runtime")]
    i = 0
    for cat, name, cname, seq, seqn, nelems, dtype, group in itertools.product(
            ("cpu_op", "kernel"), ("ncclDevKernel_AllGather_x", "gemm"), (M, None, "allreduce", "_allgather_base", 5),
            (M, None, 3, "4", True, 2.0), (M, 7, "8"), (M, 10, "10", 2.5, True, 3.0),
            (M, "Float", "c10::BFloat16", "weird", 5), (M, None, "0", 1)):
        args = {"Seq": seq, "Sequence number": seqn, "In msg nelems": nelems, "dtype": dtype, "Process Group Name": group}
        args = {k: v for k, v in args.items() if v is not M}
        if cname is not M:
            args["Collective name"] = cname
        events.append({"ph": "X", "cat": cat, "name": name, "ts": float(i), "dur": 1.0, "pid": 1, "tid": 1, "args": args})
        i += 1
    for cat, dev, stream, corr, nbytes in itertools.product(
            ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cpu_op", "user_annotation"),
            (M, None, 0, "3", "GPU 1", 2.0), (M, None, 7, "stream 9", False), (M, None, 5, "6", 1.5), (M, None, 100, "2")):
        args = {"device": dev, "stream": stream, "correlation": corr, "bytes": nbytes}
        events.append({"ph": "X", "cat": cat, "name": "op", "ts": float(i), "dur": 1.0, "pid": "CPU 2", "tid": 3,
                       "args": {k: v for k, v in args.items() if v is not M}})
        i += 1
    path = tmp_path / "combos.json"
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}))
    for chunk in (None, 4 << 10):
        typed, plain = read_both(path, monkeypatch, chunk=chunk)
        assert_same(typed, plain)
        assert typed.table.num_rows == len(events)
        assert typed.table["coll_seq"].null_count < len(events) and typed.table["bytes"].null_count < len(events)


def test_gzip_without_isal_reads_the_same_and_names_broken_files(shared_traces, monkeypatch, tmp_path):
    """ISA-L inflate is optional: the standard library's gzip gives the same table and the same errors."""
    from profkit.errors import TraceError

    path = shared_traces / "hta/trace_filter_2rank/sampled_rank-0.json.gz"
    [fast] = read_kineto(path)
    gz = path.read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(gz[: len(gz) // 2])
    bad = bytearray(gz)
    bad[len(bad) // 2] ^= 0xFF
    (tmp_path / "flip.json.gz").write_bytes(bytes(bad))
    monkeypatch.setattr(jsonio, "_igzip", None)
    [plain] = read_kineto(path)
    assert plain.table.equals(fast.table)
    with pytest.raises(TraceError, match="truncated gzip"):
        read_kineto(tmp_path / "cut.json.gz")
    with pytest.raises(TraceError, match="gzip|JSON"):
        read_kineto(tmp_path / "flip.json.gz")
