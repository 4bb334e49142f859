"""A few transformer-ish MoE layers with expert parallelism over ``all_to_all_single``.

Dense parts (embedding, attention-ish matmuls, router, LM head) are replicated on every DP rank
with the same weights (DP attention); experts are sharded: rank r hosts experts
``[r*E_r, (r+1)*E_r)``. Each MoE layer exchanges per-expert counts (one small all-to-all, then one
host read of the counts, as DeepEP's normal mode does), dispatches token rows to the experts'
ranks, runs the local experts, and combines the results back: every rank meets every other rank
twice per layer, which is why one slow rank stalls all of them.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .annotate import Spans
from .config import ModelSize

HOT_BIAS = 3.0  # router logit bonus for hot experts: "most", not all, tokens go there


@dataclass
class LayerStats:
    """Per layer and step: tokens this rank's router sent to each expert, and its local experts' load."""

    routed: list[int]  # [num_experts] tokens (x top-k choices) routed by this rank
    received: list[int]  # [experts_per_rank] token rows this rank's experts computed


def _init(gen: torch.Generator, *shape: int, fan_in: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) / math.sqrt(fan_in)


class MoEModel:
    """Weights and forward pass; no autograd, no nn.Module (nothing here needs them)."""

    def __init__(self, size: ModelSize, rank: int, world: int, device: torch.device,
                 dtype: torch.dtype, seed: int, spans: Spans, ep_group=None, token_ns: int = 0):
        """``token_ns``: modelled device time per padded token and step (``--token-us``), slept in the
        attention spans: the toy model's own compute barely depends on the batch on CPU, a real
        forward does, and a sleep costs the same under CPU contention (timing tests stay stable)."""
        self.size, self.rank, self.world = size, rank, world
        self.token_ns = int(token_ns)
        self.device, self.dtype, self.spans, self.group = device, dtype, spans, ep_group
        self.num_experts = size.experts_per_rank * world
        H, F, L, V, C, E = size.hidden, size.ffn, size.layers, size.vocab, size.kv_len, self.num_experts
        dense = torch.Generator().manual_seed(seed)  # identical on all ranks
        local = torch.Generator().manual_seed(seed * 7919 + 1 + rank)  # this rank's experts

        def put(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype).contiguous()

        self.embed = put(torch.randn(V, H, generator=dense))
        self.w_q = [put(_init(dense, H, H, fan_in=H)) for _ in range(L)]
        self.k_cache = [put(torch.randn(C, H, generator=dense)) for _ in range(L)]
        self.v_cache = [put(torch.randn(C, H, generator=dense)) for _ in range(L)]
        self.w_o = [put(_init(dense, H, H, fan_in=H)) for _ in range(L)]
        self.w_router = [put(_init(dense, H, E, fan_in=H)) for _ in range(L)]
        self.w1 = [put(_init(local, size.experts_per_rank, H, F, fan_in=H)) for _ in range(L)]
        self.w2 = [put(_init(local, size.experts_per_rank, F, H, fan_in=F)) for _ in range(L)]
        self.lm_head = put(_init(dense, H, V, fan_in=H))
        self.local_expert_ids = torch.arange(size.experts_per_rank, device=device).repeat(world)

    def hot_bias(self, hot_rank: int | None) -> torch.Tensor | None:
        """Router bias that sends most tokens to the first top-k experts hosted on ``hot_rank``."""
        if hot_rank is None:
            return None
        bias = torch.zeros(self.num_experts, device=self.device, dtype=self.dtype)
        first = hot_rank * self.size.experts_per_rank
        bias[first:first + min(self.size.topk, self.size.experts_per_rank)] = HOT_BIAS
        return bias

    @staticmethod
    def _rmsnorm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def forward(self, token_ids: torch.Tensor, n_real: int,
                router_bias: torch.Tensor | None) -> tuple[torch.Tensor, list[LayerStats]]:
        """``token_ids`` is padded to the DP max (same shapes on every rank); only the first
        ``n_real`` rows are real tokens and only those are routed to experts."""
        x = self.embed.index_select(0, token_ids)
        stats = []
        scale = 1.0 / math.sqrt(self.size.hidden)
        for layer in range(self.size.layers):
            with self.spans.span("attn"):
                h = self._rmsnorm(x)
                scores = (h @ self.w_q[layer]) @ self.k_cache[layer].T * scale
                attn = torch.softmax(scores.float(), dim=-1).to(x.dtype) @ self.v_cache[layer]
                x = x + attn @ self.w_o[layer]
                if self.token_ns:  # padded rows too: every DP rank runs the padded batch
                    time.sleep(x.shape[0] * self.token_ns / self.size.layers / 1e9)
            with self.spans.span("router"):
                h = self._rmsnorm(x[:n_real])
                logits = h @ self.w_router[layer]
                if router_bias is not None:
                    logits = logits + router_bias
                weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), self.size.topk, dim=-1)
                weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
            moe_out, layer_stats = self._moe(layer, h, weights, ids)
            stats.append(layer_stats)
            x = torch.cat([x[:n_real] + moe_out, x[n_real:]]) if n_real < x.shape[0] else x + moe_out
        return x, stats

    def _moe(self, layer: int, h: torch.Tensor, weights: torch.Tensor,
             ids: torch.Tensor) -> tuple[torch.Tensor, LayerStats]:
        n, k = ids.shape
        N, Er, H = self.world, self.size.experts_per_rank, self.size.hidden
        with self.spans.span("moe_dispatch"):
            flat = ids.reshape(-1)
            order = torch.argsort(flat, stable=True)  # grouped by expert, hence by destination rank
            send_x = h.index_select(0, order // k)
            counts = torch.bincount(flat, minlength=self.num_experts)
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.group)
            both = torch.cat([counts, recv_counts]).cpu()  # the host needs the split sizes
            routed = both[:self.num_experts]
            recv_matrix = both[self.num_experts:].view(N, Er)  # [src rank, local expert]
            send_splits = routed.view(N, Er).sum(1).tolist()
            recv_splits = recv_matrix.sum(1).tolist()
            n_recv = sum(recv_splits)
            recv_x = h.new_empty(n_recv, H)
            dist.all_to_all_single(recv_x, send_x, recv_splits, send_splits, group=self.group)
        with self.spans.span("experts"):
            per_expert = recv_matrix.sum(0).tolist()
            row_expert = torch.repeat_interleave(
                self.local_expert_ids, recv_matrix.reshape(-1).to(self.device), output_size=n_recv)
            perm = torch.argsort(row_expert, stable=True)
            grouped = recv_x.index_select(0, perm)
            out_grouped = torch.empty_like(grouped)
            offset = 0
            w1, w2 = self.w1[layer], self.w2[layer]
            for e, c in enumerate(per_expert):
                if c:
                    seg = grouped[offset:offset + c]
                    out_grouped[offset:offset + c] = torch.nn.functional.silu(seg @ w1[e]) @ w2[e]
                offset += c
            out_recv = torch.empty_like(out_grouped)
            out_recv[perm] = out_grouped
        with self.spans.span("moe_combine"):
            back = h.new_empty(n * k, H)
            dist.all_to_all_single(back, out_recv, send_splits, recv_splits, group=self.group)
            y = torch.empty_like(back)
            y[order] = back
            out = (y.view(n, k, H) * weights.unsqueeze(-1)).sum(1)
        return out, LayerStats(routed.tolist(), per_expert)
