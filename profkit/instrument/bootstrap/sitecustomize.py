"""Instrument every Python process of a command: put this folder first on ``PYTHONPATH``.

``profkit capture`` does that (with ``PROFKIT_CAPTURE=1``), so processes that no plugin reaches
(the bundled engine's ranks, vLLM's DPCoordinator, anything spawned) are instrumented from their
first line. Then the next ``sitecustomize`` on ``sys.path`` (the one this file shadows) runs too.

The one source of both bootstraps: ``profkit/capture/bootstrap/sitecustomize.py`` runs this file
as its own. Run from that folder it starts the capture agent (exit status, CUDA profiler step
window, then the same ``activate()``) and skips this folder too when it looks for the
``sitecustomize`` it shadows.
"""
from __future__ import annotations


def _role() -> tuple[str, str, str, set[str]]:
    """(module, function, what it starts, folders that are ours) for the folder this runs from."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.basename(os.path.dirname(here)) == "capture":
        theirs = os.path.join(os.path.dirname(os.path.dirname(here)), "instrument", "bootstrap")
        return "profkit.capture.agent", "start", "capture agent", {here, theirs}
    return "profkit.instrument.autostart", "activate", "instrumentation", {here}


def _activate(module: str, function: str, what: str) -> None:
    import os

    if os.environ.get("PROFKIT_CAPTURE", "").strip() != "1":
        return
    try:
        import importlib

        getattr(importlib.import_module(module), function)()
    except Exception as exc:  # noqa: BLE001 - never break the interpreter's start
        import sys

        print(f"profkit: {what} not active in pid {os.getpid()}: {exc!r}", file=sys.stderr)


def _chain(ours: set[str]) -> None:
    """Run the sitecustomize this one shadows (none of ours), if any."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    rest = [p for p in sys.path if os.path.abspath(p or ".") not in ours]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_module, _function, _what, _ours = _role()
_activate(_module, _function, _what)
_chain(_ours)
