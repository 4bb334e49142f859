"""profkit: why is the serving step slower than the GPU, and which rank makes everyone wait.

``import profkit`` stays light (it runs inside every serving rank); analysis modules load
on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from profkit.analyze.capture import Capture, load  # noqa: F401


def __getattr__(name: str) -> Any:
    if name == "span":
        from profkit.instrument import span

        return span
    if name in ("load", "Capture"):
        from profkit.analyze import capture

        return getattr(capture, name)
    raise AttributeError(f"module 'profkit' has no attribute {name!r}")
