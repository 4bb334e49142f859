"""EP balancedness under uniform routing: the baseline real routing is judged against.

Why: balancedness (mean / max rank load of a MoE layer) is below 1.0 even when a router picks
experts uniformly at random, because a finite batch is a sample: with 432 tokens per rank at
DEP32 (72 requests x 6 tokens) and top-6 of 384 experts a rank receives ~2,592 token-expert
pairs with a standard deviation of ~50, and the most loaded of 32 ranks sits about two standard
deviations above the mean, hence ~0.96. Real minus uniform is the most that expert balancing
(EPLB) can recover; ``recovered_share`` says how much of that gap a second run closed.

The model (exact, by Monte Carlo): every token picks ``topk`` DISTINCT experts uniformly from
``experts``; experts sit on EP ranks in contiguous blocks as vLLM's default ``linear`` placement
(``determine_expert_map``) puts them: ``experts // ranks`` each, the first ``experts % ranks``
ranks one more; a rank's load is the number of (token, expert) pairs it hosts; balancedness =
mean / max over ranks. Draws are seeded and vectorized (numpy), so a baseline is reproducible.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_DRAWS = 400
DEFAULT_SEED = 0
_CHUNK_PAIRS = 4_000_000  # token-expert pairs drawn at once (bounded memory)
#: at most this many distinct token counts get their own Monte Carlo; more are interpolated
MAX_EXACT_SIZES = 24


@dataclass(frozen=True)
class UniformBaseline:
    """Balancedness of uniformly routed batches: the mean over draws and its spread."""

    ranks: int
    experts: int
    topk: int
    tokens: int  # tokens in the batch over all ranks (each routed to topk experts)
    draws: int
    seed: int
    mean: float
    std: float
    lo: float  # 2.5th percentile over draws
    hi: float  # 97.5th percentile
    load_mean: float  # token-expert pairs per rank (the same in every draw)

    def to_dict(self) -> dict:
        return asdict(self)


def rank_of_expert(experts: int, ranks: int) -> np.ndarray:
    """EP rank hosting each expert under vLLM's linear placement (contiguous blocks, the first
    ``experts % ranks`` ranks one expert more)."""
    if ranks < 1 or experts < ranks:
        raise ValueError(f"need experts >= ranks >= 1, got {experts} experts on {ranks} ranks")
    base, rem = divmod(experts, ranks)
    sizes = np.full(ranks, base, dtype=np.int64)
    sizes[:rem] += 1
    return np.repeat(np.arange(ranks, dtype=np.int64), sizes)


def distinct_uniform(rng: np.random.Generator, n: int, experts: int, topk: int) -> np.ndarray:
    """``(n, topk)`` experts, distinct within a row, every k-subset equally likely: pick j draws
    uniformly among the experts the row has not taken yet (sequential sampling without
    replacement, vectorized over rows: O(n k^2))."""
    picks = np.empty((n, topk), dtype=np.int64)
    for j in range(topk):
        r = rng.integers(0, experts - j, size=n)
        taken = np.sort(picks[:, :j], axis=1)
        for i in range(j):  # r-th free expert: step over the taken ones below it, in order
            r += taken[:, i] <= r
        picks[:, j] = r
    return picks


def uniform_samples(ranks: int, experts: int, topk: int, tokens: int, draws: int = DEFAULT_DRAWS,
                    seed: int = DEFAULT_SEED) -> np.ndarray:
    """Balancedness of ``draws`` uniformly routed batches of ``tokens`` tokens (one value each)."""
    if topk < 1 or topk > experts:
        raise ValueError(f"topk must be in 1..experts ({experts}), got {topk}")
    if tokens < 1 or draws < 1:
        raise ValueError(f"tokens and draws must be >= 1, got {tokens} and {draws}")
    owner = rank_of_expert(experts, ranks)
    rng = np.random.default_rng([seed, ranks, experts, topk, tokens])
    out = np.empty(draws)
    per = max(1, _CHUNK_PAIRS // (tokens * topk))
    mean = tokens * topk / ranks
    for d0 in range(0, draws, per):
        nd = min(per, draws - d0)
        picks = distinct_uniform(rng, nd * tokens, experts, topk)
        draw = np.repeat(np.arange(nd, dtype=np.int64), tokens * topk)
        loads = np.bincount(draw * ranks + owner[picks.ravel()], minlength=nd * ranks).reshape(nd, ranks)
        out[d0:d0 + nd] = mean / loads.max(axis=1)
    return out


def uniform_baseline(ranks: int, experts: int, topk: int, tokens: int, draws: int = DEFAULT_DRAWS,
                     seed: int = DEFAULT_SEED) -> UniformBaseline:
    """The uniform-routing baseline for one batch size: mean, std and 95% band over draws."""
    x = uniform_samples(ranks, experts, topk, tokens, draws, seed)
    lo, hi = np.quantile(x, [0.025, 0.975])
    return UniformBaseline(ranks, experts, topk, tokens, draws, seed, float(x.mean()),
                           float(x.std(ddof=1)) if draws > 1 else 0.0, float(lo), float(hi),
                           tokens * topk / ranks)


def baselines_for_sizes(ranks: int, experts: int, topk: int, tokens: np.ndarray, draws: int = 200,
                        seed: int = DEFAULT_SEED) -> dict[str, np.ndarray]:
    """Baseline (mean, std, lo, hi) for each entry of ``tokens`` (batch sizes of many steps).

    Up to ``MAX_EXACT_SIZES`` distinct sizes each get their own Monte Carlo; beyond that a
    geometric grid of sizes does and the rest are interpolated linearly in 1/sqrt(tokens), the
    variable the sampling noise scales with (the grid's neighbours differ by under 20%, where
    the curve is close to straight: a few thousandths of balancedness at most)."""
    tok = np.asarray(tokens, dtype=np.int64)
    keys = ("mean", "std", "lo", "hi")
    out = {k: np.full(tok.shape, np.nan) for k in keys}
    ok = tok > 0
    if not ok.any():
        return out
    sizes = np.unique(tok[ok])
    if len(sizes) > MAX_EXACT_SIZES:
        grid = np.unique(np.rint(np.geomspace(sizes[0], sizes[-1], MAX_EXACT_SIZES)).astype(np.int64))
    else:
        grid = sizes
    table = {k: np.empty(len(grid)) for k in keys}
    for i, t in enumerate(grid.tolist()):
        b = uniform_baseline(ranks, experts, topk, int(t), draws, seed)
        for k in keys:
            table[k][i] = getattr(b, k)
    x = 1.0 / np.sqrt(grid.astype(np.float64))
    order = np.argsort(x)
    for k in keys:
        out[k][ok] = np.interp(1.0 / np.sqrt(tok[ok].astype(np.float64)), x[order], table[k][order])
    return out


def recovered_share(real_before: float, real_after: float, uniform: float) -> float:
    """Share of the recoverable gap (uniform - real_before) that a second run closed:
    ``(real_after - real_before) / (uniform - real_before)``; NaN when there was no gap."""
    gap = uniform - real_before
    if not (math.isfinite(gap) and math.isfinite(real_after)) or gap <= 0:
        return math.nan
    return (real_after - real_before) / gap
