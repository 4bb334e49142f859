"""``profkit capture``: set up, run the command, stop it cleanly, post-process, write the manifest."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import STATUS_DIR
from . import manifest as mf
from . import nsys as nsys_post
from . import pyspy as pyspy_post
from . import tools
from .environment import build_env
from .process import Child, become_subreaper
from .progress import Progress, count_outputs
from .spanscan import SpanScan

POLL_S = 0.25
PROGRESS_S = 1.0
DEFAULT_TORCH_STEPS = (10, 30)
NSYS_GRACE_S = 30.0  # nsys must write its report after the ranks stop: give it time before SIGTERM
#: files and folders a capture writes (``--force`` removes only these)
OWNED = ("manifest.json", "spans-pid*.jsonl", "torch", "nsys", "pyspy", STATUS_DIR)
_TORCH_NAME = re.compile(r"^(?:rank(\d+)-)?pid(\d+)\.")


class CaptureError(RuntimeError):
    """A problem with the request itself (bad flags, missing tool, unusable folder)."""


@dataclass
class CaptureOptions:
    command: list[str]
    out_dir: Path
    torch: bool = False
    nsys: bool = False
    pyspy: bool = False
    steps: tuple[int, int] | None = None
    hooks: list[str] | None = None
    force: bool = False
    quiet: bool = False
    grace_s: float | None = None
    pyspy_rate: int = 100
    nsys_args: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """What will run: the wrapped command, its environment, and the backends' facts so far."""

    argv: list[str]
    env: dict[str, str]
    backends: dict[str, dict[str, Any]]
    nsys: str | None = None
    pyspy: str | None = None
    notes: list[str] = field(default_factory=list)


def parse_steps(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    try:
        start, stop = int(a), int(b)
    except ValueError:
        raise CaptureError(f"--steps {text!r}: expected A:B (step numbers)") from None
    if not sep or start < 0 or stop <= start:
        raise CaptureError(f"--steps {text!r}: expected A:B with 0 <= A < B")
    return start, stop


def prepare_dir(out_dir: Path, force: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise CaptureError(f"-o {out_dir}: exists and is not a folder")
    owned = [p for pattern in OWNED for p in out_dir.glob(pattern)] if out_dir.is_dir() else []
    if owned and not force:
        raise CaptureError(f"-o {out_dir}: already holds a capture ({owned[0].name}, ...); "
                           "choose another folder or pass --force to replace it")
    for path in owned:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)


def plan(opts: CaptureOptions) -> Plan:
    """Check the request, find the tools, build the command and environment (raises CaptureError)."""
    if not opts.command:
        raise CaptureError("no command: usage: profkit capture [options] -- CMD [ARGS...]")
    if opts.torch and opts.nsys:
        raise CaptureError("--torch and --nsys in one run: only one CUPTI client can attach; capture them "
                           "in two runs")
    if opts.steps and not (opts.torch or opts.nsys):
        raise CaptureError("--steps A:B sets the torch.profiler / nsys window: use it with --torch or --nsys")
    notes: list[str] = []
    torch_steps = None
    if opts.torch:
        torch_steps = opts.steps or DEFAULT_TORCH_STEPS
        if not opts.steps:
            notes.append(f"--torch without --steps: profiling steps {torch_steps[0]}:{torch_steps[1]}")
    out = opts.out_dir.resolve()
    env = build_env(str(out), torch_steps=torch_steps, cuda_steps_window=opts.steps if opts.nsys else None,
                    hook_sets=opts.hooks)
    argv = list(opts.command)
    backends: dict[str, dict[str, Any]] = {
        "profkit_spans": {"used": True, "hooks": opts.hooks or os.environ.get("PROFKIT_HOOKS", "vllm,engine").split(",")},
        "torch": {"used": opts.torch, "steps": list(torch_steps) if torch_steps else None,
                  "env": f"PROFKIT_TORCH_STEPS={torch_steps[0]}:{torch_steps[1]}" if torch_steps else None},
    }
    result = Plan(argv, env, backends, notes=notes)
    if opts.nsys:
        try:
            result.nsys = tools.find_nsys()
        except tools.ToolMissing as exc:
            raise CaptureError(str(exc)) from None
        wrapped = tools.nsys_command(result.nsys, str(out / "nsys" / "report"), argv, window=bool(opts.steps),
                                     extra=opts.nsys_args)
        backends["nsys"] = {"used": True, "binary": result.nsys, "steps": list(opts.steps) if opts.steps else None,
                            "command": wrapped[:len(wrapped) - len(argv)],
                            "env": f"PROFKIT_CUDA_PROFILER_STEPS={opts.steps[0]}:{opts.steps[1]}" if opts.steps else None}
        argv = wrapped
    if opts.pyspy:
        try:
            result.pyspy = tools.find_pyspy()
            problem = tools.pyspy_preflight(result.pyspy)
        except tools.ToolMissing as exc:
            problem = str(exc)
        if problem:
            backends["pyspy"] = {"used": False, "skipped": problem}
            notes.append(f"--pyspy skipped: {problem}")
            result.pyspy = None
        else:
            raw = out / "pyspy" / pyspy_post.RAW_NAME
            argv = tools.pyspy_command(result.pyspy, str(raw), argv, opts.pyspy_rate)
            backends["pyspy"] = {"used": True, "binary": result.pyspy, "rate_hz": opts.pyspy_rate}
    result.argv = argv
    return result


def _anchor() -> dict[str, int]:
    return {"wall_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns()}


def _install_handlers(pending: list[int]) -> dict[int, Any]:
    """Our own SIGINT/SIGTERM/SIGHUP only queue the signal: the loop forwards it."""
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
    return previous


def run_child(child: Child, progress: Progress, pending: list[int]) -> int | None:
    """Run until the main process exits; returns the first signal that interrupted us, if any."""
    interrupted: int | None = None
    last_progress = 0.0
    while child.poll() is None:
        while pending:
            signum = pending.pop(0)
            interrupted = interrupted or signum
            sig = child.escalate(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
            if sig is not None:
                progress.say(f"{signal.Signals(signum).name} received: sent {sig.name} to the command's processes"
                             + (f"; {child.next_at - time.monotonic():.0f} s before the next signal"
                                if child.next_at else "") + " (Ctrl-C again to hurry)")
        escalated = child.tick()
        if escalated is not None:
            progress.say(f"still running: sent {escalated.name}")
        now = time.monotonic()
        if now - last_progress >= PROGRESS_S:
            progress.update()
            last_progress = now
        time.sleep(POLL_S)
    return interrupted


def torch_files(out_dir: Path, pid_rank: dict[int, int]) -> dict[int, list[str]]:
    by_rank: dict[int, list[str]] = {}
    for path in sorted((out_dir / "torch").glob("*.pt.trace.json*")):
        m = _TORCH_NAME.match(path.name)
        rank = None
        if m:
            rank = int(m.group(1)) if m.group(1) is not None else pid_rank.get(int(m.group(2)))
        if rank is not None:
            by_rank.setdefault(rank, []).append(str(path.relative_to(out_dir)))
    return by_rank


def run_capture(opts: CaptureOptions) -> int:
    """The whole capture; returns the exit status for the shell: the command's, or 128 + the signal
    that interrupted profkit capture (130 for Ctrl-C)."""
    the_plan = plan(opts)
    prepare_dir(opts.out_dir, opts.force)
    out = opts.out_dir.resolve()
    for backend in ("nsys", "pyspy"):
        if the_plan.backends.get(backend, {}).get("used"):
            (out / backend).mkdir(exist_ok=True)
    scan = SpanScan(out)
    progress = Progress(scan, out, opts.quiet)
    for note in the_plan.notes:
        progress.say(note)
    progress.say(f"writing to {out}; running: {shlex.join(the_plan.argv)}")
    subreaper = become_subreaper()
    grace = opts.grace_s if opts.grace_s is not None else (NSYS_GRACE_S if opts.nsys else 5.0)
    child = Child(the_plan.argv, the_plan.env, grace_s=grace)
    pending: list[int] = []
    previous = _install_handlers(pending)
    start = _anchor()
    try:
        try:
            child.start()
        except OSError as exc:
            raise CaptureError(f"cannot run {the_plan.argv[0]!r}: {exc.strerror or exc}") from None
        interrupted = run_child(child, progress, pending)
        returncode = child.poll()
        end = _anchor()
        progress.update(final=True)
        progress.end_line()
        leftovers = child.stop_leftovers()
        if leftovers:
            progress.say(f"stopped {len(leftovers)} process(es) the command left running: {leftovers}")
        child.leftovers = leftovers
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return finish(opts, the_plan, out, scan, progress, child, returncode, interrupted, start, end, subreaper)


def finish(opts: CaptureOptions, the_plan: Plan, out: Path, scan: SpanScan, progress: Progress, child: Child,
           returncode: int | None, interrupted: int | None, start: dict[str, int], end: dict[str, int],
           subreaper: bool) -> int:
    """Post-process (nsys export, py-spy split), write the manifest, print the summary."""
    scan.poll()
    pid_rank = {s.pid: s.rank for s in scan.processes() if s.pid is not None and s.rank is not None}
    backends = the_plan.backends
    rank_files = torch_files(out, pid_rank)
    backends["torch"]["files"] = sorted(f for files in rank_files.values() for f in files)
    if the_plan.nsys:
        progress.say("exporting the nsys report to SQLite ... (Ctrl-C skips it)")
        try:
            facts = nsys_post.export_sqlite(the_plan.nsys, out / "nsys" / "report")
        except KeyboardInterrupt:
            report = nsys_post.find_report(out / "nsys" / "report")
            facts = {"report": str(report) if report else None, "sqlite": None,
                     "error": "nsys export interrupted (Ctrl-C): run 'nsys export --type sqlite' on the report"}
        backends["nsys"].update({k: (str(Path(v).relative_to(out)) if k in ("report", "sqlite") and v else v)
                                 for k, v in facts.items()})
        if facts["sqlite"]:
            for rank in pid_rank.values():
                rank_files.setdefault(rank, []).append(str(Path(facts["sqlite"]).relative_to(out)))
        if facts["error"]:
            progress.say(facts["error"])
    if the_plan.pyspy:
        facts = pyspy_post.split_by_rank(out / "pyspy" / pyspy_post.RAW_NAME, pid_rank, start["wall_ns"])
        backends["pyspy"].update(anchor=start, **{k: v for k, v in facts.items() if k not in ("files", "raw")},
                                 raw=str(Path(facts["raw"]).relative_to(out)) if facts["raw"] else None,
                                 files={r: str(Path(p).relative_to(out)) for r, p in facts["files"].items()})
        for rank, path in facts["files"].items():
            rank_files.setdefault(rank, []).append(str(Path(path).relative_to(out)))
        if facts["error"]:
            progress.say(facts["error"])
    exit_facts = mf.exit_facts(returncode, interrupted is not None, child.signals_sent)
    exit_facts["leftovers_stopped"] = child.leftovers
    statuses = mf.read_statuses(out)
    ranks, unranked = mf.rank_records(scan, statuses, out, exit_facts["status"] == 0, rank_files)
    manifest = {
        "command": opts.command, "command_line": shlex.join(opts.command), "wrapped_command": the_plan.argv,
        "cwd": os.getcwd(), "host": socket.gethostname(), "exit": exit_facts,
        "start": start, "end": end, "duration_s": round((end["monotonic_ns"] - start["monotonic_ns"]) / 1e9, 3),
        "options": {"torch": opts.torch, "nsys": opts.nsys, "pyspy": opts.pyspy,
                    "steps": list(opts.steps) if opts.steps else None, "hooks": opts.hooks},
        "backends": backends, "tools": tools.versions(the_plan.nsys, the_plan.pyspy),
        "clock": {"spans": "CLOCK_MONOTONIC per process, placed by (wall_ns, mono_ns) anchors",
                  "capture_start": start, "capture_end": end},
        "ranks": ranks, "incomplete_ranks": [r["rank"] for r in ranks if not r["complete"]],
        "failed_ranks": [r["rank"] for r in ranks if r["failed"]],
        "unranked_processes": unranked,
        "hooks": mf.hook_summary(statuses),
        "other_processes": mf.other_processes(statuses, {p for r in ranks for p in r["pids"]}
                                              | {p["pid"] for p in unranked}),
        "subreaper": subreaper, "notes": the_plan.notes,
    }
    path = mf.write_manifest(out, manifest)
    summarize(progress, out, manifest, path)
    if interrupted:
        return 128 + interrupted
    return exit_facts["status"] if exit_facts["status"] is not None else 1


def summarize(progress: Progress, out: Path, manifest: dict[str, Any], path: Path) -> None:
    ranks = manifest["ranks"]
    counts = ", ".join(f"{n} {kind}" for kind, n in count_outputs(out).items() if n)
    progress.say(f"command {manifest['exit']['how']}{' (interrupted)' if manifest['exit']['interrupted'] else ''}"
                 f" after {manifest['duration_s']:.1f} s; {len(ranks)} rank(s); {counts or 'no trace files'}")
    for rank in ranks:
        state = "complete" if rank["complete"] else "INCOMPLETE"
        why = f": {'; '.join(rank['problems'])}" if rank["problems"] else ""
        progress.say(f"  rank {rank['rank']}: {rank['steps_seen']} steps, pids {rank['pids']}, {state}{why}")
    if not ranks:
        progress.say("no rank wrote spans: was the command a Python program that reached a hooked function?")
    hooks = manifest.get("hooks") or {}
    if hooks.get("targets"):
        fired = sum(1 for e in hooks["targets"].values() if e["state"] == "fired")
        tables = f" (vLLM table {', '.join(hooks['vllm_tables'])})" if hooks.get("vllm_tables") else ""
        progress.say(f"hooks{tables}: {fired} fired, {len(hooks['never_fired'])} resolved but never fired, "
                     f"{len(hooks['unresolved'])} did not resolve")
        if hooks["never_fired"]:
            progress.say("  never fired: " + ", ".join(hooks["never_fired"]))
        if hooks["unresolved"]:
            progress.say("  did not resolve: " + ", ".join(hooks["unresolved"]))
    progress.say(f"manifest: {path}; next: profkit analyze {out}")
