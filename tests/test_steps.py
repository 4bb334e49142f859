"""Step detection and per-step GPU accounting on small hand-built event tables (known answers)."""
from __future__ import annotations

import pandas as pd
import pytest

from profkit import schema
from profkit.analyze.gpu import gpu_timeline
from profkit.names import is_comm_kernel
from profkit.analyze.steps import find_step_spans, step_batch_facts, step_table


def events(rows: list[dict]) -> pd.DataFrame:
    df = schema.from_records(rows)
    schema.validate(df)
    return df


def span(rank, name, start, end, kind=schema.CPU_SPAN):
    return {"rank": rank, "source": "t", "kind": kind, "name": name, "start_ns": start, "end_ns": end, "pid": 1, "tid": 1}


def kern(rank, name, start, end, stream=7, kind=schema.KERNEL):
    return {"rank": rank, "source": "t", "kind": kind, "name": name, "start_ns": start, "end_ns": end, "device": 0, "stream": stream}


def test_step_gpu_busy_is_union_over_streams_clipped_to_step():
    df = events(
        [
            span(0, "execute_context_0(0)_generation_4(4)", 1000, 2000),
            span(0, "execute_context_2(300)_generation_1(1)", 2000, 4000),
            kern(0, "gemm", 900, 1100),  # half before the step
            kern(0, "gemm", 1500, 1700, stream=7),
            kern(0, "ncclDevKernel_AllToAll", 1600, 1800, stream=9),  # overlaps the gemm
            kern(0, "memcpy", 1900, 2100, kind=schema.MEMCPY),  # straddles both steps
            kern(0, "late", 3900, 4500),
        ]
    )
    steps = step_table(df)
    assert steps["step"].tolist() == [0, 1]
    first, second = steps.iloc[0], steps.iloc[1]
    assert first["step_ns"] == 1000
    # [1000,1100) + [1500,1800) + [1900,2000) = 100 + 300 + 100
    assert first["gpu_busy_ns"] == 500
    assert first["gpu_kernel_ns"] == 400
    assert first["gap_ns"] == 500
    assert second["gpu_busy_ns"] == 100 + 100
    assert second["gap_ns"] == 2000 - 200
    assert first["phase"] == "decode" and first["batch_size"] == 4 and first["num_tokens"] == 4
    assert second["phase"] == "mixed" and second["num_tokens"] == 301


def test_marker_priority_and_nesting():
    df = events(
        [
            span(0, "EngineCore.step", 0, 100),
            span(0, "execute_context_0(0)_generation_1(1)", 10, 90),
            span(0, "EngineCore.step", 100, 250),
            span(0, "EngineCore.step", 120, 130),  # nested duplicate (e.g. a re-entrant hook)
            span(1, "EngineCore.step", 5, 105),
        ]
    )
    spans = find_step_spans(df)
    assert set(spans["marker"]) == {"engine_step"}
    assert spans[spans["rank"] == 0]["start_ns"].tolist() == [0, 100]
    assert spans[spans["rank"] == 1]["step"].tolist() == [0]
    user = find_step_spans(df, step_pattern=r"^execute_context")
    assert user["marker"].tolist() == ["user"]


def test_profiler_step_numbers_and_gpu_annotation_ignored():
    df = events(
        [
            span(0, "ProfilerStep#6", 0, 100),
            span(0, "ProfilerStep#7", 100, 200),
            span(0, "ProfilerStep#6", 50, 120, kind=schema.GPU_SPAN),  # the GPU projection must not count
        ]
    )
    assert find_step_spans(df)["step"].tolist() == [6, 7]


def test_no_steps_gives_empty_table_with_contract_columns():
    df = events([kern(0, "gemm", 0, 10)])
    steps = step_table(df)
    assert steps.empty
    for col in ["rank", "step", "start_ns", "end_ns", "step_ns", "gpu_busy_ns", "gpu_kernel_ns", "gap_ns"]:
        assert col in steps.columns


def test_sglang_batch_facts():
    facts = step_batch_facts(pd.Series(["step[DECODE bs=32]", "step[EXTEND bs=15 toks=15360]", "other"]))
    assert facts["phase"].tolist()[:2] == ["decode", "prefill"]
    assert facts["batch_size"].tolist()[:2] == [32, 15]
    assert facts["num_tokens"].tolist()[:2] == [32, 15360]
    assert pd.isna(facts["phase"].iloc[2])


def test_batch_facts_of_repeated_and_missing_names_row_by_row():
    """Each distinct name is parsed once and its facts spread to its rows (a decode-only run
    repeats a few names every step); a missing name, kept missing by a ``str`` column, has none."""
    names = ["step[DECODE bs=32]", None, "execute_context_0(0)_generation_8(8)", "step[DECODE bs=32]", "other",
             "execute_context_0(0)_generation_8(8)"]
    for dtype in (object, "str"):
        facts = step_batch_facts(pd.Series(names, dtype=dtype, index=[10, 11, 12, 13, 14, 15]))
        assert list(facts.index) == [10, 11, 12, 13, 14, 15]
        assert facts["phase"].tolist()[::2] == ["decode", "decode", pd.NA] and facts["phase"].iloc[3] == "decode"
        assert facts["batch_size"].tolist() == [32, pd.NA, 8, 32, pd.NA, 8]
        assert facts["num_tokens"].tolist() == [32, pd.NA, 8, 32, pd.NA, 8]
        assert str(facts["phase"].dtype) == "string" and str(facts["num_tokens"].dtype) == "Int64"


def test_timeline_exposed_comm_and_memcpy():
    df = events(
        [
            kern(0, "gemm", 0, 100),
            kern(0, "ncclDevKernel_AllReduce_Sum_f32", 50, 200, stream=9),  # 100 exposed
            kern(0, "Memcpy DtoH", 150, 260, kind=schema.MEMCPY),  # 200..260 exposed
            kern(0, "Memset", 300, 310, kind=schema.MEMSET),  # computation, like TraceLens
        ]
    )
    t = gpu_timeline(df)
    assert t["window_ns"] == 310
    assert t["gpu_busy_ns"] == 270
    assert t["gpu_idle_ns"] == 40
    assert t["computation_ns"] == 110
    assert t["exposed_comm_ns"] == 100
    assert t["exposed_memcpy_ns"] == 60
    assert t["computation_ns"] + t["exposed_comm_ns"] + t["exposed_memcpy_ns"] == t["gpu_busy_ns"]


@pytest.mark.parametrize(
    "name,comm",
    [
        ("ncclDevKernel_AllToAll_RING_LL", True),
        ("ncclKernel_AllReduce_RING_LL_Sum_float", True),
        ("void dpsk::ep::internode::dispatch<8>(int)", True),
        ("cross_device_reduce_2stage<float, 8>", True),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", False),
        ("void at::native::reduce_kernel<512, 1>", False),
    ],
)
def test_comm_kernel_names(name, comm):
    assert bool(is_comm_kernel(pd.Series([name]))[0]) is comm


def _vllm_026_detailed_annotation(total, n_ctx, ctx_tok, n_gen, gen_tok) -> str:
    """The name vLLM 0.26's ``Worker.annotate_profile`` builds with ``detailed_trace_annotation``
    (its string joins, copied from vllm/v1/worker/gpu_worker.py; the roofline sums are arbitrary)."""
    return "".join(["execute_", str(total), "_context_", str(n_ctx), "(sq", str(ctx_tok), "sk", "900", "sqsq",
                    "40000", "sqsk", "90000", ")_generation_", str(n_gen), "(sq", str(gen_tok), "sk", "5120",
                    "sqsq", "64", "sqsk", "5120", ")"])


def test_vllm_detailed_annotation_is_a_step_with_its_counts():
    names = ["execute_context_1(200)_generation_63(63)", _vllm_026_detailed_annotation(263, 1, 200, 63, 63),
             _vllm_026_detailed_annotation(64, 0, 0, 64, 64)]
    detailed = events([span(0, n, 1000 * (i + 1), 1000 * (i + 1) + 900) for i, n in enumerate(names[1:])])
    steps = step_table(detailed)
    assert len(steps) == 2 and set(steps["marker"]) == {"vllm_detailed"}
    # SGLang traces carry the detailed form around their own step[...] span: SGLang's marker wins
    both = events([span(0, names[2], 1000, 1900), span(0, "step[DECODE bs=64]", 1010, 1890)])
    assert set(step_table(both)["marker"]) == {"sglang"}
    facts = step_batch_facts(pd.Series(names))
    assert facts["phase"].tolist() == ["mixed", "mixed", "decode"]
    assert facts["batch_size"].tolist() == [64, 64, 64]
    assert facts["num_tokens"].tolist() == [263, 263, 64]
    from profkit.analyze.overhead_names import cause_name

    assert {cause_name(n) for n in names} == {"execute_context_N_generation_N"}
