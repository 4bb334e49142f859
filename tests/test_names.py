"""``profkit.names.kernel_short_name``: the one kernel short name of the simulator (nsys
``shortName``), the straggler phase labels and the collective names of the overhead causes."""
from __future__ import annotations

from profkit.analyze.overhead_names import collective_of_kernel
from profkit.analyze.straggler_phases import kernel_label
from profkit.names import kernel_short_name


def test_short_names_of_real_kernel_names():
    # names as they stand in the H200 captures of sample_traces/
    assert kernel_short_name("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>(int, "
                             "at::native::FillFunctor<int>, std::array<char *, 1>)") == "vectorized_elementwise_kernel"
    assert kernel_short_name("Memcpy DtoH (Device -> Pinned)") == "Memcpy DtoH "  # the space stays (nsys does too)
    anonymous = "void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long>(int)"
    assert kernel_short_name(anonymous) == ""  # cut at the namespace's "(": nothing left
    assert kernel_short_name(anonymous, keep_anonymous=False) == "indexSelectSmallIndex"


def test_the_callers_keep_their_fallbacks():
    assert kernel_label("void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long>(int)") == "gpu:kernel"
    assert kernel_label("void (anonymous namespace)::k<1>(int)") == "gpu:k"  # "(" at the start is no cut
    assert kernel_label("  void ns::gemm_kernel<float>(float*)  ") == "gpu:gemm_kernel"
    assert collective_of_kernel("void vllm::cross_device_all_reduce_1stage<bf16>(x)") == "all_reduce"
    assert collective_of_kernel("void (anonymous namespace)::dispatch_tokens<8>(x)") == "dispatch_tokens"
