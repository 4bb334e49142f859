"""What ``profkit capture`` (spans only, no profiler) costs a real vLLM engine, per serving step.

Run on the GPU machine inside the vLLM 0.26 bundle (``MODE=overhead bash scripts/vllm_device.sh``):

    python3 benchmarks/vllm_overhead.py --out results.json [--pairs 4] [--tokens 2000] [--skip 300]
    python3 benchmarks/vllm_overhead.py --interleaved --out inter.json [--tokens 2500 --block 50]
    python3 benchmarks/vllm_overhead.py --report results.json      # the table again, anywhere

Alternates whole runs of ``scripts/vllm_workload.py`` (a steady offline decode on the tiny MoE,
``--prompts`` requests x ``--tokens`` tokens, one engine iteration per front-end step) without
profkit and under ``profkit capture`` (the vLLM hook set in every process, NVTX ranges on, span
files written), plain first in even pairs and profkit first in odd ones, after one untimed run that
warms the Triton cache. The workload times every ``LLMEngine.step()`` from the front end itself, so
both sides are measured the same way and profkit's own records are not needed. Per run: the mean
and median step period over steps ``--skip``.. (warm-up excluded). The overhead is the mean over
pairs of (profkit / plain - 1) with a t interval over pairs, and also the difference of pooled
means. Independently, spans per step (from the capture's span files and manifest) times the cost
of one hooked call with NVTX (measured here, in this interpreter) bounds what the hooks can cost.

Whole runs differ from each other by more than the effect (GPU clocks, where the heap landed, the
order of the two runs: ~9% between the first and the second run of a pair on the H200), so
``--interleaved`` measures inside ONE engine instead: under ``profkit capture`` the engine-core
process removes profkit's hooks (``Hooks.remove``: the original methods back) and installs them
again every ``--block`` steps (``VLLM_WORKLOAD_HOOK_TOGGLE`` in ``scripts/vllm_workload.py``),
and the front end times every step as before. Each hooks-on block is compared with the mean of
the hooks-off blocks on either side (a slow drift of the step time, as the sequences grow,
cancels), two steps at each switch are dropped, and the overhead is the mean of those ratios with
a t interval over blocks. The same run without profkit (the toggle then switches nothing) is the
null control: its "overhead" must come out near 0. The front end's own hooks (about 1.4 of ~29
spans per step) stay on in both states; the whole-run pairs include them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


T95_BIG = 1.96


def t95(dof: int) -> float:
    return T95.get(dof, 2.09 if dof < 20 else 2.04 if dof < 30 else 2.02 if dof < 40 else T95_BIG)


def workload(args: argparse.Namespace, timings: Path, tokens: int) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "vllm_workload.py"), "--prompts", str(args.prompts),
            "--max-tokens", str(tokens), "--timings", str(timings)]


def one_run(args: argparse.Namespace, work: Path, label: str, profkit: bool, tokens: int,
            toggle: str | None = None) -> dict:
    timings = work / f"{label}.timings.json"
    cmd = workload(args, timings, tokens)
    if profkit:
        cmd = [sys.executable, "-m", "profkit.cli.capture", "-q", "-f", "-o", str(work / label), "--", *cmd]
    env = dict(os.environ)
    truth = work / f"{label}.truth"
    if toggle:
        env.update(VLLM_WORKLOAD_HOOK_TOGGLE=toggle, VLLM_WORKLOAD_TRUTH_DIR=str(truth))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout_s, env=env)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-3000:]}")
    data = json.loads(timings.read_text())
    starts = [s[0] for s in data["steps"]]
    periods = [(b - a) / 1e6 for a, b in zip(starts, starts[1:])][args.skip:]
    out = {"label": label, "profkit": profkit, "wall_s": wall, "init_s": data["init_s"],
           "decode_s": data["decode_s"], "steps": len(starts), "mean_ms": statistics.fmean(periods),
           "median_ms": statistics.median(periods), "periods_ms": [round(p, 4) for p in periods]}
    if profkit:
        out.update(span_counts(work / label, len(starts)))
    if toggle:
        toggles = [json.loads(line) for f in sorted(truth.glob("faults-pid*.jsonl")) for line in f.read_text().splitlines()]
        out["toggles"] = [t for t in toggles if t.get("kind") == "toggle"]
        out["step_starts_ns"] = starts
    print(f"{label}: {len(starts)} steps, mean {out['mean_ms']:.4f} ms, median {out['median_ms']:.4f} ms, "
          f"wall {wall:.1f} s", flush=True)
    return out


def span_counts(cap: Path, steps: int) -> dict:
    """Spans per front-end step, by process role, and the hook calls of the manifest."""
    from profkit.capture.spanscan import SpanFileState  # standard library only

    per_role: dict[str, int] = {}
    for path in sorted(cap.glob("spans-pid*.jsonl")):
        state = SpanFileState(path)
        while state.poll():
            pass
        role = str(state.header.get("role") or "unknown")
        per_role[role] = per_role.get(role, 0) + state.spans
    manifest = json.loads((cap / "manifest.json").read_text())
    hooks = manifest.get("hooks", {})
    calls = sum(e.get("calls", 0) for e in hooks.get("targets", {}).values())
    return {"spans_by_role": per_role, "spans_per_step": sum(per_role.values()) / max(steps, 1),
            "hook_calls": calls, "never_fired": hooks.get("never_fired", []),
            "vllm_tables": hooks.get("vllm_tables", [])}


def hooked_call_ns(iterations: int = 200_000, runs: int = 5) -> dict:
    """ns per hooked call (recorder + NVTX, no tool attached) and per plain call, in this interpreter."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import overhead as micro  # benchmarks/overhead.py

    hooked = [micro.decorated_call(True)(iterations) / iterations for _ in range(runs)]
    plain = [micro.plain_call(iterations) / iterations for _ in range(runs)]
    return {"hooked_ns": statistics.median(hooked), "plain_ns": statistics.median(plain),
            "net_ns": statistics.median(hooked) - statistics.median(plain)}


def report(res: dict) -> str:
    parts = []
    if res.get("interleaved"):
        parts.append(summarize_interleaved(res))
    if res.get("runs"):
        parts.append(summarize(res))
    return "\n\n".join(parts)


def summarize(res: dict) -> str:
    runs = res["runs"]
    pairs = [(p, q) for p, q in zip([r for r in runs if not r["profkit"]], [r for r in runs if r["profkit"]])]
    lines = ["| pair | plain mean ms | profkit mean ms | plain p50 ms | profkit p50 ms | profkit / plain - 1 |",
             "|---|---|---|---|---|---|"]
    ratios = []
    for i, (p, q) in enumerate(pairs):
        ratio = q["mean_ms"] / p["mean_ms"] - 1
        ratios.append(ratio)
        lines.append(f"| {i} | {p['mean_ms']:.4f} | {q['mean_ms']:.4f} | {p['median_ms']:.4f} | "
                     f"{q['median_ms']:.4f} | {ratio * 100:+.2f}% |")
    n = len(ratios)
    mean = statistics.fmean(ratios) if ratios else float("nan")
    half = T95.get(n - 1, 1.96) * statistics.stdev(ratios) / math.sqrt(n) if n > 1 else float("nan")
    plain_all = [x for p, _ in pairs for x in p["periods_ms"]]
    prof_all = [x for _, q in pairs for x in q["periods_ms"]]
    pooled = statistics.fmean(prof_all) / statistics.fmean(plain_all) - 1 if pairs else float("nan")
    spans = [q["spans_per_step"] for _, q in pairs if "spans_per_step" in q]
    micro = res.get("micro", {})
    sps = statistics.fmean(spans) if spans else float("nan")
    step_ms = statistics.fmean(plain_all) if plain_all else float("nan")
    bound = sps * micro.get("net_ns", float("nan")) / 1e6 / step_ms
    lines += [
        "",
        f"per-step overhead, mean over {n} pairs: {mean * 100:+.2f}% (95% interval "
        f"{(mean - half) * 100:+.2f}% .. {(mean + half) * 100:+.2f}%); pooled means: {pooled * 100:+.2f}%",
        f"spans per step (all processes): {sps:.1f}; hooked call with NVTX: {micro.get('net_ns', float('nan')):.0f} ns "
        f"net of a plain call -> {bound * 100:.3f}% of a {step_ms:.3f} ms step if every span sat on the critical path",
    ]
    if res["runs"] and res["runs"][-1].get("spans_by_role"):
        lines.append(f"spans by process role (last capture): {res['runs'][-1]['spans_by_role']}")
    return "\n".join(lines)


def interleaved_blocks(starts_ns: list[int], toggles: list[dict], skip: int, guard: int = 2) -> list[dict]:
    """Front-end step periods grouped into the blocks between hook toggles: [{on, periods_ms}].
    A period belongs to the state in force when it started; ``guard`` periods on each side of a
    switch are dropped (the switch lands inside some step, and the engine runs one step ahead of
    the front end's view of it), as are the first ``skip`` periods."""
    import bisect

    marks = sorted((t["start_mono_ns"], bool(t["hooks_on"])) for t in toggles)
    times = [m[0] for m in marks]
    blocks: list[dict] = []
    for i, (a, b) in enumerate(zip(starts_ns, starts_ns[1:])):
        if i < skip:
            continue
        k = bisect.bisect_right(times, a)  # toggles at or before this step's start
        if k == 0:
            continue  # before the first switch: warm-up, hooks in their initial state
        near = [abs(j - i) for j in _switch_steps(starts_ns, times[k - 1:k + 1])]
        if near and min(near) <= guard:
            continue
        if not blocks or blocks[-1]["switch"] != k:
            blocks.append({"switch": k, "on": marks[k - 1][1], "periods_ms": []})
        blocks[-1]["periods_ms"].append((b - a) / 1e6)
    return [b for b in blocks if len(b["periods_ms"]) >= 5]


def _switch_steps(starts_ns: list[int], times: list[int]) -> list[int]:
    import bisect

    return [bisect.bisect_right(starts_ns, t) - 1 for t in times]


def interleaved_summary(run: dict, skip: int) -> dict:
    """Each hooks-on block against the mean of the hooks-off blocks beside it (drift cancels)."""
    blocks = interleaved_blocks(run["step_starts_ns"], run.get("toggles", []), skip)
    means = [(b["on"], statistics.fmean(b["periods_ms"])) for b in blocks]
    ratios = []
    for i, (on, m) in enumerate(means):
        if not on:
            continue
        near = [means[j][1] for j in (i - 1, i + 1) if 0 <= j < len(means) and not means[j][0]]
        if near:
            ratios.append(m / statistics.fmean(near) - 1)
    n = len(ratios)
    mean = statistics.fmean(ratios) if ratios else float("nan")
    half = t95(n - 1) * statistics.stdev(ratios) / math.sqrt(n) if n > 1 else float("nan")
    on_all = [x for b in blocks if b["on"] for x in b["periods_ms"]]
    off_all = [x for b in blocks if not b["on"] for x in b["periods_ms"]]
    return {"label": run["label"], "profkit": run["profkit"], "blocks": len(blocks), "on_blocks": n,
            "on_steps": len(on_all), "off_steps": len(off_all),
            "on_mean_ms": statistics.fmean(on_all) if on_all else float("nan"),
            "off_mean_ms": statistics.fmean(off_all) if off_all else float("nan"),
            "overhead": mean, "lo": mean - half, "hi": mean + half, "ratios": ratios}


def summarize_interleaved(res: dict) -> str:
    pooled: list[dict] = []
    lines = ["| run | hooks toggled | blocks (on) | steps on / off | on mean ms | off mean ms | on / off - 1 (95% interval) |",
             "|---|---|---|---|---|---|---|"]
    for run in res["interleaved"]:
        s = interleaved_summary(run, res["args"]["skip"])
        if s["profkit"]:
            pooled.append(s)
        what = "profkit's (engine core)" if s["profkit"] else "none (no profkit: null control)"
        lines.append(f"| {s['label']} | {what} | {s['blocks']} ({s['on_blocks']}) | {s['on_steps']} / {s['off_steps']} | "
                     f"{s['on_mean_ms']:.4f} | {s['off_mean_ms']:.4f} | {s['overhead'] * 100:+.2f}% "
                     f"({s['lo'] * 100:+.2f}% .. {s['hi'] * 100:+.2f}%) |")
    if len(pooled) > 1:  # every on-block ratio of every profkit run, one interval
        ratios = [r for s in pooled for r in s["ratios"]]
        mean = statistics.fmean(ratios)
        half = t95(len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios))
        lines.append(f"| all profkit runs | profkit's (engine core) | ({len(ratios)}) | | | | "
                     f"{mean * 100:+.2f}% ({(mean - half) * 100:+.2f}% .. {(mean + half) * 100:+.2f}%) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4, help="plain/profkit pairs (fewer if --budget-s runs out)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=2000, help="tokens per request = engine steps per run")
    ap.add_argument("--skip", type=int, default=300, help="steps dropped at the start of each run")
    ap.add_argument("--budget-s", type=float, default=520.0, help="stop starting pairs after this")
    ap.add_argument("--run-timeout-s", type=float, default=240.0)
    ap.add_argument("--warmup-run", action="store_true", help="one untimed plain run first")
    ap.add_argument("--interleaved", action="store_true",
                    help="one profkit run whose engine core toggles the hooks every --block steps, "
                         "and the same run without profkit (null control); then the pairs, if --pairs")
    ap.add_argument("--block", type=int, default=16, help="steps per hooks-on / hooks-off block")
    ap.add_argument("--interleaved-runs", type=int, default=2, help="profkit runs with toggled hooks (plus one null control)")
    ap.add_argument("--out", metavar="JSON", help="write every run's numbers here")
    ap.add_argument("--report", metavar="JSON", help="print the table of an earlier --out and exit")
    args = ap.parse_args(argv)
    if args.report:
        print(report(json.loads(Path(args.report).read_text())))
        return 0
    t0 = time.monotonic()
    res: dict = {"args": vars(args), "runs": [], "host": os.uname().nodename}
    res["micro"] = hooked_call_ns()
    print(f"hooked call: {res['micro']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="vllm-overhead-") as tmp:
        work = Path(tmp)
        if args.warmup_run:  # fills the Triton cache on a fresh machine (each run also warms itself up)
            warm = one_run(args, work, "warmup", False, args.skip + 64)
            res["warmup"] = {k: v for k, v in warm.items() if k != "periods_ms"}
        if args.interleaved:
            toggle = f"every={args.block},start={args.skip}"
            res["interleaved"] = []
            order = [True, False] + [True] * (args.interleaved_runs - 1)  # the null control second
            for i, profkit in enumerate(order):
                res["interleaved"].append(one_run(args, work, f"interleaved{i}-{'profkit' if profkit else 'plain'}",
                                                  profkit, args.tokens, toggle=toggle))
                if args.out:
                    Path(args.out).write_text(json.dumps(res))
            print(summarize_interleaved(res), flush=True)
        pair_s = None
        for i in range(args.pairs):
            left = args.budget_s - (time.monotonic() - t0)
            if pair_s is not None and left < pair_s * 1.1:
                print(f"stopping after {i} pairs: {left:.0f} s left, a pair takes {pair_s:.0f} s", flush=True)
                break
            p0 = time.monotonic()
            order = (False, True) if i % 2 == 0 else (True, False)
            for profkit in order:
                res["runs"].append(one_run(args, work, f"pair{i}-{'profkit' if profkit else 'plain'}", profkit,
                                           args.tokens))
            pair_s = time.monotonic() - p0
            if args.out:
                Path(args.out).write_text(json.dumps(res))
    table = report(res)
    print(table, flush=True)
    if args.out:
        res["table"] = table
        Path(args.out).write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
