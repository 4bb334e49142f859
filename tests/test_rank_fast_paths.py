"""The per-rank prepare and impact paths of issue #16's third round give what they replaced.

- ``impact_program._merged_order`` proposes the two lanes' evaluation order with array
  operations and keeps it only where a step-by-step check shows it is the merge loop's order
  (``_Builder._order_loop``, kept as the fallback). Compared with the loop on the programs of
  real H200 captures and on random programs, including ones where the loop must drop a cross
  edge (the proposal must then step aside).
- The coded string tests of ``collectives`` (``column_codes``, ``code_flags``, ``_is``,
  ``_equals``) and ``sources._source_counts`` on their edge cases: missing values, several
  sources. The candidates, span facts and source offsets themselves are covered by the analyze
  goldens (``test_analyze_golden.py``) on every sample capture.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.align import sources
from profkit.analyze import impact_program as prog
from profkit.collectives import candidates, syncpoints

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
HOST, GPU, CROSS, LANE = prog.HOST, prog.GPU, prog.CROSS, prog.LANE
_ORDER = prog._Builder._order  # as defined (the real-capture test wraps it)


# ---- the evaluation order ------------------------------------------------------------------
def _random_program(rng: np.random.Generator, nh: int, ng: int, n_cross: int, spread: int, p_any: float):
    """Two lanes of points (sorted times, many ties) and cross edges between them, in the
    ``_order`` inputs' layout: slot 0 the lane edge, slots 1-2 cross edges."""
    n = 1 + nh + ng
    time = np.zeros(n, np.int64)
    time[1:1 + nh] = np.sort(rng.integers(0, spread, nh))
    time[1 + nh:] = np.sort(rng.integers(0, spread, ng))
    host_idx = np.r_[0, np.arange(1, 1 + nh)]
    gpu_idx = np.r_[0, np.arange(1 + nh, n)]
    e_src = np.full((n, 3), prog.NO_SRC, np.int64)
    e_kind = np.full((n, 3), -1, np.int64)
    e_kind[1:, 0] = LANE
    e_src[1:, 0] = 0
    for _ in range(n_cross):
        dst = int(rng.integers(1, n))
        on_host = dst <= nh
        pool = gpu_idx[1:] if on_host else host_idx[1:]
        # mostly an earlier source (a launch before its kernel, a GPU-done before the resume);
        # with probability p_any any point of the other lane (cycles: the loop drops an edge)
        at = int(np.searchsorted(time[pool], time[dst] + rng.integers(-spread // 4, spread // 20), "right")) - 1
        if rng.random() < p_any:
            at = int(rng.integers(0, pool.size))
        if at < 0:
            continue
        src = int(pool[at])
        slot = 1 if e_kind[dst, 1] < 0 else 2
        e_src[dst, slot], e_kind[dst, slot] = src, CROSS
    alive = e_kind >= 0
    alive[0] = False
    return n, time, e_src, e_kind, alive, host_idx, gpu_idx


def _both(args):
    n, time, e_src, e_kind, alive, host_idx, gpu_idx = args
    b_loop, b_fast = prog._Builder(0, 0), prog._Builder(0, 0)
    alive_loop, alive_fast = alive.copy(), alive.copy()
    want = b_loop._order_loop(n, time, e_src, e_kind, alive_loop, host_idx, gpu_idx)
    merged = prog._merged_order(n, time, e_src, e_kind, alive.copy(), host_idx, gpu_idx)
    got = _ORDER(b_fast, n, time, e_src, e_kind, alive_fast, host_idx, gpu_idx)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(alive_fast, alive_loop)
    assert b_fast.notes == b_loop.notes
    if merged is not None:
        np.testing.assert_array_equal(merged, want)
        assert (alive_loop == alive).all()  # a proposal is only kept where the loop drops nothing
    return merged is not None, bool((alive_loop != alive).any())


def test_merged_order_is_the_loops_order_on_random_programs():
    rng = np.random.default_rng(16)
    taken = dropped = 0
    for case in range(400):
        nh, ng = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        p_any = (0.0, 0.02, 0.2)[case % 3]
        fast, drop = _both(_random_program(rng, nh, ng, int(rng.integers(0, nh + ng)), int(rng.integers(2, 200)), p_any))
        taken += fast
        dropped += drop
    assert taken > 150 and dropped > 50  # both paths are exercised (240 and 108 of 400 with this seed)


def test_merged_order_steps_aside_where_a_cross_edge_must_go():
    # host point 1 waits for GPU point 2, which waits for host point 1: the loop drops one edge
    n = 3
    time = np.array([0, 5, 5], np.int64)
    e_src = np.array([[-1, -1, -1], [0, 2, -1], [0, 1, -1]], np.int64)
    e_kind = np.array([[-1, -1, -1], [LANE, CROSS, -1], [LANE, CROSS, -1]], np.int64)
    alive = e_kind >= 0
    alive[0] = False
    args = (n, time, e_src, e_kind, alive, np.array([0, 1]), np.array([0, 2]))
    assert prog._merged_order(*args[:4], alive.copy(), *args[5:]) is None
    b = prog._Builder(0, 0)
    order = _ORDER(b, *args[:4], alive, *args[5:])
    assert order.tolist() == [0, 1, 2] and not alive[1, 1] and alive[2, 1]
    assert b.notes and "dropped" in b.notes[0]


@pytest.mark.parametrize("folder", ["engine-dep4-h200-capture/torch_faults", "vllm-0.26-h200/torch_faults"])
def test_merged_order_is_the_loops_order_on_real_captures(folder, monkeypatch, tmp_path):
    """Every rank program of a real capture: the proposal is taken and equals the loop's order."""
    from profkit.scale import analyze_paths

    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    seen = []

    def checked(self, n, time, e_src, e_kind, alive, host_idx, gpu_idx):
        seen.append(_both((n, time, e_src, e_kind, alive, host_idx, gpu_idx)))
        return _ORDER(self, n, time, e_src, e_kind, alive, host_idx, gpu_idx)

    monkeypatch.setattr(prog._Builder, "_order", checked)
    analyze_paths([SAMPLES / folder], executor="serial")
    assert seen and all(fast for fast, _ in seen)


# ---- coded string tests --------------------------------------------------------------------
def test_column_codes_and_flags_treat_missing_values_as_the_strings_did():
    events = pd.DataFrame({"name": pd.array(["nccl:all_reduce", None, "c10d::allreduce_", "x", "nccl:all_reduce"],
                                            dtype=pd.ArrowDtype(__import__("pyarrow").string()))})
    codes, uniques = syncpoints.column_codes(events, "name")
    assert codes.tolist() == [0, -1, 1, 2, 0] and list(uniques) == ["nccl:all_reduce", "c10d::allreduce_", "x"]
    as_rows = events["name"].astype("string").fillna("")
    for pattern in (candidates._NCCLISH_RE, syncpoints.COLL_OP_RE):
        want = as_rows.str.match(pattern).to_numpy(bool)
        got = syncpoints.code_flags(uniques, codes, lambda u, p=pattern: u.str.match(p), as_string=True)
        np.testing.assert_array_equal(got, want)
    # a missing value tested as "" (matches an empty-matching pattern) or never (missing=None)
    assert syncpoints.code_flags(uniques, codes, lambda u: u.str.match(r"^$"))[1]
    assert not syncpoints.code_flags(uniques, codes, lambda u: u.str.match(r"^$"), missing=None)[1]
    # the codes are made once per column while its data lives (``distinct.codes``), also for a
    # frame derived from it that shares the data; a filtered frame's column is factorized anew
    first = syncpoints.column_codes(events, "name")
    again = syncpoints.column_codes(events.assign(other=1), "name")
    assert again[0] is first[0] and again[1] is first[1]
    assert not first[0].flags.writeable and not first[1].flags.writeable  # shared: nobody may change them
    sub = syncpoints.column_codes(events.iloc[1:3], "name")
    assert sub[0] is not first[0] and sub[0].tolist() == [-1, 0] and list(sub[1]) == ["c10d::allreduce_"]


def test_equality_tests_of_objects():
    """``_equals``: ``v == text`` per object as Python compares it, a missing value (None, NaN, NA)
    never equal (the kernels' fields are missing by ``pd.isna``: pandas 3 makes some NaN)."""
    values = np.array(["nccl", None, np.nan, pd.NA, "comm", "all_reduce", None], dtype=object)
    np.testing.assert_array_equal(candidates._equals(values, "nccl"), [False if v is pd.NA else v == "nccl"
                                                                       for v in values])
    assert candidates._equals(np.array([], dtype=object), "nccl").size == 0


def test_source_counts_match_the_grouped_strings():
    events = pd.DataFrame({
        "rank": np.array([1, 0, 0, 1, 0, 1, 0], np.int64),
        "source": pd.array(["kineto", "profkit", "kineto", "nsys", "kineto", "kineto", "profkit"], dtype="string"),
        "kind": pd.array(["kernel", "cpu_span", "kernel", "kernel", "runtime", "cpu_op", "cpu_span"], dtype="string"),
    })

    def grouped(ev):
        from profkit import schema
        from profkit.distinct import str_objects
        return pd.DataFrame({"rank": ev["rank"].to_numpy(np.int64), "source": str_objects(ev["source"]),
                             "gpu": ev["kind"].isin(schema.GPU_KINDS).to_numpy(bool)}).groupby(
            ["rank", "source"]).agg(n=("gpu", "size"), gpu=("gpu", "sum"))

    got, want = sources._source_counts(events), grouped(events)
    pd.testing.assert_frame_equal(got, want, check_index_type=False)
    assert got.index.tolist() == [(0, "kineto"), (0, "profkit"), (1, "kineto"), (1, "nsys")]
    # ranks far apart (no dense array of every (rank, source) pair: the keys sorted instead), and
    # ranks that do not start at 0
    for ranks in ([1, 100_000, 100_000, 1, 100_000, 1, 100_000], [9, 8, 8, 9, 8, 9, 8]):
        spread = events.assign(rank=np.array(ranks, np.int64))
        pd.testing.assert_frame_equal(sources._source_counts(spread), grouped(spread), check_index_type=False)
    missing = events.assign(source=pd.array(["kineto", None, "kineto", "nsys", "kineto", "kineto", None],
                                            dtype="string"))
    pd.testing.assert_frame_equal(sources._source_counts(missing), grouped(missing))


# ---- the GPU rows' names from the attribution's codes (issue #16's eighth round) -------------
@pytest.mark.parametrize("folder", ["vllm-0.26-h200/torch_clean", "engine-dep2-h200-capture/torch_clean"])
def test_gpu_rows_from_the_arrays_codes_hold_the_same_rows_and_names(folder):
    """``gpu_rows(events, arrays)`` names the kernels by a categorical of ``EventArrays``' codes:
    the same rows, columns and name values as taking the name strings (real H200 captures, one
    rank's events as the rank task has them), and the same GPU pieces and replay GPU ops."""
    from profkit import load
    from profkit.analyze import overhead
    from profkit.analyze import straggler_phases as ph

    events = load(SAMPLES / folder).events
    rank = int(events["rank"].dropna().min())
    one = events[(events["rank"] == rank).to_numpy(bool)].reset_index(drop=True)
    arrays = overhead.event_arrays(one)
    coded, plain = ph.gpu_rows(one, arrays), ph.gpu_rows(one)
    assert len(plain) > 100 and isinstance(coded["name"].dtype, pd.CategoricalDtype)
    assert list(coded.columns) == list(plain.columns)
    np.testing.assert_array_equal(coded["name"].astype(object).to_numpy(), plain["name"].astype(object).to_numpy())
    pd.testing.assert_frame_equal(coded.drop(columns="name"), plain.drop(columns="name"))
    pd.testing.assert_frame_equal(prog.gpu_ops(one, coded), prog.gpu_ops(one, plain))
    pd.testing.assert_frame_equal(ph.gpu_pieces(ph._GpuArrays.build(coded)), ph.gpu_pieces(ph._GpuArrays.build(plain)))


# ---- the GPU ops' launch times by sorted keys (issue #16's tenth round) ---------------------
def _launch_times_by_loop(rt_pid, rt_corr, rt_start, pid, corr, has) -> list[int]:
    """The rule, one op at a time: the first runtime call of the op's (pid, correlation); else,
    for an op with a correlation, the first call of that correlation if a single pid holds it."""
    first: dict[tuple[int, int], int] = {}
    for p, c, t in zip(rt_pid.tolist(), rt_corr.tolist(), rt_start.tolist()):
        first[(p, c)] = min(t, first.get((p, c), t))
    pids_of: dict[int, set[int]] = {}
    for p, c in first:
        pids_of.setdefault(c, set()).add(p)
    out = []
    for p, c, h in zip(pid.tolist(), corr.tolist(), has.tolist()):
        if (p, c) in first:
            out.append(first[(p, c)])
        elif h and len(pids_of.get(c, ())) == 1:
            out.append(first[(next(iter(pids_of[c])), c)])
        else:
            out.append(prog.NO_LAUNCH)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_launch_times_follow_the_rule_op_by_op(seed):
    """``launch_times`` against the rule applied op by op: repeated calls of a correlation (the
    first wins), a correlation held by one pid or by several (a kernel's pid is its device's),
    ops without a correlation (-1, ``has`` False), and epoch-sized times (exact in int64)."""
    rng = np.random.default_rng(seed)
    n_rt, n_op = int(rng.integers(1, 60)), int(rng.integers(1, 60))
    base = 1_733_000_000_000_000_000 if seed % 2 else 0
    rt_pid = rng.choice([-1, 7, 8, 1_000_000], n_rt)
    rt_corr = rng.integers(-1, 25, n_rt)
    rt_start = base + rng.integers(0, 10**6, n_rt)
    pid = rng.choice([-1, 0, 7, 8, 1_000_000], n_op)
    has = rng.random(n_op) < 0.8
    corr = np.where(has, rng.integers(0, 30, n_op), -1)
    got = prog.launch_times(rt_pid, rt_corr, rt_start, pid, corr, has)
    assert got.tolist() == _launch_times_by_loop(rt_pid, rt_corr, rt_start, pid, corr, has)
    if seed == 0:  # correlations too far apart for one int64 key: the pair-by-pair path
        far = rt_corr * (1 << 56)
        got = prog.launch_times(rt_pid, far, rt_start, pid, corr * (1 << 56), has)
        assert got.tolist() == _launch_times_by_loop(rt_pid, far, rt_start, pid, corr * (1 << 56), has)


def test_gpu_ops_launch_times_are_the_runtime_calls_own_times(shared_traces):
    """On HTA's public trace with a negative queue length (7,747 GPU ops, 872 of them without a
    launch: a merge with missing rows went through float64), every launch time ``gpu_ops`` gives
    is exactly the start of a runtime call of the rank: epoch-sized nanoseconds, not rounded
    (the merge's float column was up to 128 ns off on 6,688 of them)."""
    from profkit import load, schema

    events = load(shared_traces / "hta" / "negative_queue_length_rank0.json.gz").events
    ops = prog.gpu_ops(events)
    launch = ops["launch_ns"].to_numpy(np.int64)
    known = launch[launch != prog.NO_LAUNCH]
    calls = events.loc[(events["kind"] == schema.RUNTIME).to_numpy(bool), "start_ns"].to_numpy(np.int64)
    assert known.size > 6000 and (launch == prog.NO_LAUNCH).sum() > 500 and known.min() > 10**18
    assert np.isin(known, calls).all()
