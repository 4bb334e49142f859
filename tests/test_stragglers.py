"""Straggler analysis (profkit.analyze.stragglers): who arrives late at the sync points, and why.

Known answers three ways: hand-built event tables (exact ns), simulated DEP8/32/64 captures whose
truth.json lists every injected delay (precision / recall of the straggler verdict, the cause,
the charged time), and the project's real DEP2 H200 captures with an injected sleep and a slow
scheduler on rank 1.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import profkit
from conftest import SAMPLE_TRACES
from profkit import schema
from profkit.align import apply_alignment, estimate
from profkit.analyze import straggler_arrivals as arr_mod
from profkit.analyze import straggler_phases as ph_mod
from profkit.analyze import stragglers as st
from profkit.analyze.collectives import collective_instances
from profkit.collectives.instances import match_instances
from profkit.analyze.steps import step_table
from profkit.simulate import Inject, simulate

ENGINE = SAMPLE_TRACES / "engine-dep2-h200"
WINDOW_FIRST_STEP = 10  # the engine captures trace engine steps 10..29: step 0 = engine step 10


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def analyze(events: pd.DataFrame):
    """What the pipeline does: align, steps on the aligned events, instances moved too."""
    est = estimate(events)
    aligned = apply_alignment(events, est)
    steps = step_table(aligned)
    inst = apply_alignment(est.instances, est)
    return st.straggler_table(aligned, steps, inst)


# ---- hand-built events ------------------------------------------------------------------------
def frame(rows: list[dict]) -> pd.DataFrame:
    df = schema.from_records(rows)
    schema.validate(df)
    return df


def span(name, start, end, rank=0, kind=schema.CPU_SPAN, pid=1, tid=1, **extra):
    return {"rank": rank, "source": "t", "kind": kind, "name": name, "start_ns": start, "end_ns": end,
            "pid": pid + 10 * rank, "tid": tid + 10 * rank, **extra}


def dp_capture(sched_ns: dict[tuple[int, int], int], ranks: int = 3, steps: int = 4) -> pd.DataFrame:
    """Ranks that schedule then meet at a Gloo DP all-reduce every step (one clock, no GPU).

    ``sched_ns[(rank, step)]`` overrides the 1000 ns schedule; the sync ends for all 50 ns after
    the last arrival, then the model runs 2000 ns and the step ends.
    """
    rows, t = [], 0
    for s in range(steps):
        arrive = {r: t + sched_ns.get((r, s), 1000) for r in range(ranks)}
        end = max(arrive.values()) + 50
        for r in range(ranks):
            rows += [span("EngineCore.step", t, end + 2000, rank=r), span("Scheduler.schedule", t, arrive[r], rank=r),
                     span("sync_dp_padding", arrive[r], end, rank=r), span("execute_model", end, end + 2000, rank=r)]
        t = end + 2100
    return frame(rows)


def test_last_arriver_lateness_caused_wait_and_cause_exactly():
    ev = dp_capture({(2, 1): 1300, (0, 2): 1100})
    per_rank, per_inst, late = st.straggler_table(ev, step_table(ev))
    inst = per_inst.set_index("step")
    assert inst.loc[1, "last_rank"] == 2 and inst.loc[1, "arrival_skew_ns"] == 300
    assert inst.loc[1, "last_late_ns"] == 300  # minus the median of the others (both at 1000)
    assert inst.loc[1, "caused_wait_ns"] == 600  # two ranks waited 300 each
    assert inst.loc[1, "top_cause"] == "Scheduler.schedule" and inst.loc[1, "top_cause_ns"] == 300
    assert inst.loc[2, "last_rank"] == 0 and inst.loc[2, "last_late_ns"] == 100
    r = per_rank.set_index("rank")
    assert r.loc[2, "times_last"] >= 1 and r.loc[2, "caused_wait_ns"] >= 600
    assert r.loc[2, "top_cause"] == "Scheduler.schedule"
    cell = late.set_index(["rank", "step"]).loc[(2, 1)]
    assert cell["late_ns"] == 300 and cell["times_last"] == 1 and cell["caused_wait_ns"] == 600
    assert list(per_rank.columns[:7]) == st.STRAGGLER_COLUMNS


def test_start_up_before_the_first_step_is_not_own_work():
    """Span files cover a process from its start: imports, model load, process-group set-up. A
    rank whose start-up ran longer (here 50 us of ``load_model`` and unspanned time before step 0,
    against 0 on the others) did nothing slower in serving; its first sync window starts at its
    first step. Its real excess (a 300 ns slower schedule at step 1) is still found and named."""
    ev = dp_capture({(2, 1): 1300})
    start_up = frame([span("load_model", -60_000, -10_000, rank=2), span("import", -60_000, -59_000, rank=0),
                      span("import", -60_000, -59_000, rank=1)])
    ev = pd.concat([start_up, ev], ignore_index=True)
    per_rank, per_inst, late = st.straggler_table(ev, step_table(ev))
    r = per_rank.set_index("rank")
    assert r.loc[2, "top_cause"] == "Scheduler.schedule" and r.loc[2, "top_cause_ns"] == 300
    assert "load_model" not in set(r["top_cause"].dropna()) and "load_model" not in set(r["second_cause"].dropna())
    assert (late.loc[late["step"] == 0, "excess_ns"].abs() == 0).all()


@pytest.mark.parametrize("uniform", [True, False])
def test_sorted_within_is_the_lexsort_of_group_and_value(uniform):
    """``straggler_arrivals._sorted_within``: groups of one size sorted as a table, row by row,
    give the stable lexsort by (group, value) (ties in row order); groups of mixed sizes take
    the lexsort itself."""
    rng = np.random.default_rng(7)
    for _ in range(100):
        g = int(rng.integers(1, 40))
        n = np.full(g, int(rng.integers(2, 9))) if uniform else rng.integers(2, 9, g)
        first = np.r_[0, np.cumsum(n)[:-1]]
        v = rng.integers(0, 4, int(n.sum()))  # many ties
        np.testing.assert_array_equal(arr_mod._sorted_within(v, first, n), np.lexsort((v, np.repeat(np.arange(g), n))))


def test_step_of_is_the_pandas_group_and_sort_per_rank():
    """``straggler_arrivals._step_of`` on arrays: each arrival's step as a pandas groupby of the
    steps by rank, each group sorted by ``sort_values("start_ns")``, then searched (equal starts
    included: both sort the group's starts in row order with the same quicksort)."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n_steps, n_arr = int(rng.integers(0, 120)), int(rng.integers(0, 80))
        steps = pd.DataFrame({"rank": rng.integers(0, 4, n_steps), "step": rng.integers(0, 50, n_steps),
                              "start_ns": rng.integers(0, 30, n_steps)})
        rank, t = rng.integers(0, 5, n_arr), rng.integers(-2, 35, n_arr)
        want = np.full(n_arr, arr_mod.NO_STEP, np.int64)
        for r, g in steps.groupby("rank"):
            m = np.flatnonzero(rank == r)
            g = g.sort_values("start_ns")
            j = np.searchsorted(g["start_ns"].to_numpy(np.int64), t[m], side="right") - 1
            want[m] = np.where(j >= 0, g["step"].to_numpy(np.int64)[np.maximum(j, 0)], arr_mod.NO_STEP)
        np.testing.assert_array_equal(arr_mod._step_of(rank, t, steps), want)


def test_median_of_others_matches_brute_force():
    rng = np.random.default_rng(0)
    for n in (2, 3, 4, 5, 8):
        v = rng.integers(0, 100, n * 4)
        bounds = arr_mod._group_bounds(np.repeat(np.arange(4), n))
        got = arr_mod._median_of_others(v, bounds, presorted=False)
        for i in range(v.size):
            g = i // n
            others = np.sort(np.delete(v[g * n:(g + 1) * n], i - g * n))
            lo, hi = others[(others.size - 1) // 2], others[others.size // 2]
            assert got[i] == lo + (hi - lo) // 2


def test_phase_excess_counts_absent_peers_as_zero():
    phases = pd.DataFrame({
        "window": [7, 7, 7, 7, 7], "rank": [0, 1, 2, 0, 3], "phase": ["a", "a", "a", "gc", "a"],
        "category": ["span", "span", "span", "gc", "span"], "ns": [10, 20, 30, 500, 40],
    })
    windows = pd.DataFrame({"window": [7] * 4, "rank": [0, 1, 2, 3], "start_ns": 0, "end_ns": 1})
    got = ph_mod.phase_excess(phases, windows).set_index(["rank", "phase"])
    assert got.loc[(0, "gc"), "peer_ns"] == 0 and got.loc[(0, "gc"), "excess_ns"] == 500
    assert got.loc[(1, "gc"), "ns"] == 0 and got.loc[(1, "gc"), "excess_ns"] == 0  # peers 500, 0, 0
    assert got.loc[(3, "a"), "peer_ns"] == 20 and got.loc[(0, "a"), "peer_ns"] == 30  # medians of others


def _naive_phase_excess(phases: pd.DataFrame, windows: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """phase_excess by its definition, one (window, rank, phase) at a time: the reference."""
    n_of = windows["window"].value_counts().to_dict()
    want = windows[rows]
    ph = phases[phases["window"].isin(set(want["window"])) & (phases["ns"] > 0)]
    phase_order = {p: i for i, p in enumerate(dict.fromkeys(ph["phase"]))}
    out = []
    for w, r in zip(want["window"], want["rank"]):
        here = ph[ph["window"] == w]
        for p in sorted(set(here["phase"]), key=phase_order.get):
            mine = here[here["phase"] == p]
            own = mine.loc[mine["rank"] == r, "ns"]
            others = sorted(mine.loc[mine["rank"] != r, "ns"].tolist() + [0] * (n_of[w] - len(mine)))
            if own.empty:  # the rank itself is one of the absent participants: one zero is its own
                others = others[1:] if others and others[0] == 0 else others
            lo, hi = (others[(len(others) - 1) // 2], others[len(others) // 2]) if others else (0, 0)
            peer = lo + (hi - lo) // 2
            first = mine.sort_values("ns", kind="stable").iloc[0]  # the smallest value's row names the category
            ns = int(own.iloc[0]) if len(own) else 0
            out.append((w, r, p, first["category"], ns, peer, ns - peer))
    return pd.DataFrame(out, columns=ph_mod.EXCESS_COLUMNS)


@pytest.mark.parametrize("layout", ["shuffled", "sorted", "sparse ids", "huge times", "huge ranks"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_phase_excess_matches_its_definition(seed, layout, monkeypatch):
    """Random windows (participants 1-5, some without a phase, ties, zero times) against the
    one-at-a-time reference; blocks of 7 pair rows exercise the bounded-memory path. Window ids
    dense or far apart (a table by id, or a search), the windows table sorted by id or not; times
    too large for one int64 sort key of (window, phase, time) (the sort by two keys instead), and
    ranks beyond int32 (kept as int64)."""
    rng = np.random.default_rng(seed)
    win_rows, ph_rows = [], []
    for w in rng.permutation(12):
        ranks = rng.choice(6, size=rng.integers(1, 6), replace=False)
        for r in ranks:
            win_rows.append((int(w), int(r)))
            for p in rng.choice(["gc", "span_a", "span_b", "gpu:k", "wait:x"], size=rng.integers(0, 4), replace=False):
                ph_rows.append((int(w), int(r), str(p), "gpu" if p == "gpu:k" else str(rng.choice(["span", "self"])),
                                int(rng.choice([0, 5, 10, 10, 30, int(rng.integers(1, 100))]))))
    windows = pd.DataFrame(win_rows, columns=["window", "rank"]).assign(start_ns=0, end_ns=1)
    phases = pd.DataFrame(ph_rows, columns=ph_mod.PHASE_COLUMNS)
    if layout == "sorted":
        windows = windows.sort_values("window", kind="stable").reset_index(drop=True)
    elif layout == "sparse ids":
        windows["window"] = windows["window"] * 1_000_003 - 5
        phases["window"] = phases["window"] * 1_000_003 - 5
    elif layout == "huge times":
        phases["ns"] = phases["ns"] * (1 << 56)
    elif layout == "huge ranks":
        windows["rank"] = windows["rank"] + (1 << 40)
        phases["rank"] = phases["rank"] + (1 << 40)
    rows = rng.random(len(windows)) < 0.7
    want = _naive_phase_excess(phases, windows, rows)
    got = ph_mod.phase_excess(phases, windows, rows)
    pd.testing.assert_frame_equal(got.reset_index(drop=True).astype({"phase": object, "category": object}),
                                  want.astype({"phase": object, "category": object}), check_dtype=False)
    monkeypatch.setattr(ph_mod, "MAX_PAIR_ROWS", 7)
    pd.testing.assert_frame_equal(ph_mod.phase_excess(phases, windows, rows), got)
    # rows of another coded table written first: that table's rows at the mask, then these
    [(p, c)], names, cats = ph_mod.phase_codes([phases])
    coded = ph_mod.coded_phase_excess(phases, p, c, names, cats, windows, rows)
    other = ph_mod.coded_phase_excess(phases, p, c, names, cats, windows)
    for mask in (rng.random(len(other.rows)) < 0.5, np.zeros(len(other.rows), bool)):
        joined = ph_mod.coded_phase_excess(phases, p, c, names, cats, windows, rows, before=(other, mask))
        pd.testing.assert_frame_equal(joined.rows, ph_mod.concat_excess([other.take(mask), coded]).rows)
    none = np.zeros(len(windows), bool)  # no row of its own: the other table's rows alone
    alone = ph_mod.coded_phase_excess(phases, p, c, names, cats, windows, none, before=(other, mask | True))
    pd.testing.assert_frame_equal(alone.rows, ph_mod.concat_excess([other, ph_mod._empty_coded(names, cats)]).rows)
    monkeypatch.setattr(ph_mod, "_ROW_TABLE_PER_ROW", 0)  # each rank's row found by a search, not in a table
    pd.testing.assert_frame_equal(ph_mod.phase_excess(phases, windows, rows), got)


@pytest.mark.parametrize("repeats", [False, True])
def test_row_lookup_by_table_and_by_search_agree(repeats, monkeypatch):
    """``straggler_phases._RowOf``: the row of each asked (group, rank) key, read from a table
    indexed by key or found by a binary search, the same (found, row) either way; a repeated key
    (never in summed phase rows) takes the search, which gives its first row."""
    rng = np.random.default_rng(3)
    size = 400
    keys = rng.choice(size, 300, replace=repeats)
    asked = rng.integers(0, size, 1000)
    table = ph_mod._RowOf(keys, size)
    assert (table.table is not None) == (not repeats)
    monkeypatch.setattr(ph_mod, "_ROW_TABLE_PER_ROW", 0)
    search = ph_mod._RowOf(keys, size)
    assert search.table is None
    for (f1, r1), (f2, r2) in [(table(asked), search(asked))]:
        np.testing.assert_array_equal(f1, f2)
        np.testing.assert_array_equal(r1[f1], r2[f2])
    found, row = search(asked)
    first = {}
    for i, k in enumerate(keys.tolist()):
        first.setdefault(k, i)
    assert found.tolist() == [k in first for k in asked.tolist()]
    assert row[found].tolist() == [first[k] for k in asked[found].tolist()]


def test_every_rank_equally_slow_is_no_straggler():
    ev = dp_capture({(r, s): 5000 for r in range(3) for s in (1, 3)})
    per_rank, per_inst, _ = st.straggler_table(ev, step_table(ev))
    assert st.straggler_ranks(per_rank) == []
    assert per_inst["arrival_skew_ns"].max() == 0


def test_no_collectives_and_no_events_give_empty_tables():
    ev = frame([span("EngineCore.step", 0, 1000), span("Scheduler.schedule", 0, 400),
                {"rank": 0, "source": "t", "kind": schema.KERNEL, "name": "gemm", "start_ns": 500, "end_ns": 900,
                 "device": 0, "stream": 7}])
    for events in (ev, schema.empty_frame()):
        per_rank, per_inst, late = st.straggler_table(events, step_table(events))
        assert per_inst.empty and late.empty and st.straggler_ranks(per_rank) == []
        assert list(per_rank.columns[:7]) == st.STRAGGLER_COLUMNS and list(late.columns) == st.LATENESS_COLUMNS
    assert per_rank["rank"].tolist() == [] and per_rank.attrs["report"]["instances"] == 0


def test_collective_that_never_completes_is_dropped():
    ev = dp_capture({(1, 2): 1400})
    last_sync = ev[(ev["rank"] == 0) & (ev["name"] == "sync_dp_padding")]["start_ns"].max()
    ev = ev[~((ev["rank"] == 0) & (ev["name"] == "sync_dp_padding") & (ev["start_ns"] == last_sync))]
    per_rank, per_inst, _ = st.straggler_table(ev, step_table(ev))
    report = per_rank.attrs["report"]
    assert report["dropped_incomplete"] + report["unmatched_rows"] >= 1  # the matcher drops it, or we do
    assert len(per_inst) == 3 and 3 not in set(per_inst["step"])
    assert per_inst.set_index("step").loc[2, "last_rank"] == 1


# ---- simulated DEP captures -------------------------------------------------------------------
# injected kind -> the phase the straggler analysis must name (slow_rank stretches every host
# phase; the biggest is the forward's Python between launches, charged to vLLM's step annotation)
SIM_CAUSE = {"gc": "gc", "slow_schedule": "Scheduler.schedule", "host_sync": "host_sync (", "launch_bound": "launch_bound",
             "slow_rank": "execute_context_N_generation_N"}
SIM_MS = {"gc": (30.0, (3, 4)), "slow_schedule": (3.0, (1, 2)), "host_sync": (2.0, (1, 2)), "launch_bound": (2.0, (1, 2)),
          "slow_rank": (2.0, (1,))}
SIM_SIZES = [8] * 9 + [32] * 7 + [64] * 5  # 21 scenarios


def scenario(i: int) -> dict:
    """Seeded: 1 to 3 causes of random kinds on distinct random ranks, 8-10 steps, 2-3 layers."""
    rng = np.random.default_rng(1000 + i)
    ranks = SIM_SIZES[i]
    k = int(rng.integers(1, 4))
    injects = []
    for rank, kind in zip(rng.choice(ranks, size=k, replace=False), rng.choice(list(SIM_MS), size=k)):
        ms, every = SIM_MS[str(kind)]
        injects.append(Inject(str(kind), rank=int(rank), ms=ms, every=int(rng.choice(every)), start=int(rng.integers(1, 3))))
    return {"ranks": ranks, "steps": int(rng.integers(8, 11)), "layers": int(rng.integers(2, 4)), "seed": i,
            "fmt": "nsys" if i in (4, 12) else "kineto", "injects": injects}


@pytest.fixture(scope="module")
def sim_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("sims")
    rows, verdicts = [], []
    for i in range(len(SIM_SIZES)):
        sc = scenario(i)
        out = root / f"s{i}"
        truth = simulate(sc["ranks"], sc["steps"], seed=sc["seed"], out_dir=out, fmt=sc["fmt"], layers=sc["layers"],
                         injects=sc["injects"])
        per_rank, _, _ = analyze(profkit.load(out).events)
        found = st.straggler_ranks(per_rank)
        ranked = per_rank.sort_values("excess_ns", ascending=False)["rank"].tolist()[:len(truth.stragglers)]
        verdicts.append({"scenario": i, "ranks": sc["ranks"], "fmt": sc["fmt"], "found": found,
                         "truth": truth.stragglers, "top_ranked": sorted(ranked) == sorted(truth.stragglers)})
        delays = pd.DataFrame(truth.injected_delay_ns["rows"], columns=truth.injected_delay_ns["columns"])
        by_rank = per_rank.set_index("rank")
        for inj in sc["injects"]:
            got = by_rank.loc[inj.rank]
            injected = int(delays.loc[(delays["rank"] == inj.rank) & (delays["kind"] == inj.kind), "delay_ns"].sum())
            # slow_rank stretches every host phase: its charged time is the rank's whole host excess
            charged = int(got["host_excess_ns"]) if inj.kind == "slow_rank" else int(got["top_cause_ns"])
            rows.append({"scenario": i, "dep": sc["ranks"], "steps": sc["steps"], "layers": sc["layers"], "kind": inj.kind,
                         "rank": inj.rank, "every": inj.every, "flagged": inj.rank in found, "top_cause": got["top_cause"],
                         "cause_ok": str(got["top_cause"]).startswith(SIM_CAUSE[inj.kind]),
                         "injected_ms": injected / 1e6, "charged_ms": charged / 1e6, "ratio": charged / injected,
                         "excess_share": round(float(got["excess_share"]), 3), "excess_z": round(float(got["excess_z"]), 1)})
    return pd.DataFrame(rows), pd.DataFrame(verdicts)


def test_simulated_stragglers_precision_recall_cause_and_charged_time(sim_results):
    injected, verdicts = sim_results
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print("\n" + injected.round(3).to_string())
        print(verdicts.to_string())
    true_pos = sum(len(set(v.found) & set(v.truth)) for v in verdicts.itertuples())
    flagged = sum(len(v.found) for v in verdicts.itertuples())
    precision, recall = true_pos / max(flagged, 1), true_pos / len(injected)
    print(f"scenarios {len(verdicts)} (DEP8 {SIM_SIZES.count(8)}, DEP32 {SIM_SIZES.count(32)}, DEP64 "
          f"{SIM_SIZES.count(64)}), injected stragglers {len(injected)}: precision {precision:.3f} recall {recall:.3f}, "
          f"cause right {injected['cause_ok'].mean():.3f}, charged within 10% {((injected['ratio'] - 1).abs() <= 0.10).mean():.3f}")
    assert len(verdicts) >= 20 and set(verdicts["ranks"]) == {8, 32, 64}
    assert precision >= 0.95 and recall >= 0.95
    assert verdicts["top_ranked"].all()  # the injected ranks have the largest excess
    assert injected["cause_ok"].all(), injected[~injected["cause_ok"]]
    assert ((injected["ratio"] - 1).abs() <= 0.10).all(), injected[(injected["ratio"] - 1).abs() > 0.10]


def test_hot_experts_is_a_gpu_side_cause(tmp_path):
    """Hot experts slow the rank's expert GEMMs: its GPU, not its host, arrives late at the combine."""
    truth = simulate(16, 8, seed=3, out_dir=tmp_path, layers=3, injects=[Inject("hot_experts", rank=5, ms=1.0)])
    per_rank, per_inst, _ = analyze(profkit.load(tmp_path).events)
    r = per_rank.set_index("rank").loc[5]
    assert st.straggler_ranks(per_rank) == [5] and r["top_cause"] == "gpu:fused_moe_kernel"
    assert r["top_cause_ns"] == pytest.approx(sum(c["total_ns"] for c in truth.causes), rel=0.10)
    late = per_inst[(per_inst["last_rank"] == 5) & (per_inst["last_late_ns"] > 100_000)]
    assert len(late) >= 16 and (late["top_cause"] == "gpu:fused_moe_kernel").mean() >= 0.9  # a few: host noise


def test_shared_slow_schedule_on_every_rank_is_no_straggler(tmp_path):
    injects = [Inject("slow_schedule", rank=r, every=2, ms=4) for r in range(8)]
    simulate(8, 10, seed=11, out_dir=tmp_path, layers=2, injects=injects)
    per_rank, _, _ = analyze(profkit.load(tmp_path).events)
    assert st.straggler_ranks(per_rank) == []
    assert per_rank["excess_share"].abs().max() < 0.05


@pytest.fixture(scope="module")
def sim_one(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim_one")
    truth = simulate(8, 8, seed=21, out_dir=out, layers=2, injects=[Inject("slow_schedule", rank=3, ms=3)])
    return profkit.load(out).events, truth


def test_rank_missing_from_some_collectives(sim_one):
    events, truth = sim_one
    seqs = events.loc[(events["rank"] == 6) & events["coll_seq"].notna(), "coll_seq"].astype(int)
    gone = set(seqs.unique()[[3, 7, 11]].tolist())
    drop = (events["rank"] == 6) & events["coll_seq"].isin(gone).fillna(False).to_numpy(bool)
    per_rank, per_inst, _ = analyze(events[~drop])
    assert per_rank.attrs["report"]["dropped_incomplete"] >= len(gone)
    assert st.straggler_ranks(per_rank) == [3]


def test_capture_edge_rank_whose_trace_starts_later_is_not_a_straggler(sim_one):
    """Rank 5's trace starts inside the second DP all-reduce, after the others arrived: cut like a
    profiler cuts (events before dropped, the ones running clipped), it seems to arrive last."""
    events, _ = sim_one
    aligned = apply_alignment(events, estimate(events))
    syncs = collective_instances(aligned)
    dp = syncs[syncs["source_kind"] == "cpu_span"].sort_values("start_ns")
    second = dp[dp["instance"] == dp["instance"].unique()[1]]
    cut = int(second["start_ns"].max() + second["end_ns"].min()) // 2  # after every arrival, before the exit
    ev = aligned.copy()
    r5 = (ev["rank"] == 5).to_numpy(bool)
    ev = ev[~(r5 & (ev["end_ns"] <= cut).to_numpy(bool))].copy()
    clip = ((ev["rank"] == 5) & (ev["start_ns"] < cut)).to_numpy(bool)
    ev.loc[clip, "start_ns"] = cut
    trap = match_instances(collective_instances(ev))
    assert (trap["last_rank"] == 5).any()  # the trap: the clipped sync makes rank 5 look last
    per_rank, per_inst, _ = st.straggler_table(ev, step_table(ev))
    assert per_rank.attrs["report"]["dropped_edge"] >= 1
    assert (per_inst["first_start_ns"] >= cut).all()
    assert st.straggler_ranks(per_rank) == [3]


# ---- real GPU captures (sample_traces/engine-dep2-h200) ---------------------------------------
def injected_window_steps(truth: dict, kind: str) -> list[int]:
    first, last = truth.get("profile_steps") or truth.get("cuda_profiler_steps") or [WINDOW_FIRST_STEP, 30]
    cause = next(c for c in truth["causes"] if c["kind"] == kind)
    return [s - first for s in cause["steps"] if first <= s < last]


def measured_ms(truth: dict, kind: str) -> float:
    first, last = truth.get("profile_steps") or truth.get("cuda_profiler_steps") or [WINDOW_FIRST_STEP, 30]
    cause = next(c for c in truth["causes"] if c["kind"] == kind)
    return sum(ms for s, ms in zip(cause["steps"], cause["measured_ms"]) if first <= s < last)


@pytest.mark.parametrize("name", ["torch_straggler", "nsys_straggler", "torch_split"])
def test_real_straggler_named_with_the_injected_causes(name):
    """Rank 1 sleeps 15 ms (unannotated, inside EngineCore.step) at engine steps 12, 16, ... and
    its scheduler spends 10 ms more at 14, 18, ...: rank 1 is the straggler, late at exactly those
    DP all-reduces, with the sleep as EngineCore.step self time and Scheduler.schedule."""
    truth = json.loads((ENGINE / name / "truth.json").read_text())
    per_rank, per_inst, late = analyze(profkit.load(ENGINE / name).events)
    print(per_rank[st.STRAGGLER_COLUMNS + ["top_cause_ns", "second_cause", "second_cause_ns", "excess_share",
                                           "excess_z"]].to_string())
    assert st.straggler_ranks(per_rank) == [1]
    r1 = per_rank.set_index("rank").loc[1]
    assert {r1["top_cause"], r1["second_cause"]} == {"EngineCore.step", "Scheduler.schedule"}
    dp = per_inst[per_inst["source_kind"] == "cpu_span"].set_index("step")
    for kind, cause in (("sleep", "EngineCore.step"), ("slow_schedule", "Scheduler.schedule")):
        steps = injected_window_steps(truth, kind)
        hit = dp.loc[steps]
        assert (hit["last_rank"] == 1).all() and (hit["top_cause"] == cause).all(), hit
        assert hit["top_cause_ns"].sum() / 1e6 == pytest.approx(measured_ms(truth, kind), rel=0.10)
    sleep_ms = measured_ms(truth, "sleep")
    charged = r1["top_cause_ns"] if r1["top_cause"] == "EngineCore.step" else r1["second_cause_ns"]
    assert charged / 1e6 == pytest.approx(sleep_ms, rel=0.10)
    heat = late.set_index(["rank", "step"])
    assert all(heat.loc[(1, s), "late_ns"] > 8_000_000 for s in injected_window_steps(truth, "sleep"))


def test_real_clean_nsys_capture_has_no_straggler():
    per_rank, per_inst, _ = analyze(profkit.load(ENGINE / "nsys_clean").events)
    print(per_rank[st.STRAGGLER_COLUMNS + ["excess_share", "excess_z"]].to_string())
    assert st.straggler_ranks(per_rank) == []
    assert len(per_inst) == 260  # 20 DP all-reduces and 240 NCCL all-to-alls, none at the edges


def test_real_clean_torch_capture_rank0_host_was_slower():
    """No fault was injected in torch_clean, but rank 0's host ran every phase about 1.5x slower
    than rank 1's (the engine's own timers in rank{r}.steps.jsonl agree) and it arrived last at
    almost every sync point: it is named, as a uniformly slow host, and rank 1 is not. The
    barrier before the window (rank 1's trace starts 0.55 s earlier) is a capture edge, dropped."""
    per_rank, per_inst, _ = analyze(profkit.load(ENGINE / "torch_clean").events)
    print(per_rank[st.STRAGGLER_COLUMNS + ["excess_share", "excess_z", "host_excess_ns"]].to_string())
    timers = {}
    for rank in (0, 1):
        rows = [json.loads(line) for line in (ENGINE / "torch_clean" / f"rank{rank}.steps.jsonl").read_text().splitlines()]
        timers[rank] = pd.DataFrame([r["phase_ns"] for r in rows if 10 <= r["step"] < 30]).median()
    for phase in ("attn", "router", "experts", "Scheduler.schedule"):
        assert timers[0][phase] > 1.3 * timers[1][phase]
    assert st.straggler_ranks(per_rank) == [0]
    r0 = per_rank.set_index("rank").loc[0]
    assert r0["times_last"] > 0.9 * r0["n_instances"] and r0["host_excess_ns"] > 100_000_000
    assert per_rank.attrs["report"]["dropped_edge"] == 1
    assert per_inst["arrival_skew_ns"].max() < 10_000_000  # the 554 ms barrier skew is gone


def _random_phases(rng: np.random.Generator, rank: int, rows: int, windows: int) -> pd.DataFrame:
    """A rank's ``window_phases`` table of random windows, phases (a GPU one, a wait), categories and times."""
    names = ["gc", "span_a", "span_b", "gpu:k", "wait:x", "zz"]
    cats = ["span", "self", "gpu", "gc", "wait"]
    return pd.DataFrame({"window": rng.integers(0, windows, rows), "rank": np.full(rows, rank, np.int64),
                         "phase": rng.choice(names, rows).astype(object), "category": rng.choice(cats, rows).astype(object),
                         "ns": rng.integers(0, 1000, rows)})


@pytest.mark.parametrize("seed", range(4))
def test_coded_window_phases_join_as_phase_codes(seed):
    """The ranks' phase tables cross to the driver as integer codes against their own names
    (``WindowPhases.coded``) and are joined there; the joined codes must be ``phase_codes`` of
    the string tables joined (the definition): names sorted, a null phase last, categories in
    order of first appearance over host, GPU and accounting tables. Random ranks whose names and
    categories first appear in different tables and orders, one table empty on some ranks, a
    null phase on one rank."""
    rng = np.random.default_rng(seed)

    def table(rank: int, rows: int) -> pd.DataFrame:
        return _random_phases(rng, rank, rows, 50)

    parts = []
    for r in range(5):
        host, gpu, acc = (table(r, int(rng.integers(0, 8))) for _ in range(3))
        if r == 2 and len(host):
            host.loc[0, "phase"] = None
        parts.append(st.WindowPhases(host, gpu, acc))
    joined = st.WindowPhases.concat([p.coded() for p in parts])
    plain = st.WindowPhases.concat(parts)
    want, want_names, want_cats = ph_mod.phase_codes([plain.host, plain.gpu, plain.acc])
    got, got_names, got_cats = joined.codes()
    assert list(got_names) == list(want_names) and list(got_cats) == list(want_cats)
    for (wp, wc), (gp, gc), kind in zip(want, got, ("host", "gpu", "acc")):
        np.testing.assert_array_equal(gp, wp)
        np.testing.assert_array_equal(gc, wc)
        for c in ("window", "rank", "ns"):
            np.testing.assert_array_equal(getattr(joined, kind)[c].to_numpy(np.int64),
                                          getattr(plain, kind)[c].to_numpy(np.int64))


def test_a_late_arrivers_window_is_not_closed_by_its_own_instance():
    """Aligned clocks a millisecond off (calling threads only, a loaded host) can put the peer's
    recorded end of an instance before the late arriver's own arrival, and the instance's common
    exit (the median of the ends) with it. That exit must not count as the late arriver's
    previous sync: its window reaches back to the instance before, where its GC is (found on a
    real capture of tests/workloads/foreign_dp_ep.py, whose GC steps it hid)."""
    inst = pd.DataFrame({
        "instance": [1, 1, 2, 2], "rank": [0, 1, 0, 1],
        "start_ns": [100, 100, 1005, 200], "end_ns": [110, 110, 1010, 990],  # rank 1's end: before rank 0 came
        "key": "cpu_span||all_reduce|", "coll_name": "all_reduce", "source_kind": "cpu_span", "complete": True})
    windows = pd.DataFrame({"rank": [0, 1], "trace_start_ns": [0, 0], "trace_end_ns": [2000, 2000]})
    rows, _ = arr_mod.arrival_rows(inst, windows, None)
    late = rows[(rows["instance"] == 2) & (rows["rank"] == 0)].iloc[0]
    assert late["work_start_ns"] == 110 and late["work_ns"] == 895
    assert late["work_excess_ns"] == 895 - (200 - 110)  # its own work beyond its peer's: the GC
    # the sync exits found ahead (the driver does, while the ranks are analyzed) give the same rows
    ahead, _ = arr_mod.arrival_rows(inst, windows, None, arr_mod.sync_ends(inst))
    pd.testing.assert_frame_equal(ahead, rows, check_exact=True)
    both, _ = arr_mod.arrival_rows(inst, windows, None, arr_mod.sync_ends(inst), arr_mod.host_sync_ends(inst))
    pd.testing.assert_frame_equal(both, rows, check_exact=True)
    assert arr_mod.sync_ends(inst.iloc[:0]) == {} and arr_mod.sync_ends(None) == {}
    assert arr_mod.host_sync_ends(inst.iloc[:0]) == {} and arr_mod.host_sync_ends(None) == {}


def test_host_sync_marks_found_ahead_are_the_plans_own():
    """``host_sync_ends`` (found by the driver while the ranks are analyzed) gives the arrivals'
    ``host_start_ns`` the plan finds itself: at the CPU collectives where there are some (a GPU
    collective does not hold the host), at the steps' starts where there are none ({})."""
    steps = pd.DataFrame({"rank": [0, 0, 1, 1], "step": [0, 1, 0, 1], "start_ns": [0, 500, 0, 520],
                          "end_ns": [480, 1000, 500, 1000]})
    windows = pd.DataFrame({"rank": [0, 1], "trace_start_ns": [0, 0], "trace_end_ns": [2000, 2000]})
    kernels = pd.DataFrame({
        "instance": [1, 1, 2, 2], "rank": [0, 1, 0, 1], "start_ns": [300, 310, 800, 840], "end_ns": [350, 350, 900, 900],
        "key": "kernel||all_reduce|", "coll_name": "all_reduce", "source_kind": "kernel", "complete": True})
    gloo = pd.DataFrame({
        "instance": [3, 3], "rank": [0, 1], "start_ns": [600, 650], "end_ns": [700, 700],
        "key": "cpu_span||barrier|", "coll_name": "barrier", "source_kind": "cpu_span", "complete": True})
    for inst, want in ((kernels, [0, 0, 500, 520]), (pd.concat([kernels, gloo], ignore_index=True), None)):
        host = arr_mod.host_sync_ends(inst)
        assert (host == {}) == (want is not None)
        rows, _ = arr_mod.arrival_rows(inst, windows, steps)
        ahead, _ = arr_mod.arrival_rows(inst, windows, steps, arr_mod.sync_ends(inst), host)
        pd.testing.assert_frame_equal(ahead, rows, check_exact=True)
        if want is not None:  # no CPU collective: each arrival's step start
            assert rows.sort_values(["instance", "rank"])["host_start_ns"].tolist() == want
        else:  # instance 2 (800, 840) comes after the barrier's exit at 700 on both ranks
            late = rows[rows["instance"] == 2].sort_values("rank")
            assert late["host_start_ns"].tolist() == [700, 700]


@pytest.mark.parametrize("dtype", ["str", "string", object])
def test_arrival_rows_string_columns_are_their_conversion(dtype):
    """``arrival_rows`` keeps a ``str`` column as it is where it converted every row to a Python
    object and pandas inferred ``str`` again (~0.1 s a column at DEP32 x 1,000): the table equals
    the conversion's (``astype(str)`` / ``astype(object)`` then a frame), missing values included,
    and a kernel launched long before it ran is GPU-gated as before; other dtypes convert as before."""
    n = 12
    kind = pd.Series([None if j % 2 and j // 2 % 3 == 0 else ("kernel", "cpu_span")[j // 2 % 2] for j in range(n)],
                     dtype=dtype)  # an instance's kind is its first row's (missing on some second rows)
    coll = pd.Series(["all_reduce", None, "all_gather"] * 4, dtype=dtype)
    key = pd.Series(["g|all_reduce", "g|all_gather", None, "g|x"] * 3, dtype=dtype)
    inst = pd.DataFrame({
        "instance": np.repeat(np.arange(n // 2), 2), "rank": np.tile([0, 1], n // 2),
        "start_ns": np.arange(n) * 1_000_000 + 500_000, "end_ns": np.arange(n) * 1_000_000 + 600_000,
        "launch_ns": pd.array([10 if i % 5 else None for i in range(n)], dtype="Int64"),
        "key": key, "coll_name": coll, "source_kind": kind, "complete": True})
    windows = pd.DataFrame({"rank": [0, 1], "trace_start_ns": [0, 0], "trace_end_ns": [100_000_000] * 2})
    rows, _ = arr_mod.arrival_rows(inst, windows, None)
    assert len(rows) == n
    at = rows.set_index(["instance", "rank"])
    src = inst.set_index(["instance", "rank"]).loc[at.index]
    want = pd.DataFrame({"key": src["key"].astype(str).to_numpy(dtype=object),
                         "coll_name": src["coll_name"].astype(object).to_numpy(dtype=object),
                         "source_kind": src["source_kind"].astype(str).to_numpy(dtype=object)})
    pd.testing.assert_frame_equal(rows[["key", "coll_name", "source_kind"]], want, check_exact=True)
    gated = (src["source_kind"].astype(str).to_numpy() == "kernel") & \
        (src["launch_ns"].fillna(1 << 62).to_numpy(np.int64) < src["start_ns"].to_numpy(np.int64) - arr_mod.GPU_GATED_NS)
    np.testing.assert_array_equal(rows["gpu_gated"].to_numpy(), gated)
    assert rows["gpu_gated"].sum() == 3  # kernel rows 4, 8, 9 (rows 0 and 5 have no launch, row 1 no kind)


def test_trace_windows_of_one_rank_as_of_many():
    """``trace_windows`` of one rank's events (the rank task's case, computed without a groupby)
    is the row the grouped path gives, instants and metadata left out; several ranks, no events
    but instants, and no events at all keep the grouped path's table."""
    import pyarrow as pa

    from profkit import schema
    from profkit.analyze.straggler_arrivals import WINDOW_COLUMNS, trace_windows

    rows = [dict(rank=3, kind=schema.CPU_OP, name="a", start_ns=10, end_ns=20),
            dict(rank=3, kind=schema.INSTANT, name="i", start_ns=5, end_ns=5),
            dict(rank=3, kind=schema.KERNEL, name="k", start_ns=15, end_ns=40),
            dict(rank=3, kind=schema.OTHER, name="m", start_ns=0, end_ns=99)]
    ev = schema.from_records(rows)
    got = trace_windows(ev)
    assert got.to_dict("records") == [{"rank": 3, "trace_start_ns": 10, "trace_end_ns": 40}]
    assert list(got.columns) == WINDOW_COLUMNS and (got.dtypes == "int64").all()
    two = schema.from_records(rows + [dict(rank=1, kind=schema.CPU_OP, name="b", start_ns=7, end_ns=8)])
    assert trace_windows(two).to_dict("records") == [{"rank": 1, "trace_start_ns": 7, "trace_end_ns": 8},
                                                    {"rank": 3, "trace_start_ns": 10, "trace_end_ns": 40}]
    only_instants = ev[ev["kind"].isin([schema.INSTANT, schema.OTHER]).to_numpy(bool)]
    assert len(trace_windows(only_instants)) == 0 and list(trace_windows(only_instants).columns) == WINDOW_COLUMNS
    assert len(trace_windows(schema.empty_frame())) == 0
    assert pa.types.is_int32(ev["rank"].dtype.pyarrow_dtype)


@pytest.mark.parametrize("seed", range(4))
def test_phase_excess_over_the_ranks_parts_is_the_excess_over_their_joined_tables(seed):
    """The driver takes the ranks' coded phase tables as the parts they came in
    (``WindowPhases.join`` -> ``JoinedPhases``, never joined into one table first): the excess of
    every kind over the parts must be the excess over the joined tables (``WindowPhases.concat``),
    row for row, with the same names, for every window set and mask. Random ranks, some tables
    empty, phases of zero time, windows of ranks without phases."""
    rng = np.random.default_rng(100 + seed)
    parts = [st.WindowPhases(*(_random_phases(rng, r, int(rng.integers(0, 40)), 30) for _ in range(3))).coded()
             for r in range(6)]
    joined, lazy = st.WindowPhases.concat(parts), st.WindowPhases.join(parts)
    assert isinstance(lazy, st.JoinedPhases)
    (j_codes, j_names, j_cats), (l_codes, l_names, l_cats) = joined.codes(), lazy.codes()
    assert list(j_names) == list(l_names) and list(j_cats) == list(l_cats)
    windows = pd.DataFrame({"window": np.repeat(np.arange(30), 7), "rank": np.tile(np.arange(7), 30)})
    mask = rng.random(len(windows)) < 0.5
    for kind, (jp, jc), (lp, lc) in zip(("host", "gpu", "acc"), j_codes, l_codes):
        for rows in (None, mask):
            want = ph_mod.coded_phase_excess(getattr(joined, kind), jp, jc, j_names, j_cats, windows, rows)
            got = ph_mod.coded_phase_excess(getattr(lazy, kind), lp, lc, l_names, l_cats, windows, rows)
            pd.testing.assert_frame_equal(got.rows, want.rows, check_exact=True)
            assert len(want.rows) or not len(getattr(joined, kind))  # the case is not vacuous


@pytest.mark.parametrize("spread", [1, 1_000_000_007])
def test_map_ids_is_series_map(spread):
    """``stragglers._map_ids`` (a table by id where the ids are dense, a search where they are far
    apart) as ``Series.map`` of the dict: int64 where every id is mapped, float64 with NaN where
    one is not, the index kept."""
    from profkit.analyze.stragglers import _map_ids

    rng = np.random.default_rng(9)
    for _ in range(200):
        keys = rng.choice(np.arange(-2, 60) * spread, size=int(rng.integers(1, 40)), replace=False)
        mapping = {int(k): int(rng.integers(-3, 30)) for k in keys}
        pool = keys if rng.random() < 0.5 else np.r_[keys, np.arange(-5, 70) * spread]
        ids = pd.Series(rng.choice(pool, int(rng.integers(1, 80))).astype(np.int64))
        ids.index = ids.index + int(rng.integers(0, 5))
        want = ids.map(mapping)
        if want.notna().all():
            want = want.astype("int64")
        pd.testing.assert_series_equal(_map_ids(ids, mapping), want)


@pytest.mark.parametrize("presorted", [True, False])
def test_first_and_last_arrivals_are_the_sorted_groups_head_and_tail(presorted):
    """``stragglers._first_and_last``: each instance's first and last arrival read at the bounds of
    its run (arrivals sorted as ``arrival_rows`` sorts them, else sorted first), as the stable
    sort by (instance, start, rank) and ``groupby("instance").head(1)`` / ``tail(1)`` give them."""
    rng = np.random.default_rng(13)
    for _ in range(200):
        n = int(rng.integers(0, 60))
        rows = pd.DataFrame({"instance": rng.integers(0, 6, n), "start_ns": rng.integers(0, 4, n),
                             "rank": rng.integers(0, 3, n), "late_ns": rng.integers(-9, 9, n)})
        if presorted:
            rows = rows.sort_values(["instance", "start_ns", "rank"], kind="stable").reset_index(drop=True)
        g = rows.sort_values(["instance", "start_ns", "rank"], kind="stable").groupby("instance", sort=True)
        first, last = st._first_and_last(rows)
        pd.testing.assert_frame_equal(first, g.head(1).set_index("instance"))
        pd.testing.assert_frame_equal(last, g.tail(1).set_index("instance"))
