"""Ground truth of a simulated capture: what accuracy tests compare analyzers against.

``truth.json`` layout (all times int64 ns; "true" = simulation time before clock skew):

- ``params``: the SimConfig (ranks, steps, seed, format, layers, ...).
- ``convention``: how written timestamps relate to true time (see clock.py); ``t0_ns``.
- ``offsets_ns``, ``drift_ppm``: LISTS INDEXED BY RANK (every rank of a host has its host's value).
- ``hosts``, ``devices``, ``pids``: lists indexed by rank.
- ``stragglers``: sorted ranks with at least one injected cause.
- ``causes``: ``[{kind, rank, steps, ms, every, total_ns}]``; ``ms`` = injected ms per affected
  step as requested (for ``factor=`` injections: the mean actually applied).
- ``injected_delay_ns``: a long table ``{"columns": ["step", "rank", "kind", "delay_ns"], "rows": [...]}``
  with one row per (step, rank, kind) whose injected time is non-zero: the time the cause added to
  that rank in that step (GC pause, extra schedule, extra host CPU, stall beyond the GPU drain,
  tiny-launch phase, extra expert-GEMM GPU time). It is the straggler's own excess work; how much
  of it reaches the step time depends on slack (the other ranks' natural lateness absorbs a
  little, and a GPU-side cause such as hot_experts shows as lateness at each combine but is
  hidden from step time while the host is the bottleneck, as it is at the default cpu_scale).
- ``sync``: common true ends of every sync point, the values to check alignment against:
  ``dp_allreduce_end_ns[step]`` and ``collective_end_ns[step][i]`` (i = 2*layer for dispatch,
  2*layer+1 for combine), ``ep_seq_base`` (Sequence number of collective (0, 0)),
  ``dp_seq_base``, process-group names.
- ``steps_true_ns``: ``[[first step start over ranks, last step end over ranks], ...]`` per step.
- ``span_names``: the names of the host spans as written.
- ``files``: per-rank trace files (relative to truth.json); ``expert_loads_file``.
- ``wall_s``: seconds the simulation took (informational).
- ``replay`` (only with ``--replay mirror|lag``; see replay.py): ``mode``, ``seed``, ``token_ns`` (host
  time per token of a rank's own batch, before the DP all-reduce: what makes tokens cost time),
  the request set (``requests``: one row per copy ``base, copy, rank, arrival_step, prompt_tokens,
  output_tokens``), ``tokens[step][rank]``, ``mirror_tokens[step]`` (every rank's tokens in the
  mirror replay of the same set), ``tokens_served``, ``balancedness[step]`` (mean / max),
  ``padding_tokens`` (sum over steps and ranks of max - own tokens) and the known cost, per step:
  ``cost_ns[step]``, how much later every rank's step ended than in the mirror replay with the same
  ``seed`` and ``replay_seed`` (the DP all-reduce is where ranks meet; everything after it is the
  same draws, so this is exactly the step-time change ``profkit compare MIRROR LAG`` should find;
  0 for a mirror; a step can be negative where the lag spread a burst the mirror ran at once),
  and ``imbalance_ns[step]`` (never negative), the same against every rank at the step's mean
  tokens (the cost of (max - mean) tokens proper; equals ``cost_ns`` where the lag's copies
  arrive in the mirror's steps, differs by the few tokens the lag shifts across the window's
  edges). ``cost_ns_mean`` / ``imbalance_ns_mean``: their means over steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson


@dataclass
class Truth:
    params: dict[str, Any]
    convention: str
    t0_ns: int
    offsets_ns: list[int]
    drift_ppm: list[float]
    hosts: list[int]
    devices: list[int]
    pids: list[int]
    stragglers: list[int]
    causes: list[dict[str, Any]]
    injected_delay_ns: dict[str, Any]
    sync: dict[str, Any]
    steps_true_ns: list[list[int]]
    span_names: dict[str, str]
    files: list[str]
    expert_loads_file: str
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        extra = out.pop("extra")
        out.update(extra)
        return out

    def write(self, path: Path) -> None:
        Path(path).write_bytes(orjson.dumps(self.to_json(), option=orjson.OPT_SERIALIZE_NUMPY))

    @classmethod
    def read(cls, path: Path) -> "Truth":
        data = orjson.loads(Path(path).read_bytes())
        known = set(cls.__dataclass_fields__) - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in known},
                   extra={k: v for k, v in data.items() if k not in known})

    def delay_ns(self, rank: int, step: int, kind: str | None = None) -> int:
        """Injected ns on ``rank`` in ``step`` (one kind, or all kinds summed)."""
        return sum(
            row[3] for row in self.injected_delay_ns["rows"]
            if row[0] == step and row[1] == rank and (kind is None or row[2] == kind)
        )
