"""Episodic stragglers (profkit.analyze.straggler_episodes): a rank late on a few steps, and why.

Known answers three ways: hand-built lateness / cause tables (each condition of the rule on its
own), the real DEP4 H200 captures (rank 1's GC pauses and rank 2's slow scheduler passes are the
only episodes; the clean real captures have none) and simulated DEP8-64 captures (episodes only
on the ranks a cause was injected on, every injected GC pause found).
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import SAMPLE_TRACES
from profkit.analyze.pipeline import analyze
from profkit.analyze.straggler_episodes import EPISODE_COLUMNS, EPISODE_RANK_COLUMNS, episode_ranks, straggler_episodes
from profkit.analyze.stragglers import LATENESS_COLUMNS
from profkit.ingest.loader import load
from profkit.report.terminal import episode_line, render_summary

DEP4 = SAMPLE_TRACES / "engine-dep4-h200-capture"
CLEAN = [DEP4 / "torch_clean", DEP4 / "nsys_clean", SAMPLE_TRACES / "engine-dep2-h200" / "nsys_clean",
         SAMPLE_TRACES / "engine-dep2-h200-capture" / "torch_clean",
         SAMPLE_TRACES / "engine-dep2-h200-capture" / "nsys_clean"]
SIM_SUBSET = [1, 2, 3, 4, 5, 7, 8, 10, 16]  # of test_stragglers' 21: DEP8, DEP32, DEP64


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def episodes_of(analysis) -> pd.DataFrame:
    """The pipeline's episodes, checked against the function on its inputs (lateness, per-rank
    table, and each rank's own work per step and phase since its previous sync point)."""
    direct = straggler_episodes(analysis.lateness, analysis.stragglers, analysis.phase_steps)
    pd.testing.assert_frame_equal(analysis.straggler_episodes, direct)
    return analysis.straggler_episodes


# ---- hand-built tables -----------------------------------------------------------------------
MS = 1_000_000


def tables(late_ms: dict, sched_ms: dict, ranks: int = 4, steps: int = 10, last: dict | None = None,
           extra: list | None = None):
    """Lateness, per-rank and cause tables: every rank-step 0.5 ms late (times_last 1) and 1 ms of
    Scheduler.schedule, 10 ms of 'model', unless ``late_ms`` / ``sched_ms[(rank, step)]`` say
    otherwise; ``last[(rank, step)]`` overrides times_last; ``extra``: more cause rows."""
    rows, causes = [], []
    for r in range(ranks):
        for s in range(steps):
            lm = late_ms.get((r, s), 0.5 + 0.01 * ((r * 7 + s * 3) % 5))  # a little noise
            rows.append({"rank": r, "step": s, "late_ns": int(lm * MS), "late_max_ns": int(lm * MS),
                         "excess_ns": 0, "times_last": (last or {}).get((r, s), 1),
                         "caused_wait_ns": int(3 * lm * MS), "wait_ns": 0, "n_instances": 3,
                         "top_cause": "Scheduler.schedule", "top_cause_ns": 0})
            sched = int(sched_ms.get((r, s), 1.0) * MS)
            causes.append({"rank": r, "step": s, "cause": "Scheduler.schedule", "ns": sched})
            causes.append({"rank": r, "step": s, "cause": "model", "ns": 10 * MS})
    lateness = pd.DataFrame(rows)[LATENESS_COLUMNS]
    per_rank = pd.DataFrame({"rank": range(ranks), "own_work_ns": steps * 12 * MS, "straggler": False})
    return lateness, per_rank, pd.DataFrame(causes + (extra or []))


def test_one_anomalous_step_is_an_episode_with_its_cause_and_baseline():
    lateness, per_rank, causes = tables({(2, 4): 14.0}, {(2, 4): 15.0})
    ep = straggler_episodes(lateness, per_rank, causes)
    assert list(ep.columns) == EPISODE_COLUMNS and len(ep) == 1
    row = ep.iloc[0]
    assert (row["rank"], row["step"], row["cause"]) == (2, 4, "Scheduler.schedule")
    assert row["cause_ns"] == 15 * MS and row["cause_baseline_ns"] == 1 * MS and row["cause_excess_ns"] == 14 * MS
    assert row["late_max_ns"] == 14 * MS and row["caused_wait_ns"] == 42 * MS and row["late_z"] > 100
    assert not row["straggler"]


def test_not_the_last_arriver_is_no_episode():
    lateness, per_rank, causes = tables({(2, 4): 14.0}, {(2, 4): 15.0}, last={(2, 4): 0})
    assert straggler_episodes(lateness, per_rank, causes).empty


def test_lateness_inside_the_noise_is_no_episode():
    """The same 14 ms lateness, but every rank-step is 0-28 ms late: the noise swallows it."""
    noisy = {(r, s): float((r * 13 + s * 7) % 29) for r in range(4) for s in range(10)}
    noisy[(2, 4)] = 14.0
    lateness, per_rank, causes = tables(noisy, {(2, 4): 15.0})
    assert straggler_episodes(lateness, per_rank, causes).empty


def test_small_lateness_is_no_episode_however_quiet_the_rest():
    """2 ms late on steps of 12 ms own work (below a fifth) is not worth an episode."""
    lateness, per_rank, causes = tables({(2, 4): 2.0}, {(2, 4): 3.0})
    assert straggler_episodes(lateness, per_rank, causes).empty
    lateness, per_rank, causes = tables({(2, 4): 3.0}, {(2, 4): 4.0})
    assert len(straggler_episodes(lateness, per_rank, causes)) == 1


def test_cause_usual_for_the_rank_or_the_step_is_no_episode():
    # the rank always schedules 15 ms: its own baseline; late only at step 4 by lateness noise
    always = {(2, s): 15.0 for s in range(10)}
    lateness, per_rank, causes = tables({(2, 4): 14.0}, always)
    assert straggler_episodes(lateness, per_rank, causes).empty
    # every rank schedules 15 ms at step 4: the peers' baseline
    step_wide = {(r, 4): 15.0 for r in range(4)}
    lateness, per_rank, causes = tables({(2, 4): 14.0}, step_wide)
    assert straggler_episodes(lateness, per_rank, causes).empty


def test_cause_explaining_less_than_half_the_lateness_is_no_episode():
    lateness, per_rank, causes = tables({(2, 4): 14.0}, {(2, 4): 7.0})  # +6 ms of 14
    assert straggler_episodes(lateness, per_rank, causes).empty


def test_waits_are_never_the_cause():
    extra = [{"rank": 2, "step": 4, "cause": "waiting for rank 3", "ns": 20 * MS},
             {"rank": 2, "step": 4, "cause": "wait:gloo all_reduce", "ns": 20 * MS}]
    lateness, per_rank, causes = tables({(2, 4): 14.0}, {}, extra=extra)
    assert straggler_episodes(lateness, per_rank, causes).empty
    extra.append({"rank": 2, "step": 4, "cause": "gc", "ns": 13 * MS})
    lateness, per_rank, causes = tables({(2, 4): 14.0}, {}, extra=extra)
    assert straggler_episodes(lateness, per_rank, causes)["cause"].tolist() == ["gc"]


def test_empty_inputs_give_an_empty_table_with_the_columns():
    lateness, per_rank, causes = tables({}, {})
    for args in ((None, None, None), (lateness.iloc[:0], per_rank, causes), (lateness, per_rank, causes.iloc[:0]),
                 (lateness, per_rank, causes)):
        ep = straggler_episodes(*args)
        assert ep.empty and list(ep.columns) == EPISODE_COLUMNS
    assert list(episode_ranks(ep).columns) == EPISODE_RANK_COLUMNS and episode_ranks(ep).empty


def test_roll_up_and_terminal_line():
    lateness, per_rank, causes = tables({(2, 4): 14.0, (2, 8): 16.0, (1, 3): 30.0},
                                        {(2, 4): 15.0, (2, 8): 16.0},
                                        extra=[{"rank": 1, "step": 3, "cause": "gc", "ns": 29 * MS}])
    per_rank.loc[per_rank["rank"] == 1, "straggler"] = True
    ep = straggler_episodes(lateness, per_rank, causes)
    assert ep[["rank", "step"]].values.tolist() == [[1, 3], [2, 4], [2, 8]]
    roll = episode_ranks(ep).set_index("rank")
    assert roll.loc[2, "episodes"] == 2 and roll.loc[2, "steps"] == [4, 8]
    assert roll.loc[2, "cause"] == "Scheduler.schedule"
    assert roll.loc[2, "caused_wait_ns"] == 90 * MS and roll.loc[1, "straggler"] and not roll.loc[2, "straggler"]
    assert episode_line(ep) == ("episodes: rank 1 late at step 3 (gc +29.0 ms per step); "
                                "rank 2 late at steps 4, 8 (Scheduler.schedule +14.5 ms per step)")


# ---- real captures -----------------------------------------------------------------------------
def measured(name: str, kind: str) -> dict[int, float]:
    cause = next(c for c in json.loads((DEP4 / name / "engine" / "truth.json").read_text())["causes"]
                 if c["kind"] == kind)
    return dict(zip(cause["steps"], cause["measured_ms"]))


@pytest.mark.parametrize("name", ["torch_faults", "nsys_faults"])
def test_dep4_faults_episodes_are_exactly_the_injected_ones(name):
    """GC on rank 1 at steps 12, 16, 20; rank 2's scheduler 15 ms slower at 14 and 18 (22 is
    outside the kept steps 11..21). Rank 2 is not a whole-run straggler, but its episodes name it."""
    a = analyze(load(DEP4 / name))
    ep = episodes_of(a)
    print(ep.to_string())
    got = [(int(r), int(s), c) for r, s, c in zip(ep["rank"], ep["step"], ep["cause"])]
    assert got == [(1, 12, "gc"), (1, 16, "gc"), (1, 20, "gc"), (2, 14, "Scheduler.schedule"),
                   (2, 18, "Scheduler.schedule")]
    by = ep.set_index(["rank", "step"])
    gc, sched = measured(name, "gc"), measured(name, "slow_schedule")
    for step in (12, 16, 20):  # the 'gc' span: the measured collection plus building its garbage (< 3 ms)
        assert gc[step] <= by.loc[(1, step), "cause_excess_ns"] / 1e6 <= gc[step] + 3.0
    for step in (14, 18):  # above the rank's usual scheduler pass (~1 ms)
        assert by.loc[(2, step), "cause_excess_ns"] / 1e6 == pytest.approx(sched[step], abs=2.0)
        assert by.loc[(2, step), "cause_baseline_ns"] < 2 * MS
    assert by.loc[1, "straggler"].all()
    assert episode_line(ep).startswith("episodes: rank 1 late at steps 12, 16, 20 (gc +")
    assert "rank 2 late at steps 14, 18 (Scheduler.schedule +1" in episode_line(ep)


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_clean_real_captures_have_no_episode(path):
    ep = episodes_of(analyze(load(path)))
    assert ep.empty, ep.to_string()


def test_episodes_reach_the_files_and_the_terminal(tmp_path):
    from profkit.report.files import write_outputs

    a = analyze(load(DEP4 / "torch_faults"))
    episodes = episodes_of(a)
    a.straggler_episodes = None
    assert "episodes:" not in render_summary(a)  # not computed: no line
    a.straggler_episodes = episodes
    text = render_summary(a)
    line = next(x for x in text.splitlines() if x.startswith("episodes:"))
    assert "rank 2 late at steps 14, 18 (Scheduler.schedule" in line and "rank 1 late at steps 12, 16, 20 (gc" in line
    written = write_outputs(a, tmp_path)
    assert tmp_path / "straggler_episodes.csv" in written
    csv = pd.read_csv(tmp_path / "straggler_episodes.csv")
    assert list(csv.columns) == EPISODE_COLUMNS and len(csv) == 5


# ---- simulated captures ------------------------------------------------------------------------
def test_simulated_episodes_only_on_injected_ranks(tmp_path):
    from profkit.simulate import simulate
    from test_stragglers import SIM_SIZES, scenario

    rows, gc_steps = [], []
    for i in SIM_SUBSET:
        sc = scenario(i)
        out = tmp_path / f"s{i}"
        simulate(sc["ranks"], sc["steps"], seed=sc["seed"], out_dir=out, fmt=sc["fmt"], layers=sc["layers"],
                 injects=sc["injects"])
        ep = episodes_of(analyze(load(out)))
        injected = {j.rank for j in sc["injects"]}
        rows.append({"scenario": i, "dep": SIM_SIZES[i],
                     "injects": [(j.kind, j.rank, j.every, j.start) for j in sc["injects"]],
                     "episodes": len(ep), "ranks_causes": sorted(set(zip(ep["rank"].tolist(), ep["cause"].tolist()))),
                     "uninjected": sorted(set(ep["rank"].tolist()) - injected)})
        for j in sc["injects"]:
            if j.kind == "gc":  # 30 ms pauses on every `every`-th step: each one an episode, named gc
                mine = ep[ep["rank"] == j.rank]
                gc_steps.append((i, j.steps(sc["steps"]), mine.loc[mine["cause"] == "gc", "step"].tolist()))
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_colwidth", 120):
        print("\n" + table.to_string())
    assert set(table["dep"]) == {8, 32, 64}
    assert not table["uninjected"].map(len).any(), table[table["uninjected"].map(len) > 0]
    assert len(gc_steps) >= 3 and all(want == got for _, want, got in gc_steps), gc_steps
    assert table["episodes"].sum() >= 12  # launch-bound and slow-scheduler episodes too
