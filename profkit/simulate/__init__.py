"""Simulated DEP-N captures with known causes and clock skew: ground truth and scale load.

    from profkit.simulate import simulate, Inject
    truth = simulate(32, 50, seed=1, out_dir=path, fmt="kineto",
                     injects=[Inject("gc", rank=3, every=10, ms=20)])

writes ``rank{r}.pt.trace.json.gz`` (or ``rank{r}.sqlite``), ``truth.json`` and
``expert_loads.json`` into ``out_dir``. CLI: ``profkit simulate`` / ``python -m profkit.simulate``.
No torch needed (numpy only).
"""
from __future__ import annotations

from profkit.simulate.config import INJECT_KINDS, Inject, SimConfig, parse_inject
from profkit.simulate.run import simulate
from profkit.simulate.truth import Truth

__all__ = ["INJECT_KINDS", "Inject", "SimConfig", "Truth", "parse_inject", "simulate"]
