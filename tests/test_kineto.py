"""Kineto reader against real public traces (shared/traces, see its MANIFEST) and hostile input."""
from __future__ import annotations

import decimal
import gzip
import json
from collections import Counter
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import orjson
import pyarrow.compute as pc
import pytest
from conftest import SHARED_TRACES

from profkit import schema as S
from profkit.errors import TraceError
from profkit.ingest import jsonio
from profkit.ingest.base import RankPart
from profkit.ingest.kineto import is_kineto, read_kineto, sniff_json

KINETO_FILES = sorted(
    str(p.relative_to(SHARED_TRACES))
    for folder in ("tracelens", "hta")
    for p in (SHARED_TRACES / folder).rglob("*.json.gz")
)
SMALL = "tracelens/sglang_qwen3-8b_decode/sglang_Qwen3-8B_decode.json.gz"  # ROCm, 36 KB
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
CAT_KINDS = {"kernel": S.KERNEL, "gpu_memcpy": S.MEMCPY, "gpu_memset": S.MEMSET}


@lru_cache(maxsize=None)
def part_of(rel: str) -> RankPart:
    [part] = read_kineto(SHARED_TRACES / rel)
    return part


@lru_cache(maxsize=None)
def plain_json(rel: str) -> dict:
    """The oracle: the same file through the standard library, exact decimals."""
    return json.loads(gzip.decompress((SHARED_TRACES / rel).read_bytes()), parse_float=Decimal)


def ns(value: Decimal | int) -> int:
    return int((Decimal(value) * 1000).to_integral_value(decimal.ROUND_HALF_EVEN))


def kind_counts(part: RankPart) -> Counter:
    return Counter(part.table.column("kind").to_pylist())


def write_trace(path: Path, events: list, gz: bool = False, **header) -> Path:
    doc = {"schemaVersion": 1, **header, "traceEvents": events}
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_shared_traces_are_there(shared_traces):
    assert len(KINETO_FILES) >= 8, KINETO_FILES


@pytest.mark.parametrize("rel", KINETO_FILES)
def test_every_shared_trace_loads_and_follows_the_schema(rel):
    part = part_of(rel)
    assert part.source == "kineto"
    assert part.path.endswith(rel)
    assert part.table.num_rows > 0
    assert part.warnings == []
    S.validate(S.to_frame(part.table), rel)
    assert set(part.table.column("source").to_pylist()) == {"kineto"}
    assert sniff_json(SHARED_TRACES / rel) == "kineto"
    json.dumps(part.meta)  # JSON-safe


@pytest.mark.parametrize("rel", KINETO_FILES)
def test_counts_and_kernel_time_equal_a_plain_json_count(rel):
    doc = plain_json(rel)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    expected = Counter(CAT_KINDS[e["cat"]] for e in events if e.get("cat") in CAT_KINDS)
    expected[S.RUNTIME] = sum(e.get("cat") in RUNTIME_CATS for e in events)
    got = kind_counts(part_of(rel))
    assert {k: got[k] for k in expected} == dict(expected)

    table = part_of(rel).table
    kernels = table.filter(pc.equal(table.column("kind"), S.KERNEL))
    got_ns = pc.sum(pc.subtract(kernels.column("end_ns"), kernels.column("start_ns"))).as_py() or 0
    assert got_ns == sum(ns(e["dur"]) for e in events if e.get("cat") == "kernel")


@pytest.mark.parametrize("rel", [SMALL, "tracelens/vllm_b200_tp8_eager/eager_trace.json.gz", "hta/trace_filter_2rank/sampled_rank-0.json.gz"])
def test_start_ns_is_exact_against_decimal_arithmetic(rel):
    """baseTimeNanoseconds + round(ts*1000) in exact decimal (naive float math is off by 1 ns in places)."""
    doc = plain_json(rel)
    base = doc.get("baseTimeNanoseconds", 0)
    expected = sorted(base + ns(e["ts"]) for e in doc["traceEvents"] if e.get("ph") in ("X", "i"))
    assert sorted(part_of(rel).table.column("start_ns").to_pylist()) == expected
    assert part_of(rel).meta["base_time_ns"] == base


def test_rank_comes_from_distributed_info():
    for rank in (0, 1):
        part = part_of(f"hta/trace_filter_2rank/sampled_rank-{rank}.json.gz")
        assert (part.rank, part.rank_origin) == (rank, "metadata")
        assert part.meta["distributed"]["world_size"] == 128
        assert part.meta["base_time_source"].startswith("absent")
    vllm = part_of("tracelens/vllm_b200_tp8_eager/eager_trace.json.gz")
    assert (vllm.rank, vllm.rank_origin) == (0, "metadata")
    assert vllm.meta["distributed"]["world_size"] == 8
    assert vllm.meta["distributed"] == plain_json("tracelens/vllm_b200_tp8_eager/eager_trace.json.gz")["distributedInfo"]
    hf = part_of("tracelens/hf_qwen1.5-0.5b_chat/h100_Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    assert (hf.rank, hf.rank_origin) == (None, "unknown")


def test_rocm_trace_from_mi300x():
    rel = "tracelens/sglang_qwen3-8b_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz"
    part = part_of(rel)
    assert part.meta["platform"] == "rocm"
    assert part.meta["devices"] == ["AMD Instinct MI300X"]
    assert "roctracer_version" in part.meta["versions"]
    counts = kind_counts(part)
    assert counts[S.KERNEL] == 527 and counts[S.RUNTIME] == 1069 and counts[S.PYTHON] == 53321
    kernels = part.table.filter(pc.equal(part.table.column("kind"), S.KERNEL)).to_pydict()
    assert set(kernels["device"]) == {9}  # as written (args.device); deviceProperties says id 0
    assert set(kernels["pid"]) == {part.meta["host_pid"]}
    assert set(kernels["tid"]) == {None}
    assert None not in kernels["stream"] and None not in kernels["correlation"]
    # the SGLang step marker survives, as the one host span it is, at its time in the file
    rows = part.table.filter(pc.starts_with(part.table.column("name"), "step[")).to_pylist()
    (raw,) = [e for e in plain_json(rel)["traceEvents"] if str(e.get("name", "")).startswith("step[")]
    assert [r["name"] for r in rows] == ["step[EXTEND bs=15 toks=15360]"] == [raw["name"]]
    (row,) = rows
    base = part.meta["base_time_ns"]
    assert row["kind"] == S.CPU_SPAN and row["category"] == raw["cat"] == "user_annotation"
    assert (row["start_ns"], row["end_ns"]) == (base + ns(raw["ts"]), base + ns(raw["ts"]) + ns(raw["dur"]))


def test_trace_without_profiler_step_loads():
    part = part_of(SMALL)
    names = part.table.column("name").to_pylist()
    assert not any(n.startswith("ProfilerStep#") for n in names)
    assert any(n.startswith("step[DECODE") for n in names)
    assert kind_counts(part)[S.KERNEL] == 555


def test_host_and_gpu_columns():
    part = part_of("hta/nccl_data.json.gz")
    t = part.table.to_pydict()
    host_pid = part.meta["host_pid"]
    assert host_pid == 2910249
    for kind, dev, stream, pid, tid, corr in zip(t["kind"], t["device"], t["stream"], t["pid"], t["tid"], t["correlation"]):
        if kind in S.GPU_KINDS:
            assert dev is not None and stream is not None and pid == host_pid and tid is None and corr is not None
        elif kind == S.RUNTIME:
            assert dev is None and stream is None and pid == host_pid and tid is not None and corr is not None
        elif kind == S.CPU_OP:
            assert dev is None and stream is None and pid is not None and tid is not None
    # instants with string pids ("Traces") get a stable hashed id, named in meta
    names = part.meta["id_names"]["pid"]
    assert "Traces" in names.values()
    assert part.meta["process_labels"][str(host_pid)] == "CPU"


def test_collectives_from_record_param_comms_and_nccl_kernels():
    t = part_of("hta/nccl_data.json.gz").table.to_pylist()
    ops = [r for r in t if r["kind"] == S.CPU_OP and r["coll_name"] == "all_reduce"]
    assert len(ops) == 15
    doc = plain_json("hta/nccl_data.json.gz")
    first = next(e for e in doc["traceEvents"] if e.get("args", {}).get("Collective name") == "allreduce")
    assert ops[0]["bytes"] == first["args"]["In msg nelems"] * 4  # Float
    assert {r["coll_group"] for r in ops} == {"0"}
    kernels = [r for r in t if r["kind"] == S.KERNEL and r["name"].startswith("ncclKernel_AllReduce")]
    assert len(kernels) == 15 and {r["coll_name"] for r in kernels} == {"all_reduce"}
    assert {r["coll_group"] for r in kernels} == {"0"}  # newer torch puts the args on kernels too
    bcast = [r for r in t if r["kind"] == S.KERNEL and r["name"].startswith("ncclKernel_Broadcast")]
    assert {r["coll_name"] for r in bcast} == {"broadcast"}
    # autograd's "Sequence number" on ordinary ops is not a collective sequence
    assert all(r["coll_seq"] is None for r in t)

    sendrecv = [r for r in part_of("hta/negative_queue_length_rank0.json.gz").table.to_pylist() if r["coll_name"]]
    assert len(sendrecv) == 80 and {r["coll_name"] for r in sendrecv} == {"send_recv"}
    vllm = part_of("tracelens/vllm_b200_tp8_eager/eager_trace.json.gz").table.to_pylist()
    gathers = [(r["kind"], r["coll_name"], r["coll_group"]) for r in vllm if r["coll_name"]]
    assert sorted(gathers) == [(S.CPU_OP, "all_gather", "3"), (S.KERNEL, "all_gather", "3")]


def test_collective_seq_and_bytes_synthetic(tmp_path):
    comms = {"Collective name": "all_to_all", "Process Group Name": "7", "Seq": 42, "In msg nelems": 10, "dtype": "BFloat16"}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, "args": comms},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "pid": 0, "tid": 7,
         "ts": 12.0, "dur": 3.0, "args": {"device": 0, "stream": 7, "correlation": 9}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 20.0, "dur": 1.0,
         "args": {"device": 0, "stream": 7, "correlation": 10, "bytes": 4096}},
    ]
    [part] = read_kineto(write_trace(tmp_path / "t.json", events, baseTimeNanoseconds=1_000_000_000))
    rows = part.table.to_pylist()
    assert (rows[0]["coll_name"], rows[0]["coll_group"], rows[0]["coll_seq"], rows[0]["bytes"]) == ("all_to_all", "7", 42, 20)
    assert rows[1]["coll_name"] == "send_recv" and rows[1]["coll_seq"] is None
    assert rows[2]["bytes"] == 4096 and rows[2]["kind"] == S.MEMCPY
    assert rows[0]["start_ns"] == 1_000_010_000 and rows[0]["end_ns"] == 1_000_015_000


def test_cuda_graph_kernels_sharing_one_correlation_are_all_kept(tmp_path):
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 5, "tid": 6, "ts": 100.0, "dur": 4.0,
              "args": {"correlation": 77, "cbid": 311}}
    kernels = [
        {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 110.0 + i, "dur": 0.5,
         "args": {"device": 0, "stream": 7, "correlation": 77}}
        for i in range(5)
    ]
    [part] = read_kineto(write_trace(tmp_path / "g.json", [launch, *kernels]))
    t = part.table.to_pydict()
    assert t["correlation"] == [77] * 6
    assert t["kind"] == [S.RUNTIME] + [S.KERNEL] * 5
    assert t["pid"] == [5] * 6  # the host pid comes from the runtime caller when no "CPU" label exists


def test_bad_events_are_skipped_with_counted_warnings(tmp_path):
    ok = {"ph": "X", "cat": "cpu_op", "name": "ok", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}
    events = [
        ok,
        {**ok, "dur": -3.0},
        {**ok, "dur": -1.0},
        {k: v for k, v in ok.items() if k != "dur"},
        {**ok, "ts": "soon"},
        {**ok, "ts": None},
        {**ok, "tid": "worker-thread"},
        "not an event",
        {"ph": "s", "id": 1, "ts": 1.0, "pid": 1, "tid": 1, "cat": "ac2g", "name": "ac2g"},
    ]
    [part] = read_kineto(write_trace(tmp_path / "bad.json", events))
    assert part.table.num_rows == 2
    text = " | ".join(part.warnings)
    assert "skipped 2 events with negative dur (cpu_op 2)" in text
    assert "skipped 1 events with missing or non-numeric dur" in text
    assert "skipped 2 events with missing or non-numeric ts" in text
    assert "1 entries of traceEvents that are not objects" in text
    assert part.meta["skipped"]["flow"] == 1
    tids = part.table.column("tid").to_pylist()
    assert tids[0] == 1 and part.meta["id_names"]["tid"][str(tids[1])] == "worker-thread"


def test_nan_timestamps_are_skipped(tmp_path):
    text = ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": NaN, "dur": 1},'
            '{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": Infinity},'
            '{"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": 5, "dur": 1}]}')
    (tmp_path / "nan.json").write_text(text)
    [part] = read_kineto(tmp_path / "nan.json")
    assert part.table.column("name").to_pylist() == ["c"]
    assert len(part.warnings) == 2


def test_chunked_reading_equals_whole_document(monkeypatch):
    """Cutting the event array into small verified pieces gives the same table as one parse."""
    for rel in (SMALL, "hta/trace_filter_2rank/sampled_rank-1.json.gz", "tracelens/vllm_b200_tp8_eager/eager_trace.json.gz"):
        whole = part_of(rel)
        monkeypatch.setattr(jsonio, "CHUNK_BYTES", 8 << 10)
        [small] = read_kineto(SHARED_TRACES / rel)
        monkeypatch.undo()
        assert small.meta["chunked_parse"]
        assert small.table.equals(whole.table)
        assert small.meta["distributed"] == whole.meta["distributed"]
        assert small.meta["base_time_ns"] == whole.meta["base_time_ns"]


def test_header_keys_after_the_events_are_read(tmp_path, monkeypatch):
    """Kineto writes baseTimeNanoseconds and traceName after traceEvents; strings may contain '}, {' and ']'."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op}}, {{]] {i}", "pid": 1, "tid": 1, "ts": float(i), "dur": 1.0}
              for i in range(2000)]
    text = json.dumps({"traceEvents": events, "traceName": "x]}, {", "baseTimeNanoseconds": 5000, "tail": [{"a": 1}, {"b": [2]}]})
    (tmp_path / "t.json").write_text(text)
    monkeypatch.setattr(jsonio, "CHUNK_BYTES", 4 << 10)
    [part] = read_kineto(tmp_path / "t.json")
    assert part.meta["base_time_ns"] == 5000 and part.meta["trace_name"] == "x]}, {"
    assert part.table.column("name").to_pylist() == [e["name"] for e in events]
    assert part.table.column("start_ns").to_pylist()[:2] == [5000, 6000]


def test_sniff_reads_only_the_head(tmp_path):
    head = b'{"schemaVersion": 1, "deviceProperties": [], "traceEvents": ['
    assert is_kineto(head)
    assert is_kineto(b'[{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel"')
    assert not is_kineto(b'[{"ph": "B", "cat": "py-spy", "name": "main"')
    (tmp_path / "cut.json").write_bytes(head + b" " * 200_000)  # broken later on: sniff does not care
    assert sniff_json(tmp_path / "cut.json") == "kineto"
    (tmp_path / "py.json").write_bytes(b'[{"ph": "B", "cat": "py-spy", "name": "f", "ts": 1, "pid": 1, "tid": 1}]')
    assert sniff_json(tmp_path / "py.json") == "chrome"
    (tmp_path / "empty.json").write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        sniff_json(tmp_path / "empty.json")
    (tmp_path / "db.json").write_bytes(b"SQLite format 3\x00")
    with pytest.raises(TraceError, match="not a JSON trace"):
        sniff_json(tmp_path / "db.json")


# ------------------------------------------------------------------ bad files


def small_trace_bytes() -> bytes:
    return gzip.decompress((SHARED_TRACES / SMALL).read_bytes())


def expect_trace_error(path: Path, match: str) -> TraceError:
    with pytest.raises(TraceError, match=match) as info:
        read_kineto(path)
    err = info.value
    assert err.path == str(path) and str(err).startswith(str(path)) and "\n" not in str(err)
    return err


def test_truncated_gzip(tmp_path):
    gz = (SHARED_TRACES / SMALL).read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(gz[: len(gz) // 2])
    expect_trace_error(tmp_path / "cut.json.gz", "truncated gzip")


def test_corrupt_gzip(tmp_path):
    gz = bytearray((SHARED_TRACES / SMALL).read_bytes())
    gz[-6] ^= 0xFF  # CRC
    (tmp_path / "crc.json.gz").write_bytes(bytes(gz))
    expect_trace_error(tmp_path / "crc.json.gz", "gzip")


def test_invalid_json_says_where(tmp_path):
    data = small_trace_bytes()
    (tmp_path / "bad.json").write_bytes(data[:5000] + b"@" + data[5001:])
    expect_trace_error(tmp_path / "bad.json", r"invalid JSON at line \d+ column \d+")
    (tmp_path / "cut.json").write_bytes(data[: len(data) // 2])
    expect_trace_error(tmp_path / "cut.json", "truncated JSON")


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "empty file"),
        (b"  \n ", "only whitespace"),
        (b"42", "top-level JSON value is a number"),
        (b'"trace"', "is a string"),
        (b"null", "is null"),
        (b"{}", "no traceEvents"),
        (b'{"traceEvents": 3}', "traceEvents is int, not a list"),
        (b'{"traceEvents": [}', "invalid JSON"),
        (b"\x00\x01\x02 binary", "invalid JSON"),
    ],
)
def test_not_a_trace(tmp_path, content, match):
    (tmp_path / "x.json").write_bytes(content)
    expect_trace_error(tmp_path / "x.json", match)
    (tmp_path / "x.json.gz").write_bytes(gzip.compress(content))
    expect_trace_error(tmp_path / "x.json.gz", match)


def test_missing_file_and_directory(tmp_path):
    expect_trace_error(tmp_path / "nope.json", "no such file")
    expect_trace_error(tmp_path, "directory")


def test_empty_event_list_is_not_an_error(tmp_path):
    [part] = read_kineto(write_trace(tmp_path / "e.json", []))
    assert part.table.num_rows == 0 and part.warnings == ["no events"]
    S.validate(S.to_frame(part.table))


def test_huge_and_hostile_names_pass_through_as_data(tmp_path):
    hostile = [
        "</script><script>alert(1)</script>",
        "<!-- --> & &amp; \"quoted\" 'single' `tick`",
        "line\nbreak\ttab\r\x00nul",
        "{{ template }} ${shell} $(rm -rf /) ; DROP TABLE events; --",
        "\u202eright-to-left \U0001F600 emoji ﬁ ligature",
        "}, {\"ph\": \"X\"}]",
        "x" * (1 << 20),
    ]
    events = [{"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 2, "ts": float(i), "dur": 1.0,
               "args": {"Collective name": n[:100], "Process Group Name": n[:100]}} for i, n in enumerate(hostile)]
    [part] = read_kineto(write_trace(tmp_path / "h.json.gz", events, gz=True, traceName=hostile[0]))
    assert part.table.column("name").to_pylist() == hostile
    assert part.table.column("coll_group").to_pylist() == [n[:100] for n in hostile]
    assert part.meta["trace_name"] == hostile[0]


def test_non_string_fields_do_not_crash(tmp_path):
    events = [
        {"ph": "X", "cat": ["a"], "name": {"n": 1}, "pid": [1], "tid": {"t": 2}, "ts": 1, "dur": 2, "args": [1, 2]},
        {"ph": "X", "cat": 7, "name": 12, "pid": 1.0, "tid": "17", "ts": 1, "dur": 2, "args": None},
        {"ph": ["X"], "name": "odd phase"},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": "GPU 3", "tid": "stream 9", "ts": 1, "dur": 2,
         "args": {"device": "x", "stream": None, "correlation": "12"}},
        {"ph": "X", "cat": "cpu_op", "name": "big", "pid": 2**70, "tid": True, "ts": 1, "dur": 2},
    ]
    [part] = read_kineto(write_trace(tmp_path / "odd.json", events))
    S.validate(S.to_frame(part.table))
    rows = part.table.to_pylist()
    assert [r["name"] for r in rows] == ["{'n': 1}", "12", "k", "big"]
    assert rows[1]["pid"] == 1 and rows[1]["tid"] == 17
    assert (rows[2]["device"], rows[2]["stream"], rows[2]["correlation"]) == (None, 9, 12)
    assert rows[3]["pid"] is None


def test_hypothesis_mangled_bytes_only_raise_trace_error(tmp_path_factory):
    """Truncations and byte flips of a small real trace: a table or a TraceError, nothing else."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    doc = orjson.loads(small_trace_bytes())
    doc["traceEvents"] = doc["traceEvents"][:60]
    plain = json.dumps(doc, indent=1).encode()
    folder = tmp_path_factory.mktemp("fuzz")

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        gz=st.booleans(),
        cut=st.one_of(st.none(), st.integers(0, len(plain))),
        flips=st.lists(st.tuples(st.integers(0, len(plain) - 1), st.integers(1, 255)), max_size=4),
        chunk=st.sampled_from([1 << 10, 4 << 10, 1 << 20]),
    )
    def check(gz, cut, flips, chunk):
        data = bytearray(plain if cut is None else plain[:cut])
        raw = bytearray(gzip.compress(bytes(data))) if gz else data
        for pos, bits in flips:
            if raw:
                raw[pos % len(raw)] ^= bits
        path = folder / ("t.json.gz" if gz else "t.json")
        path.write_bytes(bytes(raw))
        old = jsonio.CHUNK_BYTES
        jsonio.CHUNK_BYTES = chunk
        try:
            for read in (read_kineto, sniff_json):
                try:
                    out = read(path)
                except TraceError as err:
                    assert err.path == str(path) and "\n" not in str(err)
                    continue
                if read is read_kineto:
                    S.validate(S.to_frame(out[0].table))
                    json.dumps(out[0].meta)
        finally:
            jsonio.CHUNK_BYTES = old

    check()


def test_bad_unicode_in_one_name_does_not_cost_the_trace(tmp_path):
    ok = '{"ph": "X", "cat": "cpu_op", "name": "fine", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
    cut = b'{"ph": "X", "cat": "kernel", "name": "void gemm<\xe2\x80", "pid": 0, "tid": 7, "ts": 2, "dur": 1}'
    (tmp_path / "utf8.json").write_bytes(b'{"traceEvents": [' + ok.encode() + b", " + cut + b"]}")
    [part] = read_kineto(tmp_path / "utf8.json")
    assert part.table.column("name").to_pylist() == ["fine", "void gemm<\ufffd"]
    assert any("U+FFFD" in w for w in part.warnings)
    lone = ok.replace("fine", "half \\ud800 pair")
    (tmp_path / "surrogate.json").write_text('{"traceEvents": [' + lone + "]}")
    [part] = read_kineto(tmp_path / "surrogate.json")
    assert part.table.column("name").to_pylist() == ["half ? pair"]
