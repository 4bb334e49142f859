"""Instrument every Python process of a command: put this folder first on ``PYTHONPATH``.

``profkit capture`` does that (with ``PROFKIT_CAPTURE=1``), so processes that no plugin reaches
(the bundled engine's ranks, vLLM's DPCoordinator, anything spawned) are instrumented from their
first line. Then the next ``sitecustomize`` on ``sys.path`` (the one this file shadows) runs too.
"""
from __future__ import annotations


def _activate() -> None:
    import os

    if os.environ.get("PROFKIT_CAPTURE", "").strip() != "1":
        return
    try:
        from profkit.instrument.autostart import activate

        activate()
    except Exception as exc:  # noqa: BLE001 - never break the interpreter's start
        import sys

        print(f"profkit: instrumentation not active in pid {os.getpid()}: {exc!r}", file=sys.stderr)


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_activate()
_chain()
