"""`profkit merge`: the merged Perfetto trace parses back with Perfetto's own protos and is
structurally sound (tracks described before use, begin/end balanced and nested per track,
timestamps ordered per sequence, interning valid, every flow with both ends, every input kernel
present once); the Chrome JSON export holds the same events; windows and hostile names work."""
from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import profkit
from profkit import schema
from profkit.export import merge_capture, parse_steps, parse_time
from profkit.export.identity import MAX_OS_PID, RankIdentity, display_pids, rank_identity
from profkit.export.layout import build_rank_trace
from profkit.export.window import WindowError
from profkit.ingest.loader import Capture
from profkit.simulate import simulate
from conftest import SAMPLE_TRACES

STRAGGLER = SAMPLE_TRACES / "engine-dep2-h200" / "torch_straggler"
BEGIN, END, INSTANT = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_INSTANT
CLEARED, NEEDS = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED, pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE


# ------------------------------------------------------------------ reading a trace back


@dataclass
class Slice:
    name: str
    track: int
    start_ns: int
    end_ns: int | None = None
    args: dict = field(default_factory=dict)
    category: str | None = None


@dataclass
class Parsed:
    tracks: dict[int, pb.TrackDescriptor]
    slices: list[Slice]
    instants: list[Slice]
    flows_out: Counter
    flows_in: Counter
    n_packets: int

    def track_name(self, uuid: int) -> str:
        td = self.tracks[uuid]
        return td.thread.thread_name if td.HasField("thread") else td.name

    def process_names(self) -> list[str]:
        return [t.process.process_name for t in self.tracks.values() if t.HasField("process")]

    def on_gpu_streams(self, kind: str) -> list[Slice]:
        return [s for s in self.slices if re.match(r"^GPU \d+ stream \d+", self.track_name(s.track)) and s.args.get("kind") == kind]


def read_perfetto(path) -> Parsed:
    """Parse with perfetto_trace_pb2 and assert the structure a viewer relies on."""
    trace = pb.Trace.FromString(path.read_bytes())
    tracks: dict[int, pb.TrackDescriptor] = {}
    interned: dict[int, dict[str, dict[int, str]]] = {}
    last_ts: dict[int, int] = {}
    open_slices: dict[int, list[Slice]] = {}
    track_sequence: dict[int, int] = {}
    slices, instants = [], []
    flows_out, flows_in = Counter(), Counter()
    seen_sequences: set[int] = set()
    for packet in trace.packet:
        seq = packet.trusted_packet_sequence_id
        assert seq > 0
        if seq not in seen_sequences:
            assert packet.sequence_flags & CLEARED, "first packet of a sequence must clear incremental state"
            seen_sequences.add(seq)
            interned[seq] = {"names": {}, "cats": {}, "ann": {}, "str": {}}
        if packet.HasField("interned_data"):
            state, data = interned[seq], packet.interned_data
            for table, entries in (("names", data.event_names), ("cats", data.event_categories),
                                   ("ann", data.debug_annotation_names)):
                for e in entries:
                    assert e.iid not in state[table], "an iid is interned twice on one sequence"
                    state[table][e.iid] = e.name
            for e in data.debug_annotation_string_values:
                state["str"][e.iid] = e.str.decode("utf-8")
        if packet.HasField("track_descriptor"):
            td = packet.track_descriptor
            assert td.uuid not in tracks, f"track {td.uuid} described twice"
            if td.HasField("parent_uuid"):
                assert td.parent_uuid in tracks, "a parent track must be described before its children"
            tracks[td.uuid] = td
            track_sequence[td.uuid] = seq
        if packet.HasField("timestamp"):
            assert packet.timestamp >= last_ts.get(seq, 0), "timestamps must not go back on a sequence"
            last_ts[seq] = packet.timestamp
        if not packet.HasField("track_event"):
            continue
        assert packet.sequence_flags & NEEDS
        te, state = packet.track_event, interned[seq]
        assert te.track_uuid in tracks, "event on a track not described before"
        assert track_sequence[te.track_uuid] == seq, "all events of a track come from its own sequence"
        stack = open_slices.setdefault(te.track_uuid, [])
        if te.type == END:
            assert stack, "SLICE_END without an open slice on its track"
            stack.pop().end_ns = packet.timestamp
            assert not te.flow_ids and not te.terminating_flow_ids
            continue
        assert te.name_iid in state["names"], "event name used before it was interned"
        args = {}
        for ann in te.debug_annotations:
            key = state["ann"][ann.name_iid]
            args[key] = state["str"][ann.string_value_iid] if ann.HasField("string_value_iid") else ann.int_value
        category = state["cats"][te.category_iids[0]] if te.category_iids else None
        item = Slice(state["names"][te.name_iid], te.track_uuid, packet.timestamp, None, args, category)
        flows_out.update(te.flow_ids)
        flows_in.update(te.terminating_flow_ids)
        if te.type == BEGIN:
            stack.append(item)
            slices.append(item)
        else:
            assert te.type == INSTANT
            item.end_ns = packet.timestamp
            instants.append(item)
    for uuid, stack in open_slices.items():
        assert not stack, f"{len(stack)} slices never closed on track {uuid}"
    return Parsed(tracks, slices, instants, flows_out, flows_in, len(trace.packet))


def assert_sound(parsed: Parsed) -> None:
    # nesting is implied by the stack discipline above; also check no child outlives its parent
    by_track: dict[int, list[Slice]] = {}
    for s in parsed.slices:
        by_track.setdefault(s.track, []).append(s)
    for track, items in by_track.items():
        items.sort(key=lambda s: (s.start_ns, -s.end_ns))
        stack: list[int] = []
        for s in items:
            while stack and stack[-1] <= s.start_ns:
                stack.pop()
            assert not stack or s.end_ns <= stack[-1], f"slices cross on {parsed.track_name(track)}"
            stack.append(s.end_ns)
    assert set(parsed.flows_out) == set(parsed.flows_in), "every flow needs both ends"
    assert all(n == 1 for n in parsed.flows_out.values()) and all(n == 1 for n in parsed.flows_in.values())


def kernel_names(events: pd.DataFrame) -> Counter:
    return Counter(events.loc[events["kind"] == schema.KERNEL, "name"].astype(str).tolist())


# ------------------------------------------------------------------ fixtures


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    try:
        cap = profkit.load(STRAGGLER)
        out = tmp_path_factory.mktemp("merged")
        pf = merge_capture(cap, out / "merged.pftrace", align=None)
        ch = merge_capture(cap, out / "merged.json", fmt="chrome", align=None)
        yield cap, pf, read_perfetto(pf.path), ch, json.loads(ch.path.read_text())
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def dep8(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    try:
        sim = tmp_path_factory.mktemp("dep8")
        simulate(ranks=8, steps=4, seed=1, out_dir=sim)
        cap = profkit.load(sim)
        result = merge_capture(cap, sim / "merged.pftrace", align=None)
        yield cap, result, read_perfetto(result.path)
    finally:
        mp.undo()


def run_cli(argv: list[str]) -> int:
    """`profkit merge ...` through the real parser (registering merge if main.py does not yet)."""
    from profkit.cli import main as cli_main
    from profkit.cli import merge as merge_cli

    parser = cli_main.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "merge" not in sub.choices:
        merge_cli.register(sub)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


# ------------------------------------------------------------------ the real 2-GPU capture


def test_real_capture_is_structurally_sound(straggler):
    cap, result, parsed, _, _ = straggler
    assert_sound(parsed)
    assert result.ranks == [0, 1]
    assert result.n_events == len(cap.events)
    assert len(parsed.slices) + len(parsed.instants) == len(cap.events) + result.n_steps


def test_every_kernel_present_exactly_once_on_a_gpu_stream(straggler):
    cap, _, parsed, _, _ = straggler
    for rank in (0, 1):
        pid_tracks = {u for u, t in parsed.tracks.items() if t.parent_uuid == ((rank + 1) << 32)}
        got = Counter(s.name for s in parsed.on_gpu_streams("kernel") if s.track in pid_tracks)
        assert got == kernel_names(cap.events[cap.events["rank"] == rank])
    for kind in (schema.MEMCPY, schema.MEMSET):
        assert len(parsed.on_gpu_streams(kind)) == int((cap.events["kind"] == kind).sum())


def test_processes_threads_streams_and_steps(straggler):
    cap, result, parsed, _, _ = straggler
    names = sorted(parsed.process_names())
    assert names == ["rank 0 (pid 912)", "rank 1 (pid 913)"]
    custom = {t.name for t in parsed.tracks.values() if t.name}
    assert {"steps", "GPU 0 stream 7", "GPU 1 stream 7"} <= custom
    threads = {(t.thread.pid, t.thread.tid): t.thread.thread_name for t in parsed.tracks.values() if t.HasField("thread")}
    assert threads[(912, 997)] == "thread 997 (pt_gloo_runloop)"  # Kineto's thread names kept
    steps = [s for s in parsed.slices if parsed.track_name(s.track) == "steps"]
    assert len(steps) == 40 and result.n_steps == 40
    assert steps[0].name.startswith("step 0: EngineCore.step")
    assert {"step", "step_ns", "gpu_busy_ns", "gap_ns", "marker"} <= set(steps[0].args)
    table = cap.steps()  # steps are computed a rank at a time in merge: same table as the whole-capture one
    got = sorted((s.track >> 32) - 1 for s in steps), sorted((s.args["step"], s.start_ns, s.args["step_ns"], s.args["gpu_busy_ns"]) for s in steps)
    want = sorted(table["rank"].tolist()), sorted(zip(table["step"], table["start_ns"], table["step_ns"], table["gpu_busy_ns"]))
    assert got == want


def test_flows_join_each_launch_to_its_gpu_work(straggler):
    cap, result, parsed, _, _ = straggler
    ev = cap.events
    n_gpu_with_launch = int((ev["kind"].isin(schema.GPU_KINDS) & ev["correlation"].notna()).sum())
    assert result.n_flows == n_gpu_with_launch == len(parsed.flows_in)
    starts = {}
    for s in parsed.slices:  # the launch (flow start) begins no later than the GPU work (flow end)
        if s.args.get("kind") == "runtime" and "correlation" in s.args:
            starts[s.args["correlation"], parsed.tracks[s.track].thread.pid] = s.start_ns
    for s in parsed.on_gpu_streams("kernel")[:2000]:
        pid = next(t.process.pid for t in parsed.tracks.values() if t.HasField("process") and t.uuid == parsed.tracks[s.track].parent_uuid)
        assert starts[s.args["correlation"], pid] <= s.start_ns


def test_annotations_carried_as_debug_args(straggler):
    _, _, parsed, _, _ = straggler
    kernel = parsed.on_gpu_streams("kernel")[0]
    assert kernel.category == "kernel"
    assert kernel.args["category"] == "kernel" and kernel.args["source"] == "kineto"
    assert isinstance(kernel.args["correlation"], int)
    copies = [s for s in parsed.slices if s.args.get("kind") == "memcpy"]
    assert any("bytes" in s.args for s in copies) or not copies


def test_pdl_overlaps_go_on_an_overlap_track(straggler):
    # Hopper's programmatic dependent launch starts splitKreduce before the GEMM ends: real overlap
    _, result, parsed, _, _ = straggler
    overlap = {u: t.name for u, t in parsed.tracks.items() if t.name.endswith("(overlap)")}
    assert set(overlap.values()) == {"GPU 0 stream 7 (overlap)", "GPU 1 stream 7 (overlap)"}
    assert result.n_overlap_tracks == 2
    assert any("(overlap)" in note for note in result.notes)


def test_chrome_export_has_the_same_events(straggler):
    cap, result, parsed, chrome_result, doc = straggler
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(parsed.slices)
    assert len([e for e in events if e["ph"] == "i"]) == len(parsed.instants)
    assert Counter(e["name"] for e in complete if e.get("args", {}).get("kind") == "kernel") == kernel_names(cap.events)
    starts = Counter(e["id"] for e in events if e["ph"] == "s")
    ends = Counter(e["id"] for e in events if e["ph"] == "f")
    assert starts == ends and len(starts) == result.n_flows
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == set(parsed.process_names())
    # µs relative to time_origin_ns, exact to the ns
    origin = doc["otherData"]["time_origin_ns"]
    first_kernel = cap.events[cap.events["kind"] == "kernel"].sort_values("start_ns").iloc[0]
    match = [e for e in complete if e["name"] == first_kernel["name"] and round(e["ts"] * 1000) + origin == first_kernel["start_ns"]]
    assert match and round(match[0]["dur"] * 1000) == first_kernel["end_ns"] - first_kernel["start_ns"]


def test_chrome_export_reads_back_into_profkit(straggler, tmp_path):
    cap, _, _, chrome_result, _ = straggler
    back = profkit.load(chrome_result.path)
    assert len(back.events) == len(cap.events) + 40  # + the step slices
    assert (back.events["kind"] == "kernel").sum() == (cap.events["kind"] == "kernel").sum()


# ------------------------------------------------------------------ simulated DEP8


def test_simulated_dep8(dep8):
    cap, result, parsed = dep8
    assert_sound(parsed)
    assert result.ranks == list(range(8))
    names = sorted(parsed.process_names(), key=lambda n: int(n.split()[1]))
    for rank, name in enumerate(names):
        assert name.startswith(f"rank {rank} (DP {rank}, EP {rank}, pid ")
    assert Counter(s.name for s in parsed.on_gpu_streams("kernel")) == kernel_names(cap.events)
    sequences = {t.uuid >> 32 for t in parsed.tracks.values()}
    assert len(sequences) == 8


# ------------------------------------------------------------------ windows


def test_steps_window_keeps_those_steps_and_their_gpu_work(straggler, tmp_path):
    cap, _, _, _, _ = straggler
    result = merge_capture(cap, tmp_path / "w.pftrace", steps=parse_steps("3:5"), align=None)
    parsed = read_perfetto(result.path)
    assert_sound(parsed)
    steps = [s for s in parsed.slices if parsed.track_name(s.track) == "steps"]
    assert sorted(s.args["step"] for s in steps) == [3, 3, 4, 4, 5, 5]
    table = cap.steps()
    expected = Counter()
    for rank in (0, 1):
        sel = table[(table["rank"] == rank) & table["step"].between(3, 5)]
        lo, hi = sel["start_ns"].min(), sel["end_ns"].max()
        ev = cap.events[cap.events["rank"] == rank]
        inside = (ev["end_ns"] >= lo) & (ev["start_ns"] <= hi)
        launched = ev[inside & (ev["kind"] == "runtime")]["correlation"].dropna()
        keep = inside | (ev["kind"].isin(schema.GPU_KINDS) & ev["correlation"].isin(launched))
        expected += kernel_names(ev[keep])
    got = Counter(s.name for s in parsed.on_gpu_streams("kernel"))
    assert got == expected and 0 < sum(got.values()) < (cap.events["kind"] == "kernel").sum()


def test_time_window_relative_seconds(straggler, tmp_path):
    cap, _, _, _, _ = straggler
    t0 = int(cap.events["start_ns"].min())
    result = merge_capture(cap, tmp_path / "t.pftrace", time=parse_time("0.1:0.15"), align=None)
    parsed = read_perfetto(result.path)
    assert_sound(parsed)
    lo, hi = t0 + 100_000_000, t0 + 150_000_000
    assert parsed.slices and all(s.start_ns <= hi and s.end_ns >= lo for s in parsed.slices)
    ev = cap.events
    assert len(parsed.slices) + len(parsed.instants) == int(((ev["end_ns"] >= lo) & (ev["start_ns"] <= hi)).sum()) + result.n_steps
    absolute = merge_capture(cap, tmp_path / "a.pftrace", time=parse_time(f"{lo}:{hi}"), align=None)
    assert absolute.n_events == result.n_events


@pytest.mark.parametrize("text,expect", [
    ("0.5:1.5", ((500_000_000, True), (1_500_000_000, True))),
    ("250ms:", ((250_000_000, True), None)),
    (":40us", (None, (40_000, True))),
    ("1795972928988048694:1795972929000000000", ((1795972928988048694, False), (1795972929000000000, False))),
    ("1000ns:2000ns", ((1000, False), (2000, False))),
    ("2:3", ((2_000_000_000, True), (3_000_000_000, True))),
])
def test_time_window_parsing(text, expect):
    window = parse_time(text)
    got = tuple(None if p is None else (p.ns, p.relative) for p in (window.start, window.end))
    assert got == expect


@pytest.mark.parametrize("text", ["", "1", "a:b", "3:1", "1:2:3"])
def test_bad_step_windows_are_user_errors(text):
    with pytest.raises(WindowError):
        parse_steps(text)


@pytest.mark.parametrize("text", ["", "1", "x:2", "1.5ns:", "3:1", "1h:2h"])
def test_bad_time_windows_are_user_errors(text):
    with pytest.raises(WindowError):
        parse_time(text)


# ------------------------------------------------------------------ hostile input


HOSTILE = ["</script><script>alert(1)</script>", "x" * (1 << 20), "ünïcödé 🚀 中文 \"quoted\" \\ back", "tab\tnew\nline\x00nul"]


def hostile_capture() -> Capture:
    rows = []
    for i, name in enumerate(HOSTILE):
        t = 1_000_000 + i * 10_000
        rows.append(dict(kind="cpu_span", name=name, category="user_annotation", start_ns=t, end_ns=t + 5_000, pid=100, tid=100))
        rows.append(dict(kind="runtime", name="cudaLaunchKernel", category="cuda_runtime", start_ns=t + 100, end_ns=t + 200,
                         pid=100, tid=100, correlation=i + 1))
        rows.append(dict(kind="kernel", name=name, category="kernel", start_ns=t + 1_000, end_ns=t + 2_000, device=0, stream=7,
                         pid=100, correlation=i + 1, coll_group=name, bytes=1 << 40))
    frame = pd.DataFrame(rows)
    columns = {c: frame[c].tolist() if c in frame else [None] * len(frame) for c in schema.COLUMNS}
    columns["rank"] = [0] * len(frame)
    columns["source"] = ["chrome"] * len(frame)
    events = schema.to_frame(schema.to_table(columns))
    parts = pd.DataFrame([{"rank": 0, "source": "chrome", "path": "<hostile>", "key": "", "rank_origin": "metadata", "n_events": len(frame)}])
    return Capture(events=events, parts=parts, meta={0: [{"process_name": "</script>"}]}, skipped=[], warnings=[])


def test_hostile_names_survive_as_data(tmp_path):
    cap = hostile_capture()
    names = set(HOSTILE)
    parsed = read_perfetto(merge_capture(cap, tmp_path / "h.pftrace", align=None).path)
    assert_sound(parsed)
    assert {s.name for s in parsed.slices} == names | {"cudaLaunchKernel"}
    assert {s.args.get("coll_group") for s in parsed.on_gpu_streams("kernel")} == names
    assert all(s.args["bytes"] == 1 << 40 for s in parsed.on_gpu_streams("kernel"))
    doc = json.loads(merge_capture(cap, tmp_path / "h.json", fmt="chrome", align=None).path.read_text())
    assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"} == names | {"cudaLaunchKernel"}


# ------------------------------------------------------------------ layout, identity, alignment


def test_crossing_slices_split_into_overlap_lanes():
    starts = [0, 5, 20, 20, 30, 31, 40]
    ends = [10, 15, 50, 25, 30, 45, 60]  # [5, 15] crosses [0, 10]; [31, 45] nests; [40, 60] crosses [20, 50]
    n = len(starts)
    columns = {c: [None] * n for c in schema.COLUMNS}
    columns.update(rank=[0] * n, source=["x"] * n, kind=["kernel"] * n, name=[f"k{i}" for i in range(n)],
                   start_ns=starts, end_ns=ends, device=[0] * n, stream=[7] * n)
    events = schema.to_frame(schema.to_table(columns))
    rt = build_rank_trace(0, events, pd.DataFrame(columns=["step", "start_ns", "end_ns", "name"]), RankIdentity(0), 1, 1)
    lanes = {t.index: t.name for t in rt.tracks}
    placed = [lanes[i] for i in rt.track_of_item.tolist()]
    assert placed == ["GPU 0 stream 7", "GPU 0 stream 7 (overlap)", "GPU 0 stream 7", "GPU 0 stream 7",
                      "GPU 0 stream 7", "GPU 0 stream 7", "GPU 0 stream 7 (overlap)"]
    assert (np.diff(rt.record_ts) >= 0).all()


def test_identity_from_meta_and_shared_pids():
    meta = [{"distributed": {"rank": 5, "pg_config": [{"pg_desc": "ep", "ranks": [4, 5, 6, 7]}]},
             "process_names": {"77": "EngineCore_DP5"}, "thread_names": {"77/78": "thread 78 (worker)"}},
            {"host": "node001"}]
    ident = rank_identity(5, meta, {77: 100, 5678387443916311803: 3})
    assert ident.label() == "rank 5 (DP 5, EP 1, host node001, pid 77)"
    assert ident.thread_name(77, 78) == "thread 78 (worker)"
    pids = display_pids({0: RankIdentity(0, pid=77), 1: RankIdentity(1, pid=77), 2: RankIdentity(2, pid=78), 3: RankIdentity(3)})
    assert pids == {0: MAX_OS_PID, 1: MAX_OS_PID + 1, 2: 78, 3: MAX_OS_PID + 3}


def test_alignment_is_a_parameter(straggler, tmp_path):
    cap, _, _, _, _ = straggler
    shift_ns = 1_000_000

    def shift_rank1(events):
        out = events.copy()
        on1 = out["rank"] == 1
        out.loc[on1, "start_ns"] += shift_ns
        out.loc[on1, "end_ns"] += shift_ns
        table = pd.DataFrame({"rank": [0, 1], "offset_ns": [0, shift_ns], "drift_ppm": [0.0, 0.0],
                              "residual_ns": [0, 0], "method": ["reference", "test"]})
        return out, table

    window = parse_steps("0:1")
    result = merge_capture(cap, tmp_path / "aligned.pftrace", steps=window, align=shift_rank1)
    plain = merge_capture(cap, tmp_path / "plain.pftrace", steps=window, align=None)
    shifted, unshifted = read_perfetto(result.path), read_perfetto(plain.path)
    process = {t.process.pid: t for t in shifted.tracks.values() if t.HasField("process")}
    assert "offset_ns=1000000" in process[913].description and "method=test" in process[913].description
    for rank, delta in ((0, 0), (1, shift_ns)):
        a = sorted(s.start_ns for s in shifted.slices if s.track >> 32 == rank + 1)
        b = sorted(s.start_ns + delta for s in unshifted.slices if s.track >> 32 == rank + 1)
        assert a == b and len(a) > 1000
    assert not any("not aligned" in n for n in result.notes)
    assert any("not aligned" in n for n in plain.notes)
    assert "clock alignment: none" in next(t for t in unshifted.tracks.values() if t.HasField("process")).description


def test_auto_alignment_uses_profkit_align_and_survives_its_failure(monkeypatch, tmp_path):
    import types

    cap = hostile_capture()
    fake = types.ModuleType("profkit.align")
    fake.estimate_alignment = lambda events: pd.DataFrame(
        {"rank": [0], "offset_ns": [-500], "drift_ppm": [0.0], "residual_ns": [3], "method": ["fake"]})

    def apply_alignment(events, alignment):
        out = events.copy()
        out["start_ns"] = out["start_ns"] + 500
        out["end_ns"] = out["end_ns"] + 500
        return out

    fake.apply_alignment = apply_alignment
    monkeypatch.setitem(__import__("sys").modules, "profkit.align", fake)
    result = merge_capture(cap, tmp_path / "a.pftrace")
    assert result.alignment is not None and result.alignment["method"].tolist() == ["fake"]
    parsed = read_perfetto(result.path)
    assert min(s.start_ns for s in parsed.slices if s.category != "step") == int(cap.events["start_ns"].min()) + 500

    def broken(events):
        raise RuntimeError("half-written")

    fake.estimate_alignment = broken
    result = merge_capture(cap, tmp_path / "b.pftrace")
    assert result.alignment is None and any("profkit.align failed: RuntimeError: half-written" in n for n in result.notes)


# ------------------------------------------------------------------ CLI


def test_cli_merge(tmp_path, capsys):
    out = tmp_path / "merged.pftrace"
    assert run_cli(["merge", str(STRAGGLER), "-o", str(out), "--steps", "2:3"]) == 0
    printed = capsys.readouterr()
    assert "wrote" in printed.out and "ui.perfetto.dev" in printed.out
    parsed = read_perfetto(out)
    assert_sound(parsed)
    descriptions = [t.description for t in parsed.tracks.values() if t.HasField("process")]
    assert all(d.startswith("clock alignment: method=") for d in descriptions)  # profkit.align wired by default
    assert run_cli(["merge", str(STRAGGLER), "-o", str(tmp_path / "m.json"), "--format", "chrome", "-q", "--no-align"]) == 0
    json.loads((tmp_path / "m.json").read_text())
    assert not list(tmp_path.glob("*.partial"))


def test_cli_bad_window_and_bad_input(tmp_path, capsys):
    assert run_cli(["merge", str(STRAGGLER), "-o", str(tmp_path / "x.pftrace"), "--steps", "a:b"]) == 2
    assert "--steps" in capsys.readouterr().err
    assert run_cli(["merge", str(tmp_path / "missing"), "-o", str(tmp_path / "y.pftrace")]) == 1
    assert not (tmp_path / "y.pftrace").exists()
    with pytest.raises(SystemExit):
        run_cli(["merge", str(STRAGGLER), "-o", "z", "--steps", "1:2", "--time", "0:1"])
