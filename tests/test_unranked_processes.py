"""Processes that are not ranks never become ranks (issues #18 and #20).

A real vLLM capture holds span files of processes that serve the ranks without being one: the
front end of an offline ``LLM`` (the main process: its title is ``python3``, no DP rank, no role),
API servers (``APIServer_0``, role ``frontend``), the DP coordinator. Before, the offline front
end became "rank 1 by input order" with 0 steps. The folders here are shaped like a
``profkit capture`` of vLLM (``manifest.json`` with ``ranks`` and ``unranked_processes`` as
``profkit.capture.manifest`` writes them, one ``spans-pid*.jsonl`` per process with the header
fields ``profkit.instrument.identity`` resolves for each role).
"""
from __future__ import annotations

import json
from pathlib import Path

import profkit
from profkit.report.files import summary_document, write_outputs
from profkit.scale import analyze_paths

WALL, MONO = 1_800_000_000_000_000_000, 5_000_000_000
MS = 1_000_000


def span_file(folder: Path, pid: int, header: dict, spans: list[tuple[str, str, int, int]]) -> Path:
    """One process's span file: header (identity) and one batch of (name, category, start, end) in
    ms from the capture start, on the process's monotonic clock."""
    names: dict[str, int] = {}
    rows = []
    for name, cat, s, e in spans:
        for text in (name, cat):
            names.setdefault(text, len(names))
        rows.append([names[name], names[cat], MONO + s * MS, MONO + e * MS, pid])
    head = {"profkit_spans": 1, "pid": pid, "host": "node0", "rank": None, "rank_origin": "unknown",
            "dp_rank": None, "dp_size": None, "ep_rank": None, "tp_rank": None, "pp_rank": None,
            "local_rank": None, "global_rank": None, "process_name": None, "role": None, "clock": "monotonic",
            "anchors": [[WALL, MONO]], "profkit_version": "0.1.0", "python": "3.12.3", **header}
    body = {"anchor": [WALL, MONO], "names": {str(v): k for k, v in names.items()}, "spans": rows}
    path = folder / f"spans-pid{pid}.jsonl"
    path.write_text(json.dumps(head) + "\n" + json.dumps(body) + "\n")
    return path


def engine_spans(offset: int = 0) -> list:
    out = []
    for k in range(8):
        t = 10 * k + offset
        out += [("EngineCore.step", "step", t, t + 9), ("Scheduler.schedule", "scheduler", t, t + 2)]
    return out


def worker_spans(offset: int = 0) -> list:
    out = []
    for k in range(8):
        t = 10 * k + offset
        out += [("Worker.execute_model", "worker", t + 2, t + 8),
                ("GPUModelRunner.execute_model", "forward", t + 2, t + 8)]
    return out


def frontend_spans() -> list:
    return [("OutputProcessor.process_outputs", "frontend", 10 * k + 9, 10 * k + 10) for k in range(8)]


def process(pid: int, role: str | None, name: str, rank: int | None, span_path: str) -> dict:
    return {"pid": pid, "host": "node0", "role": role, "process_name": name, "rank_origin": "hook" if rank is not None
            else None, "span_file": span_path, "spans": 16, "steps": 8 if role == "engine_core" else 0,
            "end": "clean", "end_text": "exited 0"}


def manifest(folder: Path, ranks: dict[int, list[tuple[int, str, str]]], unranked: list[tuple[int, str | None, str]]):
    doc = {"profkit_capture": 1, "command": ["python3", "offline.py"], "exit": {"status": 0, "how": "exited 0"},
           "ranks": [{"rank": r, "host": "node0", "pids": [p for p, _, _ in procs],
                      "roles": sorted({role for _, role, _ in procs}), "dp_rank": r, "complete": True,
                      "processes": [process(p, role, name, r, f"spans-pid{p}.jsonl") for p, role, name in procs]}
                     for r, procs in ranks.items()],
           "unranked_processes": [process(p, role, name, None, f"spans-pid{p}.jsonl") for p, role, name in unranked],
           "other_processes": []}
    (folder / "manifest.json").write_text(json.dumps(doc, indent=1))


def offline_llm(folder: Path, with_manifest: bool = True) -> Path:
    """DP=1 offline ``LLM``: the front end (main process), one engine core, one worker."""
    folder.mkdir(parents=True, exist_ok=True)
    span_file(folder, 100, {"process_name": "python3"}, frontend_spans())
    span_file(folder, 200, {"rank": 0, "rank_origin": "vllm parallel config", "dp_rank": 0,
                            "process_name": "EngineCore_DP0", "role": "engine_core"}, engine_spans())
    span_file(folder, 300, {"rank": 0, "rank_origin": "vllm parallel state", "dp_rank": 0, "tp_rank": 0,
                            "process_name": "VLLM::Worker_TP0", "role": "worker"}, worker_spans())
    if with_manifest:
        manifest(folder, {0: [(200, "engine_core", "EngineCore_DP0"), (300, "worker", "VLLM::Worker_TP0")]},
                 [(100, None, "python3")])
    return folder


def test_offline_front_end_joins_the_only_rank(tmp_path):
    cap = profkit.load(offline_llm(tmp_path / "cap"))
    assert cap.ranks == [0]
    parts = cap.parts.set_index("path")
    front = parts.loc[str(tmp_path / "cap" / "spans-pid100.jsonl")]
    assert front["rank"] == 0 and front["rank_origin"] == "serves"
    assert any("spans-pid100.jsonl" in w and "joined to rank 0" in w for w in cap.warnings)
    assert not any("input order" in w for w in cap.warnings)


def test_offline_capture_analyzes_as_one_rank(tmp_path):
    folder = offline_llm(tmp_path / "cap")
    a = analyze_paths([folder], executor="serial")
    assert list(a.ranks["rank"]) == [0]
    assert len(a.steps) == 8 and set(a.steps["rank"]) == {0}
    doc = summary_document(a)
    assert doc["n_ranks"] == 1 and doc["unranked_processes"] == []
    written = write_outputs(a, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["n_ranks"] == 1 and written


def test_without_manifest_a_rankless_span_file_beside_ranks_is_no_rank(tmp_path):
    cap = profkit.load(offline_llm(tmp_path / "cap", with_manifest=False))
    assert cap.ranks == [0]
    assert not any("input order" in w for w in cap.warnings)


def test_dp2_server_front_end_and_coordinator_are_listed_apart(tmp_path):
    folder = tmp_path / "cap"
    folder.mkdir()
    span_file(folder, 100, {"process_name": "APIServer_0", "role": "frontend"}, frontend_spans())
    span_file(folder, 101, {"process_name": "python3"}, [])  # the DPCoordinator: no hooks, only a header
    for r in (0, 1):
        span_file(folder, 200 + r, {"rank": r, "rank_origin": "vllm parallel config", "dp_rank": r, "dp_size": 2,
                                    "process_name": f"EngineCore_DP{r}", "role": "engine_core"}, engine_spans(r))
        span_file(folder, 300 + r, {"rank": r, "rank_origin": "vllm parallel state", "dp_rank": r, "ep_rank": r,
                                    "process_name": f"VLLM::Worker_DP{r}_EP{r}", "role": "worker"}, worker_spans(r))
    manifest(folder, {r: [(200 + r, "engine_core", f"EngineCore_DP{r}"), (300 + r, "worker", f"VLLM::Worker_DP{r}_EP{r}")]
                      for r in (0, 1)}, [(100, "frontend", "APIServer_0"), (101, "coordinator", "DPCoordinator")])
    a = analyze_paths([folder], executor="serial")
    assert list(a.ranks["rank"]) == [0, 1]
    left = {Path(u["path"]).name: u["role"] for u in a.capture.unranked}
    assert left == {"spans-pid100.jsonl": "frontend", "spans-pid101.jsonl": "coordinator"}
    doc = summary_document(a)
    assert {Path(u["path"]).name for u in doc["unranked_processes"]} == set(left)
    assert not any("input order" in w for w in a.capture.warnings)


def test_a_lone_rankless_span_file_is_still_analyzed(tmp_path):
    """A program that never said its rank: its only span file is rank 0, as before."""
    folder = tmp_path / "lone"
    folder.mkdir()
    span_file(folder, 500, {"process_name": "python3"}, engine_spans())
    cap = profkit.load(folder)
    assert cap.ranks == [0] and cap.parts["rank_origin"].tolist() == ["order"]
