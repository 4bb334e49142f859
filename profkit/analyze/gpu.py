"""GPU-side facts of one rank: busy intervals, communication kernels, the GPU timeline.

Definitions follow TraceLens's GPU timeline so numbers can be checked against it:
busy = union of kernel, memcpy and memset intervals over all streams; computation =
union of non-communication kernels and memsets; exposed communication = communication
not overlapped by computation; exposed memcpy = memcpy not overlapped by computation or
communication; idle = window - busy. The window is first GPU event start to last GPU
event end unless the caller gives one (e.g. a ProfilerStep's GPU annotation).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit import distinct
from profkit import intervals as iv
from profkit import schema
from profkit.names import is_comm_kernel

def gpu_events(events: pd.DataFrame) -> pd.DataFrame:
    """Device activity rows (kernel, memcpy, memset) of an event table."""
    return events[events["kind"].isin(schema.GPU_KINDS)]


def kind_mask(events: pd.DataFrame, kinds: tuple[str, ...]) -> np.ndarray:
    """Rows whose kind is one of ``kinds`` (a bool array: no frame is filtered)."""
    return distinct.isin(events["kind"], kinds)


def times(events: pd.DataFrame, column: str, rows: np.ndarray) -> np.ndarray:
    """``events.loc[rows, column]`` as int64 (nulls elsewhere in the column do not matter)."""
    col = events[column]
    if col.hasnans:
        return col[rows].to_numpy(np.int64)
    return col.to_numpy(np.int64)[rows]


def _intervals(events: pd.DataFrame, rows: np.ndarray) -> iv.Intervals:
    return iv.union(times(events, "start_ns", rows), times(events, "end_ns", rows))


def busy_intervals(events: pd.DataFrame) -> iv.Intervals:
    return _intervals(events, kind_mask(events, schema.GPU_KINDS))


def kernel_intervals(events: pd.DataFrame) -> iv.Intervals:
    return _intervals(events, kind_mask(events, (schema.KERNEL,)))


TIMELINE_FIELDS = (
    "window_start_ns",
    "window_end_ns",
    "window_ns",
    "gpu_busy_ns",
    "gpu_idle_ns",
    "computation_ns",
    "comm_ns",
    "exposed_comm_ns",
    "memcpy_ns",
    "exposed_memcpy_ns",
    "gpu_kernel_ns",
    "n_kernels",
    "n_gpu_events",
)


def gpu_timeline(events: pd.DataFrame, window: tuple[int, int] | None = None) -> dict[str, int]:
    """GPU timeline of one rank's events; all values int64 ns (counts for ``n_*``)."""
    rows = kind_mask(events, schema.GPU_KINDS)  # the columns needed, not the frame, are filtered
    starts = times(events, "start_ns", rows)
    ends = times(events, "end_ns", rows)
    is_kernel = kind_mask(events, (schema.KERNEL,))[rows]
    is_memcpy = kind_mask(events, (schema.MEMCPY,))[rows]
    is_comm = is_kernel & is_comm_kernel(events["name"])[rows]
    is_comp = (is_kernel & ~is_comm) | kind_mask(events, (schema.MEMSET,))[rows]
    return _timeline(starts, ends, is_kernel, is_memcpy, is_comm, is_comp, window)


def _timeline(starts: np.ndarray, ends: np.ndarray, is_kernel: np.ndarray, is_memcpy: np.ndarray,
              is_comm: np.ndarray, is_comp: np.ndarray, window: tuple[int, int] | None) -> dict[str, int]:
    """``gpu_timeline`` of one rank's GPU rows (times and kind flags as arrays). The rows are
    put in start order once: each union below sorts its subset again, already in order (cheap),
    and a union does not depend on the order of its intervals."""
    if starts.size > 1 and not (starts[1:] >= starts[:-1]).all():
        order = np.argsort(starts, kind="stable")
        starts, ends, is_kernel, is_memcpy, is_comm, is_comp = (
            x[order] for x in (starts, ends, is_kernel, is_memcpy, is_comm, is_comp))
    if window is None:
        if starts.size == 0:
            return {k: 0 for k in TIMELINE_FIELDS}
        lo, hi = int(starts.min()), int(ends.max())
    else:
        lo, hi = int(window[0]), int(window[1])

    def clipped(mask: np.ndarray) -> iv.Intervals:
        return iv.clip(iv.union(starts[mask], ends[mask]), lo, hi)

    busy = clipped(np.ones(starts.size, dtype=bool))
    comp = clipped(is_comp)
    comm = clipped(is_comm)
    memcpy = clipped(is_memcpy)
    kernels = clipped(is_kernel)
    exposed_comm = iv.subtract(comm, comp)
    exposed_memcpy = iv.subtract(iv.subtract(memcpy, comp), comm)
    busy_ns = iv.total(busy)
    in_window = (ends > lo) & (starts < hi)
    return {
        "window_start_ns": lo,
        "window_end_ns": hi,
        "window_ns": hi - lo,
        "gpu_busy_ns": busy_ns,
        "gpu_idle_ns": (hi - lo) - busy_ns,
        "computation_ns": iv.total(comp),
        "comm_ns": iv.total(comm),
        "exposed_comm_ns": iv.total(exposed_comm),
        "memcpy_ns": iv.total(memcpy),
        "exposed_memcpy_ns": iv.total(exposed_memcpy),
        "gpu_kernel_ns": iv.total(kernels),
        "n_kernels": int((is_kernel & in_window).sum()),
        "n_gpu_events": int(in_window.sum()),
    }


def gpu_timelines(events: pd.DataFrame, arrays=None) -> pd.DataFrame:
    """One GPU-timeline row per rank (whole-trace window per rank). ``arrays``:
    ``overhead.event_arrays(events)`` when the caller has it (kinds and names already coded)."""
    rows = []
    if arrays is not None:
        for rank in sorted(arrays.rank_bounds):
            a, b = arrays.rank_bounds[rank]
            r = slice(a, b)
            gpu = arrays.is_kind(r, *schema.GPU_KINDS)
            is_kernel = arrays.is_kind(r, schema.KERNEL)[gpu]
            is_comm = is_kernel & arrays.comm[arrays.name[r][gpu]]
            is_comp = (is_kernel & ~is_comm) | arrays.is_kind(r, schema.MEMSET)[gpu]
            row = {"rank": int(rank)}
            row.update(_timeline(arrays.start[r][gpu], arrays.end[r][gpu], is_kernel,
                                 arrays.is_kind(r, schema.MEMCPY)[gpu], is_comm, is_comp, None))
            rows.append(row)
        return pd.DataFrame(rows, columns=["rank", *TIMELINE_FIELDS])
    for rank, rank_events in by_rank(events):
        row = {"rank": int(rank)}
        row.update(gpu_timeline(rank_events))
        rows.append(row)
    return pd.DataFrame(rows, columns=["rank", *TIMELINE_FIELDS])


def by_rank(events: pd.DataFrame):
    """``events.groupby("rank", sort=True, observed=True)``, without copying a table that holds one
    rank only (the per-rank stages of the scale path): (rank, rows of that rank) in rank order."""
    ranks = events["rank"]
    if len(ranks) and not ranks.hasnans and ranks.min() == ranks.max():
        return [(ranks.iloc[0], events)]
    return events.groupby("rank", sort=True, observed=True)
