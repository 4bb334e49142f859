"""Hooks for profkit's bundled engine (``profkit.engine``): span names are the qualnames.

``EngineCore.step`` is the step marker profkit's step detector looks for. The rank is learned
from the hooked objects' ``rank`` attribute (the engine passes it to every component), so the
engine-core and worker processes of one DP rank report the same rank.
"""
from __future__ import annotations

from typing import Any

from ..hooks import HookSpec
from . import table_specs

CORE = "profkit.engine.core"
SCHED = "profkit.engine.scheduler"
RUNNER = "profkit.engine.runner"
MODEL = "profkit.engine.model"

ENGINE: dict[str, tuple[str, str]] = {
    f"{CORE}:EngineCore.step": ("EngineCore.step", "step"),
    f"{SCHED}:Scheduler.schedule": ("Scheduler.schedule", "scheduler"),
    f"{SCHED}:Scheduler.update_from_output": ("Scheduler.update_from_output", "scheduler"),
    f"{CORE}:MultiprocExecutor.execute_model": ("MultiprocExecutor.execute_model", "executor_rpc"),
    f"{CORE}:MultiprocExecutor.sample_tokens": ("MultiprocExecutor.sample_tokens", "executor_rpc"),
    f"{RUNNER}:Worker.execute_model": ("Worker.execute_model", "worker"),
    f"{RUNNER}:Worker.sample_tokens": ("Worker.sample_tokens", "worker"),
    f"{RUNNER}:GPUModelRunner.sync_dp_padding": ("GPUModelRunner.sync_dp_padding", "dp_sync"),
    f"{RUNNER}:GPUModelRunner.execute_model": ("GPUModelRunner.execute_model", "forward"),
    f"{RUNNER}:GPUModelRunner.sample_tokens": ("GPUModelRunner.sample_tokens", "sampling"),
    f"{MODEL}:MoEModel.forward": ("MoEModel.forward", "forward"),
    f"{MODEL}:MoEModel._moe": ("MoEModel._moe", "forward"),
}

#: calls that count engine steps in the process that runs the model (torch step windows)
STEP_TARGETS = (f"{RUNNER}:Worker.execute_model",)


def _self_rank(role: str):
    def learn(args: tuple, kwargs: dict) -> dict[str, Any] | None:
        rank = getattr(args[0], "rank", None) if args else None
        if rank is None and args:  # Worker keeps it on its runner
            rank = getattr(getattr(args[0], "runner", None), "rank", None)
        if rank is None:
            return None
        return {"rank": int(rank), "dp_rank": int(rank), "ep_rank": int(rank), "role": role}

    return learn


LEARNERS = {
    f"{CORE}:EngineCore.step": _self_rank("engine_core"),
    f"{RUNNER}:Worker.execute_model": _self_rank("worker"),
    f"{RUNNER}:GPUModelRunner.sync_dp_padding": _self_rank("worker"),
}


def specs() -> list[HookSpec]:
    return table_specs(ENGINE, LEARNERS)
