"""Pieces of an event array read into columns by the compiled scanner (``jsonscan``).

``decoder()`` gives the piece decoder ``TraceJSON.chunks`` calls: it returns a ``ScannedPiece``
(columns, no Python object per event) where the scanner reads the piece exactly; a ``SplitPiece``
where it declines some elements (those go to ``typedjson.decode_piece``, the rest is scanned);
otherwise what ``decode_piece`` returns for the whole piece, so what the scanner declines reads
as before. ``EventColumns`` turns a ScannedPiece into the same rows the per-event loop makes
(``tests/test_jsonscan.py`` reads real and random traces both ways and compares everything).

Without numba (the ``fast`` extra), or with ``PROFKIT_NO_JIT`` set, there is no decoder and the
reader decodes with msgspec as before. The compiled functions come from ``scanbuild``: an
extension module built ahead of time once per machine (imports in under 1 ms, no numba in the
process), used for every file once it exists. Until then a file of ``MIN_FILE_BYTES`` or more on
disk builds it (~18 s, once); where it cannot be built, numba's JIT scanner serves such files
(importing numba and loading it cost a process ~0.4 s and ~100 MB of RSS, which only a large file
repays: the scanner saves ~30% of a read's CPU, ~0.3 s per 100 MB of JSON). Smaller files read
before the build keep to msgspec (a DEP256 x 200 rank file is 3.4 MB, the HTA trace of
``benchmarks/ingest.py`` 1.4 MB).
"""
from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from profkit.ingest.jsonio import EVENT_CUT
from profkit.ingest.typedjson import decode_piece
# the scanner's output layout (read here as scanned.X too, by the reader and the tests)
from profkit.ingest.scanlayout import (  # noqa: F401
    OK, DEFER, C_CAT_S, C_CAT_E, C_NAME_S, C_NAME_E, C_TS_S, C_TS_E, C_DUR_S, C_DUR_E, C_PID, C_TID, C_CORR,
    C_DEV, C_STREAM, C_EV_S, C_EV_E, C_FLAGS, N_INT_COLUMNS, F_PID_NULL, F_TID_NULL, F_CORR_NULL, F_DEV_NULL,
    F_STREAM_NULL, F_TS_SLOW, F_DUR_SLOW, F_RARE, N_COLL_ARGS, A_COLL, A_BYTES, A_GROUP, A_SEQ, A_SEQNUM,
    A_NELEMS, A_DTYPE, V_MISSING, V_NULL, V_STRING, V_INT, V_ODD, MAX_DEPTH,
)

NO_JIT_ENV = "PROFKIT_NO_JIT"  # set (any value): no compiled code, here as in the impact replay
MIN_FILE_BYTES = 8 << 20  # on disk (gzip or not): see the module docstring
MIN_BYTES_ENV = "PROFKIT_SCAN_MIN_BYTES"  # overrides MIN_FILE_BYTES
CHUNK_BYTES = 2 << 20  # JSON per scanned piece: its fixed cost (~30 numpy and Arrow calls) stays small
# ... and per piece of a file of LARGE_FILE_BYTES or more on disk (``chunk_bytes``): four simulated
# 182 MB ranks (15 MB gzip'd) read in 1.29 s of CPU against 1.39 s in 4 MB pieces and 1.54 s in
# 2 MB (16 MB: no better). A smaller file keeps 2 MB pieces: 8 MB ones hold ~40 MB more at once
# (the piece, the scanner's output arrays), which raised the peak of a load of 8 ranks of 25 MB
# of JSON (``benchmarks/ingest.py``) from 230 to 270 MB for 0.05 s
LARGE_CHUNK_BYTES = 8 << 20
LARGE_FILE_BYTES = 8 << 20
US_LIMIT = 4.0e15  # as traceevents.US_LIMIT: rows outside are dropped with a warning there, so defer

ROW_BYTES = 96  # the least JSON per row the output arrays make room for (``new_outputs``)


def rows_for(n_bytes: int) -> int:
    return n_bytes // ROW_BYTES + 1


def new_outputs(n_bytes: int) -> tuple[np.ndarray, ...]:
    """The scanner's output arrays for a piece of ``n_bytes``, and its scratch space: made here,
    the compiled code runs without numba's reference counting (``_nrt=False``: no allocation
    inside). Room for a row per ``ROW_BYTES``: the rows of a denser piece past that are declined
    (decoded by msgspec), which real traces never have (Kineto's complete events take 150-300
    bytes)."""
    cap = rows_for(n_bytes)
    return (np.empty((N_INT_COLUMNS, cap), np.int64), np.empty((2, cap), np.float64),
            np.empty((1 + 3 * N_COLL_ARGS, cap), np.int64), np.empty((3, N_COLL_ARGS), np.int64),
            np.empty(MAX_DEPTH, np.uint8))
# the kinds each arg is read with here (text args: strings; the others: integers); a row with another
# kind (a float, a bool, a list, an escaped string, a key given twice) has its event decoded alone
_TEXT_ARGS = (A_COLL, A_GROUP, A_DTYPE)
_INT_ARGS = (A_BYTES, A_SEQ, A_SEQNUM, A_NELEMS)


@dataclass
class CollArgs:
    """The collective args (and ``bytes``) of a piece's RARE rows, as ``typedjson.TraceArgs`` holds
    them, one array per arg (the reader works on them per distinct value, not per row): text args
    null where null or missing, integer args valid where ``has_*`` (``*_present`` tell null from
    missing where it matters)."""

    rows: np.ndarray  # int64
    coll_present: np.ndarray  # bool, as each of the masks
    coll: pa.StringArray
    bytes_present: np.ndarray
    nbytes: np.ndarray  # int64, as each of the integer args
    has_nbytes: np.ndarray
    group: pa.StringArray
    seq: np.ndarray  # ``Seq``, else ``Sequence number``
    has_seq: np.ndarray
    nelems: np.ndarray
    has_nelems: np.ndarray
    dtype: pa.StringArray


@dataclass
class ScannedPiece:
    """The rows (``X`` events, in order) of one piece, as arrays; flows only counted."""

    rows: int
    flows: int
    cats: pa.StringArray
    names: pa.StringArray
    start_us: np.ndarray
    dur_us: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    correlation: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    flags: np.ndarray  # jsonscan.F_* bits
    colls: CollArgs  # rows whose args hold "Collective name" or "bytes"
    odd_rows: np.ndarray  # such rows with an arg of another kind
    odd_events: list  # their events, decoded alone by ``decode_piece`` (structs or dicts)


@dataclass
class SplitPiece:
    """A piece the scanner read but for some of its elements: its ScannedPieces and the lists of the
    elements it declined (decoded alone by ``decode_piece``), in file order."""

    parts: list


def min_file_bytes() -> int:
    """``MIN_FILE_BYTES``, or the ``PROFKIT_SCAN_MIN_BYTES`` environment variable's value (0: the
    scanner for every file, when many middling files are read in one process)."""
    value = os.environ.get(MIN_BYTES_ENV, "").strip()
    if value:
        try:
            return max(0, int(float(value)))
        except ValueError:
            pass
    return MIN_FILE_BYTES


# "scan", "gather": the compiled functions this process uses; "threads": whether they release the
# GIL (numba's JIT does; the ahead-of-time build's wrappers hold it, numba.pycc has no nogil)
_KERNEL: dict[str, Any] = {}


def _loaded() -> bool:
    return "scan" in _KERNEL


def available() -> bool:
    """Whether the scanner can be used (numba installed, ``PROFKIT_NO_JIT`` unset), without
    importing numba (a read from the parsed-trace cache never needs it)."""
    return not os.environ.get(NO_JIT_ENV) and importlib.util.find_spec("numba") is not None


def _kernels(size_bytes: int | None) -> bool:
    """Load the compiled functions: the ahead-of-time build when it exists (``scanbuild``: no
    numba in the process), else, for a file of ``min_file_bytes()`` or more, build it, or at
    worst use numba's JIT. False when the file should be read the usual way."""
    if _KERNEL:
        return True
    from profkit.ingest import scanbuild

    module = scanbuild.compiled()
    if module is None:
        if size_bytes is not None and size_bytes < min_file_bytes():
            return False
        module = scanbuild.build()
    threads = module is None
    if module is None:
        try:
            from profkit.ingest import jsonscan as module  # the JIT: numba in this process
        except ImportError:
            return False
    _KERNEL.update(scan=module.scan_piece, gather=module.gather_into, threads=threads)
    return True


def threads_help(size_bytes: int) -> bool:
    """Whether reading files of ``size_bytes`` on threads runs them in parallel: only while numba's
    JIT scans them (it releases the GIL). The built scanner and msgspec hold the GIL, so threads
    would only hold more files in memory at once. Loads (or builds) the scanner as ``decoder`` would."""
    return available() and _kernels(size_bytes) and bool(_KERNEL.get("threads"))


def build_for(paths: Iterable[Path], progress: Callable[[str], None] | None = None) -> None:
    """Build the scanner before reading ``paths`` when one of them is a JSON trace large enough to
    need it and it is not built yet: once per machine, saying so (a first ``profkit analyze``
    otherwise sits ~20 s in its first large file without a word), and in this process, before a
    pool's workers start (each would wait on the build's lock). A scanner built ahead of time is
    loaded here too (~3 ms), so forked workers have it from the start."""
    if not available():
        return
    sizes = [file_size(path) for path in paths if path.name.endswith((".json", ".json.gz"))]
    if not sizes:
        return
    from profkit.ingest import scanbuild

    if max(sizes) >= min_file_bytes() and scanbuild.pending():
        if progress:
            progress("building profkit's compiled JSON scanner (once per machine, ~20 s)")
        scanbuild.build()
    if scanbuild.compiled() is not None:  # never numba's JIT here: ~100 MB the driver would keep
        _kernels(None)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def decoder(size_bytes: int | None = None) -> Callable[[Any], Any] | None:
    """The scanning decoder, or None: no numba, ``PROFKIT_NO_JIT``, or a small file while the
    scanner is neither built nor loaded."""
    if not available() or not _kernels(size_bytes):
        return None
    return decode


def _strings(b: np.ndarray, starts: np.ndarray, ends: np.ndarray, valid: np.ndarray | None = None) -> pa.StringArray:
    """The spans as an Arrow string array (null where not ``valid``); raises ArrowInvalid if one
    is not UTF-8."""
    starts = np.ascontiguousarray(starts)
    ends = np.ascontiguousarray(ends)
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(ends - starts, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    _KERNEL["gather"](b, starts, ends, data)
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    out = pa.StringArray.from_buffers(len(starts), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data), bitmap)
    out.validate(full=True)
    return out


def chunk_bytes(size_bytes: int | None) -> int:
    """JSON per scanned piece of a file of ``size_bytes`` on disk (``LARGE_CHUNK_BYTES`` from
    ``LARGE_FILE_BYTES`` on, else ``CHUNK_BYTES``)."""
    return LARGE_CHUNK_BYTES if size_bytes is not None and size_bytes >= LARGE_FILE_BYTES else CHUNK_BYTES


def _outputs(n_bytes: int) -> tuple[np.ndarray, ...]:
    """The scanner's output arrays, reused piece after piece in a thread (fresh ones for each
    piece cost a page fault per 4 KB written)."""
    held = getattr(_HELD, "outputs", None)
    if held is None or held[0].shape[1] < rows_for(n_bytes):
        held = _HELD.outputs = new_outputs(max(n_bytes, 2 * CHUNK_BYTES))
    return held


_HELD = threading.local()


def release() -> None:
    """Drop this thread's output arrays (tens of MB) once a file is read."""
    _HELD.outputs = None


def decode(view: Any) -> Any:
    """A piece (``[`` ... ``]``, as ``TraceJSON.chunks`` hands it): a ScannedPiece; a SplitPiece where
    the scanner declines some of its elements (Kineto's metadata at the head of a trace, its instant
    events at the tail: each a piece of its own otherwise, decoded whole the slow way); or what
    ``decode_piece`` makes of the whole piece where that is not worth it or not sound (bytes that
    are not JSON: the chunker then cuts elsewhere)."""
    b = np.frombuffer(view, np.uint8)
    hi = len(b) - 1
    if hi < 1:
        return decode_piece(view)
    parts: list = []
    lo = 1  # the bytes before it are in parts, or in the declined span
    declined: tuple[int, int] | None = None  # elements declined since the last scanned ones (their bytes)
    done = False
    for _ in range(MAX_DECLINED):
        if len(parts) >= MAX_PARTS:
            break  # a scanned piece costs ~30 array calls: elements declined all over, the rest as one
        ints, floats, rare, scratch, stack = _outputs(hi)
        status, rows, flows, n_rare, at = _KERNEL["scan"](b, lo, hi, ints, floats, rare, scratch, stack)
        if status != OK and at < 0:
            return decode_piece(view)  # stopped between elements (a bad separator, not an object)
        if rows or flows or (status == OK and not parts and declined is None):  # (no element: a piece of no row)
            if declined is not None:
                parts.append(_declined(view, declined))
                declined = None
            parts.append(_scanned(b, ints, floats, rare, rows, flows, n_rare))
        if status == OK:
            done = True
            break
        # the element at ``at`` ends where the next one starts (a cut inside one of its strings or
        # nested objects: what follows is declined too, so the span stays the original bytes)
        m = EVENT_CUT.search(view, at, hi)
        start = at if declined is None else declined[0]
        if m is None:
            declined, done = (start, hi), True
            break
        declined, lo = (start, m.start() + 1), m.end() - 1
    if not done:  # declined too often, or in too many places: the rest as one span
        declined = (lo if declined is None else declined[0], hi)
    if declined is not None:
        parts.append(_declined(view, declined))
    if any(p is None for p in parts):
        return decode_piece(view)  # not JSON where cut, or rows to drop: the whole piece, the usual way
    return parts[0] if len(parts) == 1 else SplitPiece(parts)


MAX_DECLINED = 64  # elements of one piece declined one by one at most; the rest of the piece is decoded as one
MAX_PARTS = 16  # scanned and declined stretches of one piece at most; the rest of it is decoded as one


def _declined(view: Any, span: tuple[int, int]) -> list | None:
    """The declined elements in ``view[span]`` (whole elements with their separators), decoded."""
    a, z = span
    return decode_piece(b"[" + bytes(view[a:z]) + b"]") if z > a else []


def _scanned(b: np.ndarray, ints: np.ndarray, floats: np.ndarray, rare: np.ndarray, rows: int, flows: int,
             n_rare: int) -> ScannedPiece | None:
    """The ScannedPiece of the scanner's ``rows`` rows (None: a value left to the per-event path)."""
    ints = ints[:, :rows]
    flags = ints[C_FLAGS].copy()
    start_us, dur_us = floats[0, :rows].copy(), floats[1, :rows].copy()
    try:
        cats = _strings(b, ints[C_CAT_S], ints[C_CAT_E])
        names = _strings(b, ints[C_NAME_S], ints[C_NAME_E])
        for values, bit, s, e in ((start_us, F_TS_SLOW, C_TS_S, C_TS_E), (dur_us, F_DUR_SLOW, C_DUR_S, C_DUR_E)):
            slow = np.flatnonzero(flags & bit)
            if slow.size:  # correctly rounded, as msgspec and orjson parse them
                values[slow] = pc.cast(_strings(b, ints[s, slow], ints[e, slow]), pa.float64()).to_numpy()
        with np.errstate(invalid="ignore"):
            if not bool(((np.abs(start_us) < US_LIMIT) & (dur_us >= 0) & (dur_us < US_LIMIT)).all()):
                return None  # rows to drop: the per-event path counts and names them
        colls, odd_rows = _coll_args(b, rare[:, :n_rare])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a string that is not UTF-8, a number Arrow rejects
        return None
    odd_events: list = []
    if odd_rows.size:
        starts, ends = ints[C_EV_S, odd_rows], ints[C_EV_E, odd_rows]
        odd_events = decode_piece(b"[" + b",".join(b[s:e].tobytes() for s, e in zip(starts, ends)) + b"]") or []
        if len(odd_events) != odd_rows.size:
            return None
    return ScannedPiece(rows, flows, cats, names, start_us, dur_us, ints[C_PID].copy(), ints[C_TID].copy(),
                        ints[C_CORR].copy(), ints[C_DEV].copy(), ints[C_STREAM].copy(), flags, colls, odd_rows,
                        odd_events)


def _coll_args(b: np.ndarray, rare: np.ndarray) -> tuple[CollArgs, np.ndarray]:
    """(the RARE rows read here, the rows whose events are decoded alone) from the scanner's table."""
    kinds, first, second = rare[1::3], rare[2::3], rare[3::3]  # (N_COLL_ARGS x rare rows) each
    odd = (kinds == V_ODD).any(axis=0)
    odd |= (kinds[list(_TEXT_ARGS)] == V_INT).any(axis=0) | (kinds[list(_INT_ARGS)] == V_STRING).any(axis=0)
    kept = ~odd if odd.any() else slice(None)  # views if none is left out: each column below is new
    kinds, first, second = kinds[:, kept], first[:, kept], second[:, kept]

    def text(slot: int) -> pa.StringArray:
        is_text = kinds[slot] == V_STRING
        if not is_text.any():
            return pa.nulls(len(is_text), pa.string())
        return _strings(b, np.where(is_text, first[slot], 0), np.where(is_text, second[slot], 0), is_text)

    def integer(slot: int) -> tuple[np.ndarray, np.ndarray]:
        is_int = kinds[slot] == V_INT
        return np.where(is_int, first[slot], 0), is_int

    seq, has_seq = integer(A_SEQ)
    seq_number, has_seq_number = integer(A_SEQNUM)
    colls = CollArgs(rare[0, kept].copy(), kinds[A_COLL] != V_MISSING, text(A_COLL), kinds[A_BYTES] != V_MISSING,
                     *integer(A_BYTES), text(A_GROUP), np.where(has_seq, seq, seq_number), has_seq | has_seq_number,
                     *integer(A_NELEMS), text(A_DTYPE))
    return colls, rare[0, odd]
