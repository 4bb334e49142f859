"""One copy of each host span seen by several sources of one rank.

Why: ``profkit capture --nsys`` / ``--torch`` records one host span up to three times per rank:
the profkit span file (source ``profkit``), the same span as an NVTX range in profkit's NVTX
domain (source ``nsys``, category ``profkit``), and the engine's own annotation (NVTX default
domain, category ``nvtx``, or a Kineto ``record_function``, category ``user_annotation``),
sometimes under its bare name (``sync_dp_padding`` for ``GPUModelRunner.sync_dp_padding``).
Span-based analyses (overhead causes, stragglers' phases, collective instances from DP-sync
spans) would count each phase two or three times. Run on the source-aligned clock (after
``apply_alignment``).

Two host spans (kind ``cpu_span`` or ``gc``) are one activity when

* they belong to one rank, and to different *streams*: another source, or the same source with
  another category (nsys's profkit domain vs its default domain). The profkit span file is one
  recorder whose categories are hook groups: two of its spans are never duplicates;
* their names agree after ``normalize_name`` (surrounding blanks dropped), exactly or as a
  qualname suffix at a ``.`` boundary: ``GPUModelRunner.sync_dp_padding`` ~ ``sync_dp_padding``,
  but not ``Worker.execute_model`` ~ ``GPUModelRunner.execute_model``;
* their starts and their ends each agree within ``max(tol_ns, tol_fraction * shorter duration)``,
  200 µs or 2% by default. Measured on the bundled captures (``sample_traces/engine-dep2-h200-
  capture``, 2 ranks x 3 captures, every profkit span against its other copies, aligned clock):
  profkit span vs nsys profkit-domain NVTX: starts within 8 µs, ends within 16 µs; the engine's
  own NVTX / ``record_function`` range, which wraps or sits inside the hooked call, up to 100 µs
  apart at the start (``sync_dp_padding``, the first call after the profiler starts) and 89 µs at
  the end (``EngineCore.step``). 200 µs is twice that, and still ten times below the smallest
  gap between two distinct calls of one name there (1.9 ms, ``MoEModel._moe`` layer to layer);
  the 2% term only widens it for spans over 10 ms, whose wrappers' exits may be held up by a GC
  pause or a few ppm of clock drift. Nested calls of one name closer than that (a recursion
  returning at once) cannot be told apart by time: when both sources recorded both calls, each
  copy still pairs with its own (only less preferred copies are dropped).
* or one copy was cut by its source's recording window: same start within the tolerance, the
  cut copy ends at the last moment its source recorded a host span on that rank (within the
  tolerance), and the other copy ends later (nsys closes ranges still open at ``stop`` there;
  Kineto likewise); the same, mirrored, for a copy cut at its source's first moment.

Of each such pair the less preferred copy is dropped: the profkit span file first (it has the
whole run and the hook's qualname), then profkit-domain ranges in other sources (category
``profkit``), then the rest (ties by source, then category name, alphabetically). A span is
dropped only when a *more* preferred copy matches it, so the most preferred copy of an activity
always stays. GPU events, runtime calls, cpu_ops, GPU-side spans and spans without a partner are
never dropped.

Vectorized, no Python loop over spans or groups: host spans sorted by (rank, name leaf, start);
each span's candidates are the spans of its group starting within its tolerance (found for all
at once by sorting the window ends among the starts), and again by end for copies cut at the
start. About 5 s for 4M events (3M host spans, 2M dropped) on one CPU core.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit import distinct, schema
from profkit.align.clock import present

DEDUPE_KINDS = (schema.CPU_SPAN, schema.GC)
PROFKIT_SOURCE = "profkit"  # the span-file reader's source name
PROFKIT_DOMAIN = "profkit"  # profkit's NVTX domain (profkit.instrument.nvtx_ranges.DOMAIN): nsys category
TOL_NS = 200_000  # 200 µs: 2x the largest disagreement measured between copies of one span (100 µs)
TOL_FRACTION = 0.02  # of the shorter copy's duration, when larger than TOL_NS


def normalize_name(name: str) -> str:
    """The name spans are compared by: surrounding blanks dropped (case and dots kept)."""
    return name.strip()


def names_match(a: str, b: str) -> bool:
    """Same name, or one is the other's qualname suffix at a ``.`` boundary."""
    a, b = normalize_name(a), normalize_name(b)
    return a == b or a.endswith("." + b) or b.endswith("." + a)


def _leaf(name: str) -> str:
    return normalize_name(name).rsplit(".", 1)[-1]


def stream_preference(source: str, category: str) -> tuple[int, str, str]:
    """Sort key of a (source, category) stream: lower is kept."""
    tier = 0 if source == PROFKIT_SOURCE else 1 if category == PROFKIT_DOMAIN else 2
    return tier, source, category


def drop_duplicate_spans(
    events: pd.DataFrame, tol_ns: int = TOL_NS, tol_fraction: float = TOL_FRACTION
) -> tuple[pd.DataFrame, dict[tuple[int, str], int]]:
    """``events`` without the extra copies of host spans seen by several sources of one rank.

    Returns the kept rows (original order and index; ``events`` itself when nothing is dropped)
    and ``{(rank, source): dropped}`` (non-zero counts only) for a warning line. Pure: ``events``
    is not modified. ``tol_ns`` / ``tol_fraction``: see the module docstring.
    """
    if events.empty:
        return events, {}
    host = distinct.isin(events["kind"], DEDUPE_KINDS)
    for col in ("name", "rank", "source", "start_ns", "end_ns"):
        valid = present(events[col])
        if valid is not None:
            host &= valid
    pos = np.flatnonzero(host)
    if len(pos) < 2 or _one_stream(events, pos):
        return events, {}
    rank = events["rank"].to_numpy(dtype=np.int64)[pos]
    start = events["start_ns"].to_numpy(dtype=np.int64)[pos]
    end = events["end_ns"].to_numpy(dtype=np.int64)[pos]

    # streams (source, category) and their preference order
    src_codes, src_uni = _codes_at(events["source"], pos)
    cat_codes, cat_uni = _codes_at(events["category"], pos, missing="")
    pair_codes, pair_uni = pd.factorize(src_codes.astype(np.int64) * len(cat_uni) + cat_codes)
    streams = [(str(src_uni[c // len(cat_uni)]), str(cat_uni[c % len(cat_uni)])) for c in pair_uni]
    if len(streams) < 2:
        return events, {}
    order = sorted(range(len(streams)), key=lambda i: stream_preference(*streams[i]))
    pref_of_stream = np.empty(len(streams), dtype=np.int64)
    pref_of_stream[order] = np.arange(len(streams))
    pref = pref_of_stream[pair_codes]
    is_profkit_file = (np.asarray(src_uni, dtype=object) == PROFKIT_SOURCE)[src_codes]

    # names: leaf (the group key) and which name pairs are compatible, on the unique names only
    name_codes, name_uni = _codes_at(events["name"], pos)
    leaves = [_leaf(n) for n in name_uni]
    leaf_codes, _ = pd.factorize(np.asarray(leaves, dtype=object))
    group = rank * (int(leaf_codes.max()) + 1) + leaf_codes[name_codes]  # (rank, leaf)
    by_leaf: dict[int, list[int]] = {}
    for code, lc in enumerate(leaf_codes):
        by_leaf.setdefault(int(lc), []).append(code)
    n_names = len(name_uni)
    ok_pairs = [a * n_names + b for members in by_leaf.values() if len(members) > 1
                for a in members for b in members if a != b and names_match(name_uni[a], name_uni[b])]
    ok_pairs = np.asarray(sorted(ok_pairs), dtype=np.int64)

    # each (rank, source)'s recording window over host spans, for copies cut at its edges
    rs = rank * len(src_uni) + src_codes
    rs_codes, _ = pd.factorize(rs)
    win_lo = np.full(rs_codes.max() + 1, np.iinfo(np.int64).max)
    win_hi = np.full(rs_codes.max() + 1, np.iinfo(np.int64).min)
    np.minimum.at(win_lo, rs_codes, start)
    np.maximum.at(win_hi, rs_codes, end)

    dur = end - start
    reach = np.maximum(tol_ns, (tol_fraction * dur).astype(np.int64))  # a span's largest tolerance
    drop = np.zeros(pos.size, dtype=bool)
    for edge in (start, end):  # pairs close in start (whole or cut at the end), then close in end
        a, b = _near_pairs(group, edge, reach)
        if len(a):
            _judge(a, b, start, end, dur, pref, pair_codes, is_profkit_file, name_codes, n_names, ok_pairs,
                   rs_codes, win_lo, win_hi, tol_ns, tol_fraction, drop)

    if not drop.any():
        return events, {}
    counts = pd.Series(1, index=pd.MultiIndex.from_arrays([rank[drop], src_codes[drop]])).groupby(level=[0, 1]).sum()
    dropped = {(int(r), str(src_uni[s])): int(n) for (r, s), n in counts.items()}
    keep = np.ones(len(events), dtype=bool)
    keep[pos[drop]] = False
    return events.iloc[keep], dropped


def _codes_at(values: pd.Series, pos: np.ndarray, missing: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize`` of the strings at ``pos`` (numbered in order of first appearance; a
    missing value spelled ``missing``, which ``pos`` has none of where it is None), read off the
    whole column's codes (``distinct.codes``) instead of taking those rows' strings: a rank of
    two sources has ~100k host spans, whose rows and strings took ~20 ms to take and factorize."""
    codes, uniques = distinct.codes(values)
    at = codes[pos]
    if missing is not None and (at < 0).any():
        same = np.flatnonzero(uniques == missing)
        if same.size:
            at = np.where(at < 0, same[0], at)
        else:
            uniques = np.append(uniques, np.array([missing], dtype=object))
            at = np.where(at < 0, uniques.size - 1, at)
    local, seen = distinct.first_appearance(at, uniques.size)
    return local, np.asarray(uniques[seen], dtype=object)


def _one_stream(events: pd.DataFrame, pos: np.ndarray) -> bool:
    """Whether the host spans at ``pos`` all come from one (source, category) stream (a missing
    category is ""): nothing to compare, the common case of one profiler trace per rank. Read
    off the columns' codes, without taking the rows."""
    src, _ = distinct.codes(events["source"])
    cat, names = distinct.codes(events["category"])
    src, cat = src[pos], cat[pos]
    if src.min() != src.max():
        return False
    empty = np.flatnonzero(names == "")
    cat = np.where(cat < 0, empty[0] if empty.size else -1, cat)
    return bool(cat.min() == cat.max())


def _near_pairs(group: np.ndarray, edge: np.ndarray, reach: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (i, j) of one group with ``edge[i] <= edge[j] <= edge[i] + reach[i]``.

    Sort by (group, edge); each span's window ends where its group's sorted edges pass
    ``edge + reach`` (found for all spans at once by sorting the queries among the edges), and
    the pairs are the windows expanded with ``np.repeat``: no Python loop over spans or groups.
    """
    n = len(edge)
    idx = np.lexsort((edge, group))
    g_group, g_edge = group[idx], edge[idx]
    q = g_edge + reach[idx]
    # queries sorted among the edges (after the edges equal to them): the number of edges
    # before each query is the exclusive end of its window
    is_query = np.r_[np.zeros(n, dtype=bool), np.ones(n, dtype=bool)]
    order = np.lexsort((is_query, np.r_[g_edge, q], np.r_[g_group, g_group]))
    q_sorted = is_query[order]
    hi = np.empty(n, dtype=np.int64)
    hi[order[q_sorted] - n] = np.cumsum(~q_sorted)[q_sorted]
    count = np.maximum(hi - np.arange(n) - 1, 0)
    if not count.any():
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    first = np.repeat(np.arange(n), count)
    step = np.arange(len(first)) - np.repeat(np.cumsum(count) - count, count) + 1
    return idx[first], idx[first + step]


def _judge(a, b, start, end, dur, pref, stream, profkit_file, name_codes, n_names, ok_pairs, rs, win_lo, win_hi,
           tol_ns, tol_fraction, drop) -> None:
    """Mark the less preferred of each duplicate pair (a[i], b[i]) in ``drop``."""
    eligible = (stream[a] != stream[b]) & ~(profkit_file[a] & profkit_file[b])
    same = name_codes[a] == name_codes[b]
    other = eligible & ~same
    if other.any():  # names differ: allowed when one is the other's qualname suffix
        same[other] = np.isin(name_codes[a[other]] * n_names + name_codes[b[other]], ok_pairs)
    eligible &= same
    a, b = a[eligible], b[eligible]
    if not len(a):
        return
    # keep: the more preferred copy (k); lose: the other (d)
    a_first = pref[a] < pref[b]
    k, d = np.where(a_first, a, b), np.where(a_first, b, a)
    tol = np.maximum(tol_ns, (tol_fraction * np.minimum(dur[k], dur[d])).astype(np.int64))
    same_start = np.abs(start[k] - start[d]) <= tol
    same_end = np.abs(end[k] - end[d]) <= tol
    cut_end = same_start & (end[d] >= win_hi[rs[d]] - tol) & (end[k] > end[d] + tol)
    cut_start = same_end & (start[d] <= win_lo[rs[d]] + tol) & (start[k] < start[d] - tol)
    dup = (same_start & same_end) | cut_end | cut_start
    drop[d[dup]] = True
