"""``--bench-forward SERVING_OUT``: replay a serving run's batch shapes GPU-only, as ``vllm bench forward``.

Why: the serving step time of a batch is only judged against what the same batch costs with no
serving loop around it. Each rank reads its own ``rank{r}.steps.jsonl`` from the serving run (the
shapes it ran: prefill and decode requests and tokens, the DP-padded token count) and runs just
``execute_model`` for each of them, back to back: no scheduler, no DP padding all-reduce (the
padded count is recorded), no sampling, no output processing. The MoE all-to-alls still couple
the ranks, as in vLLM's bench, which runs every DP/EP rank. Each step is timed to the end of its
device work (a synchronize on CUDA) and written as a step record with the same batch facts, and
vLLM's step annotation marks it in the traces, so ``profkit analyze`` finds the steps and their
shapes and ``profkit compare --gpu-only`` pairs them with the serving run's.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .annotate import Spans
from .config import SPAN_EXECUTE, EngineConfig
from .core import _build_worker, _freeze_gc, _setup_process, _write_info, timings_path
from .faults import FaultRuntime
from .scheduler import SchedulerOutput
from .truth import read_timings


def shapes_of(serving_out: str | Path, ranks: int, steps: int) -> dict[int, list[dict]]:
    """Per rank, the recorded batch shapes to replay: the first ``steps`` steps every rank recorded."""
    per = {r: read_timings(Path(serving_out) / f"rank{r}.steps.jsonl") for r in range(ranks)}
    n = min([steps] + [len(v) for v in per.values()])
    if n < 1:
        raise ValueError(f"{serving_out}: no rank{{r}}.steps.jsonl records to replay for {ranks} rank(s)")
    return {r: v[:n] for r, v in per.items()}


def batch_of(rec: dict, step: int, vocab: int, rng: random.Random) -> SchedulerOutput:
    """A batch of the recorded shape: prefill tokens split evenly over the prefill requests, one token
    per decode; token ids drawn at random (the forward's cost does not depend on them)."""
    n_pre, pre_tok = int(rec.get("n_prefill", 0)), int(rec.get("prefill_tokens", 0))
    n_dec = int(rec.get("n_decode", 0))
    sizes = [pre_tok // n_pre + (1 if i < pre_tok % n_pre else 0) for i in range(n_pre)] if n_pre else []
    sizes += [1] * n_dec
    total = sum(sizes)
    return SchedulerOutput(step, [f"b{step}.{i}" for i in range(len(sizes))],
                           [rng.randrange(vocab) for _ in range(total)], sizes, [True] * n_pre + [False] * n_dec,
                           n_prefill=n_pre, prefill_tokens=pre_tok, n_decode=n_dec, decode_tokens=n_dec)


def bench_main(rank: int, cfg: EngineConfig) -> None:
    device = _setup_process(cfg, rank)
    _freeze_gc()
    spans = Spans(use_nvtx=cfg.device == "cuda")
    faults = FaultRuntime(rank, [])  # nothing injected: this is the reference
    worker, prof = _build_worker(cfg, rank, device, spans, faults)
    _write_info(cfg, rank, device, faults, "engine")
    assert cfg.bench_forward is not None
    records = shapes_of(cfg.bench_forward, cfg.ranks, cfg.steps)[rank]
    rng = random.Random(cfg.seed * 1_000_003 + rank)
    runner = worker.runner
    with open(timings_path(cfg.out_dir, rank), "w", buffering=1) as out:
        for step, rec in enumerate(records):
            prof.before_step(step)
            batch = batch_of(rec, step, cfg.size.vocab, rng)
            padded = max(int(rec.get("padded_tokens") or batch.total_tokens), batch.total_tokens, 1)
            spans.reset()
            t0, w0 = time.monotonic_ns(), time.time_ns()
            with spans.span(SPAN_EXECUTE):
                runner.execute_model(batch, padded)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            t1, w1 = time.monotonic_ns(), time.time_ns()
            out.write(json.dumps({
                "rank": rank, "step": step, "replayed_step": int(rec["step"]), "start_wall_ns": w0, "end_wall_ns": w1,
                "start_mono_ns": t0, "end_mono_ns": t1, "step_ns": t1 - t0, "phase_ns": spans.reset(),
                "num_tokens": batch.total_tokens, "padded_tokens": padded, "n_prefill": batch.n_prefill,
                "prefill_tokens": batch.prefill_tokens, "n_decode": batch.n_decode, "decode_tokens": batch.decode_tokens,
                "annotation": batch.annotation, "serving_step_ns": int(rec.get("step_ns", 0)), "faults": [],
            }, separators=(",", ":")) + "\n")
        prof.finish()
    dist.barrier()
    dist.destroy_process_group()
