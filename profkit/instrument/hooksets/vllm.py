"""Hooks for vLLM, one table per release (targets read from the vllm 0.33.0 wheel's source).

Span names are the qualnames (``EngineCore.step`` is profkit's step marker). Use-site patches
(``module:function`` where the module imported the function by name) are listed beside the
definitions: patching only the definition would not time those calls. ``tests/test_vllm_hooks.py``
checks every target against the wheel's source.
"""
from __future__ import annotations

import sys
from typing import Any

from ..hooks import HookSpec
from . import table_specs

ENGINE_CORE = "vllm.v1.engine.core"
SCHEDULER = "vllm.v1.core.sched.scheduler"
EXECUTOR = "vllm.v1.executor.multiproc_executor"
WORKER = "vllm.v1.worker.gpu_worker"
RUNNER_V1 = "vllm.v1.worker.gpu_model_runner"
RUNNER_V2 = "vllm.v1.worker.gpu.model_runner"
DP_V1 = "vllm.v1.worker.dp_utils"
DP_V2 = "vllm.v1.worker.gpu.dp_utils"


def _methods(module_class: str, category: str, *methods: str) -> dict[str, tuple[str, str]]:
    module, cls = module_class.split(":")
    return {f"{module}:{cls}.{m}": (f"{cls}.{m}", category) for m in methods}


VLLM_033: dict[str, tuple[str, str]] = {
    # engine-core process: busy loop, step, request intake
    **_methods(f"{ENGINE_CORE}:DPEngineCoreProc", "loop", "run_busy_loop"),
    **_methods(f"{ENGINE_CORE}:EngineCoreProc", "loop", "run_busy_loop"),
    **_methods(f"{ENGINE_CORE}:EngineCoreProc", "step", "_process_engine_step"),
    **_methods(f"{ENGINE_CORE}:EngineCoreProc", "engine_input", "_process_input_queue"),
    **_methods(f"{ENGINE_CORE}:EngineCore", "step", "step", "step_with_batch_queue", "post_step",
               "execute_dummy_batch"),
    # scheduler and structured output
    **_methods(f"{SCHEDULER}:Scheduler", "scheduler", "schedule", "update_from_output", "make_stats",
               "_update_after_schedule", "_make_cached_request_data"),
    **_methods("vllm.v1.core.sched.async_scheduler:AsyncScheduler", "scheduler", "_update_after_schedule"),
    **_methods(f"{SCHEDULER}:Scheduler", "structured_output", "get_grammar_bitmask"),
    **_methods("vllm.v1.structured_output:StructuredOutputManager", "structured_output", "grammar_bitmask"),
    # executor RPC (engine-core side of the worker calls)
    **_methods(f"{EXECUTOR}:MultiprocExecutor", "executor_rpc", "execute_model", "sample_tokens",
               "execute_dummy_batch", "collective_rpc"),
    # DP finish sync (engine-core, Gloo): step 1, then every 16 steps
    **_methods(f"{ENGINE_CORE}:DPEngineCoreProc", "dp_sync", "_has_global_unfinished_reqs"),
    **_methods("vllm.config.parallel:ParallelConfig", "dp_sync", "sync_dp_state", "has_unfinished_dp"),
    "vllm.distributed.utils:cpu_all_reduce_": ("cpu_all_reduce_", "dp_sync"),
    "vllm.config.parallel:cpu_all_reduce_": ("cpu_all_reduce_", "dp_sync"),  # use site
    "vllm.distributed.parallel_state:cpu_all_reduce_": ("cpu_all_reduce_", "dp_sync"),  # use site
    # worker process entry points
    **_methods(f"{WORKER}:Worker", "worker", "execute_model", "sample_tokens", "execute_dummy_batch"),
    # V1 model runner (fallback: dual batch overlap, some speculative decoding)
    **_methods(f"{RUNNER_V1}:GPUModelRunner", "worker", "execute_model"),
    **_methods(f"{RUNNER_V1}:GPUModelRunner", "state_update", "_update_states"),
    **_methods(f"{RUNNER_V1}:GPUModelRunner", "input_prep", "_prepare_inputs", "_build_attention_metadata",
               "_preprocess", "_determine_batch_execution_and_padding"),
    **_methods(f"{RUNNER_V1}:GPUModelRunner", "forward", "_model_forward"),
    **_methods(f"{RUNNER_V1}:GPUModelRunner", "sampling", "sample_tokens", "_sample", "_bookkeeping_sync",
               "propose_draft_token_ids"),
    **_methods(f"{RUNNER_V1}:GPUModelRunner", "eplb", "eplb_step"),
    **_methods(f"{RUNNER_V1}:AsyncGPUModelRunnerOutput", "output_copy", "__init__", "get_output"),
    # V1 DP padding all-reduce (every step), at its definition and where it is imported by name
    f"{DP_V1}:coordinate_batch_across_dp": ("coordinate_batch_across_dp", "dp_sync"),
    f"{DP_V1}:_run_ar": ("dp_utils._run_ar", "dp_sync"),
    f"{RUNNER_V1}:coordinate_batch_across_dp": ("coordinate_batch_across_dp", "dp_sync"),
    "vllm.v1.spec_decode.llm_base_proposer:coordinate_batch_across_dp": ("coordinate_batch_across_dp", "dp_sync"),
    "vllm.v1.spec_decode.extract_hidden_states:coordinate_batch_across_dp": ("coordinate_batch_across_dp",
                                                                            "dp_sync"),
    # V2 model runner (default in 0.33)
    **_methods(f"{RUNNER_V2}:GPUModelRunner", "worker", "execute_model"),
    **_methods(f"{RUNNER_V2}:GPUModelRunner", "state_update", "finish_requests", "free_states", "add_requests",
               "update_requests"),
    **_methods(f"{RUNNER_V2}:GPUModelRunner", "input_prep", "gather_batch_req_state", "prepare_inputs",
               "prepare_attn"),
    **_methods(f"{RUNNER_V2}:GPUModelRunner", "sampling", "sample_tokens", "sample", "postprocess_sampled"),
    **_methods("vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager", "forward", "run_fullgraph",
               "run_pw_graph"),
    **_methods("vllm.v1.worker.gpu.cudagraph_utils:ModelCudaGraphManager", "forward", "run_fullgraph"),
    **_methods("vllm.v1.worker.gpu.eplb_utils:EPLBController", "eplb", "step"),
    **_methods("vllm.v1.worker.gpu.async_utils:AsyncOutput", "output_copy", "__init__", "get_output"),
    # V2 DP padding all-reduce (always Gloo), definition and use sites
    f"{DP_V2}:dispatch_cg_and_sync_dp": ("dispatch_cg_and_sync_dp", "dp_sync"),
    f"{DP_V2}:sync_cudagraph_and_dp_padding": ("sync_cudagraph_and_dp_padding", "dp_sync"),
    f"{RUNNER_V2}:dispatch_cg_and_sync_dp": ("dispatch_cg_and_sync_dp", "dp_sync"),
    **{f"vllm.v1.worker.gpu.spec_decode.{m}.speculator:dispatch_cg_and_sync_dp": ("dispatch_cg_and_sync_dp",
                                                                                   "dp_sync")
       for m in ("target_dependent_ar", "multi_module_mtp", "dflash")},
    # EPLB (V1 path)
    **_methods("vllm.distributed.eplb.eplb_state:EplbState", "eplb", "step", "rearrange"),
    # front end
    **_methods("vllm.v1.engine.core_client:AsyncMPClient", "frontend", "get_output_async"),
    **_methods("vllm.v1.engine.output_processor:OutputProcessor", "frontend", "process_outputs"),
    **_methods("vllm.v1.engine.detokenizer:BaseIncrementalDetokenizer", "detokenize", "update"),
    **_methods("vllm.v1.metrics.loggers:StatLoggerManager", "stats", "record"),
}

#: tables by the vLLM release they were read from (newest last)
TABLES: dict[tuple[int, int], dict[str, tuple[str, str]]] = {(0, 33): VLLM_033}

#: worker calls that count steps (torch step windows): a DP rank with no work runs a dummy batch
STEP_TARGETS = (f"{WORKER}:Worker.execute_model", f"{WORKER}:Worker.execute_dummy_batch")


def table_for(version: str | None) -> dict[str, tuple[str, str]]:
    """The newest table not newer than ``version`` (the oldest one for older or unknown versions)."""
    wanted = _parse(version)
    chosen = min(TABLES)
    for key in sorted(TABLES):
        if wanted is not None and key <= wanted:
            chosen = key
    if wanted is not None and wanted > max(TABLES):
        chosen = max(TABLES)
    return TABLES[chosen]


def _parse(version: str | None) -> tuple[int, int] | None:
    try:
        major, minor = str(version).split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()))
    except (ValueError, AttributeError):
        return None


def _installed_version() -> str | None:
    mod = sys.modules.get("vllm")
    if mod is not None and getattr(mod, "__version__", None):
        return str(mod.__version__)
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:  # noqa: BLE001
        return None


def _engine_config(args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """DP rank of an engine-core process, from ``self.vllm_config.parallel_config``."""
    pc = getattr(getattr(args[0], "vllm_config", None), "parallel_config", None) if args else None
    if pc is None:
        return None
    size = getattr(pc, "data_parallel_size", None)
    rank = getattr(pc, "data_parallel_rank", None)
    if size is not None and int(size) == 1:
        rank = 0
    return {"dp_rank": rank, "dp_size": size, "role": "engine_core"}


def _worker(args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """A worker's global and local rank (its DP/EP ranks come from vLLM's parallel state)."""
    me = args[0] if args else None
    return {"global_rank": getattr(me, "rank", None), "local_rank": getattr(me, "local_rank", None),
            "role": "worker"}


LEARNERS = {
    **{f"{ENGINE_CORE}:EngineCore.{m}": _engine_config for m in ("step", "step_with_batch_queue",
                                                                 "execute_dummy_batch")},
    **{f"{WORKER}:Worker.{m}": _worker for m in ("execute_model", "execute_dummy_batch")},
}


def specs(version: str | None = None) -> list[HookSpec]:
    return table_specs(table_for(version or _installed_version()), LEARNERS)
