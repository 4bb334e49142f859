"""Cost of profkit's instrumentation: ns per span, and step-time overhead on the bundled engine.

    python benchmarks/overhead.py [--iterations N] [--runs R] [--engine-runs K] [--no-engine]

Part 1, ns per span pair (enter + exit), all variants interleaved in one process, median of runs:
bare loop (baseline), ``with profkit.span`` recorder only (``PROFKIT_NVTX=0``), recorder + NVTX
with no tool attached, recorder writing a file (writer thread on), a decorated (= hooked)
function vs a plain call, and nvtx's own ``annotate`` / pre-built ``Domain.push_range`` for
comparison. "net" subtracts the bare loop (or the plain call for the decorator rows).

Part 2, the bundled engine on CPU (4 Gloo ranks), every hook of the engine set on (bootstrap +
``PROFKIT_CAPTURE=1``) vs off, runs alternating; median step time over ranks and steps (first
steps dropped as warm-up), and the spans recorded per step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import profkit.instrument as pi  # noqa: E402
from profkit.instrument import api  # noqa: E402
from profkit.instrument.recorder import Recorder, use_recorder  # noqa: E402

Loop = Callable[[int], int]  # runs n iterations, returns elapsed ns


def _set_nvtx(on: bool) -> None:
    os.environ["PROFKIT_NVTX"] = "1" if on else "0"
    api.reset_caches()


def bare(n: int) -> int:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        pass
    return time.perf_counter_ns() - t0


def span_loop(nvtx_on: bool) -> Loop:
    def run(n: int) -> int:
        _set_nvtx(nvtx_on)
        span = pi.span
        t0 = time.perf_counter_ns()
        for _ in range(n):
            with span("bench"):
                pass
        return time.perf_counter_ns() - t0

    return run


def file_loop(out_dir: str) -> Loop:
    rec = Recorder(out_dir)  # default buffer and periodic flush: what a capture runs with

    def run(n: int) -> int:
        _set_nvtx(False)
        previous = use_recorder(rec)
        try:
            return span_loop(False)(n)
        finally:
            use_recorder(previous)

    run.recorder = rec  # type: ignore[attr-defined]
    return run


def plain_call(n: int) -> int:
    def f(x):
        return x

    t0 = time.perf_counter_ns()
    for i in range(n):
        f(i)
    return time.perf_counter_ns() - t0


def decorated_call(nvtx_on: bool) -> Loop:
    def run(n: int) -> int:
        _set_nvtx(nvtx_on)

        @pi.span("bench.fn")
        def f(x):
            return x

        t0 = time.perf_counter_ns()
        for i in range(n):
            f(i)
        return time.perf_counter_ns() - t0

    return run


def nvtx_annotate(n: int) -> int:
    import nvtx

    t0 = time.perf_counter_ns()
    for _ in range(n):
        with nvtx.annotate("bench", domain="profkit-bench"):
            pass
    return time.perf_counter_ns() - t0


def nvtx_domain_push(n: int) -> int:
    import nvtx

    domain = nvtx.get_domain("profkit-bench")
    attr = domain.get_event_attributes(message="bench")
    push, pop = domain.push_range, domain.pop_range
    t0 = time.perf_counter_ns()
    for _ in range(n):
        push(attr)
        pop()
    return time.perf_counter_ns() - t0


def span_costs(iterations: int, runs: int) -> list[tuple[str, float, float]]:
    """[(variant, median ns per iteration, net ns)], variants interleaved run by run."""
    memory = Recorder(flush_interval_s=0)
    previous = use_recorder(memory)
    tmp = tempfile.mkdtemp(prefix="profkit-bench-")
    variants: dict[str, Loop] = {
        "bare loop (baseline)": bare,
        "profkit.span, recorder only": span_loop(False),
        "profkit.span, recorder + NVTX (no tool)": span_loop(True),
        "profkit.span, recorder -> file (writer on)": file_loop(tmp),
        "plain function call (baseline)": plain_call,
        "hooked/decorated call, recorder only": decorated_call(False),
        "hooked/decorated call, recorder + NVTX": decorated_call(True),
    }
    try:
        import nvtx  # noqa: F401

        variants["nvtx.annotate (new object each time)"] = nvtx_annotate
        variants["nvtx Domain.push_range/pop_range"] = nvtx_domain_push
    except ImportError:
        pass
    samples: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for _ in range(runs):
            for name, loop in variants.items():
                samples[name].append(loop(iterations) / iterations)
    finally:
        use_recorder(previous)
        variants["profkit.span, recorder -> file (writer on)"].recorder.close()  # type: ignore[attr-defined]
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = []
    for name, ns in med.items():
        if "call" in name and "baseline" not in name:
            base = med["plain function call (baseline)"]
        elif "baseline" in name:
            base = 0.0
        else:
            base = med["bare loop (baseline)"]
        rows.append((name, ns, ns - base))
    return rows


# -- part 2: the bundled engine -------------------------------------------------------------------
def engine_run(out: Path, ranks: int, steps: int, hooks_on: bool) -> list[int]:
    from profkit.instrument.autostart import capture_env

    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFKIT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if hooks_on:
        env = capture_env(str(out / "spans"), hook_sets=["engine"], base=env)
    cmd = [sys.executable, "-m", "profkit.engine", "--ranks", str(ranks), "--steps", str(steps),
           "--out", str(out / "steps")]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"engine failed ({'hooks on' if hooks_on else 'hooks off'}): {proc.stderr[-2000:]}")
    warmup = min(5, steps // 3)
    step_ns = []
    for r in range(ranks):
        lines = (out / "steps" / f"rank{r}.steps.jsonl").read_text().splitlines()
        step_ns += [json.loads(line)["step_ns"] for line in lines[warmup:]]
    return step_ns


def count_spans(folder: Path) -> int:
    """Spans in a capture's span files (plain json: runs where orjson is missing too)."""
    n = 0
    for path in folder.glob("spans-pid*.jsonl"):
        for line in path.read_text().splitlines():
            if '"spans"' in line:
                n += len(json.loads(line)["spans"])
    return n


def engine_overhead(runs: int, ranks: int, steps: int) -> dict[str, float]:
    on: list[float] = []
    off: list[float] = []
    spans_per_step = 0.0
    with tempfile.TemporaryDirectory(prefix="profkit-engine-bench-") as tmp:
        for i in range(runs):
            for hooks_on in ((False, True) if i % 2 == 0 else (True, False)):  # alternate the order
                out = Path(tmp) / f"run{i}-{'on' if hooks_on else 'off'}"
                samples = engine_run(out, ranks, steps, hooks_on)
                (on if hooks_on else off).append(statistics.median(samples))
                if hooks_on:
                    spans_per_step = count_spans(out / "spans") / (ranks * steps)
    off_ms, on_ms = statistics.median(off) / 1e6, statistics.median(on) / 1e6
    return {"off_ms": off_ms, "on_ms": on_ms, "overhead_pct": (on_ms - off_ms) / off_ms * 100,
            "spans_per_step": spans_per_step, "runs": runs, "ranks": ranks, "steps": steps,
            "off_runs_ms": [x / 1e6 for x in off], "on_runs_ms": [x / 1e6 for x in on]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--engine-runs", type=int, default=3, help="hooks-on/off pairs (0: skip)")
    ap.add_argument("--engine-ranks", type=int, default=4)
    ap.add_argument("--engine-steps", type=int, default=40)
    ap.add_argument("--no-engine", action="store_true")
    args = ap.parse_args(argv)

    rows = span_costs(args.iterations, args.runs)
    width = max(len(r[0]) for r in rows)
    print(f"ns per span pair / call: median of {args.runs} runs x {args.iterations} iterations, "
          f"python {sys.version.split()[0]}")
    print(f"{'variant':<{width}}  {'ns/iter':>8}  {'net ns':>8}")
    for name, ns, net in rows:
        print(f"{name:<{width}}  {ns:8.1f}  {net:8.1f}")

    if args.no_engine or args.engine_runs <= 0:
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("\nbundled engine: skipped (torch is not installed)")
        return 0
    res = engine_overhead(args.engine_runs, args.engine_ranks, args.engine_steps)
    hooked_ns = next(net for name, _, net in rows if name == "hooked/decorated call, recorder + NVTX")
    print(f"\nbundled engine, CPU, {res['ranks']} ranks x {res['steps']} steps, {res['runs']} runs each, alternating:")
    print(f"{'hooks':<6}  {'median step ms':>14}  runs (ms)")
    print(f"{'off':<6}  {res['off_ms']:14.3f}  {', '.join(f'{x:.3f}' for x in res['off_runs_ms'])}")
    print(f"{'on':<6}  {res['on_ms']:14.3f}  {', '.join(f'{x:.3f}' for x in res['on_runs_ms'])}")
    spread = (max(res["off_runs_ms"]) - min(res["off_runs_ms"])) / res["off_ms"] * 100
    estimate = res["spans_per_step"] * hooked_ns / (res["off_ms"] * 1e6) * 100
    print(f"measured overhead {res['overhead_pct']:+.2f}% of step time (run-to-run spread with hooks off: "
          f"{spread:.1f}%); {res['spans_per_step']:.1f} spans per rank-step x {hooked_ns:.0f} ns = "
          f"{estimate:.3f}% estimated")
    print(f"cores: {os.cpu_count()} (ranks beyond the cores make the measured number mostly noise)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
