"""Load balance (profkit.analyze.balance): EP balancedness per MoE layer and step, DP imbalance.

Known answers: hand-built tables, the simulator's expert loads with hot experts injected on one
rank, and the real DEP2 engine captures (steps.jsonl expert loads, vLLM-style step annotations).
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

import profkit
from conftest import SAMPLE_TRACES
from profkit import schema
from profkit.analyze import balance as bal
from profkit.analyze.steps import step_table
from profkit.simulate import Inject, simulate

ENGINE = SAMPLE_TRACES / "engine-dep2-h200"


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def test_ep_balance_by_hand():
    loads = pd.DataFrame({"rank": [0, 1, 2, 0, 1, 2], "step": [0, 0, 0, 1, 1, 1], "layer": 0,
                          "tokens": [10, 20, 30, 20, 20, 20]})
    per = bal.ep_balance(loads).set_index("step")
    assert per.loc[0, "balancedness"] == pytest.approx(20 / 30) and per.loc[0, "max_rank"] == 2
    assert per.loc[1, "balancedness"] == 1.0 and per.loc[1, "max_rank"] == bal.NO_RANK
    layer = bal.ep_balance_by_layer(loads).iloc[0]
    assert layer["balancedness_mean"] == pytest.approx((20 / 30 + 1) / 2)
    assert layer["balancedness_window"] == pytest.approx(40 / 50)  # summed: 30, 40, 50 tokens
    assert layer["hot_rank"] == 2 and layer["hot_rank_share"] == pytest.approx(50 / 120)
    assert list(bal.ep_balance(loads.iloc[:0]).columns) == bal.EP_COLUMNS


def test_simulated_hot_experts_rank_is_the_hot_one(tmp_path):
    """Rank 3's experts get 2x the tokens from step 2 on: it is the hottest rank of every layer
    there, and balancedness drops to about mean/max = (N+1)/N / 2 of a balanced step."""
    simulate(8, 6, seed=5, out_dir=tmp_path, layers=3, injects=[Inject("hot_experts", rank=3, factor=2.0, start=2)])
    loads = bal.parse_expert_loads((tmp_path / "expert_loads.json").read_text(), "expert_loads.json")
    assert loads.groupby(["step", "layer"]).size().eq(8).all()
    per = bal.ep_balance(loads)
    hot, cold = per[per["step"] >= 2], per[per["step"] < 2]
    assert (hot["max_rank"] == 3).all()
    assert hot["balancedness"].max() < 0.65 and cold["balancedness"].min() > 0.85
    assert hot["balancedness"].mean() == pytest.approx((7 + 2) / 8 / 2, rel=0.08)
    assert (bal.ep_balance_by_layer(loads)["hot_rank"] == 3).all()


def test_engine_steps_expert_loads():
    text = "".join((ENGINE / "torch_clean" / f"rank{r}.steps.jsonl").read_text() for r in (0, 1))
    loads = bal.parse_expert_loads(text, "rank*.steps.jsonl")
    records = [json.loads(line) for line in text.splitlines()]
    assert len(loads) == sum(len(r["expert_recv"]) for r in records)
    # every token goes to top-2 experts: the ranks' loads add up to 2 x the tokens of the step
    per = bal.ep_balance(loads).set_index(["step", "layer"])
    tokens = pd.DataFrame(records).groupby("step")["num_tokens"].sum()
    assert (per["total_tokens"] == 2 * tokens.reindex(per.index.get_level_values(0)).to_numpy()).all()
    assert per["balancedness"].between(0.5, 1.0).all()
    first = records[0]
    assert loads.set_index(["rank", "step", "layer"]).loc[(first["rank"], first["step"], 1), "tokens"] == sum(
        first["expert_recv"][1])


def test_csv_and_bad_input():
    csv = "rank,step,layer,tokens\n0,0,0,5\n1,0,0,15\n"
    per = bal.ep_balance(bal.parse_expert_loads(csv, "loads.csv"))
    assert per.loc[0, "balancedness"] == pytest.approx(10 / 15)
    with pytest.raises(bal.LoadsFormatError, match="loads.csv: CSV needs columns .*missing layer, tokens"):
        bal.parse_expert_loads("rank,step\n0,0\n", "loads.csv")
    with pytest.raises(bal.LoadsFormatError, match="x.json: JSON without"):
        bal.parse_expert_loads('{"a": 1}', "x.json")


def _frame(rows: list[dict]) -> pd.DataFrame:
    cols: dict[str, list] = {c: [r.get(c) for r in rows] for c in schema.COLUMNS}
    return schema.to_frame(schema.to_table(cols))


def test_dp_imbalance_from_step_names_and_from_annotations_inside_steps():
    rows = []
    for rank, toks in ((0, (64, 64)), (1, (64, 192))):
        for step, tok in enumerate(toks):
            t = step * 1000
            rows.append({"rank": rank, "source": "t", "kind": schema.CPU_SPAN, "name": "EngineCore.step",
                         "start_ns": t, "end_ns": t + 900, "pid": 1, "tid": 1})
            rows.append({"rank": rank, "source": "t", "kind": schema.CPU_SPAN,
                         "name": f"execute_context_0(0)_generation_{tok}({tok})", "start_ns": t + 100,
                         "end_ns": t + 800, "pid": 1, "tid": 1})
    ev = _frame(rows)
    steps = step_table(ev)  # EngineCore.step wins as marker: no tokens in its name
    assert steps["num_tokens"].isna().all()
    per = bal.dp_imbalance(steps, ev).set_index("step")
    assert per.loc[0, "balancedness"] == 1.0 and per.loc[0, "max_rank"] == bal.NO_RANK
    assert per.loc[1, "max_rank"] == 1 and per.loc[1, "imbalance"] == pytest.approx(192 / 128)
    ranks = bal.dp_rank_summary(steps, ev).set_index("rank")
    assert ranks.loc[1, "times_max"] == 1 and ranks.loc[0, "times_max"] == 0
    assert ranks.loc[1, "tokens_share"] == pytest.approx(256 / 384)
    # a vLLM-marked step table carries the tokens itself
    vllm = steps.assign(num_tokens=pd.array([64, 64, 64, 192], dtype="Int64"))
    assert bal.dp_imbalance(vllm).equals(bal.dp_imbalance(steps, ev))


def test_real_capture_tokens_per_rank_match_the_engine():
    ev = profkit.load(ENGINE / "nsys_clean").events
    tok = bal.step_tokens(step_table(ev), ev)
    for rank in (0, 1):
        records = [json.loads(line) for line in (ENGINE / "nsys_clean" / f"rank{rank}.steps.jsonl").read_text().splitlines()]
        want = [r["num_tokens"] for r in records if 10 <= r["step"] < 30]
        assert tok[tok["rank"] == rank]["num_tokens"].astype(int).tolist() == want
    assert (bal.dp_imbalance(step_table(ev), ev)["n_ranks"] == 2).all()
