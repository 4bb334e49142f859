"""The span recorder: a bounded in-memory buffer per process, written off the hot path.

Hot path (``add``): one tuple ``(name_id, category_id, start_ns, end_ns, tid)`` appended to a
list; no locks, no I/O. When the list holds ``capacity`` spans it is swapped for an empty one and
handed to a background writer thread (``PROFKIT_SPAN_BUFFER``, default 16384). The writer also
swaps every ``PROFKIT_FLUSH_S`` seconds (default 2; 0 = only when full), so a SIGKILL'd process
loses at most that much, and the capture launcher can show progress. It encodes in chunks and
yields the GIL between them, so it never stalls the step loop for long.

Without an output folder (``PROFKIT_OUT_DIR`` unset and none given) nothing touches the disk: the
last ``keep_batches`` full buffers stay in memory (``spans()`` reads them; tests use this).

A process writes a file only once it has recorded a span other than a GC pause, so helper
processes that merely inherit the capture environment (compile workers) leave no files.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from typing import NamedTuple

from . import clock, identity
from .spanfile import SpanFile
from .strings import STRINGS, StringTable

DEFAULT_CAPACITY = 16384
DEFAULT_FLUSH_S = 2.0
#: a swapped buffer is encoded only after this long, so an append racing the swap on another
#: thread (it read ``_buf`` just before the swap) still lands in the batch that gets written
SETTLE_NS = 20_000_000
GC_CATEGORY = "gc"

_get_ident = threading.get_ident
_STOP = object()


class SpanRecord(NamedTuple):
    """One span with its strings resolved (for tests and in-process inspection)."""

    name: str
    category: str
    start_ns: int  # monotonic
    end_ns: int  # monotonic
    tid: int  # OS thread id
    args: dict | None = None


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class Recorder:
    """Spans of one process. ``add`` is safe from any thread; writing happens on the writer thread
    (or on the caller's thread in ``flush``, used at exit and on signals)."""

    def __init__(self, out_dir: str | None = None, *, capacity: int | None = None,
                 flush_interval_s: float | None = None, keep_batches: int = 2,
                 strings: StringTable = STRINGS):
        self.capacity = max(1, int(capacity or _env_float("PROFKIT_SPAN_BUFFER", DEFAULT_CAPACITY)))
        self.flush_interval_s = (_env_float("PROFKIT_FLUSH_S", DEFAULT_FLUSH_S)
                                 if flush_interval_s is None else flush_interval_s)
        self.strings = strings
        self.gc_category_id = strings.id(GC_CATEGORY)
        self._keep_batches = keep_batches
        self._buf: list[tuple] = []
        self._tids: dict[int, int] = {}
        self._reset_process_state()
        self.out_dir: str | None = None
        if out_dir:
            self.set_out_dir(out_dir)

    def _reset_process_state(self) -> None:
        """State that belongs to one process (re-created in a forked child)."""
        self._lock = threading.RLock()  # file writing
        self._swap_lock = threading.RLock()  # reentrant: a signal handler may flush mid-swap
        self._pending: deque[tuple[int, list[tuple]]] = deque()
        self._wake: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._kept: deque[list[tuple]] = deque(maxlen=max(1, self._keep_batches))
        self._held_gc: deque[list[tuple]] = deque(maxlen=4)  # GC-only batches before the first span
        self._active = False
        self._file: SpanFile | None = None
        self.pid = os.getpid()
        self.start_anchor = clock.anchor()
        self.identity = identity.current()
        self.dropped = 0
        self.closed = False

    # -- hot path ---------------------------------------------------------------------------------
    def add(self, name_id: int, category_id: int, start_ns: int, end_ns: int) -> None:
        try:
            tid = self._tids[_get_ident()]
        except KeyError:
            tid = self._new_thread()
        buf = self._buf
        buf.append((name_id, category_id, start_ns, end_ns, tid))
        if len(buf) >= self.capacity:
            self._swap()

    def add_args(self, name_id: int, category_id: int, start_ns: int, end_ns: int, args: dict) -> None:
        """A span with extra facts (a 6th element in the file), e.g. GC counts."""
        try:
            tid = self._tids[_get_ident()]
        except KeyError:
            tid = self._new_thread()
        buf = self._buf
        buf.append((name_id, category_id, start_ns, end_ns, tid, args))
        if len(buf) >= self.capacity:
            self._swap()

    def _new_thread(self) -> int:
        """OS thread id, cached per Python thread (``get_native_id`` is a syscall, ~150 ns)."""
        tid = threading.get_native_id()
        self._tids[_get_ident()] = tid
        return tid

    def _swap(self) -> None:
        """Hand the full buffer on (rare: once per ``capacity`` spans or per flush); locked so a
        swap by the writer's timer and one by a full buffer never hand on the same list twice."""
        with self._swap_lock:
            full, self._buf = self._buf, []
            self._tids = {}  # thread idents can be reused by new threads: re-learn once per buffer
            if not full:
                return
            if self._file is None or self.closed:
                if len(self._kept) == self._kept.maxlen:
                    self.dropped += len(self._kept[0])
                self._kept.append(full)
                return
            self._pending.append((clock.now_ns(), full))
        if self._thread is None:
            self._start_writer()
        self._wake.put(None)

    # -- output -----------------------------------------------------------------------------------
    def set_out_dir(self, out_dir: str) -> None:
        """Write to ``out_dir/spans-pid{pid}.jsonl`` from now on (spans kept in memory go too)."""
        with self._lock:
            self.closed = False
            self.out_dir = str(out_dir)
            self._file = SpanFile(self.out_dir, self.pid, self.strings, self.start_anchor)
            while self._kept:
                self._pending.append((0, self._kept.popleft()))
        if self._thread is None:
            self._start_writer()

    @property
    def path(self) -> str | None:
        return self._file.path if self._file is not None else None

    def _start_writer(self) -> None:
        with self._lock:
            if self._thread is not None or self._file is None or self.closed:
                return
            thread = threading.Thread(target=self._writer_main, name="profkit-span-writer", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # interpreter shutting down, or no threads left: flush() still writes
                return
            self._thread = thread

    def _writer_main(self) -> None:
        wake = self._wake
        while True:
            timeout = self.flush_interval_s if self.flush_interval_s > 0 else None
            try:
                item = wake.get(timeout=timeout)
            except queue.Empty:
                if not self._buf:
                    continue
                self._swap()  # periodic flush (its wake token is consumed by a later, empty pass)
                item = None
            if item is _STOP:
                return
            if self._pending:
                wait_ns = self._pending[-1][0] + SETTLE_NS - clock.now_ns()
                if wait_ns > 0:
                    time.sleep(wait_ns / 1e9)
            try:
                self._drain(yield_gil=True)
            except Exception as exc:  # noqa: BLE001 - never let the writer die silently
                print(f"profkit: span writer error: {exc!r}", flush=True)

    def _drain(self, yield_gil: bool, final: bool = False) -> None:
        with self._lock:
            if self._file is None:
                return
            wrote = False
            while self._pending:
                _, batch = self._pending.popleft()
                if not self._active:
                    if all(rec[1] == self.gc_category_id for rec in batch):
                        self._held_gc.append(batch)
                        continue
                    self._active = True
                    held = [rec for b in self._held_gc for rec in b]
                    self._held_gc.clear()
                    if held:
                        self._write(held, yield_gil)
                self._write(batch, yield_gil)
                wrote = True
            if final and self._active and not wrote:
                self._write([], yield_gil)  # a last anchor (and the final identity)

    def _write(self, batch: list[tuple], yield_gil: bool) -> None:
        assert self._file is not None
        header = self.identity.refresh()
        self._file.write(batch, header, clock.anchor(), yield_gil=yield_gil)

    def flush(self) -> None:
        """Write everything recorded so far, on the calling thread (exit, signals, tests)."""
        self._swap()
        if self._file is not None:
            self._drain(yield_gil=False, final=True)

    def close(self) -> None:
        """Final flush; stop the writer thread; close the file. Later spans stay in memory."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            self._wake.put(_STOP)
            thread.join(timeout=2.0)
        self._thread = None
        with self._lock:
            if self._file is not None:
                self._file.close()

    def after_fork_in_child(self) -> None:
        """A forked child is another process: new pid, new file, no inherited spans or threads."""
        out_dir = self.out_dir
        self._buf = []
        self._tids = {}
        identity.reset()
        self._reset_process_state()
        self.out_dir = None
        if out_dir:
            self.set_out_dir(out_dir)

    # -- inspection -------------------------------------------------------------------------------
    def spans(self) -> list[SpanRecord]:
        """Spans still in memory (kept full buffers, then the current one), strings resolved."""
        text = self.strings.text
        out = []
        for batch in [*self._kept, self._buf]:
            for rec in list(batch):
                out.append(SpanRecord(text(rec[0]), text(rec[1]), rec[2], rec[3], rec[4],
                                      rec[5] if len(rec) > 5 else None))
        return out

    def __repr__(self) -> str:
        where = self.path or "memory"
        return f"<Recorder pid={self.pid} {where} buffered={len(self._buf)} capacity={self.capacity}>"


class _Current:
    """Holder of the process's recorder; wrappers read ``CURRENT.rec`` at call time."""

    __slots__ = ("rec",)

    def __init__(self) -> None:
        self.rec: Recorder = Recorder()


CURRENT = _Current()


def get_recorder() -> Recorder:
    return CURRENT.rec


def use_recorder(rec: Recorder) -> Recorder:
    """Make ``rec`` the process's recorder; returns the previous one (tests)."""
    previous, CURRENT.rec = CURRENT.rec, rec
    return previous
