"""The bundled engine: a small DP-attention + expert-parallel serving loop shaped like vLLM's.

It exists so profkit has a workload whose causes are known: every fault it injects is written down
(``--truth``), and every step is timed by the engine itself (``rank{r}.steps.jsonl``), so analyses
of its traces can be checked against ground truth. Run ``python -m profkit.engine --help``.

Only this package imports torch, and only in the modules that run inside ranks
(``core``, ``runner``, ``model``, ``annotate``); ``config``, ``faults`` and ``truth`` import without it.
"""
from __future__ import annotations

from .config import EngineConfig
from .faults import FAULT_KINDS, FaultSpec, parse_inject

__all__ = ["EngineConfig", "FaultSpec", "FAULT_KINDS", "parse_inject"]
