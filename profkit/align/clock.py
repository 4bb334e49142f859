"""A rank's clock against the reference rank's, and moving timestamps onto the reference.

Convention (the simulator's truth.json uses the same, so estimates compare to it directly)::

    host_ns = ref_ns + offset_ns + drift_ppm * 1e-6 * (ref_ns - t0_ns)

``offset_ns`` is how far the rank's clock is ahead of the reference at ``t0_ns``; the drift adds
``drift_ppm`` ns per ms after that. The inverse is applied exactly in int64 (only the small drift
correction goes through float64 and is rounded), so timestamps keep nanosecond resolution and
order: ``t_aligned = t - offset - rint((t - offset - t0) * d / (1 + d))`` with ``d = drift_ppm * 1e-6``.
To first order that is the familiar ``t - offset - drift * (t - t0)``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

TIME_COLUMNS = ("start_ns", "end_ns", "launch_ns", "host_start_ns", "host_end_ns", "arrive_ns", "exit_ns", "span_start_ns")


def to_reference(host_ns: np.ndarray, offset_ns, drift_ppm, t0_ns: int) -> np.ndarray:
    """Host timestamps (int64) -> reference clock (int64); offset/drift scalars or per-element."""
    host_ns = np.asarray(host_ns, dtype=np.int64)
    offset = np.asarray(offset_ns, dtype=np.int64)
    d = np.asarray(drift_ppm, dtype=np.float64) * 1e-6
    rel = host_ns - offset - np.int64(t0_ns)
    corr = np.rint(rel.astype(np.float64) * (d / (1.0 + d))).astype(np.int64)
    return host_ns - offset - corr


def to_host(ref_ns: np.ndarray, offset_ns, drift_ppm, t0_ns: int) -> np.ndarray:
    """Reference timestamps -> a rank's host clock (the forward model; used by tests)."""
    ref_ns = np.asarray(ref_ns, dtype=np.int64)
    d = np.asarray(drift_ppm, dtype=np.float64) * 1e-6
    return ref_ns + np.asarray(offset_ns, dtype=np.int64) + np.rint((ref_ns - np.int64(t0_ns)) * d).astype(np.int64)


def shift_columns(
    df: pd.DataFrame,
    offset_ns: np.ndarray,
    drift_ppm: np.ndarray,
    t0_ns: int,
    columns: tuple[str, ...] = TIME_COLUMNS,
) -> pd.DataFrame:
    """New frame with each time column present moved to the reference clock, row by row.

    ``offset_ns`` / ``drift_ppm``: per-row arrays, or scalars where every row has the same (one
    rank's table). Nulls stay null; dtypes are kept. The other columns are the frame's own (not
    copied: pandas copies on write)."""
    out = df.copy(deep=False)
    for col in columns:
        if col not in df.columns:
            continue
        s = df[col]
        valid = present(s)
        moved = to_reference(s.to_numpy(dtype=np.int64, na_value=0), offset_ns, drift_ppm, t0_ns)
        out[col] = _same_dtype(moved, valid, s.dtype)
    return out


def present(s: pd.Series) -> np.ndarray | None:
    """Where the column has a value; None where it has one everywhere (read off Arrow's null
    count, or a plain numpy dtype, without a mask per row)."""
    if isinstance(s.dtype, np.dtype) and s.dtype.kind in "iub":
        return None
    if isinstance(s.dtype, pd.ArrowDtype) and s.array.__arrow_array__().null_count == 0:
        return None
    valid = s.notna().to_numpy(dtype=bool)
    return None if valid.all() else valid


def _same_dtype(values: np.ndarray, valid: np.ndarray | None, dtype):
    if isinstance(dtype, pd.ArrowDtype):
        return pd.arrays.ArrowExtensionArray(pa.array(values, type=dtype.pyarrow_dtype,
                                                      mask=None if valid is None else ~valid))
    if isinstance(dtype, np.dtype) and valid is None:
        return values.astype(dtype, copy=False)
    return pd.arrays.IntegerArray(values, np.zeros(values.size, bool) if valid is None else ~valid)


def rank_clocks(table: pd.DataFrame, ranks: np.ndarray) -> tuple:
    """Each row's rank's offset (int64) and drift (float64) in the rank table ``table``: 0 where
    it has no row for the rank, or no value; scalars where every row is of one rank (a rank
    task's tables: no per-row arrays to make and read)."""
    known = table["rank"].to_numpy(dtype=np.int64)
    if np.unique(known).size != known.size:
        raise ValueError(f"the alignment has several rows for a rank: {sorted(known.tolist())}")
    order = np.argsort(known)
    known = known[order]
    offsets = table["offset_ns"].fillna(0).to_numpy(dtype=np.int64)[order]
    drifts = table["drift_ppm"].fillna(0.0).to_numpy(dtype=np.float64)[order]
    one = ranks.size > 0 and bool((ranks == ranks[0]).all())
    asked = ranks[:1] if one else ranks
    pos = np.minimum(np.searchsorted(known, asked), max(known.size - 1, 0))
    found = (known[pos] == asked) if known.size else np.zeros(asked.size, dtype=bool)
    off = np.where(found, offsets[pos] if known.size else 0, 0).astype(np.int64)
    drift = np.where(found, drifts[pos] if known.size else 0.0, 0.0).astype(np.float64)
    return (off[0], drift[0]) if one else (off, drift)
