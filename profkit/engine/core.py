"""EngineCore and the per-rank process: the step loop, profiler windows and the timings file.

One step, as in vLLM: ``Scheduler.schedule`` -> ``sync_dp_padding`` (Gloo MAX all-reduce) ->
``execute_model`` (MoE all-to-alls) -> ``sample_tokens`` (host sync) -> ``update_from_output``.
Every step appends one JSON line to ``rank{r}.steps.jsonl`` (flushed, so a crash keeps the steps
before it). With ``--split-procs`` the scheduler runs in this process and the model in a worker
child process, talking over multiprocessing queues like vLLM's ``MultiprocExecutor``.

A step record (one JSON object per line; all times int64 ns):
    rank, step; start_wall_ns/end_wall_ns (time.time_ns) and start_mono_ns/end_mono_ns
    (time.monotonic_ns) read at the same instants, so either clock maps onto the other; step_ns;
    phase_ns: span name -> summed duration. Top-level phases (siblings inside EngineCore.step):
      gc, Scheduler.schedule, sync_dp_padding, execute_model, sample_tokens, update_from_output
      (split-procs: MultiprocExecutor.execute_model / .sample_tokens on the engine side, the
      worker's own phases merged in); nested in execute_model: prepare_inputs and, summed over
      layers, attn, router, moe_dispatch, experts, moe_combine. Time in EngineCore.step outside
      the top-level phases is unannotated (the ``sleep`` fault lands there).
    num_tokens, padded_tokens (DP max), n_prefill, prefill_tokens, n_decode, decode_tokens,
    annotation (vLLM's execute_context_..._generation_...), finished, running, waiting;
    expert_loads[layer][expert]: tokens (x top-k) this rank's router sent to each global expert;
    expert_recv[layer][local expert]: token rows this rank's experts computed;
    faults: [{kind, spec (index in the run's --inject list), ms, measured_ns, ...}] that fired.
``rank{r}.engine.json`` (and ``.worker.json``) hold pid, host, device and a clock anchor.
"""
from __future__ import annotations

import datetime
import gc
import gzip
import json
import os
import queue
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .annotate import Spans
from .config import (SPAN_GC, SPAN_RPC_EXECUTE, SPAN_RPC_SAMPLE, SPAN_SCHEDULE, SPAN_STEP,
                     SPAN_UPDATE, EngineConfig)
from .faults import ENGINE_KINDS, WORKER_KINDS, FaultRuntime, InjectedCrash
from .replay import requests_for
from .runner import GPUModelRunner, Worker
from .scheduler import Scheduler, SchedulerOutput

MULTI_GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


def timings_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.steps.jsonl"


def clock_anchor() -> dict[str, int]:
    """Wall, monotonic and perf_counter read back to back: maps any of them onto the others."""
    return {"wall_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns(),
            "perf_counter_ns": time.perf_counter_ns()}


def profile_edges(cfg: EngineConfig) -> set[int]:
    """Steps before which some profiler window opens or closes."""
    return {w[i] for w in (cfg.profile_steps, cfg.cuda_profiler_steps) if w for i in (0, 1)}


class Profiling:
    """Step-numbered profiler windows: the same step on every rank, not the same wall time."""

    def __init__(self, cfg: EngineConfig, rank: int, device: torch.device, suffix: str = "",
                 barrier=None):
        """``barrier`` (a Gloo barrier, where this process has the group) re-aligns the ranks after a
        profiler start or stop, whose cost differs per rank, so the window's first step is not skewed."""
        self.cfg, self.rank, self.device, self.suffix, self.barrier = cfg, rank, device, suffix, barrier
        self.prof: torch.profiler.profile | None = None
        self.cuda_on = False

    def before_step(self, step: int) -> None:
        cfg = self.cfg
        if step not in profile_edges(cfg):
            return
        if cfg.profile_steps and cfg.torch_profile_dir:
            a, b = cfg.profile_steps
            if step == b and self.prof is not None:
                self._stop_torch()
            if step == a:
                acts = [torch.profiler.ProfilerActivity.CPU]
                if self.device.type == "cuda":
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                try:  # one window, so keep its events (silences a torch >= 2.5 warning)
                    self.prof = torch.profiler.profile(activities=acts, acc_events=True)
                except TypeError:
                    self.prof = torch.profiler.profile(activities=acts)
                self.prof.start()
        if cfg.cuda_profiler_steps and self.device.type == "cuda":
            a, b = cfg.cuda_profiler_steps
            if step == b and self.cuda_on:
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStop()
                self.cuda_on = False
            if step == a:
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStart()
                self.cuda_on = True
        if self.barrier is not None:
            self.barrier()

    def _stop_torch(self) -> None:
        assert self.prof is not None
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.prof.stop()
        out = Path(self.cfg.torch_profile_dir or ".")
        out.mkdir(parents=True, exist_ok=True)
        raw = out / f"rank{self.rank}{self.suffix}.pt.trace.json"
        self.prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        self.prof = None

    def finish(self) -> None:
        """Close a window whose end lies past the last step."""
        if self.prof is not None:
            self._stop_torch()
        if self.cuda_on:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            self.cuda_on = False


# -- executors: how the engine core reaches its worker --------------------------------------------
class InprocExecutor:
    """Worker in the engine's own process (spans and faults are shared)."""

    def __init__(self, worker: Worker):
        self.worker = worker

    def before_step(self, step: int) -> None:
        pass

    def execute_model(self, out: SchedulerOutput) -> dict[str, Any]:
        return {"padded_tokens": self.worker.execute_model(out)}

    def sample_tokens(self) -> tuple[list[int], dict[str, Any]]:
        sampled = self.worker.sample_tokens()
        return sampled, worker_stats(self.worker.runner)

    def shutdown(self) -> None:
        pass


def worker_stats(runner: GPUModelRunner) -> dict[str, Any]:
    return {"expert_loads": [s.routed for s in runner.layer_stats],
            "expert_recv": [s.received for s in runner.layer_stats]}


class MultiprocExecutor:
    """Worker in a child process (vLLM's split); each call is a queue round trip."""

    def __init__(self, cfg: EngineConfig, rank: int, spans: Spans):
        ctx = mp.get_context("spawn")
        self.rank, self.spans, self.timeout_s = rank, spans, cfg.pg_timeout_s
        self.edges = profile_edges(cfg)
        self.requests, self.responses = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=worker_main, args=(rank, cfg, self.requests, self.responses),
                                name=f"Worker_DP{rank}", daemon=True)
        self.proc.start()
        self._call("ready", None)

    def _call(self, method: str, arg: Any) -> Any:
        self.requests.put((method, arg))
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                status, value = self.responses.get(timeout=0.5)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError(f"rank {self.rank}: worker process died "
                                       f"(exit code {self.proc.exitcode})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: worker did not answer {method!r} "
                                       f"within {self.timeout_s:.0f} s") from None
                continue
            if status == "error":
                raise RuntimeError(f"rank {self.rank} worker: {value}")
            return value

    def before_step(self, step: int) -> None:
        """Lets the worker open or close its profiler window outside the step's timing."""
        if step in self.edges:
            self._call("before_step", step)

    def execute_model(self, out: SchedulerOutput) -> dict[str, Any]:
        with self.spans.span(SPAN_RPC_EXECUTE):
            return self._call("execute_model", out)

    def sample_tokens(self) -> tuple[list[int], dict[str, Any]]:
        with self.spans.span(SPAN_RPC_SAMPLE):
            return self._call("sample_tokens", None)

    def shutdown(self) -> None:
        try:
            self._call("shutdown", None)
        finally:
            self.proc.join(timeout=30)


# -- the engine core ------------------------------------------------------------------------------
class EngineCore:
    """One DP rank's engine: ``step()`` runs one iteration and returns its timing record."""

    def __init__(self, rank: int, scheduler: Scheduler, executor, spans: Spans, faults: FaultRuntime):
        self.rank, self.scheduler, self.executor = rank, scheduler, executor
        self.spans, self.faults = spans, faults

    def _before_schedule(self, step: int) -> None:
        """Faults that hit the engine loop itself, before the step's first collective."""
        spec = self.faults.active("sleep", step)
        if spec is not None:  # unannotated: the trace shows only a gap inside EngineCore.step
            t0 = time.monotonic_ns()
            time.sleep(spec.ms / 1e3)
            self.faults.record(spec, time.monotonic_ns() - t0)
        spec = self.faults.active("gc", step)
        if spec is not None:
            with self.spans.span(SPAN_GC):
                took, freed = self.faults.collect()
            self.faults.record(spec, took, freed=freed)
        spec = self.faults.active("crash", step)
        if spec is not None:
            raise InjectedCrash(f"rank {self.rank}: injected crash at step {step}")

    def step(self, step: int) -> dict[str, Any]:
        self.spans.reset()
        start_wall, start_mono = time.time_ns(), time.monotonic_ns()
        with self.spans.span(SPAN_STEP):
            self._before_schedule(step)
            with self.spans.span(SPAN_SCHEDULE):
                out = self.scheduler.schedule(step)
            info = self.executor.execute_model(out)
            sampled, stats = self.executor.sample_tokens()
            with self.spans.span(SPAN_UPDATE):
                finished = self.scheduler.update_from_output(out, sampled)
        end_mono, end_wall = time.monotonic_ns(), time.time_ns()
        phases = self.spans.reset()
        phases.update(stats.pop("phase_ns", {}))
        faults = self.faults.take_fired() + stats.pop("faults", [])
        return {
            "rank": self.rank, "step": step,
            "start_wall_ns": start_wall, "end_wall_ns": end_wall,
            "start_mono_ns": start_mono, "end_mono_ns": end_mono,
            "step_ns": end_mono - start_mono,
            "phase_ns": phases,
            "num_tokens": out.total_tokens, "padded_tokens": info["padded_tokens"],
            "n_prefill": out.n_prefill, "prefill_tokens": out.prefill_tokens,
            "n_decode": out.n_decode, "decode_tokens": out.decode_tokens,
            "annotation": out.annotation, "finished": finished, "replay_arrived": self.scheduler.arrived,
            "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
            "expert_loads": stats.get("expert_loads", []),
            "expert_recv": stats.get("expert_recv", []),
            "faults": faults,
        }


# -- processes ------------------------------------------------------------------------------------
def _setup_process(cfg: EngineConfig, rank: int, use_device: bool = True) -> torch.device:
    """``use_device=False`` for a split engine-core process, which (as in vLLM) never touches CUDA."""
    os.environ.update(MULTI_GPU_ENV)
    if cfg.device == "cuda" and use_device:
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    torch.set_num_threads(1)
    return torch.device("cpu")


def _freeze_gc() -> None:
    """No automatic GC on ranks (vLLM freezes it in workers): only injected pauses happen."""
    gc.collect()
    gc.freeze()
    gc.disable()


def _init_dist(cfg: EngineConfig, rank: int, device: torch.device):
    """World group (NCCL on CUDA, Gloo on CPU) for the all-to-alls, plus a Gloo group for DP sync."""
    timeout = datetime.timedelta(seconds=cfg.pg_timeout_s)
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
                            rank=rank, world_size=cfg.ranks, timeout=timeout, **kwargs)
    try:  # a name that shows in Kineto's distributedInfo (pg_desc)
        return dist.new_group(backend="gloo", timeout=timeout, group_desc="dp_cpu")
    except TypeError:  # older torch
        return dist.new_group(backend="gloo", timeout=timeout)


def _build_worker(cfg: EngineConfig, rank: int, device: torch.device, spans: Spans,
                  faults: FaultRuntime) -> tuple[Worker, Profiling]:
    dp_cpu_group = _init_dist(cfg, rank, device)
    worker = Worker(GPUModelRunner(cfg, rank, device, spans, faults, dp_cpu_group), spans)
    return worker, Profiling(cfg, rank, device, barrier=lambda: dist.barrier(group=dp_cpu_group))


def _write_info(cfg: EngineConfig, rank: int, device: torch.device, faults: FaultRuntime,
                role: str) -> None:
    info = {"rank": rank, "role": role, "pid": os.getpid(), "host": socket.gethostname(),
            "device": str(device), "torch": torch.__version__, "anchor": clock_anchor(),
            "gc_heap_objects": faults.gc_heap_objects}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    (Path(cfg.out_dir) / f"rank{rank}.{role}.json").write_text(json.dumps(info, indent=1))


def rank_main(rank: int, cfg: EngineConfig) -> None:
    """Entry of one DP rank's serving process (``torch.multiprocessing.spawn`` target; the
    ``--bench-forward`` run's is ``bench.bench_main``)."""
    device = _setup_process(cfg, rank, use_device=not cfg.split_procs)
    _freeze_gc()
    spans = Spans(use_nvtx=cfg.device == "cuda")  # NVTX needs no CUDA context
    if cfg.split_procs:
        faults = FaultRuntime(rank, cfg.faults, kinds=set(ENGINE_KINDS))
        executor: Any = MultiprocExecutor(cfg, rank, spans)
        prof = Profiling(cfg, rank, device, suffix=".engine")
    else:
        faults = FaultRuntime(rank, cfg.faults)
        worker, prof = _build_worker(cfg, rank, device, spans, faults)
        executor = InprocExecutor(worker)
    _write_info(cfg, rank, device, faults, "engine")
    replayed = (requests_for(cfg.replay, cfg.ranks, rank, cfg.size, cfg.steps, cfg.replay_seed)
                if cfg.replay else None)
    lag_ns = int(round(rank * cfg.lag_ms * 1e6)) if cfg.replay == "lag" else 0
    core = EngineCore(rank, Scheduler(rank, cfg.seed, cfg.size, faults, replayed, lag_ns), executor, spans, faults)
    with open(timings_path(cfg.out_dir, rank), "w", buffering=1) as timings:
        for step in range(cfg.steps):
            prof.before_step(step)
            executor.before_step(step)
            timings.write(json.dumps(core.step(step), separators=(",", ":")) + "\n")
        prof.finish()
    executor.shutdown()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def worker_main(rank: int, cfg: EngineConfig, requests, responses) -> None:
    """Entry of a rank's worker process under ``--split-procs``: serves the engine's calls."""
    try:
        device = _setup_process(cfg, rank)
        _freeze_gc()
        spans = Spans(use_nvtx=device.type == "cuda")
        faults = FaultRuntime(rank, cfg.faults, kinds=set(WORKER_KINDS))
        worker, prof = _build_worker(cfg, rank, device, spans, faults)
        _write_info(cfg, rank, device, faults, "worker")
    except Exception as exc:  # noqa: BLE001 - reported to the engine, which names the rank
        responses.put(("error", f"startup failed: {exc!r}"))
        raise
    parent = os.getppid()
    while True:
        try:
            method, arg = requests.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # engine process is gone
                return
            continue
        try:
            if method == "ready":
                responses.put(("ok", None))
            elif method == "before_step":
                prof.before_step(arg)
                responses.put(("ok", None))
            elif method == "execute_model":
                spans.reset()
                responses.put(("ok", {"padded_tokens": worker.execute_model(arg)}))
            elif method == "sample_tokens":
                sampled = worker.sample_tokens()
                stats = worker_stats(worker.runner)
                stats["phase_ns"] = spans.reset()
                stats["faults"] = faults.take_fired()
                responses.put(("ok", (sampled, stats)))
            elif method == "shutdown":
                prof.finish()
                dist.barrier()
                dist.destroy_process_group()
                responses.put(("ok", None))
                return
        except Exception as exc:  # noqa: BLE001
            responses.put(("error", repr(exc)))
            raise
