"""Every rank's events -> one merged trace file (Perfetto protobuf or Chrome JSON), one rank at a time.

``merge_ranks(source, out, alignment=...)`` is the core: it reads one rank's events from a
``RankSource`` (``profkit.export.source``), aligns, lays out and writes them, and releases them
before it reads the next rank, so only one rank's events, layout and encoded packets exist at any
moment (a DEP256 trace is written without holding it). What must be known of all ranks before the
first is written (the step marker, display pids, the earliest event) comes from each rank's small
``RankSummary``. ``merge_capture(capture, out)`` is the same over a loaded ``Capture``, with the
alignment estimated over its events. The file grows rank by rank (written to ``OUT.partial`` and
renamed when complete, so a crash never leaves a file that looks whole). Clock alignment is a
parameter: by default ``profkit.align`` when it can be imported, else the ranks are merged on
their own clocks and the result says so.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Union

import pandas as pd

from profkit.export.chrome import ChromeWriter
from profkit.export.identity import RankIdentity, display_pids, rank_identity
from profkit.export.layout import build_rank_trace
from profkit.export.perfetto import PerfettoWriter
from profkit.export.source import FrameSource, RankSource, RankSummary, first_starts_frame, summarize_rank
from profkit.export.steps import choose_marker
from profkit.export.steps import rank_steps as rank_steps_of
from profkit.export.window import StepWindow, TimeWindow, overlapping, select_steps, with_launched_gpu_work

if TYPE_CHECKING:
    from profkit.align import Alignment

FORMATS = ("perfetto", "chrome")
AUTO = "auto"
# events -> (events on one timeline, alignment table: rank, offset_ns, drift_ppm, residual_ns, method, ...)
Aligner = Callable[[pd.DataFrame], "tuple[pd.DataFrame, pd.DataFrame | None]"]
AlignOption = Union[Aligner, str, None]  # an Aligner, AUTO, or None (merge on the ranks' own clocks)


@dataclass
class MergeResult:
    path: Path
    fmt: str
    ranks: list[int]
    n_events: int
    n_steps: int
    n_flows: int
    n_overlap_tracks: int
    bytes_written: int
    alignment: pd.DataFrame | None  # None: not aligned (see notes)
    notes: list[str] = field(default_factory=list)


def profkit_aligner() -> Aligner | None:
    """``profkit.align`` as an Aligner, or None while that package does not provide it.

    Prefers ``estimate`` (per-source offsets within a rank, then per-rank clocks) over
    ``estimate_alignment`` (per-rank table only); its warnings ride in ``table.attrs["warnings"]``.
    """
    try:
        align_pkg = importlib.import_module("profkit.align")
        apply_alignment = align_pkg.apply_alignment
    except (ImportError, AttributeError):
        return None
    estimate = getattr(align_pkg, "estimate", None)
    estimate_alignment = getattr(align_pkg, "estimate_alignment", None)
    if estimate is None and estimate_alignment is None:
        return None

    def align(events: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        if estimate is not None:
            result = estimate(events)
            table = result.ranks.copy()
            table.attrs["warnings"] = list(getattr(result, "warnings", []))
            return apply_alignment(events, result), table
        table = estimate_alignment(events)
        return apply_alignment(events, table), table

    return align


def merge_capture(
    capture,
    out_path: str | Path,
    *,
    fmt: str = "perfetto",
    steps: StepWindow | None = None,
    time: TimeWindow | None = None,
    step_pattern: str | None = None,
    align: AlignOption = AUTO,
    progress: Callable[[str], None] | None = None,
) -> MergeResult:
    """Write ``capture`` (a ``profkit.load`` result) as one trace at ``out_path``.

    The alignment is estimated over all of ``capture.events`` (they are in memory anyway) and
    applied rank by rank; the writing is ``merge_ranks``'s over an in-memory source.
    """
    _check_options(fmt, steps, time)
    notes: list[str] = []
    events, align_rank, table = capture.events, None, None
    if align == AUTO:
        align_rank, table = _auto_alignment(events, notes)
    elif align is None:
        notes.append(NOT_ALIGNED.format(why="alignment was switched off"))
    elif callable(align):  # an Aligner over the whole table: the caller's errors are theirs to see
        events, table = align(events)
        if table is not None:
            notes.extend(f"alignment: {w}" for w in table.attrs.get("warnings", []))
    else:
        raise TypeError(f"align must be a callable, {AUTO!r} or None, not {align!r}")
    source = FrameSource(events, capture.meta, capture.parts)
    return _merge(source, out_path, fmt, steps, time, step_pattern, table, align_rank, notes, progress)


def merge_ranks(
    source: RankSource,
    out_path: str | Path,
    *,
    fmt: str = "perfetto",
    steps: StepWindow | None = None,
    time: TimeWindow | None = None,
    step_pattern: str | None = None,
    alignment: Alignment | pd.DataFrame | None = None,
    progress: Callable[[str], None] | None = None,
) -> MergeResult:
    """Write every rank of ``source`` (see ``profkit.export.source``) as one trace at ``out_path``,
    holding one rank's events at a time, so a DEP256 trace is written without holding it.

    ``alignment``: a ``profkit.align.Alignment`` (or its per-rank table) estimated beforehand,
    applied to each rank's events with ``profkit.align.apply_alignment``; None merges the ranks on
    their own clocks (and says so in the notes).
    """
    _check_options(fmt, steps, time)
    notes: list[str] = []
    if alignment is None:
        notes.append(NOT_ALIGNED.format(why="no alignment was given"))
        return _merge(source, out_path, fmt, steps, time, step_pattern, None, None, notes, progress)
    from profkit.align import Alignment, apply_alignment

    if isinstance(alignment, Alignment):
        table = alignment.ranks.copy()
        table.attrs["warnings"] = list(alignment.warnings)
    else:
        table = alignment
    notes.extend(f"alignment: {w}" for w in table.attrs.get("warnings", []))
    return _merge(
        source, out_path, fmt, steps, time, step_pattern, table, lambda frame: apply_alignment(frame, alignment), notes, progress,
    )


NOT_ALIGNED = "clocks not aligned ({why}): each rank is on its own clock; cross-rank gaps may be off by clock offsets"
RankAligner = Callable[[pd.DataFrame], pd.DataFrame]  # one rank's events -> the same rows on the common clock


def _check_options(fmt: str, steps: StepWindow | None, time: TimeWindow | None) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if steps is not None and time is not None:
        raise ValueError("give a step window or a time window, not both")


def _merge(
    source: RankSource,
    out_path: str | Path,
    fmt: str,
    steps: StepWindow | None,
    time: TimeWindow | None,
    step_pattern: str | None,
    alignment: pd.DataFrame | None,
    align_rank: RankAligner | None,
    notes: list[str],
    progress: Callable[[str], None] | None,
) -> MergeResult:
    """The streaming merge: a first pass over small per-rank summaries, then one rank at a time."""
    summaries = [_summary(source, int(rank)) for rank in sorted(int(r) for r in source.ranks)]
    summaries = [s for s in summaries if s.n_events]
    ranks = [s.rank for s in summaries]
    names = {s.rank: set(s.span_names) for s in summaries}
    marker = choose_marker(names.values(), step_pattern)
    if steps is not None and marker is None:
        notes.append("no step markers found on any rank: --steps selects nothing (try --step-pattern)")
    identities = {s.rank: rank_identity(s.rank, source.meta.get(s.rank, []), s.host_pid_counts) for s in summaries}
    pids = display_pids(identities)
    trace_start_ns = _trace_start_ns(summaries, align_rank)
    time_bounds = time.resolve(trace_start_ns) if time is not None else (None, None)
    parts = getattr(source, "parts", None)

    out = Path(out_path)
    partial = out.with_name(out.name + ".partial")
    writer = PerfettoWriter(partial) if fmt == "perfetto" else ChromeWriter(
        partial, trace_start_ns, {"profkit_ranks": ranks, "aligned": alignment is not None}
    )
    totals = {"events": 0, "steps": 0, "flows": 0, "overlap": 0}
    written: list[int] = []
    try:
        for rank in ranks:
            counts = _write_rank(
                writer, source, rank, align_rank, names[rank], marker, steps, time_bounds, identities[rank], pids[rank],
                totals["flows"] + 1, _description(rank, parts, alignment), notes, progress,
            )
            if counts is None:
                continue
            written.append(rank)
            for key, n in zip(("events", "steps", "flows", "overlap"), counts):
                totals[key] += n
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    size = writer.close()
    os.replace(partial, out)
    return MergeResult(
        path=out, fmt=fmt, ranks=written, n_events=totals["events"], n_steps=totals["steps"],
        n_flows=totals["flows"], n_overlap_tracks=totals["overlap"], bytes_written=size,
        alignment=alignment, notes=notes,
    )


def _summary(source: RankSource, rank: int) -> RankSummary:
    """The source's cheap summary, else one from the rank's events (a second read of the rank)."""
    summary = getattr(source, "summary", None)
    return summary(rank) if summary is not None else summarize_rank(rank, source.events(rank))


def _trace_start_ns(summaries: list[RankSummary], align_rank: RankAligner | None) -> int:
    """Earliest event of the capture on the merged clock, from each (rank, source)'s earliest."""
    firsts = first_starts_frame(summaries)
    if firsts.empty:
        return 0
    if align_rank is not None:
        firsts = align_rank(firsts)
    return int(firsts["start_ns"].min())


def _write_rank(
    writer, source: RankSource, rank: int, align_rank: RankAligner | None, names: set[str], marker,
    step_window: StepWindow | None, time_bounds, identity: RankIdentity, pid: int, flow_id_base: int,
    description: str, notes: list[str], progress: Callable[[str], None] | None,
) -> tuple[int, int, int, int] | None:
    """Read, align, window, lay out and write one rank: (events, steps, flows, overlap tracks).

    A function of its own so that every frame of the rank is released when it returns, before
    the next rank is read.
    """
    events = source.events(rank)
    if align_rank is not None:
        events = align_rank(events)
    steps = rank_steps_of(events, names, marker)
    selected = _select(rank, events, steps, step_window, time_bounds, notes)
    del events, steps
    if selected is None:
        return None
    events, steps = selected
    del selected
    rt = build_rank_trace(rank, events, steps, identity, pid, flow_id_base, description)
    writer.write_rank(rt)
    for track in rt.overlap_tracks:
        n = int((rt.track_of_item == track.index).sum())
        notes.append(f"rank {rank}: {n} events crossed others on their track; drawn on '{track.name}'")
    if progress:
        progress(f"rank {rank}: {len(events):,} events, {len(steps)} steps, {rt.n_flows:,} flows")
    return len(events), len(steps), rt.n_flows, len(rt.overlap_tracks)


def _auto_alignment(events: pd.DataFrame, notes: list[str]) -> tuple[RankAligner | None, pd.DataFrame | None]:
    """``profkit.align`` estimated over all events, as a per-rank aligner plus its rank table.

    Prefers ``estimate`` (per-source offsets within a rank, then per-rank clocks) over
    ``estimate_alignment`` (per-rank table only). A merge still helps without alignment: when the
    package is missing or fails, the note says the ranks are on their own clocks.
    """
    try:
        align_pkg = importlib.import_module("profkit.align")
        apply_alignment = align_pkg.apply_alignment
    except (ImportError, AttributeError):
        align_pkg = apply_alignment = None
    estimate = getattr(align_pkg, "estimate", None)
    estimate_alignment = getattr(align_pkg, "estimate_alignment", None)
    if apply_alignment is None or (estimate is None and estimate_alignment is None):
        notes.append(NOT_ALIGNED.format(why="profkit.align is not available"))
        return None, None
    try:
        if estimate is not None:
            result = estimate(events)
            table = result.ranks.copy()
            table.attrs["warnings"] = list(getattr(result, "warnings", []))
        else:
            result = table = estimate_alignment(events)
    except Exception as exc:  # noqa: BLE001 - a merge still helps; the note says it is unaligned
        notes.append(f"clocks not aligned (profkit.align failed: {type(exc).__name__}: {exc}): each rank is on its own clock")
        return None, None
    notes.extend(f"alignment: {w}" for w in table.attrs.get("warnings", []))
    return (lambda frame: apply_alignment(frame, result)), table


def _select(rank, events, steps, step_window, time_bounds, notes):
    """(events, steps) of one rank inside the window, or None when the rank has nothing there."""
    if step_window is not None:
        chosen = select_steps(steps, step_window)
        if chosen.empty:
            notes.append(f"rank {rank}: no steps in {step_window}; left out")
            return None
        lo, hi = int(chosen["start_ns"].min()), int(chosen["end_ns"].max())
        keep = with_launched_gpu_work(events, overlapping(events, lo, hi))
        return events[keep], chosen
    lo, hi = time_bounds
    if lo is None and hi is None:
        return events, steps
    keep = overlapping(events, lo, hi)
    if not keep.any():
        notes.append(f"rank {rank}: no events in the time window; left out")
        return None
    return events[keep], steps[overlapping(steps, lo, hi)]


ALIGNMENT_FACTS = ("method", "offset_ns", "drift_ppm", "residual_ns", "error_bound_ns")


def _fact(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _description(rank: int, parts: pd.DataFrame | None, alignment: pd.DataFrame | None) -> str:
    lines = []
    if alignment is not None and len(alignment) and "rank" in alignment.columns:
        rows = alignment[alignment["rank"] == rank]
        if len(rows):
            row = rows.iloc[0]
            facts = [f"{k}={_fact(row[k])}" for k in ALIGNMENT_FACTS if k in row.index]
            lines.append("clock alignment: " + ", ".join(facts))
    elif alignment is None:
        lines.append("clock alignment: none (rank on its own clock)")
    if parts is not None and len(parts):
        for _, part in parts[parts["rank"] == rank].iterrows():
            key = f" [{part['key']}]" if part.get("key") else ""
            lines.append(f"input: {part['path']}{key} ({part['source']})")
    return "\n".join(lines)
