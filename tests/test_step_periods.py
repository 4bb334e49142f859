"""Steps from annotations that do not tile the iteration: the iteration period (issue #20).

vLLM's own step annotation (``execute_context_{n}(..)_generation_{n}(..)``, emitted while its
profiler runs) wraps the model runner's ``execute_model`` only; the scheduler, output processing
and any GC between two annotations are serving step time too. So a step runs from one
annotation's start to the next one's start on the same rank; GPU-idle time after the annotation
is charged to what ran there, else to ``host work between steps``. The last step has no next
start and ends at its annotation's end (kept: a one-step trace keeps its step).

Real evidence: the bundled engine's DEP2 H200 nsys captures carry the same annotation (NVTX, around
``execute_model``) beside the engine-loop span ``EngineCore.step``. With the loop span removed (a
trace as vLLM's own profiler writes it: worker annotations only), the annotation periods must add
up to the loop's own iterations, and in ``nsys_straggler`` the sleep injected at the start of rank
1's iterations (no span: unannotated host time between annotations) must come out as
``host work between steps``: 5 x 15 ms injected (``truth.json``).
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import profkit
from conftest import SAMPLE_TRACES
from profkit import schema
from profkit.analyze.vocabulary import BETWEEN_STEPS_CAUSE as BETWEEN_STEPS
from profkit.analyze.pipeline import analyze
from profkit.analyze.steps import iteration_periods, step_table
from profkit.ingest.loader import Capture

ENGINE = SAMPLE_TRACES / "engine-dep2-h200"


def without_loop_span(cap: Capture) -> Capture:
    ev = cap.events
    keep = ~ev["name"].astype(str).isin(["EngineCore.step"]).to_numpy(bool)
    return Capture(events=ev[keep].reset_index(drop=True), parts=cap.parts, meta=cap.meta, skipped=[], warnings=[])


@pytest.fixture(scope="module")
def straggler():
    cap = profkit.load(ENGINE / "nsys_straggler")
    return cap, analyze(without_loop_span(cap))


def test_periods_tile_the_engine_iterations(straggler):
    cap, a = straggler
    loop = step_table(cap.events)
    steps = a.steps
    assert set(loop["marker"]) == {"engine_step"} and set(steps["marker"]) == {"vllm"}
    for rank in (0, 1):
        s = steps[steps["rank"] == rank].sort_values("start_ns")
        # one period per annotation; each ends where the next one starts, the last at its own end
        assert (s["end_ns"].to_numpy()[:-1] == s["start_ns"].to_numpy()[1:]).all()
        assert s["whole_period"].tolist() == [True] * (len(s) - 1) + [False]
        assert s["end_ns"].iloc[-1] == s["marker_end_ns"].iloc[-1]
        assert (s["marker_end_ns"] <= s["end_ns"]).all()
        # the periods cover the loop's iterations over the same span of time: the same mean
        lp = loop[loop["rank"] == rank].sort_values("start_ns")
        period = np.diff(s["start_ns"].to_numpy(np.int64)).mean()
        loop_period = np.diff(lp["start_ns"].to_numpy(np.int64)).mean()
        assert period == pytest.approx(loop_period, rel=0.03)
        # a step is longer than its annotation: the host work between annotations is step time
        whole = s[s["whole_period"]]
        assert (whole["step_ns"] > whole["marker_end_ns"] - whole["start_ns"]).all()


def test_unannotated_time_between_steps_is_named(straggler):
    """Rank 1 slept 15 ms at the start of 5 iterations, outside every span: between annotations."""
    _, a = straggler
    truth = json.loads((ENGINE / "nsys_straggler" / "truth.json").read_text())
    sleep_ms = sum(ms for c in truth["causes"] if c["kind"] == "sleep"
                   for s, ms in zip(c["steps"], c["measured_ms"]) if 10 <= s < 30)
    assert sleep_ms == pytest.approx(75, abs=2)
    between = a.cause_steps[a.cause_steps["cause"] == BETWEEN_STEPS].groupby("rank")["ns"].sum()
    excess_ms = (between.get(1, 0) - between.get(0, 0)) / 1e6
    print(a.causes.head(8)[["cause", "total_ns", "step_share", "category"]].to_string(), excess_ms)
    # rank 0 has its own unannotated gaps (~0.1 ms a step); rank 1's beyond them is the sleep
    assert excess_ms == pytest.approx(sleep_ms, rel=0.10)
    assert a.causes.set_index("cause").loc[BETWEEN_STEPS, "category"] == "between_steps"
    # named host work between annotations keeps its name (the scheduler, sampling, output)
    assert {"Scheduler.schedule", "sample_tokens"} <= set(a.causes["cause"])
    # the straggler is still rank 1, its cause the unannotated sleep between steps
    assert a.straggler_ranks == [1]
    assert a.stragglers.set_index("rank").loc[1, "top_cause"] == BETWEEN_STEPS


def test_loop_span_steps_are_kept_as_they_are():
    """profkit's EngineCore.step and ProfilerStep#N cover whole iterations: untouched."""
    rows = []
    for k in range(4):
        t = 1_000_000 * k
        rows += [dict(rank=0, source="kineto", kind="cpu_span", name="EngineCore.step", start_ns=t, end_ns=t + 600_000,
                      pid=1, tid=1)]
    steps = step_table(schema.from_records(rows))
    assert (steps["step_ns"] == 600_000).all() and steps["whole_period"].all()
    assert (steps["marker_end_ns"] == steps["end_ns"]).all()


def test_annotation_periods_on_hand_built_spans():
    spans = pd.DataFrame({"rank": [0, 0, 0, 1, 1], "step": [0, 1, 2, 0, 1],
                          "start_ns": [0, 100, 250, 10, 120], "end_ns": [80, 170, 300, 90, 180],
                          "name": ["execute_context_1(1)_generation_0(0)"] * 5, "marker": "vllm"})
    out = iteration_periods(spans).sort_values(["rank", "start_ns"])
    assert out["end_ns"].tolist() == [100, 250, 300, 120, 180]
    assert out["marker_end_ns"].tolist() == [80, 170, 300, 90, 180]
    assert out["whole_period"].tolist() == [True, True, False, True, False]


def test_single_annotation_trace_keeps_its_step(shared_traces):
    """TraceLens's vLLM B200 trace: one annotation, one step, as long as the annotation."""
    ev = profkit.load(shared_traces / "tracelens" / "vllm_b200_tp8_eager").events
    steps = step_table(ev)
    assert len(steps) == 1 and not steps["whole_period"].iloc[0]
    assert steps["step_ns"].iloc[0] == pytest.approx(87.4e6, rel=0.01)
