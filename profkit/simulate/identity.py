"""Who each simulated rank is: host, GPU, OS pid/tid, process groups, span names.

Shared by both writers and by truth.json so the names a test looks for are defined once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profkit.simulate.clock import HostClock
from profkit.simulate.config import SimConfig

# Names of the host spans (Kineto user_annotation / nsys NVTX ranges); written to truth.json.
SPAN_NAMES = {
    "step": "EngineCore.step",
    "sched": "Scheduler.schedule",
    "gc": "gc.collect",
    "em": "execute_model",
    "prep": "prepare_inputs",
    "dp": "dp_allreduce",
    "st": "sample_tokens",
    "upd": "update_from_output",
    "nccl": "nccl:all_to_all",
    "nccl_nvtx": "ncclAlltoAll",
    "comm_op": "record_param_comms",
}

# Process groups as torch's distributedInfo.pg_config names them.
PG_DEFAULT, PG_EP, PG_DP_CPU = "0", "1", "2"
EP_SEQ_BASE = 100  # sequence number of the first EP all-to-all in the window (warm-up came before)
DP_SEQ_BASE = 10
HIDDEN = 7168  # hidden size used for message sizes (DeepSeek-V3-like)

NSYS_HW_ID = 1  # nsys globalPid high byte as in real single-node exports (1 << 56)


def step_annotation(batch: int, n_prefill: int = 0, prefill_tokens: int = 0) -> str:
    """vLLM's per-step annotation: ``batch`` decodes (one token each), plus prefills in a replay."""
    return f"execute_context_{n_prefill}({prefill_tokens})_generation_{batch}({batch})"


@dataclass(frozen=True)
class RankIdentity:
    rank: int
    world: int
    host: int
    device: int
    pid: int
    tid: int
    clock: HostClock
    hostname: str

    @property
    def global_pid(self) -> int:
        """nsys globalPid: <HwId:8><VmId:8><Pid:24><Tid:24> with tid 0."""
        return (NSYS_HW_ID << 56) | (self.pid << 24)

    @property
    def global_tid(self) -> int:
        return self.global_pid | self.tid

    @property
    def process_name(self) -> str:
        return f"EngineCore_DP{self.rank}"


def identities(cfg: SimConfig, clocks: list[HostClock]) -> list[RankIdentity]:
    """Seeded, unique-per-host OS pids; the main thread's tid equals the pid."""
    rng = np.random.default_rng([cfg.seed, 0x9D])
    out = []
    for host in range(cfg.hosts):
        local = [r for r in range(cfg.ranks) if cfg.host_of(r) == host]
        pids = rng.choice(np.arange(2_000, 4_000_000 // 4), size=len(local), replace=False)
        for r, pid in zip(local, pids):
            out.append(
                RankIdentity(
                    rank=r, world=cfg.ranks, host=host, device=cfg.device_of(r), pid=int(pid), tid=int(pid),
                    clock=clocks[host], hostname=f"node{host:03d}",
                )
            )
    return sorted(out, key=lambda i: i.rank)


def pg_config(world: int) -> list[dict]:
    ranks = list(range(world))
    groups = ((PG_DEFAULT, "default_pg", "cuda:nccl"), (PG_EP, "ep", "cuda:nccl"),
              (PG_DP_CPU, "dp_cpu", "cpu:gloo,cuda:gloo"))
    return [{"pg_name": name, "pg_desc": desc, "backend_config": backend, "pg_size": world, "ranks": ranks}
            for name, desc, backend in groups]
