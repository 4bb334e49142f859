"""Fault injection: ``--inject KIND:rank=R[,every=K][,ms=M][,start=S]`` and the runtime that fires it.

Each fault is a known cause of CPU overhead or straggling in wide-EP serving (see
``shared/reference/vllm.md``). A spec fires on rank R at steps S, S+K, S+2K, ... (defaults: K=1,
S=0, M=20). What actually fired, and how long it took, goes into the step record so the truth file
lists exact steps. No torch here: the CLI and tests parse specs without it.
"""
from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass

#: kind -> where it acts (documentation, also printed by ``--help``).
FAULT_KINDS: dict[str, str] = {
    "gc": "real gc.collect() over a live heap sized (calibrated) so a full collection takes ~M ms; span 'gc'",
    "slow_schedule": "M ms of extra Python work inside Scheduler.schedule",
    "host_sync": "extra device sync inside execute_model (prepare_inputs) held M ms: "
                 "polls a CUDA event on cuda, busy-waits on cpu, then .item()",
    "slow_allreduce": "rank enters the Gloo DP all-reduce (sync_dp_padding) M ms late: a slow partner",
    "sleep": "time.sleep(M ms) at the start of the step (no span: unannotated host time)",
    "hot_experts": "all routers favour the experts hosted on rank R, so R gets most tokens (M unused)",
    "crash": "testing only: rank R raises at step S, to check that the others do not hang",
}

DEFAULT_MS = 20.0
#: which process of a rank acts out each kind under --split-procs
ENGINE_KINDS = frozenset({"gc", "sleep", "slow_schedule", "crash"})
WORKER_KINDS = frozenset({"host_sync", "slow_allreduce", "hot_experts"})


@dataclass(frozen=True)
class FaultSpec:
    """One ``--inject`` value."""

    kind: str
    rank: int
    every: int = 1
    ms: float = DEFAULT_MS
    start: int = 0

    def fires(self, rank: int, step: int) -> bool:
        return rank == self.rank and step >= self.start and (step - self.start) % self.every == 0

    def steps(self, total_steps: int) -> list[int]:
        """The steps this spec is scheduled to fire at (the truth file uses what did fire)."""
        return list(range(self.start, total_steps, self.every))

    def to_dict(self) -> dict:
        return asdict(self)


def parse_inject(text: str) -> FaultSpec:
    """Parse ``KIND:rank=R[,every=K][,ms=M][,start=S]``; raise ValueError naming what is wrong."""
    kind, sep, rest = text.partition(":")
    kind = kind.strip()
    if kind not in FAULT_KINDS:
        raise ValueError(f"--inject {text!r}: unknown kind {kind!r}; one of {', '.join(FAULT_KINDS)}")
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in ("rank", "every", "ms", "start"):
            raise ValueError(f"--inject {text!r}: bad field {part!r}; expected rank=, every=, ms=, start=")
        fields[key] = value
    if "rank" not in fields:
        raise ValueError(f"--inject {text!r}: rank=R is required")
    try:
        spec = FaultSpec(kind=kind, rank=int(fields["rank"]), every=int(fields.get("every", 1)),
                         ms=float(fields.get("ms", DEFAULT_MS)), start=int(fields.get("start", 0)))
    except ValueError as exc:
        raise ValueError(f"--inject {text!r}: {exc}") from None
    if spec.every < 1 or spec.start < 0 or spec.ms < 0 or spec.rank < 0:
        raise ValueError(f"--inject {text!r}: need rank>=0, every>=1, start>=0, ms>=0")
    return spec


def spin_until(deadline_ns: int, work=None) -> int:
    """Busy-wait (holding the CPU and the GIL, like real Python work) until a monotonic deadline."""
    n = 0
    while time.monotonic_ns() < deadline_ns:
        if work is not None:
            work()
        else:
            sum(range(200))
        n += 1
    return n


class InjectedCrash(RuntimeError):
    """Raised by the ``crash`` fault."""


class FaultRuntime:
    """The faults of one rank: decides what fires at a step and records what did."""

    def __init__(self, rank: int, specs: list[FaultSpec], kinds: set[str] | None = None):
        """``specs`` is the whole run's list (an event names its index there); ``kinds`` limits
        this runtime to the faults of one process when engine core and worker are split."""
        self.rank = rank
        self.index = {id(s): i for i, s in enumerate(specs)}
        self.specs = [s for s in specs if s.rank == rank and (kinds is None or s.kind in kinds)]
        self.fired: list[dict] = []  # this step's events; the engine moves them into the step record
        self._heap: list = []
        gc_ms = [s.ms for s in self.specs if s.kind == "gc"]
        self.gc_heap_objects = self._build_gc_heap(max(gc_ms)) if gc_ms else 0

    def active(self, kind: str, step: int) -> FaultSpec | None:
        for spec in self.specs:
            if spec.kind == kind and spec.fires(self.rank, step):
                return spec
        return None

    def record(self, spec: FaultSpec, measured_ns: int, **extra) -> None:
        self.fired.append({"kind": spec.kind, "spec": self.index[id(spec)], "ms": spec.ms,
                           "measured_ns": int(measured_ns), **extra})

    def take_fired(self) -> list[dict]:
        fired, self.fired = self.fired, []
        return fired

    # -- gc ---------------------------------------------------------------------------------------
    def _build_gc_heap(self, target_ms: float) -> int:
        """Grow a live heap of reference cycles until a full ``gc.collect()`` takes ~target_ms.

        Why a live heap: in a real server a gen-2 pause is long because the whole live heap is
        traversed, not because of the garbage itself. Automatic GC is disabled on ranks (as vLLM
        workers freeze it), so only the injected collections pause.
        """
        target_ns = target_ms * 1e6
        n = 20_000
        for _ in range(16):
            while len(self._heap) < n:
                a: list = [None]
                a[0] = [a]
                self._heap.append(a)
            del self._heap[n:]
            gc.collect()  # frees what a shrink left behind; untimed
            t0 = time.thread_time_ns()  # CPU time: calibration runs while other ranks start up
            gc.collect()
            took = time.thread_time_ns() - t0
            if 0.85 * target_ns <= took <= 1.15 * target_ns or n >= 5_000_000:
                break
            # cost is roughly linear in live objects (superlinear once caches overflow): iterate
            n = min(5_000_000, max(1_000, int(n * min(4.0, max(0.5, target_ns / max(took, 1))))))
        return len(self._heap) * 2

    def collect(self) -> tuple[int, int]:
        """Make some fresh cyclic garbage, then a full collection; returns (ns, objects freed)."""
        for _ in range(10_000):
            a: list = [None]
            a[0] = [a]
        t0 = time.monotonic_ns()
        freed = gc.collect()
        return time.monotonic_ns() - t0, freed
