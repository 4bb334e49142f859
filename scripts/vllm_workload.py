#!/usr/bin/env python3
"""A steady offline vLLM decode on the bundle's tiny random MoE, timed step by step from the front
end, with optional real faults in the engine-core process. Runs on the GPU machine through the
vLLM 0.26 bundle (``../shared/device/vllm/``); used by ``scripts/vllm_device.sh`` (the captures in
``sample_traces/vllm-0.26-h200/``) and ``benchmarks/vllm_overhead.py`` (what profkit costs a real
engine).

    python3 scripts/vllm_workload.py --prompts 64 --max-tokens 400 --timings T.json \\
        [--fault gc:every=5,ms=40,start=60] [--fault sleep:every=7,ms=30,start=60] \\
        [--native-profile DIR --native-steps 150:210]

The front end drives ``LLM.llm_engine.step()`` itself (what ``LLM.generate`` does inside) and
records each call's monotonic start/end: one call returns one engine iteration's outputs, so the
spacing of the calls is the serving step period, measured without profkit. ``--timings`` writes
them, with the run's facts.

Faults are real work in the real engine, placed inside the scheduler's own calls (so a profiler
sees them inside ``Scheduler.update_from_output`` / ``Scheduler.schedule``, not beside them):

- ``gc``: a full ``gc.collect()`` over a large heap (built once, sized so one collection takes about
  ``ms``; kept frozen between injections, so the engine's own collections stay as cheap as
  usual), run inside ``Scheduler.update_from_output`` (from ``KVCacheManager.take_events``,
  which it calls once per step) every ``every``-th step from call ``start``.
- ``sleep``: ``time.sleep(ms)`` inside ``Scheduler.schedule`` (from
  ``Scheduler._get_new_block_ids_to_zero``, called once per schedule) every ``every``-th call.

Neither function is a profkit hook target, so profkit's spans around the scheduler methods contain
the fault. Each injection is written as a JSON line (kind, call number, monotonic/wall start, the
measured duration) to ``$VLLM_WORKLOAD_TRUTH_DIR/faults-pid{pid}.jsonl``: the truth profkit is
checked against. The fault spec travels to vLLM's spawned processes in ``VLLM_WORKLOAD_FAULTS``;
with spawn, vLLM re-imports this file as ``__mp_main__`` in each, which installs the patches there.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time

os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not in the bundle
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")     # V1 GPUModelRunner (the default for qwen3_moe)
_fb = os.environ.get("VLLM_BUNDLE_FALLBACK")
if _fb and os.path.isdir(_fb) and _fb not in sys.path:
    sys.path.append(_fb)

FAULTS_ENV = "VLLM_WORKLOAD_FAULTS"
TRUTH_ENV = "VLLM_WORKLOAD_TRUTH_DIR"
TOGGLE_ENV = "VLLM_WORKLOAD_HOOK_TOGGLE"  # "every=N,start=S": profkit's hooks off/on in blocks of N steps


# -- faults (installed in every process at import; only the engine core calls the scheduler) -------
def parse_faults(text: str) -> list[dict]:
    """``gc:every=5,ms=40,start=60;sleep:every=7,ms=30`` -> [{kind, every, ms, start}, ...]."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        kind, _, rest = part.partition(":")
        spec = {"kind": kind, "every": 5, "ms": 40.0, "start": 60}
        for kv in filter(None, rest.split(",")):
            key, _, value = kv.partition("=")
            spec[key] = float(value) if key == "ms" else int(value)
        if kind not in ("gc", "sleep"):
            raise ValueError(f"unknown fault kind {kind!r} (gc, sleep)")
        out.append(spec)
    return out


class _Truth:
    def __init__(self) -> None:
        self.dir = os.environ.get(TRUTH_ENV)

    def write(self, **facts) -> None:
        if not self.dir:
            return
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, f"faults-pid{os.getpid()}.jsonl"), "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), **facts}) + "\n")


class _Heap:
    """A heap a full collection takes about ``ms`` to walk (built on first use, then frozen)."""

    def __init__(self, ms: float, truth: _Truth) -> None:
        self.ms, self.truth, self.chunks = ms, truth, []

    def build(self) -> None:
        t0 = time.perf_counter()
        took_ms = 0.0
        while took_ms < self.ms and len(self.chunks) < 400:
            self.chunks.append([[i, str(i), {"k": i}] for i in range(50_000)])
            took_ms = self.collect() / 1e6
        self.truth.write(kind="gc_heap", chunks=len(self.chunks), collect_ms=took_ms,
                         build_s=time.perf_counter() - t0)

    def collect(self) -> int:
        gc.unfreeze()
        t0 = time.perf_counter_ns()
        gc.collect()
        dur = time.perf_counter_ns() - t0
        gc.freeze()
        return dur


def install_faults(specs: list[dict]) -> None:
    from vllm.v1.core import kv_cache_manager
    from vllm.v1.core.sched import scheduler

    truth = _Truth()
    for spec in specs:
        calls = [0]
        if spec["kind"] == "gc":
            heap = _Heap(spec["ms"], truth)
            owner, attr = kv_cache_manager.KVCacheManager, "take_events"
        else:
            heap = None
            owner, attr = scheduler.Scheduler, "_get_new_block_ids_to_zero"
        original = getattr(owner, attr)

        def faulty(self, *args, _original=original, _spec=spec, _calls=calls, _heap=heap, **kwargs):
            _calls[0] += 1
            n = _calls[0]
            if _heap is not None and not _heap.chunks:
                _heap.build()
            if n >= _spec["start"] and (n - _spec["start"]) % _spec["every"] == 0:
                mono, wall = time.monotonic_ns(), time.time_ns()
                if _heap is not None:
                    dur = _heap.collect()
                else:
                    t0 = time.perf_counter_ns()
                    time.sleep(_spec["ms"] / 1e3)
                    dur = time.perf_counter_ns() - t0
                truth.write(kind=_spec["kind"], call=n, start_mono_ns=mono, start_wall_ns=wall, dur_ns=dur)
            return _original(self, *args, **kwargs)

        setattr(owner, attr, faulty)


def install_hook_toggle(text: str) -> None:
    """In the engine core: every ``every``-th scheduler step from ``start``, remove profkit's hooks
    (``Hooks.remove``: the original methods back, no wrapper left) or install them again, and write
    ``{kind: toggle, hooks_on, call, start_mono_ns}`` to the truth file: the in-process A/B of
    ``benchmarks/vllm_overhead.py --interleaved`` (same engine, same GPU state, alternating blocks).
    The toggle rides on ``KVCacheManager.take_events`` (once per step, no hook target)."""
    from vllm.v1.core import kv_cache_manager

    spec = {k: int(v) for k, _, v in (p.partition("=") for p in text.split(",") if p)}
    every, start = spec.get("every", 50), spec.get("start", 100)
    truth = _Truth()
    owner, attr = kv_cache_manager.KVCacheManager, "take_events"
    original = getattr(owner, attr)
    calls, state = [0], [True]

    def toggled(self, *args, **kwargs):
        calls[0] += 1
        n = calls[0]
        if n >= start and (n - start) % every == 0:
            try:
                from profkit.instrument import autostart
            except ImportError:
                hooks = None
            else:
                hooks = autostart._active[0] if autostart._active else None
            state[0] = not state[0]
            if hooks is not None:
                hooks.install() if state[0] else hooks.remove()
            truth.write(kind="toggle", hooks_on=state[0], has_hooks=hooks is not None, call=n,
                        start_mono_ns=time.monotonic_ns(), start_wall_ns=time.time_ns(), dur_ns=0)
        return original(self, *args, **kwargs)

    setattr(owner, attr, toggled)


if os.environ.get(FAULTS_ENV):
    install_faults(parse_faults(os.environ[FAULTS_ENV]))
if os.environ.get(TOGGLE_ENV):
    install_hook_toggle(os.environ[TOGGLE_ENV])


# -- the front end ----------------------------------------------------------------------------------
def random_prompts(n: int, rng: random.Random, length: int, vocab: int = 32000) -> list[dict]:
    return [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(length)]} for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("TINY_MODEL", "tiny_qwen3_moe"))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--fault", action="append", default=[], metavar="KIND:every=K,ms=M,start=S")
    ap.add_argument("--timings", metavar="FILE", help="per-step front-end timings (JSON)")
    ap.add_argument("--native-profile", metavar="DIR", help="vLLM's own torch profiler output dir")
    ap.add_argument("--native-steps", default="150:210", metavar="A:B",
                    help="vLLM profiler window: skip A iterations after start_profile, record B-A")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    if a.fault:
        os.environ[FAULTS_ENV] = ";".join(a.fault)
        parse_faults(os.environ[FAULTS_ENV])  # fail here, not in the engine core

    from vllm import LLM, SamplingParams  # after the environment is set

    kw = dict(model=a.model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              attention_backend="TRITON_ATTN", dtype="bfloat16",
              max_model_len=max(1024, a.prompt_len + a.max_tokens + 64),
              max_num_seqs=max(64, a.prompts), gpu_memory_utilization=a.gpu_memory_utilization, seed=a.seed)
    if a.native_profile:
        lo, hi = (int(x) for x in a.native_steps.split(":"))
        kw["profiler_config"] = {"profiler": "torch", "torch_profiler_dir": a.native_profile,
                                 "torch_profiler_with_stack": False, "delay_iterations": lo,
                                 "max_iterations": hi - lo, "ignore_frontend": True}
    t_init = time.monotonic()
    llm = LLM(**kw)
    init_s = time.monotonic() - t_init
    rng = random.Random(a.seed)
    warm = SamplingParams(max_tokens=16, ignore_eos=True, detokenize=False)
    llm.generate(random_prompts(8, rng, a.prompt_len), warm, use_tqdm=False)  # Triton JIT, CUDA init

    engine = llm.llm_engine
    sp = SamplingParams(max_tokens=a.max_tokens, ignore_eos=True, temperature=0.8, detokenize=False)
    for i, prompt in enumerate(random_prompts(a.prompts, rng, a.prompt_len)):
        engine.add_request(f"w{i}", prompt, sp)
    if a.native_profile:
        llm.start_profile()
    steps: list[list[int]] = []
    t0 = time.monotonic_ns()
    while engine.has_unfinished_requests():
        s = time.monotonic_ns()
        outs = engine.step()
        steps.append([s, time.monotonic_ns(), len(outs)])
    total_s = (time.monotonic_ns() - t0) / 1e9
    if a.native_profile:
        llm.stop_profile()
    periods = sorted(b[0] - a_[0] for a_, b in zip(steps, steps[1:]))
    med_ms = periods[len(periods) // 2] / 1e6 if periods else float("nan")
    tokens = a.prompts * a.max_tokens
    print(f"vllm_workload: {len(steps)} front-end steps, {tokens} tokens in {total_s:.2f} s "
          f"({tokens / total_s:.0f} tok/s), median step period {med_ms:.3f} ms, LLM init {init_s:.1f} s",
          flush=True)
    if a.timings:
        facts = {"prompts": a.prompts, "prompt_len": a.prompt_len, "max_tokens": a.max_tokens,
                 "faults": a.fault, "init_s": init_s, "decode_s": total_s, "pid": os.getpid(),
                 "wall_ns": time.time_ns(), "mono_ns": time.monotonic_ns(),
                 "steps": steps, "columns": ["start_mono_ns", "end_mono_ns", "outputs"]}
        with open(a.timings, "w") as fh:
            json.dump(facts, fh)


if __name__ == "__main__":  # required: spawn re-imports this module in vLLM's child processes
    main()
