"""Serving steps: find them, then measure each step's wall time against its GPU-busy time.

A step is one engine iteration. Markers, most specific first: a user regex; profkit's /
vLLM's step-loop span (``EngineCore.step``); vLLM's worker annotation
``execute_context_{n}({tok})_generation_{n}({tok})``; SGLang ``step[DECODE bs=32]``;
``ProfilerStep#N``. The first marker found on any rank is used for every rank, so steps are
comparable across ranks.

Markers that cover whole iterations (the step loop's span, ``ProfilerStep#N``, a user regex)
are the step. Annotations that cover only the model runner's part (``ANNOTATION_MARKERS``: vLLM's
worker annotation wraps ``execute_model`` only; SGLang's ``step[...]`` the forward batch) do not
tile the iteration: the scheduler, output processing and any GC between two annotations are
serving step time too. There a step runs from its annotation's start to the next annotation's
start on the same rank (the iteration period); the last one, with no next start, ends at its
annotation's end (kept, so a single-step trace still has its step, but it lacks the host work
after it: ``whole_period`` is False). ``marker_end_ns`` is the annotation's own end: GPU-idle
time after it is charged to the host work that ran there, else to ``host work between steps``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit import distinct, schema
from profkit.analyze import gpu
from profkit import intervals as iv
from profkit.analyze.window import recorded_window


# vLLM's step annotation (``Worker.annotate_profile``): ``execute_context_{n}({tok})_generation_{n}({tok})``,
# or with ``profiler_config.detailed_trace_annotation``
# ``execute_{tokens}_context_{n}(sq{tok}sk..sqsq..sqsk..)_generation_{n}(sq{tok}sk..sqsq..sqsk..)``
# (either form: token counts and cause names). As step markers the detailed form comes after SGLang's:
# SGLang traces carry it too (tracelens/sglang_qwen3-8b_decode), around their own ``step[...]``.
VLLM_STEP_RE = re.compile(r"^execute_(?:\d+_)?context_\d+\(.*\)_generation_\d+\(.*\)$")
_VLLM_PLAIN_RE = re.compile(r"^execute_context_\d+\(.*\)_generation_\d+\(.*\)$")
_VLLM_DETAILED_RE = re.compile(r"^execute_\d+_context_\d+\(.*\)_generation_\d+\(.*\)$")


@dataclass(frozen=True)
class StepMarker:
    key: str
    pattern: re.Pattern[str]


BUILTIN_MARKERS = (
    StepMarker("engine_step", re.compile(r"^(?:EngineCore\.step|EngineCore\.step_with_batch_queue|profkit\.step)$")),
    StepMarker("vllm", _VLLM_PLAIN_RE),
    StepMarker("sglang", re.compile(r"^step\[.*\]$")),
    StepMarker("vllm_detailed", _VLLM_DETAILED_RE),
    StepMarker("profiler_step", re.compile(r"^ProfilerStep#\d+$")),
)

STEP_COLUMNS = [
    "rank",
    "step",
    "start_ns",
    "end_ns",
    "step_ns",
    "gpu_busy_ns",
    "gpu_kernel_ns",
    "gap_ns",
    "gpu_idle_share",
    "phase",
    "batch_size",
    "num_tokens",
    "marker",
    "name",
    "marker_end_ns",
    "whole_period",
]
# markers that annotate part of an iteration: a step is the period from one to the next
ANNOTATION_MARKERS = ("vllm", "sglang", "vllm_detailed")

_HOST_SPAN_KINDS = (schema.CPU_SPAN, schema.CPU_OP)
# the counts of either form: "(120)" or, detailed, "(sq120sk3400sqsq...)" (query tokens first)
_VLLM_RE = re.compile(r"context_(\d+)\((?:sq)?([\d_]*)[^)]*\)_generation_(\d+)\((?:sq)?([\d_]*)[^)]*\)")
_SGLANG_RE = re.compile(r"^step\[(\w+)(?:\s+bs=(\d+))?(?:\s+toks=(\d+))?")
_NUMBER_RE = re.compile(r"#(\d+)$")


def marker_regex(step_pattern: str | None = None) -> re.Pattern[str]:
    """One regex matching every step marker (the built-in ones and ``step_pattern``; a user
    pattern that cannot be joined, e.g. one with global inline flags, is left out)."""
    try:
        return re.compile("|".join(f"(?:{m.pattern.pattern})" for m in step_markers(step_pattern)))
    except re.error:
        return re.compile("|".join(f"(?:{m.pattern.pattern})" for m in BUILTIN_MARKERS))


def step_markers(step_pattern: str | None = None) -> tuple[StepMarker, ...]:
    if step_pattern:
        return (StepMarker("user", re.compile(step_pattern)),) + BUILTIN_MARKERS
    return BUILTIN_MARKERS


def find_step_spans(events: pd.DataFrame, step_pattern: str | None = None,
                    chosen: tuple[str, bool] | None = None) -> pd.DataFrame:
    """Step spans of every rank: columns rank, step, start_ns, end_ns, name, marker.

    Nested matches (a step span inside another on the same rank) are dropped so each
    iteration counts once. ``chosen`` = (marker key, numbered): the marker and numbering decided
    over all ranks (``choose_step_marker``) when ``events`` hold only some of them.
    """
    host, names = _host_names(events)
    for marker in step_markers(step_pattern):
        if chosen is not None and marker.key != chosen[0]:
            continue
        hit = distinct.contains(names, marker.pattern)
        if hit.any():
            spans = _span_rows(events, _outermost(events, host[hit]))
            return _number_steps(spans, marker.key, None if chosen is None else chosen[1])
        if chosen is not None:
            break
    return pd.DataFrame(columns=["rank", "step", "start_ns", "end_ns", "name", "marker"])


def _host_names(events: pd.DataFrame) -> tuple[np.ndarray, pd.Series]:
    """Positions of the host span rows (cpu_span, cpu_op) and their names (one column filtered)."""
    host = np.flatnonzero(distinct.isin(events["kind"], _HOST_SPAN_KINDS))
    return host, events["name"].iloc[host]


def _span_rows(events: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """The step-span columns of the rows at ``rows`` (positions), as the step table types them:
    each column taken at the rows alone (selecting columns of the wide frame, then ``astype``,
    cost milliseconds per call)."""
    codes, uniques = distinct.codes(events["name"])
    c = codes[rows]
    if (c < 0).any():  # a span without a name: as ``astype(object)`` spells it
        names = events["name"].iloc[rows].astype("object").to_numpy(dtype=object)
    else:
        names = uniques[c]
    index = events.index[rows]
    return pd.DataFrame({col: events[col].iloc[rows].to_numpy(np.int64) for col in ("rank", "start_ns", "end_ns")}
                        | {"name": pd.Series(names, index=index, dtype=object)}, index=index)


def _outermost(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """``rows`` (positions) less the spans inside an earlier span of their rank (nested step
    matches: each iteration counts once), in the order of (rank, start, longest first; stable)."""
    rank, start, end = (events[c].iloc[rows].to_numpy(np.int64) for c in ("rank", "start_ns", "end_ns"))
    order = np.lexsort((-end, start, rank))
    rank, end = rank[order], end[order]
    same = np.r_[False, rank[1:] == rank[:-1]]
    run_end = pd.Series(end).groupby(np.cumsum(~same)).cummax().to_numpy()
    inner = same & (end <= np.r_[0, run_end[:-1]])
    return rows[order][~inner]


def step_marker_facts(events: pd.DataFrame, step_pattern: str | None = None) -> dict[str, bool]:
    """For each step marker found in ``events`` (one rank's): whether all its spans are numbered."""
    host, names = _host_names(events)
    markers = step_markers(step_pattern)
    facts: dict[str, bool] = {}
    for marker, hit in zip(markers, distinct.contains_each(names, [m.pattern for m in markers])):
        if hit.any():  # every outermost span's name ends in "#<number>" (a missing name does not)
            codes, uniques = distinct.codes(events["name"])
            facts[marker.key] = bool(distinct.regex_flags(uniques, codes[_outermost(events, host[hit])], _NUMBER_RE,
                                                          "search", missing=None).all())
    return facts


def choose_step_marker(facts: list[dict[str, bool]], step_pattern: str | None = None) -> tuple[str, bool] | None:
    """The marker ``find_step_spans`` would pick over all ranks at once, from per-rank facts."""
    for marker in step_markers(step_pattern):
        seen = [f[marker.key] for f in facts if marker.key in f]
        if seen:
            return marker.key, all(seen)
    return None


def _number_steps(spans: pd.DataFrame, marker_key: str, numbered: bool | None = None) -> pd.DataFrame:
    spans = spans.sort_values(["rank", "start_ns"]).reset_index(drop=True)
    explicit = spans["name"].str.extract(_NUMBER_RE, expand=False)
    ordinal = spans.groupby("rank").cumcount()
    if explicit.notna().all() if numbered is None else numbered:
        spans["step"] = explicit.astype("int64")
    else:
        spans["step"] = ordinal.astype("int64")
    spans["marker"] = marker_key
    return spans[["rank", "step", "start_ns", "end_ns", "name", "marker"]]


def iteration_periods(spans: pd.DataFrame) -> pd.DataFrame:
    """Step spans -> steps: an annotation marker's step runs to the next annotation's start on
    its rank (see the module docstring); other markers are the step. Adds ``marker_end_ns``
    (the marker's own end) and ``whole_period``."""
    spans = spans.copy()
    spans["marker_end_ns"] = spans["end_ns"].astype("int64")
    spans["whole_period"] = True
    if spans.empty or not spans["marker"].isin(ANNOTATION_MARKERS).any():
        return spans
    spans = spans.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    rank = spans["rank"].to_numpy(np.int64)
    start = spans["start_ns"].to_numpy(np.int64)
    end = spans["end_ns"].to_numpy(np.int64)
    has_next = np.r_[rank[1:] == rank[:-1], False]
    nxt = np.r_[start[1:], 0]
    period = has_next & (nxt >= end) & spans["marker"].isin(ANNOTATION_MARKERS).to_numpy(bool)
    spans["end_ns"] = np.where(period, nxt, end)
    spans["whole_period"] = period | ~spans["marker"].isin(ANNOTATION_MARKERS).to_numpy(bool)
    return spans


def step_batch_facts(names: pd.Series) -> pd.DataFrame:
    """Phase (prefill / decode / mixed), batch size and tokens parsed from step names (each
    distinct name parsed once: a decode-only run repeats the same few names for every step)."""
    codes, uniques = pd.factorize(names.astype(str))
    phase: list[str | None] = []
    batch: list[float] = []
    tokens: list[float] = []
    for name in uniques:
        m = _VLLM_RE.search(name)
        if m:
            n_ctx, ctx_tok, n_gen, gen_tok = int(m[1]), _tok(m[2]), int(m[3]), _tok(m[4])
            phase.append("mixed" if n_ctx and n_gen else "prefill" if n_ctx else "decode")
            batch.append(n_ctx + n_gen)
            tokens.append(ctx_tok + gen_tok)
            continue
        m = _SGLANG_RE.match(name)
        if m:
            kind = m[1].upper()
            phase.append("decode" if kind == "DECODE" else "prefill" if kind in ("EXTEND", "PREFILL") else kind.lower())
            batch.append(float(m[2]) if m[2] else np.nan)
            tokens.append(float(m[3]) if m[3] else (float(m[2]) if m[2] and kind == "DECODE" else np.nan))
            continue
        phase.append(None)
        batch.append(np.nan)
        tokens.append(np.nan)
    phase.append(None)  # a missing name (a ``str`` column keeps it missing through astype): no facts
    batch.append(np.nan)
    tokens.append(np.nan)
    codes = np.where(codes < 0, len(uniques), codes)
    return pd.DataFrame(
        {
            "phase": pd.Series(np.asarray(phase, dtype=object)[codes] if len(codes) else [], index=names.index,
                               dtype="string"),
            "batch_size": pd.Series(np.asarray(batch, dtype=np.float64)[codes] if len(codes) else [],
                                    index=names.index, dtype=np.float64).astype("Int64"),
            "num_tokens": pd.Series(np.asarray(tokens, dtype=np.float64)[codes] if len(codes) else [],
                                    index=names.index, dtype=np.float64).astype("Int64"),
        }
    )


def _tok(text: str) -> int:
    # vLLM writes the token count; some builds write "count_extra": take the first number
    head = text.split("_")[0]
    return int(head) if head.isdigit() else 0


def drop_partly_recorded_steps(spans: pd.DataFrame, events: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, int]]:
    """Keep the steps every source of their rank recorded from start to end.

    profkit's span files cover the whole run while a profiler (torch, nsys) records a window of
    steps, and starting or stopping it costs seconds inside the first and last step of that
    window: those steps, and the steps outside the window, would be measured without their GPU
    side. Returns the kept spans and the number dropped per rank.
    """
    if spans.empty or "source" not in events.columns or events["source"].nunique() < 2:
        return spans, {}
    window = recorded_window(events)
    rank = spans["rank"].astype("int64")
    inside = (spans["start_ns"].to_numpy() >= rank.map(window["first_ns"]).to_numpy()) & (
        spans["end_ns"].to_numpy() <= rank.map(window["last_ns"]).to_numpy()
    )
    dropped = spans.loc[~inside].groupby("rank").size()
    return spans.loc[inside], {int(r): int(n) for r, n in dropped.items()}


def step_table(events: pd.DataFrame, step_pattern: str | None = None,
               chosen: tuple[str, bool] | None = None) -> pd.DataFrame:
    """Per (rank, step): wall time, GPU busy and kernel time inside the step, and the gap.

    Steps that some source of the rank recorded only in part are left out (see
    ``drop_partly_recorded_steps``); ``attrs["dropped_steps"]`` says how many per rank.
    """
    spans = iteration_periods(find_step_spans(events, step_pattern, chosen))
    spans, dropped = drop_partly_recorded_steps(spans, events)
    if spans.empty:
        out = pd.DataFrame({c: pd.Series(dtype="int64") for c in STEP_COLUMNS[:9]}).reindex(columns=STEP_COLUMNS)
        out["marker_end_ns"] = out["marker_end_ns"].astype("int64")
        out["whole_period"] = out["whole_period"].astype(bool)
        return out
    parts = []
    event_ranks = events["rank"].to_numpy(dtype=np.float64, na_value=np.nan)  # float: a null rank matches none
    is_gpu = gpu.kind_mask(events, schema.GPU_KINDS)
    is_kernel = gpu.kind_mask(events, (schema.KERNEL,))
    for rank, rank_spans in spans.groupby("rank", sort=True):
        mine = event_ranks == rank
        busy = iv.union(gpu.times(events, "start_ns", mine & is_gpu), gpu.times(events, "end_ns", mine & is_gpu))
        kernels = iv.union(gpu.times(events, "start_ns", mine & is_kernel),
                           gpu.times(events, "end_ns", mine & is_kernel))
        lo = rank_spans["start_ns"].to_numpy(np.int64)
        hi = rank_spans["end_ns"].to_numpy(np.int64)
        part = rank_spans.copy()
        part["gpu_busy_ns"] = iv.covered_between(busy, lo, hi)
        part["gpu_kernel_ns"] = iv.covered_between(kernels, lo, hi)
        parts.append(part)
    steps = pd.concat(parts, ignore_index=True)
    steps["step_ns"] = steps["end_ns"] - steps["start_ns"]
    steps["gap_ns"] = steps["step_ns"] - steps["gpu_busy_ns"]
    with np.errstate(divide="ignore", invalid="ignore"):
        steps["gpu_idle_share"] = np.where(steps["step_ns"] > 0, steps["gap_ns"] / steps["step_ns"], np.nan)
    steps = pd.concat([steps, step_batch_facts(steps["name"])], axis=1)
    steps = steps[STEP_COLUMNS].sort_values(["rank", "start_ns"]).reset_index(drop=True)
    steps.attrs["dropped_steps"] = dropped
    return steps
