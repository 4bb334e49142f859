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
_INT64_MAX = np.iinfo(np.int64).max


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


@dataclass
class _Spans:
    """Step spans as arrays in (rank, start) order, each rank's outermost only: what
    ``find_step_spans`` returns before it is a frame. ``step_table`` works on these, not on a frame
    per stage: a rank's few hundred steps made each pandas call cost more than its work."""
    rank: np.ndarray  # int64
    step: np.ndarray  # int64
    start_ns: np.ndarray
    end_ns: np.ndarray
    name: np.ndarray  # object: str, or None where a span has no name
    marker: str

    def take(self, keep: np.ndarray) -> "_Spans":
        return _Spans(self.rank[keep], self.step[keep], self.start_ns[keep], self.end_ns[keep], self.name[keep],
                      self.marker)


def find_step_spans(events: pd.DataFrame, step_pattern: str | None = None,
                    chosen: tuple[str, bool] | None = None) -> pd.DataFrame:
    """Step spans of every rank: columns rank, step, start_ns, end_ns, name, marker.

    Nested matches (a step span inside another on the same rank) are dropped so each
    iteration counts once. ``chosen`` = (marker key, numbered): the marker and numbering decided
    over all ranks (``choose_step_marker``) when ``events`` hold only some of them.
    """
    spans = _step_spans(events, step_pattern, chosen)
    if spans is None:
        return pd.DataFrame(columns=["rank", "step", "start_ns", "end_ns", "name", "marker"])
    out = pd.DataFrame({"rank": spans.rank, "step": spans.step, "start_ns": spans.start_ns, "end_ns": spans.end_ns,
                        "name": pd.Series(spans.name, dtype=object)})
    out["marker"] = spans.marker
    return out


def _step_spans(events: pd.DataFrame, step_pattern: str | None, chosen: tuple[str, bool] | None) -> _Spans | None:
    """``find_step_spans``' rows as arrays (None: no marker found)."""
    host = _host_rows(events)
    for marker in step_markers(step_pattern):
        if chosen is not None and marker.key != chosen[0]:
            continue
        hit = distinct.contains_each_at(events["name"], host, [marker.pattern])[0]
        if hit.any():
            return _numbered(events, host[hit], marker.key, None if chosen is None else chosen[1])
        if chosen is not None:
            break
    return None


def _host_rows(events: pd.DataFrame) -> np.ndarray:
    """Positions of the host span rows (cpu_span, cpu_op)."""
    return np.flatnonzero(distinct.isin(events["kind"], _HOST_SPAN_KINDS))


def _numbered(events: pd.DataFrame, rows: np.ndarray, marker_key: str, numbered: bool | None) -> _Spans:
    """The outermost spans at ``rows`` (positions), numbered: by the ``#<n>`` their names end in
    where every one has it (``numbered``: as decided over all ranks), else in order per rank."""
    rank, start, end = (events[c].iloc[rows].to_numpy(np.int64) for c in ("rank", "start_ns", "end_ns"))
    keep = _outermost(rank, start, end)
    rows, rank, start, end = rows[keep], rank[keep], start[keep], end[keep]
    codes, uniques = distinct.codes(events["name"])
    c = codes[rows]
    if (c < 0).any():  # a span without a name: as ``astype(object)`` spells it
        names = events["name"].iloc[rows].astype("object").to_numpy(dtype=object)
    else:
        names = uniques[c]
    first = np.r_[True, rank[1:] != rank[:-1]] if len(rank) else np.zeros(0, dtype=bool)
    ordinal = np.arange(len(rank), dtype=np.int64)
    ordinal -= np.maximum.accumulate(np.where(first, ordinal, 0))  # the position inside its rank's run
    numbers = _name_numbers(uniques)
    explicit = np.where(c >= 0, numbers[np.maximum(c, 0)] if len(uniques) else -1, -1)
    if not (explicit < 0).any() if numbered is None else numbered:
        if (explicit < 0).any():
            raise ValueError(f"step names without a '#<number>' where every rank's are numbered: "
                             f"{names[explicit < 0][:3].tolist()}")
        step = explicit
    else:
        step = ordinal
    return _Spans(rank, step.astype(np.int64), start, end, names, marker_key)


def _name_numbers(uniques: np.ndarray) -> np.ndarray:
    """Per distinct name, the number its name ends in (``#<n>``), -1 where none or where it is past
    int64 (a hostile name is not a step number: its steps are counted in order instead)."""
    out = np.full(len(uniques), -1, dtype=np.int64)
    for i, name in enumerate(uniques.tolist()):
        m = _NUMBER_RE.search(name) if isinstance(name, str) else None
        if m and int(m[1]) <= _INT64_MAX:
            out[i] = int(m[1])
    return out


def _outermost(rank: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Positions of the spans (``rank``, ``start``, ``end``: int64) not inside an earlier span of
    their rank (nested step matches: each iteration counts once), in the order of (rank, start,
    longest first; stable)."""
    order = np.lexsort((-end, start, rank))
    rank, end = rank[order], end[order]
    same = np.r_[False, rank[1:] == rank[:-1]]
    run_end = np.empty_like(end)
    bounds = np.r_[np.flatnonzero(~same), len(end)]
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):  # the latest end so far, per rank
        np.maximum.accumulate(end[lo:hi], out=run_end[lo:hi])
    inner = same & (end <= np.r_[0, run_end[:-1]])
    return order[~inner]


def step_marker_facts(events: pd.DataFrame, step_pattern: str | None = None) -> dict[str, bool]:
    """For each step marker found in ``events`` (one rank's): whether all its spans are numbered."""
    host = _host_rows(events)
    markers = step_markers(step_pattern)
    facts: dict[str, bool] = {}
    for marker, hit in zip(markers, distinct.contains_each_at(events["name"], host, [m.pattern for m in markers])):
        if hit.any():  # every outermost span's name ends in "#<number>" (a missing name does not)
            codes, uniques = distinct.codes(events["name"])
            rows = host[hit]
            rank, start, end = (events[c].iloc[rows].to_numpy(np.int64) for c in ("rank", "start_ns", "end_ns"))
            facts[marker.key] = bool(distinct.regex_flags(uniques, codes[rows[_outermost(rank, start, end)]],
                                                          _NUMBER_RE, "search", missing=None).all())
    return facts


def choose_step_marker(facts: list[dict[str, bool]], step_pattern: str | None = None) -> tuple[str, bool] | None:
    """The marker ``find_step_spans`` would pick over all ranks at once, from per-rank facts."""
    for marker in step_markers(step_pattern):
        seen = [f[marker.key] for f in facts if marker.key in f]
        if seen:
            return marker.key, all(seen)
    return None


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
    spans["end_ns"], spans["whole_period"] = _periods(
        spans["rank"].to_numpy(np.int64), spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64),
        spans["marker"].isin(ANNOTATION_MARKERS).to_numpy(bool))
    return spans


def _periods(rank: np.ndarray, start: np.ndarray, end: np.ndarray,
             annotation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(end, whole period) of each step span in (rank, start) order: an annotation's (``annotation``)
    runs to the next span's start on its rank, where that is not before its own end."""
    has_next = np.r_[rank[1:] == rank[:-1], False]
    nxt = np.r_[start[1:], 0]
    period = has_next & (nxt >= end) & annotation
    return np.where(period, nxt, end), period | ~annotation


def step_batch_facts(names: pd.Series) -> pd.DataFrame:
    """Phase (prefill / decode / mixed), batch size and tokens parsed from step names (each
    distinct name parsed once: a decode-only run repeats the same few names for every step)."""
    phase, batch, tokens = batch_fact_arrays(names.astype(str))
    return pd.DataFrame({"phase": pd.Series(phase, index=names.index, dtype="string"),
                         "batch_size": pd.Series(batch, index=names.index, dtype=np.float64).astype("Int64"),
                         "num_tokens": pd.Series(tokens, index=names.index, dtype=np.float64).astype("Int64")})


def batch_fact_arrays(names) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``step_batch_facts``' columns as arrays (phase: object, None where unknown; batch size and
    tokens: float64, NaN where unknown) of ``names`` (text, missing: no facts)."""
    codes, uniques = pd.factorize(names)
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
    return (np.asarray(phase, dtype=object)[codes], np.asarray(batch, dtype=np.float64)[codes],
            np.asarray(tokens, dtype=np.float64)[codes])


def _tok(text: str) -> int:
    # vLLM writes the token count; some builds write "count_extra": take the first number
    head = text.split("_")[0]
    return int(head) if head.isdigit() else 0


def _recorded(rank: np.ndarray, start: np.ndarray, end: np.ndarray, events: pd.DataFrame) -> np.ndarray | None:
    """Which steps (``rank``, ``start``, ``end``) lie inside the window every source of their rank
    recorded; None where each rank has one source.

    profkit's span files cover the whole run while a profiler (torch, nsys) records a window of
    steps, and starting or stopping it costs seconds inside the first and last step of that
    window: those steps, and the steps outside the window, would be measured without their GPU
    side, so ``step_table`` leaves them out."""
    if "source" not in events.columns or distinct.codes(events["source"])[1].size < 2:
        return None
    window = recorded_window(events)
    rank = pd.Series(rank)
    return (start >= rank.map(window["first_ns"]).to_numpy()) & (end <= rank.map(window["last_ns"]).to_numpy())


def _dropped(rank: np.ndarray, inside: np.ndarray) -> dict[int, int]:
    """Steps left out per rank (those with any)."""
    ranks, counts = np.unique(rank[~inside], return_counts=True)
    return {int(r): int(n) for r, n in zip(ranks.tolist(), counts.tolist())}


def step_table(events: pd.DataFrame, step_pattern: str | None = None,
               chosen: tuple[str, bool] | None = None) -> pd.DataFrame:
    """Per (rank, step): wall time, GPU busy and kernel time inside the step, and the gap.

    Steps that some source of the rank recorded only in part are left out (see ``_recorded``);
    ``attrs["dropped_steps"]`` says how many per rank.
    """
    spans = _step_spans(events, step_pattern, chosen)
    if spans is not None:
        marker_end = spans.end_ns
        if spans.marker in ANNOTATION_MARKERS:
            spans.end_ns, whole = _periods(spans.rank, spans.start_ns, spans.end_ns, np.ones(len(spans.rank), bool))
        else:
            whole = np.ones(len(spans.rank), bool)
        inside = _recorded(spans.rank, spans.start_ns, spans.end_ns, events)
        dropped = {} if inside is None else _dropped(spans.rank, inside)
        if inside is not None:
            spans, marker_end, whole = spans.take(inside), marker_end[inside], whole[inside]
    if spans is None or not len(spans.rank):
        out = pd.DataFrame({c: pd.Series(dtype="int64") for c in STEP_COLUMNS[:9]}).reindex(columns=STEP_COLUMNS)
        out["marker_end_ns"] = out["marker_end_ns"].astype("int64")
        out["whole_period"] = out["whole_period"].astype(bool)
        if spans is not None and dropped:  # every step left out: still said (the run's warning counts them)
            out.attrs["dropped_steps"] = dropped
        return out
    busy_ns, kernel_ns = _gpu_time_in(events, spans)
    step_ns = spans.end_ns - spans.start_ns
    gap_ns = step_ns - busy_ns
    with np.errstate(divide="ignore", invalid="ignore"):
        idle_share = np.where(step_ns > 0, gap_ns / step_ns, np.nan)
    phase, batch, tokens = batch_fact_arrays(spans.name)
    marker = pd.array(np.full(len(step_ns), spans.marker, dtype=object), dtype=str)  # as a scalar column is typed
    steps = pd.DataFrame({
        "rank": spans.rank, "step": spans.step, "start_ns": spans.start_ns, "end_ns": spans.end_ns, "step_ns": step_ns,
        "gpu_busy_ns": busy_ns, "gpu_kernel_ns": kernel_ns, "gap_ns": gap_ns, "gpu_idle_share": idle_share,
        "phase": pd.array(phase, dtype="string"), "batch_size": pd.array(batch, dtype="Int64"),
        "num_tokens": pd.array(tokens, dtype="Int64"), "marker": marker, "name": pd.Series(spans.name, dtype=object),
        "marker_end_ns": marker_end, "whole_period": whole})
    steps.attrs["dropped_steps"] = dropped
    return steps


def _gpu_time_in(events: pd.DataFrame, spans: _Spans) -> tuple[np.ndarray, np.ndarray]:
    """Per step span: the time its rank's GPU was busy (any GPU activity) and ran kernels inside it."""
    busy_ns = np.zeros(len(spans.rank), dtype=np.int64)
    kernel_ns = np.zeros(len(spans.rank), dtype=np.int64)
    event_ranks = events["rank"].to_numpy(dtype=np.float64, na_value=np.nan)  # float: a null rank matches none
    is_gpu = gpu.kind_mask(events, schema.GPU_KINDS)
    is_kernel = gpu.kind_mask(events, (schema.KERNEL,))
    bounds = np.r_[np.flatnonzero(np.r_[True, spans.rank[1:] != spans.rank[:-1]]), len(spans.rank)]
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):  # the spans are in rank order
        mine = event_ranks == spans.rank[lo]
        start, end = spans.start_ns[lo:hi], spans.end_ns[lo:hi]
        for out, rows in ((busy_ns, mine & is_gpu), (kernel_ns, mine & is_kernel)):
            covered = iv.union(gpu.times(events, "start_ns", rows), gpu.times(events, "end_ns", rows))
            out[lo:hi] = iv.covered_between(covered, start, end)
    return busy_ns, kernel_ns
