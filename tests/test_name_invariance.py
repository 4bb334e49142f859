"""The verdict does not depend on our span names (issue #18).

Every capture in ``sample_traces/`` and simulated DEP8 / DEP32 runs with injected faults are
analyzed twice: as they are, and with every span name that is not a library's mapped through a
seeded random bijection (``u00042``), at the event-table level (after loading, before analysis),
so every format is covered. Library names stay: CUDA runtime calls, kernels and copies, framework
ops (``aten::``, ``c10d::``, every ``cpu_op``), NCCL / RCCL / Gloo / ``record_param_comms`` spans
and NCCL's NVTX domain, CUB / Thrust ranges, ``ProfilerStep#N``, and vLLM's and SGLang's own step
annotations (their format carries the batch). Our names go: ``EngineCore.step``,
``Scheduler.schedule``, ``sync_dp_padding``, the engine's ``gc`` span, profkit's ``gc.gen2``, the
simulator's ``dp_allreduce``, every NVTX / record_function range. The step marker of the renamed
run is given as ``--step-pattern`` would give it (the mapped names of the original run's step spans).

Compared, after mapping the names back (``wait:<name>`` and the like too, then normalized as
``cause_name`` does): the same straggler ranks with the same top causes, the same episodes, and
every cause's share of step time within 1 point. On each capture the consistency line is silent.

What holds it: sync points come from collective ops, Gloo worker spans, blocking OS calls and
aligned ends, not from names; names only add evidence (``profkit.collectives.syncpoints``).
"""
from __future__ import annotations

import json

import re

import numpy as np
import pandas as pd
import pytest

import profkit
from conftest import SAMPLE_TRACES
from profkit.analyze.overhead_names import cause_name
from profkit.analyze.vocabulary import WAIT_PREFIX
from profkit.analyze.pipeline import analyze
from profkit.ingest.loader import Capture
from profkit.simulate import simulate
from profkit.simulate.config import Inject

LIBRARY = re.compile(
    r"^(?:ProfilerStep#|nccl|rccl|gloo:|c10d::|record_param_comms|cub::|thrust::|execute_context_\d|step\[|"
    r"PyTorch Profiler|## Call CompiledFxGraph|Torch-Compiled|cuda|Memcpy|Memset)", re.I)
LIBRARY_CATEGORIES = ("NCCL", "CCCL")
RENAMED_KINDS = ("cpu_span", "gpu_span", "gc")
# profkit's own span categories (its hooks' labels: dp_sync, step, scheduler, ...) are renamed too;
# the sources' own categories (Kineto's user_annotation, NVTX domains NCCL / CCCL / nvtx) stay
RENAMED_CATEGORY_SOURCES = ("profkit",)
SHARE_TOL = 0.01  # causes' shares of step time agree within 1 point

CAPTURES = sorted(p for p in SAMPLE_TRACES.glob("*/*") if p.is_dir()) + [SAMPLE_TRACES / "public-hta-2rank"]


def rename(events: pd.DataFrame, seed: int) -> tuple[pd.DataFrame, dict[str, str]]:
    """Events with every non-library span name mapped through a random bijection; and the map
    back (token -> original name)."""
    kind = events["kind"].astype(str)
    names = events["name"].astype(str)
    cat = events["category"].astype("string").fillna("")
    ours = kind.isin(RENAMED_KINDS) & ~names.str.contains(LIBRARY) & ~cat.isin(LIBRARY_CATEGORIES)
    uniques = sorted(names[ours].unique())
    rng = np.random.default_rng(seed)
    tokens = [f"u{i:05d}" for i in rng.permutation(len(uniques))]
    forward = dict(zip(uniques, tokens))
    out = events.copy()
    out["name"] = pd.array(np.where(ours.to_numpy(bool), names.map(forward).fillna(names).to_numpy(dtype=object),
                                    names.to_numpy(dtype=object)), dtype=events["name"].dtype)
    mine = events["source"].astype(str).isin(RENAMED_CATEGORY_SOURCES).to_numpy(bool) & (cat != "").to_numpy(bool)
    cats = sorted(cat[mine].unique())
    cat_map = {c: f"c{int(i):03d}" for c, i in zip(cats, rng.permutation(len(cats)))}
    if mine.any():
        out.loc[mine, "category"] = cat[mine].map(cat_map).to_numpy(dtype=object)
    return out, {v: k for k, v in forward.items()}


def back(label: object, inverse: dict[str, str]) -> object:
    """A cause (or phase) label of the renamed run in the original run's terms."""
    if not isinstance(label, str):
        return label
    for prefix in (WAIT_PREFIX, "transfer:"):
        if label.startswith(prefix):
            return prefix + cause_name(inverse.get(label[len(prefix):], label[len(prefix):]))
    m = re.match(r"^host_sync \((.*)\)$", label)
    if m:
        return f"host_sync ({cause_name(inverse.get(m.group(1), m.group(1)))})"
    return cause_name(inverse[label]) if label in inverse else label


def analyze_both(cap: Capture, seed: int = 7):
    base = analyze(cap)
    renamed_events, inverse = rename(cap.events, seed)
    steps = base.steps
    pattern = None
    if len(steps) and str(steps["marker"].iloc[0]) not in ("profiler_step", "vllm", "sglang"):
        forward = {v: k for k, v in inverse.items()}
        marks = sorted({forward.get(n, n) for n in steps["name"].astype(str)})
        pattern = "^(?:" + "|".join(re.escape(m) for m in marks) + ")$"
    other = analyze(Capture(events=renamed_events, parts=cap.parts, meta=cap.meta, skipped=[], warnings=[]),
                    step_pattern=pattern)
    return base, other, inverse


def shares(causes: pd.DataFrame, inverse: dict[str, str] | None = None) -> pd.Series:
    c = causes.assign(cause=causes["cause"].map(lambda x: back(x, inverse) if inverse else x))
    return c.groupby("cause")["step_share"].sum()


def check(base, other, inverse) -> None:
    assert len(other.steps) == len(base.steps)
    assert other.straggler_ranks == base.straggler_ranks
    if base.straggler_ranks:
        b = base.stragglers.set_index("rank")
        o = other.stragglers.set_index("rank")
        for r in base.straggler_ranks:
            assert back(o.loc[r, "top_cause"], inverse) == b.loc[r, "top_cause"], r
    eb, eo = base.straggler_episodes, other.straggler_episodes
    assert list(zip(eb["rank"], eb["step"], eb["cause"])) == [
        (r, s, back(c, inverse)) for r, s, c in zip(eo["rank"], eo["step"], eo["cause"])]
    sb, so = shares(base.causes), shares(other.causes, inverse)
    both = sb.index.union(so.index)
    diff = (sb.reindex(both, fill_value=0) - so.reindex(both, fill_value=0)).abs().sort_values(ascending=False)
    print(pd.DataFrame({"base": sb.reindex(both), "renamed": so.reindex(both), "diff": diff}).sort_values(
        "diff", ascending=False).head(8).to_string())
    assert diff.max() <= SHARE_TOL, diff.head(5)
    assert base.consistency == [] and other.consistency == []


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sample_captures_are_name_invariant(path):
    base, other, inverse = analyze_both(profkit.load(path))
    check(base, other, inverse)


def test_span_files_alone_find_the_dp_sync_by_aligned_ends():
    """A capture's span files without torch or nsys (what ``profkit capture`` with no backend
    leaves): no collective op, no OS call, only spans. The Gloo DP all-reduce's span is still a
    sync point, by its ends lining up across ranks while the starts spread (the GC on rank 1);
    renamed, by that alone."""
    files = sorted((SAMPLE_TRACES / "engine-dep4-h200-capture" / "torch_faults").glob("spans-pid*.jsonl"))
    assert len(files) == 4
    base, other, inverse = analyze_both(profkit.load(*files))
    sp = other.sync_points
    dp = sp[sp["span_name"].map(lambda n: inverse.get(n, n)) == "GPUModelRunner.sync_dp_padding"]
    assert len(dp) and (dp["evidence"] == "aligned_ends").all()
    # the injected GCs (rank 1, steps 12, 16, 20: engine/truth.json) are rank 1's episodes, named gc.
    # (Not asserted: rank 1 in the whole-run verdict. Its 324 ms of GC sit at the 5% excess
    # threshold of this 24-step run (330 ms), beside rank 3's 290 ms profiler start at step 10.)
    ep = base.straggler_episodes
    mine = ep[(ep["rank"] == 1) & (ep["cause"] == "gc")]
    assert sorted(mine["step"].astype(int)) == [12, 16, 20], ep
    truth = json.loads((files[0].parent / "engine" / "truth.json").read_text())
    measured = dict(zip([12, 16, 20], truth["causes"][0]["measured_ms"]))
    for row in mine.itertuples():
        assert abs(row.cause_excess_ns / 1e6 / measured[int(row.step)] - 1) < 0.10, (row.step, row.cause_excess_ns)
    check(base, other, inverse)


SIMS = {  # (ranks, steps, seed, injected); 3 MoE layers a step keeps the DEP32 run small
    "dep8": (8, 14, 3, [Inject("gc", rank=3, every=4, ms=30, start=1), Inject("slow_schedule", rank=5, every=3, ms=6,
                                                                            start=2)]),
    "dep32": (32, 8, 5, [Inject("gc", rank=17, every=3, ms=30, start=1), Inject("host_sync", rank=4, every=2, ms=4,
                                                                              start=1)]),
}


@pytest.mark.parametrize("name", sorted(SIMS))
def test_simulated_faults_are_name_invariant(name, tmp_path):
    ranks, steps, seed, injects = SIMS[name]
    simulate(ranks, steps, seed=seed, out_dir=tmp_path, injects=injects, layers=3)
    base, other, inverse = analyze_both(profkit.load(tmp_path), seed=seed)
    injected = {j.rank for j in injects}
    assert set(base.straggler_episodes["rank"]) | set(base.straggler_ranks) <= injected
    check(base, other, inverse)
