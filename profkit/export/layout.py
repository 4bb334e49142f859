"""One rank laid out as trace tracks: which track each event goes on, in which order to write it.

Shared by the Perfetto and Chrome writers, so both show the same events on the same tracks.
Slices on one track must nest (a viewer cannot draw [0, 10] and [5, 15] on one row), so every
track key (a CPU thread, a GPU stream, the steps) is split into lanes: an event goes on the first
lane where it nests in what is open there; the rare one that would cross goes on an overlap lane
("GPU 0 stream 7 (overlap)") instead of breaking begin/end pairs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit import schema
from profkit.export.flows import launch_flows
from profkit.export.identity import MAX_INT32, MAX_OS_PID, RankIdentity

STEPS, THREAD, STREAM, OTHER = 0, 1, 2, 3  # track groups, in display order
BEGIN, END, INSTANT = 1, 2, 3  # record types (Perfetto's TrackEvent.Type values)

# debug annotations carried per event: (column, value type)
EVENT_ANNOTATIONS = (
    ("kind", str), ("category", str), ("source", str), ("correlation", int),
    ("coll_name", str), ("coll_group", str), ("coll_seq", int), ("bytes", int),
)
STEP_ANNOTATIONS = (
    ("step", int), ("marker", str), ("step_ns", int), ("gpu_busy_ns", int), ("gap_ns", int),
    ("phase", str), ("batch_size", int), ("num_tokens", int),
)


@dataclass
class Track:
    index: int
    group: int  # STEPS | THREAD | STREAM | OTHER
    name: str
    lane: int  # 0: the track itself; k > 0: its k-th overlap lane
    thread: tuple[int, int] | None = None  # (pid, tid) of a lane-0 OS thread track
    sort_key: tuple = ()


@dataclass
class Labels:
    """A string column, factorized: ``uniques[codes[i]]``, code -1 = null."""

    codes: np.ndarray  # int64
    uniques: list[str]

    def value(self, i: int) -> str | None:
        code = self.codes[i]
        return None if code < 0 else self.uniques[code]


@dataclass
class Items:
    """Rows to write, columnar: the rank's events, then its steps.

    ``labels`` holds ``name``, ``category`` and every string annotation; ``numbers`` every
    integer annotation as (values, present). Annotation order is ``annotation_names``.
    """

    start_ns: np.ndarray
    end_ns: np.ndarray
    labels: dict[str, Labels]
    numbers: dict[str, tuple[np.ndarray, np.ndarray]]
    annotation_names: list[str]

    def __len__(self) -> int:
        return len(self.start_ns)

    def label_combos(self, names: list[str]) -> np.ndarray:
        """One code per distinct combination of the ``names`` label columns (row -> combo id)."""
        combo = np.zeros(len(self), dtype=np.int64)
        for name in names:
            lab = self.labels[name]
            combo = combo * (len(lab.uniques) + 1) + (lab.codes + 1)
            combo = pd.factorize(combo)[0].astype(np.int64)  # re-densify: codes stay < rows
        return combo


@dataclass
class RankTrace:
    """Everything a writer needs for one rank, in writing order."""

    rank: int
    identity: RankIdentity
    pid: int  # the pid the rank's process gets in the trace (see identity.display_pids)
    description: str
    items: Items
    tracks: list[Track]
    track_of_item: np.ndarray  # int32, item -> track index
    record_ts: np.ndarray  # int64, non-decreasing
    record_item: np.ndarray  # int32
    record_type: np.ndarray  # int8: BEGIN | END | INSTANT
    flow_src: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # launch item per flow
    flow_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # GPU item per flow
    flow_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # globally unique

    @property
    def n_flows(self) -> int:
        return len(self.flow_ids)

    def flows_by_item(self) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """(item -> flow ids it starts, item -> flow ids it ends)."""
        out: dict[int, list[int]] = {}
        into: dict[int, list[int]] = {}
        for src, dst, fid in zip(self.flow_src.tolist(), self.flow_dst.tolist(), self.flow_ids.tolist()):
            out.setdefault(src, []).append(fid)
            into.setdefault(dst, []).append(fid)
        return out, into

    @property
    def n_events(self) -> int:
        return len(self.items)

    @property
    def overlap_tracks(self) -> list[Track]:
        return [t for t in self.tracks if t.lane > 0]


def build_rank_trace(
    rank: int,
    events: pd.DataFrame,
    steps: pd.DataFrame,
    identity: RankIdentity,
    pid: int,
    flow_id_base: int,
    description: str = "",
) -> RankTrace:
    """Lay out one rank's (already windowed) events and steps; flow ids start at ``flow_id_base``."""
    timed = events["start_ns"].notna().to_numpy(dtype=bool) & events["end_ns"].notna().to_numpy(dtype=bool)
    if not timed.all():
        events = events[timed]
    items, groups, a_keys, b_keys, instant = _items(events, steps)
    key_ids, key_table = _key_ids(groups, a_keys, b_keys)
    tracks, track_of_item, rec = _lay_out(items, key_ids, key_table, instant, identity)
    order = np.argsort(rec[0], kind="stable")
    out_rows, in_rows = launch_flows(events)
    return RankTrace(
        rank=rank,
        identity=identity,
        pid=pid,
        description=description,
        items=items,
        tracks=tracks,
        track_of_item=track_of_item,
        record_ts=rec[0][order],
        record_item=rec[1][order],
        record_type=rec[2][order],
        flow_src=out_rows,
        flow_dst=in_rows,
        flow_ids=np.arange(flow_id_base, flow_id_base + len(out_rows), dtype=np.int64),
    )


def _labels(events_col: pd.Series | None, n_events: int, steps_col: pd.Series | None, n_steps: int) -> Labels:
    """Factorize a string column of the events and one of the steps into one Labels."""
    parts_codes, uniques, index = [], [], {}
    for col, n in ((events_col, n_events), (steps_col, n_steps)):
        if col is None or n == 0:
            parts_codes.append(np.full(n, -1, dtype=np.int64))
            continue
        codes, values = pd.factorize(col.astype("string"), use_na_sentinel=True)
        remap = np.empty(len(values) + 1, dtype=np.int64)
        remap[-1] = -1
        for j, value in enumerate(values.tolist()):
            remap[j] = index.setdefault(str(value), len(index))
        parts_codes.append(remap[codes])
    uniques = list(index)
    return Labels(np.concatenate(parts_codes), uniques)


def _numbers(events_col: pd.Series | None, n_events: int, steps_col: pd.Series | None, n_steps: int):
    values, present = [], []
    for col, n in ((events_col, n_events), (steps_col, n_steps)):
        if col is None or n == 0:
            values.append(np.zeros(n, dtype=np.int64))
            present.append(np.zeros(n, dtype=bool))
            continue
        as_int = pd.to_numeric(col, errors="coerce").astype("Int64")
        present.append(as_int.notna().to_numpy(dtype=bool))
        values.append(as_int.fillna(0).to_numpy(np.int64))
    return np.concatenate(values), np.concatenate(present)


def _items(events: pd.DataFrame, steps: pd.DataFrame):
    """Rows to write and their track keys: (group, a, b) with -1 for 'none'."""
    n_ev, n_st = len(events), len(steps)
    is_stream = events["stream"].notna().to_numpy(dtype=bool)
    pid = events["pid"].astype("Int64").fillna(-1).to_numpy(np.int64)
    tid = events["tid"].astype("Int64").fillna(-1).to_numpy(np.int64)
    device = events["device"].astype("Int64").fillna(-1).to_numpy(np.int64)
    stream = events["stream"].astype("Int64").fillna(-1).to_numpy(np.int64)
    is_thread = ~is_stream & (pid > 0) & (pid < MAX_OS_PID) & (tid > 0) & (tid <= MAX_INT32)
    groups = np.where(is_stream, STREAM, np.where(is_thread, THREAD, OTHER))
    a_keys = np.where(is_stream, device, np.where(is_thread, pid, -1))
    b_keys = np.where(is_stream, stream, np.where(is_thread, tid, -1))
    instant = (events["kind"] == schema.INSTANT).fillna(False).to_numpy(dtype=bool)

    steps = steps.assign(
        label=[f"step {s}: {m}" for s, m in zip(steps["step"].tolist(), steps["name"].astype(str).tolist())],
        category="step",
    )
    labels = {
        "name": _labels(events["name"], n_ev, steps["label"], n_st),
        "category": _labels(events["category"], n_ev, steps["category"], n_st),
    }
    numbers = {}
    annotation_names = []
    for name, kind in EVENT_ANNOTATIONS + STEP_ANNOTATIONS:
        ev_col = events[name] if name in events.columns and (name, kind) in EVENT_ANNOTATIONS else None
        st_col = steps[name] if name in steps.columns and (name, kind) in STEP_ANNOTATIONS else None
        if name in labels or name in numbers:  # "category" is both the event's category and an annotation
            annotation_names.append(name)
            continue
        if kind is int:
            numbers[name] = _numbers(ev_col, n_ev, st_col, n_st)
        else:
            labels[name] = _labels(ev_col, n_ev, st_col, n_st)
        annotation_names.append(name)
    items = Items(
        start_ns=np.concatenate([events["start_ns"].to_numpy(np.int64), steps["start_ns"].to_numpy(np.int64)]),
        end_ns=np.concatenate([events["end_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)]),
        labels=labels,
        numbers=numbers,
        annotation_names=annotation_names,
    )
    zeros = np.full(n_st, -1, dtype=np.int64)
    return (
        items,
        np.concatenate([groups, np.full(n_st, STEPS)]),
        np.concatenate([a_keys, zeros]),
        np.concatenate([b_keys, zeros]),
        np.concatenate([instant, np.zeros(n_st, dtype=bool)]),
    )


def _key_ids(groups: np.ndarray, a_keys: np.ndarray, b_keys: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
    if len(groups) == 0:
        return np.zeros(0, dtype=np.int64), []
    stacked = np.stack([groups, a_keys, b_keys], axis=1)
    table, ids = np.unique(stacked, axis=0, return_inverse=True)
    return ids.reshape(-1), [tuple(int(x) for x in row) for row in table]


def _track_name(key: tuple, lane: int, identity: RankIdentity) -> str:
    group, a, b = key
    if group == STEPS:
        base = "steps"
    elif group == STREAM:
        base = f"GPU {a} stream {b}" if a >= 0 else f"stream {b}"
    elif group == THREAD:
        base = identity.thread_name(a, b)
    else:
        base = "other (no OS thread)"
    if lane == 0:
        return base
    return f"{base} (overlap)" if lane == 1 else f"{base} (overlap {lane})"


def _lay_out(items: Items, key_ids: np.ndarray, key_table: list[tuple], instant: np.ndarray, identity: RankIdentity):
    """Assign lanes (greedy, first fit) and emit BEGIN/END/INSTANT records in nesting order."""
    n = len(items)
    starts, ends = items.start_ns, items.end_ns
    order = np.lexsort((np.arange(n), -ends, starts, key_ids)) if n else np.zeros(0, dtype=np.int64)
    tracks: list[Track] = []
    track_index: dict[tuple[int, int], int] = {}

    def track_for(key_id: int, lane: int) -> int:
        idx = track_index.get((key_id, lane))
        if idx is None:
            key = key_table[key_id]
            thread = (key[1], key[2]) if key[0] == THREAD and lane == 0 else None
            idx = len(tracks)
            tracks.append(Track(idx, key[0], _track_name(key, lane, identity), lane, thread, (key[0], key[1], key[2], lane)))
            track_index[(key_id, lane)] = idx
        return idx

    track_of_item = np.zeros(n, dtype=np.int32)
    rec_ts: list[int] = []
    rec_item: list[int] = []
    rec_type: list[int] = []
    lanes: list[list[tuple[int, int]]] = []  # per lane: stack of (end_ns, item) still open
    current_key = -1
    key_list, start_list, end_list, inst_list = key_ids[order].tolist(), starts[order].tolist(), ends[order].tolist(), instant[order].tolist()
    for pos, item in enumerate(order.tolist()):
        key_id, start, end = key_list[pos], start_list[pos], end_list[pos]
        if key_id != current_key:
            _close_all(lanes, rec_ts, rec_item, rec_type)
            lanes, current_key = [], key_id
            track_for(key_id, 0)
        if inst_list[pos]:
            track_of_item[item] = track_for(key_id, 0)
            rec_ts.append(start)
            rec_item.append(item)
            rec_type.append(INSTANT)
            continue
        lane_no = len(lanes)
        for i, stack in enumerate(lanes):
            while stack and stack[-1][0] <= start:  # ended by the time this one starts
                done_end, done_item = stack.pop()
                rec_ts.append(done_end)
                rec_item.append(done_item)
                rec_type.append(END)
            if not stack or end <= stack[-1][0]:
                lane_no = i
                break
        if lane_no == len(lanes):
            lanes.append([])
        lanes[lane_no].append((end, item))
        track_of_item[item] = track_for(key_id, lane_no)
        rec_ts.append(start)
        rec_item.append(item)
        rec_type.append(BEGIN)
    _close_all(lanes, rec_ts, rec_item, rec_type)
    records = (
        np.asarray(rec_ts, dtype=np.int64),
        np.asarray(rec_item, dtype=np.int32),
        np.asarray(rec_type, dtype=np.int8),
    )
    return tracks, track_of_item, records


def _close_all(lanes, rec_ts, rec_item, rec_type) -> None:
    for stack in lanes:
        while stack:
            done_end, done_item = stack.pop()
            rec_ts.append(done_end)
            rec_item.append(done_item)
            rec_type.append(END)
