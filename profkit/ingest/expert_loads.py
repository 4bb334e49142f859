"""Find and read expert loads (tokens per rank, step and MoE layer) for EP balancedness.

Sources: an explicit ``--expert-loads FILE`` (CSV ``rank,step,layer,tokens``, the simulator's
``expert_loads.json`` or the bundled engine's ``rank*.steps.jsonl``), else whatever of those a
capture folder holds. The parsers (text in, table ``LOAD_COLUMNS`` out) are here too; the
analysis of the table is ``profkit.analyze.balance``.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from profkit.errors import TraceError

LOAD_COLUMNS = ["rank", "step", "layer", "tokens"]
ROUTING_ATTR = "routing"


class LoadsFormatError(ValueError):
    """Expert-load text in no known format (a user error: the message says what was expected)."""


# ---- parsers ---------------------------------------------------------------------------------
def parse_engine_steps(records: Iterable[dict] | str) -> pd.DataFrame:
    """Expert loads from profkit engine step records (``rank{r}.steps.jsonl`` lines, as text or
    dicts): one row per (rank, step, layer), tokens = sum of ``expert_recv[layer]``."""
    if isinstance(records, str):
        records = [json.loads(line) for line in records.splitlines() if line.strip()]
    rows = []
    routing: dict | None = None
    for rec in records:
        recv = rec.get("expert_recv")
        if recv is None:
            continue
        for layer, per_expert in enumerate(recv):
            rows.append((int(rec["rank"]), int(rec["step"]), layer, int(sum(per_expert))))
        routed, n_tok = rec.get("expert_loads"), rec.get("num_tokens")
        if routing is None and routed and n_tok:  # one routed count per global expert, k per token
            routing = {"experts": len(routed[0]), "topk": int(round(sum(routed[0]) / n_tok)), "source": "engine steps"}
    out = _loads_frame(rows)
    if routing is not None and routing["topk"] >= 1:
        out.attrs[ROUTING_ATTR] = routing
    return out


def parse_sim_expert_loads(doc: dict | str) -> pd.DataFrame:
    """Expert loads from the simulator's ``expert_loads.json`` (``tokens[step][layer][rank]``)."""
    if isinstance(doc, str):
        doc = json.loads(doc)
    tokens = np.asarray(doc["tokens"], dtype=np.int64)
    if tokens.ndim != 3:
        raise LoadsFormatError(f"expert_loads.json: tokens must be [step][layer][rank], got shape {tokens.shape}")
    s, layer, r = np.meshgrid(np.arange(tokens.shape[0]), np.arange(tokens.shape[1]), np.arange(tokens.shape[2]),
                              indexing="ij")
    out = pd.DataFrame({"rank": r.ravel(), "step": s.ravel(), "layer": layer.ravel(),
                        "tokens": tokens.ravel()}).astype("int64")[LOAD_COLUMNS]
    if doc.get("experts") and doc.get("topk"):
        out.attrs[ROUTING_ATTR] = {"experts": int(doc["experts"]), "topk": int(doc["topk"]), "source": "simulator"}
    return out


def parse_expert_loads(text: str, name: str = "expert loads") -> pd.DataFrame:
    """Any known format, sniffed: the simulator's JSON, engine step JSON lines, or CSV with a
    ``rank,step,layer,tokens`` header. ``name`` (the file) appears in errors."""
    head = text.lstrip()[:1]
    if head == "{":
        first = text.lstrip().split("\n", 1)[0]
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None
        if isinstance(doc, dict) and "tokens" in doc:
            return parse_sim_expert_loads(doc)
        if '"expert_recv"' in first or '"expert_recv"' in text[:100_000]:
            return parse_engine_steps(text)
        raise LoadsFormatError(f"{name}: JSON without 'tokens' (simulator) or 'expert_recv' (engine steps)")
    try:
        df = pd.read_csv(io.StringIO(text))
    except Exception as exc:  # noqa: BLE001 - any parse failure is a format error for the user
        raise LoadsFormatError(f"{name}: not JSON and not CSV ({exc})") from None
    missing = [c for c in LOAD_COLUMNS if c not in df.columns]
    if missing:
        raise LoadsFormatError(f"{name}: CSV needs columns {', '.join(LOAD_COLUMNS)}; missing {', '.join(missing)}")
    return df[LOAD_COLUMNS].astype("int64")


def _loads_frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=LOAD_COLUMNS).astype("int64")


def read_expert_loads(path: str | Path) -> pd.DataFrame:
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
