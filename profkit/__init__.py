"""profkit: why is the serving step slower than the GPU, and which rank makes everyone wait."""
from __future__ import annotations

__version__ = "0.1.0"
