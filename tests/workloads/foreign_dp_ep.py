"""A small DP-attention + expert-parallel decode loop that is NOT profkit's engine.

Why it exists: profkit's verdicts must hold on programs shaped by someone else, whose span names
the analyzer has never seen. This program is set up the way vLLM sets up data parallelism with
expert parallelism, but with names of its own:

- the default process group is NCCL on GPUs (``--device cuda``) or Gloo on CPU;
- the DP padding sync is an all-reduce (MAX) of the padded token count on a SEPARATE Gloo group,
  once an iteration, inside the user's ``record_function("dp_padding_allreduce")`` (vLLM does
  it on its CPU group; with Gloo the ``c10d::allreduce_`` op returns at once and the wait is in
  ``work.wait()``, i.e. the user range's self time);
- MoE dispatch and combine are ``all_to_all_single`` on the default group, one pair per layer;
- every iteration is ``schedule`` -> ``dp_padding_allreduce`` -> ``execute_model`` (``attention``,
  ``moe_layer``) -> ``sample`` -> ``update_from_output``, under torch.profiler (one
  ``ProfilerStep#N`` per iteration: ``prof.step()`` ends each);
- one rank runs a long ``gc.collect()`` over a live heap at the END of an iteration, inside
  ``update_from_output``, every ``--gc-every`` iterations: it arrives late at the NEXT
  iteration's padding all-reduce, and its peers wait there.

Each rank writes ``OUT/rank{r}.pt.trace.json.gz`` (Kineto) and ``TRUTH/rank{r}.json``: which
iterations (= ``ProfilerStep#N`` numbers) ended with a GC stall and how long each ``gc.collect()``
took, measured by the program itself (``time.perf_counter_ns`` around the call), plus its
per-iteration wall times and the profiled iterations.

Run: ``python tests/workloads/foreign_dp_ep.py --ranks 2 --steps 36 --out DIR --truth TRUTH``
(CPU, Gloo; ``--device cuda`` for NCCL on one GPU per rank).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Heap:
    """A live heap of tracked container objects: a full collection walks all of them."""

    def __init__(self, n_objects: int) -> None:
        self.items = [[i, {"k": i}] for i in range(n_objects // 2)]

    def collect(self) -> int:
        """One full collection (plus some fresh cyclic garbage, as a real loop leaves behind)."""
        for _ in range(2000):
            a: list = []
            a.append(a)
        t0 = time.perf_counter_ns()
        gc.collect()
        return time.perf_counter_ns() - t0


def calibrate_heap(target_ms: float) -> Heap:
    """Grow the heap until one full collection takes about ``target_ms`` (measured, not assumed)."""
    n = 200_000
    while True:
        heap = Heap(n)
        took = min(heap.collect() for _ in range(2)) / 1e6
        if took >= target_ms or n >= 20_000_000:
            return heap
        n = int(n * max(1.5, min(4.0, target_ms / max(took, 0.5))))


def run_rank(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.set_num_threads(1)
    torch.manual_seed(1000 + rank)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=args.ranks)
    dp_group = dist.new_group(backend="gloo")  # the padding sync's own CPU group, as vLLM does

    hidden, n_layers, experts_per_rank = args.hidden, args.layers, 2
    n_experts = experts_per_rank * args.ranks
    gen = torch.Generator().manual_seed(7)
    attn_w = [torch.randn(hidden, hidden, generator=gen).to(device) / hidden ** 0.5 for _ in range(n_layers)]
    router_w = [torch.randn(hidden, n_experts, generator=gen).to(device) for _ in range(n_layers)]
    expert_w = [[torch.randn(hidden, hidden, generator=gen).to(device) / hidden ** 0.5
                 for _ in range(experts_per_rank)] for _ in range(n_layers)]
    embed = torch.randn(4096, hidden, generator=gen).to(device)
    heap = calibrate_heap(args.gc_ms) if rank == args.gc_rank else None
    requests = [{"id": i, "tokens": [i % 97], "done": False} for i in range(args.batch)]
    rng = torch.Generator().manual_seed(100 + rank)

    def schedule_batch() -> list[dict]:
        live = [r for r in requests if not r["done"]]
        live.sort(key=lambda r: len(r["tokens"]))  # some Python work, as a scheduler does
        take = int(torch.randint(args.batch // 2, args.batch + 1, (1,), generator=rng))
        return live[:take]

    def moe_layer(x: torch.Tensor, layer: int) -> torch.Tensor:
        logits = x @ router_w[layer]
        expert = logits.argmax(dim=-1)
        owner = torch.div(expert, experts_per_rank, rounding_mode="floor")
        # fixed-size chunk per destination rank: padded dispatch, as padded all-to-all kernels do
        send = torch.zeros(args.ranks * x.shape[0], hidden, device=device)
        for dst in range(args.ranks):
            rows = x[owner == dst]
            send[dst * x.shape[0]: dst * x.shape[0] + rows.shape[0]] = rows
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # dispatch
        out = torch.zeros_like(recv)
        for e in range(experts_per_rank):
            out = out + torch.relu(recv @ expert_w[layer][e]) / experts_per_rank
        back = torch.empty_like(out)
        dist.all_to_all_single(back, out)  # combine
        return x + back.view(args.ranks, x.shape[0], hidden).sum(0)

    truth: dict = {"rank": rank, "gc_rank": args.gc_rank, "gc_every": args.gc_every, "gc": [], "iterations": []}
    wait, warmup, active = 1, args.warmup, args.steps - args.warmup - 1
    out_dir = Path(args.out)

    def on_ready(prof) -> None:
        path = out_dir / f"rank{rank}.pt.trace.json"
        prof.export_chrome_trace(str(path))
        import gzip
        import shutil

        with open(path, "rb") as src, gzip.open(str(path) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        path.unlink()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    dist.barrier()
    with profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                 on_trace_ready=on_ready) as prof:
        for it in range(args.steps):
            t_it = time.perf_counter_ns()
            with record_function("schedule"):
                batch = schedule_batch()
            with record_function("dp_padding_allreduce"):
                n = torch.tensor([len(batch)], dtype=torch.int64)
                dist.all_reduce(n, op=dist.ReduceOp.MAX, group=dp_group)
                padded = int(n.item())
            with record_function("execute_model"):
                ids = torch.tensor([r["tokens"][-1] for r in batch] + [0] * (padded - len(batch)), device=device)
                x = embed[ids]
                for layer in range(n_layers):
                    with record_function("attention"):
                        x = x + torch.tanh(x @ attn_w[layer])
                    with record_function("moe_layer"):
                        x = moe_layer(x, layer)
            with record_function("sample"):
                next_ids = (x @ embed[:512].T).argmax(dim=-1).tolist()
            with record_function("update_from_output"):
                for r, tok in zip(batch, next_ids):
                    r["tokens"].append(int(tok))
                    if len(r["tokens"]) > 64:
                        r["tokens"] = r["tokens"][-8:]
                if heap is not None and it >= args.warmup and (it % args.gc_every) == args.gc_every - 1:
                    took = heap.collect()
                    truth["gc"].append({"iteration": it, "ms": took / 1e6})
            truth["iterations"].append({"iteration": it, "ms": (time.perf_counter_ns() - t_it) / 1e6})
            prof.step()
    dist.barrier()
    truth["profiled_iterations"] = [wait + warmup, args.steps - 1]
    Path(args.truth).mkdir(parents=True, exist_ok=True)
    (Path(args.truth) / f"rank{rank}.json").write_text(json.dumps(truth, indent=1))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=36, help="iterations in all (the first few are not profiled)")
    ap.add_argument("--warmup", type=int, default=4, help="profiler warm-up iterations (after one skipped)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--gc-rank", type=int, default=0)
    ap.add_argument("--gc-every", type=int, default=5)
    ap.add_argument("--gc-ms", type=float, default=80.0, help="calibrated length of one gc.collect()")
    ap.add_argument("--out", required=True, help="folder for the Kineto traces")
    ap.add_argument("--truth", required=True, help="folder for each rank's truth JSON")
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    import torch.multiprocessing as mp

    mp.spawn(run_rank, args=(args, _free_port()), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
