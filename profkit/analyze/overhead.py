"""Overhead attribution: why a step is slower than its GPU work, cause by cause.

Inside every step (the step table: rank, step, start_ns, end_ns) each interval where the rank's
GPU is idle is charged to what held the critical path on the host at that moment, then causes
are ranked by total time across ranks and steps (``rank_causes`` -> ``OUT/causes.csv``).

Idle for attribution (``gpu_state``): ``idle``, nothing runs; ``comm_only``, only communication
kernels run (the GPU waits in a collective for other ranks); ``launch_run``, a launch-bound run
of tiny kernels (the GPU is starved by the launch rate: the run's whole wall time is charged,
its tiny kernels included, which is what the launches cost). Each interval is cut at every
host-span boundary and each piece goes to the first rule that matches:

1. ``wait:<collective>``: only communication kernels run;
2. ``wait:<name>``: the host is blocked in a collective (``collectives.syncpoints``: from its arrival to its
   release at a host-blocking collective such as a Gloo all-reduce, whatever span it sits in;
   a sync span's name is never a cause of time spent waiting in it); then ``gc``: a GC pause in a
   launching process (it holds the GIL);
3. ``host_sync (<span>)``: a synchronize call, blocking copy or event busy-polling loop on a
   launching thread, named with the innermost span it sits in;
4. ``launch_bound``: inside a launch-bound run;
5. the innermost named span (cpu_span: profkit, vLLM, NVTX, record_function) of the launching
   threads, named as-is.
   Step-level spans (step markers) are skipped here, so that deeper host activity names the
   time inside them: 6. the outermost framework op (cpu_op), 7. the innermost Python frame
   (builtins skipped), 8. the innermost py-spy sample frame;
9. rules 5-8 on the rank's other threads (vLLM runs scheduler and model runner in two
   processes: while the runner idles, the engine core holds the critical path);
10. the step-level span's self time (e.g. an unannotated sleep in ``EngineCore.step``);
    after a step annotation that covers only part of the iteration (vLLM's worker annotation,
    ``steps.ANNOTATION_MARKERS``) ended: ``host work between steps``;
11. ``unattributed (no host activity)``, or ``gpu idle (no host events)`` on a rank without any
    host events: then only GPU-side facts are claimed.

"Launching threads" issue the rank's kernel launches and copies (runtime events' pid/tid; a
thread with under 1% of them, e.g. NCCL's watchdog, is not one); without runtime events every
thread of the rank is one. ``refine_waits`` renames collective waits after the last arriver
(``waiting for rank k``; ``transfer:<collective>`` on the last arriver itself) using
``profkit.analyze.collectives`` (``causes_table`` does it).
Pure functions over event tables (int64 ns); no file access.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from profkit import distinct, schema
from profkit.analyze import gpu
from profkit.analyze import overhead_rank as per_rank
from profkit.distinct import group_keys, strings_at
from profkit.keys import sorted_groups
from profkit.layers import innermost, make_layer
from profkit.analyze.vocabulary import (  # noqa: F401 - the categories and GPU states: read as ov.WAIT etc. too
    BETWEEN_STEPS, CPU_OP, GC, GPU_STATES, HOST_SYNC, LAUNCH_BOUND, NO_HOST, PYTHON, SAMPLE, SELF, SPAN, UNATTRIBUTED,
    WAIT, transfer_cause, waiting_for_rank,
)

CAUSE_COLUMNS = [
    "cause",
    "total_ns",
    "per_step_ns",
    "step_share",
    "ranks",
    "example_rank",
    "example_step",
    "example_start_ns",
]
CAUSE_EXTRA_COLUMNS = ["category", "n_intervals", "share_of_charged", "example_dur_ns", "ranks_list"]
CHARGED_COLUMNS = ["rank", "step", "start_ns", "end_ns", "dur_ns", "cause", "category", "gpu_state", "where"]
CHARGED_TEXT = ("cause", "category", "gpu_state", "where")
# what ``refine_waits``, ``cause_summary`` and ``compare.cause_step_table`` read of the charged rows
SUMMARIZED_COLUMNS = ["rank", "step", "start_ns", "end_ns", "dur_ns", "cause", "category"]

NO_STEP = -1  # step number of a whole-capture window (no step markers found)


# ---- public API ---------------------------------------------------------------------------
def causes_table(events: pd.DataFrame, steps: pd.DataFrame, arrivals: pd.DataFrame | None = None) -> pd.DataFrame:
    """``OUT/causes.csv``: charge every idle interval, refine waits by the last arriver, rank the
    causes. Without step markers each rank's GPU window is one step (``step = -1``).

    ``arrivals`` (see ``refine_waits``) saves matching collectives again when the caller already
    has them (``arrivals_from_match(instances, matched)``); by default they are matched here.
    """
    charged, windows = charge(events, steps, arrivals)
    return rank_causes(charged, windows)


def charge(
    events: pd.DataFrame, steps: pd.DataFrame, arrivals: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The charged intervals (waits refined by the last arriver) and the windows analyzed.

    Kept by the pipeline: ``causes.csv`` ranks them, ``cause_steps.csv`` sums them per step.
    """
    windows = analysis_windows(events, steps)
    charged = attribute_gaps(events, windows)
    if arrivals is None:
        arrivals = last_arrivers(events)
    if arrivals is not None:
        charged = refine_waits(charged, arrivals)
    return charged, windows


def analysis_windows(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The (rank, step, start_ns, end_ns, step_ns[, name]) windows analyzed: the step table, or
    when it is empty one window per rank from its first to its last GPU event."""
    if steps is not None and len(steps):
        # built from the columns' arrays: a column selection, copy and astype of a hundred-row
        # table cost ~4 ms, three times per rank (the causes, the timeline pieces)
        index = pd.RangeIndex(len(steps))
        cols: dict = {c: steps[c].to_numpy(np.int64) for c in ("rank", "step", "start_ns", "end_ns")}
        for c in ("name", "marker_end_ns"):
            if c in steps:
                cols[c] = steps[c].set_axis(index)  # its dtype kept (an object name column stays object)
        cols["step_ns"] = cols["end_ns"] - cols["start_ns"]
        return pd.DataFrame(cols, index=index)
    g = gpu.gpu_events(events)
    if len(g):
        agg = g.groupby("rank", observed=True).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
        out = agg.reset_index().astype({"rank": "int64", "start_ns": "int64", "end_ns": "int64"})
    else:
        out = pd.DataFrame({c: pd.Series(dtype="int64") for c in ("rank", "start_ns", "end_ns")})
    out.insert(1, "step", NO_STEP)
    out["step"] = out["step"].astype("int64")
    out["step_ns"] = out["end_ns"] - out["start_ns"]
    return out.reset_index(drop=True)


def _rank_groups(frame: pd.DataFrame) -> list[tuple[int, pd.DataFrame]]:
    """``frame.groupby("rank", sort=True)``'s groups; the frame itself where it is one rank's (the
    rank task's windows and waits: a groupby would copy it)."""
    rank = frame["rank"].to_numpy(np.int64)
    if rank.size and (rank == rank[0]).all():
        return [(int(rank[0]), frame)]
    return [(int(r), g) for r, g in frame.groupby("rank", sort=True)]


def _increasing(values: np.ndarray) -> bool:
    """Strictly increasing: any sort of these rows keeps their order."""
    return bool((values[1:] > values[:-1]).all())


def event_arrays(events: pd.DataFrame) -> per_rank.EventArrays:
    """``events`` as the attribution's arrays, for ``attribute_gaps(..., arrays=)``: built once
    when one table is attributed over several window sets (the causes and the timeline pieces)."""
    return per_rank.EventArrays.build(events, frozenset(), per_rank.Vocab())


def attribute_gaps(events: pd.DataFrame, steps: pd.DataFrame, sync_waits: pd.DataFrame | None = None,
                   arrays: per_rank.EventArrays | None = None, with_gpu: bool = True, coded: bool = False) -> pd.DataFrame:
    """One row per charged interval: ``CHARGED_COLUMNS`` (see the module docstring).

    ``where`` is the innermost named span at that moment (context for waits, syncs, ops).
    Adjacent pieces with the same cause in one step are merged into one row.
    ``sync_waits``: ``sync_table.wait_intervals`` of the ranks (when the host was blocked in a
    collective); found in ``events`` when None (all ranks given on one clock). ``arrays``:
    ``event_arrays(events)``, when already built. ``with_gpu`` False: as if ``events`` held no
    GPU rows (every instant of the windows is charged to the host). ``coded``: the text columns
    (``CHARGED_TEXT``) as ``distinct.coded`` Categoricals, for the store.
    """
    got = attribute_coded(events, steps, sync_waits, arrays, with_gpu)
    if got is None:
        return _empty_charged()
    parts, vocab = got
    causes = vocab.array()
    cat = lambda f: np.concatenate([getattr(p, f) for _, p in parts])  # noqa: E731
    where = cat("where")
    text = distinct.coded if coded else strings_at
    out = pd.DataFrame(
        {
            "rank": np.concatenate([np.full(p.start.size, r, np.int64) for r, p in parts]),
            "step": cat("step"),
            "start_ns": cat("start"),
            "end_ns": cat("end"),
            "dur_ns": cat("end") - cat("start"),
            "cause": text(causes, cat("cause")),
            "category": text(per_rank.CATEGORIES, cat("category")),
            "gpu_state": text(per_rank.STATES, cat("state")),
            "where": text(causes, where),
        }
    )
    return out[CHARGED_COLUMNS]


def attribute_coded(events: pd.DataFrame, steps: pd.DataFrame, sync_waits: pd.DataFrame | None = None,
                    arrays: per_rank.EventArrays | None = None, with_gpu: bool = True
                    ) -> tuple[list[tuple[int, per_rank.RankCharges]], per_rank.Vocab] | None:
    """``attribute_gaps`` before its table is made: per rank (in rank order) its charged
    intervals with causes as ids of the returned vocabulary and categories as indexes of
    ``overhead_rank.CATEGORIES``; None where nothing is charged. For callers that go on
    computing with the causes (the timeline pieces): no strings made and factorized again."""
    if not with_gpu and (steps is None or not len(steps)):
        return None  # the windows would be those of the GPU events: none
    windows = analysis_windows(events, steps)
    if sync_waits is None:
        sync_waits = sync_wait_intervals(events if with_gpu else events[~gpu.kind_mask(events, schema.GPU_KINDS)])
    step_names = frozenset(str(n) for n in windows["name"].dropna().unique()) if "name" in windows else frozenset()
    if arrays is None:
        arrays = per_rank.EventArrays.build(events, step_names, per_rank.Vocab())
    arrays = arrays.with_step_names(step_names)
    vocab = arrays.vocab
    waits_by_rank = dict(_rank_groups(sync_waits)) if len(sync_waits) else {}
    parts = []
    for rank, w in _rank_groups(windows):
        if not _increasing(w["start_ns"].to_numpy(np.int64)):  # in order already: no sort (no ties to order)
            w = w.sort_values("start_ns")
        ws = w["start_ns"].to_numpy(np.int64)
        we = w["end_ns"].to_numpy(np.int64).copy()
        we[:-1] = np.minimum(we[:-1], ws[1:])  # overlapping windows: each instant charged once
        sw = waits_by_rank.get(int(rank))
        layer = None if sw is None else make_layer(sw["start_ns"].to_numpy(np.int64), sw["end_ns"].to_numpy(np.int64),
                                                   vocab.ids(sw["cause"].to_numpy(dtype=object)))
        me = w["marker_end_ns"].to_numpy(np.int64) if "marker_end_ns" in w else None
        got = per_rank.attribute_rank(arrays, int(rank), ws, np.maximum(we, ws), w["step"].to_numpy(np.int64), vocab,
                                    layer, me, gpu=with_gpu)
        if got is not None:
            parts.append((int(rank), got))
    if not parts:
        return None
    return parts, vocab


def sync_wait_intervals(events: pd.DataFrame) -> pd.DataFrame:
    """``sync_table.wait_intervals`` of every host-blocking collective in ``events`` (the
    cross-rank evidence taken over the ranks given)."""
    from profkit.analyze import sync_table
    from profkit.analyze.collectives import find_sync_names
    from profkit.collectives.candidates import collective_candidates

    if events is None or not len(events):
        return sync_table.wait_intervals(None)
    return sync_table.wait_intervals(collective_candidates(events, find_sync_names(events)))


def rank_causes(charged: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Causes ranked by total charged time across ranks and steps.

    ``per_step_ns`` = total / number of (rank, step) pairs analyzed (rounded to int64 ns): what
    one rank loses to the cause in an average step. ``step_share`` = total / summed step time of those pairs.
    ``ranks`` = ranks where the cause was charged; the example is the largest single charged
    interval (rank, step, start_ns) to open in Perfetto. Extra columns: ``CAUSE_EXTRA_COLUMNS``.
    """
    return rank_causes_from_summaries([cause_summary(charged)], steps)


def cause_summary(charged: pd.DataFrame) -> dict[str, pd.DataFrame | int]:
    """What ``rank_causes`` needs from some charged rows (one rank's, on the scale path): per
    cause its total, count and largest interval, category and rank counts. Small; merged by
    ``rank_causes_from_summaries`` into the same table as over all rows at once."""
    if charged is None or not len(charged):
        return {"n": 0}
    # groupby("cause", sort=False) and the drop_duplicates below over integer codes: hashing the
    # names of ~20k rows several times cost a rank ~15 ms
    cause_c, causes = distinct.factorize(charged["cause"])  # in order of appearance, as groupby(sort=False)
    dur = charged["dur_ns"].to_numpy(np.int64)
    rank = charged["rank"].to_numpy(np.int64)
    has = np.flatnonzero(cause_c >= 0)  # a row without a cause is in no group
    order, starts = sorted_groups((cause_c[has],), within=(-dur[has],))  # per cause its longest interval first
    top = has[order[starts]]  # the first row of the largest interval, as idxmax
    per = pd.DataFrame({
        "cause": np.asarray(causes, dtype=object)[cause_c[top]],
        "total_ns": np.add.reduceat(dur[has][order], starts).astype(np.int64) if starts.size else np.empty(0, np.int64),
        "n_intervals": np.diff(np.r_[starts, has.size]).astype(np.int64),
        "example_rank": rank[top], "example_step": charged["step"].to_numpy(np.int64)[top],
        "example_start_ns": charged["start_ns"].to_numpy(np.int64)[top], "example_dur_ns": dur[top],
    })
    cat_c, categories = distinct.factorize(charged["category"])
    both = np.flatnonzero((cause_c >= 0) & (cat_c >= 0))
    first, n = _first_of_each((cause_c[both], cat_c[both]))
    cats = pd.DataFrame({"cause": group_keys(causes, cause_c[both][first]),
                         "category": group_keys(categories, cat_c[both][first]), "n": n})
    first, _ = _first_of_each((cause_c, rank))  # drop_duplicates: a missing cause is a value (-1)
    at = charged.index[first]
    ranks = pd.DataFrame({c: pd.Series(charged[c].array.take(first), index=at, dtype=charged[c].dtype) for c in ("cause", "rank")})
    step_c = pd.factorize(charged["step"].to_numpy(np.int64))[0]
    return {"n": len(charged), "per": per, "categories": cats, "ranks": ranks,
            "dur_ns": int(dur.sum()), "pairs": int(_first_of_each((rank, step_c))[0].size)}


def _first_of_each(cols: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct tuple of the integer columns, its first row and its number of rows, in order
    of first appearance (``drop_duplicates``, ``groupby(sort=False).size()``)."""
    order, starts = sorted_groups(cols)
    firsts = order[starts]  # the sort is stable: each group's first row in row order
    n = np.diff(np.r_[starts, order.size]).astype(np.int64)
    keep = np.argsort(firsts, kind="stable")
    return firsts[keep], n[keep]


def rank_causes_from_summaries(summaries: list[dict], steps: pd.DataFrame) -> pd.DataFrame:
    """``rank_causes`` from ``cause_summary`` s of disjoint row sets, given in row order."""
    cols = CAUSE_COLUMNS + CAUSE_EXTRA_COLUMNS
    summaries = [s for s in summaries if s.get("n")]
    if not summaries:
        return pd.DataFrame({c: pd.Series(dtype="object" if c in ("cause", "category", "ranks_list") else "int64")
                             for c in cols})
    if steps is not None and len(steps):
        n_pairs = len(steps)
        step_total = int((steps["end_ns"].astype("int64") - steps["start_ns"].astype("int64")).sum())
    else:
        n_pairs = sum(s["pairs"] for s in summaries)
        step_total = 0
    per = pd.concat([s["per"].assign(_part=i) for i, s in enumerate(summaries)], ignore_index=True)
    g = per.groupby("cause", sort=False)
    # the largest interval; on a tie the first in row order (the first part, then its first row)
    best = per.sort_values(["example_dur_ns", "_part"], ascending=[False, True], kind="stable")
    top = best.groupby("cause", sort=False).head(1).set_index("cause")
    out = pd.DataFrame({"total_ns": g["total_ns"].sum().astype("int64"),
                        "n_intervals": g["n_intervals"].sum().astype("int64")})
    ranks = pd.concat([s["ranks"] for s in summaries], ignore_index=True).drop_duplicates()
    rg = ranks.groupby("cause", sort=False)["rank"]
    out["ranks"] = rg.nunique().reindex(out.index).astype("int64")
    out["ranks_list"] = rg.agg(lambda r: " ".join(str(x) for x in sorted(r.unique()))).reindex(out.index)
    cats = pd.concat([s["categories"] for s in summaries], ignore_index=True)
    cats = cats.groupby(["cause", "category"], sort=False)["n"].sum().reset_index()
    # the most frequent category (the smallest name on a tie, as Series.mode orders them)
    cats = cats.sort_values(["cause", "n", "category"], ascending=[True, False, True], kind="stable")
    out["category"] = cats.groupby("cause", sort=False)["category"].first().reindex(out.index)
    for c in ("example_rank", "example_step", "example_start_ns", "example_dur_ns"):
        out[c] = top[c].reindex(out.index).astype("int64")
    out["per_step_ns"] = (out["total_ns"] / max(n_pairs, 1)).round().astype("int64")
    out["step_share"] = out["total_ns"] / step_total if step_total > 0 else np.nan
    out["share_of_charged"] = out["total_ns"] / max(sum(s["dur_ns"] for s in summaries), 1)
    out.index.name = "cause"
    out = out.reset_index().sort_values(["total_ns", "cause"], ascending=[False, True], kind="stable")
    return out[cols].reset_index(drop=True)


def refine_waits(charged: pd.DataFrame, arrivals: pd.DataFrame) -> pd.DataFrame:
    """Rename collective waits after who arrived last: ``waiting for rank k``.

    ``arrivals``: one row per (rank, collective instance) with ``rank, start_ns, end_ns,
    last_rank`` (the instance's interval on that rank, on that rank's own clock, and the rank
    that arrived last). A ``wait`` row whose midpoint lies in an instance of its rank (the one
    begun last, if several hold it) is renamed; on the last arriver itself it becomes
    ``transfer:<collective>`` (no one to wait for: the collective's own time). Rows outside
    every instance keep ``wait:<collective>``. Only the rank's own clock is used.
    """
    if not len(charged) or arrivals is None or not len(arrivals):
        return charged
    out = charged.copy()
    codes, names = distinct.factorize(out["cause"])
    if (codes < 0).any():
        return _refine_waits_rows(out, arrivals)
    # causes as codes: each new name is made once per distinct last arriver / cause, not per row
    codes = np.asarray(codes, np.int64).copy()
    names = [str(n) for n in names]
    ids = {n: i for i, n in enumerate(names)}

    def code_of(name: str) -> int:
        if name not in ids:
            ids[name] = len(names)
            names.append(name)
        return ids[name]

    for rows, last, own in _waits_by_last_arriver(out, arrivals):
        ks, inv = np.unique(last, return_inverse=True)
        codes[rows] = np.array([code_of(waiting_for_rank(k)) for k in ks], np.int64)[inv.reshape(-1)]
        cs, inv = np.unique(codes[own], return_inverse=True)
        codes[own] = np.array([code_of(str(transfer_cause(names[c]))) for c in cs], np.int64)[inv.reshape(-1)]
    out["cause"] = distinct.strings_from_codes(np.array(names, dtype=object), codes)  # its codes known to the summaries
    return out


def _refine_waits_rows(out: pd.DataFrame, arrivals: pd.DataFrame) -> pd.DataFrame:
    """``refine_waits`` row by row (charged rows without a cause: never made by ``attribute_gaps``)."""
    cause = out["cause"].to_numpy(dtype=object).copy()
    for rows, last, own in _waits_by_last_arriver(out, arrivals):
        cause[rows] = [waiting_for_rank(k) for k in last]
        cause[own] = [transfer_cause(c) for c in cause[own]]
    out["cause"] = cause
    return out


def _waits_by_last_arriver(out: pd.DataFrame, arrivals: pd.DataFrame):
    """Per rank: (its wait rows inside an instance where another rank arrived last, those ranks,
    its wait rows where it arrived last itself); a wait row is matched by its midpoint to the
    innermost instance of its rank holding it (``refine_waits``)."""
    is_wait = (out["category"] == WAIT).to_numpy(bool)
    mid = (out["start_ns"].to_numpy(np.int64) + out["end_ns"].to_numpy(np.int64)) // 2
    ranks = out["rank"].to_numpy(np.int64)
    for rank, a in arrivals.groupby("rank"):
        rows = np.flatnonzero(is_wait & (ranks == int(rank)))
        if not rows.size:
            continue
        layer = make_layer(a["start_ns"].to_numpy(np.int64), a["end_ns"].to_numpy(np.int64),
                           a["last_rank"].to_numpy(np.int64))
        j = innermost(layer, mid[rows])
        hit = j >= 0
        last = layer.codes[j[hit]]
        rows = rows[hit]
        other = last != int(rank)
        yield rows[other], last[other], rows[~other]


def last_arrivers(events: pd.DataFrame) -> pd.DataFrame | None:
    """``rank, start_ns, end_ns, last_rank`` per (rank, collective instance) from
    ``profkit.analyze.collectives``; None when the matching fails."""
    from profkit.analyze import collectives  # imports this module's neighbours: here, not at the top
    from profkit.collectives.instances import match_instances

    try:
        inst = collectives.collective_instances(events)
        matched = match_instances(inst) if len(inst) else None
    except Exception as exc:  # noqa: BLE001 - a failed match must not cost the causes table
        warnings.warn(f"collective matching failed, waits stay 'wait:<collective>': {exc!r}", stacklevel=2)
        return None
    return arrivals_from_match(inst, matched)


def arrivals_from_match(inst: pd.DataFrame, matched: pd.DataFrame) -> pd.DataFrame | None:
    """``refine_waits``' arrivals from ``collectives.collective_instances`` / ``match_instances``."""
    if matched is None:
        return None
    last_col = next((c for c in ("last_rank", "last_arriver", "last") if c in matched), None)
    if last_col is None or not len(inst):
        return None
    keys = ["instance"] if "instance" in inst and "instance" in matched else [
        c for c in ("group", "seq", "coll_name") if c in inst and c in matched]
    if not keys:
        return None
    per = matched[keys + [last_col]].drop_duplicates(keys)
    cols = ["rank", "start_ns", "end_ns"] + [c for c in ("arrive_ns", "exit_ns") if c in inst]
    out = inst[cols + keys].merge(per, on=keys, how="inner")
    out = out.rename(columns={last_col: "last_rank"}).dropna(subset=["last_rank"])
    if "arrive_ns" in out:  # the rank is in the collective from its arrival to its release
        out["start_ns"] = out["arrive_ns"].astype("Int64").fillna(out["start_ns"].astype("Int64"))
    if "exit_ns" in out:
        out["end_ns"] = np.maximum(out["end_ns"].astype("int64"),
                                   out["exit_ns"].astype("Int64").fillna(out["end_ns"].astype("Int64")).astype("int64"))
    return out[["rank", "start_ns", "end_ns", "last_rank"]].astype("int64")


def _empty_charged() -> pd.DataFrame:
    out = pd.DataFrame({c: pd.Series(dtype="int64") for c in CHARGED_COLUMNS})
    for c in ("cause", "category", "gpu_state", "where"):
        out[c] = out[c].astype(object)
    return out
