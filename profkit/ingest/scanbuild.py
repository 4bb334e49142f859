"""The compiled JSON scanner as a plain extension module, built once per machine with numba's
ahead-of-time compiler (``numba.pycc``, through ``profkit.native``) and then imported without numba.

Why: numba's JIT makes every process that uses the scanner import numba and LLVM, ~0.4 s and
~100 MB of RSS (measured), which a small trace never repays. The same functions compiled ahead
of time into an extension module import in under a millisecond, add ~1 MB and run as fast
(measured on the HTA 25 MB trace: 25 ms per scan either way). Building needs numba and a C
compiler and takes ~15 s; it happens the first time a process reads a large file (or when
``build()`` is called), under a file lock, so concurrent processes build once. Without a C
compiler, or if ``numba.pycc`` is gone from a future numba, the build fails once (remembered in a
marker file) and the JIT scanner is used instead.

The module is named for the scanner's source, numba and Python (``_name()``): a changed
``jsonscan.py`` (or ``scanlayout.py``, whose layout constants it compiles in) builds a new one. It lives beside this file (``__pycache__``) when that is
writable, else in ``~/.cache/profkit/native``; ``PROFKIT_NATIVE_DIR`` picks another folder.
``python -m profkit.ingest.scanbuild`` builds it at once; ``python -m profkit.analyze.impact_replay``
builds the impact replay's kernel the same way.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from types import ModuleType

from profkit import native
from profkit.native import DIR_ENV  # noqa: F401 - read as scanbuild.DIR_ENV

# the scanner's source, and the module whose layout constants (C_*, F_*, V_*...) it compiles in
_SOURCES = (Path(__file__).with_name("jsonscan.py"), Path(__file__).with_name("scanlayout.py"))
# the exported functions' signatures: see jsonscan (arrays made by scanned.new_outputs and _strings)
SIGNATURES = {
    "scan_piece": "UniTuple(i8, 5)(u1[::1], i8, i8, i8[:, ::1], f8[:, ::1], i8[:, ::1], i8[:, ::1], u1[::1])",
    "gather_into": "void(u1[::1], i8[::1], i8[::1], u1[::1])",
}


def _target() -> native.Target:
    """The scanner as ``profkit.native`` builds it (``_nrt`` off: reference counting would halve its speed)."""
    return native.Target("_profkit_jsonscan", "profkit.ingest.jsonscan", tuple(_SOURCES), tuple(SIGNATURES.items()),
                         Path(__file__).parent, use_nrt=False)


@functools.lru_cache(maxsize=1)
def _name() -> str | None:
    """The module's name for this source, numba and Python; None without numba."""
    return native.name(_target())


def compiled() -> ModuleType | None:
    """The built module if it exists (imported once per process); never builds, never imports numba."""
    return native.compiled(_target(), _name())


def pending() -> bool:
    """Whether ``build()`` would compile now: numba is there, the module is not built, and no
    earlier build failed here."""
    return native.pending(_target(), _name())


def build() -> ModuleType | None:
    """The built module, building it first if needed (numba and a C compiler; ~15 s, once per
    machine); None if it cannot be built here (then the JIT scanner serves)."""
    return native.build(_target(), _name(), lambda module, where: _compile(module, where))  # read late: tests stub it


def _compile(name: str, where: Path) -> None:
    native.compile_target(_target(), name, where)


def main() -> int:
    """``python -m profkit.ingest.scanbuild``: build the module now (e.g. in an image) and say where
    it is, or why the JIT scanner will serve instead. Exit status 1 if it is not built."""
    return native.say_built(_target(), _name(), build())


if __name__ == "__main__":
    sys.exit(main())
