"""The analysis as a map over ranks: every executor gives the same tables, bit for bit, and a
dead worker is retried or named, never a silent partial result (issue 9)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.analyze.pipeline import analyze
from profkit.ingest.loader import load
from profkit.scale import ScaleError, analyze_paths
from profkit.scale.executors import START_ENV, start_method
from profkit.analyze.stages import KILL_ENV
from profkit.analyze.store import frame_to_table, table_to_frame

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.xdist_group("multiprocess")  # process pools and Dask clusters: not beside each other

TABLES = ("steps", "timelines", "ranks", "causes", "cause_steps", "stragglers", "straggler_instances", "lateness")


def _tables(a) -> dict[str, pd.DataFrame]:
    out = {name: getattr(a, name) for name in TABLES}
    out["dp_imbalance"] = a.balance["dp"]
    out["impact"] = a.impact.table
    out["impact_steps"] = a.impact.steps
    out["alignment"] = a.alignment.ranks
    out["sources"] = a.alignment.sources
    return out


def _assert_same(a, b, what: str) -> None:
    ta, tb = _tables(a), _tables(b)
    for name in ta:
        try:
            pd.testing.assert_frame_equal(ta[name].reset_index(drop=True), tb[name].reset_index(drop=True),
                                          check_exact=True)
        except AssertionError as exc:
            raise AssertionError(f"{what}: table {name} differs: {exc}") from None
    assert a.straggler_ranks == b.straggler_ranks
    assert a.warnings == b.warnings
    assert a.step_marker == b.step_marker


def _simulated(tmp_path_factory, ranks: int, steps: int, layers: int, *injects: str) -> Path:
    """``profkit simulate`` (seed 9, 2 workers) of ``ranks`` x ``steps`` with the causes ``injects``."""
    out = tmp_path_factory.mktemp(f"dep{ranks}") / "sim"
    flags = [f for i in injects for f in ("--inject", i)]
    subprocess.run([sys.executable, "-m", "profkit.cli.main", "simulate", "--ranks", str(ranks), "--steps", str(steps),
                    "--seed", "9", "--layers", str(layers), *flags, "-o", str(out), "-q", "--workers", "2"], check=True)
    return out


@pytest.fixture(scope="module")
def dep32(tmp_path_factory) -> Path:
    """A simulated DEP32 capture with two injected causes (4 hosts, skewed clocks)."""
    return _simulated(tmp_path_factory, 32, 24, 4, "gc:rank=5,every=6,ms=20", "slow_schedule:rank=17,ms=4")


@pytest.fixture(scope="module")
def serial(dep32):
    return analyze_paths([dep32], executor="serial")


@pytest.fixture(scope="module")
def dep12(tmp_path_factory) -> Path:
    """A smaller capture for what does not depend on size (retries, error messages, the CLI's
    flags): 12 ranks (rank 11 is the last finish task, with the impact tasks queued behind it),
    8 steps, the same two causes; a run costs a fraction of DEP32's."""
    return _simulated(tmp_path_factory, 12, 8, 2, "gc:rank=5,every=3,ms=20", "slow_schedule:rank=7,ms=4")


@pytest.fixture(scope="module")
def serial12(dep12):
    return analyze_paths([dep12], executor="serial")


def test_serial_pool_dask_and_in_memory_give_identical_tables(dep32, serial):
    pool = analyze_paths([dep32], executor="pool", workers=2)
    dask = analyze_paths([dep32], executor="dask", dask_local=2)
    _assert_same(serial, pool, "pool vs serial")
    _assert_same(serial, dask, "dask vs serial")
    _assert_same(serial, analyze(load(dep32)), "in-memory pipeline.analyze vs serial")
    # the run was really spread: two worker processes besides the driver, every rank in every stage
    workers = set(pool.run_stats["worker"])
    assert len(workers) == 2, workers
    per_stage = pool.run_stats.groupby("stage")["rank"].nunique()
    assert per_stage["prepare"] == per_stage["rank"] == per_stage["causes"] == per_stage["finish"] == per_stage["impact"] == 32
    # and it found the injected causes (the accuracy suite checks how well; here: found at all)
    assert {5, 17} <= set(serial.straggler_ranks)


def test_impact_at_dep32_matches_the_simulator_with_each_fault_removed(serial):
    """Issue 17 at DEP32 on the scale path: rank 5's GC (every 6th step) and rank 17's slow
    schedule (every step) land at the same sync point; the simulator re-run with one of them
    removed (same seed) is the truth, within 10% or 0.2 ms."""
    from profkit.analyze import impact as imp
    from profkit.simulate.config import SimConfig, parse_inject
    from profkit.simulate.model import Timeline

    def true_mean(injects):
        cfg = SimConfig(ranks=32, steps=24, seed=9, layers=4, injects=tuple(parse_inject(i) for i in injects))
        tl = Timeline(cfg)
        spans = [r.spans for r in tl.run(np.arange(32), tl.new_coupling())]
        return float((np.concatenate([s["step_e"] for s in spans], 1) - np.concatenate([s["step_b"] for s in spans], 1)).mean())

    gc, slow = "gc:rank=5,every=6,ms=20", "slow_schedule:rank=17,ms=4"
    full = true_mean([gc, slow])
    table = serial.impact.table.set_index("cause")
    for name, without in (("gc", [slow]), ("Scheduler.schedule on rank 17", [gc])):
        true = full - true_mean(without)
        pred = float(table.loc[name, "impact_ns_per_step"])
        assert abs(pred - true) <= max(0.1 * abs(true), 200_000), (name, pred, true)
    both = imp.what_if(serial.impact, [imp.Scenario("both", imp.COMBINED, parts=(
        imp.Scenario("gc", imp.CAUSE, phase="gc"),
        imp.Scenario("s", imp.RANK_PHASE, phase="Scheduler.schedule", rank=17)))])
    true = full - true_mean([])
    assert abs(float(both["impact_ns_per_step"].iloc[0]) - true) <= max(0.1 * true, 200_000)


def _replay_spies(monkeypatch) -> tuple[list, list]:
    """What the driver read back of each program (True: from the store), and what each replay on
    the driver was given of a worker's replay (``pipeline._replay_beside``: True where it came)
    followed by the names of the scenarios it replayed itself."""
    from profkit.analyze import impact, stages

    stored, given = [], []
    load, replay, cuts = stages.load_program, impact.impact_from_graph, impact._cuts

    def load_spy(store, program, **kw):
        stored.append(program.nodes is None)  # it came back without its tables
        return load(store, program, **kw)

    def replay_spy(*args, **kw):
        given.append(kw.get("replayed") is not None)
        return replay(*args, **kw)

    def cuts_spy(g, block):
        given.extend(sc.name for sc in block)
        return cuts(g, block)

    monkeypatch.setattr(stages, "load_program", load_spy)
    monkeypatch.setattr(impact, "impact_from_graph", replay_spy)
    monkeypatch.setattr(impact, "_cuts", cuts_spy)  # (a worker's calls are counted in its own copy)
    return stored, given


def _replay_tasks(analysis) -> int:
    st = analysis.run_stats
    return int(((st["stage"] == "impact") & st["rank"].isna()).sum())


def test_replay_programs_kept_in_the_store_give_the_same_tables(dep32, serial, monkeypatch):
    """Large captures' impact tasks put their programs in the store (Arrow, phases as a category)
    and the driver reads them back after the verdicts: the same tables as the serial run's. A
    worker replays the scenarios that need no verdict from the store meanwhile, and the driver
    takes them: the same tables again; without it (a graph too large for a worker) as well."""
    from profkit.analyze import impact as imp
    from profkit.analyze import pipeline

    stored, given = _replay_spies(monkeypatch)
    monkeypatch.setattr(pipeline, "PROGRAMS_IN_STORE_EVENTS", 0)
    beside = analyze_paths([dep32], executor="pool", workers=2)
    _assert_same(serial, beside, "pool, programs in the store, replayed beside the verdicts")
    assert len(stored) == 32 and all(stored)
    assert given[0] is True and _replay_tasks(beside) == 1
    # a straggler's cause is on its GPU: the driver joins that work, so it replays again only
    # what that work changes (the spike-free bound, the spikes) and the straggler ranks' rows
    assert imp.straggler_gpu_phases(serial.stragglers)
    kinds = dict(zip(serial.impact.table["cause"], serial.impact.table["kind"]))
    mine = given[1:]
    assert mine and imp.MEDIAN_STEP in mine and imp.GPU_ONLY not in mine
    assert {kinds[c] for c in mine} <= {imp.RANK_PHASE, imp.SPIKES, imp.BOUND}
    assert len(mine) < len(kinds)
    monkeypatch.setattr(pipeline, "REPLAY_BESIDE_MAX_POINTS", 0)
    given.clear()
    alone = analyze_paths([dep32], executor="pool", workers=2)
    _assert_same(serial, alone, "pool, programs in the store, every scenario replayed by the driver")
    assert given[0] is False and len(given[1:]) == len(kinds) and _replay_tasks(alone) == 0
    monkeypatch.setattr(pipeline, "PROGRAMS_IN_STORE_EVENTS", 10**12)
    stored.clear()
    analyze_paths([REPO / "sample_traces" / "public-hta-2rank"], executor="pool", workers=2)
    assert len(stored) == 2 and not any(stored)  # a small capture's come with the results


def test_a_replay_beside_the_verdicts_whose_worker_dies_is_made_by_the_driver(dep32, serial, monkeypatch):
    """The worker replaying beside the verdicts dies every time (retried once on a fresh pool):
    the driver replays every scenario itself, the same tables, and the run goes on."""
    from profkit.analyze import pipeline

    _, given = _replay_spies(monkeypatch)
    monkeypatch.setattr(pipeline, "PROGRAMS_IN_STORE_EVENTS", 0)
    monkeypatch.setenv(KILL_ENV, "replay:None")
    _assert_same(serial, analyze_paths([dep32], executor="pool", workers=2), "pool, the replay's worker died")
    assert given[0] is False and len(given[1:]) == len(serial.impact.table)


def test_driver_holds_no_events(serial, dep32):
    assert serial.events is None and serial.capture.events.empty
    assert serial.capture.event_count == sum(load(dep32).parts["n_events"])


def test_a_dask_worker_killed_mid_run_is_retried(dep12, serial12, tmp_path, monkeypatch):
    monkeypatch.setenv(KILL_ENV, f"rank:7:{tmp_path / 'killed'}")  # rank 7's first attempt dies
    again = analyze_paths([dep12], executor="dask", dask_local=2)
    assert (tmp_path / "killed").exists()
    _assert_same(serial12, again, "dask after a worker died")


def test_a_dask_task_whose_workers_keep_dying_fails_naming_the_rank(dep12, monkeypatch):
    dask_config = pytest.importorskip("dask.config")
    monkeypatch.setenv(KILL_ENV, "finish:11")  # every attempt dies
    with dask_config.set({"distributed.scheduler.allowed-failures": 1}):
        with pytest.raises(ScaleError, match=r"rank 11: stage 'finish'"):
            analyze_paths([dep12], executor="dask", dask_local=2)


@pytest.mark.parametrize("stage, rank", [("prepare", 3), ("finish", 11)])
def test_a_pool_worker_killed_is_retried_once_then_named(dep12, serial12, tmp_path, monkeypatch, stage, rank):
    """The finish and impact stages are in flight together (``pipeline.run_stages``): a worker that
    dies in a finish task breaks the pool under the queued impact tasks too, which run again on
    the fresh pool without that counting as a death of theirs."""
    monkeypatch.setenv(KILL_ENV, f"{stage}:{rank}:{tmp_path / 'once'}")
    _assert_same(serial12, analyze_paths([dep12], executor="pool", workers=2), f"pool after a worker died in {stage}")
    assert (tmp_path / "once").exists()
    monkeypatch.setenv(KILL_ENV, f"{stage}:{rank}")
    with pytest.raises(ScaleError, match=rf"rank {rank}\b.*stage '{stage}'.*died twice"):
        analyze_paths([dep12], executor="pool", workers=2)


def test_a_script_without_a_main_guard_is_told_why_every_worker_died(dep12, tmp_path):
    """Spawned workers import the main script: one that calls profkit at its top level kills each of
    them at start-up, and the error says so, not only "killed, or out of memory". Forked workers
    (the default on Linux) do not import it: the same script runs."""
    script = tmp_path / "no_guard.py"
    script.write_text("from profkit.scale import analyze_paths\n"
                      f"a = analyze_paths([{str(dep12)!r}], executor='pool', workers=2)\n"
                      "print('ranks', a.steps['rank'].nunique())\n")
    env = {k: v for k, v in os.environ.items() if k != START_ENV}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**env, START_ENV: "spawn"})
    assert done.returncode != 0
    # the traceback's last line; not simply stderr's: on a loaded machine the multiprocessing resource
    # tracker may warn after it about semaphores the dying workers left (their pools' queues)
    errors = [line for line in done.stderr.splitlines() if line.startswith("profkit.errors.ScaleError: ")]
    assert errors, done.stderr[-2000:]
    assert "died twice" in errors[-1] and 'if __name__ == "__main__":' in errors[-1], errors[-1]
    if sys.platform.startswith("linux"):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0 and "ranks 12" in done.stdout, done.stderr[-2000:]


def test_a_batch_submitted_to_a_pool_another_batch_broke_runs_on_a_fresh_one():
    """The finish and impact batches are in flight together: when a task of the first kills its
    worker before the second is submitted, the second is not lost (nor an exception of the
    pool's own): it runs on a fresh pool, and the first batch still names its task."""
    import time

    from profkit.scale.executors import PoolExecutor

    ex = PoolExecutor(1)
    try:
        first = ex.submit(os._exit, [(3,)], ["the killer"])
        deadline = time.monotonic() + 30
        while not getattr(ex._pool, "_broken", False) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert getattr(ex._pool, "_broken", False)
        second = ex.submit(abs, [(-2,), (-3,)], ["rank 0", "rank 1"])
        assert second.results() == [2, 3]
        with pytest.raises(ScaleError, match=r"the killer: stage '_exit'.*died twice"):
            first.results()
    finally:
        ex.close()


def test_pool_start_method_forks_only_without_other_threads(monkeypatch):
    """fork only where it is safe (Linux, one Python thread: no lock of ours can be held in the
    child); the environment variable overrides, and a wrong value is named."""
    import threading

    monkeypatch.delenv(START_ENV, raising=False)
    fresh = subprocess.run([sys.executable, "-c", "from profkit.scale.executors import start_method; print(start_method())"],
                           capture_output=True, text=True, check=True, env={k: v for k, v in os.environ.items() if k != START_ENV})
    assert fresh.stdout.strip() == ("fork" if sys.platform.startswith("linux") else "spawn")  # a fresh interpreter: one thread
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert start_method() == "spawn"
    finally:
        stop.set()
        worker.join()
    monkeypatch.setenv(START_ENV, "Spawn")
    assert start_method() == "spawn"
    monkeypatch.setenv(START_ENV, "vfork")
    with pytest.raises(ScaleError, match=START_ENV + ".*vfork"):
        start_method()


def test_spawned_and_forked_pools_give_the_same_tables(dep12, serial12, monkeypatch):
    monkeypatch.setenv(START_ENV, "spawn")
    _assert_same(serial12, analyze_paths([dep12], executor="pool", workers=2), "spawned pool")


def test_cli_executors_write_identical_files(dep12, tmp_path):
    """The CLI's executor flags on a small capture (the tables themselves are compared on DEP32,
    in-process, by ``test_serial_pool_dask_and_in_memory_give_identical_tables``)."""
    outs = {}
    for name, flags in {"serial": ["--executor", "serial"], "pool": ["--workers", "2"],
                        "dask": ["--dask-local", "2"]}.items():
        out = tmp_path / name
        subprocess.run([sys.executable, "-m", "profkit.cli.main", "analyze", str(dep12), "-o", str(out), "-q",
                        *flags], check=True)
        outs[name] = out
    for csv in ("steps.csv", "causes.csv", "stragglers.csv", "lateness.csv", "dp_imbalance.csv", "impact.csv",
                "impact_steps.csv"):
        ref = (outs["serial"] / csv).read_bytes()
        assert ref and all((outs[n] / csv).read_bytes() == ref for n in ("pool", "dask")), csv


def test_bad_file_is_skipped_and_named_on_every_executor(dep12, tmp_path):
    import shutil

    folder = tmp_path / "cap"
    shutil.copytree(dep12, folder)
    (folder / "rank3.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    a = analyze_paths([folder], executor="pool", workers=2)
    assert any("rank3.pt.trace.json.gz" in s for s in a.capture.skipped)
    assert 3 not in set(a.steps["rank"]) and len(set(a.steps["rank"])) == 11


def test_store_round_trip_keeps_dtypes_and_missing_values():
    df = pd.DataFrame({
        "rank": pd.array([1, 2, 3], dtype="int64"),
        "phase": pd.Series(["a", None, "c"], dtype=object),
        "n": pd.array([1, None, 3], dtype="Int64"),
        "share": [0.5, float("nan"), 1.0],
        "flag": [True, False, True],
        "name": pd.array(["x", None, "<script>"], dtype=pd.ArrowDtype(__import__("pyarrow").string())),
    })
    back = table_to_frame(frame_to_table(df))
    pd.testing.assert_frame_equal(back, df, check_exact=True)
    assert back["phase"].iloc[1] is None


def test_merge_from_the_executor_is_the_same_file_as_from_memory(tmp_path):
    """``profkit merge`` reads and prepares ranks on the pool and writes one rank at a time; the
    file is byte for byte the one ``merge_capture`` writes from a capture held in memory."""
    from profkit.export import merge_capture
    from profkit.scale import merge_paths

    sim = tmp_path / "sim"
    subprocess.run([sys.executable, "-m", "profkit.cli.main", "simulate", "--ranks", "8", "--steps", "12", "--seed", "3",
                    "--ranks-per-host", "4", "--inject", "gc:rank=2,every=4,ms=10", "-o", str(sim), "-q",
                    "--workers", "1"], check=True)
    for fmt, name in (("perfetto", "m.pftrace"), ("chrome", "m.json")):
        streamed, capture = merge_paths([sim], tmp_path / f"pool-{name}", executor="pool", workers=2, fmt=fmt)
        in_memory = merge_capture(load(sim), tmp_path / f"mem-{name}", fmt=fmt)
        assert streamed.ranks == in_memory.ranks == list(range(8))
        assert (tmp_path / f"pool-{name}").read_bytes() == (tmp_path / f"mem-{name}").read_bytes()
        assert capture.events.empty and capture.event_count == in_memory.n_events


_FREED_MEMORY_CHECK = r"""
import json
import numpy as np
from profkit.scale import allocator
from profkit.scale.executors import PoolExecutor

def kept():
    # whether glibc kept a freed 64 MB array (the RSS stays up) or unmapped it; the module's flag
    def rss():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024
    a = np.ones(8 << 20, np.int64)  # 64 MB: above glibc's largest default mmap threshold (32 MB)
    held = rss()
    del a
    return rss() > held - (32 << 20), bool(allocator._applied)

ex = PoolExecutor(1)
[worker] = ex.map(kept, [()], ["rank 0"])
ex.close()
print(json.dumps({"worker": worker, "driver": kept()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
@pytest.mark.parametrize("setting", ["default", "off"])
def test_pool_workers_keep_freed_memory_for_the_next_array(setting):
    """The pool's workers reuse what they free (``scale.allocator``): a freed 64 MB array stays in
    the heap, where glibc's default unmaps it at once; ``PROFKIT_MALLOC=0`` leaves glibc as it is.
    The driver's (the caller's) own allocator is never changed. In a fresh interpreter: a test
    process that ran other tests may hold what it freed for its own reasons."""
    import json

    from profkit.scale import allocator

    env = {k: v for k, v in os.environ.items() if k not in (allocator.ENV, "GLIBC_TUNABLES")}
    env[START_ENV] = "fork"  # the script's own function reaches a forked worker as it is
    if setting == "off":
        env[allocator.ENV] = "0"
    done = subprocess.run([sys.executable, "-c", _FREED_MEMORY_CHECK], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["worker"] == ([True, True] if setting == "default" else [False, False]), got
    assert got["driver"] == [False, False], got  # the driver: glibc's default, the array unmapped


def test_spawned_pool_workers_tune_their_allocator_too(monkeypatch):
    from profkit.scale import allocator
    from profkit.scale.executors import PoolExecutor

    monkeypatch.setenv(START_ENV, "spawn")
    monkeypatch.delenv(allocator.ENV, raising=False)
    ex = PoolExecutor(1)
    try:
        assert ex.map(allocator.keep_freed_memory, [()], ["rank 0"]) == [sys.platform.startswith("linux")]
    finally:
        ex.close()


def _arrow_pool_name() -> str:
    import pyarrow as pa

    return pa.default_memory_pool().backend_name


@pytest.mark.parametrize("setting", ["default", "malloc off", "user's pool"])
def test_arrow_allocates_from_the_system_pool_inside_an_analysis_only(monkeypatch, setting):
    """``allocator.system_arrow_pool``: Arrow's default pool is the system allocator inside, the
    caller's pool is back on return (after an error too); ``PROFKIT_MALLOC=0`` or a pool the user
    chose (``ARROW_DEFAULT_MEMORY_POOL``) leaves Arrow's pool alone. Buffers made inside outlive it."""
    import pyarrow as pa

    from profkit.scale import allocator

    monkeypatch.delenv(allocator.ENV, raising=False)
    monkeypatch.delenv(allocator.ARROW_ENV, raising=False)
    if setting == "malloc off":
        monkeypatch.setenv(allocator.ENV, "0")
    elif setting == "user's pool":
        monkeypatch.setenv(allocator.ARROW_ENV, _arrow_pool_name())
    before = _arrow_pool_name()
    other = before != "system"  # a process whose pool is the system one already has nothing to switch
    with allocator.system_arrow_pool() as changed:
        assert changed == (setting == "default" and other)
        assert _arrow_pool_name() == ("system" if setting == "default" else before)
        kept = pa.array(np.arange(1 << 16))
    assert _arrow_pool_name() == before
    assert kept.sum().as_py() == (1 << 16) * ((1 << 16) - 1) // 2
    with pytest.raises(RuntimeError):
        with allocator.system_arrow_pool():
            raise RuntimeError("the analysis failed")
    assert _arrow_pool_name() == before


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_pool_workers_allocate_arrow_buffers_from_the_system_pool(monkeypatch, start):
    """Forked workers inherit the driver's setting inside ``analyze_paths``; spawned ones set it
    in their initializer (``executors._start_worker``)."""
    from profkit.scale import allocator
    from profkit.scale.executors import PoolExecutor

    if start not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"no {start} here")
    monkeypatch.setenv(START_ENV, start)
    monkeypatch.delenv(allocator.ENV, raising=False)
    monkeypatch.delenv(allocator.ARROW_ENV, raising=False)
    with allocator.system_arrow_pool():
        ex = PoolExecutor(1)
        try:
            assert ex.map(_arrow_pool_name, [()], ["rank 0"]) == ["system"]
        finally:
            ex.close()


def test_a_batch_then_another_waits_for_the_first_and_a_cancelled_one_is_never_submitted():
    """``pipeline._Then``: the second batch is made of the first's results in a thread; once
    cancelled (the run failed before it was used), nothing is submitted to a closing executor;
    an error of the first batch reaches the caller."""
    import threading

    from profkit.analyze.pipeline import _Then
    from profkit.analyze.stages import Batch

    gate = threading.Event()
    made = []

    def first():
        gate.wait(10)
        return [1, 2]

    def then(res):
        made.append(res)
        return Batch(lambda: [sum(res)])

    ok = _Then(Batch(first), then)
    gate.set()
    ok.first_in()
    assert ok.results() == 3 and made == [[1, 2]]
    gate.clear()
    made.clear()
    stopped = _Then(Batch(first), then)
    stopped.cancel()
    gate.set()
    assert stopped.results() is None and made == []

    def broken():
        raise ScaleError("rank 3: stage 'impact' failed")

    with pytest.raises(ScaleError, match="rank 3"):
        _Then(Batch(broken), then).results()
    assert made == []


@pytest.mark.parametrize("start, sizes, workers, expect", [
    ("fork", [600_000, 600_000], None, "pool"),  # 1.2 MB: forked workers pay back
    ("fork", [300_000, 300_000], None, "serial"),  # 0.6 MB: as fast in this process
    ("fork", [3 << 20], None, "serial"),  # one file: nothing to spread
    ("spawn", [8 << 20, 8 << 20], None, "serial"),  # 16 MB: spawned workers import everything first
    ("spawn", [40 << 20, 40 << 20], None, "pool"),  # 80 MB: that pays back
    ("spawn", [1000, 1000], 2, "pool"),  # workers asked for: a pool, whatever the size
])
def test_default_pool_runs_a_small_capture_in_this_process(tmp_path, monkeypatch, start, sizes, workers, expect):
    """The default pool's size rule (``run.small_capture_bytes``): in-process below 1 MB of trace
    files where the workers would fork, below 64 MB where they would spawn, always for one file;
    a pool whenever workers are given (and then no more processes than files)."""
    from profkit.scale import run

    for i, size in enumerate(sizes):
        with open(tmp_path / f"rank{i}.json", "wb") as f:  # only the sizes are read here: sparse files
            f.truncate(size)
    monkeypatch.setenv(START_ENV, start)
    files, skipped, _, store, ex = run._setup([tmp_path], "pool", workers, None, None, None, None)
    try:
        assert len(files) == len(sizes) and not skipped
        assert ex.name == expect
        if expect == "pool":
            assert ex.workers == min(workers or os.cpu_count() or 1, len(files))
    finally:
        ex.close()
        store.close()
    assert run.small_capture_bytes() == (run.SMALL_FORKED_CAPTURE_BYTES if start == "fork" else run.SMALL_CAPTURE_BYTES)


def test_the_driver_gives_freed_memory_back_only_on_large_captures(dep12, serial12, monkeypatch):
    """``pipeline.TRIM_MIN_EVENTS``: below it the driver keeps what it frees (its heap is small, and
    the trims cost the waiting workers more than they give back); from it up, it trims between
    stages (in the straggler verdicts too). The tables are the same either way."""
    from profkit.analyze import pipeline

    calls = []
    monkeypatch.setattr(pipeline, "_trim", lambda: calls.append(1))
    small = analyze_paths([dep12], executor="serial")
    assert calls == []
    monkeypatch.setattr(pipeline, "TRIM_MIN_EVENTS", 1)
    large = analyze_paths([dep12], executor="serial")
    assert len(calls) >= 5  # after the prepare, before and after the verdicts (and inside them), in the impact
    _assert_same(small, serial12, "kept")
    _assert_same(large, serial12, "trimmed")
