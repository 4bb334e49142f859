"""Load balance across ranks: EP balancedness per MoE layer and step, DP imbalance per step.

Why: in a DEP deployment every rank waits at each MoE layer for the most loaded one, so the
step costs what the MAXIMUM load costs while the work done is the MEAN load.
``balancedness = mean / max`` (1.0 = perfectly balanced; 0.5 = the hottest rank does twice the
average and half the fleet's expert time is waiting). The same ratio over tokens per DP rank
per step is the DP imbalance (a rank given a bigger batch is a straggler by construction).

Expert loads come as a long table ``LOAD_COLUMNS`` (``rank, step, layer, tokens``: tokens routed
to the experts a rank hosts). Parsers turn the known formats into it (pure: they take text or
parsed JSON, never a path; the CLI reads ``--expert-loads FILE``):

- ``parse_engine_steps``: profkit's engine ``rank{r}.steps.jsonl`` (``expert_recv[layer][local
  expert]``: tokens received by the rank's local experts);
- ``parse_sim_expert_loads``: the simulator's ``expert_loads.json`` (``tokens[step][layer][rank]``);
- ``parse_expert_loads``: either of those, or CSV with the ``LOAD_COLUMNS`` header.
"""
from __future__ import annotations

import io
import json
import re
from typing import Iterable

import numpy as np
import pandas as pd

from profkit import schema
from profkit.analyze.steps import step_batch_facts

LOAD_COLUMNS = ["rank", "step", "layer", "tokens"]
NO_RANK = -1  # ``max_rank`` when every rank has the same load
EP_COLUMNS = ["step", "layer", "n_ranks", "total_tokens", "mean_tokens", "max_tokens", "max_rank", "balancedness"]
EP_LAYER_COLUMNS = ["layer", "n_steps", "balancedness_mean", "balancedness_p10", "balancedness_window", "hot_rank",
                    "hot_rank_share"]
DP_COLUMNS = ["step", "n_ranks", "total_tokens", "mean_tokens", "max_tokens", "max_rank", "min_tokens",
              "balancedness", "imbalance"]
DP_RANK_COLUMNS = ["rank", "n_steps", "tokens_mean", "tokens_share", "times_max"]

_VLLM_STEP = re.compile(r"^execute_context_\d+\(.*\)_generation_\d+\(.*\)$")


class LoadsFormatError(ValueError):
    """Expert-load text in no known format (a user error: the message says what was expected)."""


# ---- parsers ---------------------------------------------------------------------------------
def parse_engine_steps(records: Iterable[dict] | str) -> pd.DataFrame:
    """Expert loads from profkit engine step records (``rank{r}.steps.jsonl`` lines, as text or
    dicts): one row per (rank, step, layer), tokens = sum of ``expert_recv[layer]``."""
    if isinstance(records, str):
        records = [json.loads(line) for line in records.splitlines() if line.strip()]
    rows = []
    for rec in records:
        recv = rec.get("expert_recv")
        if recv is None:
            continue
        for layer, per_expert in enumerate(recv):
            rows.append((int(rec["rank"]), int(rec["step"]), layer, int(sum(per_expert))))
    return _loads_frame(rows)


def parse_sim_expert_loads(doc: dict | str) -> pd.DataFrame:
    """Expert loads from the simulator's ``expert_loads.json`` (``tokens[step][layer][rank]``)."""
    if isinstance(doc, str):
        doc = json.loads(doc)
    tokens = np.asarray(doc["tokens"], dtype=np.int64)
    if tokens.ndim != 3:
        raise LoadsFormatError(f"expert_loads.json: tokens must be [step][layer][rank], got shape {tokens.shape}")
    s, layer, r = np.meshgrid(np.arange(tokens.shape[0]), np.arange(tokens.shape[1]), np.arange(tokens.shape[2]),
                              indexing="ij")
    return pd.DataFrame({"rank": r.ravel(), "step": s.ravel(), "layer": layer.ravel(),
                         "tokens": tokens.ravel()}).astype("int64")[LOAD_COLUMNS]


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


# ---- EP balancedness -------------------------------------------------------------------------
def ep_balance(loads: pd.DataFrame) -> pd.DataFrame:
    """Per (step, layer): tokens over ranks, the hottest rank (``NO_RANK`` on a tie of all) and
    ``balancedness`` = mean / max (NaN where no rank got a token)."""
    if loads is None or not len(loads):
        return _empty(EP_COLUMNS)
    g = loads.groupby(["step", "layer"], sort=True)["tokens"]
    out = pd.DataFrame({"n_ranks": g.size(), "total_tokens": g.sum(), "max_tokens": g.max()})
    out["mean_tokens"] = out["total_tokens"] / out["n_ranks"]
    hot = loads.sort_values(["tokens", "rank"], ascending=[False, True], kind="stable")
    out["max_rank"] = hot.groupby(["step", "layer"], sort=True)["rank"].first()
    out.loc[out["max_tokens"] == g.min(), "max_rank"] = NO_RANK  # all equal: no hottest rank
    out["balancedness"] = out["mean_tokens"] / out["max_tokens"].where(out["max_tokens"] > 0)
    return out.reset_index().astype({"n_ranks": "int64", "total_tokens": "int64", "max_tokens": "int64",
                                     "max_rank": "int64"})[EP_COLUMNS]


def ep_balance_by_layer(loads: pd.DataFrame) -> pd.DataFrame:
    """Per MoE layer over the window: mean and 10th percentile (the bad steps) of the per-step
    balancedness, the balancedness of the tokens summed over the window (imbalance that
    averages out over steps vs. a persistently hot rank), and the hottest rank over the window
    with its share of the layer's tokens."""
    per = ep_balance(loads)
    if not len(per):
        return _empty(EP_LAYER_COLUMNS)
    g = per.groupby("layer", sort=True)["balancedness"]
    out = pd.DataFrame({"n_steps": g.size(), "balancedness_mean": g.mean(), "balancedness_p10": g.quantile(0.1)})
    window = loads.groupby(["layer", "rank"])["tokens"].sum()
    w = window.groupby(level=0)
    out["balancedness_window"] = (w.mean() / w.max().where(w.max() > 0))
    out["hot_rank"] = window.groupby(level=0).idxmax().map(lambda k: int(k[1]))
    out["hot_rank_share"] = w.max() / w.sum().where(w.sum() > 0)
    return out.reset_index().astype({"n_steps": "int64", "hot_rank": "int64"})[EP_LAYER_COLUMNS]


# ---- DP imbalance ----------------------------------------------------------------------------
def step_tokens(steps: pd.DataFrame, events: pd.DataFrame | None = None) -> pd.DataFrame:
    """``rank, step, num_tokens``: the step table's own column, or, when the step marker carries
    no token count (``EngineCore.step``), the vLLM annotation ``execute_context_N(tok)_generation_
    N(tok)`` that starts inside each step on the same rank (summed if several)."""
    if steps is None or not len(steps):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in ("rank", "step", "num_tokens")})
    base = steps[["rank", "step", "start_ns", "end_ns"]].astype("int64").copy()
    have = steps["num_tokens"] if "num_tokens" in steps else pd.Series(pd.NA, index=steps.index)
    base["num_tokens"] = pd.array(have, dtype="Int64")
    if base["num_tokens"].notna().all() or events is None or not len(events):
        return base[["rank", "step", "num_tokens"]]
    host = events[events["kind"].isin([schema.CPU_SPAN, schema.CPU_OP]).to_numpy(dtype=bool)]
    names = host["name"].astype("string")
    ann = host[names.str.match(_VLLM_STEP, na=False).to_numpy(dtype=bool)]
    if not len(ann):
        return base[["rank", "step", "num_tokens"]]
    tok = step_batch_facts(ann["name"])["num_tokens"]
    ann = pd.DataFrame({"rank": ann["rank"].to_numpy(np.int64), "start_ns": ann["start_ns"].to_numpy(np.int64),
                        "tokens": tok.to_numpy(dtype="float64", na_value=np.nan)})
    filled = []
    for rank, b in base.groupby("rank", sort=False):
        a = ann[ann["rank"] == rank].sort_values("start_ns")
        b = b.sort_values("start_ns")
        j = np.searchsorted(b["start_ns"].to_numpy(np.int64), a["start_ns"].to_numpy(np.int64), side="right") - 1
        inside = (j >= 0) & (a["start_ns"].to_numpy(np.int64) < b["end_ns"].to_numpy(np.int64)[np.maximum(j, 0)])
        sums = pd.Series(a["tokens"].to_numpy()[inside]).groupby(j[inside]).sum(min_count=1)
        got = np.full(len(b), np.nan)
        got[sums.index.to_numpy(np.int64)] = sums.to_numpy(np.float64)
        found = pd.Series(pd.array(np.rint(got), dtype="Int64"), index=b.index)
        b = b.assign(num_tokens=b["num_tokens"].fillna(found))
        filled.append(b)
    out = pd.concat(filled, ignore_index=True).sort_values(["rank", "step"]).reset_index(drop=True)
    return out[["rank", "step", "num_tokens"]]


def dp_imbalance(steps: pd.DataFrame, events: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per step: tokens per DP rank (``step_tokens``), the largest batch and ``balancedness`` =
    mean / max, ``imbalance`` = max / mean. Steps where no rank's token count is known are left out."""
    tok = step_tokens(steps, events).dropna(subset=["num_tokens"])
    if not len(tok):
        return _empty(DP_COLUMNS)
    tok = tok.astype({"num_tokens": "int64"})
    g = tok.groupby("step", sort=True)["num_tokens"]
    out = pd.DataFrame({"n_ranks": g.size(), "total_tokens": g.sum(), "max_tokens": g.max(), "min_tokens": g.min()})
    out["mean_tokens"] = out["total_tokens"] / out["n_ranks"]
    hot = tok.sort_values(["num_tokens", "rank"], ascending=[False, True], kind="stable")
    out["max_rank"] = hot.groupby("step", sort=True)["rank"].first()
    out.loc[out["max_tokens"] == out["min_tokens"], "max_rank"] = NO_RANK  # all equal: no largest batch
    out["balancedness"] = out["mean_tokens"] / out["max_tokens"].where(out["max_tokens"] > 0)
    out["imbalance"] = out["max_tokens"] / out["mean_tokens"].where(out["mean_tokens"] > 0)
    return out.reset_index().astype({"n_ranks": "int64", "total_tokens": "int64", "max_tokens": "int64",
                                     "min_tokens": "int64", "max_rank": "int64"})[DP_COLUMNS]


def dp_rank_summary(steps: pd.DataFrame, events: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per DP rank: mean tokens per step, its share of all tokens, and how often it had the
    largest batch (a rank always given more is a structural straggler)."""
    tok = step_tokens(steps, events).dropna(subset=["num_tokens"])
    if not len(tok):
        return _empty(DP_RANK_COLUMNS)
    tok = tok.astype({"num_tokens": "int64"})
    per = dp_imbalance(steps, events)
    g = tok.groupby("rank", sort=True)["num_tokens"]
    out = pd.DataFrame({"n_steps": g.size(), "tokens_mean": g.mean(), "tokens_share": g.sum() / tok["num_tokens"].sum()})
    out["times_max"] = per.loc[per["max_rank"] != NO_RANK, "max_rank"].value_counts().reindex(out.index).fillna(0).astype("int64")
    return out.reset_index().astype({"rank": "int64", "n_steps": "int64"})[DP_RANK_COLUMNS]


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64" if ("balanced" in c or c in ("mean_tokens", "imbalance",
                                                                                     "tokens_mean", "tokens_share",
                                                                                     "hot_rank_share"))
                                      else "int64") for c in columns})
