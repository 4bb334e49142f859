"""Replays of one seeded request set (``--replay mirror|lag|round-robin``): tokens per rank and step.

Why: DP ranks meet at every step's DP all-reduce (and every MoE layer), so a step costs what its
most loaded rank costs. Replaying the SAME requests on every rank prices that, as vLLM's
DeepSeek-V4.1-Flash study does: *mirror* gives every DP rank an identical copy of the request
stream at the same time (identical batches, perfect balance); *lag* gives rank r the same copy
``r x lag`` later in time (``--lag-ms``; the study used 5 s), so the ranks are out of phase with
the same total work: one rank prefills a burst while the others decode. Lag minus mirror
(throughput, step time per token served) is the cost of DP imbalance. *round-robin* is a
different thing kept under its own name: the same copies dealt out by a round-robin DP balancer
in arrival order, each copy arriving up to ``LAG_STEPS`` steps before or after its base request.
The same definitions as the bundled engine's ``--replay`` (``profkit.engine.replay``).

The request set depends only on ``replay_seed`` (never on ``seed``: replays with different timing
noise serve the same requests) and the workload. ``decode`` (the default): base requests arrive
Poisson(``RATE``) per step from ``-WARMUP`` steps on (so decodes are in steady state at step 0),
prompts lognormal, outputs uniform. ``prefill`` (prefill-heavy): bursts of ``BURST_SIZE`` long
prompts every ``BURST_EVERY`` steps with short outputs. A copy admitted at step ``a`` with prompt
``p`` and ``o`` output tokens runs ``p`` prefill tokens at ``a`` and one decode token at each of
``a+1 .. a+o-1`` (no token budget: the batch is whatever is running). Pure numpy, deterministic.

Time in the lag replay: a base request's arrival step ``a`` is the moment step ``a`` starts in
this run (every rank shares it: the ranks run in lockstep; before step 0, ``NOMINAL_STEP_NS``
per step is assumed); rank r's copy arrives ``r x lag`` after that and is admitted at the first
step that starts at or after it. Step start times depend on the tokens (a prefill burst makes a
long step), so admission is decided step by step as the timeline runs (``LagReplay.admit``).
With a lag of 0 the lag replay is the mirror, token for token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REPLAY_MODES = ("mirror", "lag", "round-robin")
WORKLOADS = ("decode", "prefill")
BALANCER = "round_robin"
RATE = 2.0  # base requests per step (each served N times)
PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_RANGE = 128.0, 0.8, (8, 2048)
OUTPUT_RANGE = (8, 56)  # uniform, inclusive: ~64 decodes per rank in steady state
WARMUP = OUTPUT_RANGE[1]
LAG_STEPS = 2  # round-robin: a copy arrives -LAG_STEPS..+LAG_STEPS steps from its base request
# prefill workload: bursts of long prompts, short outputs (most tokens are prefill)
BURST_EVERY, BURST_SIZE = 6, 3
PREFILL_PROMPT_MEDIAN, PREFILL_PROMPT_SIGMA, PREFILL_PROMPT_RANGE = 1024.0, 0.4, (256, 4096)
PREFILL_OUTPUT_RANGE = (2, 8)
#: lag replay: assumed step time before step 0 (only places the copies that arrived before the window)
NOMINAL_STEP_NS = 17_000_000
DEFAULT_LAG_MS = 25.0  # the simulator's default --lag-ms: ~1.5 steps, so a 30-step run shows the effect


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


def base_requests(steps: int, seed: int, workload: str = "decode", history_steps: int = 0) -> np.ndarray:
    """``(M, 3)`` int64: arrival step, prompt tokens, output tokens of the base stream, arrival order.

    ``history_steps`` adds requests arriving before ``-WARMUP`` (a lag replay needs them: rank r's
    copies of them arrive inside the window); they come from a stream of their own, so the
    requests from ``-WARMUP`` on are the same whatever the history."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r}: one of {', '.join(WORKLOADS)}")
    core = _stream(np.random.default_rng([seed, 0x5EED]), -WARMUP, steps, workload)
    if history_steps <= 0:
        return core
    old = _stream(np.random.default_rng([seed, 0x5EED, 1]), -WARMUP - history_steps, -WARMUP, workload)
    return np.concatenate([old, core])


def _stream(rng: np.random.Generator, first: int, stop: int, workload: str) -> np.ndarray:
    arrivals = np.arange(first, stop)
    if workload == "decode":
        per_step = rng.poisson(RATE, arrivals.size)
        arrival = np.repeat(arrivals, per_step)
        m = arrival.size
        prompt = np.clip(np.rint(PROMPT_MEDIAN * np.exp(PROMPT_SIGMA * rng.standard_normal(m))), *PROMPT_RANGE)
        output = rng.integers(OUTPUT_RANGE[0], OUTPUT_RANGE[1] + 1, m)
    else:
        arrival = np.repeat(arrivals[arrivals % BURST_EVERY == 0], BURST_SIZE)
        m = arrival.size
        prompt = np.clip(np.rint(PREFILL_PROMPT_MEDIAN * np.exp(PREFILL_PROMPT_SIGMA * rng.standard_normal(m))),
                         *PREFILL_PROMPT_RANGE)
        output = rng.integers(PREFILL_OUTPUT_RANGE[0], PREFILL_OUTPUT_RANGE[1] + 1, m)
    return np.stack([arrival, prompt, output], axis=1).astype(np.int64)


def history_for(ranks: int, lag_ns: int) -> int:
    """Steps of history before ``-WARMUP`` a lag replay needs: the last rank's copies of requests
    that far back still arrive in the window."""
    return int(np.ceil((ranks - 1) * lag_ns / NOMINAL_STEP_NS)) if lag_ns > 0 else 0


def assign(mode: str, ranks: int, base: np.ndarray, seed: int) -> np.ndarray:
    """``(M * N, 6)`` int64 copies: base, copy, rank, arrival_step, prompt_tokens, output_tokens."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"replay mode {mode!r}: one of {', '.join(REPLAY_MODES)}")
    m = base.shape[0]
    idx = np.repeat(np.arange(m), ranks)
    copy = np.tile(np.arange(ranks), m)
    arrival = base[idx, 0].copy()
    if mode in ("mirror", "lag"):  # lag: copy r to rank r too; its time shift is LagReplay's
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


def build(mode: str, ranks: int, steps: int, seed: int, workload: str = "decode") -> ReplayTokens:
    """Token matrices of a mirror or round-robin replay (fixed in advance; see ``LagReplay`` for lag)."""
    if mode == "lag":
        raise ValueError("the lag replay's tokens depend on step times: use LagReplay")
    base = base_requests(steps, seed, workload)
    copies = assign(mode, ranks, base, seed)
    n_prefill, prefill, decode = token_matrices(copies, ranks, steps)
    mirror = assign("mirror", 1, base, seed)
    _, m_prefill, m_decode = token_matrices(mirror, 1, steps)
    return ReplayTokens(mode, n_prefill, prefill, decode, (m_prefill + m_decode)[0], copies)


class LagReplay:
    """The study's lag replay: rank r admits its copy of each base request ``r x lag_ns`` after
    the request's arrival, by the run's own step clock (see the module docstring).

    ``admit(s, t_ns)`` is called once per step, in order, with the step's start time; it returns
    that step's (n_prefill, prefill_tokens, n_decode) per rank. ``admitted[i, r]`` is the step at
    which rank r admitted base request i (before the window: the assumed step, negative)."""

    def __init__(self, ranks: int, steps: int, seed: int, lag_ns: int, workload: str = "decode"):
        self.mode, self.ranks, self.steps, self.lag_ns = "lag", ranks, steps, int(lag_ns)
        self.base = base_requests(steps, seed, workload, history_for(ranks, self.lag_ns))
        self.copies = assign("lag", ranks, self.base, seed)
        a, prompt, out = self.base[:, 0], self.base[:, 1], self.base[:, 2]
        self.arrival, self.output = a, out
        self.cum_prompt = np.concatenate([[0], np.cumsum(prompt)])
        mirror = assign("mirror", 1, base_requests(steps, seed, workload), seed)
        _, m_prefill, m_decode = token_matrices(mirror, 1, steps)
        self.mirror_tokens = (m_prefill + m_decode)[0]
        self.shift = self.lag_ns * np.arange(ranks, dtype=np.int64)  # (N,)
        self.diff = np.zeros((ranks, steps + int(out.max(initial=1)) + 2), np.int64)
        self.active = np.zeros(ranks, np.int64)
        self.admitted = np.full((len(a), ranks), np.iinfo(np.int64).min, np.int64)
        self.step_start_ns = np.zeros(steps, np.int64)
        # before the window: copies whose assumed admission step is < 0 ran their prefill there
        rel = a[:, None] * NOMINAL_STEP_NS + self.shift[None, :]  # arrival - T(0), ns
        virt = -((-rel) // NOMINAL_STEP_NS)  # ceil: the first assumed step starting at or after it
        early = virt <= -1
        self.ptr = early.sum(axis=0).astype(np.int64)  # a prefix per rank (arrival order)
        self.admitted[early] = virt[early]
        lo = np.clip(virt + 1, 0, None)
        hi = virt + out[:, None]
        keep = early & (hi > lo)
        r_idx = np.broadcast_to(np.arange(ranks), virt.shape)
        np.add.at(self.diff, (r_idx[keep], lo[keep]), 1)
        np.add.at(self.diff, (r_idx[keep], hi[keep]), -1)
        self.n_prefill = np.zeros((ranks, steps), np.int64)
        self.prefill_tokens = np.zeros((ranks, steps), np.int64)
        self.n_decode = np.zeros((ranks, steps), np.int64)

    def admit(self, s: int, t_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.step_start_ns[s] = t_ns
        a = self.arrival
        known = int(np.searchsorted(a, s, side="right"))  # requests whose arrival step has started
        t0 = self.step_start_ns[0]
        past = a[:known]
        times = np.where(past < 0, t0 + past * NOMINAL_STEP_NS, self.step_start_ns[np.clip(past, 0, None)])
        cnt = np.searchsorted(times, t_ns - self.shift, side="right").astype(np.int64)
        cnt = np.maximum(cnt, self.ptr)
        new = cnt - self.ptr
        self.n_prefill[:, s] = new
        self.prefill_tokens[:, s] = self.cum_prompt[cnt] - self.cum_prompt[self.ptr]
        for r in np.nonzero(new)[0].tolist():
            i0, i1 = int(self.ptr[r]), int(cnt[r])
            self.admitted[i0:i1, r] = s
            outs = self.output[i0:i1]
            self.diff[r, s + 1] += i1 - i0
            np.add.at(self.diff[r], s + outs, -1)
        self.ptr = cnt
        self.active += self.diff[:, s]
        self.n_decode[:, s] = self.active
        return self.n_prefill[:, s], self.prefill_tokens[:, s], self.n_decode[:, s]

    @property
    def tokens(self) -> np.ndarray:
        return self.prefill_tokens + self.n_decode

    def requests_table(self) -> np.ndarray:
        """``(copies, 7)``: base, copy, rank, arrival_step (base), admitted_step, prompt_tokens, output_tokens."""
        m, n = self.admitted.shape
        i = np.repeat(np.arange(m), n)
        r = np.tile(np.arange(n), m)
        return np.stack([i, r, r, self.base[i, 0], self.admitted.ravel(), self.base[i, 1], self.base[i, 2]],
                        axis=1).astype(np.int64)
