"""``span``: the user-facing span, as a context manager or a decorator.

    with profkit.span("prepare_batch"):          # context manager
        ...

    @profkit.span("tokenize", category="frontend")  # decorator (sync or async)
    def tokenize(...): ...

    @profkit.span                                 # decorator, named after the function
    def step(...): ...

Use one ``span(...)`` object per ``with`` (it holds the start time); decorators are thread- and
reentrancy-safe. Cost: see ``benchmarks/overhead.py`` (a few hundred ns per span).
"""
from __future__ import annotations

from typing import Any, Callable, overload

from . import nvtx_ranges
from .clock import now_ns
from .recorder import CURRENT
from .strings import STRINGS
from .wrappers import wrap

DEFAULT_CATEGORY = "profkit"

# (name, category) -> (name id, category id, NVTX attributes or None, push, pop)
_ENTRIES: dict[tuple[str, str], tuple[int, int, Any, Any, Any]] = {}
_env_checked = [False]


def _entry(name: str, category: str) -> tuple[int, int, Any, Any, Any]:
    ranges = nvtx_ranges.ranges()
    if ranges is None:
        ent = (STRINGS.id(name), STRINGS.id(category), None, None, None)
    else:
        ent = (STRINGS.id(name), STRINGS.id(category), ranges.attributes(name, category),
               ranges.push, ranges.pop)
    _ENTRIES[(name, category)] = ent
    return ent


def reset_caches() -> None:
    """Forget cached NVTX attributes (tests that toggle ``PROFKIT_NVTX``)."""
    _ENTRIES.clear()
    nvtx_ranges.reset()


class Span:
    """A context manager recording one span; calling it on a function makes a decorator."""

    __slots__ = ("name", "category", "_nid", "_cid", "_attr", "_push", "_pop", "_t0")

    def __init__(self, name: str, category: str = DEFAULT_CATEGORY):
        ent = _ENTRIES.get((name, category)) or _entry(name, category)
        self.name = name
        self.category = category
        self._nid, self._cid, self._attr, self._push, self._pop = ent

    def __enter__(self) -> "Span":
        if self._push is not None:
            self._push(self._attr)
        self._t0 = now_ns()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t1 = now_ns()
        if self._pop is not None:
            self._pop()
        CURRENT.rec.add(self._nid, self._cid, self._t0, t1)

    def __call__(self, fn: Callable) -> Callable:
        return wrap(fn, self.name, self.category)

    def __repr__(self) -> str:
        return f"span({self.name!r}, category={self.category!r})"


@overload
def span(name: str, category: str = ...) -> Span: ...
@overload
def span(name: Callable, category: str = ...) -> Callable: ...


def span(name: Any, category: str = DEFAULT_CATEGORY) -> Any:
    """A span named ``name`` (context manager / decorator); ``@span`` alone names it after the
    function's qualname. The first call starts file output when ``PROFKIT_OUT_DIR`` is set."""
    if not _env_checked[0]:
        _env_checked[0] = True
        from .lifecycle import start_from_env

        start_from_env()
    if callable(name):
        return wrap(name, getattr(name, "__qualname__", repr(name)), category)
    return Span(name, category)
