"""profkit capture's bootstrap: runs first in every Python process of the captured command.

It starts the capture agent (exit status, CUDA profiler step window) and then profkit's
instrumentation (the same ``activate()`` as ``profkit/instrument/bootstrap``, which this folder
replaces on ``PYTHONPATH``), and finally the ``sitecustomize`` it shadows, if any. The code is
that folder's ``sitecustomize.py`` (one source), run here as this module: it reads its role from
this file's folder. Only the standard library: profkit may not be importable yet.
"""
import os as _os

_source = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))),
                        "instrument", "bootstrap", "sitecustomize.py")
with open(_source, encoding="utf-8") as _file:
    exec(compile(_file.read(), _source, "exec"))  # noqa: S102 - profkit's own bootstrap source, not input
