"""profkit's GPU timeline against other tools' published numbers on the same public traces.

TraceLens (AMD-AGI, MIT) GPU timeline CSVs and Holistic Trace Analysis 0.5.0 temporal
breakdowns ship beside the traces in ../shared/traces. Tolerances are stated per check.
"""
from __future__ import annotations

import csv

import numpy as np
import pytest

import profkit
from profkit import intervals as iv
from profkit.analyze.gpu import gpu_timeline
from profkit.analyze.steps import step_table

MS = 1_000_000  # ns per ms

# TraceLens computes in float microseconds; its sums carry ~10 ns of float error, far inside
# the 0.01 ms the issue allows. We check 0.01 ms (10_000 ns) as required.
TRACELENS_TOL_NS = 10_000


def tracelens_csv(path) -> dict[str, float]:
    with open(path) as fh:
        return {row["type"]: float(row["time ms"]) for row in csv.DictReader(fh)}


@pytest.mark.parametrize(
    "folder,csv_name,window",
    [
        # SGLang traces: TraceLens's window is the whole trace (first to last GPU event)
        ("sglang_qwen3-8b_decode", "tracelens_gpu_timeline.csv", "trace"),
        ("sglang_qwen3-8b_prefilldecode", "tracelens_gpu_timeline.csv", "trace"),
        # HF trace: TraceLens restricts to the ProfilerStep's GPU annotation (gpu_user_annotation)
        ("hf_qwen1.5-0.5b_chat", "tracelens_gpu_timeline_h100.csv", "profiler_step"),
    ],
)
def test_gpu_timeline_matches_tracelens(shared_traces, folder, csv_name, window):
    base = shared_traces / "tracelens" / folder
    ref = tracelens_csv(base / csv_name)
    cap = profkit.load(base)
    assert cap.skipped == [] and cap.ranks == [0]
    ev = cap.events
    if window == "profiler_step":
        ann = ev[(ev["kind"] == "gpu_span") & ev["name"].str.startswith("ProfilerStep")]
        assert len(ann) == 1
        got = gpu_timeline(ev, (int(ann["start_ns"].iloc[0]), int(ann["end_ns"].iloc[0])))
        # the whole-trace window is larger: say so rather than hide it
        assert gpu_timeline(ev)["window_ns"] > got["window_ns"] + 10 * MS
    else:
        got = gpu_timeline(ev)
    pairs = {
        "busy_time": "gpu_busy_ns",
        "idle_time": "gpu_idle_ns",
        "total_time": "window_ns",
        "computation_time": "computation_ns",
        "exposed_comm_time": "exposed_comm_ns",
        "exposed_memcpy_time": "exposed_memcpy_ns",
    }
    for theirs, ours in pairs.items():
        assert abs(got[ours] - ref[theirs] * MS) <= TRACELENS_TOL_NS, (theirs, got[ours], ref[theirs])


def hta_input(events):
    """The GPU events HTA 0.5.0's temporal breakdown looks at, as HTA selects and rounds them.

    Input conventions only, no arithmetic of HTA's: (1) HTA keeps the GPU events whose launching
    runtime call (same correlation id) starts before the LAST ProfilerStep starts (it drops the
    last, incomplete iteration); (2) it reads times as whole microseconds: ceil(start),
    floor(end). Everything after that (union, window, idle, computation) is profkit's own
    ``gpu_timeline``.
    """
    steps = events[events["name"].str.startswith("ProfilerStep") & (events["kind"] != "gpu_span")]
    last_step_start = steps["start_ns"].max()
    launches = events[(events["kind"] == "runtime") & (events["start_ns"] < last_step_start)]
    gpu = events[events["kind"].isin(["kernel", "memcpy", "memset"])]
    gpu = gpu[gpu["correlation"].isin(set(launches["correlation"].dropna()))]
    start_ns = gpu["start_ns"].to_numpy(np.int64)
    end_ns = gpu["end_ns"].to_numpy(np.int64)
    return gpu.assign(start_ns=-(-start_ns // 1000) * 1000, end_ns=end_ns // 1000 * 1000)


def hta_reference(path) -> dict[int, dict[str, int]]:
    """HTA's CSV per rank, in ns (HTA writes whole microseconds)."""
    with open(path) as fh:
        return {int(r["rank"]): {k: round(float(r[f"{k}_time(us)"])) * 1000
                                 for k in ("idle", "compute", "non_compute", "kernel")} for r in csv.DictReader(fh)}


@pytest.mark.parametrize(
    "files,csv_rel",
    [
        (["trace_filter_2rank/sampled_rank-0.json.gz", "trace_filter_2rank/sampled_rank-1.json.gz"], "trace_filter_2rank/hta_temporal_breakdown.csv"),
        (["nccl_data.json.gz"], "nccl_data.hta_temporal_breakdown.csv"),
        (["negative_queue_length_rank0.json.gz"], "negative_queue_length_rank0.hta_temporal_breakdown.csv"),
    ],
)
def test_temporal_breakdown_matches_hta_exactly(shared_traces, files, csv_rel):
    """profkit's ``gpu_timeline`` on the events HTA looks at gives HTA's numbers to the microsecond.

    Mapping: HTA ``kernel_time`` = profkit ``window_ns`` (first to last GPU event), ``idle_time``
    = ``gpu_idle_ns``, ``compute_time`` = ``computation_ns`` and ``non_compute_time`` = window -
    computation - idle. One definition differs and is applied, not hidden: profkit counts memsets
    as computation (TraceLens's definition), HTA does not, so HTA's compute is profkit's
    ``computation_ns`` of the same events without memsets (the memsets stay in the busy time).
    """
    base = shared_traces / "hta"
    cap = profkit.load(*[base / f for f in files])
    assert cap.skipped == []
    ref = hta_reference(base / csv_rel)
    assert sorted(ref) == cap.ranks
    for rank, rank_events in cap.events.groupby("rank"):
        seen = hta_input(rank_events)
        timeline = gpu_timeline(seen)
        compute = gpu_timeline(seen[seen["kind"] != "memset"])["computation_ns"]
        want = ref[int(rank)]
        ours = {"kernel": timeline["window_ns"], "idle": timeline["gpu_idle_ns"], "compute": compute,
                "non_compute": timeline["window_ns"] - compute - timeline["gpu_idle_ns"]}
        assert ours == want, (rank, ours, want)
        # memsets are real, so the two definitions give different computation times here
        assert timeline["computation_ns"] > compute


@pytest.mark.parametrize(
    "trace,csv_rel,whole_us",
    [
        ("trace_filter_2rank/sampled_rank-0.json.gz", "trace_filter_2rank/hta_temporal_breakdown.csv", True),
        ("negative_queue_length_rank0.json.gz", "negative_queue_length_rank0.hta_temporal_breakdown.csv", True),
        ("nccl_data.json.gz", "nccl_data.hta_temporal_breakdown.csv", False),
    ],
)
def test_unrounded_timeline_against_hta(shared_traces, trace, csv_rel, whole_us):
    """profkit's own nanosecond timeline of the same iterations, without HTA's rounding: equal to
    HTA's on traces whose timestamps are whole microseconds; on nccl_data (fractional
    microseconds) HTA's rounding shrinks every GPU event by less than 2 us, so profkit's idle is
    smaller than HTA's by at most 2 us per event, its window longer by less than 2 us."""
    cap = profkit.load(shared_traces / "hta" / trace)
    rank = cap.ranks[0]
    ev = cap.events
    seen = hta_input(ev)
    exact = ev.loc[seen.index]  # the same events, times as read
    is_whole = bool((exact["start_ns"].to_numpy(np.int64) % 1000 == 0).all()
                    and (exact["end_ns"].to_numpy(np.int64) % 1000 == 0).all())
    assert is_whole == whole_us
    own = gpu_timeline(exact)
    want = hta_reference(shared_traces / "hta" / csv_rel)[rank]
    if whole_us:
        assert (own["window_ns"], own["gpu_idle_ns"]) == (want["kernel"], want["idle"])
    else:
        bound = 2_000 * len(exact)
        assert 0 <= own["window_ns"] - want["kernel"] < 2_000
        assert 0 < want["idle"] - own["gpu_idle_ns"] <= bound
        assert MS < want["idle"] - own["gpu_idle_ns"]  # and the rounding matters here: over a millisecond


def test_hta_rounding_matters_on_float_timestamps(shared_traces):
    """nccl_data has fractional-microsecond timestamps: HTA's ceil/floor drops ~3.5 ms of busy time.

    profkit keeps nanoseconds, so its idle time is smaller than HTA's by exactly the time
    the rounding removed (measured here, not assumed).
    """
    cap = profkit.load(shared_traces / "hta" / "nccl_data.json.gz")
    ev = cap.events
    gpu = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]
    exact = iv.total(iv.union(gpu["start_ns"], gpu["end_ns"]))
    rounded = iv.total(iv.union(-(-gpu["start_ns"].to_numpy(np.int64) // 1000) * 1000, gpu["end_ns"].to_numpy(np.int64) // 1000 * 1000))
    lost_ns = exact - rounded
    assert 1 * MS < lost_ns < 10 * MS
    assert (gpu["start_ns"].to_numpy(np.int64) % 1000 != 0).mean() > 0.5  # most timestamps are not whole µs


def test_steps_on_real_serving_traces(shared_traces):
    """vLLM, SGLang and HF step markers are found on the real traces and the numbers add up."""
    expect = {
        "vllm_b200_tp8_eager": "vllm",
        "sglang_qwen3-8b_decode": "sglang",
        "sglang_qwen3-8b_prefilldecode": "sglang",
        "hf_qwen1.5-0.5b_chat": "profiler_step",
    }
    for folder, marker in expect.items():
        cap = profkit.load(shared_traces / "tracelens" / folder)
        steps = step_table(cap.events)
        assert len(steps) >= 1 and set(steps["marker"]) == {marker}, folder
        assert (steps["gap_ns"] == steps["step_ns"] - steps["gpu_busy_ns"]).all()
        assert (steps["gpu_kernel_ns"] <= steps["gpu_busy_ns"]).all()
        assert (steps["gpu_busy_ns"] <= steps["step_ns"]).all()
    vllm = step_table(profkit.load(shared_traces / "tracelens" / "vllm_b200_tp8_eager").events)
    # the CPU-overhead case: the GPU is busy for a small part of the step
    assert (vllm["gpu_busy_ns"] / vllm["step_ns"]).max() < 0.5
