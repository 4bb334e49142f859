"""numba kernels compiled ahead of time into plain extension modules (``numba.pycc``), imported
later without numba.

Why: numba's JIT makes every process that runs a kernel import numba and LLVM and load the
kernel (~0.4-0.9 s and ~100 MB of RSS, measured), which a small input never repays; the same
functions compiled ahead of time import in about a millisecond. Two kernels are built so: the
JSON scanner (``ingest/scanbuild.py``) and the impact replay (``analyze/impact_replay.py``).

A ``Target`` names the numba functions to export with their signatures and the files whose text
names the module (a changed source builds a new one: never a stale module). Building needs numba
and a C compiler, happens under a file lock (concurrent processes build once), and a build that
fails is remembered in a ``.failed`` marker beside it (not tried again: the JIT serves). The
module lives in the package's ``__pycache__`` when that is writable, else in
``~/.cache/profkit/native``; ``PROFKIT_NATIVE_DIR`` picks another folder.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

DIR_ENV = "PROFKIT_NATIVE_DIR"
_loaded: dict[str, ModuleType | None] = {}  # by the module's path: one import per process


@dataclass(frozen=True)
class Target:
    """One module to build: ``prefix`` + a hash of its sources, numba and Python."""

    prefix: str  # e.g. "_profkit_jsonscan"
    functions: str  # the module holding the numba functions (their ``py_func`` is exported)
    sources: tuple[Path, ...]  # files whose text names the module (the functions' module, its layout constants)
    signatures: tuple[tuple[str, str], ...]  # (function, numba signature)
    home: Path  # the package folder whose ``__pycache__`` keeps the module when writable
    use_nrt: bool = False  # numba's reference counting: needed by a kernel that allocates arrays
    release_gil: bool = False  # the exported wrappers release the GIL while the kernel runs (numba's nogil)


def name(target: Target) -> str | None:
    """The module's name for this source, numba and Python; None without numba."""
    try:
        numba_version = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        return None
    sources = b"".join(path.read_bytes() for path in target.sources)
    options = repr((target.use_nrt, target.release_gil) if target.release_gil else target.use_nrt)  # the same names as before the option
    key = hashlib.blake2b(sources + repr(sorted(target.signatures)).encode() + options.encode()
                          + numba_version.encode() + sys.version.encode(), digest_size=8).hexdigest()
    return f"{target.prefix}_{key}"


def folder(target: Target) -> Path:
    """Where the target's module is (or will be) kept."""
    chosen = os.environ.get(DIR_ENV)
    if chosen:
        return Path(chosen)
    beside = target.home / "__pycache__"
    try:
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK):
            return beside
    except OSError:
        pass
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "profkit" / "native"


def module_path(target: Target, module: str) -> Path:
    return folder(target) / (module + importlib.machinery.EXTENSION_SUFFIXES[0])


def failed_marker(target: Target, module: str) -> Path:
    """The marker a failed build leaves (its error inside): the build is not tried again."""
    return folder(target) / f"{module}.failed"


def compiled(target: Target, module: str | None) -> ModuleType | None:
    """The built module ``module`` if it exists (imported once per process); never builds, never
    imports numba."""
    if module is None:
        return None
    path = module_path(target, module)
    key = str(path)
    if key not in _loaded:
        _loaded[key] = _import(module, path) if path.exists() else None
    return _loaded[key]


def pending(target: Target, module: str | None) -> bool:
    """Whether ``build`` would compile now: numba is there, the module is not built, and no earlier
    build failed here."""
    return module is not None and compiled(target, module) is None and not failed_marker(target, module).exists()


def build(target: Target, module: str | None,
          compile_fn: Callable[[str, Path], None] | None = None) -> ModuleType | None:
    """The built module, building it first with ``compile_fn(module, folder)`` (default:
    ``compile_target``) if needed (numba and a C compiler; seconds, once per machine); None if it
    cannot be built here."""
    found = compiled(target, module)
    if found is not None or module is None:
        return found
    where = folder(target)
    failed = failed_marker(target, module)
    if failed.exists():
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
        import fcntl

        with open(where / f"{module}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then use its build
            path = module_path(target, module)
            if not path.exists():
                if compile_fn is None:
                    compile_target(target, module, where)
                else:
                    compile_fn(module, where)
            _loaded.pop(str(path), None)
            return compiled(target, module)
    except Exception as exc:  # noqa: BLE001 - no compiler, no pycc, a read-only folder: the JIT serves
        try:
            failed.write_text(f"{type(exc).__name__}: {exc}\n")
        except OSError:
            pass
        return None


def compile_target(target: Target, module: str, where: Path) -> None:
    """Compile ``target``'s functions into ``where``/``module`` (``numba.pycc``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba.pycc's pending deprecation
        from numba.pycc import CC

    functions = importlib.import_module(target.functions)
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        cc = CC(module)
        cc.output_dir = tmp
        cc.use_nrt = target.use_nrt
        cc.verbose = False
        for function, signature in target.signatures:
            cc.export(function, signature)(getattr(functions, function).py_func)
        if target.release_gil:
            _compile_without_gil(cc)
        else:
            cc.compile()
        os.replace(Path(tmp) / module_path(target, module).name, module_path(target, module))


def _compile_without_gil(cc) -> None:
    """``cc.compile()`` with numba's ``release_gil`` flag on, so the exported wrappers drop the GIL
    once their arguments are unboxed, as a ``nogil`` JIT function does: ``numba.pycc`` has no option
    for it, but it takes its compile flags from ``numba.pycc.compiler.Flags``. A numba where that
    is gone fails the build (remembered: the JIT serves), never builds a kernel that holds the GIL."""
    from numba.pycc import compiler as pycc_compiler

    base = pycc_compiler.Flags

    class NoGilFlags(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True

    pycc_compiler.Flags = NoGilFlags
    try:
        cc.compile()
    finally:
        pycc_compiler.Flags = base


def why_not_built(target: Target, module: str | None) -> str:
    """Why ``module`` is not there: the failed build's error, or no numba."""
    failed = failed_marker(target, module) if module else None
    return failed.read_text().strip() if failed and failed.exists() else "numba is not installed"


def say_built(target: Target, module: str | None, built: ModuleType | None, otherwise: str = "") -> int:
    """What a build command prints (where the module is, or why it is not built and what serves
    instead) and its exit status (1: not built)."""
    if built is not None:
        print(f"built ahead of time: {built.__file__}")
        return 0
    print(f"not built ({why_not_built(target, module)}){otherwise}")
    return 1


def _import(module: str, path: Path) -> ModuleType | None:
    spec = importlib.util.spec_from_file_location(module, path)
    if spec is None or spec.loader is None:
        return None
    loaded = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(loaded)
    except ImportError:  # a file from another machine or a broken build: built again
        return None
    return loaded
