"""Sync points: where a rank's host blocks until the other ranks arrive, found from evidence.

Why: a slow rank's victims wait at the next sync point, and that wait must be charged as
``waiting for rank k``, never as the span they waited in. profkit's verdicts were right on
programs whose span names it knew (``sync_dp_padding``) and wrong on others (a user's
``record_function("dp_padding_allreduce")`` around the same Gloo all-reduce became the victim's
"top cause"). So a host span is recognized as a synchronizing call from what the trace shows,
never from its name alone:

- ``collective_op``: it holds a host-blocking collective op on its thread (``c10d::allreduce_``
  and friends, ``record_param_comms`` with a collective, on a group that runs no GPU kernel: a
  Gloo / CPU group); ``gloo_span``: a Gloo worker thread ran the collective (``gloo:all_reduce``);
- ``blocking_call`` (nsys with ``osrt``): blocking OS calls (``pthread_cond_wait``, futex, poll,
  ``epoll_wait``, recv, ``sem_wait``, ...) cover most of its time on some rank;
- ``aligned_ends``: across ranks, the ends of its instances line up while their starts spread
  (the signature of a barrier), and it holds no collective of its own (the innermost such span);
- ``name``: the names of vLLM's and profkit's own DP-sync hooks (``sync_dp_padding``, ...) and
  the ``dp_sync`` category: extra evidence, never required.

One instance per host-blocking collective and rank (overlapping members of one process are one
instance), with (``collectives.instances.INSTANCE_COLUMNS``):

- ``span_start_ns`` / ``span_name``: the sync span (the span recognized, or the innermost span
  enclosing the collective op) on the calling thread;
- ``arrive_ns``: the rank's own part done, it entered the blocking part: the collective op's
  start, else the longest blocking OS call's start, else the span's start. ``start_ns`` is the
  same moment (the arrival the straggler analysis reads);
- ``exit_ns``: the calling thread was released: the first host event on that thread after the
  op returned (Gloo's ``c10d::allreduce_`` returns at once and the wait is in ``work.wait()``,
  which the profiler does not record), capped at the sync span's end; the span's end otherwise;
- ``end_ns``: the best estimate of the common exit (the Gloo worker span's end, else ``exit_ns``),
  which clock alignment fits to.

``[arrive_ns, exit_ns)`` is time in the collective: ``wait:<name>`` until the instance is matched
across ranks, then ``waiting for rank k`` (k the last arriver) or, on the last arriver itself,
``transfer:<name>``: everywhere (charged GPU-idle time, the straggler phases, lateness, episodes).

Per-rank facts for the cross-rank evidence (``span_facts``) are small: name summaries and a block
of span ends per name, reduced by ``decide_sync_names``. ``profkit.analyze.sync_table`` turns the
matched instances into the one table per capture the rest reads (``OUT/sync_points.csv``).
Pure functions over event tables (int64 ns); no file access.
"""
from __future__ import annotations

import contextlib
import functools
import re

import numpy as np
import pandas as pd
import pyarrow as pa

from profkit import distinct, schema
from profkit.ingest.collectives import normalize_coll_name
from profkit.layers import innermost, make_layer
from profkit.names import POLL_RE, SYNC_RE

# ---- evidence ----------------------------------------------------------------------------------
COLLECTIVE_OP = "collective_op"
GLOO_SPAN = "gloo_span"
BLOCKING_CALL = "blocking_call"
ALIGNED_ENDS = "aligned_ends"
NAME = "name"
COLLECTIVE_KERNEL = "collective_kernel"
COLLECTIVE_LAUNCH = "collective_launch"

# torch.distributed's dispatcher ops of collectives (point-to-point send/recv are not sync points)
COLL_OP_RE = re.compile(
    r"^c10d::(?:allreduce_|allreduce_coalesced_|allgather_|_allgather_base_|allgather_coalesced_"
    r"|allgather_into_tensor_coalesced_|reduce_scatter_|_reduce_scatter_base_|reduce_scatter_tensor_coalesced_"
    r"|alltoall_|alltoall_base_|broadcast_|reduce_|gather_|scatter_|barrier|monitored_barrier_)$"
)
GLOO_RE = re.compile(r"^gloo:(\w+)$")
# OS calls a thread blocks in while another party has to act (osrt names, nsys). Sleeps are not
# here: a sleeping rank is doing its own (idle) work, not waiting for the others.
BLOCKING_CALL_RE = re.compile(
    r"^(?:pthread_cond_(?:timed|clock)?wait|futex|syscall_futex|__futex\w*|poll|ppoll|epoll_p?wait|select|pselect6?"
    r"|recv|recvfrom|recvmsg|read|sem_(?:timed|clock)?wait|pthread_barrier_wait|pthread_join)(?:@\S*)?$"
)
# Names as extra evidence: vLLM's DP-sync hook targets (profkit's hook names), the bundled
# engine's and the simulator's DP all-reduce, and plain barriers. Never required.
NAME_SYNC_RE = re.compile(
    r"(?:^|[.:])(?:sync_dp_padding|coordinate_batch_across_dp|_run_ar|dispatch_cg_and_sync_dp"
    r"|sync_cudagraph_and_dp_padding|cpu_all_reduce_|dp_allreduce|_has_global_unfinished_reqs"
    r"|has_unfinished_dp|sync_dp_state)$|(?:^|[^a-z])barrier$",
    re.I,
)
DP_SYNC_CATEGORY = "dp_sync"
UNKNOWN_COLL = "sync"  # coll_name of a sync span whose collective the trace does not show

# Cross-rank evidence thresholds (``decide_sync_names``)
BLOCKED_SHARE = 0.5  # blocking OS calls cover at least half of a span's time on some rank
MIN_INSTANCES = 3  # per rank, for a name to be judged at all
SAMPLE_PER_NAME = 64  # span ends per name and rank sent to the driver (a central block)
END_TOL_NS = 1_000_000  # ends "line up": within 1 ms (Gloo DP-sync ends spread up to ~0.6 ms measured)
MATCHED_SHARE = 0.8  # ... for at least this share of the instances paired with the lowest rank ...
SPREAD_RATIO = 4.0  # ... while starts spread at least 4x the typical end spread ...
MIN_START_SPREAD_NS = 500_000  # ... and at least 0.5 ms ...
MIN_SPREAD_SHARE = 0.1  # ... in at least a tenth of the instances (and 3), where the ends spread
# at most a quarter of what the starts do (median over those instances)
MAX_SAMPLE_RANKS = 16  # ranks compared per name (the lowest one against up to 15 others)

FACT_COLUMNS = ["rank", "name", "n", "total_ns", "blocked_ns", "with_collective"]
SAMPLE_COLUMNS = ["rank", "name", "start_ns", "end_ns"]

_HOST_EVENT_KINDS = (schema.CPU_OP, schema.CPU_SPAN, schema.RUNTIME, schema.GC)  # "the thread did something"
_NCCL_PREFIX_RE = re.compile(r"^(?:nccl|rccl)", re.IGNORECASE)
_LIBRARY_RE = re.compile(r"^(?:gloo:|nccl|rccl|c10d::|record_param_comms|ProfilerStep#|cuda|cu[A-Z]|aten::)", re.I)


def is_name_evidence(names: pd.Series, categories: pd.Series) -> np.ndarray:
    n = names.astype("string").fillna("")
    return n.str.contains(NAME_SYNC_RE).to_numpy(dtype=bool) | (
        categories.astype("string").fillna("") == DP_SYNC_CATEGORY).to_numpy(dtype=bool)


@functools.lru_cache(maxsize=4096)  # asked per collective row; a trace names a few collectives
def op_coll_name(name: str) -> str:
    """``c10d::allreduce_`` -> ``all_reduce`` (ingest's vocabulary)."""
    base = str(name).split("::", 1)[-1].strip("_")
    return normalize_coll_name(base) or base or UNKNOWN_COLL


@functools.lru_cache(maxsize=4096)
def _gloo_coll_name(name: str) -> str:
    """``gloo:allreduce`` -> ``all_reduce``."""
    op = GLOO_RE.match(name).group(1)
    return normalize_coll_name(op) or op


# ---- per rank: host-blocking collectives -----------------------------------------------------
def host_sync_rows(events: pd.DataFrame, host_rows: np.ndarray, op_labels,
                   sync_names: dict[str, str] | None = None) -> pd.DataFrame:
    """Candidate rows (``collectives`` format plus the sync columns) of every host-blocking
    collective in ``events`` (any number of ranks).

    ``host_rows``: positions of the cpu_op / cpu_span rows in ``events``;
    ``op_labels``: index labels of the collective ops that run no GPU kernel (decided by the caller);
    ``sync_names``: span names recognized across ranks (``decide_sync_names``: name -> evidence).
    Names and categories are tested once per distinct value (``column_codes``).
    """
    sync_names = sync_names or {}
    host_rows = np.asarray(host_rows, np.int64)
    name_c, name_u = column_codes(events, "name")
    hn = name_c[host_rows]
    is_op = events.index[host_rows].isin(pd.Index(op_labels))
    gloo = distinct.regex_flags(name_u, hn, GLOO_RE)
    kind_c, kind_u = column_codes(events, "kind")
    span_kind = distinct.codes_in(kind_u, kind_c[host_rows], schema.CPU_SPAN)
    cat_c, cat_u = column_codes(events, "category")
    by_name = distinct.regex_flags(name_u, hn, NAME_SYNC_RE, "search") | distinct.codes_in(
        cat_u, cat_c[host_rows], DP_SYNC_CATEGORY, missing="")
    cross = distinct.codes_in(name_u, hn, sync_names, missing="") if sync_names \
        else np.zeros(host_rows.size, bool)
    named = span_kind & ~gloo & ~is_op & (by_name | cross)
    if not (is_op.any() or gloo.any() or named.any()):
        return pd.DataFrame()
    ctx = _thread_context(events)
    members = []
    if is_op.any():
        members.append(_op_members(events, host_rows[is_op], ctx))
    if gloo.any():
        members.append(_plain_members(_base_at(events, host_rows[gloo]), GLOO_SPAN, calling=False))
    if named.any():
        named_names = np.array(list(name_u) + [""], dtype=object)[np.where(hn[named] < 0, len(name_u), hn[named])]
        ev = np.where(cross[named], [sync_names.get(n, NAME) for n in named_names], NAME)
        ev = np.where(by_name[named] & cross[named], [f"{NAME}+{e}" if e != NAME else e for e in ev], ev)
        members.append(_span_members(events, host_rows[named], ev, ctx))
    members = [m for m in members if m["rank"].size]
    return _clusters({c: np.concatenate([m[c] for m in members]) for c in members[0]})


HOST_COLUMNS = ("rank", "kind", "name", "category", "start_ns", "end_ns", "pid", "tid", "coll_name", "coll_group",
                "coll_seq")


class _ThreadContext:
    """Per thread: host events (what the thread did next), cpu spans (enclosing span), blocking
    OS calls (where it waited). Built lazily, once per thread asked about."""

    def __init__(self, events: pd.DataFrame):
        # kinds and names as codes of the whole columns (taking rows of string columns is the slow
        # part); a missing name is ""
        kind_codes, kind_uniques = column_codes(events, "kind")
        kind_u = np.array(list(kind_uniques) + [""], dtype=object)
        kind_all = np.where(kind_codes < 0, len(kind_u) - 1, kind_codes)
        keep = np.isin(kind_u, list(_HOST_EVENT_KINDS + (schema.OSRT,)))[kind_all] & events["tid"].notna().to_numpy(bool)
        # the kept rows of the numeric columns, as numpy (no frame taken)
        ev = {c: column_ints(events, c)[0][keep] for c in ("rank", "pid", "tid")}  # shared with the members
        self.key = _thread_key(ev)
        ev["start_ns"], ev["end_ns"] = (events[c].to_numpy(np.int64)[keep] for c in ("start_ns", "end_ns"))
        kind_codes = kind_all[keep]

        def is_kind(*kinds: str) -> np.ndarray:
            return np.isin(kind_u, list(kinds))[kind_codes]
        codes, uniques = column_codes(events, "name")
        uniques = pd.Series(np.array(list(uniques) + [""], dtype=object), dtype=object)
        self.names = uniques.to_numpy(dtype=object)
        codes = codes[keep]
        self.name = np.where(codes < 0, len(uniques) - 1, codes)
        # per unique name, once: a Gloo worker span, a blocking OS call name
        every = np.arange(len(uniques))
        gloo = distinct.regex_flags(self.names, every, GLOO_RE)
        block = distinct.regex_flags(self.names, every, BLOCKING_CALL_RE)
        self.act = is_kind(*_HOST_EVENT_KINDS)
        self.span = is_kind(schema.CPU_SPAN) & ~gloo[self.name] if keep.any() else np.zeros(0, bool)
        self.block = is_kind(schema.OSRT) & block[self.name] if keep.any() else np.zeros(0, bool)
        self.start = ev["start_ns"]
        self.end = ev["end_ns"]
        order = np.lexsort((self.start, self.key))
        self.key, self.name, self.start, self.end, self.act, self.span, self.block = (
            a[order] for a in (self.key, self.name, self.start, self.end, self.act, self.span, self.block))
        first = np.flatnonzero(np.r_[True, self.key[1:] != self.key[:-1]]) if self.key.size else np.empty(0, np.int64)
        last = np.r_[first[1:], self.key.size]
        self.bounds = {int(self.key[a]): (int(a), int(b)) for a, b in zip(first, last)}
        self._cache: dict[int, dict] = {}

    def thread(self, key: int) -> dict:
        got = self._cache.get(key)
        if got is not None:
            return got
        a, b = self.bounds.get(key, (0, 0))
        name, start, end = self.name[a:b], self.start[a:b], self.end[a:b]
        act, span, block = self.act[a:b], self.span[a:b], self.block[a:b]
        got = {
            "act_starts": start[act],  # sorted: the rows are in (thread, start) order
            "spans": make_layer(start[span], end[span], name[span]),
            "block_s": start[block], "block_e": end[block],
        }
        self._cache[key] = got
        return got

    def enclosing(self, key: int, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Innermost cpu span on the thread containing each [s, e]: (start, end, name); -1 / None if none."""
        th = self.thread(key)
        layer = th["spans"]
        j = innermost(layer, s)
        for _ in range(64):  # climb to a span that also holds e
            bad = (j >= 0) & (layer.ends[np.maximum(j, 0)] < e)
            if not bad.any():
                break
            j = np.where(bad, layer.parent[np.maximum(j, 0)], j)
        ok = j >= 0
        js = np.maximum(j, 0)
        starts = np.where(ok, layer.starts[js] if layer.size else 0, -1)
        ends = np.where(ok, layer.ends[js] if layer.size else 0, -1)
        nm = np.where(ok, self.names[layer.codes[js]], None).astype(object) if layer.size \
            else np.full(s.size, None, dtype=object)
        return starts.astype(np.int64), ends.astype(np.int64), nm

    def next_activity(self, key: int, t: np.ndarray) -> np.ndarray:
        """Start of the first host event on the thread starting at or after each t (max int64 if none)."""
        starts = self.thread(key)["act_starts"]
        i = np.searchsorted(starts, t, side="left")
        return np.where(i < starts.size, starts[np.minimum(i, max(starts.size - 1, 0))] if starts.size else 0,
                        np.iinfo(np.int64).max).astype(np.int64)

    def longest_block(self, key: int, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per window [s, e): start of the longest blocking call inside (-1 if none) and the
        blocked time inside (calls clipped to the window)."""
        th = self.thread(key)
        bs, be = th["block_s"], th["block_e"]
        first = np.full(s.size, -1, np.int64)
        blocked = np.zeros(s.size, np.int64)
        if not bs.size:
            return first, blocked
        order = np.argsort(bs, kind="stable")
        bs, be = bs[order], be[order]
        lo = np.searchsorted(bs, s, side="left")
        hi = np.searchsorted(bs, e, side="left")
        for i in np.flatnonzero(hi > lo):
            cs, ce = bs[lo[i]:hi[i]], np.minimum(be[lo[i]:hi[i]], e[i])
            d = ce - cs
            first[i] = cs[int(np.argmax(d))]
            blocked[i] = int(np.clip(d, 0, None).sum())
        return first, blocked


class _Shared:
    """What the per-rank functions of one frame share inside ``shared_context``: the thread
    context (the string columns' codes are shared by ``distinct.codes`` while the frame lives)."""

    def __init__(self, events: pd.DataFrame):
        self.events = events
        self.ctx: _ThreadContext | None = None
        self.ints: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # ``column_ints``


_SHARED: list[_Shared] = []  # one per open ``shared_context`` block


@contextlib.contextmanager
def shared_context(events: pd.DataFrame):
    """Inside this block, ``host_sync_rows`` and ``span_facts`` of this very ``events`` frame share
    one ``_ThreadContext`` (the per-thread arrays of a rank, built once instead of twice in the
    scale path's prepare task). The frame must not change inside the block."""
    _SHARED.append(_Shared(events))
    try:
        yield
    finally:
        _SHARED.pop()


@contextlib.contextmanager
def sharing(events: pd.DataFrame):
    """``shared_context(events)`` unless a block of this very frame is already open (then that one)."""
    if _SHARED and _SHARED[-1].events is events:
        yield
    else:
        with shared_context(events):
            yield


def _thread_context(events: pd.DataFrame) -> _ThreadContext:
    """``_ThreadContext(events)``, built once per ``shared_context`` block of that frame."""
    if _SHARED and _SHARED[-1].events is events:
        if _SHARED[-1].ctx is None:
            _SHARED[-1].ctx = _ThreadContext(events)
        return _SHARED[-1].ctx
    return _ThreadContext(events)


def column_codes(events: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """A string column as (codes: int64 per row, -1 where missing; distinct values: an object
    array of Python strings), factorized once while the column lives (``distinct.codes``).
    Why: tests and takes of the strings of hundreds of thousands of rows cost more than all the
    rest; the distinct values are a few hundred."""
    return distinct.codes(events[col])


def column_ints(events: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """An integer column as (int64 values, -1 where missing; where missing), converted once per
    ``shared_context`` block of the frame. Why: a rank's collective rows are taken a few hundred
    at a time, several times, and pandas' fixed cost per take and ``astype`` of a frame's rows was
    most of the time of a rank of a few thousand events."""
    shared = _SHARED[-1] if _SHARED and _SHARED[-1].events is events else None
    got = shared.ints.get(col) if shared is not None else None
    if got is None:
        values = events[col]
        got = (values.to_numpy(np.int64, na_value=-1), values.isna().to_numpy(bool))
        if shared is not None:
            shared.ints[col] = got
    return got


def _is_text(values: pd.Series) -> bool:
    """A column of strings (Arrow or pandas string dtype): its ``column_codes`` values are its values."""
    dtype = values.dtype
    return isinstance(dtype, pd.StringDtype) or (
        isinstance(dtype, pd.ArrowDtype) and pa.types.is_string(dtype.pyarrow_dtype))


def texts_at(events: pd.DataFrame, col: str, rows: np.ndarray) -> np.ndarray:
    """``events[col].iloc[rows].astype(object).where(notna, None)`` as an object array, from the
    column's codes (the strings are not taken row by row)."""
    if not _is_text(events[col]):
        got = events[col].iloc[rows]
        return got.astype(object).where(got.notna(), None).to_numpy(dtype=object)
    codes, uniques = column_codes(events, col)
    values = np.empty(len(uniques) + 1, dtype=object)
    values[:-1] = uniques
    values[-1] = None
    c = codes[rows]
    return values[np.where(c < 0, len(uniques), c)]


def _names_at(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """``events["name"].iloc[rows].astype(str)`` as an object array (a missing name as
    ``astype(str)`` makes it, which depends on the dtype: taken as it is then)."""
    codes, uniques = column_codes(events, "name")
    c = codes[rows]
    if (c < 0).any() or not _is_text(events["name"]):
        return events["name"].iloc[rows].astype(str).to_numpy(dtype=object)
    return uniques[c]


def code_flags(uniques: np.ndarray, codes: np.ndarray, test, missing: str | None = "",
               as_string: bool = False) -> np.ndarray:
    """``test`` (a Series of strings -> bools) of each row's value, run once per distinct value:
    a missing value is tested as ``missing`` ("" by default; None: False). ``as_string``: test
    a ``string`` Series (as ``col.astype("string").fillna("")`` did), else an object one."""
    extra = [missing] if missing is not None else []
    distinct = pd.Series(np.array(list(uniques) + extra, dtype=object), dtype=object)
    if as_string:
        distinct = distinct.astype("string")
    flags = np.asarray(test(distinct), dtype=bool) if len(distinct) else np.zeros(0, bool)
    flags = np.r_[flags, False] if missing is None else flags
    return flags[np.where(codes < 0, len(uniques), codes)] if codes.size else np.zeros(0, bool)


def _thread_key(df: pd.DataFrame | dict[str, np.ndarray]) -> np.ndarray:
    """One int64 per (rank, pid, tid), the same in every frame (a hash: no bits to run out of).
    ``df``: a frame, or a dict of int64 arrays (missing ids already -1). The values are pandas'
    ``hash_pandas_object`` of the three columns (``_row_hash``)."""
    if isinstance(df, dict):
        return _row_hash([np.asarray(df[c], np.int64) for c in ("rank", "pid", "tid")])
    n = len(df)
    return _row_hash([df["rank"].to_numpy(np.int64, na_value=-1) if "rank" in df else np.zeros(n, np.int64),
                      df["pid"].to_numpy(np.int64, na_value=-1), df["tid"].to_numpy(np.int64, na_value=-1)])


_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _mixed(values: np.ndarray) -> np.ndarray:
    """pandas' hash of each int64 (``hashing._hash_ndarray``: its bits through splitmix64's finalizer)."""
    h = values.view(np.uint64).copy()
    h ^= h >> np.uint64(30)
    h *= _MIX[0]
    h ^= h >> np.uint64(27)
    h *= _MIX[1]
    h ^= h >> np.uint64(31)
    return h


def _row_hash(columns: list[np.ndarray]) -> np.ndarray:
    """``pd.util.hash_pandas_object(pd.DataFrame(columns), index=False)`` of int64 columns, as int64
    (``hashing.combine_hash_arrays`` over the columns' hashes), without the frame and its copies;
    a column of one value (a rank's own frame: one rank, most often one pid) hashed once. In a
    rank's read task this was ~15 ms a call, several calls a rank."""
    n = len(columns[0]) if columns else 0
    out = np.full(n, 0x345678, np.uint64)
    mult = np.uint64(1000003)
    for i, col in enumerate(columns):
        if n and col[0] == col.min() == col.max():
            out ^= _mixed(col[:1])[0]
        else:
            out ^= _mixed(col)
        out *= mult
        inverse = len(columns) - i
        mult += np.uint64(82520 + inverse + inverse)
    out += np.uint64(97531)
    return out.view(np.int64)


def _base_at(events: pd.DataFrame, rows: np.ndarray) -> dict:
    """The member columns of the rows at positions ``rows``, as arrays (ids: -1 where missing)."""
    base = {c: column_ints(events, col)[0][rows] for c, col in (
        ("rank", "rank"), ("pid", "pid"), ("tid", "tid"), ("start", "start_ns"), ("end", "end_ns"), ("seq", "coll_seq"))}
    base["name"] = _names_at(events, rows)
    base["group"] = texts_at(events, "coll_group", rows)
    base["coll"] = texts_at(events, "coll_name", rows)
    return base


def _thread_sorted(events: pd.DataFrame, rows: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray]:
    """``_base_at`` of ``rows`` in the order of (rank, pid, tid, start, end descending), missing
    ids last (as a stable ``sort_values`` orders them); the order; the rows' thread keys."""
    b = _base_at(events, rows)
    big = np.iinfo(np.int64).max
    pid = np.where(column_ints(events, "pid")[1][rows], big, b["pid"])
    tid = np.where(column_ints(events, "tid")[1][rows], big, b["tid"])
    order = np.lexsort((-b["end"], b["start"], tid, pid, b["rank"]))  # stable
    b = {c: v[order] for c, v in b.items()}
    return b, order, _thread_key(b)


def _op_members(events: pd.DataFrame, rows: np.ndarray, ctx: _ThreadContext) -> dict:
    """Host-blocking collective ops (the outermost on their thread): arrive at the op's start,
    released at the thread's next activity after the op returned (capped by the enclosing span)."""
    b, _, key = _thread_sorted(events, rows)
    end = b["end"]
    same = np.r_[False, key[1:] == key[:-1]]
    block = np.cumsum(~same)
    run_end = pd.Series(end).groupby(block).cummax().to_numpy()
    nested = same & (end <= np.r_[0, run_end[:-1]])
    b, key = {c: v[~nested] for c, v in b.items()}, key[~nested]
    n = key.size
    exit_ = b["end"].copy()
    span_s = np.full(n, -1, np.int64)
    span_n = np.full(n, None, dtype=object)
    for k in np.unique(key):
        m = key == k
        es, ee, en = ctx.enclosing(int(k), b["start"][m], b["end"][m])
        nxt = ctx.next_activity(int(k), b["end"][m])
        cap = np.where(es >= 0, ee, np.iinfo(np.int64).max)
        rel = np.minimum(nxt, cap)
        exit_[m] = np.where(rel == np.iinfo(np.int64).max, b["end"][m], np.maximum(rel, b["end"][m]))
        span_s[m], span_n[m] = es, en
    coll = np.array([c if c is not None else op_coll_name(nm) for c, nm in zip(b["coll"], b["name"])], dtype=object)
    return _member_frame(b, COLLECTIVE_OP, region_start=b["start"], region_end=exit_, arrive=b["start"],
                         exit_=exit_, common_end=np.full(n, -1, np.int64), span_start=span_s, span_name=span_n,
                         coll=coll, calling=True, prio=1)


def _plain_members(b: dict, evidence: str, calling: bool) -> dict:
    """Gloo worker spans: their start is when the worker took the work (close to the arrival),
    their end the common exit (the most exact end)."""
    coll = np.array([_gloo_coll_name(nm) for nm in b["name"]], dtype=object)
    n = b["rank"].size
    return _member_frame(b, evidence, region_start=b["start"], region_end=b["end"], arrive=np.full(n, -1, np.int64),
                         exit_=np.full(n, -1, np.int64), common_end=b["end"], span_start=np.full(n, -1, np.int64),
                         span_name=np.full(n, None, dtype=object), coll=coll, calling=calling, prio=0)


def _span_members(events: pd.DataFrame, rows: np.ndarray, evidence: np.ndarray, ctx: _ThreadContext) -> dict:
    """Sync spans recognized by name or cross-rank evidence: the innermost on each thread.
    Arrival: the longest blocking OS call inside, else the span's start; released at its end."""
    b, order, key = _thread_sorted(events, rows)
    evidence = np.asarray(evidence, dtype=object)[order]
    s, e = b["start"], b["end"]
    # drop a span that holds another recognized span of its thread: the innermost is the sync point
    nxt_same = np.r_[key[1:] == key[:-1], False]
    holds = nxt_same & (np.r_[s[1:], 0] >= s) & (np.r_[e[1:], 0] <= e)
    b, key, evidence = {c: v[~holds] for c, v in b.items()}, key[~holds], evidence[~holds]
    n = key.size
    arrive = b["start"].copy()
    for k in np.unique(key):
        m = key == k
        first, _ = ctx.longest_block(int(k), b["start"][m], b["end"][m])
        arrive[m] = np.where(first >= 0, first, b["start"][m])
    coll = np.array([c if c is not None else ("all_reduce" if NAME_SYNC_RE.search(nm) and "barrier" not in nm.lower()
                                              else ("barrier" if "barrier" in nm.lower() else UNKNOWN_COLL))
                     for c, nm in zip(b["coll"], b["name"])], dtype=object)
    return _member_frame(b, evidence, region_start=b["start"], region_end=b["end"],
                         arrive=arrive, exit_=b["end"], common_end=np.full(n, -1, np.int64), span_start=b["start"],
                         span_name=b["name"], coll=coll, calling=True, prio=2)


def _member_frame(b: dict, evidence, *, region_start, region_end, arrive, exit_, common_end, span_start, span_name,
                  coll, calling: bool, prio: int) -> dict:
    """The members' columns (``_clusters`` reads them), as arrays."""
    n = b["rank"].size
    return {
        "rank": b["rank"], "pid": b["pid"], "tid": b["tid"], "name": np.asarray(b["name"], dtype=object),
        "group": b["group"], "seq": b["seq"], "coll": coll,
        "evidence": evidence if isinstance(evidence, np.ndarray) else np.full(n, evidence, dtype=object),
        "r_start": np.asarray(region_start, np.int64), "r_end": np.asarray(region_end, np.int64),
        "arrive": np.asarray(arrive, np.int64), "exit": np.asarray(exit_, np.int64),
        "common_end": np.asarray(common_end, np.int64), "span_start": np.asarray(span_start, np.int64),
        "span_name": np.asarray(span_name, dtype=object), "calling": np.full(n, calling), "prio": np.full(n, prio, np.int64),
        "op_start": b["start"] if prio == 1 else np.full(n, -1, np.int64),
    }


def _clusters(m: dict[str, np.ndarray]) -> pd.DataFrame:
    """Overlapping members of one process are one instance (candidate rows, see module docstring).

    Per block of overlapping members, with array operations (a few thousand members per rank:
    pandas' per-call cost of tens of grouped operations was most of the time): the block's first
    member in each of several orders, and min / max of the members' times that are set (>= 0)."""
    order = np.lexsort((-m["r_end"].astype(np.int64), m["r_start"].astype(np.int64),
                        m["pid"].astype(np.int64), m["rank"].astype(np.int64)))  # stable
    col = {c: np.asarray(v, dtype=object if c in _MEMBER_TEXT else None)[order] for c, v in m.items()}
    proc = col["rank"].astype(np.int64) * (1 << 32) + (col["pid"].astype(np.int64) & 0xFFFFFFFF)
    s, e = col["r_start"].astype(np.int64), col["r_end"].astype(np.int64)
    new = np.r_[True, proc[1:] != proc[:-1]]
    run_end = pd.Series(e).groupby(np.cumsum(new)).cummax().to_numpy()
    new |= np.r_[False, s[1:] > run_end[:-1]]
    block = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    nb = starts.size
    calling = col["calling"].astype(bool)
    prio = col["prio"].astype(np.int64)
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min

    def agg(name: str, how: str, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(value, set) per block: min / max of ``name`` over the rows (all, or ``rows``) where it is >= 0."""
        v = col[name].astype(np.int64)
        ok = v >= 0 if rows is None else (v >= 0) & rows
        fill = big if how == "min" else small
        red = (np.minimum if how == "min" else np.maximum).reduceat(np.where(ok, v, fill), starts)
        return red, np.add.reduceat(ok.astype(np.int64), starts) > 0

    def first(keys: tuple[np.ndarray, ...], rows: np.ndarray | None = None) -> np.ndarray:
        """Per block, the member first in the stable order of (block, *keys) among ``rows``; -1 if none."""
        o = np.lexsort(tuple(reversed(keys)) + (block,))
        if rows is not None:
            o = o[rows[o]]
        out = np.full(nb, -1, np.int64)
        if o.size:
            b = block[o]
            head = np.r_[True, b[1:] != b[:-1]]
            out[b[head]] = o[head]
        return out

    first_start = np.minimum.reduceat(s, starts)
    op_start, has_op = agg("op_start", "min")
    c_arrive, has_ca = agg("arrive", "min", calling)
    arrive = np.where(has_op, op_start, np.where(has_ca, c_arrive, first_start))
    gloo_end, has_gloo = agg("common_end", "max")
    c_exit, has_ce = agg("exit", "max", calling)
    exit_ = np.where(has_ce, c_exit, np.where(has_gloo, gloo_end, np.maximum.reduceat(e, starts)))
    end = np.where(has_gloo, gloo_end, exit_)
    # the sync span: a recognized span member, else the op's enclosing span, else the op itself
    span_start_m = col["span_start"].astype(np.int64)
    span_name_m = col["span_name"]
    sp = first((-prio, span_start_m), (span_start_m >= 0) & ~pd.isna(span_name_m))
    best = first((prio, -e))
    caller = first((~calling, prio))
    # evidence of a block: the union of its members' (each a "+"-joined set), as bits
    ev = col["evidence"].astype(str)
    tokens = sorted({x for t in pd.unique(ev) for x in t.split("+")})
    bit = {t: 1 << i for i, t in enumerate(tokens)}
    mask_of = {t: sum(bit[x] for x in set(t.split("+"))) for t in pd.unique(ev)}
    masks = np.bitwise_or.reduceat(np.array([mask_of[t] for t in ev], np.int64), starts)
    evidence = np.array(["+".join(t for t in tokens if mk & bit[t]) for mk in masks.tolist()], dtype=object)
    group_at = first((), ~pd.isna(col["group"]))
    group = np.array([col["group"][i] if i >= 0 else None for i in group_at.tolist()], dtype=object)
    seq_at = first((), col["seq"].astype(np.int64) >= 0)
    seq = pd.arrays.IntegerArray(np.where(seq_at >= 0, col["seq"].astype(np.int64)[np.maximum(seq_at, 0)], 0),
                                 seq_at < 0).to_numpy()  # as Int64's to_numpy: ints, or objects with NA
    # the collective's name: Gloo's, the op's, a recognized span's guess
    coll_ok = ~pd.isna(col["coll"])
    coll = _at(col["coll"], first((prio,), coll_ok))
    known = _at(col["coll"], first((prio,), coll_ok & (prio <= 1)))
    span_start = np.where(sp >= 0, span_start_m[np.maximum(sp, 0)], first_start)
    sp_name = _at(span_name_m, sp)
    span_name = np.where(~pd.isna(sp_name), sp_name, col["name"][best]).astype(object)
    pid = col["pid"].astype(np.int64)[caller]
    tid = col["tid"].astype(np.int64)[caller]
    n = nb
    return pd.DataFrame({
        "rank": col["rank"].astype(np.int64)[best],
        "source_kind": "cpu_span",
        "group": group,
        "seq": seq,
        "coll_name": coll,
        "start_ns": arrive,
        "end_ns": end,
        "name": col["name"][best],
        "device": missing_ints(n),
        "stream": missing_ints(n),
        "pid": pd.arrays.IntegerArray(np.maximum(pid, 0), pid < 0),
        "tid": pd.arrays.IntegerArray(np.maximum(tid, 0), tid < 0),
        "launch_ns": missing_ints(n),
        "host_start_ns": pd.array(span_start, dtype="Int64"),
        "host_end_ns": pd.array(exit_, dtype="Int64"),
        "arrive_ns": arrive,
        "exit_ns": np.maximum(exit_, arrive),
        "span_start_ns": span_start,
        "span_name": span_name,
        "evidence": evidence,
        # waits are labelled by the collective where the trace shows it (a Gloo span, an op),
        # else by the sync span: never by a guess made from a name, so renaming spans changes
        # the label only by that name
        "wait_name": np.where(~pd.isna(known), known, np.where(~pd.isna(span_name), span_name, coll)).astype(object),
    })


_MEMBER_TEXT = {"name", "group", "coll", "evidence", "span_name"}


def missing_ints(n: int) -> pd.api.extensions.ExtensionArray:
    """``pd.array([pd.NA] * n, dtype="Int64")`` (the same data and mask) without a list of n NAs."""
    return pd.arrays.IntegerArray(np.ones(n, np.int64), np.ones(n, bool))


def _at(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values[rows]`` as objects, NaN where ``rows`` is -1 (a block without such a member,
    as ``reindex`` left it)."""
    out = np.full(rows.size, np.nan, dtype=object)
    ok = rows >= 0
    out[ok] = values[rows[ok]]
    return out


# ---- cross rank: names recognized by blocking calls or aligned ends --------------------------
def span_facts(events: pd.DataFrame, exclude: re.Pattern[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per rank and span name: instances, time, time in blocking OS calls on its thread, and how
    many instances hold a collective of their own (``FACT_COLUMNS``); and a central block of up to
    ``SAMPLE_PER_NAME`` instances (``SAMPLE_COLUMNS``) for the aligned-ends test. Small: one row per
    name, 64 per name. Library spans (Gloo, NCCL, ProfilerStep, ...) and ``exclude`` are skipped.
    Spans are grouped by name codes (``column_codes``); the strings are made only for the result."""
    kind_c, kind_u = column_codes(events, "kind")
    is_span = distinct.codes_in(kind_u, kind_c, schema.CPU_SPAN)
    rows = np.flatnonzero(is_span & events["tid"].notna().to_numpy(bool))
    if not rows.size:
        return empty_table(FACT_COLUMNS), empty_table(SAMPLE_COLUMNS)
    name_c, name_u = column_codes(events, "name")
    code = name_c[rows]
    if (code < 0).any():  # a span without a name: the frame path groups as it always did
        return _span_facts_frames(events, exclude)
    lib = distinct.regex_flags(name_u, code, _LIBRARY_RE)
    if exclude is not None:
        lib |= distinct.regex_flags(name_u, code, exclude, "search")
    rows, code = rows[~lib], code[~lib]
    if not rows.size:
        return empty_table(FACT_COLUMNS), empty_table(SAMPLE_COLUMNS)
    rank = events["rank"].to_numpy(np.int64)[rows]
    # (rank, name) groups in the order of (rank, name as text), as groupby sorts them
    by_text = np.empty(len(name_u), np.int64)
    by_text[np.argsort(name_u, kind="stable")] = np.arange(len(name_u))
    _, ginv, gcount = np.unique(rank * np.int64(len(name_u)) + by_text[code], return_inverse=True, return_counts=True)
    ok = gcount[ginv.reshape(-1)] >= MIN_INSTANCES
    rows, code, rank = rows[ok], code[ok], rank[ok]
    if not rows.size:
        return empty_table(FACT_COLUMNS), empty_table(SAMPLE_COLUMNS)
    key = _thread_key({c: column_ints(events, c)[0][rows] for c in ("rank", "pid", "tid")})
    s = events["start_ns"].to_numpy(np.int64)[rows]
    e = events["end_ns"].to_numpy(np.int64)[rows]
    blocked, holds = _blocked_and_holding(events, key, rank, s, e)
    gkey = rank * np.int64(len(name_u)) + by_text[code]
    order = np.lexsort((s, gkey))  # stable: rows of one start keep their order
    gk = gkey[order]
    first = np.flatnonzero(np.r_[True, gk[1:] != gk[:-1]])
    n = np.diff(np.r_[first, gk.size])
    g_rank, g_code = rank[order][first], code[order][first]
    dur = (e - s)[order]
    facts = pd.DataFrame({"rank": g_rank, "name": name_u[g_code], "n": n.astype(np.int64),
                          "total_ns": np.add.reduceat(dur, first).astype(np.int64),
                          "blocked_ns": np.add.reduceat(blocked[order], first).astype(np.int64),
                          "with_collective": np.add.reduceat(holds[order].astype(np.int64), first).astype(np.int64)})
    pos = np.arange(gk.size) - np.repeat(first, n)
    size = np.repeat(n, n)
    lo = np.maximum((size - SAMPLE_PER_NAME) // 2, 0)
    pick = order[(pos >= lo) & (pos < lo + SAMPLE_PER_NAME)]
    sample = pd.DataFrame({"rank": rank[pick], "name": name_u[code[pick]], "start_ns": s[pick], "end_ns": e[pick]})
    return facts[FACT_COLUMNS], sample


def _blocked_and_holding(events: pd.DataFrame, key: np.ndarray, rank: np.ndarray, s: np.ndarray,
                         e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per span [s, e) of a thread (``key``) on a rank: the longest blocking OS call inside it
    (ns), and whether it holds a collective's start (of its rank) or a sync mark (of its thread)."""
    ctx = _thread_context(events)
    coll_by_rank, sync_by_thread = _collective_marks(events)
    blocked = np.zeros(s.size, np.int64)
    holds = np.zeros(s.size, bool)

    def inside(starts: np.ndarray | None, m: np.ndarray) -> np.ndarray:
        if starts is None or not starts.size:
            return np.zeros(int(m.sum()), bool)
        return np.searchsorted(starts, e[m], side="left") > np.searchsorted(starts, s[m], side="left")

    for k in np.unique(key):
        m = key == k
        _, blocked[m] = ctx.longest_block(int(k), s[m], e[m])
        holds[m] |= inside(sync_by_thread.get(int(k)), m)
    for r in np.unique(rank):
        m = rank == r
        holds[m] |= inside(coll_by_rank.get(int(r)), m)
    return blocked, holds


def _span_facts_frames(events: pd.DataFrame, exclude: re.Pattern[str] | None = None
                       ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``span_facts`` grouping the spans' rows as frames (spans without a name: pandas drops
    them from the groups)."""
    spans = events.loc[distinct.isin(events["kind"], (schema.CPU_SPAN,)) & events["tid"].notna().to_numpy(bool),
                       [c for c in ("rank", "name", "start_ns", "end_ns", "pid", "tid") if c in events.columns]]
    if not len(spans):
        return empty_table(FACT_COLUMNS), empty_table(SAMPLE_COLUMNS)
    lib = _name_flags(spans["name"], lambda u: u.str.match(_LIBRARY_RE) | (
        u.str.contains(exclude) if exclude is not None else False))
    spans = spans[~lib]
    if not len(spans):
        return empty_table(FACT_COLUMNS), empty_table(SAMPLE_COLUMNS)
    counts = spans.groupby(["rank", "name"], observed=True).size()
    spans = spans[spans.set_index(["rank", "name"]).index.map(counts).to_numpy(np.int64) >= MIN_INSTANCES]
    if not len(spans):
        return empty_table(FACT_COLUMNS), empty_table(SAMPLE_COLUMNS)
    key = _thread_key(spans)
    rank = spans["rank"].to_numpy(np.int64)
    s, e = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
    blocked, holds = _blocked_and_holding(events, key, rank, s, e)
    df = pd.DataFrame({"rank": spans["rank"].to_numpy(np.int64), "name": spans["name"].astype(str).to_numpy(dtype=object),
                       "start_ns": s, "end_ns": e, "dur": e - s, "blocked": blocked, "holds": holds})
    g = df.groupby(["rank", "name"], sort=True)
    facts = pd.DataFrame({"n": g.size(), "total_ns": g["dur"].sum(), "blocked_ns": g["blocked"].sum(),
                          "with_collective": g["holds"].sum()}).reset_index()
    df = df.sort_values(["rank", "name", "start_ns"], kind="stable")
    pos = df.groupby(["rank", "name"], sort=False).cumcount().to_numpy()
    n = df.groupby(["rank", "name"], sort=False)["start_ns"].transform("size").to_numpy()
    lo = np.maximum((n - SAMPLE_PER_NAME) // 2, 0)
    sample = df[(pos >= lo) & (pos < lo + SAMPLE_PER_NAME)][SAMPLE_COLUMNS].reset_index(drop=True)
    return facts[FACT_COLUMNS].astype({"n": "int64", "total_ns": "int64", "blocked_ns": "int64",
                                       "with_collective": "int64"}), sample


def _collective_marks(events: pd.DataFrame) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Sorted starts of host events that synchronize on their own, per rank (any thread or
    process: collectives, i.e. c10d ops, record_param_comms, Gloo / NCCL spans, NCCL's NVTX
    domain) and per thread (host syncs on the GPU: ``cudaStreamSynchronize``, blocking copies,
    event polling; per thread, as NCCL's watchdog polls events all the time). A span holding one
    is judged by it (the collective's own evidence, or the GPU timeline: a host blocked on its
    GPU while the GPU waits in a collective is charged from the GPU side), never by its ends;
    per rank, since vLLM's engine core waits for its worker process, which holds the collective."""

    # flags over whole columns (names tested once per distinct name): no rows of the string
    # columns are taken, only the few sync rows' thread ids
    kind_c, kind_u = column_codes(events, "kind")
    is_host = distinct.codes_in(kind_u, kind_c, (schema.CPU_OP, schema.CPU_SPAN, schema.RUNTIME))
    if not is_host.any():
        return {}, {}
    is_rt = distinct.codes_in(kind_u, kind_c, schema.RUNTIME)
    name_c, name_u = column_codes(events, "name")
    coll = (distinct.regex_flags(name_u, name_c, COLL_OP_RE) | distinct.regex_flags(name_u, name_c, GLOO_RE)
            | distinct.regex_flags(name_u, name_c, _NCCL_PREFIX_RE))
    cat_c, cat_u = column_codes(events, "category")
    coll |= distinct.codes_in(cat_u, cat_c, "NCCL") | events["coll_name"].notna().to_numpy(bool)
    coll &= is_host & ~is_rt
    sync = is_rt & (distinct.regex_flags(name_u, name_c, SYNC_RE, "search") | distinct.regex_flags(name_u, name_c, POLL_RE))
    starts = events["start_ns"].to_numpy(np.int64)
    ranks = events["rank"].to_numpy(np.int64)
    by_rank = {int(r): np.sort(starts[coll & (ranks == r)]) for r in np.unique(ranks[coll])}
    sync_rows = np.flatnonzero(sync)
    key = _thread_key(events.iloc[sync_rows][[c for c in ("rank", "pid", "tid") if c in events.columns]])
    s_starts = starts[sync_rows]
    by_thread = {int(k): np.sort(s_starts[key == k]) for k in np.unique(key)}
    return by_rank, by_thread


def _name_flags(names: pd.Series, test) -> np.ndarray:
    """``test`` (a function of a Series of strings -> bools) applied once per distinct name
    (a missing name is tested as ""): ``code_flags`` of the column's codes."""
    codes, uniques = pd.factorize(names, use_na_sentinel=True)  # Arrow strings: dictionary-encoded
    return code_flags(np.array([str(u) for u in uniques], dtype=object), np.asarray(codes, np.int64), test)


def decide_sync_names(facts: pd.DataFrame, samples: pd.DataFrame | None) -> dict[str, str]:
    """Span names that are sync points by cross-rank evidence: ``name -> evidence``.

    ``facts`` / ``samples``: ``span_facts`` of every rank (concatenated); ``samples`` on ONE
    clock (aligned). Names holding a collective of their own are left to that collective.
    """
    if facts is None or not len(facts):
        return {}
    per = facts.groupby("name").agg(ranks=("rank", "nunique"), holds=("with_collective", "sum"))
    eligible = per[(per["ranks"] >= 2) & (per["holds"] == 0)].index
    f = facts[facts["name"].isin(eligible)]
    out: dict[str, str] = {}
    share = f["blocked_ns"] / f["total_ns"].where(f["total_ns"] > 0)
    for name in sorted(set(f.loc[share >= BLOCKED_SHARE, "name"])):
        out[str(name)] = BLOCKING_CALL
    if samples is not None and len(samples):
        s = samples[samples["name"].isin(eligible) & ~samples["name"].isin(list(out))]
        for name, g in s.groupby("name", sort=True):
            if _aligned_ends(g["rank"].to_numpy(np.int64), g["start_ns"].to_numpy(np.int64),
                             g["end_ns"].to_numpy(np.int64)):
                out[str(name)] = ALIGNED_ENDS
    return out


def _aligned_ends(rank: np.ndarray, start: np.ndarray, end: np.ndarray) -> bool:
    """Ends of one name's instances (its samples' ranks, starts and ends) line up across ranks
    while their starts spread. Only the ranks compared are sorted (up to ``MAX_SAMPLE_RANKS``; every
    rank's frame sorted was a quarter of the driver's sync-name decision at DEP32), each by start as
    ``DataFrame.sort_values`` sorts (numpy's quicksort of the rank's rows in their order)."""
    from profkit.collectives.sequences import match_sequences

    ranks = np.unique(rank)[:MAX_SAMPLE_RANKS].tolist()
    if len(ranks) < 2:
        return False

    def by_start(r: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.flatnonzero(rank == r)
        rows = rows[np.argsort(start[rows], kind="quicksort")]
        return end[rows], start[rows]

    ref_e, ref_s = by_start(ranks[0])
    if ref_e.size < MIN_INSTANCES:
        return False
    ends = [ref_e.astype(np.float64)]
    starts = [ref_s.astype(np.float64)]
    for r in ranks[1:]:
        oe, os_ = by_start(r)
        pairs, _ = match_sequences({"k": ref_e}, {"k": oe}, {"k": END_TOL_NS})
        ia, ib = pairs.get("k", (np.empty(0, np.int64), np.empty(0, np.int64)))
        if ia.size < MATCHED_SHARE * min(ref_e.size, oe.size):
            return False
        col_e = np.full(ref_e.size, np.nan)
        col_s = np.full(ref_e.size, np.nan)
        col_e[ia], col_s[ia] = oe[ib], os_[ib]
        ends.append(col_e)
        starts.append(col_s)
    E, S = np.vstack(ends), np.vstack(starts)
    both = (~np.isnan(E)).sum(axis=0) >= 2
    if both.sum() < MIN_INSTANCES:
        return False
    end_spread = np.nanmax(E[:, both], axis=0) - np.nanmin(E[:, both], axis=0)
    start_spread = np.nanmax(S[:, both], axis=0) - np.nanmin(S[:, both], axis=0)
    typical = float(np.median(end_spread))
    if typical > END_TOL_NS:
        return False
    # where the starts spread, the ends must not: a span of steady length spreads at both ends
    spread = start_spread >= max(SPREAD_RATIO * typical, MIN_START_SPREAD_NS)
    if spread.sum() < max(MIN_INSTANCES, MIN_SPREAD_SHARE * spread.size):
        return False
    return bool(np.median(end_spread[spread] / start_spread[spread]) <= 1.0 / SPREAD_RATIO)


def empty_table(columns: list[str]) -> pd.DataFrame:
    """No rows, ``columns`` typed as the sync tables type them (names text, flags bool, the rest int64)."""
    text = {"key", "coll_name", "source_kind", "evidence", "span_name", "name"}
    out = pd.DataFrame({c: pd.Series(dtype=object if c in text else "int64") for c in columns})
    for c in ("is_last", "complete"):
        if c in out:
            out[c] = out[c].astype(bool)
    return out
