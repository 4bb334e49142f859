"""``profkit balance``: EP balancedness against uniform routing, without a trace.

    profkit balance --uniform --ranks 32 --experts 384 --topk 6 --tokens-per-rank 432 [--json OUT]
    profkit balance --expert-loads FILE --experts 384 --topk 6 [--csv OUT] [--json OUT]

The first prints the uniform-routing baseline of one batch size (mean, std, 95% band over
seeded draws). The second reads expert loads (CSV ``rank,step,layer,tokens``, the simulator's
``expert_loads.json`` or engine ``rank*.steps.jsonl``) and prints real balancedness per layer
against the baseline of the same batches, and the recoverable gap.
"""
from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("balance", help="EP balancedness vs uniform routing (the baseline, or of an expert-loads file)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uniform", action="store_true", help="print the uniform-routing baseline of one batch size")
    p.add_argument("--expert-loads", metavar="FILE", help="expert loads to judge against the baseline")
    p.add_argument("--ranks", type=int, metavar="N", help="EP ranks (--uniform)")
    p.add_argument("--experts", type=int, metavar="E", help="routed experts (logical) per MoE layer")
    p.add_argument("--topk", type=int, metavar="K", help="experts each token is routed to")
    p.add_argument("--tokens-per-rank", type=int, metavar="T",
                   help="tokens per rank in one step (--uniform; e.g. 72 requests x 6 tokens = 432)")
    p.add_argument("--draws", type=int, default=400, metavar="N", help="Monte Carlo draws (default 400)")
    p.add_argument("--seed", type=int, default=0, metavar="K", help="seed of the draws (default 0)")
    p.add_argument("--json", metavar="OUT", help="also write the result as JSON")
    p.add_argument("--csv", metavar="OUT", help="(--expert-loads) write the per-(step, layer) table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.uniform == bool(args.expert_loads):
        print("profkit balance: give --uniform or --expert-loads FILE (one of them)", file=sys.stderr)
        return 2
    try:
        return _uniform(args) if args.uniform else _loads(args)
    except ValueError as exc:
        print(f"profkit balance: {exc}", file=sys.stderr)
        return 2


def _uniform(args: argparse.Namespace) -> int:
    from profkit.analyze.uniform import uniform_baseline

    missing = [f"--{n.replace('_', '-')}" for n in ("ranks", "experts", "topk", "tokens_per_rank")
               if getattr(args, n) is None]
    if missing:
        raise ValueError(f"--uniform needs {', '.join(missing)}")
    b = uniform_baseline(args.ranks, args.experts, args.topk, args.tokens_per_rank * args.ranks, args.draws, args.seed)
    print(f"uniform routing, DEP{b.ranks}: {args.tokens_per_rank} tokens per rank, top-{b.topk} of {b.experts} experts "
          f"(linear placement, {b.experts // b.ranks}{'+' if b.experts % b.ranks else ''} experts per rank)")
    print(f"  balancedness (mean / max rank load): mean {b.mean:.4f}, std {b.std:.4f}, "
          f"95% of draws in [{b.lo:.4f}, {b.hi:.4f}]  ({b.draws} draws, seed {b.seed}; "
          f"{b.load_mean:.0f} token-expert pairs per rank)")
    if args.json:
        _write_json(args.json, {"uniform": b.to_dict(), "tokens_per_rank": args.tokens_per_rank})
    return 0


def _loads(args: argparse.Namespace) -> int:
    from profkit.analyze.balance import ep_balance, ep_balance_by_layer, routing_of
    from profkit.errors import TraceError
    from profkit.ingest.expert_loads import read_expert_loads

    try:
        loads = read_expert_loads(args.expert_loads)
    except TraceError as exc:
        raise ValueError(str(exc)) from None
    routing = routing_of(loads, experts=args.experts, topk=args.topk)
    per = ep_balance(loads, routing=routing, draws=args.draws, seed=args.seed)
    layers = ep_balance_by_layer(loads, per=per)
    print(f"{args.expert_loads}: {per['step'].nunique()} steps x {per['layer'].nunique()} layers, "
          f"{int(per['n_ranks'].max()) if len(per) else 0} EP ranks"
          + (f", top-{routing['topk']} of {routing['experts']} experts" if routing else
             " (give --experts and --topk for the uniform baseline)"))
    cols = ["layer", "n_steps", "balancedness_mean", "balancedness_p10", "balancedness_window"]
    extra = [c for c in ("uniform_balancedness_mean", "recoverable_mean") if c in layers]
    print(layers[cols + extra].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.csv:
        per.to_csv(args.csv, index=False)
    if args.json:
        _write_json(args.json, {"routing": routing, "layers": json.loads(layers.to_json(orient="records"))})
    return 0


def _write_json(path: str, doc: dict) -> None:
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
