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
Entry = tuple[int, int, Any, Any, Any]
_ENTRIES: dict[tuple[Any, str], Entry] = {}
_env_checked = False
_new = object.__new__


def _entry(name: str, category: str) -> Entry:
    ranges = nvtx_ranges.ranges()
    if ranges is None:
        ent: Entry = (STRINGS.id(name), STRINGS.id(category), None, None, None)
    else:
        ent = (STRINGS.id(name), STRINGS.id(category), ranges.attributes(name, category), ranges.push, ranges.pop)
    _ENTRIES[(name, category)] = ent
    return ent


def reset_caches() -> None:
    """Forget cached NVTX attributes (tests that toggle ``PROFKIT_NVTX``)."""
    _ENTRIES.clear()
    nvtx_ranges.reset()


class Span:
    """A context manager recording one span; calling it on a function makes a decorator."""

    __slots__ = ("_e", "_t0")

    def __init__(self, name: str, category: str = DEFAULT_CATEGORY):
        self._e = _ENTRIES.get((name, category)) or _entry(name, category)

    def __enter__(self) -> "Span":
        e = self._e
        if e[3] is not None:
            e[3](e[2])
        self._t0 = now_ns()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t1 = now_ns()
        e = self._e
        if e[4] is not None:
            e[4]()
        CURRENT.rec.add(e[0], e[1], self._t0, t1)

    @property
    def name(self) -> str:
        return STRINGS.text(self._e[0])

    @property
    def category(self) -> str:
        return STRINGS.text(self._e[1])

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
    try:
        ent = _ENTRIES.get((name, category))
    except TypeError:  # an unhashable callable to decorate
        ent = None
    if ent is None:  # first use of this name (or a function to decorate): the slow path
        global _env_checked
        if not _env_checked:
            _env_checked = True
            from .lifecycle import start_from_env

            start_from_env()
        if type(name) is not str:
            if callable(name):
                return wrap(name, getattr(name, "__qualname__", repr(name)), category)
            name = str(name)
        ent = _ENTRIES.get((name, category)) or _entry(name, category)
    s = _new(Span)  # skips __init__: the entry is already known
    s._e = ent
    return s
