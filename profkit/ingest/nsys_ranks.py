"""Which rank each process of an nsys export is: user mapping, then metadata, then device order.

Metadata is what the capture itself says: a profkit NVTX payload (``profkit rank=3``, or
``rank=3`` in a ``profkit`` NVTX domain) or a process / main-thread name (vLLM's
``EngineCore_DP3``, ``VLLM::Worker_DP3_EP3``, worker suffix ``..._rank3``). Linux keeps only 15
characters of a thread name (``VLLM::Worker_DP``), so an index that runs into a 15-character cut
is not trusted.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

COMM_MAX_CHARS = 15  # Linux TASK_COMM_LEN - 1: nsys thread names are cut here
_RANK_RE = re.compile(r"(?:^|[^A-Za-z0-9])rank[_=]?(\d+)(?![0-9])", re.IGNORECASE)
_INDEX_RE = re.compile(r"(?:^|[^A-Za-z])(DP|EP|TP)(\d+)(?![0-9])", re.IGNORECASE)
_PROFKIT_NVTX_RE = re.compile(r"\brank=(\d+)\b")
PROFKIT_NVTX_DOMAIN = "profkit"


def _trusted(name: str, m: re.Match) -> bool:
    return not (len(name) == COMM_MAX_CHARS and m.end() == len(name))


def rank_from_name(name: str | None) -> int | None:
    """Global rank a process title reveals: explicit rank > EP index > DP (no TP) > TP (no DP)."""
    if not name:
        return None
    m = _RANK_RE.search(name)
    if m and _trusted(name, m):
        return int(m.group(1))
    idx: dict[str, int] = {}
    for m in _INDEX_RE.finditer(name):
        if _trusted(name, m):
            idx.setdefault(m.group(1).upper(), int(m.group(2)))
    if "EP" in idx:
        return idx["EP"]
    if "DP" in idx and "TP" not in idx:
        return idx["DP"]
    if "TP" in idx and "DP" not in idx:
        return idx["TP"]
    return None


def nvtx_rank_claims(events: pa.Table) -> dict[int, set[int]]:
    """pid -> ranks claimed by profkit NVTX payloads in that process."""
    # the NVTX rows first, then their names searched (every event's name: ~57 ms at 371k rows)
    host = events.select(["pid", "name", "category"]).filter(
        pc.fill_null(pc.is_in(events["kind"], pa.array(["cpu_span", "instant"])), False))
    hits = host.filter(pc.fill_null(pc.match_substring(host["name"], "rank="), False)).to_pylist()
    claims: dict[int, set[int]] = {}
    for row in hits:
        name, pid = row["name"], row["pid"]
        if pid is None:
            continue
        in_domain = (row["category"] or "").lower() == PROFKIT_NVTX_DOMAIN
        if not (in_domain or name.lower().startswith("profkit")):
            continue
        m = _PROFKIT_NVTX_RE.search(name)
        if m:
            claims.setdefault(int(pid), set()).add(int(m.group(1)))
    return claims


@dataclass
class RankDecision:
    rank: int | None
    origin: str  # mapping | metadata | order | unknown
    evidence: str


@dataclass
class ProcessFacts:
    pid: int
    process_name: str | None = None
    thread_name: str | None = None  # main thread (tid == pid): where setproctitle/prctl names land
    min_device: int | None = None  # None for processes without GPU work
    nvtx_ranks: set[int] = field(default_factory=set)


def metadata_rank(p: ProcessFacts, warnings: list[str]) -> tuple[int | None, str]:
    if len(p.nvtx_ranks) > 1:
        warnings.append(f"pid {p.pid}: profkit NVTX payloads claim several ranks {sorted(p.nvtx_ranks)}; ignored")
    nvtx = next(iter(p.nvtx_ranks)) if len(p.nvtx_ranks) == 1 else None
    by_name = None
    name_src = ""
    for label, name in (("thread name", p.thread_name), ("process name", p.process_name)):
        r = rank_from_name(name)
        if r is not None:
            by_name, name_src = r, f"{label} {name!r}"
            break
    if nvtx is not None:
        if by_name is not None and by_name != nvtx:
            warnings.append(f"pid {p.pid}: NVTX says rank {nvtx} but {name_src} says {by_name}; using NVTX")
        return nvtx, f"profkit NVTX payload rank={nvtx}"
    if by_name is not None:
        return by_name, name_src
    return None, ""


def assign_ranks(primaries: list[ProcessFacts], pid_to_rank: dict[int, int] | None,
                 warnings: list[str]) -> dict[int, RankDecision]:
    """Ranks for the processes that become parts (those with GPU work)."""
    mapping = pid_to_rank or {}
    out: dict[int, RankDecision] = {}
    for p in primaries:
        if p.pid in mapping:
            out[p.pid] = RankDecision(int(mapping[p.pid]), "mapping", f"pid_to_rank[{p.pid}]")
    taken = {d.rank for d in out.values()}
    claims: dict[int, list[tuple[ProcessFacts, str]]] = {}
    for p in primaries:
        if p.pid in out:
            continue
        r, why = metadata_rank(p, warnings)
        if r is not None:
            claims.setdefault(r, []).append((p, why))
    for r, claimants in sorted(claims.items()):
        if len(claimants) > 1 or r in taken:
            pids = [c[0].pid for c in claimants]
            warnings.append(f"rank {r} is claimed by pids {pids} (or mapped already); metadata not used for them")
            continue
        p, why = claimants[0]
        out[p.pid] = RankDecision(r, "metadata", why)
        taken.add(r)
    rest = sorted((p for p in primaries if p.pid not in out),
                  key=lambda p: (p.min_device if p.min_device is not None else 1 << 31, p.pid))
    if not rest:
        return out
    if len(primaries) == 1:
        out[rest[0].pid] = RankDecision(None, "unknown", "the only GPU process in the file")
        return out
    free = (r for r in range(1 << 20) if r not in taken)
    for p in rest:
        r = next(free)
        out[p.pid] = RankDecision(r, "order", f"order of (min device {p.min_device}, pid)")
    warnings.append("ranks of pids " + ", ".join(f"{p.pid}->{out[p.pid].rank}" for p in rest)
                    + " guessed from the order of (lowest GPU used, pid); pass pid_to_rank to be sure")
    return out
