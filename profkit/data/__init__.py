"""Files the installed package carries, so a wheel works outside a checkout.

``samples/``: the demo capture of ``profkit demo`` (a real DEP2 H200 capture with its README);
``dashboards/``: the default panels of ``profkit dashboard``. In the repository both are symlinks
to ``sample_traces/`` and ``dashboards/`` (one copy, where users read and edit it); a wheel or
sdist build copies the files they point at (``pyproject.toml``, package-data).
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def shipped(*parts: str) -> Path:
    """The path on disk of a file or folder under ``profkit/data`` (profkit is never zipped)."""
    return Path(str(resources.files(__name__).joinpath(*parts)))
