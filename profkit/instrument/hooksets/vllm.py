"""Hooks for vLLM, one table per release: 0.33 read from the vllm 0.33.0 wheel's source, 0.26 from
the vllm 0.26.0 wheel (the release the lent H200 machine runs).

Span names are the qualnames (``EngineCore.step`` is profkit's step marker). Use-site patches
(``module:function`` where the module imported the function by name) are listed beside the
definitions: patching only the definition would not time those calls. ``tests/test_vllm_hooks.py``
checks every table against its wheel's source. A release without a table gets the nearest one and
a warning; targets that then do not resolve warn one by one (``HookWarning``) and are listed in the
capture's manifest, as are the targets that resolved but never fired.
"""
from __future__ import annotations

import sys
import warnings
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

#: 0.33 targets that do not exist in 0.26.0: the DP syncs call torch.distributed.all_reduce directly
#: (no ``cpu_all_reduce_`` helper), the V2 runner has no ``gather_batch_req_state``, and the V2
#: speculators below are not there yet
NOT_IN_026 = frozenset({
    "vllm.distributed.utils:cpu_all_reduce_",
    "vllm.config.parallel:cpu_all_reduce_",
    "vllm.distributed.parallel_state:cpu_all_reduce_",
    f"{RUNNER_V2}:GPUModelRunner.gather_batch_req_state",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:dispatch_cg_and_sync_dp",
    "vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator:dispatch_cg_and_sync_dp",
})
VLLM_026: dict[str, tuple[str, str]] = {t: v for t, v in VLLM_033.items() if t not in NOT_IN_026}

#: tables by the vLLM release they were read from (oldest first)
TABLES: dict[tuple[int, int], dict[str, tuple[str, str]]] = {(0, 26): VLLM_026, (0, 33): VLLM_033}

#: worker calls that count steps (torch step windows): a DP rank with no work runs a dummy batch
STEP_TARGETS = (f"{WORKER}:Worker.execute_model", f"{WORKER}:Worker.execute_dummy_batch")


def table_key(version: str | None) -> tuple[int, int]:
    """The release whose table serves ``version``: its own, else the nearest (ties: the newer);
    the newest for an unparsable or unknown (None) version."""
    wanted = _parse(version)
    if wanted is None:
        return max(TABLES)
    if wanted in TABLES:
        return wanted
    return min(TABLES, key=lambda key: (abs((key[0] - wanted[0]) * 1000 + key[1] - wanted[1]), -key[1]))


def table_for(version: str | None) -> dict[str, tuple[str, str]]:
    """The hook table for ``version`` (see ``table_key``)."""
    return TABLES[table_key(version)]


class VersionWarning(RuntimeWarning):
    """The installed vLLM has no hook table of its own."""


def describe_choice(version: str | None) -> tuple[str, str | None]:
    """(``"0.26"``, warning text or None) for the installed ``version``."""
    key = table_key(version)
    label = f"{key[0]}.{key[1]}"
    if _parse(version) == key:
        return label, None
    known = ", ".join(f"{k[0]}.{k[1]}" for k in sorted(TABLES))
    return label, (f"profkit: no vLLM hook table for vllm {version or '(version unknown)'} (tables: {known}); "
                   f"using {label}'s. Targets that do not resolve warn one by one and are listed in the "
                   f"capture manifest's hooks section.")


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
    """Hook specs for ``version`` (default: the installed vLLM, which is not imported for this)."""
    version = version or _installed_version()
    label, warning = describe_choice(version)
    CHOSEN.update(version=version, table=label)
    if warning and version is not None:
        warnings.warn(warning, VersionWarning, stacklevel=2)
    return table_specs(table_for(version), LEARNERS)


#: which table this process chose (for the capture manifest)
CHOSEN: dict[str, str | None] = {"version": None, "table": None}
