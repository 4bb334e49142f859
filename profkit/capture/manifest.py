"""``DIR/manifest.json``: what was run, how it ended, and which rank wrote what.

Everything ``profkit analyze DIR`` (or a person) needs to trust a capture: the command and its
exit, start/end clock anchors, tool versions, backends with their files and problems, and per
rank: host, pids, DP/EP ids, role of each process, how each process ended (from the capture
agent's status files), its span file's clock anchors, and ``complete``. A rank is complete when
its data ends where its processes ended on purpose: every process exited cleanly, or was stopped
by a signal it handled (the span recorder flushes on SIGTERM/SIGINT), and no span file ends in a
torn line. A process that raised, exited non-zero, or died without running Python's exit (SIGKILL,
native crash) makes its rank incomplete, and ``failed_ranks`` names it.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from . import CAPTURE_FORMAT, MANIFEST, STATUS_DIR
from .spanscan import SpanFileState, SpanScan

IDENTITY_KEYS = ("dp_rank", "dp_size", "ep_rank", "tp_rank", "pp_rank", "local_rank", "global_rank")
MAX_OTHER_PROCESSES = 50


def read_statuses(out_dir: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((out_dir / STATUS_DIR).glob("pid*.status")):
        try:
            data = json.loads(path.read_text())
            out[int(data["pid"])] = data
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def classify(status: dict[str, Any] | None) -> tuple[str, str]:
    """(end, text): end is clean | signal | failed | killed | unknown."""
    if status is None:
        return "unknown", "no status record (the capture agent did not run in this process)"
    signals = status.get("signals") or []
    how, code = status.get("how"), status.get("code")
    if signals and how != "running":
        then = f", then exited {code}" if how == "exit" and code is not None else ""
        return "signal", f"stopped by {', '.join(signals)}{then}"
    if how == "running":
        return "killed", "ended without running Python's exit (SIGKILL, a native crash or os._exit)"
    if how == "exception":
        return "failed", f"uncaught {status.get('exception') or 'exception'}"
    if how == "signal":
        return "signal", f"stopped by {', '.join(signals) or 'a signal'}"
    if code not in (0, None):
        return "failed", f"exited {code}"
    return "clean", "exited 0"


def exit_facts(returncode: int | None, interrupted: bool, signals_sent: list[str]) -> dict[str, Any]:
    """The command's exit, shell style (128 + N for a signal)."""
    facts: dict[str, Any] = {"interrupted": interrupted, "signals_sent": signals_sent}
    if returncode is None:
        facts.update(status=None, signal=None, how="did not start")
    elif returncode < 0:
        name = signal.Signals(-returncode).name
        facts.update(status=128 - returncode, signal=name, how=f"killed by {name}")
    else:
        facts.update(status=returncode, signal=None, how=f"exited {returncode}")
    return facts


def _rel(path: str | Path, out_dir: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(out_dir.resolve()))
    except ValueError:
        return str(path)


def process_record(state: SpanFileState, status: dict[str, Any] | None, out_dir: Path) -> dict[str, Any]:
    end, text = classify(status)
    header = state.header
    record: dict[str, Any] = {
        "pid": state.pid, "host": header.get("host"), "role": header.get("role"),
        "process_name": header.get("process_name"), "rank_origin": header.get("rank_origin"),
        "span_file": _rel(state.path, out_dir), "spans": state.spans, "steps": state.steps,
        "worker_steps": state.worker_steps, "gc_spans": state.gc_spans, "torn_last_line": state.torn,
        "clock": header.get("clock", "monotonic"), "anchors": state.anchors,
        "end": end, "end_text": text,
    }
    if status is not None:
        record.update(exit_code=status.get("code"), signals=status.get("signals") or [],
                      start_wall_ns=status.get("start_wall_ns"), end_wall_ns=status.get("end_wall_ns"))
        hooks = process_hooks(status)
        if hooks:
            record["hooks"] = hooks
    return record


def process_hooks(status: dict[str, Any]) -> dict[str, Any]:
    """One process's hooks, from its status record: ``fired`` (target -> calls), ``never_fired``
    (patched, 0 calls), ``unresolved`` (target -> why), how many targets it never imported, and
    the vLLM table it chose. Empty when the process wrote no hook facts."""
    report = status.get("hooks")
    if not isinstance(report, dict):
        return {}
    fired: dict[str, int] = {}
    never: list[str] = []
    unresolved: dict[str, str] = {}
    not_imported = 0
    for target, facts in report.items():
        state, calls = str(facts.get("status")), int(facts.get("calls") or 0)
        if state == "patched":
            if calls:
                fired[target] = calls
            else:
                never.append(target)
        elif state.startswith("missing"):
            unresolved[target] = state
        else:
            not_imported += 1
    out: dict[str, Any] = {"fired": fired, "never_fired": sorted(never), "unresolved": unresolved,
                           "not_imported": not_imported}
    table = status.get("vllm_table") or {}
    if table.get("table"):
        out["vllm_table"] = table
    return out


def hook_summary(statuses: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """All processes together, per target that any process patched or failed to resolve:
    total calls, how many processes patched it, and ``fired`` / ``never fired`` / ``unresolved``
    (unresolved only where no process patched it). ``never_fired`` and ``unresolved`` list targets."""
    targets: dict[str, dict[str, Any]] = {}
    tables: set[str] = set()
    for _pid, status in sorted(statuses.items()):
        hooks = process_hooks(status)
        if not hooks:
            continue
        if hooks.get("vllm_table"):
            tables.add(str(hooks["vllm_table"].get("table")))
        for target, calls in hooks["fired"].items():
            entry = targets.setdefault(target, {"calls": 0, "processes": 0, "unresolved": None})
            entry["calls"] += calls
            entry["processes"] += 1
        for target in hooks["never_fired"]:
            targets.setdefault(target, {"calls": 0, "processes": 0, "unresolved": None})["processes"] += 1
        for target, why in hooks["unresolved"].items():
            targets.setdefault(target, {"calls": 0, "processes": 0, "unresolved": None})["unresolved"] = why
    for entry in targets.values():
        entry["state"] = ("fired" if entry["calls"] else "never fired" if entry["processes"] else "unresolved")
        if entry["state"] != "unresolved":
            entry.pop("unresolved")
    return {
        "vllm_tables": sorted(tables),
        "targets": targets,
        "never_fired": sorted(t for t, e in targets.items() if e["state"] == "never fired"),
        "unresolved": sorted(t for t, e in targets.items() if e["state"] == "unresolved"),
    }


def rank_records(scan: SpanScan, statuses: dict[int, dict[str, Any]], out_dir: Path, run_ok: bool,
                 rank_files: dict[int, list[str]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(ranks, processes without a rank)."""
    by_rank: dict[int, list[SpanFileState]] = {}
    unranked: list[dict[str, Any]] = []
    for state in scan.processes():
        if state.rank is None:
            unranked.append(process_record(state, statuses.get(state.pid or -1), out_dir))
        else:
            by_rank.setdefault(state.rank, []).append(state)
    steps = scan.steps_by_rank()
    ranks = []
    for rank, states in sorted(by_rank.items()):
        procs = [process_record(s, statuses.get(s.pid or -1), out_dir) for s in states]
        problems = []
        for p in procs:
            if p["torn_last_line"]:
                problems.append(f"pid {p['pid']}: span file ends in a torn line")
            if p["end"] in ("failed", "killed") or (p["end"] == "unknown" and not run_ok):
                problems.append(f"pid {p['pid']} ({p['role'] or 'process'}): {p['end_text']}")
        failed = any(p["end"] == "failed" or (p["end"] == "killed" and not run_ok) for p in procs)
        complete = not problems or (run_ok and not any(p["torn_last_line"] for p in procs))
        first = states[0].header
        ranks.append({
            "rank": rank, "host": first.get("host"), "pids": [p["pid"] for p in procs],
            "roles": sorted({p["role"] for p in procs if p["role"]}),
            **{k: next((s.header.get(k) for s in states if s.header.get(k) is not None), None) for k in IDENTITY_KEYS},
            "steps_seen": steps.get(rank, 0), "complete": complete, "failed": failed, "problems": problems,
            "files": sorted({*(p["span_file"] for p in procs), *rank_files.get(rank, [])}),
            "processes": procs,
        })
    return ranks, unranked


def other_processes(statuses: dict[int, dict[str, Any]], with_spans: set[int]) -> list[dict[str, Any]]:
    """Processes that ran the agent but wrote no spans (launchers, helpers): how they ended."""
    out = []
    for pid, status in sorted(statuses.items()):
        if pid in with_spans:
            continue
        end, text = classify(status)
        out.append({"pid": pid, "ppid": status.get("ppid"), "argv": status.get("argv"), "end": end,
                    "end_text": text, "exit_code": status.get("code")})
    failed_first = sorted(out, key=lambda p: p["end"] == "clean")
    return failed_first[:MAX_OTHER_PROCESSES]


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> Path:
    path = out_dir / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"profkit_capture": CAPTURE_FORMAT, **manifest}, indent=1, default=str))
    os.replace(tmp, path)
    return path
