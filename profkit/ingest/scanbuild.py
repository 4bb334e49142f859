"""The compiled scanner as a plain extension module, built once per machine with numba's
ahead-of-time compiler (``numba.pycc``) and then imported without numba.

Why: numba's JIT makes every process that uses the scanner import numba and LLVM, ~0.4 s and
~100 MB of RSS (measured), which a small trace never repays. The same functions compiled ahead
of time into an extension module import in under a millisecond, add ~1 MB and run as fast
(measured on the HTA 25 MB trace: 25 ms per scan either way). Building needs numba and a C
compiler and takes ~15 s; it happens the first time a process reads a large file (or when
``build()`` is called), under a file lock, so concurrent processes build once. Without a C
compiler, or if ``numba.pycc`` is gone from a future numba, the build fails once (remembered in a
marker file) and the JIT scanner is used instead.

The module is named for the scanner's source, numba and Python (``_name()``): a changed
``jsonscan.py`` (or ``scanned.py``, whose layout constants it compiles in) builds a new one. It lives beside this file (``__pycache__``) when that is
writable, else in ``~/.cache/profkit/native``; ``PROFKIT_NATIVE_DIR`` picks another folder.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

DIR_ENV = "PROFKIT_NATIVE_DIR"
# the scanner's source, and the module whose layout constants (C_*, F_*, V_*...) it compiles in
_SOURCES = (Path(__file__).with_name("jsonscan.py"), Path(__file__).with_name("scanned.py"))
# the exported functions' signatures: see jsonscan (arrays made by scanned.new_outputs and _strings)
SIGNATURES = {
    "scan_piece": "UniTuple(i8, 4)(u1[::1], i8, i8, i8[:, ::1], f8[:, ::1], i8[:, ::1], i8[:, ::1], u1[::1])",
    "gather_into": "void(u1[::1], i8[::1], i8[::1], u1[::1])",
}
_loaded: dict[str, ModuleType | None] = {}


@functools.lru_cache(maxsize=1)
def _name() -> str | None:
    """The module's name for this source, numba and Python; None without numba."""
    try:
        numba_version = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        return None
    sources = b"".join(path.read_bytes() for path in _SOURCES)
    key = hashlib.blake2b(sources + repr(sorted(SIGNATURES.items())).encode() + numba_version.encode()
                          + sys.version.encode(), digest_size=8).hexdigest()
    return f"_profkit_jsonscan_{key}"


def folder() -> Path:
    """Where the built module is (or will be) kept."""
    chosen = os.environ.get(DIR_ENV)
    if chosen:
        return Path(chosen)
    beside = Path(__file__).with_name("__pycache__")
    try:
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK):
            return beside
    except OSError:
        pass
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "profkit" / "native"


def _path(name: str) -> Path:
    return folder() / (name + importlib.machinery.EXTENSION_SUFFIXES[0])


def _failed(name: str) -> Path:
    """The marker a failed build leaves (its error inside): the build is not tried again."""
    return folder() / f"{name}.failed"


def _import(name: str, path: Path) -> ModuleType | None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError:  # a file from another machine or a broken build: built again
        return None
    return module


def compiled() -> ModuleType | None:
    """The built module if it exists (imported once per process); never builds, never imports numba."""
    name = _name()
    if name is None:
        return None
    if name not in _loaded:
        path = _path(name)
        _loaded[name] = _import(name, path) if path.exists() else None
    return _loaded[name]


def pending() -> bool:
    """Whether ``build()`` would compile now: numba is there, the module is not built, and no
    earlier build failed here."""
    name = _name()
    return name is not None and compiled() is None and not _failed(name).exists()


def build() -> ModuleType | None:
    """The built module, building it first if needed (numba and a C compiler; ~15 s, once per
    machine); None if it cannot be built here (then the JIT scanner serves)."""
    module = compiled()
    name = _name()
    if module is not None or name is None:
        return module
    where = folder()
    failed = _failed(name)
    if failed.exists():
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
        import fcntl

        with open(where / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then use its build
            path = _path(name)
            if not path.exists():
                _compile(name, where)
            _loaded.pop(name, None)
            return compiled()
    except Exception as exc:  # noqa: BLE001 - no compiler, no pycc, a read-only folder: the JIT serves
        try:
            failed.write_text(f"{type(exc).__name__}: {exc}\n")
        except OSError:
            pass
        return None


def _compile(name: str, where: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba.pycc's pending deprecation
        from numba.pycc import CC

    from profkit.ingest import jsonscan

    with tempfile.TemporaryDirectory(dir=where) as tmp:
        cc = CC(name)
        cc.output_dir = tmp
        cc.use_nrt = False  # as the JIT's _nrt=False: reference counting would halve the speed
        cc.verbose = False
        for function, signature in SIGNATURES.items():
            cc.export(function, signature)(getattr(jsonscan, function).py_func)
        cc.compile()
        os.replace(Path(tmp) / _path(name).name, _path(name))


def main() -> int:
    """``python -m profkit.ingest.scanbuild``: build the module now (e.g. in an image) and say where
    it is, or why the JIT scanner will serve instead. Exit status 1 if it is not built."""
    module = build()
    if module is not None:
        print(f"built ahead of time: {module.__file__}")
        return 0
    name = _name()
    failed = _failed(name) if name else None
    why = failed.read_text().strip() if failed and failed.exists() else "numba is not installed"
    print(f"not built ({why})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
