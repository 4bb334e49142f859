"""Issue #14: the four measurements of vLLM's DeepSeek-V4.1-Flash / GB300 study, reproduced.

1. EP balancedness against uniform routing: the baseline's numbers are the study's published ones
   (independent of profkit): DEP32, 72 requests x 6 tokens per GPU, top-6 of 384 -> 0.96, top-3 of
   128 -> 0.94; 0.35 -> 0.94 against 0.96 is 97% of the gap. Then end to end: a no-EPLB and an
   EPLB run of skewed routing (generated here, placement linear vs greedy-balanced) through
   ``profkit analyze --expert-loads --experts --topk`` and ``profkit compare``.
2. The lag replay (rank r gets the same requests r x MS later), prefill-heavy, DEP4: the
   simulator knows the throughput its mirror twin reaches with the same seeds; ``profkit compare``
   of the mirror and lag runs must find the throughput change within 10%, on two seeds.
3. GPU-only vs serving: the simulator's bench-forward run of the same batches knows the serving
   run's gap; ``profkit compare --gpu-only`` must find it within 10%, and name the scheduler's
   share as the simulator spent it.
4. Scaling: DEP16 vs DEP32 with GPU work 1.1 ms faster at DEP32 and the same host jitter
   distribution: DEP32 is slower; compare splits the change into GPU + host + waiting, each
   within 10% of the simulator's own split (or 10% of the step-time change, where a part is
   smaller than that), and names waiting.
Plus the engine on CPU (Gloo): the lag replay holds requests back per rank, and --bench-forward
replays exactly the serving run's batch shapes.

What the simulator tests prove: that profkit measures what the simulator did, from the traces
alone. The simulator was written beside the analyzer, so they do not prove the model is vLLM.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.analyze.uniform import rank_of_expert, recovered_share, uniform_baseline, uniform_samples
from profkit.cli.main import main
from profkit.simulate import replay as sim_replay
from profkit.simulate import simulate

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def analyzed(tmp: Path, name: str, ranks: int, steps: int, seed: int, *extra: str, **options) -> tuple[Path, dict]:
    traces, out = tmp / name, tmp / f"{name}.out"
    truth = simulate(ranks, steps, seed, traces, workers=1, **options)
    assert main(["analyze", str(traces), "-o", str(out), "-q", *extra]) == 0
    return out, truth.to_json()


class Lazy(dict):
    """Runs made on first use, by key: xdist may hand a fixture's tests (one per seed) to two
    workers, each of which builds the module fixture; each then makes only the runs its tests
    read, not every seed's."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        self[key] = self.make(key)
        return self[key]


# ---- 1. EP balancedness against uniform routing ------------------------------------------------------------
def test_uniform_baseline_is_the_studys():
    """The study: DEP32, 72 requests per GPU x 6 tokens (1 + 5 draft), uniform routing ~0.96 (target,
    top-6 of 384) and ~0.94 (draft, top-3 of 128). Tolerance 0.01: the study gives two digits."""
    target = uniform_baseline(32, 384, 6, 72 * 6 * 32)
    draft = uniform_baseline(32, 128, 3, 72 * 6 * 32)
    assert target.mean == pytest.approx(0.96, abs=0.01) and draft.mean == pytest.approx(0.94, abs=0.01)
    assert target.lo < target.mean < target.hi and 0 < target.std < 0.02
    # by hand: ~2592 pairs per rank, sigma ~50 (hypergeometric per token), max of 32 ~ mean + 2.07 sigma
    per_token_var = 6 * (12 / 384) * (1 - 12 / 384) * (384 - 6) / (384 - 1)
    sigma = math.sqrt(72 * 6 * 32 * per_token_var)
    assert target.mean == pytest.approx(2592 / (2592 + 2.07 * sigma), abs=0.005)
    assert recovered_share(0.35, 0.94, 0.96) == pytest.approx(0.97, abs=0.01)
    assert recovered_share(0.21, 0.89, 0.94) == pytest.approx(0.93, abs=0.01)
    assert math.isnan(recovered_share(0.96, 0.97, 0.96))


def test_uniform_sampling_is_uniform_and_placement_is_vllms():
    x = uniform_samples(4, 10, 3, 200, draws=50, seed=3)
    assert x.tolist() == uniform_samples(4, 10, 3, 200, draws=50, seed=3).tolist() and (x <= 1).all()
    # linear placement: contiguous blocks, the first experts % ranks ranks one more (vLLM determine_expert_map)
    assert rank_of_expert(10, 4).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    from profkit.analyze.uniform import distinct_uniform

    picks = distinct_uniform(np.random.default_rng(0), 100_000, 6, 2)
    assert (picks[:, 0] != picks[:, 1]).all()
    pairs = np.bincount(np.sort(picks, 1) @ np.array([6, 1]), minlength=36)
    assert pairs[pairs > 0].size == 15 and np.ptp(pairs[pairs > 0]) < 0.1 * pairs.max()  # all 15 subsets alike


def test_balance_cli(tmp_path, capsys):
    js = tmp_path / "u.json"
    assert main(["balance", "--uniform", "--ranks", "32", "--experts", "384", "--topk", "6",
                 "--tokens-per-rank", "432", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "mean 0.96" in out and "95% of draws in [" in out
    doc = json.loads(js.read_text())["uniform"]
    assert doc["mean"] == pytest.approx(0.96, abs=0.01) and doc["lo"] < doc["mean"] < doc["hi"]
    assert main(["balance", "--uniform", "--ranks", "32"]) == 2
    assert "needs --experts, --topk, --tokens-per-rank" in capsys.readouterr().err


def skewed_loads(steps: int, ranks: int, experts: int, topk: int, tokens: int, balanced: bool, seed: int) -> pd.DataFrame:
    """Expert loads of skewed routing (popularity ~ 1/(e+1)^0.6, the hottest experts first): linear
    placement (what a deployment without EPLB has), or each expert on the least loaded rank in order
    of expected load (what EPLB's rearrangement approximates). Routing is weighted sampling
    without replacement (Gumbel top-k)."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, experts + 1) ** 0.6
    pop /= pop.sum()
    if balanced:
        owner, load = np.empty(experts, np.int64), np.zeros(ranks)
        slots = np.full(ranks, experts // ranks)
        for e in np.argsort(-pop):
            r = int(np.argmin(np.where(slots > 0, load, np.inf)))
            owner[e], load[r], slots[r] = r, load[r] + pop[e], slots[r] - 1
    else:
        owner = rank_of_expert(experts, ranks)
    rows = []
    for step in range(steps):
        for layer in range(2):
            keys = np.log(pop)[None, :] + rng.gumbel(size=(tokens * ranks, experts))
            picks = np.argpartition(-keys, topk, axis=1)[:, :topk]
            per_rank = np.bincount(owner[picks.ravel()], minlength=ranks)
            rows += [(r, step, layer, int(per_rank[r])) for r in range(ranks)]
    return pd.DataFrame(rows, columns=["rank", "step", "layer", "tokens"])


def test_compare_reports_the_share_of_the_gap_eplb_recovered(tmp_path, capsys):
    ranks, experts, topk, tokens, steps = 8, 64, 4, 64, 12
    traces = tmp_path / "sim"
    simulate(ranks, steps, 1, traces, workers=1, layers=2)
    outs = {}
    for name, balanced in (("noeplb", False), ("eplb", True)):
        loads = skewed_loads(steps, ranks, experts, topk, tokens, balanced, seed=7)
        loads.to_csv(tmp_path / f"{name}.csv", index=False)
        outs[name] = tmp_path / f"{name}.out"
        assert main(["analyze", str(traces), "-o", str(outs[name]), "-q", "--expert-loads", str(tmp_path / f"{name}.csv"),
                     "--experts", str(experts), "--topk", str(topk)]) == 0
        got = pd.read_csv(outs[name] / "balance.csv")
        assert {"uniform_balancedness", "uniform_lo", "uniform_hi", "recoverable", "step_tokens"} <= set(got.columns)
        assert (got["step_tokens"] == tokens * ranks).all()
        # real balancedness straight from the generated loads
        g = loads.groupby(["step", "layer"])["tokens"]
        assert got.sort_values(["step", "layer"])["balancedness"].to_numpy() == pytest.approx((g.mean() / g.max()).to_numpy())
    js = tmp_path / "cmp.json"
    main(["compare", str(outs["noeplb"]), str(outs["eplb"]), "--json", str(js), "--ep-csv", str(tmp_path / "ep.csv")])
    out = capsys.readouterr().out
    assert "EP balance vs uniform routing" in out and "of the recoverable gap" in out
    doc = json.loads(js.read_text())["ep_balance"]
    rows = {r["metric"]: r for r in doc["rows"]}
    real_b, real_c = rows["balancedness"]["base"], rows["balancedness"]["cand"]
    uniform = uniform_baseline(ranks, experts, topk, tokens * ranks, draws=100).mean
    assert real_b < 0.5 and real_c > 0.8  # skew on linear placement is badly balanced (~0.38, the study 0.35); greedy is not
    assert rows["recovered_share"]["cand"] == pytest.approx((real_c - real_b) / (uniform - real_b), abs=0.01)
    assert rows["recovered_share"]["delta_lo"] < rows["recovered_share"]["cand"] < rows["recovered_share"]["delta_hi"]
    assert pd.read_csv(tmp_path / "ep.csv")["metric"].tolist()[-1] == "recovered_share"


# ---- 2. the lag replay ---------------------------------------------------------------------------------------
def test_lag_of_zero_is_the_mirror_and_lag_shifts_each_rank():
    mirror = sim_replay.build("mirror", 4, 30, 0, "prefill")
    zero = sim_replay.LagReplay(4, 30, 0, 0, "prefill")
    lag = sim_replay.LagReplay(4, 30, 0, 40_000_000, "prefill")
    for s in range(30):  # a step clock of 20 ms
        zero.admit(s, s * 20_000_000)
        lag.admit(s, s * 20_000_000)
    assert (zero.tokens == mirror.tokens).all()
    # rank r admits each request r x 40 ms = 2r steps after rank 0 did (rank 0 admits at the arrival step)
    for r in range(1, 4):
        assert (lag.prefill_tokens[r, 2 * r + 1:] == lag.prefill_tokens[0, 1:30 - 2 * r]).all()
    assert (lag.prefill_tokens[0] == mirror.prefill_tokens[0]).all()
    assert (lag.admitted[:, 1][lag.admitted[:, 0] >= 0] - lag.admitted[:, 0][lag.admitted[:, 0] >= 0] == 2).all()
    assert lag.tokens.sum(axis=1).std() / lag.tokens.sum(axis=1).mean() < 0.05  # the same work on every rank


@pytest.fixture(scope="module")
def lag_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lag")
    return Lazy(lambda key: analyzed(tmp, f"{key[1]}{key[0]}", 4, 36, key[0], replay=key[1], workload="prefill",
                                     layers=4))


@pytest.mark.parametrize("seed", [1, 2])
def test_compare_prices_the_lag_within_10_percent(lag_runs, seed, tmp_path):
    (mirror, _), (lag, truth) = lag_runs[seed, "mirror"], lag_runs[seed, "lag"]
    rep = truth["replay"]
    assert rep["mode"] == "lag" and rep["lag_ms"] == sim_replay.DEFAULT_LAG_MS
    js = tmp_path / "cmp.json"
    main(["compare", str(mirror), str(lag), "--json", str(js), "-q"])
    dp = json.loads(js.read_text())["dp_imbalance"]
    thr = next(m for m in dp["metrics"] if m["metric"] == "throughput")
    # truth over the steps the analysis kept: tokens / step time, this run and its mirror twin
    kept = pd.read_csv(lag / "steps.csv")["step"].unique()
    tokens, twin = np.asarray(rep["tokens"]), rep["mirror_twin"]
    want = (tokens[kept].sum() / np.asarray(rep["step_ns_mean"])[kept].sum()) / \
        (np.asarray(twin["tokens"])[kept].sum() / np.asarray(twin["step_ns_mean"])[kept].sum()) - 1
    assert want < -0.10 and rep["throughput_change"] < -0.10  # prefill bursts out of phase cost throughput
    assert thr["rel"] == pytest.approx(want, rel=0.10), (thr, want)
    assert thr["rel_hi"] < 0 and dp["significant"]
    assert dp["sides"]["cand"]["balancedness_mean"] < 0.8 and dp["sides"]["base"]["balancedness_min"] == 1.0


# ---- 3. GPU-only vs serving ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    return Lazy(lambda seed: (analyzed(tmp, f"serving{seed}", 8, 16, seed, layers=4),
                              analyzed(tmp, f"gpu{seed}", 8, 16, seed, layers=4, bench_forward=True)))


@pytest.mark.parametrize("seed", [1, 2])
def test_gpu_only_gap_within_10_percent(bench_runs, seed, tmp_path):
    (serving, _), (gpu_only, truth) = bench_runs[seed]
    steps = pd.read_csv(gpu_only / "steps.csv")
    assert (steps["marker"] == "vllm").all() and steps["num_tokens"].notna().all()  # no serving loop: annotations mark steps
    js, table = tmp_path / "g.json", tmp_path / "g.csv"
    assert main(["compare", "--gpu-only", str(gpu_only), str(serving), "--json", str(js), "--gpu-only-csv", str(table)]) == 0
    got = json.loads(js.read_text())["gpu_only"]
    bench = truth["bench_forward"]
    assert got["pairing"]["exact"] == len(pd.read_csv(serving / "steps.csv")) and got["pairing"]["unpaired"] == 0
    assert got["gap_ns"] == pytest.approx(bench["gap_ns_mean"], rel=0.10)
    assert got["gap_ci"][0] <= got["gap_ns"] <= got["gap_ci"][1]
    parts = {p["part"]: p["mean_ns"] for p in got["parts"]}
    assert sum(parts.values()) == pytest.approx(got["gap_ns"], rel=1e-9)  # the decomposition is exact
    # the scheduler ran with the GPU idle: all of it is gap, as the simulator spent it
    assert parts["Scheduler.schedule"] == pytest.approx(bench["serving_spans_ns_mean"]["Scheduler.schedule"], rel=0.10)
    assert parts["waiting for other ranks"] > 0
    assert list(pd.read_csv(table).columns) == ["part", "mean_ns", "lo_ns", "hi_ns", "share_of_gap"]


def test_gpu_only_pairs_the_nearest_shape():
    from profkit.analyze.gpu_only import gpu_only_gap

    gpu = pd.DataFrame({"rank": 0, "step": [0, 1, 2], "step_ns": [100, 200, 300], "num_tokens": [10, 20, 40],
                        "batch_size": [10, 20, 40]})
    srv = pd.DataFrame({"rank": 0, "step": [0, 1, 2, 3], "step_ns": [150, 260, 330, 500],
                        "num_tokens": [10, 22, 40, None], "batch_size": [10, 22, 40, None]})
    got = gpu_only_gap(gpu, srv, None, n_resamples=200)
    assert got.pairing == {"exact": 2, "nearest": 1, "unpaired": 1, "gpu_only_shapes": 3, "gpu_only_steps": 3,
                           "max_token_distance": 2}
    assert got.gap_ns == pytest.approx((50 + 60 + 30) / 3)
    assert any("nearest shape" in n for n in got.notes) and any("left out" in n for n in got.notes)


# ---- 4. scaling: DEP16 vs DEP32 ------------------------------------------------------------------------------
# GPU work per step: 2 layers at gpu_scale 8.0 (DEP16) vs 5.73 (DEP32): 1.1 ms less at DEP32. The same
# host jitter distribution on every rank: an exponential stall of mean 2 ms before each all-to-all launch.
# Per step the slowest of 32 ranks is later than the slowest of 16 by ~0.7 x 2 ms per sync point, but the
# maximum of exponentials is noisy (about 2 ms per step): over 12 steps the step-time change is positive
# in the truth and in profkit on every seed tried, yet its interval (sides resampled independently, as for
# two real deployments) does not always exclude 0, so the test asks for the point and the split, not that.
SCALING = {16: 8.0, 32: 5.73}


@pytest.fixture(scope="module")
def scaling_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scaling")
    return Lazy(lambda key: analyzed(tmp, f"dep{key[1]}s{key[0]}", key[1], 12, key[0], layers=2,
                                     gpu_scale=SCALING[key[1]], host_jitter_ms=2.0))


@pytest.mark.parametrize("seed", [1, 2])
def test_dep32_slower_than_dep16_because_of_waiting(scaling_runs, seed, tmp_path):
    (d16, t16), (d32, t32) = scaling_runs[seed, 16], scaling_runs[seed, 32]
    js, table = tmp_path / "s.json", tmp_path / "s.csv"
    main(["compare", str(d16), str(d32), "--json", str(js), "--scaling-csv", str(table), "-q"])
    sc = json.loads(js.read_text())["scaling"]
    parts = {p["part"]: p for p in sc["parts"]}
    o16, o32 = t16["decomposition"]["observed"], t32["decomposition"]["observed"]
    truth = {k: o32[f"{k}_mean"] - o16[f"{k}_mean"] for k in ("step_ns", "gpu_ns", "host_ns", "wait_ns")}
    # the scenario is the study's: GPU ~1.1 ms faster at DEP32, and yet DEP32 is slower
    gpu16, gpu32 = t16["decomposition"]["gpu_ns_mean"], t32["decomposition"]["gpu_ns_mean"]
    assert gpu32 - gpu16 == pytest.approx(-1.1e6, rel=0.10)
    assert truth["step_ns"] > 0 and parts["step_ns"]["delta"] > 0
    for k, want in truth.items():
        tol = max(0.10 * abs(want), 0.10 * abs(truth["step_ns"]))
        assert parts[k]["delta"] == pytest.approx(want, abs=tol), (k, parts[k], want)
    assert max(("gpu_ns", "host_ns", "wait_ns"), key=lambda k: parts[k]["delta"]) == "wait_ns"
    assert "mostly because of waiting for other ranks" in sc["headline"] and "although the GPU time" in sc["headline"]
    assert sum(parts[k]["delta"] for k in ("gpu_ns", "host_ns", "wait_ns")) == pytest.approx(parts["step_ns"]["delta"])
    assert list(pd.read_csv(table)["part"]) == ["step_ns", "gpu_ns", "host_ns", "wait_ns"]


# ---- the engine on CPU (Gloo) ----------------------------------------------------------------------------------
ENGINE = [sys.executable, "-m", "profkit.engine", "--ranks", "2", "--layers", "1"]


def _engine(*args: str) -> None:
    proc = subprocess.run([*ENGINE, *args], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.xdist_group("multiprocess")
def test_engine_lag_replay_holds_requests_back_per_rank(tmp_path):
    pytest.importorskip("torch")
    for name, lag in (("mirror", "0"), ("lag", "120")):
        _engine("--steps", "10", "--replay", "lag", "--lag-ms", lag, "--token-us", "1000", "--out", str(tmp_path / name),
                "--truth", str(tmp_path / f"{name}.json"))
    arrived = {name: json.loads((tmp_path / f"{name}.json").read_text())["replay"]["arrived_per_step"]
               for name in ("mirror", "lag")}
    m, lg = arrived["mirror"], arrived["lag"]
    assert m["0"] == m["1"] and m["0"][0] > 0  # lag 0: both ranks get every request when it arrives
    assert lg["0"] == m["0"]  # rank 0 is never lagged
    assert lg["1"][0] == 0 and np.all(np.cumsum(lg["1"]) <= np.cumsum(lg["0"]))
    assert sum(lg["1"]) > 0  # ... and gets them 120 ms later


@pytest.mark.xdist_group("multiprocess")
def test_engine_bench_forward_replays_the_serving_shapes(tmp_path):
    pytest.importorskip("torch")
    _engine("--steps", "8", "--token-us", "300", "--out", str(tmp_path / "serving"), "--torch-profile",
            str(tmp_path / "serving_tr"), "--profile-steps", "1:8")
    _engine("--steps", "8", "--token-us", "300", "--bench-forward", str(tmp_path / "serving"), "--out",
            str(tmp_path / "bench"), "--torch-profile", str(tmp_path / "bench_tr"), "--profile-steps", "1:8",
            "--truth", str(tmp_path / "bench.json"))
    for r in (0, 1):
        srv = [json.loads(x) for x in (tmp_path / "serving" / f"rank{r}.steps.jsonl").read_text().splitlines()]
        gpu = [json.loads(x) for x in (tmp_path / "bench" / f"rank{r}.steps.jsonl").read_text().splitlines()]
        keys = ("num_tokens", "padded_tokens", "n_prefill", "prefill_tokens", "n_decode")
        assert [[x[k] for k in keys] for x in gpu] == [[x[k] for k in keys] for x in srv]
        assert all("Scheduler.schedule" not in x["phase_ns"] and "sample_tokens" not in x["phase_ns"] for x in gpu)
    for name in ("serving", "bench"):
        assert main(["analyze", str(tmp_path / f"{name}_tr"), "-o", str(tmp_path / f"{name}.out"), "-q"]) == 0
    js = tmp_path / "g.json"
    assert main(["compare", "--gpu-only", str(tmp_path / "bench.out"), str(tmp_path / "serving.out"), "--json", str(js)]) == 0
    got = json.loads(js.read_text())["gpu_only"]
    assert got["pairing"]["exact"] == 14 and got["pairing"]["unpaired"] == 0
    assert math.isfinite(got["gap_ns"]) and got["gpu_only_ns"] > 0
