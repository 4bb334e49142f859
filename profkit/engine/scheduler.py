"""Continuous-batching scheduler: real Python work over a request queue, like vLLM's ``Scheduler``.

Requests arrive from a seeded RNG (per rank, so DP ranks get different batches), with varying
prompt and output lengths; or, under ``--replay mirror|lag|round-robin``, from a fixed list (``replay.py``).
Each step decodes every running request (one token each) and fills the rest of the token budget
with (chunked) prefills, allocating KV blocks from a free list. The batch sequence depends only on
(seed, rank) (or the replayed list), never on model outputs or faults, so a clean run and a faulty
run with the same seed schedule the same tokens.
"""
from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field

from .config import ModelSize, step_annotation
from .faults import FaultRuntime, spin_until
from .replay import ReplayRequest

BLOCK_SIZE = 16


@dataclass
class Request:
    req_id: str
    prompt: list[int]
    max_output: int
    num_computed: int = 0
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt)


@dataclass
class SchedulerOutput:
    """What one step runs; picklable (crosses the queue under ``--split-procs``)."""

    step: int
    req_ids: list[str]
    token_ids: list[int]  # flat, request after request
    num_scheduled: list[int]  # tokens per request
    is_prefill: list[bool]
    n_prefill: int = 0
    prefill_tokens: int = 0
    n_decode: int = 0
    decode_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def annotation(self) -> str:
        return step_annotation(self.n_prefill, self.prefill_tokens, self.n_decode, self.decode_tokens)


class Scheduler:
    """vLLM-shaped: ``schedule()`` then, after the model ran, ``update_from_output()``."""

    def __init__(self, rank: int, seed: int, size: ModelSize, faults: FaultRuntime,
                 replay: list[ReplayRequest] | None = None, lag_ns: int = 0):
        """``replay``: this rank's requests of a replay, which then replace the RNG's arrivals (each
        enters the waiting queue at its arrival step; with ``lag_ns``, at the first step that starts
        ``lag_ns`` or more after this rank started the arrival step: the lag replay)."""
        self.rank = rank
        self.size = size
        self.faults = faults
        self.rng = random.Random(seed * 1_000_003 + rank * 7919 + 17)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished = 0
        self._next_id = 0
        b = size.token_budget
        self.prompt_range = (max(4, b // 8), max(8, b + b // 2))  # some prompts need chunking
        self.output_range = (4, 48)
        per_seq = -(-(self.prompt_range[1] + self.output_range[1]) // BLOCK_SIZE)
        self.free_blocks: deque[int] = deque(range(size.max_seqs * per_seq + 64))
        self.replay: deque[ReplayRequest] | None = None
        self.lag_ns = int(lag_ns)
        self.step_start_ns: dict[int, int] = {}  # this rank's monotonic clock at each step's schedule
        self.arrived = 0  # replayed requests that entered the queue in the last schedule()
        if replay is not None:
            self.replay = deque(sorted(replay, key=lambda r: r.arrival_step))
            return
        for _ in range(size.max_seqs // 2):
            self._arrive()

    def _arrive(self) -> None:
        n_prompt = self.rng.randint(*self.prompt_range)
        prompt = [self.rng.randrange(self.size.vocab) for _ in range(n_prompt)]
        self.waiting.append(Request(f"r{self.rank}-{self._next_id}", prompt,
                                    self.rng.randint(*self.output_range)))
        self._next_id += 1

    def _allocate(self, req: Request, new_tokens: int) -> bool:
        need = -(-(req.num_computed + new_tokens) // BLOCK_SIZE) - len(req.blocks)
        if need > len(self.free_blocks):
            return False
        req.blocks.extend(self.free_blocks.popleft() for _ in range(max(0, need)))
        return True

    def _free(self, req: Request) -> None:
        self.free_blocks.extend(req.blocks)
        req.blocks.clear()

    def _replay_arrivals(self, step: int) -> None:
        assert self.replay is not None
        now = self.step_start_ns[step] = time.monotonic_ns()
        self.arrived = 0
        while self.replay and self.replay[0].arrival_step <= step:
            if self.lag_ns and self.step_start_ns[self.replay[0].arrival_step] + self.lag_ns > now:
                break  # arrival order: every later request arrives later still
            r = self.replay.popleft()
            self.waiting.append(Request(r.req_id, list(r.prompt), r.max_output))
            self.arrived += 1

    def schedule(self, step: int) -> SchedulerOutput:
        if self.replay is not None:
            self._replay_arrivals(step)
        else:  # arrivals: bursty, ~1 per step on average
            for _ in range(self.rng.choice((0, 0, 1, 1, 2, 3))):
                self._arrive()
        budget = self.size.token_budget
        out = SchedulerOutput(step, [], [], [], [])

        def add(req: Request, n: int) -> None:
            prefill = req.in_prefill
            out.req_ids.append(req.req_id)
            start = req.num_computed
            if prefill:
                out.token_ids.extend(req.prompt[start:start + n])
                out.n_prefill += 1
                out.prefill_tokens += n
            else:
                out.token_ids.append(req.output[-1] if req.output else req.prompt[-1])
                out.n_decode += 1
                out.decode_tokens += n
            out.num_scheduled.append(n)
            out.is_prefill.append(prefill)

        for req in self.running:  # running first: decodes, then unfinished chunked prefills
            if budget <= 0:
                break
            n = min(len(req.prompt) - req.num_computed, budget) if req.in_prefill else 1
            if self._allocate(req, n):
                add(req, n)
                budget -= n
        while budget > 0 and self.waiting and len(self.running) < self.size.max_seqs:
            req = self.waiting[0]
            n = min(len(req.prompt), budget)
            if not self._allocate(req, n):
                break
            self.waiting.popleft()
            self.running.append(req)
            add(req, n)
            budget -= n

        spec = self.faults.active("slow_schedule", step)
        if spec is not None:  # e.g. a costly policy pass over the whole queue
            t0 = time.monotonic_ns()
            queue = list(self.waiting) + self.running
            spin_until(t0 + int(spec.ms * 1e6),
                       lambda: sorted(queue, key=lambda r: (r.num_computed - r.num_tokens, r.req_id)))
            self.faults.record(spec, time.monotonic_ns() - t0)
        return out

    def update_from_output(self, out: SchedulerOutput, sampled: list[int]) -> int:
        """Advance requests by what ran; append sampled tokens; free finished ones. Returns #finished."""
        by_id = {r.req_id: r for r in self.running}
        done = 0
        for req_id, n, tok in zip(out.req_ids, out.num_scheduled, sampled):
            req = by_id[req_id]
            req.num_computed += n
            if req.in_prefill:
                continue  # partial prefill: the sampled token is discarded, as in vLLM
            req.output.append(int(tok))
            if len(req.output) >= req.max_output:
                self._free(req)
                done += 1
        if done:
            self.running = [r for r in self.running if len(r.output) < r.max_output]
            self.finished += done
        return done
