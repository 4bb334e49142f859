"""``profkit compare BASE CAND``: every headline metric with its change, a bootstrap interval and a
verdict; exit code 1 on a regression beyond the threshold, so CI can gate on it."""
from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from profkit.analyze.balance import DpCost
    from profkit.history.runs import RunData

EPILOG = """\
BASE and CAND are analysis folders (OUT of `profkit analyze -o OUT`) or runs in the history
database (--db): a label (the latest run with it) or #ID.

metrics: step time p50 and p90, GPU-only (GPU busy) time p50, gap (step - GPU busy) p50, each top
cause's time per step (cause_steps.csv or a recorded run gives it an interval; causes.csv alone
gives only the point change), worst-rank lateness per step (lateness.csv), straggler score
(stragglers.csv), EP balancedness (balance.csv). Intervals: 95% bootstrap over steps (all ranks of
a step resampled together), BASE and CAND resampled independently, seeded (--seed).

verdicts, for [lo, hi] the interval of the relative change and t the threshold:
  regressed     lo > +t for a lower-is-better metric (times), hi < -t for balancedness
  improved      the mirror image
  within noise  neither: the change is not beyond t at 95% confidence
  not judged    no per-step samples on one side (shown, never gates)
A step-level metric's change is relative to its own baseline value; a cause's (and lateness's)
is relative to the baseline's step time p50: what the cause costs a step. The overall verdict is
`regressed` if any metric regressed. Exit code 1 then, 2 on unusable input, else 0.

DP imbalance: when both folders have token counts per rank and step (dp_imbalance.csv), a
section follows the table: each side's DP balancedness (mean / max tokens per step), the change in
mean and median step time and in step time per token served, each with its bootstrap interval, and
the share of the change that cause_steps.csv charges to waiting for other ranks. For BASE a mirror
replay (every rank an identical copy of the requests) and CAND a lag replay of the same requests
(dealt out by a DP balancer), that change is what DP imbalance costs. It goes into --json
(`dp_imbalance`) and --dp-csv; without token counts the section says so and computes nothing. It
never changes the verdict or the exit code.

EP balance vs uniform routing: when both folders' balance.csv carry the uniform-routing baseline
(expert loads with known experts and top-k), a section gives each side's real balancedness, the
baseline, the recoverable gap (uniform - real) and the share of BASE's gap that CAND recovered,
with its interval (BASE = no expert balancing, CAND = EPLB on). --json `ep_balance`, --ep-csv.

Scaling: when the two runs have different rank counts (or with --scaling), the change of the mean
step time is split into GPU time + host overhead + waiting for other ranks, each with its
interval (cause_steps.csv charges the GPU-idle time of each step; see profkit.analyze.scaling).
--json `scaling`, --scaling-csv.

GPU-only vs serving (--gpu-only GPU_ONLY_OUT SERVING_OUT): BASE is a GPU-only run (the same
batches with no serving loop: the engine's --bench-forward, the simulator's --bench-forward,
vLLM's `bench forward`), CAND a serving run; steps are paired by batch shape (num_tokens,
batch_size; the nearest shape by tokens where none is equal) and the per-step gap is decomposed
into the serving run's causes plus the GPU-work difference. Only this section is printed; the
exit code is 0 (2 on unusable input). --json `gpu_only`, --gpu-only-csv.

impact: when both folders have impact.csv (what removing each cause would save, from profkit
analyze's what-if replay), a section lists the top causes of either run and the bounds (GPU-only,
straggler-free, spike-free) with each run's impact and the change, its 95% bootstrap interval from
impact_steps.csv, and larger / smaller / within noise. It goes into --json (`impact`) and never
changes the verdict or the exit code.

uses: gate CI on a nightly capture (`profkit compare last-good-nightly out/ --db runs.sqlite`);
price DP imbalance (`profkit compare mirror_out/ lag_out/ --dp-csv dp_imbalance_cost.csv`).
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="baseline vs candidate: changes, bootstrap intervals, verdict (exit 1 on regression)",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", metavar="BASE", help="baseline: analysis folder, or label / #ID in --db")
    p.add_argument("cand", metavar="CAND", help="candidate: analysis folder, or label / #ID in --db")
    p.add_argument("--threshold", default="5%", metavar="PCT", help="smallest change that counts (default 5%%)")
    p.add_argument("--db", default=os.environ.get("PROFKIT_HISTORY_DB"), metavar="FILE",
                   help="history database for labels (default $PROFKIT_HISTORY_DB)")
    p.add_argument("--seed", type=int, default=0, metavar="K", help="bootstrap seed (default 0: reproducible)")
    p.add_argument("--resamples", type=int, default=2000, metavar="N", help="bootstrap resamples (default 2000)")
    p.add_argument("--top-causes", type=int, default=5, metavar="N", help="compare the top N causes of each run (default 5)")
    p.add_argument("--json", metavar="OUT", help="also write the comparison as JSON")
    p.add_argument("--dp-csv", metavar="OUT", help="also write the DP-imbalance section as CSV (dp_imbalance_cost.csv)")
    p.add_argument("--ep-csv", metavar="OUT", help="also write the EP balance vs uniform section as CSV")
    p.add_argument("--scaling", action="store_true",
                   help="split the step-time change into GPU + host + waiting even when the rank counts are equal")
    p.add_argument("--scaling-csv", metavar="OUT", help="also write the scaling decomposition as CSV")
    p.add_argument("--gpu-only", action="store_true",
                   help="BASE is a GPU-only (bench-forward) run, CAND a serving run: pair steps by batch shape and "
                        "decompose the serving step's gap over the GPU-only time")
    p.add_argument("--gpu-only-csv", metavar="OUT", help="(--gpu-only) also write the decomposition as CSV")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the one-line verdict")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from profkit.analyze import compare as cmp
    from profkit.history import HistoryDB, RunError, SchemaError, resolve_run, samples_of

    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    try:
        threshold = cmp.parse_threshold(args.threshold)
        if args.resamples < 100:
            raise ValueError("--resamples: at least 100")
        needs_db = not (Path(args.base).is_dir() and Path(args.cand).is_dir())
        db = HistoryDB(args.db, create=False) if args.db and needs_db else None
        try:
            say(f"loading {args.base}")
            base = resolve_run(args.base, db)
            say(f"loading {args.cand}")
            cand = resolve_run(args.cand, db)
        finally:
            if db is not None:
                db.close()
    except (ValueError, RunError, SchemaError, sqlite3.Error) as exc:
        print(f"profkit compare: {exc}", file=sys.stderr)
        return 2
    for name, r in (("BASE", base), ("CAND", cand)):
        if not len(r.steps):
            print(f"profkit compare: {name} {r.source or r.name}: no steps to compare", file=sys.stderr)
            return 2
    if args.gpu_only:
        return _run_gpu_only(args, base, cand, say)
    say(f"bootstrapping ({args.resamples} resamples, seed {args.seed})")
    result = cmp.compare(samples_of(base), samples_of(cand), threshold=threshold, n_resamples=args.resamples,
                         seed=args.seed, top_causes=args.top_causes, base_name=base.name, cand_name=cand.name)
    dp = dp_cost(base, cand, n_resamples=args.resamples, seed=args.seed)
    from profkit.analyze.ep_recovery import ep_recovery, has_uniform
    from profkit.analyze.scaling import scaling_decomposition

    bb, cb = balance_table(base), balance_table(cand)
    ep = ep_recovery(bb, cb, n_resamples=args.resamples, seed=args.seed) \
        if ((has_uniform(bb) and has_uniform(cb)) or args.ep_csv) else None
    scaling = None
    if args.scaling or args.scaling_csv or base.n_ranks != cand.n_ranks:
        scaling = scaling_decomposition(base.steps, base.cause_steps, cand.steps, cand.cause_steps,
                                        n_resamples=args.resamples, seed=args.seed)
    impact = impact_change(base, cand, top=args.top_causes, n_resamples=args.resamples, seed=args.seed)
    if args.quiet:
        print(result.headline)
    else:
        print(render(result, base, cand, dp, ep=ep, scaling=scaling, impact=impact))
    if args.dp_csv:
        dp.to_frame().to_csv(args.dp_csv, index=False)
        say(f"wrote {args.dp_csv}")
    for path, section in ((args.ep_csv, ep), (args.scaling_csv, scaling)):
        if path and section is not None:
            section.to_frame().to_csv(path, index=False)
            say(f"wrote {path}")
    if args.json:
        doc = result.to_dict()
        doc["notes"] = {"base": base.notes, "candidate": cand.notes}
        doc["dp_imbalance"] = dp.to_dict()
        if ep is not None:
            doc["ep_balance"] = ep.to_dict()
        if scaling is not None:
            doc["scaling"] = scaling.to_dict()
        doc["impact"] = None if impact is None else [
            {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
            for row in impact.to_dict("records")]
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        say(f"wrote {args.json}")
    return 1 if result.regressed else 0


def render(result, base, cand, dp=None, ep=None, scaling=None, impact=None) -> str:
    """The comparison as a table that fits 120 columns, the impact, DP-imbalance, EP-balance and
    scaling sections (when given), then the verdict sentence (always the last line)."""
    from profkit.analyze import compare as cmp

    lines = [
        f"base {base.name}: {len(base.steps)} step samples, {base.n_ranks} rank(s)",
        f"cand {cand.name}: {len(cand.steps)} step samples, {cand.n_ranks} rank(s)",
        f"threshold {result.threshold:.0%}; {result.confidence:.0%} bootstrap intervals over steps "
        f"({result.n_resamples} resamples, seed {result.seed})",
        "",
        f"{'metric':40} {'base':>10} {'cand':>10} {'change':>10} {'change %':>9}  {'95% interval of change %':26} verdict",
    ]
    for c in result.changes:
        m = c.metric
        name = ("cause: " if m.source.startswith(cmp.CAUSE_PREFIX) else "") + m.label
        name = name if len(name) <= 40 else name[:39] + "~"
        lo, hi = c.rel_ci
        ci = f"[{cmp.fmt_pct(lo)}, {cmp.fmt_pct(hi)}]" if math.isfinite(lo) else "-"
        if m.relative_to == "step" and math.isfinite(lo):
            ci += " of step"
        verdict = c.verdict + (f" ({c.note})" if c.note else "")
        lines.append(f"{name:40} {_v(c.base, m.unit):>10} {_v(c.cand, m.unit):>10} {_v(c.delta, m.unit, signed=True):>10}"
                     f" {cmp.fmt_pct(c.rel):>9}  {ci:26} {verdict}")
    lines.append("(times in ms; a cause is its time per rank and step; % of a cause is of the base step time p50)")
    for who, r in (("base", base), ("cand", cand)):
        for note in r.notes:
            lines.append(f"note ({who}): {note}")
    if impact is not None:
        lines += ["", render_impact(impact)]
    if dp is not None:
        lines += ["", render_dp(dp)]
    if ep is not None and (ep.significant or not ep.available):  # an unchanged EP balance is in --json only
        lines += ["", render_ep(ep)]
    if scaling is not None:
        lines += ["", render_scaling(scaling)]
    lines += ["", result.headline]
    return "\n".join(lines)


def impact_tables(run: "RunData") -> "tuple[pd.DataFrame, pd.DataFrame | None] | None":
    """A run's ``impact.csv`` and ``impact_steps.csv`` from its analysis folder; None for a run from
    the history database or a folder without impact.csv."""
    import pandas as pd

    from profkit.history.runs import RunError, is_analysis_dir

    if run.run_id is not None or not run.source or not is_analysis_dir(run.source):
        return None
    path = Path(run.source) / "impact.csv"
    if not path.is_file():
        return None
    try:
        table = pd.read_csv(path)
        steps_path = Path(run.source) / "impact_steps.csv"
        steps = pd.read_csv(steps_path) if steps_path.is_file() else None
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: unreadable CSV: {exc}") from exc
    if not {"cause", "kind", "impact_ns_per_step"} <= set(table.columns):
        raise RunError(f"{path}: not an impact table (cause, kind, impact_ns_per_step needed)")
    if steps is not None and not {"cause", "step", "step_ns", "replayed_ns"} <= set(steps.columns):
        steps = None
    return table, steps


def impact_change(base: "RunData", cand: "RunData", top: int = 5, n_resamples: int = 2000,
                  seed: int = 0) -> "pd.DataFrame | None":
    """``compare.impact_changes`` of two analysis folders; None unless both have impact.csv."""
    from profkit.analyze.compare import impact_changes

    b, c = impact_tables(base), impact_tables(cand)
    if b is None or c is None:
        return None
    return impact_changes(b[0], b[1], c[0], c[1], top=top, n_resamples=n_resamples, seed=seed)


def render_impact(changes: "pd.DataFrame") -> str:
    """Impact per cause in both runs (the mean step drop without it) and its change."""
    if not len(changes):
        return "Impact (what-if replay): nothing to compare"
    lines = ["Impact (what-if replay): how much shorter the mean step would be without each cause",
             f"{'without':52} {'base':>9} {'cand':>9} {'change':>9}  {'95% interval':20} verdict"]
    for row in changes.to_dict("records"):
        name = str(row["cause"])
        name = name if len(name) <= 52 else name[:51] + "~"
        lo, hi = row["delta_lo_ns"], row["delta_hi_ns"]
        ci = f"[{lo / 1e6:+.3f}, {hi / 1e6:+.3f}]" if math.isfinite(lo) and math.isfinite(hi) else "-"
        lines.append(f"{name:52} {row['base_ns'] / 1e6:>9.3f} {row['cand_ns'] / 1e6:>9.3f}"
                     f" {row['delta_ns'] / 1e6:>+9.3f}  {ci:20} {row['change']}")
    lines.append("(ms per step; intervals: bootstrap over steps of the per-step drops in impact_steps.csv)")
    return "\n".join(lines)


def dp_tokens(run: "RunData") -> "pd.DataFrame | None":
    """A run's ``dp_imbalance.csv`` (tokens per rank and step), read from its analysis folder; None for
    a run from the history database (it keeps no token counts) or a folder without the file."""
    import pandas as pd

    from profkit.history.runs import RunError, is_analysis_dir

    if run.run_id is not None or not run.source or not is_analysis_dir(run.source):
        return None
    path = Path(run.source) / "dp_imbalance.csv"
    if not path.is_file():
        return None
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: unreadable CSV: {exc}") from exc
    needed = ["step", "total_tokens", "mean_tokens", "max_tokens", "balancedness"]
    if [c for c in needed if c not in df.columns]:
        return None
    return df.dropna(subset=["total_tokens", "max_tokens"])


def dp_cost(base: "RunData", cand: "RunData", n_resamples: int = 2000, seed: int = 0) -> "DpCost":
    """The DP-imbalance section for two runs (``balance.dp_imbalance_cost`` on their tables)."""
    from profkit.analyze.balance import dp_imbalance_cost

    return dp_imbalance_cost(base.steps, dp_tokens(base), cand.steps, dp_tokens(cand),
                             base.cause_steps, cand.cause_steps, n_resamples=n_resamples, seed=seed)


def render_dp(dp: "DpCost") -> str:
    """The DP-imbalance section: balancedness per side, step-time changes with intervals, waits."""
    if not dp.available:
        return dp.headline
    b, c = dp.sides["base"], dp.sides["cand"]
    pct = f"{dp.confidence:.0%}"
    lines = [
        "DP imbalance: BASE = mirror replay, CAND = lag (or round-robin) replay of the same requests",
        f"({b['n_steps']} and {c['n_steps']} steps with token counts per rank; intervals "
        f"{'paired by step' if dp.paired else 'over steps, sides resampled independently'})",
        f"{'':40} {'base':>10} {'cand':>10} {'change':>10}  {pct} interval of change",
        f"{'DP balancedness, mean (mean/max tokens)':40} {b['balancedness_mean']:>10.3f}"
        f" {c['balancedness_mean']:>10.3f} {c['balancedness_mean'] - b['balancedness_mean']:>+10.3f}",
        f"{'DP balancedness, worst step':40} {b['balancedness_min']:>10.3f} {c['balancedness_min']:>10.3f}",
        f"{'steps with balancedness < 1':40} {b['steps_unbalanced']:>10} {c['steps_unbalanced']:>10}",
        f"{'padding share (1 - sum mean / sum max)':40} {100 * b['padding_share']:>9.1f}%"
        f" {100 * c['padding_share']:>9.1f}%",
        f"{'tokens served per step (all ranks)':40} {b['tokens_per_step']:>10.0f} {c['tokens_per_step']:>10.0f}",
    ]
    titles = {"step_ns_mean": ("step time, mean (ms)", 1e6, 3), "step_ns_p50": ("step time, p50 (ms)", 1e6, 3),
              "step_ns_per_token": ("step time per token served (ns)", 1.0, 0),
              "wait_ns_mean": ("waiting for other ranks (ms/rank/step)", 1e6, 3),
              "throughput": ("throughput (tokens served / s)", 1.0, 0)}
    for m in dp.metrics:
        if m.metric not in titles:
            continue
        title, scale, digits = titles[m.metric]
        if not math.isfinite(m.base) or not math.isfinite(m.cand):
            lines.append(f"{title:40} {'-':>10} {'-':>10}")
            continue
        lo, hi = m.delta_ci
        ci = f"[{lo / scale:+.{digits}f}, {hi / scale:+.{digits}f}]" if math.isfinite(lo) else "-"
        rel = f" ({cmp_pct(m.rel)})" if math.isfinite(m.rel) else ""
        tail = ""
        if m.metric == "wait_ns_mean" and math.isfinite(dp.wait_share):
            tail = f" = {100 * dp.wait_share:.0f}% of the mean step-time change"
        lines.append(f"{title:40} {m.base / scale:>10.{digits}f} {m.cand / scale:>10.{digits}f}"
                     f" {m.delta / scale:>+10.{digits}f}  {ci + rel:26}{tail}".rstrip())
    for note in dp.notes:
        lines.append(f"note: {note}")
    lines.append(dp.headline)
    return "\n".join(lines)


def cmp_pct(x: float) -> str:
    from profkit.analyze import compare as cmp

    return cmp.fmt_pct(x)


def _v(x: float, unit: str, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if unit == "ratio":
        return f"{x:+.3f}" if signed else f"{x:.3f}"
    return f"{x / 1e6:+.3f}" if signed else f"{x / 1e6:.3f}"


# ---- the study's other measurements: EP balance vs uniform, scaling, GPU-only vs serving ----------
def _analysis_csv(run: "RunData", name: str) -> "pd.DataFrame | None":
    """A CSV of a run's analysis folder read whole (None for a history run or a missing file)."""
    import pandas as pd

    from profkit.history.runs import RunError, is_analysis_dir

    if run.run_id is not None or not run.source or not is_analysis_dir(run.source):
        return None
    path = Path(run.source) / name
    if not path.is_file():
        return None
    try:
        return pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: unreadable CSV: {exc}") from exc


def balance_table(run: "RunData") -> "pd.DataFrame | None":
    """balance.csv with every column (the uniform baseline included)."""
    return _analysis_csv(run, "balance.csv")


def render_ep(ep) -> str:
    if not ep.available:
        return ep.headline
    lines = ["EP balance vs uniform routing: BASE = no expert balancing, CAND = balanced (e.g. EPLB)",
             f"({ep.n_steps[0]} and {ep.n_steps[1]} steps; per step the mean over MoE layers)",
             f"{'':40} {'base':>10} {'cand':>10} {'change':>10}  {ep.confidence:.0%} interval of change"]
    f = ep.to_frame().set_index("metric")
    for metric, title in (("balancedness", "balancedness (mean / max rank load)"),
                          ("uniform_balancedness", "uniform routing, same batches"),
                          ("recoverable_gap", "recoverable gap (uniform - real)")):
        r = f.loc[metric]
        ci = f"[{r['delta_lo']:+.3f}, {r['delta_hi']:+.3f}]" if math.isfinite(r["delta_lo"]) else ""
        lines.append(f"{title:40} {r['base']:>10.3f} {r['cand']:>10.3f} {r['delta']:>+10.3f}  {ci}".rstrip())
    r = f.loc["recovered_share"]
    if math.isfinite(r["cand"]) and ep.significant:
        ci = f"[{100 * r['delta_lo']:.0f}%, {100 * r['delta_hi']:.0f}%]" if math.isfinite(r["delta_lo"]) else ""
        lines.append(f"{'share of the gap recovered':40} {'':>10} {100 * r['cand']:>9.0f}% {'':>10}  {ci}".rstrip())
    lines += [f"note: {n}" for n in ep.notes] + [ep.headline]
    return "\n".join(lines)


def render_scaling(sc) -> str:
    if not sc.available:
        return sc.headline
    from profkit.analyze.scaling import TITLES

    lines = [f"Scaling: BASE {sc.n_ranks[0]} ranks -> CAND {sc.n_ranks[1]} ranks; mean per rank and step "
             f"({sc.n_steps[0]} and {sc.n_steps[1]} steps; intervals over steps, sides resampled independently)",
             f"{'(ms)':40} {'base':>10} {'cand':>10} {'change':>10}  {sc.confidence:.0%} interval  share of change"]
    for p in sc.parts:
        lo, hi = p.delta_ci
        ci = f"[{lo / 1e6:+.3f}, {hi / 1e6:+.3f}]" if math.isfinite(lo) else "-"
        share = f"{100 * p.share:+.0f}%" if math.isfinite(p.share) and p.part != "step_ns" else ""
        title = ("= " if p.part == "step_ns" else "  + ") + TITLES[p.part]
        lines.append(f"{title:40} {_v(p.base, 'ns'):>10} {_v(p.cand, 'ns'):>10} {_v(p.delta, 'ns', True):>10}  "
                     f"{ci:20} {share}".rstrip())
    lines += [f"note: {n}" for n in sc.notes] + [sc.headline]
    return "\n".join(lines)


def _run_gpu_only(args, base: "RunData", cand: "RunData", say) -> int:
    from profkit.analyze.gpu_only import gpu_only_gap

    shaped = [_analysis_csv(r, "steps.csv") for r in (base, cand)]
    for name, r, df in (("GPU_ONLY", base, shaped[0]), ("SERVING", cand, shaped[1])):
        if df is None:
            print(f"profkit compare: --gpu-only: {name} {r.source or r.name}: needs an analysis folder "
                  "(steps.csv with num_tokens and batch_size)", file=sys.stderr)
            return 2
    say(f"pairing {len(cand.steps)} serving steps with {len(base.steps)} GPU-only steps by batch shape")
    gap = gpu_only_gap(shaped[0], shaped[1], cand.cause_steps, n_resamples=args.resamples, seed=args.seed)
    print(gap.headline if args.quiet else render_gpu_only(gap, base, cand))
    if args.gpu_only_csv:
        gap.to_frame().to_csv(args.gpu_only_csv, index=False)
        say(f"wrote {args.gpu_only_csv}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu_only": gap.to_dict(), "gpu_only_run": base.name, "serving_run": cand.name}, fh, indent=2)
            fh.write("\n")
        say(f"wrote {args.json}")
    return 0 if gap.available else 2


def render_gpu_only(gap, base, cand) -> str:
    if not gap.available:
        return gap.headline
    pr = gap.pairing
    lines = [f"GPU-only vs serving: GPU_ONLY = {base.name} ({pr['gpu_only_steps']} steps, {pr['gpu_only_shapes']} batch shapes), "
             f"SERVING = {cand.name}",
             f"pairing by (num_tokens, batch_size): {pr['exact']} serving steps exact, {pr['nearest']} nearest by tokens, "
             f"{pr['unpaired']} unpaired",
             f"{'(ms per step, mean over ranks and steps)':48} {'mean':>9}  {gap.confidence:.0%} interval      share of gap",
             f"{'serving step time':48} {gap.serving_ns / 1e6:>9.3f}",
             f"{'GPU-only step time of the same shapes':48} {gap.gpu_only_ns / 1e6:>9.3f}",
             f"{'gap (serving - GPU-only)':48} {gap.gap_ns / 1e6:>9.3f}  [{gap.gap_ci[0] / 1e6:.3f}, {gap.gap_ci[1] / 1e6:.3f}]"]
    if gap.parts:
        lines.append("  = the serving step's charged causes (cause_steps.csv) + the GPU-work difference:")
    for p in gap.parts:
        name = p["part"] if len(p["part"]) <= 44 else p["part"][:43] + "~"
        lines.append(f"  + {name:44} {p['mean_ns'] / 1e6:>+9.3f}  [{p['lo_ns'] / 1e6:+.3f}, {p['hi_ns'] / 1e6:+.3f}]"
                     f"   {100 * p['share_of_gap']:+.0f}%")
    lines += [f"note: {n}" for n in gap.notes] + [gap.headline]
    return "\n".join(lines)
