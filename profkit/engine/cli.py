"""``python -m profkit.engine``: launch one process per DP rank, wait for them, write the truth.

    python -m profkit.engine --ranks N --steps S [--device cpu|cuda]
        [--inject KIND:rank=R[,every=K][,ms=M][,start=S]]... [--truth FILE] [--out DIR] [--seed K]
        [--torch-profile DIR --profile-steps A:B] [--cuda-profiler-steps A:B] [--split-procs]
        [--replay mirror|lag|round-robin [--replay-seed K] [--lag-ms MS]] [--bench-forward SERVING_OUT]

Profiler windows are step numbers [A, B): started before step A and stopped before step B on
every rank. Exit status 0 when every rank finished; otherwise non-zero with the failed rank named.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from .config import EngineConfig, ModelSize
from .faults import FAULT_KINDS, parse_inject
from .replay import DEFAULT_LAG_MS, REPLAY_MODES, replay_truth
from .truth import build_truth, read_timings, write_truth


def _window(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    try:
        start, stop = int(a), int(b)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B (step numbers)") from None
    if not sep or start < 0 or stop <= start:
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B with 0 <= A < B")
    return start, stop


def _inject(text: str):
    try:
        return parse_inject(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    kinds = "\n".join(f"  {k}: {v}" for k, v in FAULT_KINDS.items())
    p = argparse.ArgumentParser(
        prog="python -m profkit.engine", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A small DP-attention + expert-parallel engine shaped like vLLM, with fault "
                    "injection and written truth.", epilog=f"fault kinds:\n{kinds}")
    p.add_argument("--ranks", type=int, required=True, help="DP ranks (processes; one GPU each on cuda)")
    p.add_argument("--steps", type=int, required=True, help="engine steps per rank")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--inject", type=_inject, action="append", default=[],
                   metavar="KIND:rank=R[,every=K][,ms=M][,start=S]", help="repeatable")
    p.add_argument("--truth", metavar="FILE", help="write the injected truth as JSON")
    p.add_argument("--out", metavar="DIR", help="step timings per rank (default: a new temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-profile", metavar="DIR", help="torch.profiler traces rank{r}.pt.trace.json.gz")
    p.add_argument("--profile-steps", type=_window, metavar="A:B", help="torch.profiler window [A, B)")
    p.add_argument("--cuda-profiler-steps", type=_window, metavar="A:B",
                   help="cudaProfilerStart/Stop window [A, B) (nsys --capture-range=cudaProfilerApi)")
    p.add_argument("--split-procs", action="store_true",
                   help="engine core (scheduler) and worker (model) in two processes per rank, like vLLM")
    p.add_argument("--replay", choices=REPLAY_MODES,
                   help="serve one seeded request set instead of per-rank random arrivals: mirror = every "
                        "rank gets an identical copy at the same time (balanced), lag = rank r gets the same "
                        "copy r x --lag-ms later (out of phase, same work), round-robin = the same copies dealt "
                        "round-robin in arrival order; compare lag (or round-robin) with mirror for the cost")
    p.add_argument("--lag-ms", type=float, default=DEFAULT_LAG_MS, metavar="MS",
                   help=f"--replay lag: rank r receives the requests r x MS later (default {DEFAULT_LAG_MS:g}; the "
                        "vLLM study used 5000)")
    p.add_argument("--bench-forward", metavar="SERVING_OUT",
                   help="GPU-only run: replay the batch shapes a serving run recorded (SERVING_OUT/rank{r}.steps.jsonl) "
                        "through execute_model back to back, with no scheduler, DP sync or sampling (vLLM's bench "
                        "forward); at most --steps of them")
    p.add_argument("--replay-seed", type=int, default=0, metavar="K",
                   help="seed of the replayed request set (independent of --seed; default 0)")
    p.add_argument("--token-us", type=float, default=0.0, metavar="US",
                   help="modelled device time per padded token and step, slept inside attention (default 0: "
                        "off); makes the batch size cost time on CPU as it does on a GPU")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the whole run is killed")
    p.add_argument("--pg-timeout", type=float, default=60.0, help="process-group timeout, seconds")
    sizes = p.add_argument_group("model size (defaults depend on --device)")
    for name in ("hidden", "ffn", "layers", "experts-per-rank", "topk", "vocab", "token-budget", "max-seqs"):
        sizes.add_argument(f"--{name}", type=int)
    return p


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_config(args: argparse.Namespace, argv: list[str]) -> EngineConfig:
    size = ModelSize.for_device(args.device)
    overrides = {k: getattr(args, k) for k in ("hidden", "ffn", "layers", "experts_per_rank", "topk",
                                                "vocab", "token_budget", "max_seqs")
                 if getattr(args, k) is not None}
    size = replace(size, **overrides)
    if size.topk > size.experts_per_rank * args.ranks:
        raise SystemExit(f"--topk {size.topk} exceeds the number of experts")
    for spec in args.inject:
        if spec.rank >= args.ranks:
            raise SystemExit(f"--inject {spec.kind}: rank {spec.rank} out of range for --ranks {args.ranks}")
    if args.token_us < 0:
        raise SystemExit("--token-us must be >= 0")
    if args.lag_ms < 0:
        raise SystemExit("--lag-ms must be >= 0")
    if args.bench_forward:
        if args.replay or args.inject or args.split_procs:
            raise SystemExit("--bench-forward replays recorded shapes: no --replay, --inject or --split-procs")
        if not (Path(args.bench_forward) / "rank0.steps.jsonl").is_file():
            raise SystemExit(f"--bench-forward {args.bench_forward}: no rank0.steps.jsonl (a serving run's --out folder)")
    if args.profile_steps and not args.torch_profile:
        raise SystemExit("--profile-steps needs --torch-profile DIR")
    if args.torch_profile and not args.profile_steps:
        args.profile_steps = (min(10, args.steps // 3), args.steps)
    out = args.out or tempfile.mkdtemp(prefix="profkit-engine-")
    Path(out).mkdir(parents=True, exist_ok=True)
    return EngineConfig(
        ranks=args.ranks, steps=args.steps, device=args.device, seed=args.seed,
        out_dir=str(Path(out).resolve()),
        faults=list(args.inject), size=size,
        torch_profile_dir=str(Path(args.torch_profile).resolve()) if args.torch_profile else None,
        profile_steps=args.profile_steps, cuda_profiler_steps=args.cuda_profiler_steps,
        split_procs=args.split_procs, pg_timeout_s=args.pg_timeout, master_port=free_port(),
        replay=args.replay, replay_seed=args.replay_seed, token_ns=int(round(args.token_us * 1e3)),
        lag_ms=args.lag_ms, bench_forward=str(Path(args.bench_forward).resolve()) if args.bench_forward else None,
        command=shlex.join([sys.executable, "-m", "profkit.engine", *argv]))


def launch(cfg: EngineConfig, timeout_s: float) -> tuple[int, str]:
    """Spawn the ranks and wait; returns (exit status, message). A failing rank stops the others."""
    import torch.multiprocessing as mp  # torch only from here on

    from .bench import bench_main
    from .core import MULTI_GPU_ENV, rank_main

    os.environ.update(MULTI_GPU_ENV)  # inherited by spawned ranks (and set again inside them)
    entry = bench_main if cfg.bench_forward else rank_main  # serving, or the exact batches of a serving run
    ctx = mp.spawn(entry, args=(cfg,), nprocs=cfg.ranks, join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                alive = [i for i, p in enumerate(ctx.processes) if p.is_alive()]
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                return 3, f"timed out after {timeout_s:.0f} s; ranks still running: {alive}"
    except mp.ProcessRaisedException as exc:
        return 1, f"rank {exc.error_index} failed:\n{exc}"
    except mp.ProcessExitedException as exc:
        return 1, f"rank {exc.error_index} exited with {exc.exit_code} (signal {exc.signal_name})"
    finally:
        _remove_error_files(ctx)
    return 0, "ok"


def _remove_error_files(ctx) -> None:
    """The traceback files torch's spawn gives each rank (``pytorch-errorfile-*.pickle`` in the temp
    folder, written by a rank that raised): its message is read by then, and torch leaves them."""
    for path in getattr(ctx, "error_files", None) or []:
        if path:
            Path(path).unlink(missing_ok=True)


def device_name(cfg: EngineConfig) -> str:
    """From the ranks' info files: the launcher itself never creates a CUDA context."""
    if cfg.device != "cuda":
        return "cpu"
    for role in ("worker", "engine"):
        info = Path(cfg.out_dir) / f"rank0.{role}.json"
        if info.exists() and "device_name" in (data := json.loads(info.read_text())):
            return f"cuda: {cfg.ranks} x {data['device_name']}"
    return f"cuda: {cfg.ranks} GPUs"


def summarize(cfg: EngineConfig, timings: dict[int, list[dict]]) -> str:
    lines = [f"{'rank':>4} {'steps':>5} {'median ms':>9} {'max ms':>8}  faults fired at steps"]
    for rank in range(cfg.ranks):
        recs = timings.get(rank, [])
        ms = [r["step_ns"] / 1e6 for r in recs]
        fired = sorted({(ev["kind"], r["step"]) for r in recs for ev in r.get("faults", [])})
        kinds: dict[str, list[int]] = {}
        for kind, step in fired:
            kinds.setdefault(kind, []).append(step)
        med = f"{statistics.median(ms):9.2f}" if ms else f"{'-':>9}"
        mx = f"{max(ms):8.2f}" if ms else f"{'-':>8}"
        fired_text = "; ".join(f"{k} {v}" for k, v in kinds.items())
        lines.append(f"{rank:>4} {len(recs):>5} {med} {mx}  {fired_text}")
    return "\n".join(lines)


def replay_line(replay: dict) -> str:
    """One line on what a mirror/lag replay served and at what step time per token."""
    bal = [b for b in replay["balancedness"] if b is not None]
    per_tok = replay["step_ns_per_token"]
    return (f"replay {replay['mode']} (seed {replay['seed']}): {replay['requests']} requests, "
            f"{replay['tokens_served']} tokens served; DP balancedness mean {sum(bal) / max(len(bal), 1):.3f}, "
            f"min {min(bal, default=float('nan')):.3f}; "
            f"{'-' if per_tok is None else f'{per_tok / 1e3:.2f}'} us of step time per token served")


def bench_summary(cfg: EngineConfig, timings: dict[int, list[dict]]) -> dict:
    """truth's ``bench_forward``: what was replayed and, per replayed step, GPU-only vs serving step time."""
    recs = [r for rank in sorted(timings) for r in timings[rank]]
    gpu_only = [r["step_ns"] for r in recs]
    serving = [r.get("serving_step_ns", 0) for r in recs]
    return {"serving_out": cfg.bench_forward, "steps": len(recs) // max(len(timings), 1),
            "gpu_only_step_ns_mean": statistics.fmean(gpu_only) if gpu_only else None,
            "serving_step_ns_mean": statistics.fmean(serving) if serving else None,
            "gap_ns_mean": statistics.fmean(s - g for s, g in zip(serving, gpu_only)) if recs else None}


def _maybe_list(window: tuple[int, int] | None) -> list[int] | None:
    return list(window) if window else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.ranks < 1 or args.steps < 1:
        raise SystemExit("--ranks and --steps must be >= 1")
    cfg = make_config(args, argv)
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < cfg.ranks:
            raise SystemExit(f"--device cuda needs {cfg.ranks} GPUs (one per rank); "
                             f"found {torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    t0 = time.monotonic()
    status, message = launch(cfg, args.timeout)
    wall_s = time.monotonic() - t0
    timings = {r: read_timings(p) for r in range(cfg.ranks)
               if (p := Path(cfg.out_dir) / f"rank{r}.steps.jsonl").exists()}
    print(summarize(cfg, timings))
    replay = (replay_truth(cfg.replay, cfg.ranks, cfg.size, cfg.steps, cfg.replay_seed, timings, cfg.lag_ms)
              if cfg.replay else None)
    if replay is not None:
        print(replay_line(replay))
    if args.truth:
        truth = build_truth(cfg.faults, timings, command=cfg.command, ranks=cfg.ranks, steps=cfg.steps,
                            device=device_name(cfg), seed=cfg.seed, split_procs=cfg.split_procs,
                            profile_steps=_maybe_list(cfg.profile_steps),
                            cuda_profiler_steps=_maybe_list(cfg.cuda_profiler_steps),
                            out_dir=cfg.out_dir, exit_status=status,
                            size=vars(cfg.size) | {"num_experts": cfg.num_experts}, token_ns=cfg.token_ns,
                            **({"replay": replay} if replay is not None else {}),
                            **({"bench_forward": bench_summary(cfg, timings)} if cfg.bench_forward else {}))
        write_truth(args.truth, truth)
        print(f"truth: {args.truth}")
    print(f"step timings: {cfg.out_dir} (rank{{r}}.steps.jsonl); {wall_s:.1f} s")
    if status:
        print(f"profkit.engine: {message}", file=sys.stderr)
    return status
