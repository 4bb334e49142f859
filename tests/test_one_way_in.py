"""The whole-capture helpers agree with the per-rank stage path that ``profkit analyze`` runs
(issue #15: they must not drift from it): ``overhead.causes_table`` and
``compare.cause_step_samples`` over a loaded capture's aligned events give ``causes.csv`` and
``cause_steps.csv`` exactly, on real captures (a straggler DEP2 H200 capture, a vLLM 0.26 capture
with injected faults)."""
from __future__ import annotations

import pandas as pd
import pytest

import profkit
from profkit.analyze import overhead as ov
from profkit.analyze.compare import cause_step_samples
from profkit.analyze.pipeline import analyze
from tests.conftest import SAMPLE_TRACES

pytestmark = pytest.mark.xdist_group("analyze_golden")


@pytest.mark.parametrize("name", ["engine-dep2-h200/torch_straggler", "vllm-0.26-h200/torch_faults"])
def test_whole_capture_helpers_equal_the_stage_path(name):
    a = analyze(profkit.load(SAMPLE_TRACES / name))
    assert len(a.causes) > 5
    pd.testing.assert_frame_equal(ov.causes_table(a.events, a.steps), a.causes)
    key = ["rank", "step", "cause"]
    whole = cause_step_samples(a.events, a.steps).sort_values(key, kind="stable").reset_index(drop=True)
    staged = a.cause_steps.sort_values(key, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(whole, staged, check_dtype=False)
