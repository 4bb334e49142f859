"""Chrome JSON writer (object form) for tools that read only Chrome trace JSON.

Same ranks, tracks and events as the Perfetto writer (one layout feeds both): a process per
rank (``M`` process_name / process_sort_index), a thread per track (``M`` thread_name /
thread_sort_index; GPU streams, steps and overlap lanes get synthetic tids above the OS range),
``X`` complete events, ``i`` instants, and ``s``/``f`` flows from launch to GPU activity.

Times are µs relative to ``otherData.time_origin_ns`` (the earliest event of the capture):
absolute epoch µs need 19 significant digits for ns precision, more than a double holds, while
relative µs with three decimals are exact for any capture shorter than ~100 days. Streamed per
rank; the file is complete once ``close()`` writes the closing brackets.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import orjson

from profkit.export.layout import BEGIN, INSTANT, RankTrace

SYNTHETIC_TID_BASE = 0x7F000000  # tids for non-OS tracks; real tids stay below 2**22


class ChromeWriter:
    def __init__(self, path: str | Path, time_origin_ns: int, other_data: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.time_origin_ns = int(time_origin_ns)
        self._fh: BinaryIO = open(self.path, "wb")
        self.bytes_written = 0
        self._first = True
        header = {"time_origin_ns": self.time_origin_ns, "time_unit": "us relative to time_origin_ns", **(other_data or {})}
        self._raw(b'{"displayTimeUnit":"ns","otherData":' + orjson.dumps(header) + b',"traceEvents":[\n')

    def __enter__(self) -> "ChromeWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _raw(self, data: bytes) -> None:
        self._fh.write(data)
        self.bytes_written += len(data)

    def _events(self, events: list[bytes]) -> None:
        if not events:
            return
        lead = b"" if self._first else b",\n"
        self._first = False
        self._raw(lead + b",\n".join(events))

    def close(self) -> int:
        if not self._fh.closed:
            self._raw(b"\n]}\n")
            self._fh.close()
        return self.bytes_written

    def write_rank(self, rt: RankTrace) -> None:
        pid = rt.pid
        dumps = orjson.dumps
        meta = [
            dumps({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": rt.identity.label()}}),
            dumps({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rt.rank}}),
        ]
        if rt.description:
            meta.append(dumps({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": rt.description}}))
        tids = []
        for order, track in enumerate(sorted(rt.tracks, key=lambda t: t.sort_key)):
            tid = track.thread[1] if track.thread is not None else SYNTHETIC_TID_BASE + track.index
            tids.append((track.index, tid))
            meta.append(dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track.name}}))
            meta.append(dumps({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": order}}))
        self._events(meta)
        tid_of_track = dict(tids)
        items = rt.items
        def column(name: str) -> tuple[list[int], list[str]]:  # lists: per-row access in the loop
            return items.labels[name].codes.tolist(), items.labels[name].uniques

        names, categories = column("name"), column("category")
        string_cols = [(n, *column(n)) for n in items.annotation_names if n in items.labels]
        number_cols = [(n, items.numbers[n][0].tolist(), items.numbers[n][1].tolist())
                       for n in items.annotation_names if n in items.numbers]
        origin = self.time_origin_ns
        starts, ends, track_of = items.start_ns.tolist(), items.end_ns.tolist(), rt.track_of_item.tolist()
        flows_out, flows_in = rt.flows_by_item()
        out: list[bytes] = []
        for item, rtype in zip(rt.record_item.tolist(), rt.record_type.tolist()):
            if rtype not in (BEGIN, INSTANT):  # one JSON event per BEGIN or INSTANT record
                continue
            start = starts[item]
            tid = tid_of_track[track_of[item]]
            ts = (start - origin) / 1000.0
            code = names[0][item]
            event: dict[str, Any] = {"name": names[1][code] if code >= 0 else "", "ph": "X", "ts": ts, "pid": pid, "tid": tid}
            if rtype == INSTANT:
                event["ph"], event["s"] = "i", "t"
            else:
                event["dur"] = (ends[item] - start) / 1000.0
            code = categories[0][item]
            if code >= 0:
                event["cat"] = categories[1][code]
            args = {name: uniques[codes[item]] for name, codes, uniques in string_cols if codes[item] >= 0}
            args.update((name, values[item]) for name, values, present in number_cols if present[item])
            if args:
                event["args"] = args
            out.append(dumps(event))
            for fid in flows_out.get(item, ()):
                out.append(dumps({"ph": "s", "id": fid, "cat": "ac2g", "name": "launch", "ts": ts, "pid": pid, "tid": tid}))
            for fid in flows_in.get(item, ()):
                out.append(dumps({"ph": "f", "bp": "e", "id": fid, "cat": "ac2g", "name": "launch", "ts": ts, "pid": pid, "tid": tid}))
            if len(out) >= 4096:
                self._events(out)
                out = []
        self._events(out)
