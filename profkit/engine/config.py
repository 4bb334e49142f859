"""Engine configuration: one picklable object handed to every rank process."""
from __future__ import annotations

from dataclasses import dataclass, field

from .faults import FaultSpec

#: Span names, shared by torch.profiler (record_function) and NVTX so both profilers see the same.
SPAN_STEP = "EngineCore.step"
SPAN_SCHEDULE = "Scheduler.schedule"
#: vLLM V2 runner: ``dispatch_cg_and_sync_dp`` -> ``sync_cudagraph_and_dp_padding`` (Gloo all-reduce).
SPAN_DP_SYNC = "sync_dp_padding"
SPAN_EXECUTE = "execute_model"
SPAN_SAMPLE = "sample_tokens"
SPAN_UPDATE = "update_from_output"
SPAN_GC = "gc"
#: split-procs only: the engine-core side of the RPC to the worker process (vLLM's executor names).
SPAN_RPC_EXECUTE = "MultiprocExecutor.execute_model"
SPAN_RPC_SAMPLE = "MultiprocExecutor.sample_tokens"


def step_annotation(n_prefill: int, prefill_tokens: int, n_decode: int, decode_tokens: int) -> str:
    """vLLM's per-step annotation (emitted by its workers while a profiler runs)."""
    return f"execute_context_{n_prefill}({prefill_tokens})_generation_{n_decode}({decode_tokens})"


@dataclass
class ModelSize:
    """Shapes of the toy MoE model; small on CPU (fast tests), larger on CUDA (µs-scale kernels)."""

    hidden: int
    ffn: int
    layers: int
    experts_per_rank: int
    topk: int
    vocab: int
    kv_len: int  # length of the fake KV cache each token attends to
    token_budget: int  # scheduler's max tokens per step
    max_seqs: int

    @staticmethod
    def for_device(device: str) -> "ModelSize":
        if device == "cuda":
            # expert matmuls ~[512 x 4096] @ [4096 x 4096]: tens of µs on an H200
            return ModelSize(hidden=4096, ffn=4096, layers=4, experts_per_rank=4, topk=2,
                             vocab=32768, kv_len=2048, token_budget=2048, max_seqs=128)
        return ModelSize(hidden=128, ffn=256, layers=2, experts_per_rank=2, topk=2,
                         vocab=512, kv_len=64, token_budget=64, max_seqs=16)


@dataclass
class EngineConfig:
    """Everything a rank needs; built by the CLI, pickled into each spawned process."""

    ranks: int
    steps: int
    device: str = "cpu"
    seed: int = 0
    out_dir: str = ""
    faults: list[FaultSpec] = field(default_factory=list)
    size: ModelSize = field(default_factory=lambda: ModelSize.for_device("cpu"))
    torch_profile_dir: str | None = None
    profile_steps: tuple[int, int] | None = None  # [A, B): start before step A, stop before step B
    cuda_profiler_steps: tuple[int, int] | None = None
    split_procs: bool = False
    pg_timeout_s: float = 60.0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    command: str = ""
    replay: str | None = None  # "mirror" | "lag" | "round-robin": serve a fixed request set (replay.py)
    replay_seed: int = 0
    lag_ms: float = 200.0  # lag replay: rank r receives the requests r x lag_ms later
    bench_forward: str | None = None  # a serving run's out dir: replay its batch shapes GPU-only (bench.py)
    token_ns: int = 0  # modelled device time per padded token and step (--token-us); 0 = off

    @property
    def num_experts(self) -> int:
        return self.size.experts_per_rank * self.ranks
