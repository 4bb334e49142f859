"""profkit capture's bootstrap: runs first in every Python process of the captured command.

It starts the capture agent (exit status, CUDA profiler step window) and then profkit's
instrumentation (the same ``activate()`` as ``profkit/instrument/bootstrap``, which this folder
replaces on ``PYTHONPATH``), and finally the ``sitecustomize`` it shadows, if any.
"""
from __future__ import annotations


def _start() -> None:
    import os

    if os.environ.get("PROFKIT_CAPTURE", "").strip() != "1":
        return
    try:
        from profkit.capture.agent import start

        start()
    except Exception as exc:  # noqa: BLE001 - never break the interpreter's start
        import sys

        print(f"profkit: capture agent not active in pid {os.getpid()}: {exc!r}", file=sys.stderr)


def _chain() -> None:
    """Run the sitecustomize this one shadows (neither ours nor profkit.instrument's)."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    theirs = os.path.join(os.path.dirname(os.path.dirname(here)), "instrument", "bootstrap")
    skip = {here, theirs}
    rest = [p for p in sys.path if os.path.abspath(p or ".") not in skip]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_start()
_chain()
