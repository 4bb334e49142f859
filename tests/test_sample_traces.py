"""The project's own GPU captures (sample_traces/engine-dep2-h200): read completely, steps found,
and the injected faults visible in the step table where truth.json says they fired."""
from __future__ import annotations

import json

import pytest

import profkit
from profkit.cli.main import main
from conftest import SAMPLE_TRACES

ENGINE = SAMPLE_TRACES / "engine-dep2-h200"
CAPTURES = ["torch_clean", "torch_straggler", "torch_split", "nsys_clean", "nsys_straggler"]
WINDOW_FIRST_STEP = 10  # every capture traced engine steps 10..29 on every rank


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", CAPTURES)
def test_capture_reads_completely_with_steps_on_both_ranks(name):
    cap = profkit.load(ENGINE / name)
    assert cap.skipped == []
    assert cap.ranks == [0, 1]
    steps = cap.steps()
    assert set(steps["marker"]) == {"engine_step"}
    assert steps.groupby("rank").size().tolist() == [20, 20]
    assert (steps["gpu_busy_ns"] > 0).all()  # both GPUs worked in every step
    timeline = cap.gpu_timeline()
    assert (timeline["n_kernels"] > 1000).all()
    assert (timeline["comm_ns"] > 0).all()  # NCCL all_to_all kernels recognized


@pytest.mark.parametrize("name", ["torch_straggler", "nsys_straggler", "torch_split"])
def test_injected_sleep_visible_in_the_straggler_step_times(name):
    truth = json.loads((ENGINE / name / "truth.json").read_text())
    sleep = next(c for c in truth["causes"] if c["kind"] == "sleep")
    assert sleep["rank"] == 1
    steps = profkit.load(ENGINE / name).steps()
    rank1 = steps[steps["rank"] == 1].set_index("step")["step_ns"]
    fault_steps = [s - WINDOW_FIRST_STEP for s in sleep["steps"] if s - WINDOW_FIRST_STEP in rank1.index]
    all_faults = {s - WINDOW_FIRST_STEP for c in truth["causes"] for s in c["steps"]}
    quiet = rank1[[s for s in rank1.index if s not in all_faults]]
    assert len(fault_steps) == 5 and len(quiet) >= 5
    for s in fault_steps:
        # the sleep sits inside rank 1's step: at least 80% of it on top of a quiet step
        assert rank1[s] - quiet.median() >= 0.8 * sleep["ms"] * 1e6, (s, rank1[s], quiet.median())


def test_clean_capture_has_no_outlier_steps():
    steps = profkit.load(ENGINE / "torch_clean").steps()
    for _, rank_steps in steps.groupby("rank"):
        assert rank_steps["step_ns"].max() < 1.5 * rank_steps["step_ns"].median()


def test_demo_command_runs_on_shipped_samples(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["n_steps"] for r in summary["ranks"]] == [20, 20]
    assert "steps found by marker 'engine_step'" in capsys.readouterr().out


def test_package_data_is_the_repository_copy():
    """What a wheel carries for ``profkit demo`` and ``profkit dashboard`` (profkit/data) is the
    same file as in sample_traces/ and dashboards/, not a copy that can drift."""
    from profkit.cli.demo import DEFAULT_SAMPLE, sample_path
    from profkit.data import shipped
    from profkit.report.dashboard import default_spec_path, load_spec

    repo = SAMPLE_TRACES.parent
    demo = shipped("samples", DEFAULT_SAMPLE)
    assert sample_path(DEFAULT_SAMPLE) == demo
    assert demo.resolve() == (SAMPLE_TRACES / DEFAULT_SAMPLE).resolve()
    assert shipped("samples", "engine-dep2-h200", "README.md").resolve() == (ENGINE / "README.md").resolve()
    assert sorted(p.name for p in (demo / "trace").iterdir()) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert default_spec_path().resolve() == (repo / "dashboards" / "default.json").resolve()
    assert len(load_spec().panels) == 7
