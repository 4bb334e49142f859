"""Worker and model runner: the DP padding all-reduce, ``execute_model`` and ``sample_tokens``.

Mirrors vLLM's V2 runner: before running, every DP rank agrees on the padded token count with a
MAX all-reduce of a CPU tensor over a Gloo group (``sync_dp_padding``, vLLM's
``sync_cudagraph_and_dp_padding``), so all ranks run the same shapes and meet in the MoE
all-to-alls. The forward result stays on the device until ``sample_tokens`` (argmax, then a host
sync through ``.cpu()``), as in vLLM where sampling is a separate call.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .annotate import Spans
from .config import SPAN_DP_SYNC, SPAN_EXECUTE, SPAN_SAMPLE, EngineConfig
from .faults import FaultRuntime, spin_until
from .model import LayerStats, MoEModel
from .scheduler import SchedulerOutput


class GPUModelRunner:
    """Holds the model; runs one step's forward and sampling."""

    def __init__(self, cfg: EngineConfig, rank: int, device: torch.device, spans: Spans,
                 faults: FaultRuntime, dp_cpu_group):
        self.cfg, self.rank, self.device, self.spans, self.faults = cfg, rank, device, spans, faults
        self.dp_cpu_group = dp_cpu_group
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.model = MoEModel(cfg.size, rank, cfg.ranks, device, dtype, cfg.seed, spans, token_ns=cfg.token_ns)
        hot = [s for s in cfg.faults if s.kind == "hot_experts"]  # every rank routes with the bias
        self._hot = hot
        self._hidden: torch.Tensor | None = None
        self._last_idx: torch.Tensor | None = None
        self._hidden_probe: torch.Tensor | None = None  # a device tensor the host_sync fault reads
        self.layer_stats: list[LayerStats] = []

    def sync_dp_padding(self, step: int, num_tokens: int) -> int:
        """MAX of num_tokens over DP ranks (Gloo, CPU tensor): the padded batch every rank runs."""
        spec = self.faults.active("slow_allreduce", step)
        if spec is not None:  # the partner arrives late
            t0 = time.monotonic_ns()
            time.sleep(spec.ms / 1e3)
            self.faults.record(spec, time.monotonic_ns() - t0)
        t = torch.tensor([num_tokens], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.dp_cpu_group)
        return max(1, int(t.item()))

    def _host_sync(self, step: int) -> None:
        spec = self.faults.active("host_sync", step)
        if spec is None:
            return
        t0 = time.monotonic_ns()
        deadline = t0 + int(spec.ms * 1e6)
        if self.device.type == "cuda":  # busy-poll an event, as a runner waiting on the GPU does
            event = torch.cuda.Event()
            event.record()
            while time.monotonic_ns() < deadline:
                event.query()
                spin_until(min(deadline, time.monotonic_ns() + 50_000))
        else:
            spin_until(deadline)
        assert self._hidden_probe is not None
        self._hidden_probe.sum().item()  # the sync itself
        self.faults.record(spec, time.monotonic_ns() - t0)

    def execute_model(self, out: SchedulerOutput, padded_tokens: int) -> None:
        with self.spans.span(out.annotation, timed=False):
            with self.spans.span("prepare_inputs"):
                ids = out.token_ids + [0] * (padded_tokens - out.total_tokens)
                token_ids = torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True)
                ends = torch.tensor(out.num_scheduled, dtype=torch.int64).cumsum(0) - 1
                self._last_idx = ends.to(self.device, non_blocking=True)
                self._hidden_probe = token_ids
                self._host_sync(out.step)
            bias = None
            for spec in self._hot:
                if spec.fires(spec.rank, out.step):
                    bias = self.model.hot_bias(spec.rank)
                    if spec.rank == self.rank:
                        self.faults.record(spec, 0, experts=self._hot_ids(spec.rank))
            self._hidden, self.layer_stats = self.model.forward(token_ids, out.total_tokens, bias)

    def _hot_ids(self, rank: int) -> list[int]:
        s = self.cfg.size
        first = rank * s.experts_per_rank
        return list(range(first, first + min(s.topk, s.experts_per_rank)))

    def sample_tokens(self) -> list[int]:
        """Greedy sampling of each request's last position; ``.cpu()`` is the step's host sync."""
        assert self._hidden is not None and self._last_idx is not None
        if self._last_idx.numel() == 0:
            return []
        logits = self._hidden.index_select(0, self._last_idx) @ self.model.lm_head
        return torch.argmax(logits, dim=-1).cpu().tolist()


class Worker:
    """vLLM's ``Worker``: the entry the engine (or the executor RPC) calls each step."""

    def __init__(self, runner: GPUModelRunner, spans: Spans):
        self.runner, self.spans = runner, spans

    def execute_model(self, out: SchedulerOutput) -> int:
        """DP padding sync, then the forward; returns the padded token count."""
        with self.spans.span(SPAN_DP_SYNC):
            padded = self.runner.sync_dp_padding(out.step, out.total_tokens)
        with self.spans.span(SPAN_EXECUTE):
            self.runner.execute_model(out, padded)
        return padded

    def sample_tokens(self) -> list[int]:
        with self.spans.span(SPAN_SAMPLE):
            return self.runner.sample_tokens()
