"""A program profkit did not write: the cause is named, not the victim (issue #18).

``tests/workloads/foreign_dp_ep.py`` is a DP + EP decode loop with its own names, set up the way
vLLM sets up DP: the default group Gloo (CPU here; NCCL with ``--device cuda``), the padding sync
an all-reduce on a separate Gloo group inside the user's ``record_function("dp_padding_allreduce")``,
MoE dispatch / combine as ``all_to_all_single``, and on rank 0 a long ``gc.collect()`` at the END of
every 5th iteration, inside ``update_from_output``. Rank 0 then arrives late at the NEXT
iteration's padding all-reduce and rank 1 waits there. The program measures each collection
itself (``truth``); nothing of profkit runs inside it and none of its names is known to profkit.

Expected, and why:
- straggler: rank 0 only;
- its cause: ``update_from_output``. torch.profiler without Python stacks records no GC event:
  the collection is the self time of the user range it ran in, so the range is the most precise
  name the trace holds. Sized against the measured collections: rank 0's own time in that range
  in each late step is the collection plus at most 5% + 3 ms (the range also builds 2000 small
  cyclic lists before collecting and updates the requests). Its excess over the peer (the
  stragglers.csv number) is 80-105% of the collections: the peer's own time in the same range is
  subtracted, and on a loaded 2-core CI host that can be several ms a step;
- its episodes: the iterations AFTER each collection (k + 1 for a GC at the end of k), each sized
  as above. Either rank may have an episode of its own on a loaded host (an OS descheduling is a
  real, if small, straggle): never one of a GC's size, the peer's never at those steps and never
  named after a wait or the sync span;
- the victim, rank 1: its top cause is ``waiting for rank 0``, and its wait in the steps after the
  collections is 80-110% of their measured time (its own work there moves it); the user's sync
  span ``dp_padding_allreduce`` is never a cause of its time (below 2% of its wait: its own part
  before the all-reduce and after the release, ~0.1 ms a step).

The same holds when the Gloo worker threads' spans are left out (a trace of the calling threads
only, as a GPU program's launching thread is): the ``c10d::allreduce_`` op alone marks the sync.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import profkit
from profkit.analyze.pipeline import analyze
from profkit.ingest.loader import Capture

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.xdist_group("multiprocess")  # two ranks on two cores: never beside others

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "tests" / "workloads" / "foreign_dp_ep.py"
GC_RANK, VICTIM, EVERY, ITERATIONS = 0, 1, 5, 36


@pytest.fixture(scope="session")
def foreign(tmp_path_factory):
    """One run of the workload: (trace folder, the GC rank's truth)."""
    tmp = tmp_path_factory.mktemp("foreign")
    cmd = [sys.executable, str(WORKLOAD), "--ranks", "2", "--steps", str(ITERATIONS), "--gc-rank", str(GC_RANK),
           "--gc-every", str(EVERY), "--out", str(tmp / "trace"), "--truth", str(tmp / "truth")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    truth = json.loads((tmp / "truth" / f"rank{GC_RANK}.json").read_text())
    return tmp / "trace", truth


@pytest.fixture(scope="session")
def analysis(foreign):
    return analyze(profkit.load(foreign[0]))


@pytest.fixture(scope="session")
def calling_threads_only(foreign):
    """The same capture without the Gloo worker threads' ``gloo:*`` spans."""
    cap = profkit.load(foreign[0])
    ev = cap.events
    keep = ~ev["name"].astype(str).str.startswith("gloo:").to_numpy(bool)
    assert (~keep).sum() > 100  # there were some to drop
    return analyze(Capture(events=ev[keep].reset_index(drop=True), parts=cap.parts, meta=cap.meta,
                           skipped=cap.skipped, warnings=cap.warnings))


def stalls(truth: dict, steps: pd.DataFrame) -> dict[int, float]:
    """Step (ProfilerStep number) where rank 0 arrives late -> the measured ms of the collection
    that made it late (at the end of the previous iteration), for collections inside the steps
    analyzed whose next step is analyzed too (one just before the profiler started is outside)."""
    kept = set(steps["step"].astype(int))
    return {g["iteration"] + 1: g["ms"] for g in truth["gc"] if g["iteration"] in kept and g["iteration"] + 1 in kept}


def by_rank(analysis) -> pd.Series:
    return analysis.cause_steps.groupby(["rank", "cause"])["ns"].sum()


@pytest.mark.parametrize("variant", ["full", "calling_threads_only"])
def test_foreign_straggler_and_cause(variant, foreign, analysis, calling_threads_only):
    a = analysis if variant == "full" else calling_threads_only
    truth = foreign[1]
    got = stalls(truth, a.steps)
    assert len(got) >= 5, got
    print(a.stragglers.to_string())
    assert a.straggler_ranks == [GC_RANK]
    row = a.stragglers.set_index("rank").loc[GC_RANK]
    assert row["top_cause"] == "update_from_output"
    total_ms = sum(got.values())
    assert 0.8 * total_ms <= row["top_cause_ns"] / 1e6 <= 1.05 * total_ms + 3.0 * len(got), (row["top_cause_ns"], got)
    own = a.phase_steps[(a.phase_steps["rank"] == GC_RANK) & (a.phase_steps["cause"] == "update_from_output")]
    own = own.set_index("step")["ns"] / 1e6
    unseen = [step for step, ms in got.items() if not ms <= own.get(step, 0.0) <= 1.05 * ms + 3.0]
    # calling threads only too: a padding sync's ops pair by order however late a loaded host woke
    # a calling thread (collectives.sequences), so every GC step has its window
    assert not unseen, [(step, own.get(step), got[step]) for step in unseen]
    victim = a.stragglers.set_index("rank").loc[VICTIM]
    assert not victim["straggler"] and victim["waited_for_rank"] == GC_RANK
    assert victim["top_cause"] != "dp_padding_allreduce"
    assert a.consistency == []  # the verdict and the cause table agree


@pytest.mark.parametrize("variant", ["full", "calling_threads_only"])
def test_foreign_episodes_are_the_steps_after_each_collection(variant, foreign, analysis, calling_threads_only):
    a = analysis if variant == "full" else calling_threads_only
    got = stalls(foreign[1], a.steps)
    ep = a.straggler_episodes
    print(ep.to_string())
    mine = ep[ep["rank"] == GC_RANK]
    # calling threads only too: no Gloo worker spans, so the sync instances stand on the calling
    # threads' ends alone; aligned ends a millisecond off (test_stragglers'
    # test_a_late_arrivers_window_is_not_closed_by_its_own_instance) and late releases that kept an
    # op unmatched (test_collectives' test_late_calling_thread_ends_stay_matched_by_order) hid GC
    # steps on a loaded 2-core host before they were mended
    assert set(got) <= set(mine["step"].astype(int)), (sorted(mine["step"]), got)
    # the GC rank may have a small episode of its own elsewhere, as the peer may: both ranks and
    # another test worker share 2 cores, and a descheduled rank straggles for real (seen: 6.5 ms
    # late in moe_layer at a step without GC, 4 ms over its baseline); never one of a GC's size
    others = mine[~mine["step"].astype(int).isin(set(got))]
    assert (others["late_ns"] / 1e6 < 0.25 * min(got.values())).all(), others
    mine = mine[mine["step"].astype(int).isin(set(got))]
    assert set(mine["cause"]) == {"update_from_output"}
    for step, ms in got.items():
        if step not in set(mine["step"].astype(int)):
            continue
        excess = float(mine.set_index("step").loc[step, "cause_excess_ns"]) / 1e6
        assert 0.8 * ms <= excess <= 1.05 * ms + 3.0, (step, excess, ms)
    peer = ep[ep["rank"] != GC_RANK]
    # the peer waits at the GC steps: never an episode of the GC's size there. (A small episode
    # of its own work at such a step is real: the OS descheduled it on the loaded 2-core host.)
    for row in peer[peer["step"].astype(int).isin(set(got))].itertuples():
        assert row.late_ns / 1e6 < 0.25 * got[int(row.step)], (row.step, row.late_ns, row.cause)
    assert not peer["cause"].str.startswith(("waiting for rank", "wait:", "transfer:")).any()
    assert "dp_padding_allreduce" not in set(peer["cause"])


@pytest.mark.parametrize("variant", ["full", "calling_threads_only"])
def test_foreign_victim_waits_for_the_straggler_never_in_the_sync_span(variant, foreign, analysis,
                                                                      calling_threads_only):
    a = analysis if variant == "full" else calling_threads_only
    got = stalls(foreign[1], a.steps)
    per = by_rank(a)
    victim = per.loc[VICTIM].sort_values(ascending=False)
    print(victim.head(8))
    assert victim.index[0] == f"waiting for rank {GC_RANK}"
    cs = a.cause_steps
    waited = cs[(cs["rank"] == VICTIM) & (cs["cause"] == f"waiting for rank {GC_RANK}") & cs["step"].isin(list(got))]
    total_ms = sum(got.values())
    assert 0.8 * total_ms <= waited["ns"].sum() / 1e6 <= 1.1 * total_ms
    assert victim.get("dp_padding_allreduce", 0) <= 0.02 * victim.iloc[0]
    # the causes table says the same: the straggler's own cause and the victim's wait, no sync span
    causes = a.causes.set_index("cause")
    assert causes.loc[f"waiting for rank {GC_RANK}", "ranks_list"] == str(VICTIM)
    assert causes.loc["update_from_output", "total_ns"] >= 0.9 * total_ms * 1e6
    top = list(a.causes["cause"].head(2))
    assert set(top) == {f"waiting for rank {GC_RANK}", "update_from_output"}, a.causes.head(5)


def test_foreign_sync_points_found_without_names(analysis):
    """The padding all-reduce is found by its collective op; its instances pair the ranks'
    arrivals, and after each stall the victim is blocked about as long as the collection took."""
    sp = analysis.sync_points
    dp = sp[sp["span_name"] == "dp_padding_allreduce"]
    assert len(dp) and dp["evidence"].str.contains("collective_op").all()
    assert (dp["coll_name"] == "all_reduce").all()
    assert (dp["arrive_ns"] >= dp["span_start_ns"]).all() and (dp["exit_ns"] >= dp["arrive_ns"]).all()
    a2a = sp[sp["coll_name"] == "all_to_all"]
    assert a2a["span_name"].eq("moe_layer").mean() > 0.95  # dispatch and combine, inside the user's layer range
    per_inst = dp.groupby("instance")["rank"].nunique()
    assert (per_inst == 2).mean() > 0.9


def test_calling_threads_of_a_loaded_host_keep_every_gc_step():
    """A stored run of the workload (``tests/data/foreign-loaded-host``: a fresh-clone CI run on the
    loaded 2-core host) whose calling threads' MoE all-to-all ends were noisier than their 1 ms
    matching tolerance: order matching paired them a period off (a lag of two scored 32 against
    lag 0's 31), which put every pair off the clock line, and the calling-threads analysis lost
    the padding all-reduce's instances at three of the six GC steps (408 ms of 817). The lag is
    now taken where the all-reduce's clear lag puts the clock (``sequences._order_lags``): every
    GC step is found, sized as the full trace sizes it."""
    root = REPO / "tests" / "data" / "foreign-loaded-host"
    truth = json.loads((root / "truth" / f"rank{GC_RANK}.json").read_text())
    cap = profkit.load(root / "trace")
    keep = ~cap.events["name"].astype(str).str.startswith("gloo:").to_numpy(bool)
    a = analyze(Capture(events=cap.events[keep].reset_index(drop=True), parts=cap.parts, meta=cap.meta,
                        skipped=cap.skipped, warnings=cap.warnings))
    got = stalls(truth, a.steps)
    assert sorted(got) == [10, 15, 20, 25, 30, 35]
    assert a.straggler_ranks == [GC_RANK]
    row = a.stragglers.set_index("rank").loc[GC_RANK]
    total_ms = sum(got.values())
    assert row["top_cause"] == "update_from_output"
    assert 0.8 * total_ms <= row["top_cause_ns"] / 1e6 <= 1.05 * total_ms + 3.0 * len(got)
    own = a.phase_steps[(a.phase_steps["rank"] == GC_RANK) & (a.phase_steps["cause"] == "update_from_output")]
    own = own.set_index("step")["ns"] / 1e6
    assert all(ms <= own.get(step, 0.0) <= 1.05 * ms + 3.0 for step, ms in got.items()), (own.to_dict(), got)
    cs = a.cause_steps
    waited = cs[(cs["rank"] == VICTIM) & (cs["cause"] == f"waiting for rank {GC_RANK}") & cs["step"].isin(list(got))]
    assert 0.8 * total_ms <= waited["ns"].sum() / 1e6 <= 1.1 * total_ms
