"""Which rank this process belongs to, learned lazily from every source that knows.

Priority for the profkit rank (the DP rank when DP > 1, so a DP rank's engine-core process and
its worker process land on the same rank):

1. ``PROFKIT_RANK`` (the user or the capture launcher says so);
2. a rank a hook learned from the object it was called on (the bundled engine's ``self.rank``);
3. the DP rank: vLLM's parallel state (``get_dp_group().rank_in_group``) or the engine's
   ``parallel_config.data_parallel_rank`` (learned by a hook), then ``VLLM_DP_RANK``, then the
   process title (``EngineCore_DP{n}``, ``VLLM::Worker_DP{d}_EP{e}``);
4. ``RANK`` (torchrun), then ``torch.distributed.get_rank()`` if already imported and initialized.

Nothing here imports vLLM or torch: a source is read only if its module is already loaded.
"""
from __future__ import annotations

import os
import re
import sys
import threading
from typing import Any

_TITLE_IDS = {key: re.compile(rf"(?<![A-Za-z]){key.upper()}(\d+)") for key in ("dp", "ep", "tp", "pp")}
_ROLES = (("EngineCore", "engine_core"), ("Worker", "worker"), ("APIServer", "frontend"),
          ("DPCoordinator", "coordinator"))

#: header keys, in the order they are written
HEADER_KEYS = ("rank", "rank_origin", "dp_rank", "dp_size", "ep_rank", "tp_rank", "pp_rank",
               "local_rank", "global_rank", "process_name", "role")


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and str(value).strip() != "" else None
    except (TypeError, ValueError):
        return None


def from_env(environ: os._Environ[str] | dict[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    return {k: v for k, v in {
        "profkit_rank": _int(env.get("PROFKIT_RANK")),
        "env_dp_rank": _int(env.get("VLLM_DP_RANK")),
        "env_dp_size": _int(env.get("VLLM_DP_SIZE")),
        "env_rank": _int(env.get("RANK")),
        "local_rank": _int(env.get("LOCAL_RANK")),
    }.items() if v is not None}


def from_vllm() -> dict[str, Any]:
    """Group ranks from vLLM's parallel state, if vLLM is loaded and its groups are initialized."""
    ps = sys.modules.get("vllm.distributed.parallel_state")
    if ps is None:
        return {}
    facts: dict[str, Any] = {}
    try:
        if not ps.model_parallel_is_initialized():
            return {}
    except Exception:  # noqa: BLE001 - any failure means "not known yet"
        return {}
    for key, getter in (("dp", "get_dp_group"), ("ep", "get_ep_group"), ("tp", "get_tp_group"),
                        ("pp", "get_pp_group")):
        try:
            group = getattr(ps, getter)()
            facts[f"vllm_{key}_rank"] = int(group.rank_in_group)
            facts[f"vllm_{key}_size"] = int(group.world_size)
        except Exception:  # noqa: BLE001
            continue
    return facts


def from_torch_distributed() -> dict[str, Any]:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return {"torch_rank": int(dist.get_rank())}
    except Exception:  # noqa: BLE001
        pass
    return {}


def process_title() -> str | None:
    """The title vLLM sets with setproctitle, else multiprocessing's process name, else comm."""
    spt = sys.modules.get("setproctitle")
    if spt is not None:
        try:
            title = str(spt.getproctitle()).strip()
            if "::" in title or any(p.search(title) for p in _TITLE_IDS.values()):
                return title
        except Exception:  # noqa: BLE001
            pass
    mp = sys.modules.get("multiprocessing")
    if mp is not None:
        try:
            name = mp.current_process().name
            if name and name != "MainProcess":
                return name
        except Exception:  # noqa: BLE001
            pass
    try:
        with open("/proc/self/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def from_title(title: str | None) -> dict[str, Any]:
    if not title:
        return {}
    facts: dict[str, Any] = {"process_name": title}
    for key, pattern in _TITLE_IDS.items():
        m = pattern.search(title)
        if m:
            facts[f"title_{key}_rank"] = int(m.group(1))
    for needle, role in _ROLES:
        if needle in title:
            facts["role"] = role
            break
    return facts


def resolve(facts: dict[str, Any]) -> dict[str, Any]:
    """Header fields from merged facts (see the module docstring for the priority)."""

    def first(*keys: str) -> tuple[Any, str]:
        for key in keys:
            if facts.get(key) is not None:
                return facts[key], key
        return None, ""

    dp_rank, _ = first("vllm_dp_rank", "learned_dp_rank", "env_dp_rank", "title_dp_rank")
    dp_size, _ = first("vllm_dp_size", "learned_dp_size", "env_dp_size")
    rank, key = first("profkit_rank", "learned_rank", "vllm_dp_rank", "learned_dp_rank", "env_dp_rank",
                      "title_dp_rank", "env_rank", "torch_rank")
    origins = {"profkit_rank": "PROFKIT_RANK", "learned_rank": "hook", "vllm_dp_rank": "vllm parallel state",
               "learned_dp_rank": "vllm parallel config", "env_dp_rank": "VLLM_DP_RANK",
               "title_dp_rank": "process title", "env_rank": "RANK", "torch_rank": "torch.distributed"}
    if dp_rank is None and key == "learned_rank":
        dp_rank = rank
    return {
        "rank": rank,
        "rank_origin": origins.get(key, "unknown"),
        "dp_rank": dp_rank,
        "dp_size": dp_size,
        "ep_rank": first("vllm_ep_rank", "learned_ep_rank", "title_ep_rank")[0],
        "tp_rank": first("vllm_tp_rank", "learned_tp_rank", "title_tp_rank")[0],
        "pp_rank": first("vllm_pp_rank", "title_pp_rank")[0],
        "local_rank": first("local_rank", "learned_local_rank")[0],
        "global_rank": first("env_rank", "torch_rank", "learned_global_rank")[0],
        "process_name": facts.get("process_name"),
        "role": facts.get("learned_role") or facts.get("role"),
    }


class ProcessIdentity:
    """This process's facts: learned ones (from hooks) persist, discovered ones are re-read.

    A fact once known is never forgotten: at exit vLLM may already have torn its groups down.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts: dict[str, Any] = {}
        self.header: dict[str, Any] = resolve({})

    def learn(self, facts: dict[str, Any]) -> None:
        """Facts from a hooked call, keys as in the header (``rank``, ``dp_rank``, ...)."""
        with self._lock:
            for key, value in facts.items():
                if value is not None:
                    self._facts[f"learned_{key}"] = value
        self.refresh()

    def refresh(self) -> dict[str, Any]:
        """Re-read every source; return the header fields (also kept in ``self.header``)."""
        found: dict[str, Any] = {}
        for source in (from_env, from_vllm, from_torch_distributed):
            try:
                found.update(source())
            except Exception:  # noqa: BLE001 - identity must never break the rank
                continue
        found.update(from_title(process_title()))
        with self._lock:
            self._facts.update(found)
            self.header = resolve(self._facts)
            return dict(self.header)

    @property
    def rank(self) -> int | None:
        return self.header.get("rank")


_identity: list[ProcessIdentity] = [ProcessIdentity()]


def current() -> ProcessIdentity:
    return _identity[0]


def reset() -> ProcessIdentity:
    """A fresh identity (after ``fork``: the child is another process)."""
    _identity[0] = ProcessIdentity()
    return _identity[0]
