"""The GPU work of one engine step: which ops a DEP rank launches, in order, on which stream.

One list of ``OpSpec`` per step, identical on every rank (ranks differ in timing only), so the
timeline can be computed for many ranks at once with numpy. Per MoE layer the layout mirrors the
per-layer kernel mix of the real vLLM trace in ``stats.py`` (19 compute kernels), with the two TP
all-reduces replaced by the EP dispatch and combine all-to-alls of a DEP deployment. Ops marked
``fused`` (routing .. combine .. moe_sum) are launched from inside one custom op, as vLLM's
fused MoE layer does, and take the shortest host gaps of the real distribution, so between
dispatch and combine the GPU, not the host, sets the pace: a rank with hot experts really does
arrive late at the combine. Kernel names
are Hopper-era names as they appear in real torch/vLLM traces.
"""
from __future__ import annotations

from dataclasses import dataclass

from profkit.names import kernel_short_name
from profkit.simulate import stats

COMPUTE_STREAM = 7  # torch's default compute stream id in real Kineto traces ("stream 7")
COMM_STREAM = 24  # a ProcessGroupNCCL stream

KERNEL, MEMCPY_H2D, MEMCPY_D2H, COLL = "kernel", "memcpy_h2d", "memcpy_d2h", "coll"

NCCL_KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"  # all-to-all = grouped send/recv


@dataclass(frozen=True)
class OpSpec:
    """One launch (kernel, memcpy or collective) in the step program."""

    role: str
    name: str
    kind: str = KERNEL
    stream: int = COMPUTE_STREAM
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (128, 1, 1)
    regs: int = 32
    smem: int = 0
    layer: int = -1
    coll: str = ""  # "dispatch" | "combine" for collectives
    expert: bool = False  # duration scales with the rank's expert load
    fused: bool = False  # launched back-to-back from inside one custom op (vLLM's fused MoE)

    @property
    def short_name(self) -> str:
        """nsys ``shortName``: the function name without template/argument lists."""
        return kernel_short_name(self.name)


_COPY = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
    "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}"
    "::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::"
    "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}"
    "::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, at::native::"
    "gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}"
    "::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::"
    "TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}"
    "::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::"
    "{lambda(int)#1})"
)
_NORM = (
    "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
    "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, "
    "c10::BFloat16 const*, float, int, int)"
)
_FLASH = (
    "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, {sw}, false, "
    "false, false, false, true, true, false, false>(flash::Flash_fwd_params)"
)


def _layer(layer: int) -> list[OpSpec]:
    sliding = layer % 2 == 0
    return [
        OpSpec("rms_norm", _NORM, grid=(64, 1, 1), block=(256, 1, 1), smem=168, layer=layer),
        OpSpec(
            "fp8_quant",
            "void vllm::scaled_fp8_quant_kernel_strided<c10::BFloat16, c10::Float8_e4m3fn>"
            "(c10::Float8_e4m3fn*, c10::BFloat16 const*, float const*, int, long, long)",
            grid=(64, 1, 1), block=(256, 1, 1), regs=30, layer=layer,
        ),
        OpSpec(
            "gemm_qkv",
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_"
            "execute_segment_k_off_kernel__5x_cublas",
            grid=(80, 1, 1), block=(128, 1, 1), regs=168, smem=213656, layer=layer,
        ),
        OpSpec(
            "rotary",
            "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, "
            "c10::BFloat16*, c10::BFloat16 const*, int, long, long, long, int, int, int)",
            grid=(64, 1, 1), block=(256, 1, 1), layer=layer,
        ),
        OpSpec(
            "kv_cache",
            "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, "
            "(vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16*, "
            "__nv_bfloat16*, long const*, long, long, long, long, long, int, int, int, float const*, "
            "float const*)",
            grid=(64, 1, 1), block=(64, 1, 1), regs=42, layer=layer,
        ),
        OpSpec("copy", _COPY, grid=(111, 1, 1), regs=20, layer=layer),
        OpSpec(
            "attention_sliding" if sliding else "attention_full",
            _FLASH.format(sw="true" if sliding else "false"),
            grid=(4, 8, 1), block=(128, 1, 1), regs=255, smem=49152, layer=layer,
        ),
        OpSpec(
            "gemm_o",
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x64x64_warpgroupsize1x1x1_"
            "execute_segment_k_off_kernel__5x_cublas",
            grid=(56, 1, 1), block=(128, 1, 1), regs=168, smem=217680, layer=layer,
        ),
        OpSpec("rms_norm", _NORM, grid=(64, 1, 1), block=(256, 1, 1), smem=168, layer=layer),
        OpSpec(
            "gemm_router",
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x32x64_warpgroupsize1x1x1_"
            "execute_segment_k_off_kernel__5x_cublas",
            grid=(8, 1, 1), block=(128, 1, 1), regs=168, smem=164504, layer=layer,
        ),
        OpSpec(
            "topk",
            "void vllm::moe::topkGatingSoftmax<8, 256, 4, 16, 32, int, float>(float const*, bool "
            "const*, float*, int, int*, int*, int, int, int, bool)",
            grid=(16, 1, 1), block=(32, 4, 1), regs=31, layer=layer,
        ),
        OpSpec(
            "align",
            "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, "
            "int, int, unsigned long, int*)",
            grid=(1, 1, 1), block=(1024, 1, 1), smem=512, layer=layer, fused=True,
        ),
        OpSpec(
            "sort",
            "void vllm::moe::count_and_sort_expert_tokens_kernel<int>(int const*, int*, int*, "
            "unsigned long)",
            grid=(4, 1, 1), block=(256, 1, 1), smem=1568, layer=layer, fused=True,
        ),
        OpSpec(
            "act_quant",
            "void vllm::per_token_group_quant_8bit_kernel<c10::BFloat16, c10::Float8_e4m3fn, false>"
            "(c10::BFloat16 const*, void*, float*, int, int, int, float, float, float, bool, int, int)",
            grid=(256, 1, 1), block=(256, 1, 1), layer=layer, fused=True,
        ),
        OpSpec("ep_dispatch", NCCL_KERNEL, kind=COLL, stream=COMM_STREAM, grid=(32, 1, 1),
               block=(640, 1, 1), regs=96, smem=103808, layer=layer, coll="dispatch", fused=True),
        OpSpec("expert_gemm1", "fused_moe_kernel", grid=(1184, 1, 1), block=(128, 1, 1), regs=168,
               smem=98304, layer=layer, expert=True, fused=True),
        OpSpec(
            "act_mul",
            "void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel<c10::"
            "BFloat16>(c10::BFloat16 const&)), true>(c10::BFloat16*, c10::BFloat16 const*, int)",
            grid=(512, 1, 1), block=(1024, 1, 1), regs=16, layer=layer, fused=True,
        ),
        OpSpec("expert_gemm2", "fused_moe_kernel", grid=(592, 1, 1), block=(128, 1, 1), regs=168,
               smem=98304, layer=layer, expert=True, fused=True),
        OpSpec("ep_combine", NCCL_KERNEL, kind=COLL, stream=COMM_STREAM, grid=(32, 1, 1),
               block=(640, 1, 1), regs=96, smem=103808, layer=layer, coll="combine", fused=True),
        OpSpec(
            "moe_sum",
            "void vllm::moe::moe_sum_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16 const*, int)",
            grid=(64, 1, 1), block=(256, 1, 1), regs=44, smem=384, layer=layer, fused=True,
        ),
        OpSpec("copy", _COPY, grid=(111, 1, 1), regs=20, layer=layer),
    ]


SAMPLER = [
    OpSpec(
        "sample_logits",
        "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, "
        "long, long, bool)",
        grid=(64, 2, 1), block=(256, 1, 1),
    ),
    OpSpec(
        "sample_argmax",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
        "unsigned int, long, 4, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned "
        "int, long, 4, 4>)",
        grid=(64, 1, 1), block=(512, 1, 1),
    ),
    OpSpec("copy", _COPY, grid=(1, 1, 1), regs=20),
]

H2D = OpSpec("h2d", "Memcpy HtoD (Pinned -> Device)", kind=MEMCPY_H2D)
D2H = OpSpec("d2h", "Memcpy DtoH (Device -> Pinned)", kind=MEMCPY_D2H)

TINY = OpSpec(
    "tiny",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
    "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
    grid=(1, 1, 1), block=(128, 1, 1), regs=16,
)


@dataclass(frozen=True)
class Program:
    """The ops of one step, with index helpers the timeline and writers share.

    Layout: ``[H2D] + layers x _layer() + SAMPLER + [D2H]``. ``coll_ops`` are the indices of the
    collectives in order (``2 * layers`` of them); ``sampler_first`` is where ``sample_tokens``
    starts.
    """

    ops: tuple[OpSpec, ...]
    layers: int

    @property
    def n(self) -> int:
        return len(self.ops)

    @property
    def coll_ops(self) -> list[int]:
        return [i for i, op in enumerate(self.ops) if op.kind == COLL]

    @property
    def sampler_first(self) -> int:
        return self.n - 1 - len(SAMPLER)

    def durations(self) -> list[stats.LogNormal | None]:
        """Duration law per op (None for collectives: their end is set by the last arriver)."""
        out: list[stats.LogNormal | None] = []
        for op in self.ops:
            if op.kind == COLL:
                out.append(None)
            elif op.kind == MEMCPY_H2D:
                out.append(stats.H2D_US)
            elif op.kind == MEMCPY_D2H:
                out.append(stats.D2H_US)
            else:
                out.append(stats.KERNEL_US[op.role])
        return out


def build_program(layers: int) -> Program:
    ops: list[OpSpec] = [H2D]
    for layer in range(layers):
        ops.extend(_layer(layer))
    ops.extend(SAMPLER)
    ops.append(D2H)
    return Program(tuple(ops), layers)
