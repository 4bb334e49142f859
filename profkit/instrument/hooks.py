"""Hook registry: ``"module:Qualname.method" -> (span name, category)``, applied at import.

    hooks = Hooks({"vllm.v1.core.sched.scheduler:Scheduler.schedule": ("Scheduler.schedule",
                                                                        "scheduler")}).install()
    ...
    hooks.remove()  # every patched attribute is restored to the exact object it held

A target whose module is already imported is patched at once; otherwise a ``sys.meta_path``
finder patches it right after the module executes (the loader's ``exec_module`` is shimmed for
that one import, so the module keeps its real loader and spec). Targets may be methods
(plain, ``staticmethod``, ``classmethod``, ``async def``) or module attributes, including
functions imported by name into another module: ``"pkg.user:helper"`` patches ``pkg.user.helper``
(a "use-site" patch), which is the only way to time calls that module makes. A function hooked at
its definition and at a use site gets one span per call, not two. A missing target warns once
(naming the target and the installed version of its top package) and is skipped.
"""
from __future__ import annotations

import sys
import threading
import types
import warnings
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from . import identity
from .wrappers import PreHook, wrap

#: learns identity facts (``rank``, ``dp_rank``, ...) from a hooked call's arguments
Learner = Callable[[tuple, dict], "dict[str, Any] | None"]
_ABSENT = object()
_MISSING = object()
LEARN_ATTEMPTS = 8


class HookWarning(RuntimeWarning):
    """A hook target could not be patched (missing, or not a function)."""


class HookSpec(NamedTuple):
    """One target. ``learn`` reads identity facts from the call until the rank is known; ``pre``
    runs before each call's span opens (e.g. a step counter)."""

    target: str  # "package.module:Qualname.attr"
    name: str  # span name
    category: str = "profkit"
    learn: Learner | None = None
    pre: PreHook | None = None

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]


HookTable = Mapping[str, "tuple[str, str] | str | HookSpec"]


def hook_specs(table: HookTable | Iterable[HookSpec]) -> list[HookSpec]:
    """Normalize a table (target -> (name, category) | name | HookSpec) into HookSpecs."""
    if isinstance(table, Mapping):
        items: list[HookSpec] = []
        for target, value in table.items():
            if isinstance(value, HookSpec):
                items.append(value if value.target == target else value._replace(target=target))
            elif isinstance(value, str):
                items.append(HookSpec(target, value))
            else:
                items.append(HookSpec(target, *value))
    else:
        items = list(table)
    for spec in items:
        mod, sep, qual = spec.target.partition(":")
        if not sep or not mod or not qual:
            raise ValueError(f"hook target {spec.target!r}: expected 'package.module:Qualname.attr'")
    return items


class Patch:
    """One applied hook: ``previous`` is the exact object the attribute held (``_ABSENT`` if it
    was inherited), ``installed`` what we set (the wrapper, or staticmethod/classmethod of it)."""

    __slots__ = ("spec", "owner", "attr", "previous", "installed", "module", "active", "__weakref__")

    def __init__(self, spec: HookSpec, owner: Any, attr: str, previous: Any, installed: Any,
                 module: types.ModuleType):
        self.spec, self.owner, self.attr = spec, owner, attr
        self.previous, self.installed, self.module = previous, installed, module
        self.active = True


# -- the import-time finder -----------------------------------------------------------------------
class _PostImportFinder:
    """Runs callbacks right after a watched module executes. One per process, first on meta_path."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Callable[[types.ModuleType], None]]] = {}
        self._local = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.waiting:
            return None
        busy: set[str] = self._local.__dict__.setdefault("busy", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            busy.discard(fullname)
        if spec is not None and spec.loader is not None:
            _shim_exec_module(spec.loader, fullname, self._loaded)
        return spec

    def _loaded(self, module: types.ModuleType) -> None:
        for callback in list(self.waiting.get(module.__name__, ())):
            try:
                callback(module)
            except Exception as exc:  # noqa: BLE001 - a hook bug must never break an import
                warnings.warn(f"profkit: hooking {module.__name__} failed: {exc!r}", HookWarning, stacklevel=2)

    def watch(self, name: str, callback: Callable[[types.ModuleType], None]) -> None:
        self.waiting.setdefault(name, []).append(callback)

    def unwatch(self, name: str, callback: Callable[[types.ModuleType], None]) -> None:
        callbacks = self.waiting.get(name, [])
        if callback in callbacks:
            callbacks.remove(callback)
        if not callbacks:
            self.waiting.pop(name, None)


def _shim_exec_module(loader: Any, fullname: str, on_loaded: Callable[[types.ModuleType], None]) -> None:
    """Make ``loader.exec_module`` call ``on_loaded`` after executing ``fullname`` (once)."""
    if isinstance(loader, type) or not hasattr(loader, "__dict__") or not hasattr(loader, "exec_module"):
        return  # built-in/frozen importers: never a hook target
    had_own = "exec_module" in loader.__dict__
    original = loader.exec_module

    def exec_module(module: types.ModuleType) -> None:
        if getattr(module, "__name__", None) != fullname:  # a loader shared by several modules
            return original(module)
        try:
            original(module)
        finally:
            if loader.__dict__.get("exec_module") is exec_module:
                if had_own:
                    loader.exec_module = original
                else:
                    del loader.exec_module
        on_loaded(module)

    loader.exec_module = exec_module


_finder_lock = threading.Lock()
_finder: list[_PostImportFinder] = []


def _the_finder() -> _PostImportFinder:
    with _finder_lock:
        if not _finder:
            _finder.append(_PostImportFinder())
        finder = _finder[0]
        if finder not in sys.meta_path:
            sys.meta_path.insert(0, finder)
        return finder


# -- warnings -------------------------------------------------------------------------------------
_warned: set[str] = set()


def installed_version(module_name: str) -> str:
    """Version of the top-level package of ``module_name`` (``vllm 0.33.0``), for messages."""
    top = module_name.split(".")[0]
    mod = sys.modules.get(top)
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version(top)
        except Exception:  # noqa: BLE001
            version = "unknown version"
    return f"{top} {version}"


def _warn_once(spec: HookSpec, reason: str) -> None:
    if spec.target in _warned:
        return
    _warned.add(spec.target)
    warnings.warn(f"profkit: cannot hook {spec.target} ({installed_version(spec.module)}): {reason}",
                  HookWarning, stacklevel=3)


# -- wrappers and their unwrapping ----------------------------------------------------------------
def _active_patch(fn: Any) -> Patch | None:
    patch = getattr(fn, "__profkit_patch__", None)
    return patch if isinstance(patch, Patch) and patch.active else None


def _strip_active(fn: Any) -> Any:
    """The function under our active hook wrappers (a use site holding a definition's wrapper)."""
    while _active_patch(fn) is not None:
        fn = fn.__wrapped__
    return fn


def _restorable(value: Any) -> Any:
    """``value`` without our inactive wrappers (the exact object when it holds none)."""
    if isinstance(value, (staticmethod, classmethod)):
        inner = _restorable(value.__func__)
        return value if inner is value.__func__ else type(value)(inner)
    while isinstance(getattr(value, "__profkit_patch__", None), Patch) and not value.__profkit_patch__.active:
        value = value.__wrapped__
    return value


def _learning_pre(learn: Learner) -> PreHook:
    left = [LEARN_ATTEMPTS]

    def pre(args: tuple, kwargs: dict) -> None:
        if not left[0]:
            return
        left[0] -= 1
        try:
            facts = learn(args, kwargs)
        except Exception:  # noqa: BLE001 - a half-built object: try again next call
            facts = None
        ident = identity.current()
        if facts:
            ident.learn(facts)
        else:
            ident.refresh()
        if ident.rank is not None:
            left[0] = 0

    return pre


def _chain(first: PreHook | None, second: PreHook | None) -> PreHook | None:
    if first is None or second is None:
        return first or second

    def pre(args: tuple, kwargs: dict) -> None:
        first(args, kwargs)
        second(args, kwargs)

    return pre


# -- the registry ---------------------------------------------------------------------------------
class Hooks:
    """A set of hook targets: ``install()`` patches (now or at import), ``remove()`` restores."""

    def __init__(self, table: HookTable | Iterable[HookSpec]):
        self.specs = hook_specs(table)
        self.patches: list[Patch] = []
        self.problems: dict[str, str] = {}
        self._by_module: dict[str, list[HookSpec]] = {}
        for spec in self.specs:
            self._by_module.setdefault(spec.module, []).append(spec)
        self._done: set[tuple[str, int]] = set()
        self._installed = False
        self._lock = threading.RLock()

    def install(self) -> "Hooks":
        with self._lock:
            if self._installed:
                return self
            self._installed = True
            finder = _the_finder()
            for name in self._by_module:
                finder.watch(name, self._on_import)
            for name in self._by_module:
                module = sys.modules.get(name)
                if module is not None:
                    self._on_import(module)
        return self

    def remove(self) -> None:
        """Restore every patched attribute; stop watching imports."""
        with self._lock:
            if _finder:
                for name in self._by_module:
                    _finder[0].unwatch(name, self._on_import)
            for patch in self.patches:
                patch.active = False
            for patch in reversed(self.patches):
                current = _own_attr(patch.owner, patch.attr)
                if current is not patch.installed:
                    continue  # replaced by someone else since: theirs now
                if patch.previous is _ABSENT:
                    delattr(patch.owner, patch.attr)
                else:
                    setattr(patch.owner, patch.attr, _restorable(patch.previous))
            self.patches.clear()
            self._done.clear()
            self._installed = False

    def status(self) -> dict[str, str]:
        """Per target: ``patched``, ``waiting for import`` or the problem."""
        patched = {p.spec.target for p in self.patches}
        return {s.target: "patched" if s.target in patched else self.problems.get(s.target, "waiting for import")
                for s in self.specs}

    def report(self) -> dict[str, dict[str, Any]]:
        """Per target: span name, status (``patched`` / ``not imported`` / ``missing: ...``) and
        ``calls`` (calls through this process's patches; 0 for a target that never fired)."""
        calls: dict[str, int] = {}
        for patch in self.patches:
            counter = getattr(_unwrap_method(patch.installed), "__profkit_calls__", None)
            calls[patch.spec.target] = calls.get(patch.spec.target, 0) + (counter[0] if counter else 0)
        out: dict[str, dict[str, Any]] = {}
        for spec, (target, state) in zip(self.specs, self.status().items()):
            state = "not imported" if state == "waiting for import" else state
            out[target] = {"span": spec.name, "status": state, "calls": calls.get(target, 0)}
        return out

    def _on_import(self, module: types.ModuleType) -> None:
        with self._lock:
            for spec in self._by_module.get(module.__name__, ()):
                key = (spec.target, id(module))
                if key in self._done:
                    continue
                self._done.add(key)
                self._apply(spec, module)

    def _apply(self, spec: HookSpec, module: types.ModuleType) -> None:
        parts = spec.qualname.split(".")
        owner: Any = module
        for i, part in enumerate(parts[:-1]):
            owner = getattr(owner, part, _MISSING)
            if owner is _MISSING:
                return self._missing(spec, f"{module.__name__} has no {'.'.join(parts[:i + 1])}")
        attr = parts[-1]
        if isinstance(owner, type):
            raw, here = _class_attr(owner, attr)
        else:
            raw = getattr(owner, attr, _MISSING)
            here = True
        if raw is _MISSING:
            return self._missing(spec, f"{module.__name__}.{spec.qualname} does not exist")
        kind: type | None = None
        fn = raw
        if isinstance(raw, (staticmethod, classmethod)):
            kind, fn = type(raw), raw.__func__
        elif isinstance(raw, (type, property)) or not callable(raw):
            return self._missing(spec, f"is a {type(raw).__name__}, not a function")
        inner = _strip_active(fn)
        pre = _chain(_learning_pre(spec.learn) if spec.learn else None, spec.pre)
        try:
            wrapper = wrap(inner, spec.name, spec.category, pre=pre)
        except TypeError as exc:
            return self._missing(spec, str(exc))
        installed = kind(wrapper) if kind is not None else wrapper
        patch = Patch(spec, owner, attr, raw if here else _ABSENT, installed, module)
        wrapper.__profkit_patch__ = patch  # type: ignore[attr-defined]
        setattr(owner, attr, installed)
        self.patches.append(patch)
        self.problems.pop(spec.target, None)

    def _missing(self, spec: HookSpec, reason: str) -> None:
        self.problems[spec.target] = f"missing: {reason}"
        _warn_once(spec, reason)


def _unwrap_method(installed: Any) -> Any:
    return installed.__func__ if isinstance(installed, (staticmethod, classmethod)) else installed


def _class_attr(cls: type, attr: str) -> tuple[Any, bool]:
    """(raw attribute from the MRO, defined on ``cls`` itself)."""
    for i, klass in enumerate(cls.__mro__):
        if attr in klass.__dict__:
            return klass.__dict__[attr], i == 0
    return _MISSING, False


def _own_attr(owner: Any, attr: str) -> Any:
    if isinstance(owner, type):
        return owner.__dict__.get(attr, _MISSING)
    return getattr(owner, attr, _MISSING)


def install_hooks(table: HookTable | Iterable[HookSpec]) -> Hooks:
    """``Hooks(table).install()``."""
    return Hooks(table).install()
