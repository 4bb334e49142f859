"""Find and read expert loads (tokens per rank, step and MoE layer) for EP balancedness.

Sources: an explicit ``--expert-loads FILE`` (CSV ``rank,step,layer,tokens``, the simulator's
``expert_loads.json`` or the bundled engine's ``rank*.steps.jsonl``), else whatever of those a
capture folder holds. Parsing lives in ``profkit.analyze.balance`` (text in, table out).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from profkit.errors import TraceError


def read_expert_loads(path: str | Path) -> pd.DataFrame:
    from profkit.analyze.balance import parse_expert_loads

    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(p, f"cannot read expert loads: {exc}") from None
    try:
        return parse_expert_loads(text, str(p))
    except ValueError as exc:
        raise TraceError(p, str(exc)) from None


def discover_expert_loads(paths: Iterable[str | Path]) -> pd.DataFrame | None:
    """Expert loads found beside the traces (engine timings or simulator output), or None."""
    frames = []
    for raw in paths:
        folder = Path(raw)
        if not folder.is_dir():
            continue
        candidates = sorted(folder.rglob("expert_loads.json")) or sorted(folder.rglob("rank*.steps.jsonl"))
        for f in candidates:
            try:
                frames.append(read_expert_loads(f))
            except TraceError:
                continue  # side files are optional: a bad one only loses balance, never the analysis
    frames = [f for f in frames if len(f)]
    if not frames:
        return None
    out = pd.concat(frames, ignore_index=True)
    routing = next((f.attrs["routing"] for f in frames if f.attrs.get("routing")), None)
    if routing is not None:  # what the files said about the routing (experts, top-k)
        out.attrs["routing"] = routing
    return out
