"""Open trace JSON (plain or gzip) and hand out its events in bounded chunks.

Why chunks: ``orjson.loads`` of a whole trace turns 1 MB of JSON into ~6 MB of
Python dicts, so a 1 GB rank trace would need ~6 GB at once. Instead the
``traceEvents`` array is cut at event boundaries (``}, {``) into pieces of about
``CHUNK_BYTES`` and each piece is parsed on its own; only one piece's dicts are
alive at a time. A cut can only be wrong if it falls inside a string or a nested
object, and then that piece is not valid JSON on its own (an open string or an
unbalanced bracket), so every piece is verified by parsing it. If anything does
not verify, the caller falls back to one whole-document parse, which also gives
the exact error position for broken files. Nothing is ever eval'd or unpickled.
"""
from __future__ import annotations

import gc
import gzip
import json
import re
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from profkit.errors import TraceError

try:  # ISA-L inflate: ~3x zlib's speed (a 182 MB rank: 0.08 s vs 0.27 s); optional, ``pip install profkit[fast]``
    from isal import igzip as _igzip
    from isal.isal_zlib import error as _IsalError
except ImportError:  # pragma: no cover - depends on what is installed
    _igzip = None
    _IsalError = zlib.error
GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, _IsalError)


def gzip_reader(fileobj):
    """A file object inflating ``fileobj`` (gzip): ISA-L's when installed, else the standard library's."""
    return _igzip.IGzipFile(fileobj=fileobj, mode="rb") if _igzip is not None else gzip.GzipFile(fileobj=fileobj, mode="rb")


def gunzip(data: bytes) -> bytes:
    return _igzip.decompress(data) if _igzip is not None else gzip.decompress(data)

# 256 KB of JSON per parse (~1.5 MB of dicts alive). Measured on 8 x 25 MB Kineto traces:
# 256-512 KB pieces load in 1.2 s with ~2k page faults, 2 MB pieces in 1.9 s with ~280k.
# orjson parses a document whose yyjson work area fits its static 8 MB buffer (input under
# ~0.7 MB) without allocating; above that every piece mallocs (and faults in) fresh
# multi-MB memory. Rows are batched into Arrow separately (see traceevents), so small
# pieces do not mean small batches.
CHUNK_BYTES = 256 << 10
READ_BYTES = 64 << 10  # per read from the file: small reads reuse heap memory (no mmap churn)
HEAD_BYTES = 64 << 10
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
UTF8_BOM = b"\xef\xbb\xbf"

EVENT_CUT = re.compile(rb"\}\s*,\s*\{")  # between two events of the array (or inside one: a parse verifies)
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = b" \t\r\n"
_MAX_RETRIES = 4


class ChunkingFailed(Exception):
    """A cut did not verify; the caller restarts with ``TraceJSON.whole()``."""


# ---------------------------------------------------------------- bytes in


def _open_error(path: Path, exc: OSError) -> TraceError:
    if isinstance(exc, FileNotFoundError):
        return TraceError(path, "no such file")
    if isinstance(exc, IsADirectoryError):
        return TraceError(path, "is a directory, not a trace file")
    if isinstance(exc, PermissionError):
        return TraceError(path, "permission denied")
    return TraceError(path, f"cannot read: {exc.strerror or exc}")


def _gunzip_error(path: Path, exc: Exception) -> TraceError:
    if isinstance(exc, EOFError):
        return TraceError(path, "truncated gzip: the compressed stream ends early (file cut off while copying or writing?)")
    return TraceError(path, f"corrupt gzip data: {exc}")


def read_bytes(path: str | Path) -> bytes:
    """The whole decompressed file. Gzip is recognised by its magic bytes, not the name."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise _open_error(path, exc) from None
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gunzip(raw)
        except (OSError, ValueError, *GZIP_ERRORS) as exc:
            raise _gunzip_error(path, exc) from None
    elif raw[:4] == ZSTD_MAGIC:
        raise TraceError(path, "zstd-compressed file: decompress it first (zstd -d)")
    if raw[:3] == UTF8_BOM:
        raw = raw[3:]
    if not raw.strip():
        raise TraceError(path, "empty file" if not raw else "file holds only whitespace")
    return raw


def read_head(path: str | Path, n_bytes: int = HEAD_BYTES) -> bytes:
    """The first ``n_bytes`` of the decompressed file, for sniffing (cheap on huge files)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
            fh.seek(0)
            if magic == GZIP_MAGIC:
                try:
                    with gzip_reader(fh) as gz:
                        head = gz.read(n_bytes)
                except GZIP_ERRORS as exc:
                    raise _gunzip_error(path, exc) from None
            else:
                head = fh.read(n_bytes)
    except OSError as exc:
        if isinstance(exc, gzip.BadGzipFile):
            raise _gunzip_error(path, exc) from None
        raise _open_error(path, exc) from None
    if head[:3] == UTF8_BOM:
        head = head[3:]
    return head


# ---------------------------------------------------------------- parsing


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while millions of acyclic dicts are made and dropped.

    The collector would rescan the growing heap again and again (measured: orjson
    on a 26 MB trace takes 0.38 s with GC on, 0.13 s off); refcounting still frees
    every chunk as soon as it is dropped.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def loads(data: bytes | bytearray, path: str | Path, notes: list[str] | None = None) -> Any:
    """Parse a whole JSON document or raise TraceError saying where it breaks.

    Two lenient retries keep one bad string from costing a whole rank: invalid UTF-8
    (a C++ writer cutting a multi-byte name) is replaced with U+FFFD, and NaN /
    Infinity / lone surrogates, which orjson rejects, go to Python's json.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        problem = _describe(exc)
        utf8 = "not valid UTF-8" in str(exc)
    if utf8:
        text = bytes(data).decode("utf-8", "replace")
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError:
            data = text.encode("utf-8", "surrogatepass")
        else:
            if notes is not None:
                notes.append("invalid UTF-8 bytes in strings were replaced with U+FFFD")
            return doc
    if b"NaN" in data or b"Infinity" in data or b"\\u" in data or b"\\U" in data:
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            pass
    raise TraceError(path, problem)


def _describe(exc: orjson.JSONDecodeError) -> str:
    msg = exc.msg if hasattr(exc, "msg") else str(exc)
    where = f"line {exc.lineno} column {exc.colno} (char {exc.pos})"
    if "input length is 0" in msg:
        return "empty file"
    if "end of data" in msg or "EOF" in msg:
        return f"truncated JSON: the document ends early at {where}"
    return f"invalid JSON at {where}: {msg}"


def _skip_ws(data: bytes | bytearray, pos: int, end: int) -> int:
    while pos < end and data[pos] in _WS:
        pos += 1
    return pos


class _Stream:
    """Decompressed bytes of a file, read piece by piece (gzip found by its magic bytes)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._raw = open(self.path, "rb")
        except OSError as exc:
            raise _open_error(self.path, exc) from None
        try:
            magic = self._raw.read(4)
            self._raw.seek(0)
        except OSError as exc:
            self.close()
            raise _open_error(self.path, exc) from None
        if magic[:4] == ZSTD_MAGIC:
            self.close()
            raise TraceError(self.path, "zstd-compressed file: decompress it first (zstd -d)")
        self._fh: Any = gzip_reader(self._raw) if magic[:2] == GZIP_MAGIC else self._raw
        self.eof = False
        self._started = False

    def read(self, n_bytes: int) -> bytes:
        if self.eof:
            return b""
        try:
            data = self._fh.read(n_bytes)
        except GZIP_ERRORS as exc:
            raise _gunzip_error(self.path, exc) from None
        except OSError as exc:
            raise _open_error(self.path, exc) from None
        if not self._started:
            self._started = True
            if data[:3] == UTF8_BOM:
                data = data[3:]
        if not data:
            self.eof = True
            self.close()
        return data

    def readinto(self, view: memoryview) -> int:
        """Fill the front of ``view`` (up to READ_BYTES at a time); 0 at the end of the file."""
        if self.eof:
            return 0
        if not self._started:  # the first bytes go through read() (BOM)
            data = self.read(len(view))
            view[: len(data)] = data
            return len(data)
        fh = self._fh
        total, size = 0, len(view)
        try:
            while total < size:
                got = fh.readinto(view[total : min(size, total + READ_BYTES)])
                if not got:
                    self.eof = True
                    self.close()
                    break
                total += got
        except GZIP_ERRORS as exc:
            raise _gunzip_error(self.path, exc) from None
        except OSError as exc:
            raise _open_error(self.path, exc) from None
        return total

    def close(self) -> None:
        for fh in (getattr(self, "_fh", None), getattr(self, "_raw", None)):
            if fh is not None:
                try:
                    fh.close()
                except (OSError, *GZIP_ERRORS):
                    pass


class TraceJSON:
    """A trace document: its top-level keys (``header``) and its event array.

    ``form`` is ``object`` (``{"traceEvents": [...], ...}``) or ``array`` (``[...]``).
    Opened with ``open``, the file is streamed: ``chunks()`` reads it piece by piece
    and keeps only a few chunks of bytes in memory (not the whole decompressed file).
    """

    def __init__(self, path: str, header: dict, form: str, events: list | None = None, notes: tuple[str, ...] = ()):
        self.path = path
        self.header = header
        self.form = form
        self.notes = notes
        self.whole_events = events  # set when parsed in one piece
        self._stream: _Stream | None = None
        self._head = b""  # object form: the bytes before the '"traceEvents"' key
        self._buf = bytearray()  # bytes after the event array's '['

    @classmethod
    def open(cls, path: str | Path) -> "TraceJSON":
        """Start reading: parses only the part before the events (the header is completed by the tail)."""
        stream = _Stream(path)
        try:
            return cls._locate(str(path), stream)
        except BaseException:
            stream.close()
            raise

    @classmethod
    def _locate(cls, path: str, stream: _Stream) -> "TraceJSON":
        buf = bytearray()
        want = HEAD_BYTES
        while True:
            while len(buf) < want and not stream.eof:
                buf += stream.read(want - len(buf))
            start = _skip_ws(buf, 0, len(buf))
            if start == len(buf) and not stream.eof:
                want *= 2
                continue
            first = buf[start : start + 1]
            if first == b"[":
                doc = cls(path, {}, "array")
                doc._stream, doc._buf = stream, buf[start + 1 :]
                return doc
            if first != b"{":
                if stream.eof:
                    break  # small: let the parser say what it is
                raise TraceError(path, f"not a JSON trace: starts with {bytes(buf[start : start + 16])!r}")
            for m in _EVENTS_KEY.finditer(buf, start):
                head = bytes(buf[: m.start()])
                try:  # the key is top-level iff everything before it closes as an object
                    orjson.loads(head + b'"traceEvents":0}')
                except orjson.JSONDecodeError:
                    continue
                doc = cls(path, {}, "object")
                doc._stream, doc._head, doc._buf = stream, head, buf[m.end() :]
                return doc
            if stream.eof:
                break
            want *= 2  # header longer than what was read, or the key is further on
        while not stream.eof:  # not a stream we can cut: parse it whole (and report errors)
            buf += stream.read(CHUNK_BYTES * 4)
        if not bytes(buf).strip():
            raise TraceError(path, "empty file" if not buf else "file holds only whitespace")
        return cls.whole_doc(path, bytes(buf))

    @classmethod
    def whole_doc(cls, path: str, data: bytes) -> "TraceJSON":
        """Parse everything at once: the fallback, and the error reporter for broken JSON."""
        notes: list[str] = []
        try:
            doc = loads(data, path, notes)
        except TraceError:
            fixed = _close_array(data)
            if fixed is None:
                raise
            doc = loads(fixed, path, notes)
            notes.append("the event array was not closed (trace cut off?): read what was there")
        return cls.from_doc(path, doc, tuple(notes))

    @classmethod
    def from_doc(cls, path: str, doc: Any, notes: tuple[str, ...] = ()) -> "TraceJSON":
        if isinstance(doc, list):
            return cls(path, {}, "array", doc, notes)
        if not isinstance(doc, dict):
            kind = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(type(doc), "null")
            raise TraceError(path, f"not a trace: the top-level JSON value is {kind}, not an object or array")
        events = doc.get("traceEvents")
        if events is None:
            keys = ", ".join(repr(str(k)[:40]) for k in list(doc)[:6]) or "none"
            raise TraceError(path, f"not a trace: no traceEvents (top-level keys: {keys})")
        if not isinstance(events, list):
            raise TraceError(path, f"traceEvents is {type(events).__name__}, not a list")
        header = {k: v for k, v in doc.items() if k != "traceEvents"}
        return cls(path, header, "object", events, notes)

    def whole(self) -> "TraceJSON":
        """The same document parsed in one piece (after ChunkingFailed): reads the file again."""
        self.close()
        if self.whole_events is not None:
            return self
        return TraceJSON.whole_doc(self.path, read_bytes(self.path))

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._buf = bytearray()

    def _fill(self, view: memoryview, n: int, want: int) -> int:
        """Read on until the buffer holds ``want`` event bytes (or the file ends); returns how many it holds."""
        stream = self._stream
        while n < want and stream is not None and not stream.eof:
            n += stream.readinto(view[1 + n : 1 + want])
        return n

    @property
    def _eof(self) -> bool:
        return self._stream is None or self._stream.eof

    def chunks(self, chunk_bytes: int | None = None, decode: Callable[[Any], list | None] | None = None) -> Iterator[list]:
        """Yield the events as lists; sets ``header`` once the tail is read.

        ``decode`` turns one piece (a JSON array's bytes) into its events, or None when the bytes
        are not JSON (default: orjson into dicts; ``typedjson.decode_piece`` into structs).
        Raises ChunkingFailed (possibly after yielding) when a cut does not verify.
        """
        chunk_bytes = chunk_bytes or CHUNK_BYTES
        decode = decode or _orjson_list
        if self.whole_events is not None:
            yield self.whole_events
            return
        # One buffer for the whole file, reused piece after piece (a fresh multi-MB buffer
        # per piece costs a page fault per 4 KB): buf[0] is always "[" and the unparsed
        # event bytes are buf[1 : 1 + n]. A piece up to ``cut`` is parsed in place as
        # buf[0 : cut + 1] with a "]" written at ``cut`` for the call, and what follows it
        # is moved to the front before reading on.
        head = self._buf
        n = len(head)
        cap = max(2 * chunk_bytes, n)
        buf = bytearray(cap + 1)
        buf[0] = _OPEN
        buf[1 : 1 + n] = head
        self._buf = buf
        del head
        view = memoryview(buf)
        try:
            want = 2 * chunk_bytes
            while True:
                n = self._fill(view, n, want)
                if self._eof and n <= chunk_bytes:
                    break
                m = EVENT_CUT.search(buf, 1 + chunk_bytes, 1 + n)
                events = None
                for _ in range(_MAX_RETRIES):
                    if m is None:
                        break
                    events = _parse_piece(buf, view, m.start() + 1, decode)
                    if events is not None:
                        break
                    m = EVENT_CUT.search(buf, m.end(), 1 + n)
                if events is None:
                    if self._eof:
                        break  # the rest (at most two chunks) is the last chunk
                    if m is not None:
                        raise ChunkingFailed("no verified cut between events")
                    want = n + chunk_bytes  # one event longer than a chunk: read on
                    if want > cap:
                        view.release()
                        buf += bytes(want - cap)
                        cap = want
                        view = memoryview(buf)
                    continue
                yield events
                del events
                start = m.end() - 1  # keep the '{' that starts the next event
                rest = 1 + n - start
                view[1 : 1 + rest] = view[start : start + rest]
                n = rest
                want = 2 * chunk_bytes
            yield self._last_chunk(buf, view, n, decode)
        finally:
            view.release()
            self.close()

    def _last_chunk(self, buf: bytearray, view: memoryview, n: int, decode: Callable[[Any], list | None]) -> list:
        """Find where the event array ends (its ']') and parse the document's tail."""
        hi = 1 + n
        for _ in range(16):
            q = buf.rfind(b"]", 1, hi)
            if q < 0:
                break
            hi = q
            tail = bytes(buf[q + 1 : 1 + n])
            if self.form == "object":
                if tail.strip()[:1] not in (b",", b"}"):
                    continue
                try:
                    rest = orjson.loads(self._head + b'"traceEvents":0' + tail)
                except orjson.JSONDecodeError:
                    continue
            elif tail.strip():
                continue
            if _skip_ws(buf, 1, q) == q:
                events: list | None = []  # empty array
            else:
                events = _parse_piece(buf, view, q, decode)  # buf[q] is the "]" already
            if events is None:
                continue
            if self.form == "object":
                rest.pop("traceEvents", None)
                self.header = rest
            return events
        raise ChunkingFailed("could not find the end of the event array")


_OPEN, _CLOSE = ord("["), ord("]")


def _orjson_list(data) -> list | None:
    try:
        events = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return events if isinstance(events, list) else None


def _parse_piece(buf: bytearray, view: memoryview, cut: int, decode: Callable[[Any], list | None]) -> list | None:
    """The events in buf[1:cut] (buf[0] is "["), parsed in place with a "]" at ``cut``; None if that is not JSON."""
    saved = buf[cut]
    buf[cut] = _CLOSE
    try:
        return decode(view[: cut + 1])
    finally:
        buf[cut] = saved


def _close_array(data: bytes) -> bytes | None:
    """Chrome's array form may lack its closing ']' (a trace cut off by a crash)."""
    body = data.strip()
    if not body.startswith(b"[") or body.endswith(b"]"):
        return None
    body = body.rstrip(b" \t\r\n,")
    if not body.endswith(b"}"):
        return None
    return body + b"]"
