"""``profkit compare``: bootstrap intervals and verdicts, on synthetic samples and on the real captures."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.analyze import compare as cmp
from profkit.cli.main import main

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces" / "engine-dep2-h200"


# ---- pure: synthetic samples -------------------------------------------------------------------
def steps_table(step_ms: np.ndarray, gpu_ms: np.ndarray | None = None) -> pd.DataFrame:
    """A steps.csv-like table: rows = (step, rank) from a [n_steps, n_ranks] matrix of ms."""
    n_steps, n_ranks = step_ms.shape
    gpu_ms = np.full_like(step_ms, 5.0) if gpu_ms is None else gpu_ms
    step_ns = (step_ms * 1e6).astype("int64")
    gpu_ns = (gpu_ms * 1e6).astype("int64")
    return pd.DataFrame({
        "rank": np.tile(np.arange(n_ranks), n_steps), "step": np.repeat(np.arange(n_steps), n_ranks),
        "step_ns": step_ns.ravel(), "gpu_busy_ns": gpu_ns.ravel(), "gap_ns": (step_ns - gpu_ns).ravel(),
    })


def noisy(rng, n_steps=60, n_ranks=4, mean=20.0, sd=1.0) -> np.ndarray:
    shared = rng.normal(mean, sd, size=(n_steps, 1))  # ranks sync every step: shared step noise
    return shared + rng.normal(0, sd / 4, size=(n_steps, n_ranks))


def test_equal_distributions_are_within_noise():
    rng = np.random.default_rng(1)
    a = cmp.samples_from_tables(steps_table(noisy(rng)))
    b = cmp.samples_from_tables(steps_table(noisy(rng)))
    result = cmp.compare(a, b, threshold=0.05, seed=3)
    assert result.verdict == cmp.NOISE and not result.regressed
    assert result.headline.startswith("within noise")
    p50 = result.changes[0]
    assert p50.metric.key == "step_ns_p50"
    assert p50.rel_ci[0] < 0.05 and p50.rel_ci[1] > -0.05


def test_slowdown_beyond_threshold_regresses_and_speedup_improves():
    rng = np.random.default_rng(2)
    base = steps_table(noisy(rng))
    slow = steps_table(noisy(rng, mean=26.0))  # +30%
    fast = steps_table(noisy(rng, mean=15.0))  # -25%
    b = cmp.samples_from_tables(base)
    worse = cmp.compare(b, cmp.samples_from_tables(slow), threshold=0.05)
    p50 = {c.metric.key: c for c in worse.changes}["step_ns_p50"]
    assert p50.verdict == cmp.REGRESSED and p50.rel_ci[0] > 0.05
    assert p50.rel == pytest.approx(0.30, abs=0.06)
    assert p50.delta_ci[0] < p50.delta < p50.delta_ci[1]
    assert worse.verdict == cmp.REGRESSED and worse.headline.startswith("regressed: step time p50 +")
    better = cmp.compare(b, cmp.samples_from_tables(fast), threshold=0.05)
    assert {c.metric.key: c for c in better.changes}["step_ns_p50"].verdict == cmp.IMPROVED
    assert better.verdict == cmp.IMPROVED
    # a change inside the threshold is noise even when the interval excludes zero
    slight = cmp.compare(b, cmp.samples_from_tables(steps_table(noisy(rng, mean=20.4))), threshold=0.10)
    assert {c.metric.key: c for c in slight.changes}["step_ns_p50"].verdict == cmp.NOISE


def test_seeded_and_reproducible():
    rng = np.random.default_rng(4)
    a = cmp.samples_from_tables(steps_table(noisy(rng)))
    b = cmp.samples_from_tables(steps_table(noisy(rng)))
    one = cmp.compare(a, b, seed=7).to_dict()
    two = cmp.compare(a, b, seed=7).to_dict()
    other = cmp.compare(a, b, seed=8).to_dict()
    assert one == two
    assert one["metrics"][0]["rel_ci"] != other["metrics"][0]["rel_ci"]


def test_bootstrap_resamples_whole_steps():
    # every rank of a step equal, steps differ: a resample's median is always one of the step values
    m = np.repeat(np.arange(10, dtype=float)[:, None], 3, axis=1)
    reps = cmp.bootstrap(m, "max", 500, np.random.default_rng(0))
    assert set(np.unique(reps)) <= set(range(10))
    const = cmp.bootstrap(np.full((8, 2), 4.0), "p90", 200, np.random.default_rng(0))
    assert np.all(const == 4.0)
    # missing ranks (NaN) are skipped, not counted as zero
    holes = np.array([[1.0, np.nan], [1.0, 1.0], [np.nan, 1.0]])
    assert np.all(cmp.bootstrap(holes, "mean", 100, np.random.default_rng(0)) == 1.0)


def test_cause_change_is_judged_against_the_step():
    rng = np.random.default_rng(5)
    steps = steps_table(noisy(rng, n_steps=40, n_ranks=2))
    cause_rows = lambda ms: pd.DataFrame({"rank": steps["rank"], "step": steps["step"], "cause": "gc",  # noqa: E731
                                          "ns": (rng.normal(ms, 0.05, len(steps)) * 1e6).astype("int64")})
    small_b = cmp.samples_from_tables(steps, cause_steps=cause_rows(0.01))
    small_c = cmp.samples_from_tables(steps, cause_steps=cause_rows(0.2))  # x20 itself, +1% of a 20 ms step
    big_c = cmp.samples_from_tables(steps, cause_steps=cause_rows(3.0))  # +15% of a step
    m = cmp.metric("cause:gc")
    assert m.relative_to == "step" and m.stat == "mean"
    small = cmp.change(small_b, small_c, m, threshold=0.05)
    assert small.verdict == cmp.NOISE and small.rel == pytest.approx(0.0095, abs=0.003)
    big = cmp.change(small_b, big_c, m, threshold=0.05)
    assert big.verdict == cmp.REGRESSED and big.delta == pytest.approx(2.99e6, rel=0.02)
    result = cmp.compare(small_b, big_c)
    assert result.top_cause is not None and result.top_cause.metric.label == "gc"
    assert result.headline.startswith("regressed: top cause: gc +2.9")


def test_without_samples_a_metric_is_shown_but_not_judged():
    rng = np.random.default_rng(6)
    steps = steps_table(noisy(rng))
    causes = pd.DataFrame({"cause": ["gc"], "total_ns": [10], "per_step_ns": [1_000_000]})
    causes2 = causes.assign(per_step_ns=[9_000_000])
    r = cmp.compare(cmp.samples_from_tables(steps, causes), cmp.samples_from_tables(steps, causes2))
    gc = {c.metric.key: c for c in r.changes}["cause:gc"]
    assert gc.verdict == cmp.UNJUDGED and gc.note == "no per-step samples" and gc.delta == 8_000_000
    assert r.verdict == cmp.NOISE  # never gates


def test_higher_is_better_metrics_are_mirrored():
    rng = np.random.default_rng(7)
    steps = steps_table(noisy(rng))
    bal = lambda mean: pd.DataFrame({"step": np.arange(60), "layer": -1,  # noqa: E731
                                     "balancedness": np.clip(rng.normal(mean, 0.02, 60), 0, 1)})
    good = cmp.samples_from_tables(steps, balance=bal(0.9))
    bad = cmp.samples_from_tables(steps, balance=bal(0.6))
    m = cmp.metric("balancedness")
    assert m.better == cmp.HIGHER
    assert cmp.change(good, bad, m).verdict == cmp.REGRESSED
    assert cmp.change(bad, good, m).verdict == cmp.IMPROVED
    assert m in cmp.headline_metrics(good, bad)


def test_threshold_parsing():
    assert cmp.parse_threshold("5%") == pytest.approx(0.05)
    assert cmp.parse_threshold("12.5") == pytest.approx(0.125)
    with pytest.raises(ValueError, match="percentage"):
        cmp.parse_threshold("five")


# ---- the CLI on real captures ------------------------------------------------------------------------
def analyze_into(capture: str, out: Path) -> Path:
    """``profkit analyze CAPTURE -o OUT``; it writes ``cause_steps.csv`` itself (checked)."""
    assert main(["analyze", str(SAMPLES / capture), "-o", str(out), "-q"]) == 0
    assert (out / "cause_steps.csv").is_file(), "profkit analyze did not write cause_steps.csv"
    return out


@pytest.fixture(scope="module")
def outs(tmp_path_factory):
    base = tmp_path_factory.mktemp("compare")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFKIT_CACHE_DIR", str(base / "cache"))
        yield {
            "torch_clean": analyze_into("torch_clean", base / "torch_clean"),
            "torch_clean_again": analyze_into("torch_clean", base / "torch_clean_again"),
            "torch_straggler": analyze_into("torch_straggler", base / "torch_straggler"),
            "nsys_clean": analyze_into("nsys_clean", base / "nsys_clean"),
            "nsys_straggler": analyze_into("nsys_straggler", base / "nsys_straggler"),
        }


@pytest.mark.parametrize("name", ["torch_straggler", "nsys_straggler"])
def test_analyze_writes_the_cause_samples_behind_causes_csv(outs, name):
    """``cause_steps.csv`` (written by ``profkit analyze``, nothing else) is ``causes.csv`` split by
    (rank, step): the same causes, the same totals to the nanosecond, only steps of ``steps.csv``,
    and the injected straggler's waits in it (rank 0 waiting for rank 1)."""
    out = outs[name]
    samples = pd.read_csv(out / "cause_steps.csv")
    assert list(samples.columns) == ["rank", "step", "cause", "ns"]
    assert not samples.duplicated(["rank", "step", "cause"]).any() and (samples["ns"] >= 0).all()
    causes = pd.read_csv(out / "causes.csv").set_index("cause")["total_ns"]
    per_cause = samples.groupby("cause")["ns"].sum()
    per_cause = per_cause[per_cause != 0]
    pd.testing.assert_series_equal(per_cause.sort_index(), causes.sort_index().astype("int64"), check_names=False)
    steps = pd.read_csv(out / "steps.csv")
    assert set(zip(samples["rank"], samples["step"])) <= set(zip(steps["rank"], steps["step"]))
    waits = samples[samples["cause"] == "waiting for rank 1"]
    assert len(waits) and set(waits["rank"]) == {0}


def test_same_capture_twice_is_within_noise(outs, capsys, tmp_path):
    js = tmp_path / "cmp.json"
    rc = main(["compare", str(outs["torch_clean"]), str(outs["torch_clean_again"]), "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.strip().splitlines()[-1].startswith("within noise")
    doc = json.loads(js.read_text())
    assert doc["verdict"] == "within noise"
    # one-number-per-run metrics (the straggler score) have no per-step samples: "not judged"
    assert all(m["verdict"] == "within noise" or (m["verdict"] == "not judged" and m["note"] == "no per-step samples")
               for m in doc["metrics"])
    assert sum(m["verdict"] == "within noise" for m in doc["metrics"]) >= 5
    assert all(m["delta"] == 0 for m in doc["metrics"])


def test_clean_vs_fault_injected_torch_capture_regresses_and_names_the_cause(outs, capsys, tmp_path):
    """torch_straggler injects a 15 ms sleep (steps 12, 16, ...) and 10 ms of extra scheduling
    (14, 18, ...) on rank 1, and rank 0 waits for it. Honest about this pair: the clean capture ran
    with rank 0 slow (its rank 1 waited 5.6 ms per step for rank 0), so its *median* step is not
    faster than the straggler's (22.9 vs 19.5 ms, see the README) and step time p50 must not be
    called a regression. What the fault adds is the wait for rank 1, and the sleep and scheduling
    time on rank 1 itself."""
    js = tmp_path / "cmp.json"
    rc = main(["compare", str(outs["torch_clean"]), str(outs["torch_straggler"]), "--threshold", "5%", "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 1
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("regressed: top cause: waiting for rank 1 +")
    doc = json.loads(js.read_text())
    by = {m["metric"]["key"]: m for m in doc["metrics"]}
    assert doc["top_cause"] == "waiting for rank 1"
    wait = by["cause:waiting for rank 1"]
    assert wait["verdict"] == "regressed" and wait["rel_ci"][0] > 0.05
    assert 2.5e6 < wait["delta"] < 5.5e6  # ~3.9 ms per rank and step
    assert by["step_ns_p50"]["verdict"] != "regressed"
    # the injected work itself grew on rank 1: the sleep (EngineCore.step self time) and scheduling
    assert by["cause:EngineCore.step"]["delta"] > 1.5e6 and by["cause:Scheduler.schedule"]["delta"] > 0.3e6
    assert "cause: waiting for rank 1" in out and "95% interval" in out


def test_clean_vs_fault_injected_nsys_capture_regresses_step_time(outs, capsys):
    rc = main(["compare", str(outs["nsys_clean"]), str(outs["nsys_straggler"]), "-q"])
    line = capsys.readouterr().out.strip()
    assert rc == 1
    assert line.startswith("regressed: step time p50 +") and "top cause: waiting for rank 1 +" in line
    assert "\n" not in line  # -q: the verdict only


def test_without_cause_samples_causes_are_not_judged(outs, capsys, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(outs["torch_straggler"], bare)
    (bare / "cause_steps.csv").unlink()
    rc = main(["compare", str(outs["torch_clean"]), str(bare)])
    out = capsys.readouterr().out
    assert "not judged (no per-step samples)" in out
    assert "note (cand): no cause_steps.csv" in out
    assert rc == 0  # step-level metrics alone do not show this fault (see the test above)


def test_compare_labels_in_the_history(outs, capsys, tmp_path):
    db = str(tmp_path / "runs.sqlite")
    for label, key in (("nightly-1", "nsys_clean"), ("nightly-2", "nsys_straggler")):
        assert main(["history", "add", str(outs[key]), "--db", db, "--label", label, "-q"]) == 0
    assert main(["compare", "nightly-1", "nightly-2", "--db", db, "-q"]) == 1
    assert capsys.readouterr().out.startswith("regressed: step time p50")
    assert main(["compare", "#1", str(outs["nsys_clean"]), "--db", db, "-q"]) == 0
    assert capsys.readouterr().out.startswith("within noise")


def test_compare_bad_inputs(outs, capsys, tmp_path):
    assert main(["compare", str(outs["torch_clean"]), "nightly-9"]) == 2
    assert "no such analysis folder (give --db" in capsys.readouterr().err
    assert main(["compare", str(SAMPLES / "torch_clean"), str(outs["torch_clean"])]) == 2
    assert "not an analysis folder" in capsys.readouterr().err
    assert main(["compare", str(outs["torch_clean"]), str(outs["torch_clean"]), "--threshold", "lots"]) == 2
    assert "threshold" in capsys.readouterr().err


def test_straggler_tables_when_present():
    """stragglers.csv gives the worst rank's score (shown, no per-step samples); lateness.csv gives
    the worst rank's lateness per step, judged like a cause (against the step)."""
    rng = np.random.default_rng(8)
    steps = steps_table(noisy(rng, n_steps=40, n_ranks=2))
    late = lambda ms: pd.DataFrame({"rank": steps["rank"], "step": steps["step"],  # noqa: E731
                                    "late_ns": np.where(steps["rank"] == 1, rng.normal(ms, 0.1, len(steps)) * 1e6, 0).astype("int64")})
    strag = lambda score: pd.DataFrame({"rank": [0, 1], "score": [1.0, score], "top_cause": ["-", "EngineCore.step"]})  # noqa: E731
    base = cmp.samples_from_tables(steps, lateness=late(0.5), stragglers=strag(0.97))
    cand = cmp.samples_from_tables(steps, lateness=late(4.0), stragglers=strag(0.8))
    r = cmp.compare(base, cand)
    by = {c.metric.key: c for c in r.changes}
    assert by["late_ns_mean"].verdict == cmp.REGRESSED and by["late_ns_mean"].metric.label == "worst-rank lateness per step"
    score = by["straggler_score_min"]
    assert score.verdict == cmp.UNJUDGED and score.base == 0.97 and score.cand == 0.8 and score.metric.better == cmp.HIGHER
    assert cand.late_because == {0: "-", 1: "EngineCore.step"}


@pytest.mark.parametrize("stat", ["mean", "max", "p90"])
@pytest.mark.parametrize("holes", [False, True])
def test_bootstrap_with_rows_drawn_once_is_the_bootstrap_that_draws_them(stat, holes):
    """``resample_rows`` drawn once from a generator of the bootstrap's seed give the very same
    resamples (the impact table draws them once for all its scenarios); a matrix without missing
    values divides by its size, as its counts would sum to."""
    from profkit.analyze.compare import bootstrap, resample_rows

    m = np.random.default_rng(5).normal(size=(37, 3)) * 1e6
    if holes:
        m[::4, 1] = np.nan
    want = bootstrap(m, stat, 300, np.random.default_rng([0, 17]))
    idx = resample_rows(np.random.default_rng([0, 17]), m.shape[0], 300)
    got = bootstrap(m, stat, 300, np.random.default_rng(99), idx=idx)
    np.testing.assert_array_equal(got, want)
    if stat == "mean" and not holes:  # divided by the resampled counts' sum, as before this round
        counts = np.full(m.shape[0], m.shape[1])
        np.testing.assert_array_equal(want, m.sum(axis=1)[idx].sum(axis=1) / counts[idx].sum(axis=1))
