"""Replays of one seeded request set (``--replay mirror|lag|round-robin``): the DP-imbalance pair.

Why: every DP rank meets the others at each step's DP all-reduce and at every MoE layer, so a step
costs what the most loaded rank costs. Serving engineers price that by replaying the SAME requests
on every rank, as vLLM's DeepSeek-V4.1-Flash study does: *mirror*, where every DP rank receives an
identical copy of the request stream at the same time (perfect balance by construction), and
*lag*, where rank r receives the same copy ``r x --lag-ms`` later (the study used 5 s): the ranks
are out of phase with the same total work, one prefilling while the others decode. Lag minus
mirror (throughput) is the cost. *round-robin* is a different replay kept under its own name: the
same copies dealt out by a round-robin DP balancer in arrival order, each copy arriving up to
``LAG_STEPS`` steps before or after its base request.

The request set: a base stream of requests (arrival step, prompt tokens, output length) drawn from
``random.Random`` seeded by ``--replay-seed`` only (never ``--seed``), so replays with different
engine seeds serve the same requests. ``N`` copies of it are served (N = DP ranks): copy ``c`` of
base request ``i`` is ``q{i}.{c}``. Mirror and lag give copy ``r`` to rank ``r`` at the base arrival
step; under lag the rank's scheduler holds it back until ``r x lag`` after the moment the rank
started that step (its own monotonic clock: the ranks run in lockstep), so a lag of 0 is the mirror.
Round-robin lets every copy arrive up to ``LAG_STEPS`` steps before or after its base request
(seeded, never before step 0), orders all copies by arrival step (same step: seeded random order)
and deals them out round-robin over the ranks (one global pointer). Pure Python, no torch: the CLI
and the tests use it too.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

from .config import ModelSize

REPLAY_MODES = ("mirror", "lag", "round-robin")
DEFAULT_LAG_MS = 200.0  # the engine's default --lag-ms: about one CPU step with --token-us
BALANCER = "round_robin"
#: base-stream arrivals per step (bursty, mean 4/3); an initial burst of ``max_seqs // 4`` at step 0
ARRIVALS_PER_STEP = (0, 0, 1, 1, 2, 4)
OUTPUT_RANGE = (2, 16)
#: round-robin: a copy arrives -LAG_STEPS..+LAG_STEPS steps from its base request
LAG_STEPS = 2


@dataclass(frozen=True)
class ReplayRequest:
    """One copy of one base request, as handed to a rank's scheduler."""

    req_id: str
    base: int  # index in the base stream
    copy: int  # 0 .. N-1
    arrival_step: int  # when it reaches the balancer (mirror: the base request's step)
    prompt: tuple[int, ...]
    max_output: int


def prompt_range(size: ModelSize) -> tuple[int, int]:
    """Prompts short enough that a rank's load stays under its token budget on average: the budget
    does not flatten the bursts, so where sizes land is what differs between ranks."""
    b = size.token_budget
    return max(2, b // 16), max(4, b // 2)


def base_stream(size: ModelSize, steps: int, seed: int) -> list[tuple[int, tuple[int, ...], int]]:
    """``(arrival_step, prompt token ids, max_output)`` per base request, arrival order."""
    rng = random.Random(seed * 1_000_003 + 0x5EED)
    lo, hi = prompt_range(size)
    out: list[tuple[int, tuple[int, ...], int]] = []

    def arrive(step: int) -> None:
        n = rng.randint(lo, hi)
        out.append((step, tuple(rng.randrange(size.vocab) for _ in range(n)), rng.randint(*OUTPUT_RANGE)))

    for _ in range(max(1, size.max_seqs // 4)):
        arrive(0)
    for step in range(steps):
        for _ in range(rng.choice(ARRIVALS_PER_STEP)):
            arrive(step)
    return out


def assign(mode: str, ranks: int, stream: list[tuple[int, tuple[int, ...], int]],
           seed: int) -> list[list[ReplayRequest]]:
    """Per rank, the copies it serves (arrival order). See the module docstring for the two modes."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"replay mode {mode!r}: one of {', '.join(REPLAY_MODES)}")
    copies = [ReplayRequest(f"q{i}.{c}", i, c, arr, prompt, out)
              for i, (arr, prompt, out) in enumerate(stream) for c in range(ranks)]
    per_rank: list[list[ReplayRequest]] = [[] for _ in range(ranks)]
    if mode in ("mirror", "lag"):  # lag: the same copies, held back by the scheduler (lag_ns)
        for req in copies:
            per_rank[req.copy].append(req)
        return per_rank
    rng = random.Random(seed * 1_000_003 + 0xBA1)
    copies = [replace(r, arrival_step=max(0, r.arrival_step + rng.randint(-LAG_STEPS, LAG_STEPS))) for r in copies]
    order = [rng.random() for _ in copies]
    copies = [copies[i] for i in sorted(range(len(copies)), key=lambda i: (copies[i].arrival_step, order[i]))]
    for pos, req in enumerate(copies):  # one global round-robin pointer
        per_rank[pos % ranks].append(req)
    return per_rank


def requests_for(mode: str, ranks: int, rank: int, size: ModelSize, steps: int, seed: int) -> list[ReplayRequest]:
    """What one rank serves; every rank computes the same assignment, so nothing is sent around."""
    return assign(mode, ranks, base_stream(size, steps, seed), seed)[rank]


def replay_truth(mode: str, ranks: int, size: ModelSize, steps: int, seed: int,
                 timings: dict[int, list[dict]], lag_ms: float = 0.0) -> dict:
    """The ``replay`` section of the truth file: what was replayed (every copy and its rank) and,
    from the ranks' own step records, tokens per rank and step, DP balancedness and step time per
    token served, so a mirror/lag pair can be priced without any trace."""
    per_rank = assign(mode, ranks, base_stream(size, steps, seed), seed)
    rows = sorted(([r.req_id, r.base, r.copy, rank, r.arrival_step, len(r.prompt), r.max_output]
                   for rank, reqs in enumerate(per_rank) for r in reqs), key=lambda row: (row[1], row[2]))
    by_step: dict[int, dict[int, dict]] = {}
    for rank, recs in timings.items():
        for rec in recs:
            by_step.setdefault(int(rec["step"]), {})[rank] = rec
    tokens, balancedness, step_ns_mean = [], [], []
    for step in sorted(by_step):
        recs = by_step[step]
        tok = [int(recs[r]["num_tokens"]) if r in recs else None for r in range(ranks)]
        tokens.append(tok)
        known = [t for t in tok if t is not None]
        balancedness.append(sum(known) / len(known) / max(known) if known and max(known) > 0 else None)
        step_ns_mean.append(sum(int(x["step_ns"]) for x in recs.values()) / len(recs))
    served = sum(t for row in tokens for t in row if t is not None)
    arrived = {rank: [int(rec.get("replay_arrived", 0)) for rec in recs] for rank, recs in timings.items()}
    return {
        "mode": mode, "seed": seed,
        "balancer": BALANCER if mode == "round-robin" else "copy r -> rank r"
        + (f", {lag_ms:g} ms x r later" if mode == "lag" else ""),
        "lag_steps": LAG_STEPS if mode == "round-robin" else 0,
        "lag_ms": lag_ms if mode == "lag" else 0.0,
        "arrived_per_step": {str(r): v for r, v in sorted(arrived.items())},
        "throughput_tokens_per_s": (served / sum(step_ns_mean) * 1e9) if served and sum(step_ns_mean) else None,
        "base_requests": len(rows) // max(ranks, 1), "requests": len(rows),
        "prompt_range": list(prompt_range(size)), "output_range": list(OUTPUT_RANGE),
        "per_rank": [{"rank": r, "requests": len(reqs), "prompt_tokens": sum(len(x.prompt) for x in reqs),
                      "max_output_tokens": sum(x.max_output for x in reqs)} for r, reqs in enumerate(per_rank)],
        "request_table": {"columns": ["req_id", "base", "copy", "rank", "arrival_step", "prompt_tokens",
                                      "max_output"], "rows": rows},
        "tokens": tokens, "balancedness": balancedness, "step_ns_mean": step_ns_mean,
        "tokens_served": served,
        "step_ns_per_token": (sum(step_ns_mean) / served) if served else None,
    }
