"""``profkit simulate --ranks N --steps S --seed K [--format kineto|nsys] [--inject ...]... -o DIR``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profkit.simulate.config import DEFAULT_MS, INJECT_KINDS, SimConfigError, parse_inject


def build_parser(prog: str = "profkit simulate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Write the traces a DEP-N vLLM deployment would produce, with injected causes and "
        "clock skew, plus truth.json (ground truth for accuracy tests).",
    )
    p.add_argument("--ranks", type=int, required=True, help="DP/EP ranks (one GPU each)")
    p.add_argument("--steps", type=int, required=True, help="engine steps per rank")
    p.add_argument("--seed", type=int, required=True, help="random seed (same seed, same files)")
    p.add_argument("--format", choices=("kineto", "nsys"), default="kineto", help="trace format (default kineto)")
    kinds = ", ".join(f"{k} (default ms={v:g})" for k, v in DEFAULT_MS.items())
    p.add_argument(
        "--inject", action="append", default=[], metavar="KIND:rank=R[,every=K][,ms=M]",
        help=f"inject a cause; repeatable. KIND is one of: {kinds}. Also start=S (first step, default 1), "
        "factor=F (slow_rank, hot_experts), layer=L (host_sync).",
    )
    p.add_argument("-o", "--out", type=Path, required=True, help="output directory")
    p.add_argument("--layers", type=int, default=8, help="MoE layers per step (default 8)")
    p.add_argument("--ranks-per-host", type=int, default=8, choices=(1, 2, 4, 8), help="GPUs per host (default 8)")
    p.add_argument("--offset-ms", type=float, default=5.0, help="max |clock offset| per host in ms (default 5)")
    p.add_argument("--drift-ppm", type=float, default=30.0, help="max |clock drift| per host in ppm (default 30)")
    p.add_argument("--replay", choices=("mirror", "lag", "round-robin"),
                   help="replay one seeded request set (prefill + decode tokens per rank and step) instead of "
                        "Poisson decode batches: mirror = every rank an identical copy at the same time (balanced), "
                        "lag = rank r gets the same copy r x --lag-ms later (out of phase, same work; truth.json's "
                        "replay.throughput_change is the known cost against the mirror), round-robin = the same "
                        "copies through a round-robin DP balancer with jitter (replay.cost_ns: the known cost)")
    p.add_argument("--lag-ms", type=float, default=25.0, metavar="MS",
                   help="--replay lag: rank r receives the requests r x MS later (default 25: ~1.5 simulated "
                        "steps; the vLLM study used 5000)")
    p.add_argument("--workload", choices=("decode", "prefill"), default="decode",
                   help="replayed request set: decode (Poisson arrivals, default) or prefill (bursts of long prompts)")
    p.add_argument("--bench-forward", action="store_true",
                   help="a GPU-only run of the same batches (vLLM's bench forward): the forward back to back, no "
                        "scheduler, DP all-reduce or sampling; truth.json's bench_forward holds the serving run's gap")
    p.add_argument("--gpu-scale", type=float, default=1.0, metavar="F", help="multiply every kernel's duration (default 1)")
    p.add_argument("--host-jitter-ms", type=float, default=0.0, metavar="MS",
                   help="mean extra host time per rank and step (exponential, in Scheduler.schedule; default 0)")
    p.add_argument("--replay-seed", type=int, default=0, metavar="K",
                   help="seed of the replayed request set (independent of --seed; default 0)")
    p.add_argument("--token-us", type=float, default=8.0, metavar="US",
                   help="replay: host time per token of a rank's own batch, before the DP all-reduce (default 8)")
    p.add_argument("--workers", type=int, default=0, help="writer processes (default: CPU count)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        injects = [parse_inject(text) for text in args.inject]
        from profkit.simulate.run import simulate

        truth = simulate(
            args.ranks, args.steps, args.seed, args.out, fmt=args.format, injects=injects,
            layers=args.layers, ranks_per_host=args.ranks_per_host, offset_ms_max=args.offset_ms,
            drift_ppm_max=args.drift_ppm, workers=args.workers, bench_forward=args.bench_forward,
            gpu_scale=args.gpu_scale, host_jitter_ms=args.host_jitter_ms,
            **({"replay": args.replay, "replay_seed": args.replay_seed, "lag_ms": args.lag_ms, "workload": args.workload,
                "token_ns": int(round(args.token_us * 1e3))} if args.replay else {}),
        )
    except SimConfigError as exc:
        print(f"profkit simulate: error: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        causes = ", ".join(f"{c['kind']}@rank{c['rank']}x{len(c['steps'])}" for c in truth.causes) or "none"
        print(
            f"wrote {args.ranks} {args.format} traces x {args.steps} steps to {args.out} in {truth.wall_s:.2f} s "
            f"(causes: {causes}; truth: {args.out / 'truth.json'})"
        )
        rep = truth.extra.get("replay")
        if rep is not None and rep["mode"] == "lag":
            print(f"replay lag (seed {rep['seed']}, {rep['lag_ms']:g} ms per rank, {rep['workload']}): "
                  f"{rep['tokens_served']} tokens served; throughput {rep['throughput_tokens_per_s']:.0f} tokens/s against "
                  f"{rep['mirror_twin']['throughput_tokens_per_s']:.0f} for the mirror replay: "
                  f"{100 * rep['throughput_change']:+.1f}% (replay.throughput_change in truth.json)")
        elif rep is not None:
            bal = [b for b in rep["balancedness"] if b is not None]
            print(f"replay {rep['mode']} (seed {rep['seed']}): {rep['tokens_served']} tokens served, DP balancedness "
                  f"mean {sum(bal) / max(len(bal), 1):.3f}; known DP-imbalance cost vs the mirror replay "
                  f"{rep['cost_ns_mean'] / 1e6:+.3f} ms per step (replay.cost_ns in truth.json)")
        bench = truth.extra.get("bench_forward")
        if bench is not None:
            print(f"GPU-only run: {bench['gpu_only_step_ns_mean'] / 1e6:.3f} ms per step; the serving run of the same "
                  f"seeds {bench['serving_step_ns_mean'] / 1e6:.3f} ms: a gap of {bench['gap_ns_mean'] / 1e6:.3f} ms "
                  "(bench_forward in truth.json)")
    return 0


assert set(DEFAULT_MS) == set(INJECT_KINDS)
