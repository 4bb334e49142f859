"""The compiled replay (``replay_kernel``: numba's JIT, and the same function built ahead of time
into a module, ``impact_replay.build_kernel``) and the numpy replay compute the same shifts.

All are exact integer max-plus, so they must agree bit for bit: on random programs whose ranks
take their sync instances in different orders (the replay must release an instance early, which
depends on the order points were evaluated in), and on the programs of real captures (vLLM 0.26
and profkit's engine on 4 H200s, analyzed from ``sample_traces``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.analyze import impact as imp
from profkit.analyze import impact_program as prog
from profkit.analyze import impact_replay as rp

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


@pytest.fixture(params=["jit", "built"])
def kernel(request, monkeypatch):
    """Each compiled replay: numba's JIT (the module built ahead of time hidden), and the built
    module (skipped where it cannot be built, e.g. no C compiler)."""
    pytest.importorskip("numba")
    if request.param == "built":
        if rp.build_kernel() is None:
            pytest.skip(f"the replay cannot be built ahead of time here ({rp.why_kernel_not_built()})")
    else:
        monkeypatch.setattr(rp, "_built", lambda: None)
    return request.param


def random_graph(rng: np.random.Generator, ranks: int, instances: int, swap_p: float) -> tuple[rp.ReplayGraph, int]:
    """A program of ``ranks`` ranks: each takes part in some of ``instances`` sync instances
    (arrive, then exit), with host work points between them whose edges reach up to 3 earlier
    points of the rank; with probability ``swap_p`` a rank takes two neighbouring instances in
    the other order (clocks disagreeing about the order: deadlocks the replay must break)."""
    members = [sorted(rng.choice(ranks, size=int(rng.integers(1, ranks + 1)), replace=False)) for _ in range(instances)]
    rows, src, edge, slack = [], [], [], []
    n_edges = 0
    offsets = [0]
    for r in range(ranks):
        mine = [k for k in range(instances) if r in members[k]]
        for i in range(len(mine) - 1):
            if rng.random() < swap_p:
                mine[i], mine[i + 1] = mine[i + 1], mine[i]
        t = int(rng.integers(0, 1000))
        start = len(rows)

        def point(kind: int, k: int, n_src: int) -> None:
            nonlocal t, n_edges
            here = len(rows)
            t += int(rng.integers(0, 50))
            rows.append((r, here - start, t, prog.HOST, kind, k, -1))
            s = [-1] * rp.IN
            e = [-1] * rp.IN
            sl = [0] * rp.IN
            earlier = np.arange(start, here)
            if kind == prog.EXIT:
                e[0], n_edges = n_edges, n_edges + 1  # the sync edge: no source
            elif earlier.size and n_src:
                picks = rng.choice(earlier[-6:], size=min(n_src, min(6, earlier.size)), replace=False)
                for j, p in enumerate(picks):  # slack 0 on the first: the baseline replays every time as observed
                    s[j], e[j], sl[j] = int(p), n_edges, int(rng.integers(0, 30)) if j else 0
                    n_edges += 1
            src.append(s), edge.append(e), slack.append(sl)

        point(prog.START, -1, 0)
        for k in mine:
            for _ in range(int(rng.integers(0, 4))):
                point(prog.ANCHOR, -1, int(rng.integers(1, rp.IN + 1)))
            point(prog.ARRIVE, k, int(rng.integers(1, rp.IN + 1)))
            point(prog.EXIT, k, 0)
        offsets.append(len(rows))
    nodes = pd.DataFrame(rows, columns=prog.NODE_COLUMNS)
    kind = nodes["kind"].to_numpy(np.int64)
    raw = nodes["instance"].to_numpy(np.int64)
    is_exit, is_arrive = kind == prog.EXIT, kind == prog.ARRIVE
    inst = np.where(is_exit | is_arrive, raw, -1)
    arr = np.flatnonzero(is_arrive)
    arr = arr[np.argsort(inst[arr], kind="stable")]
    counts = np.bincount(inst[arr], minlength=instances)
    bounds = np.r_[0, np.cumsum(counts)].astype(np.int64)
    t = nodes["time_ns"].to_numpy(np.int64)
    last = np.zeros(instances, np.int64)
    np.maximum.at(last, inst[arr], t[arr])
    work = rp.WorkArrays.of(prog._empty_work().assign(gedge=pd.Series(dtype="int64")))
    g = rp.ReplayGraph(nodes=nodes, offsets=np.array(offsets, np.int64), ranks=np.arange(ranks, dtype=np.int64),
                       in_src=np.array(src, np.int64), in_edge=np.array(edge, np.int64),
                       in_slack=np.array(slack, np.int64), is_exit=is_exit, is_arrive=is_arrive, inst=inst,
                       arr_nodes=arr, arr_slack=last[inst[arr]] - t[arr], arr_bounds=bounds,
                       edges=pd.DataFrame({"gid": np.arange(n_edges)}), work=work)
    return g, n_edges


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_with_disagreeing_clocks_replay_the_same(seed, kernel):
    rng = np.random.default_rng(seed)
    g, n_edges = random_graph(rng, ranks=int(rng.integers(2, 7)), instances=int(rng.integers(3, 25)),
                              swap_p=0.0 if seed < 3 else 0.3)
    scen = 4
    cut = rng.integers(0, 40, size=(n_edges, scen)).astype(np.int64)
    cut[rng.random(cut.shape) < 0.5] = 0
    cut[:, 0] = 0  # the baseline: nothing removed
    node_cut = rng.integers(0, 20, size=(g.n, scen)).astype(np.int64) if seed % 2 else None
    fast, forced_fast = rp.replay(g, cut, node_cut, use_kernel=kernel)
    slow, forced_slow = rp.replay_numpy(g, cut, node_cut)
    assert forced_fast == forced_slow
    np.testing.assert_array_equal(fast, slow)
    if node_cut is None and not forced_fast:
        assert not fast[:, 0].any()  # nothing removed moves nothing


def test_the_random_programs_do_deadlock():
    """The generator's swaps reach the early-release path (else the tests above prove less)."""
    forced = 0
    for seed in range(3, 12):
        rng = np.random.default_rng(seed)
        g, n_edges = random_graph(rng, ranks=int(rng.integers(2, 7)), instances=int(rng.integers(3, 25)), swap_p=0.3)
        forced += rp.replay(g, np.zeros((n_edges, 1), np.int64), use_kernel=True)[1]
    assert forced > 0


@pytest.mark.parametrize("folder", ["vllm-0.26-h200/torch_faults", "engine-dep4-h200-capture/torch_faults"])
def test_real_capture_programs_replay_the_same(folder, monkeypatch, kernel):
    from profkit.scale import analyze_paths

    a = analyze_paths([SAMPLES / folder], executor="serial")
    g = a.impact.graph
    assert g is not None and g.n > 200
    scen = imp.scenarios_for(g.work, a.causes, a.stragglers, a.straggler_ranks)
    cut, node_cut, _ = imp._cuts(g, scen)
    assert cut.any()
    fast, forced_fast = rp.replay(g, cut, node_cut, use_kernel=kernel)
    slow, forced_slow = rp.replay_numpy(g, cut, node_cut)
    assert forced_fast == forced_slow
    np.testing.assert_array_equal(fast, slow)
    # the whole impact table, the kernel's scenario blocks included, is the same either way; one
    # scenario per block, so the blocks are replayed on threads side by side (both kernels run
    # without the GIL)
    monkeypatch.setattr(rp, "MIN_COMPILED_ROUNDS", 1)
    assert rp.kernel_kind(g) == kernel and rp.releases_gil(g)
    halves = imp.what_if(a.impact, scen)  # every scenario fits a block: two even blocks, one a thread
    monkeypatch.setattr(imp, "SCENARIO_BLOCK_BYTES", 1)
    compiled = imp.what_if(a.impact, scen)
    pd.testing.assert_frame_equal(compiled, halves)
    monkeypatch.setenv(rp.NO_JIT_ENV, "1")
    pd.testing.assert_frame_equal(compiled, imp.what_if(a.impact, scen))


def test_warm_up_loads_the_kernel_the_replay_runs(monkeypatch):
    """``warm_up`` (run in a background thread on large captures) must load the very
    specialization a replay then calls: a replay after it compiles nothing new. (Where the kernel
    is built ahead of time, there is nothing to warm: hidden here.)"""
    from profkit.analyze.replay_kernel import replay_points

    monkeypatch.setattr(rp, "_built", lambda: None)
    monkeypatch.setattr(rp, "build_kernel", lambda: None)  # as where it cannot be built
    assert rp.warm_up()
    warmed = set(replay_points.signatures)
    g, n_edges = random_graph(np.random.default_rng(3), ranks=3, instances=6, swap_p=0.0)
    rp.replay(g, np.zeros((n_edges, 2), np.int64), np.zeros((g.n, 2), np.int64), use_kernel=True)
    rp.replay(g, np.zeros((n_edges, 1), np.int64), use_kernel=True)
    assert set(replay_points.signatures) == warmed


def test_warm_up_builds_the_kernel_where_it_is_not_built(monkeypatch):
    """On a large capture's first run on a machine, the background warm-up builds the kernel ahead
    of time (and loads no numba JIT kernel once that worked); ``PROFKIT_NO_JIT`` does nothing."""
    builds = []
    monkeypatch.setattr(rp, "_built", lambda: None)
    monkeypatch.setattr(rp, "build_kernel", lambda: builds.append(1) or object())
    monkeypatch.setattr(rp, "_kernel", lambda: pytest.fail("the JIT kernel must not be loaded"))
    assert not rp.warm_up() and builds == [1]
    monkeypatch.setenv(rp.NO_JIT_ENV, "1")
    assert not rp.warm_up() and builds == [1]


def test_the_kernel_runs_from_its_size_on_and_numpy_can_be_forced(monkeypatch):
    """numba is a test dependency: without the module built ahead of time, numba's JIT replay is
    what runs on a rank of ``MIN_COMPILED_ROUNDS`` points or more, and smaller programs get numpy
    (importing numba would cost more); ``PROFKIT_NO_JIT`` forces numpy."""
    g, _ = random_graph(np.random.default_rng(0), ranks=2, instances=5, swap_p=0.0)
    monkeypatch.setattr(rp, "_built", lambda: None)
    assert not rp.compiled(g) and rp.kernel_kind(g) is None
    monkeypatch.setattr(rp, "MIN_COMPILED_ROUNDS", 1)
    assert rp.kernel_kind(g) == "jit" and rp.releases_gil(g)
    monkeypatch.setenv(rp.NO_JIT_ENV, "1")
    assert not rp.compiled(g)


def test_the_built_kernel_serves_every_size_without_numba(monkeypatch):
    """Once built ahead of time, the replay kernel runs on programs of any size (it costs no numba:
    a process replays a small capture with it without importing numba or LLVM), is not warmed up,
    and ``PROFKIT_NO_JIT`` still forces numpy."""
    import subprocess
    import sys

    pytest.importorskip("numba")
    if rp.build_kernel() is None:
        pytest.skip(f"the replay cannot be built ahead of time here ({rp.why_kernel_not_built()})")
    g, _ = random_graph(np.random.default_rng(0), ranks=2, instances=5, swap_p=0.0)
    assert rp.kernel_kind(g) == "built" and rp.releases_gil(g)
    assert not rp.warm_up()  # nothing to load in the background
    code = ("import sys, numpy as np; from profkit.analyze import impact_replay as rp; "
            "g = rp._empty_graph(); print(rp.kernel_kind(g), 'numba' in sys.modules, 'llvmlite' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["built", "False", "False"], out
    monkeypatch.setenv(rp.NO_JIT_ENV, "1")
    assert rp.kernel_kind(g) is None


def test_the_built_kernel_releases_the_gil():
    """The module built ahead of time drops the GIL while it replays (``native.Target.release_gil``),
    as ``releases_gil`` tells the impact, which then replays scenario blocks on threads. With a
    switch interval of an hour, this thread never hands the GIL over while it runs Python code, so
    the counting thread can tick during the call only if the kernel released it: no pass by chance.
    (A few tries: a busy machine may not schedule the counter within one call.)"""
    import sys
    import threading
    import time

    pytest.importorskip("numba")
    if rp.build_kernel() is None:
        pytest.skip(f"the replay cannot be built ahead of time here ({rp.why_kernel_not_built()})")
    g, n_edges = random_graph(np.random.default_rng(5), ranks=8, instances=2000, swap_p=0.0)
    assert rp.kernel_kind(g) == "built"
    kernel = rp._built()
    args = rp.kernel_args(g, np.ones((n_edges, 256), np.int64))
    ticks, stop = [0], threading.Event()

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0)  # hands the GIL back at once: the replaying thread never waits for it

    interval = sys.getswitchinterval()
    counter = threading.Thread(target=count)
    counter.start()
    seen = []
    try:
        while ticks[0] == 0:
            time.sleep(0.001)
        sys.setswitchinterval(3600)
        for _ in range(5):
            before = ticks[0]
            kernel(*args)
            seen.append(ticks[0] - before)
            if seen[-1] > 0:
                break
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        counter.join()
    assert seen[-1] > 0, seen
