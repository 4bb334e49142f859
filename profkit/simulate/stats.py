"""Empirical timing tables the simulator samples from, so simulated traces look like real ones.

Source of every number marked "real": the public trace
``../shared/traces/tracelens/vllm_b200_tp8_eager/eager_trace.json.gz`` (AMD-AGI/TraceLens
``tests/traces/inference/b200/eager_trace.json.gz``, MIT; vLLM eager, rank 0 of TP8 on B200,
one 888-token prefill step, 768 kernels). Quantiles are in microseconds, computed with
``numpy.quantile`` over the trace's events (see tests/test_simulate.py, which recomputes the
kernel-duration quantiles from the trace and compares them with a simulated run).

Numbers marked "assumed" are not in that trace (it has no scheduler/engine spans and no
cross-rank collectives); they are plausible magnitudes from vLLM issues (reference/vllm.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Z90 = 1.2815515655446004  # standard-normal quantile at 0.9


@dataclass(frozen=True)
class LogNormal:
    """A duration law given by its 10th/50th/90th percentiles (µs); sampled as a lognormal."""

    p10_us: float
    p50_us: float
    p90_us: float

    @property
    def sigma(self) -> float:
        return max(np.log(self.p90_us / self.p10_us) / (2 * Z90), 1e-3)

    def ns(self, z: np.ndarray) -> np.ndarray:
        """Map standard-normal draws ``z`` to int64 nanoseconds."""
        return np.rint(self.p50_us * 1e3 * np.exp(self.sigma * z)).astype(np.int64)


@dataclass(frozen=True)
class Empirical:
    """A duration law given by quantile knots (probability, µs); sampled by inverse CDF."""

    probs: tuple[float, ...]
    values_us: tuple[float, ...]

    def ns(self, u: np.ndarray) -> np.ndarray:
        """Map uniform(0,1) draws ``u`` to int64 nanoseconds (piecewise-linear inverse CDF)."""
        return np.rint(np.interp(u, self.probs, self.values_us) * 1e3).astype(np.int64)


# ---- real: kernel durations per kernel class (p10, p50, p90 µs) --------------------------------
# Keys are the simulator's kernel roles; the comment names the real kernel the stats come from.
KERNEL_US: dict[str, LogNormal] = {
    "rms_norm": LogNormal(5.79, 6.32, 6.81),  # vllm::fused_add_rms_norm_kernel
    "fp8_quant": LogNormal(2.64, 2.69, 2.75),  # vllm::scaled_fp8_quant_kernel_strided
    "gemm_qkv": LogNormal(7.62, 8.05, 8.22),  # nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT
    "rotary": LogNormal(3.58, 3.66, 3.84),  # vllm::rotary_embedding_kernel
    "kv_cache": LogNormal(4.37, 4.51, 4.72),  # vllm::reshape_and_cache_flash_kernel
    "copy": LogNormal(3.49, 5.26, 7.07),  # at::native::elementwise_kernel direct_copy
    "attention_full": LogNormal(15.10, 15.18, 15.27),  # fmhaSm100aKernel_..._Causal...
    "attention_sliding": LogNormal(11.68, 11.73, 12.05),  # fmhaSm100aKernel_..._SlidingOrChunked...
    "gemm_o": LogNormal(6.21, 6.34, 6.45),  # nvjet_tst_144x128_64x6_2x1_v_bz_bias_TNN
    "gemm_router": LogNormal(6.46, 6.50, 6.58),  # nvjet_tst_64x16_64x16_2x4_2cta_h_bz_bias_TNT
    "topk": LogNormal(2.62, 2.72, 2.78),  # routingIndicesHistogramScoresKernel
    "align": LogNormal(4.64, 4.91, 5.30),  # routingIndicesHistogramKernel
    "sort": LogNormal(4.50, 4.69, 4.77),  # routingIndicesOffsetsKernel
    "act_quant": LogNormal(4.54, 4.67, 4.77),  # tensorrt_llm::kernels::quantize_with_block_size
    "act_mul": LogNormal(3.10, 3.17, 3.22),  # at::native::vectorized_elementwise_kernel FillFunctor
    "expert_gemm1": LogNormal(77.79, 87.90, 100.70),  # bmm_MxE4m3_MxE2m1MxE4m3_..._swiGlu
    "expert_gemm2": LogNormal(53.60, 56.64, 59.57),  # bmm_Bfloat16_MxE2m1MxE4m3_...
    "moe_sum": LogNormal(6.66, 7.07, 7.31),  # moe::dev::finalize::finalizeKernelVecLoad
    # sampler kernels: nearest real small kernels (index/gather/elementwise, single samples)
    "sample_logits": LogNormal(3.90, 4.58, 7.71),  # vectorized_gather / index_elementwise / masked_fill
    "sample_argmax": LogNormal(2.40, 2.54, 2.68),  # _copy_page_indices_kernel
    "tiny": LogNormal(1.98, 2.08, 2.69),  # triton_poi_fused_add_..., unrolled_elementwise add
}

# real: the same, all compute kernels pooled (comm kernels nccl/multimem excluded), for the test
REAL_COMPUTE_KERNEL_QUANTILES_US = {0.10: 2.78, 0.25: 3.71, 0.50: 5.84, 0.75: 7.07, 0.90: 52.68}

# ---- real: CUDA runtime call durations (µs) -------------------------------------------------------
LAUNCH_US = LogNormal(6.06, 6.60, 7.60)  # cudaLaunchKernel, 367 calls
MEMCPY_CALL_US = LogNormal(8.44, 13.83, 28.83)  # cudaMemcpyAsync, 161 calls

# real: launch -> kernel start when the GPU was idle (kernel.ts - runtime.ts, 779 kernels)
LAUNCH_LATENCY_US = Empirical(
    (0.0, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 1.0),
    (8.0, 8.88, 9.17, 9.57, 10.26, 11.70, 21.63, 26.86, 40.0),
)

# real: host gap between consecutive launch calls on the main thread (Python/op overhead, 927 gaps)
LAUNCH_GAP_US = Empirical(
    (0.0, 0.10, 0.25, 0.50, 0.75, 0.90, 0.99, 1.0),
    (0.5, 1.01, 20.66, 63.54, 107.99, 150.18, 337.16, 500.0),
)

# real: memcpy durations on the GPU (µs)
H2D_US = LogNormal(0.93, 1.22, 1.98)  # Memcpy HtoD (Pinned -> Device)
D2H_US = LogNormal(0.93, 1.22, 1.98)  # no DtoH in the trace: HtoD used as the nearest real copy

# ---- assumed: host spans of the engine step (µs) -----------------------------------------------------
SCHEDULE_US = LogNormal(260.0, 350.0, 480.0)  # Scheduler.schedule at decode batch ~64
PREPARE_US = LogNormal(300.0, 400.0, 560.0)  # input preparation in the model runner
UPDATE_US = LogNormal(180.0, 250.0, 350.0)  # Scheduler.update_from_output
INTERSTEP_US = LogNormal(50.0, 80.0, 130.0)  # busy-loop overhead between steps
POST_SAMPLE_US = LogNormal(20.0, 30.0, 45.0)  # after the sampled-token copy returns
# Gloo DP all-reduce once the last rank arrives; key: all ranks on one host (True) or not
GLOO_ALLREDUCE_US = {True: LogNormal(120.0, 150.0, 200.0), False: LogNormal(450.0, 600.0, 800.0)}
# assumed: EP all-to-all transfer time once the last rank arrives (dispatch / combine, decode sizes)
DISPATCH_US = LogNormal(38.0, 45.0, 55.0)
COMBINE_US = LogNormal(50.0, 60.0, 72.0)
