"""Function wrappers that time a call as a span (used by ``span`` as a decorator and by hooks).

Each wrapper resolves the recorder at call time (``CURRENT.rec``) but its name/category ids and
NVTX attributes once, when it is built. Sync calls use NVTX push/pop (a per-thread stack);
coroutines use start/end ranges, since other coroutines run on the thread while one awaits. An
async span covers the call until the coroutine finishes, suspended time included.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from . import nvtx_ranges
from .clock import now_ns
from .recorder import CURRENT
from .strings import STRINGS

#: ``pre(args, kwargs)`` runs before the span opens (identity learning, step counting)
PreHook = Callable[[tuple, dict], None]
CO_COROUTINE = 0x80
CO_GENERATOR = 0x20
CO_ASYNC_GENERATOR = 0x200


def is_coroutine_function(fn: Any) -> bool:
    """True for ``async def`` functions, also behind ``functools.wraps`` decorators (a sync
    decorator that returns the inner coroutine is awaited the same way)."""
    for _ in range(16):
        flags = getattr(getattr(fn, "__code__", None), "co_flags", 0)
        if flags & CO_COROUTINE or getattr(fn, "_is_coroutine_marker", None) is not None:
            return True
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            return False
    return False


def is_generator_function(fn: Any) -> bool:
    flags = getattr(getattr(fn, "__code__", None), "co_flags", 0)
    return bool(flags & (CO_GENERATOR | CO_ASYNC_GENERATOR))


def span_ids(name: str, category: str) -> tuple[int, int, Any]:
    """(name id, category id, NVTX attributes or None) of a span."""
    ranges = nvtx_ranges.ranges()
    attr = ranges.attributes(name, category) if ranges is not None else None
    return STRINGS.id(name), STRINGS.id(category), attr


def wrap(fn: Callable, name: str, category: str = "profkit", pre: PreHook | None = None) -> Callable:
    """A wrapper of ``fn`` that records each call as span ``name``; ``functools.wraps``-preserving.

    Generator functions are refused (a span would time only the creation of the generator).
    ``wrapper.__profkit_calls__[0]`` counts the calls (a capture's manifest says which hooks fired;
    one list-item increment, a few ns, and not atomic across threads: a count, not a ledger).
    """
    if is_generator_function(fn):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)!r} is a generator function: not hooked")
    nid, cid, attr = span_ids(name, category)
    ranges = nvtx_ranges.ranges() if attr is not None else None
    cur = CURRENT
    calls = [0]
    if is_coroutine_function(fn):
        wrapper: Callable = _async_wrapper(fn, nid, cid, attr, ranges, pre, cur, calls)
    elif pre is not None:
        wrapper = _sync_wrapper_pre(fn, nid, cid, attr, ranges, pre, cur, calls)
    elif ranges is not None:
        push, pop = ranges.push, ranges.pop

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            push(attr)
            t0 = now_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = now_ns()
                pop()
                cur.rec.add(nid, cid, t0, t1)
    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            t0 = now_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                cur.rec.add(nid, cid, t0, now_ns())

    functools.update_wrapper(wrapper, fn)
    wrapper.__profkit_span__ = (name, category)  # type: ignore[attr-defined]
    wrapper.__profkit_calls__ = calls  # type: ignore[attr-defined]
    return wrapper


def _sync_wrapper_pre(fn, nid, cid, attr, ranges, pre, cur, calls) -> Callable:
    push = ranges.push if ranges is not None else None
    pop = ranges.pop if ranges is not None else None

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        pre(args, kwargs)
        if push is not None:
            push(attr)
        t0 = now_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = now_ns()
            if pop is not None:
                pop()
            cur.rec.add(nid, cid, t0, t1)

    return wrapper


def _async_wrapper(fn, nid, cid, attr, ranges, pre, cur, calls) -> Callable:
    start = ranges.start if ranges is not None else None
    end = ranges.end if ranges is not None else None

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if pre is not None:
            pre(args, kwargs)
        range_id = start(attr) if start is not None else None
        t0 = now_ns()
        try:
            return await fn(*args, **kwargs)
        finally:
            t1 = now_ns()
            if end is not None:
                end(range_id)
            cur.rec.add(nid, cid, t0, t1)

    return wrapper
