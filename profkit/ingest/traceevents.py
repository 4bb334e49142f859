"""Chrome-format trace events (Kineto's too) -> columns of the profkit event schema.

A tight loop appends the raw values of each event (a ``typedjson`` struct, or a dict where a
piece did not fit the typed decoder) as one short tuple per row: a code for (kind, category),
name, times, ids; a GPU row's device and stream go to lists of their own. Every ``FLUSH_ROWS``
rows (not every parsed piece) they are checked and converted to Arrow arrays (numpy for time),
so Python objects never pile up beyond one batch. Columns with odd values take a slow path;
rare fields (collectives, bytes) are kept sparse. Timestamps become int64 ns exactly, see
``us_to_ns``.
"""
from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from profkit import schema as S
from profkit.ingest.collectives import as_int, coll_from_args, coll_from_kernel, dtype_bytes, normalize_coll_name
from profkit.ingest.scanned import (F_CORR_NULL, F_DEV_NULL, F_PID_NULL, F_STREAM_NULL, F_TID_NULL, CollArgs,
                                    ScannedPiece, SplitPiece)
from profkit.ingest.typedjson import FLOW_TYPES, UNSET, TraceArgs, TraceEvent, event_dict, is_typed

Spec = tuple[str, bool]  # (kind, is_device_event)

# Kineto's activity categories (libkineto ActivityType names) and their kinds.
KINETO_CATS: dict[str, Spec] = {
    "kernel": (S.KERNEL, True),
    "gpu_memcpy": (S.MEMCPY, True),
    "gpu_memset": (S.MEMSET, True),
    "gpu_user_annotation": (S.GPU_SPAN, True),
    "cuda_sync": (S.OTHER, True),
    "cuda_runtime": (S.RUNTIME, False),
    "cuda_driver": (S.RUNTIME, False),
    "hip_runtime": (S.RUNTIME, False),  # ROCm Kineto writes cuda_runtime; older builds hip_*
    "hip_driver": (S.RUNTIME, False),
    "xpu_runtime": (S.RUNTIME, False),
    "xpu_driver": (S.RUNTIME, False),
    "mtia_runtime": (S.RUNTIME, False),
    "privateuse1_runtime": (S.RUNTIME, False),
    "privateuse1_driver": (S.RUNTIME, False),
    "cpu_op": (S.CPU_OP, False),
    "user_annotation": (S.CPU_SPAN, False),
    "collective_comm": (S.CPU_SPAN, False),
    "python_function": (S.PYTHON, False),
    "cpu_instant_event": (S.INSTANT, False),
    "Trace": (S.OTHER, False),
    "overhead": (S.OTHER, False),
    "cuda_profiler_range": (S.OTHER, False),
}
INSTANT_PHASES = frozenset(("i", "I", "n"))
FLOW_PHASES = frozenset(("s", "t", "f"))
BEGIN_END = frozenset(("B", "E"))

US_LIMIT = 4.0e15  # µs (year 2096 as epoch µs): start + dur in ns stays far inside int64
INT63 = (1 << 63) - 1
_EMPTY: dict = {}
_INT_OR_NONE = frozenset((int, type(None)))
_MISSING = object()


def _cached(cache: dict, key: str, compute: Callable[[str], Any]) -> Any:
    """``compute(key)`` once per distinct key (names and dtypes repeat on every collective row)."""
    got = cache.get(key, _MISSING)
    if got is _MISSING:
        got = cache[key] = compute(key)
    return got
_NCCL_PREFIXES = ("nccl", "rccl")
_NCCL_WORDS = tuple(int.from_bytes(prefix.encode(), "little") for prefix in _NCCL_PREFIXES)  # as 4-byte words
# branches of the hot loop (compared by identity)
_HOST, _RUNTIME, _GPU, _FRAME = "host", "runtime", "gpu", "frame"
_GROUPS = (_HOST, _RUNTIME, _GPU, _FRAME)
# Pending rows become one batch of Arrow arrays once this many are collected (or at the
# end): independent of the parser's piece size, so small pieces do not mean small batches.
FLUSH_ROWS = 16384
# The reader's Arrow buffers come from the system allocator: built batch by batch, then mostly
# replaced (times moved by the base, GPU pids filled), they left mimalloc (pyarrow's default pool)
# holding ~30 MB more at the peak of 8 ranks of 25 MB of JSON (253 vs 223 MB), at no measurable cost.
POOL = pa.system_memory_pool()
# the row checks of ``_flush``, in the order their warnings are listed
_DROP_REASONS = ("missing or non-numeric ts", "ts out of range", "missing or non-numeric dur", "negative dur",
                 "dur out of range")


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """Float µs -> int64 ns, exactly ``round(x * 1000)`` of the decimal written in the file.

    ``ts * 1000`` in float64 is not exact: at ts ~ 4.9e12 µs (a ROCm trace here) the
    product is ~4.9e15, where a double's spacing is 1 ns, and the two roundings can
    land 1 ns off. Splitting off the integer part keeps every step exact: floor()
    and the subtraction are exact in binary floating point, integer µs * 1000 is
    done in int64, and the fraction * 1000 (< 1000) carries ~1e-13 ns of error. What
    remains is the parser's own rounding of the decimal to a double: < 0.5 ns while
    |ts| < 2**43 µs (~100 days of relative time), so the result equals the decimal's
    ns value. Absolute-epoch µs written as floats (~1.7e15) keep the double's 0.25 µs
    resolution; integer µs (older Kineto) are exact up to 2**53 µs.
    """
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def stable_id(text: str) -> int:
    """A stable non-negative int63 for a non-numeric pid/tid ("Traces", "Thread A")."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") & INT63


_ID_COLUMNS = (("device", pa.int32(), None), ("stream", pa.int64(), "stream"), ("pid", pa.int64(), "pid"),
               ("tid", pa.int64(), "tid"), ("correlation", pa.int64(), None))
_SPARSE_COLUMNS = (("coll_name", pa.string()), ("coll_group", pa.string()), ("coll_seq", pa.int64()), ("bytes", pa.int64()))


class EventColumns:
    """Accumulates the events of one file: ``add`` chunk by chunk, then ``table``."""

    def __init__(self, cat_spec: Callable[[str | None], Spec]):
        self._spec_of = cat_spec
        self._specs: dict[str | None, tuple] = {}
        self._codes: dict[tuple[str, str | None], int] = {}  # (kind, category) -> the row's code
        self._code_kind: list[str] = []
        self._code_cat: list[str | None] = []
        self._names: dict[str, str] = {}
        self._batches: list[dict[str, Any]] = []
        self.id_names: dict[str, dict[str, str]] = {"stream": {}, "pid": {}, "tid": {}}
        self.begin_end: list[tuple] = []  # (ts, seq, is_begin, pid, tid, name, cat)
        self.metadata: list[dict] = []
        self.skipped: Counter = Counter()
        self.dropped: Counter = Counter()  # (why, kind) -> rows
        self._coll_names: dict[str, str | None] = {}  # raw "Collective name" -> normalized
        self._kernel_colls: dict[str, str | None] = {}  # NCCL kernel name -> its collective
        self._dtype_sizes: dict[str, int | None] = {}
        self._new_rows()

    def _new_rows(self) -> None:
        # one tuple per pending row: (code of (kind, category), name, ts, dur, pid, tid, correlation);
        # device and stream of the GPU rows (gpu_rows) in lists of their own: host rows have none
        self.rows: list[tuple] = []
        self.gpu_rows: list[int] = []
        self.gpu_device: list[Any] = []
        self.gpu_stream: list[Any] = []
        self.coll_name: dict[int, Any] = {}
        self.coll_group: dict[int, Any] = {}
        self.coll_seq: dict[int, Any] = {}
        self.nbytes: dict[int, Any] = {}

    # ------------------------------------------------------------ the hot loop
    def _resolve(self, cat: str | None) -> tuple:
        """(kind, group, cat, code) for a category; group picks the loop's branch (see ``_rows``), code
        names (kind, category) in the pending rows."""
        kind, on_gpu = self._spec_of(cat)
        if on_gpu:
            group = _GPU
        elif kind == S.RUNTIME:
            group = _RUNTIME
        elif kind in (S.PYTHON, S.SAMPLE):
            group = _FRAME
        else:
            group = _HOST
        spec = self._specs[cat] = (kind, group, cat, self._code(kind, cat))
        return spec

    def _code(self, kind: str, cat: str | None) -> int:
        code = self._codes.get((kind, cat))
        if code is None:
            code = self._codes[(kind, cat)] = len(self._code_kind)
            self._code_kind.append(kind)
            self._code_cat.append(cat)
        return code

    def add(self, events: Any) -> None:
        """Take one chunk of events (dicts, or ``typedjson.TraceEvent`` structs: one piece is all
        one or all the other, or a ``scanned.ScannedPiece`` or ``SplitPiece``); afterwards the caller
        may drop them."""
        if type(events) is ScannedPiece:
            self._add_scanned(events)
            return
        if type(events) is SplitPiece:  # its parts in order, each as the piece it would be alone
            for part in events.parts:
                self.add(part)
            return
        if is_typed(events):
            self._rows_typed(events)
        else:
            self._rows(events)
        if len(self.rows) >= FLUSH_ROWS:
            self._flush()

    def _add_scanned(self, p: ScannedPiece) -> None:
        """The rows of a scanned piece as one batch, the same rows ``_rows_typed`` makes of those
        events (pending rows are flushed first: batches stay in file order)."""
        self._flush()
        if p.flows:
            self.skipped["flow"] += p.flows
        n = p.rows
        if not n:
            return
        encoded = p.cats.dictionary_encode()
        specs = [self._specs.get(cat) or self._resolve(cat) for cat in encoded.dictionary.to_pylist()]
        at = encoded.indices.to_numpy()
        code = np.array([spec[3] for spec in specs], np.int32)[at]
        group = np.array([_GROUPS.index(spec[1]) for spec in specs], np.int8)[at]
        is_kernel = np.array([spec[0] == S.KERNEL for spec in specs], bool)[at]
        gpu = group == _GROUPS.index(_GPU)
        flags = p.flags
        pid_null = (flags & F_PID_NULL) != 0
        tid_null = (flags & F_TID_NULL) != 0
        dev_null = (flags & F_DEV_NULL) != 0
        stream_null = (flags & F_STREAM_NULL) != 0
        device = np.where(dev_null, p.pid, p.device)
        device_null = ~gpu | (dev_null & pid_null) | (device < -(1 << 31)) | (device >= 1 << 31)
        has_corr = gpu | (group == _GROUPS.index(_RUNTIME))
        start_ns = us_to_ns(p.start_us)
        code_array = pa.array(code)
        batch: dict[str, Any] = {
            "kind": pc.take(pa.array(self._code_kind, pa.string()), code_array, memory_pool=POOL),
            "category": pc.take(_str_column(self._code_cat), code_array, memory_pool=POOL),
            "name": p.names,
            "start_ns": pa.array(start_ns, pa.int64()),
            "end_ns": pa.array(start_ns + us_to_ns(p.dur_us), pa.int64()),
            "on_gpu": pa.array(gpu, memory_pool=POOL),
            "device": pa.array(device.astype(np.int32), pa.int32(), mask=device_null, memory_pool=POOL),
            "stream": pa.array(np.where(stream_null, p.tid, p.stream), pa.int64(),
                               mask=~gpu | (stream_null & tid_null), memory_pool=POOL),
            "pid": pa.array(p.pid, pa.int64(), mask=gpu | pid_null, memory_pool=POOL),
            "tid": pa.array(p.tid, pa.int64(), mask=gpu | tid_null, memory_pool=POOL),
            "correlation": pa.array(p.correlation, pa.int64(), mask=~has_corr | ((flags & F_CORR_NULL) != 0),
                                    memory_pool=POOL),
        }
        rare = np.zeros(n, bool)
        rare[p.odd_rows] = True
        rare[p.colls.rows] = True
        gpu_host = gpu | (group == _GROUPS.index(_HOST))
        for row, e in zip(p.odd_rows.tolist(), p.odd_events):
            if gpu_host[row]:
                self._coll_event(row, e, specs[at[row]][0], bool(gpu[row]))
        placed = self._coll_scanned(p.colls, p.names, is_kernel, gpu, gpu_host, rare)
        sparse = {"coll_name": self.coll_name, "coll_group": self.coll_group, "coll_seq": self.coll_seq, "bytes": self.nbytes}
        for column, typ in _SPARSE_COLUMNS:
            batch[column] = _merged(placed[column], sparse[column], n, typ)
        self._batches.append(batch)
        self._new_rows()

    def _coll_scanned(self, c: CollArgs, names: pa.StringArray, is_kernel: np.ndarray, gpu: np.ndarray,
                      gpu_host: np.ndarray, rare: np.ndarray) -> dict[str, pa.Array | None]:
        """The collective and bytes columns of a scanned piece but its odd rows (None: no value):
        ``_rows_typed``'s branches and ``_coll_typed``'s steps as masks over the RARE rows
        (``scanned.CollArgs``) and the NCCL kernels, with names and dtypes looked up once per
        distinct string (row by row in Python, these columns cost a scanned piece more than all its others)."""
        n = len(names)
        rows = c.rows
        kernel = is_kernel[rows]
        coll = gpu_host[rows] & c.coll_present  # a collective's args
        code, coll_names = _factorized(c.coll, normalize_coll_name, self._coll_names)
        unnamed = np.array([name is None for name in coll_names], bool)[code]
        # a kernel's name names its collective where its collective's args name none, or where it has no
        # collective's args (RARE for ``bytes`` alone, or not RARE: the odd rows are read alone)
        by_kernel = gpu & is_kernel & ~rare
        by_kernel[rows[kernel & ((coll & unnamed) | (~c.coll_present & gpu[rows]))]] = True
        kernel_rows = np.flatnonzero(by_kernel)
        kernel_rows = kernel_rows[_nccl_named(names, kernel_rows)]
        kernel_code, kernel_colls = _factorized(names.take(pa.array(kernel_rows)), coll_from_kernel, self._kernel_colls)
        name_at = np.full(n, -1, np.int64)
        name_at[rows[coll]] = code[coll]
        name_at[kernel_rows] = len(coll_names) + kernel_code  # the kernel's over an unnamed collective's
        arg_at = np.full(n, -1, np.int64)
        arg_at[rows[coll]] = np.flatnonzero(coll)
        return {"coll_name": _taken(pa.array(coll_names + kernel_colls, pa.string()), name_at),
                "coll_group": _taken(c.group, arg_at),
                "coll_seq": _ints(n, (rows[coll], c.seq[coll], c.has_seq[coll])),
                "bytes": self._bytes_scanned(c, coll, kernel, gpu, n)}

    def _bytes_scanned(self, c: CollArgs, coll: np.ndarray, kernel: np.ndarray, gpu: np.ndarray,
                       n: int) -> pa.Array | None:
        """``bytes`` of a scanned piece's RARE rows: a collective's ``In msg nelems`` x its dtype's size
        (null beyond int64, as ``_sparse`` makes it), else a GPU row's ``bytes`` (not a kernel's)."""
        code, sizes = _factorized(c.dtype, dtype_bytes, self._dtype_sizes)
        known = np.array([size is not None for size in sizes], bool)[code]
        size = np.array([size or 1 for size in sizes], np.int64)[code]  # (known sizes are positive)
        product = c.nelems * size  # wraps beyond int64: caught by the division
        fits = coll & known & c.has_nelems & (product // size == c.nelems)
        plain = ~c.coll_present & gpu[c.rows] & ~kernel & c.bytes_present
        return _ints(n, (c.rows[fits], product[fits], True), (c.rows[plain], c.nbytes[plain], c.has_nbytes[plain]))

    def _coll_event(self, row: int, e: Any, kind: str, on_gpu: bool) -> None:
        """The collective and bytes columns of one row of a scanned piece, from its event decoded
        alone (a struct or a dict): ``_rows_typed``'s and ``_rows``' branches for them."""
        if type(e) is dict:
            a = e.get("args")
            if type(a) is dict:
                self._dict_colls(row, a, kind, e.get("name"), on_gpu)
            return
        a = e.args
        name = e.name
        if type(a) is not TraceArgs:
            return
        if a.collective_name is not UNSET:
            self._coll_typed(row, a, kind, name)
        elif on_gpu and kind is S.KERNEL:
            self._kernel_coll(row, name)
        elif on_gpu and a.bytes is not UNSET:
            self.nbytes[row] = a.bytes

    def _dict_colls(self, row: int, a: dict, kind: str, name: Any, on_gpu: bool) -> None:
        """The collective and bytes columns of a row from its dict args: a collective's args, else,
        on a GPU row, an NCCL kernel's name or the args' bytes."""
        if "Collective name" in a:
            self._coll_args(row, a, kind, name)
        elif on_gpu and kind is S.KERNEL:
            self._kernel_coll(row, name)
        elif on_gpu and "bytes" in a:
            self.nbytes[row] = a["bytes"]

    def _kernel_coll(self, row: int, name: Any) -> None:
        """An NCCL / RCCL kernel's collective, from its name (looked up once per distinct name)."""
        if type(name) is str and name.startswith(_NCCL_PREFIXES):
            coll = _cached(self._kernel_colls, name, coll_from_kernel)
            if coll is not None:
                self.coll_name[row] = coll

    def _rows_typed(self, events: list[TraceEvent]) -> None:
        """``_rows`` over typed events: the same rows, the same fast-path shape (an ``X`` event with
        object args, a category seen before and a string name); every other event goes through
        ``_event`` as the dict orjson would have made (``typedjson.event_dict``)."""
        rows = self.rows
        append = rows.append
        gpu_rows, gpu_device, gpu_stream, specs = self.gpu_rows, self.gpu_device, self.gpu_stream, self._specs
        slow = self._event
        KERNEL = S.KERNEL
        row = len(rows)
        flows = 0
        X, FLOWS = TraceEvent, FLOW_TYPES
        for e in events:
            t = type(e)
            if t is X:
                a = e.args
                name = e.name
                spec = specs.get(e.cat)
                if type(a) is TraceArgs and spec is not None and type(name) is str:
                    kind, group, cat, code = spec
                    if group is _RUNTIME:
                        append((code, name, e.ts, e.dur, e.pid, e.tid, a.correlation))
                    elif group is _GPU:
                        dev = a.device
                        stream = a.stream
                        append((code, name, e.ts, e.dur, None, None, a.correlation))
                        gpu_rows.append(row)
                        gpu_device.append(e.pid if dev is None else dev)
                        gpu_stream.append(e.tid if stream is None else stream)
                        if a.collective_name is not UNSET:
                            self._coll_typed(row, a, kind, name)
                        elif kind is KERNEL:
                            if name.startswith(_NCCL_PREFIXES):
                                coll = coll_from_kernel(name)
                                if coll is not None:
                                    self.coll_name[row] = coll
                        elif a.bytes is not UNSET:
                            self.nbytes[row] = a.bytes
                    else:
                        append((code, name, e.ts, e.dur, e.pid, e.tid, None))
                        if group is _HOST and a.collective_name is not UNSET:
                            self._coll_typed(row, a, kind, name)
                    row += 1
                    continue
            elif t in FLOWS:
                flows += 1
                continue
            added = slow(event_dict(e), row)
            if added == 1:
                row += 1
            elif added == 2:
                flows += 1
        if flows:
            self.skipped["flow"] += flows

    def _rows(self, events: Iterable[Any]) -> None:
        """Append raw values (checked later, per column, in ``_flush``).

        Hot: ~0.5 µs per event. The category decides which fields are looked at:
        host rows pid/tid (+ collective args), runtime rows also correlation, GPU
        rows device/stream/correlation (+ NCCL kernel names, memcpy bytes), python
        frames only pid/tid.

        The fast path takes the common shape (an ``X`` event with every field, args an
        object, a category and name seen before) with plain subscripts; anything else
        (a missing key, a value of another type, a first-seen name) raises KeyError or
        TypeError before the row is stored, and that event goes through ``_event``,
        the general (and defining) version. Flow events are only counted.
        """
        rows = self.rows
        append = rows.append
        gpu_rows, gpu_device, gpu_stream = self.gpu_rows, self.gpu_device, self.gpu_stream
        names, specs = self._names, self._specs
        slow = self._event
        KERNEL = S.KERNEL
        row = len(rows)
        flows = 0
        for e in events:
            rec = None
            try:
                ph = e["ph"]
                if ph == "X":
                    a = e["args"]
                    if type(a) is dict:
                        kind, group, cat, code = specs[e["cat"]]
                        name = names[e["name"]]
                        if group is _RUNTIME:
                            rec = (code, name, e["ts"], e["dur"], e["pid"], e["tid"], a.get("correlation"))
                        elif group is _GPU:
                            dev = a.get("device")
                            stream = a.get("stream")
                            if dev is None:
                                dev = e["pid"]
                            if stream is None:
                                stream = e["tid"]
                            rec = (code, name, e["ts"], e["dur"], None, None, a.get("correlation"))
                        else:
                            rec = (code, name, e["ts"], e["dur"], e["pid"], e["tid"], None)
                elif ph in FLOW_PHASES:
                    flows += 1
                    continue
            except (KeyError, TypeError):
                pass
            if rec is None:
                added = slow(e, row)
                if added == 1:
                    row += 1
                elif added == 2:
                    flows += 1
                continue
            append(rec)
            if group is _GPU:
                gpu_rows.append(row)
                gpu_device.append(dev)
                gpu_stream.append(stream)
                if "Collective name" in a:
                    self._coll_args(row, a, kind, name)
                elif kind is KERNEL:
                    if name[:4] in ("nccl", "rccl"):  # name is a str: it was found in names
                        coll = coll_from_kernel(name)
                        if coll is not None:
                            self.coll_name[row] = coll
                elif "bytes" in a:
                    self.nbytes[row] = a["bytes"]
            elif group is _HOST and "Collective name" in a:
                self._coll_args(row, a, kind, name)
            row += 1
        if flows:
            self.skipped["flow"] += flows

    def _event(self, e: Any, row: int) -> int:
        """One event, any shape: 1 if it became row ``row``, 2 if it is a flow, else 0."""
        if type(e) is not dict:
            self.skipped["not an object"] += 1
            return 0
        ph = e.get("ph")
        if ph == "X":
            dur = e.get("dur")
        elif type(ph) is not str:
            self.skipped["phase missing or not a string"] += 1
            return 0
        elif ph in FLOW_PHASES:
            return 2
        elif ph in INSTANT_PHASES:
            dur = 0
        else:
            self._other_phase(e, ph)
            return 0
        cat = e.get("cat")
        if type(cat) is not str and cat is not None:
            cat = str(cat)
        spec = self._specs.get(cat)
        if spec is None:
            spec = self._resolve(cat)
        kind, group, cat, code = spec
        if ph != "X":
            kind, group = S.INSTANT, _HOST
            code = self._code(kind, cat)
        name = e.get("name")
        if type(name) is str:
            name = self._names.setdefault(name, name)
        a = e.get("args")
        if type(a) is not dict:
            a = _EMPTY
        ts = e.get("ts")
        if group is _FRAME:
            self.rows.append((code, name, ts, dur, e.get("pid"), e.get("tid"), None))
        elif group is _HOST:
            self.rows.append((code, name, ts, dur, e.get("pid"), e.get("tid"), None))
            if "Collective name" in a:
                self._coll_args(row, a, kind, name)
        elif group is _RUNTIME:
            self.rows.append((code, name, ts, dur, e.get("pid"), e.get("tid"), a.get("correlation")))
        else:
            dev = a.get("device")
            stream = a.get("stream")
            self.rows.append((code, name, ts, dur, None, None, a.get("correlation")))
            self.gpu_rows.append(row)
            self.gpu_device.append(e.get("pid") if dev is None else dev)
            self.gpu_stream.append(e.get("tid") if stream is None else stream)
            self._dict_colls(row, a, kind, name, True)
        return 1

    def _coll_typed(self, row: int, a: TraceArgs, kind: str, event_name: Any) -> None:
        """``_coll_args`` of typed args (``coll_from_args`` step by step; names and dtypes of
        string values are looked up once per distinct string: record_param_comms rows are many)."""
        raw = a.collective_name
        if type(raw) is str:
            name = _cached(self._coll_names, raw, normalize_coll_name)
        else:
            name = normalize_coll_name(raw)
        group = a.group
        if group is not None and type(group) is not str:
            group = str(group)
        seq = a.seq
        if seq is None:
            seq = a.sequence_number
        if type(seq) is not int:
            seq = as_int(seq)
        nelems = a.in_msg_nelems
        if type(nelems) is not int:
            nelems = as_int(nelems)
        dtype = a.dtype
        if type(dtype) is str:
            size = _cached(self._dtype_sizes, dtype, dtype_bytes)
        else:
            size = None
        if name is None and kind == S.KERNEL and isinstance(event_name, str):
            name = coll_from_kernel(event_name)
        if name is not None:
            self.coll_name[row] = name
        if group is not None:
            self.coll_group[row] = group
        if seq is not None:
            self.coll_seq[row] = seq
        if nelems is not None and size is not None:
            self.nbytes[row] = nelems * size

    def _coll_args(self, row: int, a: dict, kind: str, event_name: Any) -> None:
        name, group, seq, nbytes = coll_from_args(a)
        if name is None and kind == S.KERNEL and isinstance(event_name, str):
            name = coll_from_kernel(event_name)
        for column, value in ((self.coll_name, name), (self.coll_group, group), (self.coll_seq, seq), (self.nbytes, nbytes)):
            if value is not None:
                column[row] = value

    def _other_phase(self, e: dict, ph: str) -> None:
        if ph in BEGIN_END:
            self.begin_end.append((e.get("ts"), len(self.begin_end), ph == "B", e.get("pid"), e.get("tid"),
                                   e.get("name"), e.get("cat")))
        elif ph == "M":
            self.metadata.append(e)
        else:
            self.skipped[f"phase {ph[:8]!r}"] += 1

    # ------------------------------------------------------------ rows -> arrays
    def _flush(self, end_us: dict[int, float] | None = None) -> None:
        """Check and convert the pending rows into one batch of arrays; drop bad rows."""
        n = len(self.rows)
        if not n:
            return
        codes, names, ts, dur, pid, tid, corr = zip(*self.rows)
        self.rows = []  # the tuples go now, the columns hold the values
        code = np.fromiter(codes, dtype=np.int32, count=n)
        kinds = np.array(self._code_kind, dtype=object)[code]  # for the drop counts only (same objects)
        start_us, bad_ts = _float_column(ts)
        dur_us, bad_dur = _float_column(dur)
        with np.errstate(invalid="ignore"):  # NaN compares False: such rows are caught by the checks below
            fine = (not bad_ts.any() and not bad_dur.any()
                    and bool(((np.abs(start_us) < US_LIMIT) & (dur_us >= 0) & (dur_us < US_LIMIT)).all()))
        if fine:  # the common case: every row is good (NaN and inf fail the comparisons)
            keep = None
            start_ns = us_to_ns(start_us)
            end_ns = start_ns + us_to_ns(dur_us)
        else:
            keep = np.ones(n, dtype=bool)
            self._drop(keep, bad_ts | ~np.isfinite(start_us), "missing or non-numeric ts", kinds)
            self._drop(keep, np.abs(np.nan_to_num(start_us)) >= US_LIMIT, "ts out of range", kinds)
            self._drop(keep, bad_dur | ~np.isfinite(dur_us), "missing or non-numeric dur", kinds)
            self._drop(keep, np.nan_to_num(dur_us) < 0, "negative dur", kinds)
            self._drop(keep, np.nan_to_num(dur_us) >= US_LIMIT, "dur out of range", kinds)
            start_ns = us_to_ns(np.where(keep, start_us, 0.0))
            end_ns = start_ns + us_to_ns(np.where(keep, dur_us, 0.0))
        if end_us:
            rows = np.fromiter(end_us.keys(), dtype=np.int64, count=len(end_us))
            end_ns[rows] = us_to_ns(np.fromiter(end_us.values(), dtype=np.float64, count=len(rows)))
        on_gpu = np.zeros(n, dtype=bool)
        on_gpu[self.gpu_rows] = True
        code_array = pa.array(code)
        batch: dict[str, Any] = {
            "kind": pc.take(pa.array(self._code_kind, pa.string()), code_array, memory_pool=POOL),
            "category": pc.take(_str_column(self._code_cat), code_array, memory_pool=POOL),
            "name": _str_column(names),
            "start_ns": pa.array(start_ns, pa.int64()),
            "end_ns": pa.array(end_ns, pa.int64()),
            "on_gpu": pa.array(on_gpu, memory_pool=POOL),
        }
        raw = {"device": self.gpu_device, "stream": self.gpu_stream, "pid": pid, "tid": tid, "correlation": corr}
        for column, typ, names in _ID_COLUMNS:
            id_names = self.id_names.get(names) if names else None
            if column in ("device", "stream"):  # GPU rows only
                batch[column] = _scatter(self.gpu_rows, raw[column], n, typ, id_names, column)
            else:
                batch[column] = _id_column(raw[column], typ, id_names, column)
        sparse = {"coll_name": self.coll_name, "coll_group": self.coll_group, "coll_seq": self.coll_seq, "bytes": self.nbytes}
        for column, typ in _SPARSE_COLUMNS:
            batch[column] = _sparse(sparse[column], n, typ)
        if keep is not None and not keep.all():
            mask = pa.array(keep)
            batch = {k: pc.filter(v, mask, memory_pool=POOL) for k, v in batch.items()}
        self._batches.append(batch)
        self._new_rows()

    def _drop(self, keep: np.ndarray, bad: np.ndarray, why: str, kinds: np.ndarray) -> None:
        bad = bad & keep
        if bad.any():
            keep &= ~bad
            for kind, count in Counter(kinds[bad]).items():  # kinds in row order of their first bad row
                self.dropped[(why, kind)] += count

    # ------------------------------------------------------------ B/E pairing
    def pair_begin_end(self) -> list[str]:
        """Pair B/E events per (pid, tid) as a stack (Chrome semantics) into spans."""
        warnings: list[str] = []
        by_thread: dict[tuple, list] = defaultdict(list)
        bad_ts = 0
        for item in self.begin_end:
            ts = item[0]
            if type(ts) not in (int, float) or ts != ts or abs(ts) >= US_LIMIT:
                bad_ts += 1
                continue
            by_thread[(_hashable(item[3]), _hashable(item[4]))].append(item)
        self.begin_end = []
        unmatched_end = unclosed = 0
        end_us: dict[int, float] = {}
        for events in by_thread.values():
            events.sort(key=lambda item: (item[0], item[1]))
            stack: list[tuple] = []
            for item in events:
                if item[2]:
                    stack.append(item)
                elif stack:
                    self._span(stack.pop(), item[0], end_us)
                else:
                    unmatched_end += 1
            unclosed += len(stack)
            while stack:
                self._span(stack.pop(), events[-1][0], end_us)
        self._flush(end_us)
        if bad_ts:
            self.skipped["B/E with bad ts"] += bad_ts
            warnings.append(f"skipped {bad_ts} B/E events with a missing or non-numeric ts")
        if unmatched_end:
            self.skipped["E without B"] += unmatched_end
            warnings.append(f"skipped {unmatched_end} E events with no open B on their thread")
        if unclosed:
            warnings.append(f"{unclosed} B events never ended: closed at their thread's last event")
        return warnings

    def _span(self, begin: tuple, end_ts: float, end_us: dict[int, float]) -> None:
        row = len(self.rows)
        ts, _, _, pid, tid, name, cat = begin
        self._rows(({"ph": "X", "dur": 0, "ts": ts, "pid": pid, "tid": tid, "name": name, "cat": cat},))
        end_us[row] = end_ts

    # ------------------------------------------------------------ the table
    def table(self, source: str, base_ns: int, labelled_cpu_pids: list[int]) -> tuple[pa.Table, int | None, list[str]]:
        """(schema table with rank left null for the loader, host pid, warnings about dropped rows).

        GPU rows get the host process's pid: the one Kineto labels "CPU", else the
        busiest caller of runtime APIs. ``base_ns`` is added to every time.
        """
        self._flush()
        batches = self._batches
        self._batches = []

        def column(name: str, typ: pa.DataType) -> pa.ChunkedArray:
            return pa.chunked_array([b[name] for b in batches], typ)

        kind = column("kind", pa.string())
        pid = column("pid", pa.int64())
        host_pid = _host_pid(kind, pid, labelled_cpu_pids)
        if host_pid is not None:
            pid = pc.if_else(column("on_gpu", pa.bool_()), pa.scalar(host_pid, pa.int64()), pid, memory_pool=POOL)
        n = len(kind)
        columns: dict[str, Any] = {
            "source": pa.chunked_array([pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(n, dtype=np.int8)), pa.array([source])).cast(pa.string())]),
            "kind": kind,
            "pid": pid,
            "start_ns": pc.add(column("start_ns", pa.int64()), base_ns, memory_pool=POOL),  # |base|, |t| < 2**62
            "end_ns": pc.add(column("end_ns", pa.int64()), base_ns, memory_pool=POOL),
        }
        for name in ("name", "category", "coll_name", "coll_group"):
            columns[name] = column(name, pa.string())
        for name, typ, _ in _ID_COLUMNS:
            columns.setdefault(name, column(name, typ))
        for name, typ in _SPARSE_COLUMNS:
            columns.setdefault(name, column(name, typ))
        arrays = [columns[f.name] if f.name in columns else pa.chunked_array([pa.nulls(n, f.type, memory_pool=POOL)]) for f in S.ARROW_SCHEMA]
        table = pa.Table.from_arrays(arrays, schema=S.ARROW_SCHEMA)
        warnings = []
        by_why: dict[str, Counter] = defaultdict(Counter)
        for (why, kind_name), count in self.dropped.items():
            by_why[why][kind_name] += count
        # in the order of the checks, whichever batch first had a dropped row of a kind
        for why, kinds in sorted(by_why.items(), key=lambda item: _DROP_REASONS.index(item[0])):
            detail = ", ".join(f"{k} {c}" for k, c in kinds.most_common())
            warnings.append(f"skipped {sum(kinds.values())} events with {why} ({detail})")
            self.skipped[why] += sum(kinds.values())
        return table, host_pid, warnings


def _host_pid(kind: pa.ChunkedArray, pid: pa.ChunkedArray, labelled_cpu_pids: list[int]) -> int | None:
    if len(labelled_cpu_pids) == 1:
        return labelled_cpu_pids[0]
    runtime_pids = pid.filter(pc.equal(kind, S.RUNTIME))
    counts = {d["values"]: d["counts"] for d in pc.value_counts(runtime_pids.drop_null()).to_pylist()}
    if not counts:
        counts = {d["values"]: d["counts"] for d in pc.value_counts(pid.drop_null()).to_pylist()}
    if labelled_cpu_pids:
        counts = {p: counts.get(p, 0) for p in labelled_cpu_pids}
    return max(counts, key=lambda p: counts[p]) if counts else None


def _hashable(value: Any) -> Any:
    return value if type(value) in (int, str, float, type(None)) else repr(value)


def _float_column(values: list) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values, mask of entries that were not numbers)."""
    n = len(values)
    if set(map(type, values)) <= {int, float}:
        try:  # fromiter: the same conversion per value as np.array, without its shape discovery (~2x faster)
            return np.fromiter(values, dtype=np.float64, count=n), np.zeros(n, dtype=bool)
        except OverflowError:
            pass
    out = np.empty(n, dtype=np.float64)
    bad = np.zeros(n, dtype=bool)
    for i, v in enumerate(values):
        if type(v) in (int, float):
            try:
                out[i] = v
                continue
            except OverflowError:
                pass
        out[i] = np.nan
        bad[i] = True
    return out, bad


def _str_column(values: list) -> pa.Array:
    try:
        return pa.array(values, pa.string(), memory_pool=POOL)
    except (pa.ArrowException, TypeError, ValueError, UnicodeError):
        return pa.array([_as_text(v) for v in values], pa.string(), memory_pool=POOL)


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    return value.encode("utf-8", "replace").decode("utf-8")


def _id_column(values: list, typ: pa.DataType, names: dict | None, what: str) -> pa.Array:
    """Integer ids; numeric strings become ints, other strings a stable hash (named in ``names``);
    an integral float its int, another float null (``_as_id``). Arrow's conversion straight to
    ``typ`` would truncate 1.5 to 1, so the fast path takes only what Arrow infers as integers."""
    try:
        inferred = pa.array(values, memory_pool=POOL)
        if pa.types.is_integer(inferred.type) or pa.types.is_null(inferred.type):
            return inferred.cast(typ, memory_pool=POOL)  # a safe cast: out of range raises
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    lo, hi = (-(1 << 31), (1 << 31) - 1) if typ == pa.int32() else (-(1 << 63), INT63)
    fixed = list(values)
    for i in [i for i, v in enumerate(values) if type(v) not in _INT_OR_NONE]:
        fixed[i] = _as_id(values[i], lo, hi, names, what)
    try:
        return pa.array(fixed, typ, memory_pool=POOL)
    except (pa.ArrowException, OverflowError):  # ints beyond the column's range
        return pa.array([v if v is None or lo <= v <= hi else None for v in fixed], typ, memory_pool=POOL)


def _as_id(v: Any, lo: int, hi: int, names: dict | None, what: str) -> int | None:
    i = as_int(v) if type(v) is not bool else None
    if i is None and isinstance(v, str) and v:
        if what in ("stream", "device"):
            i = as_int(v.rsplit(" ", 1)[-1])  # Kineto's old "stream 7" / "GPU 0" labels
        if i is None and names is not None:
            i = stable_id(v)
            if len(names) < 10_000:
                names[str(i)] = v[:200]
    return i if i is not None and lo <= i <= hi else None


def _scatter(rows: list[int], values: list, n: int, typ: pa.DataType, names: dict | None, what: str) -> pa.Array:
    """A column of ``n`` ids holding ``values`` (converted by ``_id_column``) at ``rows``, null elsewhere."""
    if not rows:
        return pa.nulls(n, typ, memory_pool=POOL)
    compact = _id_column(values, typ, names, what)
    return compact if len(rows) == n else _placed(rows, compact, n)


def _placed(rows: list[int], compact: pa.Array, n: int) -> pa.Array:
    """A column of ``n`` rows: ``compact``'s i-th value at row ``rows[i]``, null elsewhere."""
    index = np.full(n, -1, dtype=np.int64)
    index[np.fromiter(rows, dtype=np.int64, count=len(rows))] = np.arange(len(rows), dtype=np.int64)
    return _take_at(compact, index)


def _factorized(values: pa.StringArray, compute: Callable[[str], Any], cache: dict) -> tuple[np.ndarray, list]:
    """(each value's index in the list of results, ``compute`` of each distinct string, None for
    null): a piece's collectives repeat a few names and dtypes, each computed once in ``cache``."""
    if not len(values):
        return np.zeros(0, np.int64), []
    encoded = pc.dictionary_encode(values, null_encoding="encode", memory_pool=POOL)
    results = [None if key is None else _cached(cache, key, compute) for key in encoded.dictionary.to_pylist()]
    return encoded.indices.to_numpy(), results


def _nccl_named(names: pa.StringArray, rows: np.ndarray) -> np.ndarray:
    """Whether the names at ``rows`` start with ``nccl`` or ``rccl``, read off the array's buffers as
    the 4 bytes at each name's start (a take of the names would copy them: most rows are kernels,
    with long names; Arrow's starts_with would read every row's)."""
    _, offsets, data = names.buffers()
    bounds = np.frombuffer(offsets, np.int32, len(names) + 1, names.offset * 4)
    start = bounds[rows]
    named = bounds[rows + 1] - start >= 4
    if not named.any():
        return named
    words = np.ndarray((data.size - 3,), "<u4", data, 0, (1,))  # the 4 bytes from each byte on
    word = words[np.minimum(start, data.size - 4)]
    return named & ((word == _NCCL_WORDS[0]) | (word == _NCCL_WORDS[1]))


def _taken(values: pa.Array, index: np.ndarray) -> pa.Array | None:
    """``_take_at``, None where every row is null."""
    return None if (index < 0).all() else _take_at(values, index)


def _take_at(values: pa.Array, index: np.ndarray) -> pa.Array:
    """``values`` at ``index``, null where it is -1."""
    return pc.take(values, pa.array(index, mask=index < 0), memory_pool=POOL)


def _ints(n: int, *parts: tuple[np.ndarray, Any, Any]) -> pa.Array | None:
    """An int64 column of ``n`` rows from (rows, values, valid) parts, null elsewhere; None where
    no row is valid."""
    values = np.zeros(n, np.int64)
    valid = np.zeros(n, bool)
    for rows, part, ok in parts:
        values[rows] = part
        valid[rows] = ok
    if not valid.any():
        return None
    return pa.array(values, pa.int64(), mask=~valid, memory_pool=POOL)


def _merged(placed: pa.Array | None, values: dict[int, Any], n: int, typ: pa.DataType) -> pa.Array:
    """``placed`` (or nulls) with ``values`` (``_sparse``'s, from a scanned piece's odd rows) at
    their rows: the two never share a row."""
    if not values:
        return pa.nulls(n, typ, memory_pool=POOL) if placed is None else placed
    odd = _sparse(values, n, typ)
    return odd if placed is None else pc.coalesce(placed, odd, memory_pool=POOL)


def _sparse(values: dict[int, Any], n: int, typ: pa.DataType) -> pa.Array:
    """A column of ``n`` rows holding ``values`` (row -> value), null elsewhere. The values are
    converted on their own (each value converts alone, so this equals converting the full column
    with None between them) and placed: no list of ``n`` mostly-None entries."""
    if not values:
        return pa.nulls(n, typ, memory_pool=POOL)
    rows = sorted(values)  # (already in row order: rows are added in order)
    compact_values = list(map(values.__getitem__, rows))
    if typ != pa.string():
        return _scatter(rows, compact_values, n, typ, None, "value")
    return _placed(rows, _str_column(compact_values), n)
