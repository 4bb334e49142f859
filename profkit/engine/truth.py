"""The injected truth: which fault fired on which rank at which steps, read back from the ranks'
own step records (not from the schedule), so it holds even when a run stopped early."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .faults import FaultSpec

#: kinds that make their rank a straggler (everything but the test-only crash)
STRAGGLER_KINDS = frozenset({"gc", "slow_schedule", "host_sync", "slow_allreduce", "sleep", "hot_experts"})


def read_timings(path: str | Path) -> list[dict[str, Any]]:
    """One rank's ``rank{r}.steps.jsonl``; a torn last line (crashed rank) is skipped."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


def build_truth(specs: list[FaultSpec], timings: dict[int, list[dict[str, Any]]], *,
                command: str, ranks: int, steps: int, device: str, **extra: Any) -> dict[str, Any]:
    causes = []
    for i, spec in enumerate(specs):
        fired = [(rec["step"], ev) for rec in timings.get(spec.rank, [])
                 for ev in rec.get("faults", []) if ev.get("spec") == i]
        cause: dict[str, Any] = {"kind": spec.kind, "rank": spec.rank, "steps": [s for s, _ in fired],
                                 "ms": spec.ms, "every": spec.every, "start": spec.start,
                                 "measured_ms": [round(ev["measured_ns"] / 1e6, 3) for _, ev in fired]}
        if spec.kind == "crash" and len(timings.get(spec.rank, [])) == spec.start:
            cause["steps"] = [spec.start]  # the rank died in that step, before writing its record
        if spec.kind == "hot_experts":
            cause["ms"] = None
            cause.pop("measured_ms")
            cause["experts"] = fired[0][1].get("experts", []) if fired else []
        causes.append(cause)
    stragglers = sorted({c["rank"] for c in causes if c["kind"] in STRAGGLER_KINDS and c["steps"]})
    return {"causes": causes, "stragglers": stragglers, "command": command, "ranks": ranks,
            "steps": steps, "device": device, **extra}


def write_truth(path: str | Path, truth: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(truth, indent=1) + "\n")
