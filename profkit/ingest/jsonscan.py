"""A compiled scanner (numba, the ``fast`` extra) that reads a piece of a trace's event array
straight into columns: no Python object per event.

Why: decoding is most of a read (msgspec ~47% of its instructions, the per-event loop and the
conversions to Arrow ~35%), and msgspec holds the GIL. This scanner walks the bytes once,
validates the JSON grammar, and writes the fields the reader uses into arrays: spans of the
``cat`` and ``name`` strings, the numbers of ``ts``/``dur``, the ids (``pid``, ``tid``, and from
``args`` ``device``, ``stream``, ``correlation``). It releases the GIL.

It only takes what it can read exactly; ``scan_piece`` says ``DEFER`` for anything else, and
where: the caller decodes the elements it declines the usual way (``typedjson.decode_piece``) and
scans on after them (``scanned.decode``), so results are the same by construction wherever the
scanner declines. An element is scanned when it is an object whose ``ph`` is ``X`` (a row) or
a flow (``s``/``t``/``f``, only counted), with, on rows:
``cat`` and ``name`` strings without escapes, ``ts`` and ``dur`` numbers, ``pid``/``tid`` and the
three id args integers of at most 18 digits or null, ``args`` an object (or missing), and no
key given twice or written with escapes. A row whose args hold ``Collective name`` or ``bytes``
is marked ``RARE`` and its collective args (``ARG_KEYS[3:]``) are kept with their kind (string,
integer, null, missing, or odd); the caller decodes only the events with an odd one alone, with
the typed decoder. Numbers: integers are exact; a decimal is exact here when its digits fit
2**53 and its power of ten is at most 22 (one correctly rounded division, as every correct
parser gives); others are flagged for the caller's correctly rounded parse (Arrow's).

Speed: every function is compiled with ``_nrt=False`` (no reference counting: the caller
allocates every array) and the small helpers are inlined; a call passing arrays with numba's
reference counting cost about as much as the scanning itself. Strings are skipped 8 bytes at a
time (``_string``). ~0.5 GB/s of Kineto's compact JSON here.
"""
from __future__ import annotations

import sys

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from profkit.ingest.scanlayout import (C_CAT_E, C_CAT_S, C_CORR, C_DEV, C_DUR_E, C_DUR_S, C_EV_E, C_EV_S,
                                       C_FLAGS, C_NAME_E, C_NAME_S, C_PID, C_STREAM, C_TID, C_TS_E, C_TS_S, DEFER,
                                       F_CORR_NULL, F_DEV_NULL, F_DUR_SLOW, F_PID_NULL, F_RARE, F_STREAM_NULL,
                                       F_TID_NULL, F_TS_SLOW, MAX_DEPTH, N_COLL_ARGS, OK, V_INT, V_MISSING,
                                       V_NULL, V_ODD, V_STRING)

_POW10 = np.array([10.0 ** k for k in range(23)])  # exact doubles 1e0 .. 1e22
_TWO53 = 1 << 53
# number kinds
_BAD, _INT, _FAST, _SLOW = 0, 1, 2, 3


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _ws(b, i, n):  # pragma: no cover - compiled
    while i < n:
        c = b[i]
        if c != 32 and c != 10 and c != 13 and c != 9:
            break
        i += 1
    return i


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _hex(c):  # pragma: no cover - compiled
    return (48 <= c <= 57) or (65 <= c <= 70) or (97 <= c <= 102)


@intrinsic
def _load8(typingctx, arr, idx):
    """The 8 bytes ``arr[idx:idx + 8]`` as one little-endian uint64 (an unaligned load; the
    caller keeps ``idx + 8 <= len(arr)``)."""
    sig = types.uint64(arr, idx)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        return builder.load(builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)

    return sig, codegen


_LITTLE = sys.byteorder == "little"  # ``_string``'s 8-byte reads find the first byte as the lowest: else byte by byte
_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_QUOTES = np.uint64(0x2222222222222222)
_SLASHES = np.uint64(0x5C5C5C5C5C5C5C5C)
_CONTROLS = np.uint64(0x2020202020202020)  # 0x20 in every byte: bytes below it are control characters


@intrinsic
def _low_zeros(typingctx, w):
    """The number of trailing zero bits of the uint64 ``w`` (64 for 0)."""
    sig = types.uint64(w)

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

    return sig, codegen


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _specials8(w):  # pragma: no cover - compiled
    """A mask of the 8 bytes in ``w`` (little-endian) that end a run of plain string bytes: a
    quote, a backslash or a control character. The lowest set bit is exact (the first such byte);
    borrows may flag later bytes too, which is never used."""
    q = w ^ _QUOTES
    s = w ^ _SLASHES
    return (((q - _ONES) & ~q) | ((s - _ONES) & ~s) | ((w - _CONTROLS) & ~w)) & _HIGHS


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _string(b, i, n):  # pragma: no cover - compiled
    """``b[i]`` is a quote: (index after the closing quote, whether it holds escapes); -1 if invalid.
    Reads 8 bytes at a time (``_specials8``) while 8 are left before ``n``, jumping to the first
    byte that is not plain; the last few bytes one by one. (Kernel names and args keys are most
    of a trace's bytes: a quarter less time per scan than byte by byte, measured.)"""
    i += 1
    esc = False
    while True:
        if _LITTLE and i + 8 <= n:
            t = _specials8(_load8(b, i))
            if t == np.uint64(0):
                i += 8
                continue
            i += np.int64(_low_zeros(t) >> np.uint64(3))
        elif i >= n:
            return -1, esc
        c = b[i]
        if c == 34:
            return i + 1, esc
        if c == 92:
            esc = True
            if i + 1 >= n:
                return -1, esc
            d = b[i + 1]
            if d == 117:  # \uXXXX
                if i + 5 >= n or not (_hex(b[i + 2]) and _hex(b[i + 3]) and _hex(b[i + 4]) and _hex(b[i + 5])):
                    return -1, esc
                i += 6
                continue
            if d == 34 or d == 92 or d == 47 or d == 98 or d == 102 or d == 110 or d == 114 or d == 116:
                i += 2
                continue
            return -1, esc
        if c < 32:
            return -1, esc
        i += 1


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _number(b, i, n, pow10):  # pragma: no cover - compiled
    """A JSON number at ``b[i]``: (end, kind, integer value, float value). kind ``_INT``: an integer
    of at most 18 digits (exact); ``_FAST``: a decimal whose float is exact here; ``_SLOW``: valid
    but to be parsed elsewhere; ``_BAD``: not a number."""
    neg = False
    if b[i] == 45:
        neg = True
        i += 1
        if i >= n:
            return i, _BAD, 0, 0.0
    m = 0
    nd = 0
    c = b[i]
    if c == 48:
        i += 1
    elif 49 <= c <= 57:
        while i < n and 48 <= b[i] <= 57:
            if nd < 19:
                m = m * 10 + (b[i] - 48)
            nd += 1
            i += 1
    else:
        return i, _BAD, 0, 0.0
    frac = 0
    is_int = True
    if i < n and b[i] == 46:  # .
        is_int = False
        i += 1
        if i >= n or not (48 <= b[i] <= 57):
            return i, _BAD, 0, 0.0
        while i < n and 48 <= b[i] <= 57:
            if nd < 19:
                m = m * 10 + (b[i] - 48)
            nd += 1
            frac += 1
            i += 1
    e10 = 0
    if i < n and (b[i] == 101 or b[i] == 69):  # e E
        is_int = False
        i += 1
        eneg = False
        if i < n and (b[i] == 43 or b[i] == 45):
            eneg = b[i] == 45
            i += 1
        if i >= n or not (48 <= b[i] <= 57):
            return i, _BAD, 0, 0.0
        while i < n and 48 <= b[i] <= 57:
            if e10 < 100000:
                e10 = e10 * 10 + (b[i] - 48)
            i += 1
        if eneg:
            e10 = -e10
    if nd > 18:
        return i, _SLOW, 0, 0.0
    if is_int:
        return i, _INT, -m if neg else m, 0.0
    e10 -= frac
    if m > _TWO53 or e10 > 22 or e10 < -22:
        return i, _SLOW, 0, 0.0
    v = float(m)
    if e10 >= 0:
        v = v * pow10[e10]
    else:
        v = v / pow10[-e10]
    return i, _FAST, 0, -v if neg else v


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _literal(b, i, n):  # pragma: no cover - compiled
    """true / false / null at ``b[i]``: (end, 1 for null, 0 for a boolean); end -1 if none."""
    c = b[i]
    if c == 110 and i + 3 < n and b[i + 1] == 117 and b[i + 2] == 108 and b[i + 3] == 108:
        return i + 4, 1
    if c == 116 and i + 3 < n and b[i + 1] == 114 and b[i + 2] == 117 and b[i + 3] == 101:
        return i + 4, 0
    if (c == 102 and i + 4 < n and b[i + 1] == 97 and b[i + 2] == 108 and b[i + 3] == 115
            and b[i + 4] == 101):
        return i + 5, 0
    return -1, 0


@njit(cache=True, nogil=True, _nrt=False)
def _value(b, i, n, pow10, stack):  # pragma: no cover - compiled
    """Skip (and validate) any JSON value at ``b[i]``: its end, -1 if invalid, -2 if too deep."""
    depth = 0
    expect_key = False
    while True:
        # a value (or, in an object, a key and its colon first)
        if expect_key:
            if i >= n or b[i] != 34:
                return -1
            i, _ = _string(b, i, n)
            if i < 0:
                return -1
            i = _ws(b, i, n)
            if i >= n or b[i] != 58:
                return -1
            i = _ws(b, i + 1, n)
            expect_key = False
        if i >= n:
            return -1
        c = b[i]
        if c == 34:
            i, _ = _string(b, i, n)
            if i < 0:
                return -1
        elif c == 123 or c == 91:  # { [
            if depth >= MAX_DEPTH:
                return -2
            stack[depth] = c
            depth += 1
            i = _ws(b, i + 1, n)
            if i < n and b[i] == c + 2:  # } ]
                depth -= 1
                i += 1
            else:
                expect_key = c == 123
                continue
        elif c == 45 or 48 <= c <= 57:
            i, kind, _, _ = _number(b, i, n, pow10)
            if kind == _BAD:
                return -1
        else:
            i, _ = _literal(b, i, n)
            if i < 0:
                return -1
        # after a value: close containers, or go on to the next element
        while True:
            if depth == 0:
                return i
            i = _ws(b, i, n)
            if i >= n:
                return -1
            c = b[i]
            if c == 44:  # ,
                i = _ws(b, i + 1, n)
                expect_key = stack[depth - 1] == 123
                break
            if c == stack[depth - 1] + 2:
                depth -= 1
                i += 1
                continue
            return -1


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _scalar_or_value(b, i, n, pow10, stack):  # pragma: no cover - compiled
    """``_value``, with the common values (a number, a string) read here, not through a call."""
    c = b[i]
    if c == 45 or 48 <= c <= 57:
        i, kind, _, _ = _number(b, i, n, pow10)
        return -1 if kind == _BAD else i
    if c == 34:
        i, _ = _string(b, i, n)
        return i
    return _value(b, i, n, pow10, stack)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _key(b, s, e):  # pragma: no cover - compiled
    """Which field a key (bytes s..e, no quotes) is: 1 ph, 2 cat, 3 name, 4 ts, 5 dur, 6 pid, 7 tid, 8 args."""
    ln = e - s
    c0 = b[s]
    if ln == 2:
        if c0 == 112 and b[s + 1] == 104:
            return 1
        if c0 == 116 and b[s + 1] == 115:
            return 4
    elif ln == 3:
        c1, c2 = b[s + 1], b[s + 2]
        if c0 == 99 and c1 == 97 and c2 == 116:
            return 2
        if c0 == 100 and c1 == 117 and c2 == 114:
            return 5
        if c0 == 112 and c1 == 105 and c2 == 100:
            return 6
        if c0 == 116 and c1 == 105 and c2 == 100:
            return 7
    elif ln == 4:
        c1, c2, c3 = b[s + 1], b[s + 2], b[s + 3]
        if c0 == 110 and c1 == 97 and c2 == 109 and c3 == 101:
            return 3
        if c0 == 97 and c1 == 114 and c2 == 103 and c3 == 115:
            return 8
    return 0


# args keys the scanner reads, numbered from 1 (``_arg_key``): the ids, then the collective args
ARG_KEYS = (b"device", b"stream", b"correlation", b"Collective name", b"bytes", b"Process Group Name", b"Seq",
            b"Sequence number", b"In msg nelems", b"dtype")
_KEY_BYTES = np.zeros((len(ARG_KEYS), max(map(len, ARG_KEYS))), np.uint8)
for _k, _word in enumerate(ARG_KEYS):
    _KEY_BYTES[_k, : len(_word)] = np.frombuffer(_word, np.uint8)
_KEY_LENGTHS = np.array([len(word) for word in ARG_KEYS], np.int64)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _arg_key(b, s, e):  # pragma: no cover - compiled
    """Which of ``ARG_KEYS`` (1-based) the key in ``b[s:e]`` is; 0 for another."""
    ln = e - s
    for k in range(_KEY_LENGTHS.size):
        if _KEY_LENGTHS[k] != ln:
            continue
        same = True
        for q in range(ln):
            if b[s + q] != _KEY_BYTES[k, q]:
                same = False
                break
        if same:
            return k + 1
    return 0


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _id(b, i, n, pow10):  # pragma: no cover - compiled
    """An id value: (end, value, is_null); end -1 if not an integer of <= 18 digits or null."""
    c = b[i]
    if c == 110:
        j, null = _literal(b, i, n)
        if j < 0 or null != 1:
            return -1, 0, True
        return j, 0, True
    if c == 45 or 48 <= c <= 57:
        j, kind, iv, _ = _number(b, i, n, pow10)
        if kind != _INT:
            return -1, 0, True
        return j, iv, False
    return -1, 0, True


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _member(b, i, n):  # pragma: no cover - compiled
    """An object member's key at ``b[i]`` and its colon: (key start, key end, index of the value);
    the index is -1 if there is no unescaped string key, no colon or no value after it."""
    if i >= n or b[i] != 34:
        return 0, 0, -1
    ks = i + 1
    i, esc = _string(b, i, n)
    if i < 0 or esc:
        return 0, 0, -1
    ke = i - 1
    i = _ws(b, i, n)
    if i >= n or b[i] != 58:
        return 0, 0, -1
    i = _ws(b, i + 1, n)
    if i >= n:
        return 0, 0, -1
    return ks, ke, i


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _next_member(b, i, n):  # pragma: no cover - compiled
    """After a member's value, at ``b[i]``: (the next key's index, True) past a comma, (the index
    after the object, False) at its closing brace; (-1, False) otherwise."""
    i = _ws(b, i, n)
    if i < n:
        if b[i] == 44:
            return _ws(b, i + 1, n), True
        if b[i] == 125:
            return i + 1, False
    return -1, False


@njit(cache=True, nogil=True, _nrt=False)
def scan_piece(b, lo, hi, ints, floats, rare, scratch, stack):  # pragma: no cover - compiled
    """Scan the array elements in ``b[lo:hi]`` (``b[hi]`` is the array's ``]``); ``stack``: MAX_DEPTH
    bytes of room for ``_value``, ``scratch`` (3 x N_COLL_ARGS) for an event's collective args.

    ``rare`` gets a column per RARE row: the row, then per collective arg (``ARG_KEYS[3:]``) its
    kind (``V_*``) and two values (a string's span, or an integer's value).

    Fills ``ints`` (N_INT_COLUMNS x capacity) and ``floats`` (2 x capacity: ts, dur) row by row.
    Returns (status, rows, flows, rare rows, at): status ``DEFER`` when an element is not of the shapes
    above, the JSON is invalid, or the rows do not fit; ``at``: where the element it declined starts
    (every element before it is counted in rows and flows; -1 where it stopped between elements: a
    bad separator or something other than an object; the caller declines the whole piece then)."""
    pow10 = _POW10
    cap = ints.shape[1]
    n_rare = 0
    rows = 0
    flows = 0
    i = _ws(b, lo, hi)
    if i == hi:
        return OK, 0, 0, 0, -1
    while True:
        if i >= hi or b[i] != 123:
            return DEFER, rows, flows, n_rare, -1
        ev_s = i
        i = _ws(b, i + 1, hi)
        seen = 0  # bit per field
        ph = 0  # 1 X, 2 flow
        flags = 0
        cat_s = cat_e = name_s = name_e = ts_s = ts_e = dur_s = dur_e = 0
        pid = tid = corr = dev = stream = 0
        ts = dur = 0.0
        pid_null = tid_null = True
        corr_null = dev_null = stream_null = True
        aseen = 0
        if i < hi and b[i] == 125:
            return DEFER, rows, flows, n_rare, ev_s  # {}: no phase
        while True:
            ks, ke, i = _member(b, i, hi)
            if i < 0:
                return DEFER, rows, flows, n_rare, ev_s
            field = _key(b, ks, ke)
            if field != 0:
                bit = 1 << field
                if seen & bit:
                    return DEFER, rows, flows, n_rare, ev_s
                seen |= bit
            c = b[i]
            if field == 1:  # ph
                if c != 34:
                    return DEFER, rows, flows, n_rare, ev_s
                s = i + 1
                i, esc = _string(b, i, hi)
                if i != s + 2 or esc:  # one character
                    return DEFER, rows, flows, n_rare, ev_s
                p = b[s]
                if p == 88:
                    ph = 1
                elif p == 115 or p == 116 or p == 102:
                    ph = 2
                else:
                    return DEFER, rows, flows, n_rare, ev_s
            elif field == 2 or field == 3:  # cat, name
                if c != 34:
                    return DEFER, rows, flows, n_rare, ev_s
                s = i + 1
                i, esc = _string(b, i, hi)
                if i < 0 or esc:
                    return DEFER, rows, flows, n_rare, ev_s
                if field == 2:
                    cat_s, cat_e = s, i - 1
                else:
                    name_s, name_e = s, i - 1
            elif field == 4 or field == 5:  # ts, dur
                if not (c == 45 or 48 <= c <= 57):
                    return DEFER, rows, flows, n_rare, ev_s
                s = i
                i, kind, iv, fv = _number(b, i, hi, pow10)
                if kind == _BAD:
                    return DEFER, rows, flows, n_rare, ev_s
                if kind == _INT:
                    fv = float(iv)
                if field == 4:
                    ts_s, ts_e, ts = s, i, fv
                    if kind == _SLOW:
                        flags |= F_TS_SLOW
                else:
                    dur_s, dur_e, dur = s, i, fv
                    if kind == _SLOW:
                        flags |= F_DUR_SLOW
            elif field == 6 or field == 7:  # pid, tid
                i, iv, null = _id(b, i, hi, pow10)
                if i < 0:
                    return DEFER, rows, flows, n_rare, ev_s
                if field == 6:
                    pid, pid_null = iv, null
                else:
                    tid, tid_null = iv, null
            elif field == 8:  # args
                if c != 123:
                    return DEFER, rows, flows, n_rare, ev_s
                i = _ws(b, i + 1, hi)
                if i < hi and b[i] == 125:
                    i += 1
                else:
                    while True:
                        ks, ke, i = _member(b, i, hi)
                        if i < 0:
                            return DEFER, rows, flows, n_rare, ev_s
                        akey = _arg_key(b, ks, ke)
                        if 1 <= akey <= 3:
                            abit = 1 << akey
                            if aseen & abit:
                                return DEFER, rows, flows, n_rare, ev_s
                            aseen |= abit
                            i, iv, null = _id(b, i, hi, pow10)
                            if i < 0:
                                return DEFER, rows, flows, n_rare, ev_s
                            if akey == 1:
                                dev, dev_null = iv, null
                            elif akey == 2:
                                stream, stream_null = iv, null
                            else:
                                corr, corr_null = iv, null
                        elif akey >= 4:  # a collective arg (or bytes): kept as a value of its own
                            if akey <= 5:
                                flags |= F_RARE
                            slot = akey - 4
                            abit = 1 << akey
                            kind = V_ODD if aseen & abit else V_MISSING  # given twice: decoded alone
                            aseen |= abit
                            va = vb = 0
                            c = b[i]
                            if c == 34:
                                va = i + 1
                                i, esc = _string(b, i, hi)
                                if i < 0:
                                    return DEFER, rows, flows, n_rare, ev_s
                                vb = i - 1
                                if kind == V_MISSING:
                                    kind = V_ODD if esc else V_STRING
                            elif c == 45 or 48 <= c <= 57:
                                i, nkind, va, _ = _number(b, i, hi, pow10)
                                if nkind == _BAD:
                                    return DEFER, rows, flows, n_rare, ev_s
                                if kind == V_MISSING:
                                    kind = V_INT if nkind == _INT else V_ODD
                            else:
                                j, null = _literal(b, i, hi)
                                if j >= 0 and null == 1:
                                    i = j
                                    if kind == V_MISSING:
                                        kind = V_NULL
                                else:
                                    i = _value(b, i, hi, pow10, stack)
                                    if i < 0:
                                        return DEFER, rows, flows, n_rare, ev_s
                                    kind = V_ODD
                            scratch[0, slot] = kind
                            scratch[1, slot] = va
                            scratch[2, slot] = vb
                        else:
                            i = _scalar_or_value(b, i, hi, pow10, stack)
                            if i < 0:
                                return DEFER, rows, flows, n_rare, ev_s
                        i, more = _next_member(b, i, hi)
                        if i < 0:
                            return DEFER, rows, flows, n_rare, ev_s
                        if not more:
                            break
            else:
                i = _scalar_or_value(b, i, hi, pow10, stack)
                if i < 0:
                    return DEFER, rows, flows, n_rare, ev_s
            i, more = _next_member(b, i, hi)
            if i < 0:
                return DEFER, rows, flows, n_rare, ev_s
            if not more:
                break
        if ph == 2:
            flows += 1
        elif ph == 1:
            # a row needs cat, name, ts and dur (bits 2..5)
            if seen & 0b111100 != 0b111100:
                return DEFER, rows, flows, n_rare, ev_s
            if rows >= cap:
                return DEFER, rows, flows, n_rare, ev_s
            if pid_null:
                flags |= F_PID_NULL
            if tid_null:
                flags |= F_TID_NULL
            if corr_null:
                flags |= F_CORR_NULL
            if dev_null:
                flags |= F_DEV_NULL
            if stream_null:
                flags |= F_STREAM_NULL
            ints[C_CAT_S, rows] = cat_s
            ints[C_CAT_E, rows] = cat_e
            ints[C_NAME_S, rows] = name_s
            ints[C_NAME_E, rows] = name_e
            ints[C_TS_S, rows] = ts_s
            ints[C_TS_E, rows] = ts_e
            ints[C_DUR_S, rows] = dur_s
            ints[C_DUR_E, rows] = dur_e
            ints[C_PID, rows] = pid
            ints[C_TID, rows] = tid
            ints[C_CORR, rows] = corr
            ints[C_DEV, rows] = dev
            ints[C_STREAM, rows] = stream
            ints[C_EV_S, rows] = ev_s
            ints[C_EV_E, rows] = i
            ints[C_FLAGS, rows] = flags
            floats[0, rows] = ts
            floats[1, rows] = dur
            if flags & F_RARE:
                rare[0, n_rare] = rows
                for slot in range(N_COLL_ARGS):
                    at = 1 + 3 * slot
                    if aseen & (1 << (slot + 4)):
                        rare[at, n_rare] = scratch[0, slot]
                        rare[at + 1, n_rare] = scratch[1, slot]
                        rare[at + 2, n_rare] = scratch[2, slot]
                    else:
                        rare[at, n_rare] = V_MISSING
                n_rare += 1
            rows += 1
        else:
            return DEFER, rows, flows, n_rare, ev_s  # no phase
        i = _ws(b, i, hi)
        if i == hi:  # b[hi] is the ']'
            return OK, rows, flows, n_rare, -1
        if b[i] != 44:
            return DEFER, rows, flows, n_rare, -1
        i = _ws(b, i + 1, hi)


@njit(cache=True, nogil=True, _nrt=False)
def gather_into(b, starts, ends, out):  # pragma: no cover - compiled
    """The byte spans ``b[starts[k]:ends[k]]`` one after another into ``out`` (sized by the caller)."""
    p = 0
    for j in range(starts.size):
        for q in range(starts[j], ends[j]):
            out[p] = b[q]
            p += 1
