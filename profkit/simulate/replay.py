"""Mirror and lag replays of one seeded request set (``--replay mirror|lag``): tokens per rank and step.

Why: DP ranks meet at every step's DP all-reduce (and every MoE layer), so a step costs what its
most loaded rank costs. Replaying the SAME requests twice prices that: *mirror* gives every DP rank
an identical copy of the request stream (identical batches, perfect balance), *lag* sends the same
copies through a round-robin DP balancer in arrival order, each copy arriving up to ``LAG_STEPS``
steps before or after its base request (different users, not one synchronized client), so one rank takes a
prefill burst while another only decodes. Lag minus mirror step time is the DP-imbalance cost. The
same definitions as the bundled engine's ``--replay`` (``profkit.engine.replay``).

The request set depends only on ``replay_seed`` (never on ``seed``: replays with different timing
noise serve the same requests). Base requests arrive Poisson(``RATE``) per step from ``-WARMUP``
steps on (so decodes are in steady state at step 0), prompts lognormal, outputs uniform. A copy
arriving at step ``a`` with prompt ``p`` and ``o`` output tokens runs ``p`` prefill tokens at ``a``
and one decode token at each of ``a+1 .. a+o-1`` (no token budget: the batch is whatever is
running, so tokens per step do not depend on the other requests). Pure numpy, deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REPLAY_MODES = ("mirror", "lag")
BALANCER = "round_robin"
RATE = 2.0  # base requests per step (each served N times)
PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_RANGE = 128.0, 0.8, (8, 2048)
OUTPUT_RANGE = (8, 56)  # uniform, inclusive: ~64 decodes per rank in steady state
WARMUP = OUTPUT_RANGE[1]
LAG_STEPS = 2


@dataclass(frozen=True)
class ReplayTokens:
    """Per (rank, step) tokens of one replay, and what was replayed."""

    mode: str
    n_prefill: np.ndarray  # (N, S) int64
    prefill_tokens: np.ndarray  # (N, S) int64
    n_decode: np.ndarray  # (N, S) int64: one token each
    mirror_tokens: np.ndarray  # (S,) int64: what every rank runs in the mirror replay of this set
    requests: np.ndarray  # (copies, 6) int64: base, copy, rank, arrival_step, prompt_tokens, output_tokens

    @property
    def tokens(self) -> np.ndarray:
        """(N, S) int64 tokens per rank and step."""
        return self.prefill_tokens + self.n_decode


def base_requests(steps: int, seed: int) -> np.ndarray:
    """``(M, 3)`` int64: arrival step, prompt tokens, output tokens of the base stream."""
    rng = np.random.default_rng([seed, 0x5EED])
    arrivals = np.arange(-WARMUP, steps)
    per_step = rng.poisson(RATE, arrivals.size)
    arrival = np.repeat(arrivals, per_step)
    m = arrival.size
    prompt = np.clip(np.rint(PROMPT_MEDIAN * np.exp(PROMPT_SIGMA * rng.standard_normal(m))), *PROMPT_RANGE)
    output = rng.integers(OUTPUT_RANGE[0], OUTPUT_RANGE[1] + 1, m)
    return np.stack([arrival, prompt, output], axis=1).astype(np.int64)


def assign(mode: str, ranks: int, base: np.ndarray, seed: int) -> np.ndarray:
    """``(M * N, 6)`` int64 copies: base, copy, rank, arrival_step, prompt_tokens, output_tokens."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"replay mode {mode!r}: one of {', '.join(REPLAY_MODES)}")
    m = base.shape[0]
    idx = np.repeat(np.arange(m), ranks)
    copy = np.tile(np.arange(ranks), m)
    arrival = base[idx, 0].copy()
    if mode == "mirror":
        rank = copy.copy()
    else:
        rng = np.random.default_rng([seed, 0xBA1])
        arrival += rng.integers(-LAG_STEPS, LAG_STEPS + 1, arrival.size)
        order = np.lexsort((rng.random(arrival.size), arrival))  # arrival order, ties at random
        rank = np.empty(arrival.size, np.int64)
        rank[order] = np.arange(arrival.size) % ranks  # one global round-robin pointer
    return np.stack([idx, copy, rank, arrival, base[idx, 1], base[idx, 2]], axis=1).astype(np.int64)


def token_matrices(copies: np.ndarray, ranks: int, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n_prefill, prefill_tokens, n_decode), each (N, S), from the copies' arrivals and lengths."""
    rank, arrival, prompt, output = copies[:, 2], copies[:, 3], copies[:, 4], copies[:, 5]
    width = steps + 1
    n_prefill = np.zeros((ranks, width), np.int64)
    prefill = np.zeros((ranks, width), np.int64)
    inside = (arrival >= 0) & (arrival < steps)
    np.add.at(n_prefill, (rank[inside], arrival[inside]), 1)
    np.add.at(prefill, (rank[inside], arrival[inside]), prompt[inside])
    diff = np.zeros((ranks, width + 1), np.int64)  # decodes over [a+1, a+o) clipped to the window
    lo = np.clip(arrival + 1, 0, width)
    hi = np.clip(arrival + output, 0, width)
    keep = hi > lo
    np.add.at(diff, (rank[keep], lo[keep]), 1)
    np.add.at(diff, (rank[keep], hi[keep]), -1)
    decode = np.cumsum(diff, axis=1)[:, :width]
    return n_prefill[:, :steps], prefill[:, :steps], decode[:, :steps]


def build(mode: str, ranks: int, steps: int, seed: int) -> ReplayTokens:
    base = base_requests(steps, seed)
    copies = assign(mode, ranks, base, seed)
    n_prefill, prefill, decode = token_matrices(copies, ranks, steps)
    mirror = assign("mirror", 1, base, seed)
    _, m_prefill, m_decode = token_matrices(mirror, 1, steps)
    return ReplayTokens(mode, n_prefill, prefill, decode, (m_prefill + m_decode)[0], copies)
