"""The replay loop of ``impact_replay.replay`` compiled with numba (the ``fast`` extra).

The numpy replay advances all ranks together, one point per rank per round: tens of thousands
of rounds of small vector operations, each paying numpy's call overhead (~4-6 s per pass at
DEP32 x 1,000). Compiled, the same recurrence is one pass over the points. It computes the same
shifts bit for bit (integer max-plus, no rounding): each rank runs until it reaches a sync exit
whose instance is not released; when every unfinished rank waits so, the instance of the
earliest waiting exit is released from the arrivals evaluated so far, as the numpy replay does.
That state (every point whose inputs are known has been evaluated) does not depend on the order
ranks are visited in, so neither do the shifts. ``tests/test_impact_replay_kernel.py`` compares
both on random programs with cycles and on a real capture's programs.

Importing this module imports numba; ``impact_replay`` falls back to numpy without it.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def replay_points(offsets, in_src, in_edge, in_slack, is_exit, is_arrive, inst, arr_nodes, arr_slack, arr_bounds,
                  time_ns, cut, node_cut, use_node_cut, delta):  # pragma: no cover - compiled
    """Fill ``delta`` (points x scenarios, zeros on entry); returns the forced releases."""
    n_ranks = offsets.size - 1
    n_scen = delta.shape[1]
    n_inst = arr_bounds.size - 1
    slots = in_src.shape[1]
    comp = np.zeros((max(n_inst, 1), n_scen), np.int64)
    released = np.zeros(max(n_inst, 1), np.bool_)
    seen = np.zeros(max(n_inst, 1), np.int64)
    ptr = offsets[:-1].copy()
    best = np.empty(n_scen, np.int64)
    forced = 0
    while True:
        active = False
        moved = False
        for r in range(n_ranks):
            p, end = ptr[r], offsets[r + 1]
            while p < end:
                if is_exit[p]:
                    k = inst[p]
                    if not released[k]:
                        break
                    for s in range(n_scen):
                        delta[p, s] = comp[k, s]
                else:
                    any_src = False
                    for j in range(slots):
                        src = in_src[p, j]
                        if src < 0:
                            continue
                        e = in_edge[p, j]
                        sl = in_slack[p, j]
                        for s in range(n_scen):
                            v = delta[src, s] - sl
                            if e >= 0:
                                v -= cut[e, s]
                            if not any_src or v > best[s]:
                                best[s] = v
                        any_src = True
                    for s in range(n_scen):
                        v = best[s] if any_src else 0
                        if use_node_cut:
                            v -= node_cut[p, s]
                        delta[p, s] = v
                    if is_arrive[p]:
                        k = inst[p]
                        seen[k] += 1
                        if seen[k] == arr_bounds[k + 1] - arr_bounds[k] and not released[k]:
                            _release(comp, delta, arr_nodes, arr_slack, arr_bounds, offsets, ptr, k, False)
                            released[k] = True
                p += 1
                moved = True
            ptr[r] = p
            if p < end:
                active = True
        if not active:
            return forced
        if moved:
            continue
        # every unfinished rank waits at an exit not released: clocks disagree about an order
        k_first, t_first = -1, 0
        for r in range(n_ranks):
            p = ptr[r]
            if p < offsets[r + 1] and (k_first < 0 or time_ns[p] < t_first):
                k_first, t_first = inst[p], time_ns[p]
        _release(comp, delta, arr_nodes, arr_slack, arr_bounds, offsets, ptr, k_first, True)
        released[k_first] = True
        forced += 1


@njit(cache=True, nogil=True)
def _release(comp, delta, arr_nodes, arr_slack, arr_bounds, offsets, ptr, k, partial):  # pragma: no cover - compiled
    """Instance ``k``'s completion shift: the latest shifted arrival (``partial``: of those
    already evaluated; none: 0)."""
    n_scen = delta.shape[1]
    first = True
    for i in range(arr_bounds[k], arr_bounds[k + 1]):
        a = arr_nodes[i]
        if partial:
            r = np.searchsorted(offsets, a, side="right") - 1
            if a >= ptr[r]:
                continue
        for s in range(n_scen):
            v = delta[a, s] - arr_slack[i]
            if first or v > comp[k, s]:
                comp[k, s] = v
        first = False
    if first:
        for s in range(n_scen):
            comp[k, s] = 0
