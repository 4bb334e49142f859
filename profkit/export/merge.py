"""A loaded capture -> one merged trace file (Perfetto protobuf or Chrome JSON), one rank at a time.

Only one rank's layout and encoded packets exist at any moment; the file grows rank by rank
(written to ``OUT.partial`` and renamed when complete, so a crash never leaves a file that looks
whole). Clock alignment is a parameter: by default ``profkit.align`` when it can be imported,
else the ranks are merged on their own clocks and the result says so.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union

import numpy as np
import pandas as pd

from profkit.export.chrome import ChromeWriter
from profkit.export.identity import RankIdentity, display_pids, rank_identity
from profkit.export.layout import build_rank_trace
from profkit.export.perfetto import PerfettoWriter
from profkit.export.steps import choose_marker, span_names
from profkit.export.steps import rank_steps as rank_steps_of
from profkit.export.window import StepWindow, TimeWindow, overlapping, select_steps, with_launched_gpu_work

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
    """Write ``capture`` (a ``profkit.load`` result) as one trace at ``out_path``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if steps is not None and time is not None:
        raise ValueError("give a step window or a time window, not both")
    notes: list[str] = []
    events, alignment = _aligned(capture.events, align, notes)
    ranks = sorted(int(r) for r in pd.unique(events["rank"].dropna())) if len(events) else []
    positions = events.groupby("rank", sort=True).indices if len(events) else {}
    names = {rank: span_names(_rows(events, positions[rank])) for rank in ranks}
    marker = choose_marker(names.values(), step_pattern)
    if steps is not None and marker is None:
        notes.append("no step markers found on any rank: --steps selects nothing (try --step-pattern)")
    identities = _identities(capture, events, ranks)
    pids = display_pids(identities)
    trace_start_ns = int(events["start_ns"].min()) if len(events) else 0
    time_bounds = time.resolve(trace_start_ns) if time is not None else (None, None)

    out = Path(out_path)
    partial = out.with_name(out.name + ".partial")
    writer = PerfettoWriter(partial) if fmt == "perfetto" else ChromeWriter(
        partial, trace_start_ns, {"profkit_ranks": ranks, "aligned": alignment is not None}
    )
    totals = {"events": 0, "steps": 0, "flows": 0, "overlap": 0}
    written: list[int] = []
    try:
        for rank in ranks:
            rank_events = _rows(events, positions[rank])
            rank_steps = rank_steps_of(rank_events, names[rank], marker)
            selected = _select(rank, rank_events, rank_steps, steps, time_bounds, notes)
            if selected is None:
                continue
            rank_events, rank_steps = selected
            rt = build_rank_trace(
                rank, rank_events, rank_steps, identities[rank], pids[rank], totals["flows"] + 1,
                _description(rank, capture, alignment),
            )
            writer.write_rank(rt)
            written.append(rank)
            n_flows = rt.n_flows
            totals["events"] += len(rank_events)
            totals["steps"] += len(rank_steps)
            totals["flows"] += n_flows
            totals["overlap"] += len(rt.overlap_tracks)
            for track in rt.overlap_tracks:
                n = int((rt.track_of_item == track.index).sum())
                notes.append(f"rank {rank}: {n} events crossed others on their track; drawn on '{track.name}'")
            if progress:
                progress(f"rank {rank}: {len(rank_events):,} events, {len(rank_steps)} steps, {n_flows:,} flows")
            del rt, rank_events
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


def _rows(events: pd.DataFrame, positions) -> pd.DataFrame:
    """One rank's rows: a slice (no copy) when contiguous, as the loader builds them."""
    if len(positions) and positions[-1] - positions[0] + 1 == len(positions):
        return events.iloc[int(positions[0]):int(positions[-1]) + 1]
    return events.iloc[positions]


def _aligned(events: pd.DataFrame, align: AlignOption, notes: list[str]):
    aligner = profkit_aligner() if align == AUTO else align
    if aligner is None:
        why = "profkit.align is not available" if align == AUTO else "alignment was switched off"
        notes.append(f"clocks not aligned ({why}): each rank is on its own clock; cross-rank gaps may be off by clock offsets")
        return events, None
    if not callable(aligner):
        raise TypeError(f"align must be a callable, {AUTO!r} or None, not {aligner!r}")
    if align != AUTO:
        aligned, table = aligner(events)  # the caller chose this aligner: its errors are theirs to see
    else:
        try:
            aligned, table = aligner(events)
        except Exception as exc:  # noqa: BLE001 - a merge still helps; the note says it is unaligned
            notes.append(f"clocks not aligned (profkit.align failed: {type(exc).__name__}: {exc}): each rank is on its own clock")
            return events, None
    if table is not None:
        notes.extend(f"alignment: {w}" for w in table.attrs.get("warnings", []))
    return aligned, table


def _identities(capture, events: pd.DataFrame, ranks: list[int]) -> dict[int, RankIdentity]:
    host = events["stream"].isna().to_numpy(dtype=bool) & events["pid"].notna().to_numpy(dtype=bool)
    pairs = pd.DataFrame({"rank": events["rank"].to_numpy(np.int64)[host], "pid": events["pid"].to_numpy(np.int64, na_value=-1)[host]})
    counts: dict[int, dict[int, int]] = {}
    for (rank, pid), n in pairs.value_counts().items():
        counts.setdefault(int(rank), {})[int(pid)] = int(n)
    return {rank: rank_identity(rank, capture.meta.get(rank, []), counts.get(rank, {})) for rank in ranks}


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


def _description(rank: int, capture, alignment: pd.DataFrame | None) -> str:
    lines = []
    if alignment is not None and len(alignment) and "rank" in alignment.columns:
        rows = alignment[alignment["rank"] == rank]
        if len(rows):
            row = rows.iloc[0]
            facts = [f"{k}={_fact(row[k])}" for k in ALIGNMENT_FACTS if k in row.index]
            lines.append("clock alignment: " + ", ".join(facts))
    elif alignment is None:
        lines.append("clock alignment: none (rank on its own clock)")
    parts = capture.parts[capture.parts["rank"] == rank] if len(capture.parts) else capture.parts
    for _, part in parts.iterrows():
        key = f" [{part['key']}]" if part.get("key") else ""
        lines.append(f"input: {part['path']}{key} ({part['source']})")
    return "\n".join(lines)

