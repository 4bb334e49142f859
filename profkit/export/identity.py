"""Who a rank is (DP/EP rank, host, pid, thread names), read from what the readers kept in meta.

Exporters name tracks with this; nothing here is measured. Facts are reported only where a
source states them: a missing DP rank stays missing rather than being guessed from the global rank.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

MAX_OS_PID = 1 << 22  # Linux pid_max ceiling: larger "pids" are readers' hashes of labels
MAX_INT32 = (1 << 31) - 1

_DP_IN_NAME = re.compile(r"(?:^|[^A-Za-z0-9])DP[_-]?(\d+)(?:[^0-9]|$)")
_EP_GROUP = re.compile(r"(?:^|[^a-z])(ep|expert)(?:[^a-z]|$)", re.IGNORECASE)


@dataclass(frozen=True)
class RankIdentity:
    rank: int
    pid: int | None = None  # the rank's main OS process (most host events)
    dp_rank: int | None = None
    ep_rank: int | None = None
    host: str | None = None
    process_name: str | None = None
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)  # (pid, tid) -> name

    def label(self) -> str:
        """``rank 3 (DP 3, EP 3, host node001, pid 4242)``: what the process track is called."""
        facts = []
        if self.dp_rank is not None:
            facts.append(f"DP {self.dp_rank}")
        if self.ep_rank is not None:
            facts.append(f"EP {self.ep_rank}")
        if self.host:
            facts.append(f"host {self.host}")
        if self.pid is not None:
            facts.append(f"pid {self.pid}")
        return f"rank {self.rank}" + (f" ({', '.join(facts)})" if facts else "")

    def thread_name(self, pid: int, tid: int) -> str:
        name = self.thread_names.get((pid, tid)) or f"thread {tid}"
        return name if pid == self.pid or self.pid is None else f"{name} [pid {pid}]"


def is_os_pid(value: Any) -> bool:
    return value is not None and 0 < int(value) < MAX_OS_PID


def rank_identity(rank: int, metas: Iterable[dict[str, Any]], host_pid_counts: dict[int, int]) -> RankIdentity:
    """Identity of ``rank`` from its parts' meta and how many host events each OS pid holds."""
    metas = list(metas)
    pid = max((p for p in host_pid_counts if is_os_pid(p)), key=lambda p: (host_pid_counts[p], -p), default=None)
    if pid is None:
        pid = next((int(m[k]) for m in metas for k in ("host_pid", "pid") if is_os_pid(m.get(k))), None)
    return RankIdentity(
        rank=rank,
        pid=pid,
        dp_rank=_dp_rank(metas),
        ep_rank=_ep_rank(metas),
        host=_first(m.get("host") or m.get("hostname") for m in metas),
        process_name=_process_name(metas, pid),
        thread_names=_thread_names(metas),
    )


def _first(values: Iterable[Any]) -> Any:
    return next((v for v in values if v not in (None, "")), None)


def _as_int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and str(value).strip() != "" else None
    except (TypeError, ValueError):
        return None


def _dp_rank(metas: list[dict]) -> int | None:
    explicit = _first(_as_int(m.get("dp_rank")) for m in metas)
    if explicit is not None:
        return explicit
    names = [m.get("process_name") for m in metas] + [n for m in metas for n in (m.get("process_names") or {}).values()]
    for name in names:
        hit = _DP_IN_NAME.search(str(name or ""))
        if hit:
            return int(hit.group(1))
    return None


def _ep_rank(metas: list[dict]) -> int | None:
    explicit = _first(_as_int(m.get("ep_rank")) for m in metas)
    if explicit is not None:
        return explicit
    for m in metas:
        dist = m.get("distributed") or {}
        global_rank = _as_int(dist.get("rank"))
        for group in dist.get("pg_config") or []:
            if not isinstance(group, dict) or not _EP_GROUP.search(str(group.get("pg_desc", ""))):
                continue
            members = list(group.get("ranks") or [])
            if global_rank in members:
                return members.index(global_rank)
    return None


def _process_name(metas: list[dict], pid: int | None) -> str | None:
    explicit = _first(m.get("process_name") for m in metas)
    if explicit:
        return str(explicit)
    if pid is not None:
        return _first((m.get("process_names") or {}).get(str(pid)) for m in metas)
    return None


def _thread_names(metas: list[dict]) -> dict[tuple[int, int], str]:
    names: dict[tuple[int, int], str] = {}
    for m in metas:
        for key, name in (m.get("thread_names") or {}).items():  # Kineto: "pid/tid" -> name
            pid, _, tid = str(key).partition("/")
            if pid.isdigit() and tid.isdigit() and is_os_pid(int(pid)) and name:
                names.setdefault((int(pid), int(tid)), str(name).strip())
        if is_os_pid(m.get("pid")) and m.get("thread_name"):  # nsys: the process's main thread
            names.setdefault((int(m["pid"]), int(m["pid"])), str(m["thread_name"]))
    return names


def display_pids(identities: dict[int, RankIdentity]) -> dict[int, int]:
    """Per rank, the pid its Perfetto process gets: its own, unless ranks share one.

    Trace viewers merge processes by pid, and pids repeat across hosts; so every rank whose pid
    is missing or shared gets a synthetic pid above the OS range (``2**22 + rank``). The real
    pid stays in the process name.
    """
    owners: dict[int, int] = {}
    for ident in identities.values():
        if ident.pid is not None:
            owners[ident.pid] = owners.get(ident.pid, 0) + 1
    return {
        rank: ident.pid if ident.pid is not None and owners[ident.pid] == 1 else MAX_OS_PID + rank
        for rank, ident in identities.items()
    }
