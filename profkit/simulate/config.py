"""Simulation parameters and injected causes (``--inject KIND:rank=R[,every=K][,ms=M]``)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

class SimConfigError(ValueError):
    """Bad simulation parameters or --inject text (a user error, reported without a traceback)."""


INJECT_KINDS = ("gc", "slow_rank", "slow_schedule", "host_sync", "launch_bound", "hot_experts")

# Injected milliseconds per affected step when ``ms`` is not given.
DEFAULT_MS = {
    "gc": 30.0,  # one gen-2 pause
    "slow_rank": 2.0,  # extra CPU time per step, spread over all its CPU work
    "slow_schedule": 3.0,
    "host_sync": 2.0,
    "launch_bound": 2.0,  # CPU time spent launching tiny kernels
    "hot_experts": 1.0,  # extra expert-GEMM GPU time per step, spread over layers
}


@dataclass(frozen=True)
class Inject:
    """One injected cause on one rank.

    Affected steps are ``range(start, steps, every)``; ``start`` defaults to 1 so step 0 is
    always clean. ``ms`` is the injected time per affected step (see DEFAULT_MS). For
    ``slow_rank`` and ``hot_experts`` a ``factor`` may be given instead of ``ms`` (CPU work x
    factor, expert load x factor). ``layer`` places ``host_sync`` after that layer's combine
    (default: the middle layer).
    """

    kind: str
    rank: int
    every: int = 1
    ms: float | None = None
    start: int = 1
    factor: float | None = None
    layer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in INJECT_KINDS:
            raise SimConfigError(f"unknown inject kind {self.kind!r}; expected one of {', '.join(INJECT_KINDS)}")
        if self.rank < 0:
            raise SimConfigError(f"inject {self.kind}: rank must be >= 0, got {self.rank}")
        if self.every < 1:
            raise SimConfigError(f"inject {self.kind}: every must be >= 1, got {self.every}")
        if self.ms is not None and self.ms < 0:
            raise SimConfigError(f"inject {self.kind}: ms must be >= 0, got {self.ms}")
        if self.factor is not None:
            if self.kind not in ("slow_rank", "hot_experts"):
                raise SimConfigError(f"inject {self.kind}: factor applies to slow_rank and hot_experts only")
            if self.factor < 1:
                raise SimConfigError(f"inject {self.kind}: factor must be >= 1, got {self.factor}")
            if self.ms is not None:
                raise SimConfigError(f"inject {self.kind}: give ms or factor, not both")

    @property
    def ms_per_step(self) -> float:
        return DEFAULT_MS[self.kind] if self.ms is None else float(self.ms)

    def steps(self, total_steps: int) -> list[int]:
        start = min(self.start, max(total_steps - 1, 0))
        return list(range(start, total_steps, self.every))

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def parse_inject(text: str) -> Inject:
    """Parse ``KIND:rank=R[,every=K][,ms=M][,start=S][,factor=F][,layer=L]``."""
    kind, sep, rest = text.partition(":")
    kind = kind.strip()
    if not sep or not rest.strip():
        raise SimConfigError(f"--inject {text!r}: expected KIND:rank=R[,every=K][,ms=M]")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        if not eq:
            raise SimConfigError(f"--inject {text!r}: {part!r} is not key=value")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"rank", "every", "ms", "start", "factor", "layer"}
    if unknown:
        raise SimConfigError(f"--inject {text!r}: unknown keys {sorted(unknown)}")
    if "rank" not in fields:
        raise SimConfigError(f"--inject {text!r}: rank=R is required")
    try:
        return Inject(
            kind=kind,
            rank=int(fields["rank"]),
            every=int(fields.get("every", 1)),
            ms=float(fields["ms"]) if "ms" in fields else None,
            start=int(fields.get("start", 1)),
            factor=float(fields["factor"]) if "factor" in fields else None,
            layer=int(fields["layer"]) if "layer" in fields else None,
        )
    except ValueError as exc:
        raise SimConfigError(f"--inject {text!r}: {exc}") from None


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a simulated capture (same config + seed = same bytes)."""

    ranks: int
    steps: int
    seed: int
    fmt: str = "kineto"
    injects: tuple[Inject, ...] = ()
    layers: int = 8  # MoE layers per step (each: 19 compute kernels + dispatch + combine)
    ranks_per_host: int = 8
    batch_per_rank: int = 64  # mean decode requests per DP rank per step
    topk: int = 8
    offset_ms_max: float = 5.0  # per-host clock offset ~ U(-max, +max); host 0 is the reference (0)
    drift_ppm_max: float = 30.0  # per-host drift ~ U(-max, +max) ppm; host 0 drifts 0
    cpu_scale: float = 1.0  # multiplies the sampled host gaps between launches
    start_epoch_ns: int = 1_750_000_000_000_000_000  # true time of the capture start
    group_size: int = 8  # ranks computed and written together in the second pass
    workers: int = 0  # processes for writing; 0 = min(cpu count, groups)
    chunk_steps: int = 0  # steps per chunk; 0 = automatic (bounded memory)
    replay: str = ""  # "" (Poisson decode batches), "mirror", "lag" or "round-robin": replay one request set (replay.py)
    replay_seed: int = 0  # the replayed request set's seed (independent of seed)
    token_ns: int = 8_000  # replay: host time per token of the rank's own batch, before the DP all-reduce
    lag_ms: float = 25.0  # lag replay: rank r receives the requests r x lag_ms later
    workload: str = "decode"  # replayed request set: "decode" (Poisson arrivals) or "prefill" (bursts of long prompts)
    bench_forward: bool = False  # a GPU-only run of the same batches (vLLM's bench forward): no serving loop
    gpu_scale: float = 1.0  # multiplies every kernel's and copy's duration (collectives excluded)
    host_jitter_ms: float = 0.0  # mean of an exponential extra host time per rank and step, in Scheduler.schedule
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise SimConfigError(f"ranks must be >= 1, got {self.ranks}")
        if self.steps < 1:
            raise SimConfigError(f"steps must be >= 1, got {self.steps}")
        if self.fmt not in ("kineto", "nsys"):
            raise SimConfigError(f"format must be kineto or nsys, got {self.fmt!r}")
        if self.layers < 1:
            raise SimConfigError(f"layers must be >= 1, got {self.layers}")
        if self.ranks_per_host not in (1, 2, 4, 8):
            raise SimConfigError(f"ranks_per_host must be 1, 2, 4 or 8, got {self.ranks_per_host}")
        if self.replay not in ("", "mirror", "lag", "round-robin"):
            raise SimConfigError(f"replay must be mirror, lag or round-robin, got {self.replay!r}")
        if self.workload not in ("decode", "prefill"):
            raise SimConfigError(f"workload must be decode or prefill, got {self.workload!r}")
        if self.lag_ms < 0:
            raise SimConfigError(f"lag must be >= 0 ms, got {self.lag_ms}")
        if self.gpu_scale <= 0:
            raise SimConfigError(f"gpu_scale must be > 0, got {self.gpu_scale}")
        if self.host_jitter_ms < 0:
            raise SimConfigError(f"host jitter must be >= 0 ms, got {self.host_jitter_ms}")
        if self.bench_forward and self.fmt != "kineto":
            raise SimConfigError("--bench-forward writes Kineto traces only")
        if self.bench_forward and self.replay == "lag":
            raise SimConfigError("--bench-forward replays fixed batches: not with --replay lag (its batches depend on "
                                 "the serving run's step times)")
        if self.token_ns < 0:
            raise SimConfigError(f"token time must be >= 0, got {self.token_ns} ns")
        for inj in self.injects:
            if inj.rank >= self.ranks:
                raise SimConfigError(f"inject {inj.kind}: rank {inj.rank} >= ranks {self.ranks}")
            if inj.layer is not None and not 0 <= inj.layer < self.layers:
                raise SimConfigError(f"inject {inj.kind}: layer {inj.layer} outside 0..{self.layers - 1}")

    @property
    def hosts(self) -> int:
        return (self.ranks + self.ranks_per_host - 1) // self.ranks_per_host

    def host_of(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def device_of(self, rank: int) -> int:
        return rank % self.ranks_per_host
