"""Declarative hook tables: vLLM (versioned) and the bundled engine.

Categories say what kind of host work a span is, so overhead can be grouped by cause:
``loop`` (busy loop), ``step`` (one engine iteration), ``engine_input`` (request intake),
``scheduler``, ``structured_output``, ``executor_rpc`` (engine-core -> worker calls), ``worker``,
``state_update``, ``input_prep``, ``dp_sync`` (DP padding / finish all-reduces), ``forward``,
``sampling``, ``eplb``, ``output_copy`` (async device-to-host output), ``frontend``,
``detokenize``, ``stats``; ``gc`` is used by the GC pause spans.
"""
from __future__ import annotations

from typing import Any

from ..hooks import HookSpec


def table_specs(table: dict[str, tuple[str, str]], learners: dict[str, Any] | None = None) -> list[HookSpec]:
    """HookSpecs of a ``target -> (name, category)`` table, with identity learners attached."""
    learners = learners or {}
    return [HookSpec(target, name, category, learners.get(target)) for target, (name, category) in table.items()]


def load(name: str) -> list[HookSpec]:
    """Hook specs of a set by name: ``vllm`` (matching the installed version) or ``engine``."""
    if name == "vllm":
        from . import vllm

        return vllm.specs()
    if name == "engine":
        from . import engine

        return engine.specs()
    raise ValueError(f"unknown hook set {name!r} (known: vllm, engine)")
