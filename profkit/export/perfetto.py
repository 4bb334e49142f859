"""Perfetto protobuf writer: one trusted packet sequence per rank, streamed packet by packet.

The file is a ``Trace``: each TracePacket is written as one ``Trace.packet`` field (field 1,
length-delimited), so packets can be appended as they are made and the file is valid after
every rank. Per rank (= per sequence): the process track and all its tracks first (descriptors
need no incremental state), then BEGIN/END/INSTANT track events in timestamp order. Event names,
categories, debug-annotation names and string values are interned per sequence: the first packet
of a sequence says SEQ_INCREMENTAL_STATE_CLEARED, later ones SEQ_NEEDS_INCREMENTAL_STATE.
"""
from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

from profkit.export import protowire as pw
from profkit.export.layout import BEGIN, END, RankTrace
from profkit.export.protowire import F


def process_uuid(rank: int) -> int:
    return (rank + 1) << 32


def track_uuid(rank: int, track_index: int) -> int:
    return process_uuid(rank) + 1 + track_index


class PerfettoWriter:
    """Write ranks one at a time into ``path``; ``close()`` returns the bytes written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: BinaryIO = open(self.path, "wb")
        self.bytes_written = 0

    def __enter__(self) -> "PerfettoWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> int:
        if not self._fh.closed:
            self._fh.close()
        return self.bytes_written

    def _write(self, chunks: list[bytes]) -> None:
        data = b"".join(chunks)
        self._fh.write(data)
        self.bytes_written += len(data)

    def write_rank(self, rt: RankTrace) -> None:
        seq = pw.uint_field(F.TRUSTED_PACKET_SEQUENCE_ID, _sequence_id(rt.rank))
        self._write(self._descriptors(rt, seq))
        self._write_events(rt, seq)

    # -- tracks -----------------------------------------------------------------------------

    def _descriptors(self, rt: RankTrace, seq: bytes) -> list[bytes]:
        proc_uuid = process_uuid(rt.rank)
        process = pw.uint_field(F.PD_PID, rt.pid) + pw.str_field(F.PD_PROCESS_NAME, rt.identity.label())
        desc = (
            pw.uint_field(F.TD_UUID, proc_uuid)
            + pw.bytes_field(F.TD_PROCESS, process)
            + pw.uint_field(F.TD_CHILD_ORDERING, pw.CHILD_ORDERING_EXPLICIT)
        )
        if rt.description:
            desc += pw.str_field(F.TD_DESCRIPTION, rt.description)
        first = (
            seq
            + pw.uint_field(F.SEQUENCE_FLAGS, pw.SEQ_INCREMENTAL_STATE_CLEARED)
            + pw.uint_field(F.FIRST_PACKET_ON_SEQUENCE, 1)
            + pw.bytes_field(F.TRACK_DESCRIPTOR, desc)
        )
        out = [pw.framed_packet(first)]
        for order, track in enumerate(sorted(rt.tracks, key=lambda t: t.sort_key)):
            body = pw.uint_field(F.TD_UUID, track_uuid(rt.rank, track.index)) + pw.uint_field(F.TD_PARENT_UUID, proc_uuid)
            if track.thread is not None:
                pid, tid = track.thread
                body += pw.bytes_field(
                    F.TD_THREAD,
                    pw.uint_field(F.THD_PID, rt.pid) + pw.uint_field(F.THD_TID, tid) + pw.str_field(F.THD_THREAD_NAME, track.name),
                )
            else:
                body += pw.str_field(F.TD_NAME, track.name)
            body += pw.uint_field(F.TD_SIBLING_ORDER_RANK, order)
            out.append(pw.framed_packet(seq + pw.bytes_field(F.TRACK_DESCRIPTOR, body)))
        return out

    # -- events -----------------------------------------------------------------------------

    def _write_events(self, rt: RankTrace, seq: bytes) -> None:
        """BEGIN/INSTANT packets reuse the encoded (track, name, category, string annotations)
        part per distinct combination; only timestamps, numbers and flows are encoded per event."""
        items = rt.items
        interner = _Interner()
        header = seq + pw.uint_field(F.SEQUENCE_FLAGS, pw.SEQ_NEEDS_INCREMENTAL_STATE)
        uuid_fields = [pw.uint_field(F.TE_TRACK_UUID, track_uuid(rt.rank, t.index)) for t in rt.tracks]
        end_tail = [header + pw.bytes_field(F.TRACK_EVENT, pw.uint_field(F.TE_TYPE, END) + u) for u in uuid_fields]

        string_names = [n for n in items.annotation_names if n in items.labels]
        number_names = [n for n in items.annotation_names if n in items.numbers]
        # numbers: the annotation name is interned up front; the value is encoded per event
        number_cols = []
        for name in number_names:
            values, present = items.numbers[name]
            prefix = pw.uint_field(F.DA_NAME_IID, interner.iid(F.ID_DEBUG_ANNOTATION_NAMES, name)) + pw.key(F.DA_INT_VALUE, 0)
            number_cols.append((prefix, values, present))
        primed = b"".join(interner.new_entries)
        interner.new_entries.clear()
        if primed:  # the annotation names, before any event uses them
            self._write([pw.framed_packet(header + pw.bytes_field(F.INTERNED_DATA, primed))])

        combos = items.label_combos(["name", "category"] + string_names)
        statics: dict[tuple[int, int, int], bytes] = {}
        name_lab, cat_lab = items.labels["name"], items.labels["category"]
        string_labs = [(name, items.labels[name]) for name in string_names]

        def static_part(item: int, track: int, rtype: int) -> tuple[bytes, bytes]:
            """(TrackEvent prefix, interned entries it introduces): computed once per combination."""
            interner.new_entries.clear()
            event = pw.uint_field(F.TE_TYPE, rtype) + uuid_fields[track]
            event += pw.uint_field(F.TE_NAME_IID, interner.iid(F.ID_EVENT_NAMES, name_lab.value(item) or ""))
            category = cat_lab.value(item)
            if category is not None:
                event += pw.uint_field(F.TE_CATEGORY_IIDS, interner.iid(F.ID_EVENT_CATEGORIES, category))
            for name, lab in string_labs:
                value = lab.value(item)
                if value is None:
                    continue
                ann = pw.uint_field(F.DA_NAME_IID, interner.iid(F.ID_DEBUG_ANNOTATION_NAMES, name))
                ann += pw.uint_field(F.DA_STRING_VALUE_IID, interner.iid(F.ID_DEBUG_ANNOTATION_STRING_VALUES, value))
                event += pw.bytes_field(F.TE_DEBUG_ANNOTATIONS, ann)
            entries = b"".join(interner.new_entries)
            return event, (pw.bytes_field(F.INTERNED_DATA, entries) if entries else b"")

        ts_varints = pw.varints(rt.record_ts)
        ts_key, event_key = pw.key(F.TIMESTAMP, 0), pw.key(F.TRACK_EVENT, 2)
        varint, small, frame = pw.varint, pw.SMALL_VARINTS, pw.key(F.TRACE_PACKET, 2)
        n_small = len(small)
        numbers_of_item = _encoded_numbers(len(items), number_cols)
        flows_of_item = _encoded_flows(rt)
        track_of = rt.track_of_item.tolist()
        combo_list = combos.tolist()
        chunks: list[bytes] = []
        for ts_bytes, item, rtype in zip(ts_varints, rt.record_item.tolist(), rt.record_type.tolist()):
            track = track_of[item]
            if rtype == END:
                body = ts_key + ts_bytes + end_tail[track]
                size = len(body)
                chunks.append(frame + (small[size] if size < n_small else varint(size)) + body)
                continue
            key = (combo_list[item], track, rtype)
            prefix = statics.get(key)
            interned = b""
            if prefix is None:  # first use: its new interned entries ride along, once
                prefix, interned = static_part(item, track, rtype)
                statics[key] = prefix
            event = prefix + numbers_of_item[item]
            if rtype == BEGIN and item in flows_of_item:
                event += flows_of_item[item]
            size = len(event)
            body = ts_key + ts_bytes + header + interned + event_key + (small[size] if size < n_small else varint(size)) + event
            size = len(body)
            chunks.append(frame + (small[size] if size < n_small else varint(size)) + body)
            if len(chunks) >= 8192:
                self._write(chunks)
                chunks = []
        self._write(chunks)


def _encoded_numbers(n_items: int, number_cols: list[tuple[bytes, np.ndarray, np.ndarray]]) -> list[bytes]:
    """Per item, its integer debug annotations, encoded (b"" for most rows)."""
    out = [b""] * n_items
    tag = pw.key(F.TE_DEBUG_ANNOTATIONS, 2)
    for prefix, values, present in number_cols:
        rows = np.flatnonzero(present)
        for row, encoded in zip(rows.tolist(), pw.varints(values[rows])):
            ann = prefix + encoded
            out[row] += tag + pw.varint(len(ann)) + ann
    return out


def _encoded_flows(rt: RankTrace) -> dict[int, bytes]:
    """Per item that starts or ends flows: its flow_ids / terminating_flow_ids fields."""
    out: dict[int, bytes] = {}
    for rows, field in ((rt.flow_src, F.TE_FLOW_IDS), (rt.flow_dst, F.TE_TERMINATING_FLOW_IDS)):
        for row, encoded in zip(rows.tolist(), pw.fixed64_fields(field, rt.flow_ids)):
            out[row] = out.get(row, b"") + encoded
    return out


class _Interner:
    """Per-sequence interning tables; ``new_entries`` collects what the current packet must carry."""

    def __init__(self) -> None:
        self.tables: dict[int, dict[str, int]] = {}
        self.new_entries: list[bytes] = []

    def iid(self, table_field: int, text: str) -> int:
        table = self.tables.setdefault(table_field, {})
        found = table.get(text)
        if found is not None:
            return found
        iid = len(table) + 1  # iids start at 1; 0 means "not set"
        table[text] = iid
        self.new_entries.append(pw.interned_entry(table_field, iid, text))
        return iid


def _sequence_id(rank: int) -> int:
    return rank + 1  # nonzero and unique per rank (one writer per rank)

