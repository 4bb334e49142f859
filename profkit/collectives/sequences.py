"""Pair the collective instances of two ranks by their end times, where no sequence number does.

Why in ``align``: it is what the clock estimate stands on (a rank's source offsets, the ends that
must coincide), and the collective instances of the analysis are matched the same way
(``analyze.collectives``). Per key (one collective on one group or stream), order with a lag
first; when that leaves many pairs off one line (offset + drift), votes on end differences and
tracking along time. Kernel ends are exact to tens of microseconds, host span ends (Gloo, DP
sync) to a millisecond (``TOL_NS``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.robust import theil_sen

KERNEL = "kernel"
CPU_SPAN = "cpu_span"
LAUNCH_SPAN = "launch_span"
SOURCE_KINDS = (KERNEL, CPU_SPAN, LAUNCH_SPAN)
COINCIDENT_KINDS = (KERNEL, CPU_SPAN)  # kinds whose ends are one real moment on all participants

# Tolerance on end coincidence when matching without sequence numbers. Measured on the project's
# DEP2 H200 captures: NCCL all-to-all kernel ends differ by up to ~15 us between ranks sharing a
# clock, Gloo / DP-sync span ends by up to ~0.6 ms.
TOL_NS = {KERNEL: 50_000, CPU_SPAN: 1_000_000, LAUNCH_SPAN: 1_000_000}
CPU_TOL_MAX_FACTOR = 5  # host-span tolerance may widen with the spacing of instances, up to 5 ms
DRIFT_MAX_PPM = 200.0  # how far clocks may drift apart while tracking matches along time
MAX_LAG = 512  # order matching: largest lag (instances cut off one rank) searched
VOTE_PAIRS = 2_000_000  # vote on at most this many end differences per rank pair
NEIGHBOURS = 9  # order pairs judged with this many neighbours (a rolling median of end differences)
ORDER_SHARE = 0.8  # order stands when its pairs agree with one line this often (else votes)
CLEAR_LAG = 1.5  # a key's best lag is clear when it scores this many times any other lag's score
NEAR_BEST = 0.5  # an unclear key's lags scoring at least half its best are its candidates


def match_sequences(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], tol: dict[str, int]
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], str]:
    """Pair the end times of two ranks, per key: ``{key: (indices into a, indices into b)}``.

    Order with a lag first; if that leaves more than a fifth of the possible pairs inconsistent
    with one line (offset + drift), votes and tracking. Returns the pairs and "order" | "vote".
    """
    keys = [k for k in a if k in b and len(a[k]) and len(b[k])]
    if not keys:
        return {}, "order"
    tol = {k: _spacing_tolerance(a[k], tol[k]) if k in keys else tol[k] for k in tol}
    possible = sum(min(len(a[k]), len(b[k])) for k in keys)
    order = _order_lags(a, b, keys, tol)
    kept = _consistent(a, b, order, tol)
    n_order = sum(len(v[0]) for v in kept.values())
    if n_order >= ORDER_SHARE * possible:
        return kept, "order"
    voted = _vote_track(a, b, keys, tol)
    n_vote = sum(len(v[0]) for v in voted.values())
    if n_vote > n_order:
        return voted, "vote"
    return kept, "order"


def _spacing_tolerance(ends: np.ndarray, tol_ns: int) -> int:
    """Host-span ends (Gloo / DP sync) of busy processes disagree by the scheduler's delays, ms on
    a loaded host: widen their tolerance up to a quarter of the instances' median spacing (order
    stays unambiguous below half of it), at most CPU_TOL_MAX_FACTOR times the measured one.
    Kernel tolerances are left as they are."""
    if tol_ns < TOL_NS[CPU_SPAN] or len(ends) < 3:
        return tol_ns
    return max(tol_ns, min(CPU_TOL_MAX_FACTOR * tol_ns, _spacing(ends) // 4))


def _spacing(ends: np.ndarray) -> int:
    """Median spacing of one rank's instances of a key (0 below 3 ends): the shift of every later
    end difference when an instance is missing inside the window."""
    return int(np.median(np.diff(np.sort(ends)))) if len(ends) >= 3 else 0


def _lag_scores(a: np.ndarray, b: np.ndarray, tol: int) -> tuple[int, bool, dict[int, int]]:
    """(the best lag, whether it is clear, the score of each lag tried): a lag's score is how many
    neighbouring end differences of its pairs agree within ``tol``. Lags are tried from 0 outwards
    and the search stops at one that pairs 90% of the ends consistently (clear). Otherwise the
    best is clear when it scores ``CLEAR_LAG`` times any other lag: on a periodic sequence with
    ends noisier than ``tol`` (a calling thread's ends on a loaded host) a lag of a whole period
    can score as well as the true one."""
    n, m = len(a), len(b)
    lo, hi = max(-(n - 2), -MAX_LAG), min(m - 2, MAX_LAG)
    lags = sorted(range(lo, hi + 1), key=lambda L: (abs(L), L))
    need = 0.9 * (min(n, m) - 1)
    best_l, best_score = 0, -1
    scores: dict[int, int] = {}
    for L in lags:
        i0, i1 = max(0, -L), min(n, m - L)
        if i1 - i0 < 2:
            continue
        d = b[i0 + L:i1 + L] - a[i0:i1]
        score = scores[L] = int((np.abs(np.diff(d)) <= tol).sum())
        if score > best_score:
            best_l, best_score = L, score
        if score >= need:
            return best_l, True, scores
    second = max((sc for L, sc in scores.items() if L != best_l), default=0)
    return best_l, best_score >= CLEAR_LAG * second, scores


def _lag_pairs(n: int, m: int, lag: int) -> tuple[np.ndarray, np.ndarray]:
    i0, i1 = max(0, -lag), min(n, m - lag)
    ia = np.arange(i0, i1, dtype=np.int64)
    return ia, ia + lag


def _median_difference(a: np.ndarray, b: np.ndarray, lag: int) -> float:
    ia, ib = _lag_pairs(len(a), len(b), lag)
    return float(np.median(b[ib] - a[ia])) if ia.size else float("inf")


def _order_lags(a, b, keys: list[str], tol) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per key, pairs a[i] <-> b[i + L] for the lag L whose neighbouring end differences agree most
    often (``_lag_scores``; a key with one end on a rank pairs it only with the other's only end),
    where a key without a clear best lag takes, of its lags scoring near its best (``NEAR_BEST``), the one whose end differences sit nearest those of the keys
    with a clear lag: every key of two ranks has one clock relation (``_consistent`` fits one
    line through them all), and a lag off by a period is off it by that period. Seen on a real
    2-rank DP + EP program's calling threads on a loaded 2-core host: the MoE all-to-alls (two
    per step, their ends ms apart, the noise over the 1 ms tolerance) scored 32 at a lag of two
    and 31 at 0, while the padding all-reduce's lag 0 scored twice any other; the wrong lag put
    every pair off the line and half the steps lost their instances."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    scored: dict[str, tuple[int, bool, dict[int, int]]] = {}
    for k in keys:
        n, m = len(a[k]), len(b[k])
        if n == 1 or m == 1:
            out[k] = _lag_pairs(n, m, 0) if n == m else (np.empty(0, np.int64), np.empty(0, np.int64))
        else:
            scored[k] = _lag_scores(a[k], b[k], tol[k])
    clear = [k for k, (_, is_clear, _) in scored.items() if is_clear]
    ref = float(np.median([_median_difference(a[k], b[k], scored[k][0]) for k in clear])) if clear else None
    for k, (best, is_clear, scores) in scored.items():
        if ref is not None and not is_clear:
            near = [L for L, sc in scores.items() if sc >= NEAR_BEST * scores[best]]
            best = min(near, key=lambda L: (abs(_median_difference(a[k], b[k], L) - ref), abs(L), L))
        out[k] = _lag_pairs(len(a[k]), len(b[k]), best)
    return {k: out[k] for k in keys}


def line_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Theil-Sen line y = a + b x (``robust.theil_sen``: the robust start of the clock fit)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) == 0:
        return 0.0, 0.0
    return theil_sen(x, y, forward_only=True)


def _consistent(a, b, pairs, tol) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Keep order pairs whose end difference lies within the key's tolerance of one robust line."""
    xs, ys = [], []
    for k, (ia, ib) in pairs.items():
        xs.append(a[k][ia])
        ys.append(b[k][ib] - a[k][ia])
    if not xs:
        return {}
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    if len(x) == 0:
        return {k: v for k, v in pairs.items()}
    x0 = int(np.median(x))
    off, slope = line_fit(x - x0, y)
    out = {}
    for k, (ia, ib) in pairs.items():
        line = off + slope * (a[k][ia] - x0)
        r = b[k][ib] - a[k][ia] - line
        ok = np.abs(r) <= tol[k]
        # one odd end between two consistent neighbours is still the same instance (order holds)
        glitch = ~ok & np.r_[False, ok[:-1]] & np.r_[ok[1:], False]
        keep = ok | glitch
        if tol[k] >= TOL_NS[CPU_SPAN]:
            # host spans: so are noisy ends where the pairs around them agree with the line. A
            # missing instance shifts every later difference by a whole spacing, late releases do
            # not (a host released from a Gloo collective may wake ms late on a loaded CPU)
            around = np.abs(np.nan_to_num(
                pd.Series(r).rolling(NEIGHBOURS, center=True, min_periods=3).median().to_numpy(), nan=np.inf))
            keep |= around <= tol[k]
            if keep.size and (keep.mean() >= ORDER_SHARE or len(ia) == len(a[k]) == len(b[k])):
                # order explains the key (most pairs consistent: the robust line stands on them),
                # or both ranks have the same instances and order pairs every one (a pair is off
                # only if one rank lacks an instance inside AND has an extra one elsewhere). A
                # calling thread's ends (no Gloo worker span) can stay late for many instances in a
                # row on a loaded CPU, their median past the tolerance: those pairs hold while the
                # median stays within half a spacing (order is unambiguous there) and no neighbour
                # of the pair's end on the other rank lies nearer the line (as one would after an
                # instance missing near the sequence's edge)
                keep |= (2 * around < _spacing(a[k])) & _nearest(b[k], ib, a[k][ia] + line)
            # kernel ends are exact and keep the strict rule
        out[k] = (ia[keep], ib[keep])
    return out


def _nearest(ends: np.ndarray, idx: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """True where ``ends[idx]`` is at least as near ``pred`` as its neighbours ``ends[idx -+ 1]``."""
    err = np.abs(ends[idx] - pred)
    before = np.where(idx > 0, np.abs(ends[np.maximum(idx - 1, 0)] - pred), np.inf)
    after = np.where(idx + 1 < len(ends), np.abs(ends[np.minimum(idx + 1, len(ends) - 1)] - pred), np.inf)
    return (err <= before) & (err <= after)


def _vote_track(a, b, keys, tol) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Find the offset most end pairs agree on, then grow matches along time with a drifting line.

    Votes use the keys of the most exact kind and at most VOTE_PAIRS differences, from a central
    block of the anchor's ends; the vote window allows DRIFT_MAX_PPM over the block, so the pairs
    it starts from do not depend on the drift.
    """
    tight = min(tol[k] for k in keys)
    vote_keys = [k for k in keys if tol[k] == tight]
    d_parts, k_parts, i_parts, j_parts = [], [], [], []
    span = 0
    for n_key, k in enumerate(vote_keys):
        ak, bk = a[k], b[k]
        per = max(1, VOTE_PAIRS // max(len(bk) * len(vote_keys), 1))
        i_lo = 0
        if len(ak) > per:
            i_lo = max(0, len(ak) // 2 - per // 2)
        ak = ak[i_lo:i_lo + per]
        span = max(span, int(ak[-1] - ak[0]))
        ii, jj = np.meshgrid(np.arange(len(ak), dtype=np.int64), np.arange(len(bk), dtype=np.int64), indexing="ij")
        d_parts.append((bk[None, :] - ak[:, None]).ravel())
        k_parts.append(np.full(ii.size, n_key, dtype=np.int64))
        i_parts.append(ii.ravel() + i_lo)
        j_parts.append(jj.ravel())
    d = np.concatenate(d_parts)
    order = np.argsort(d, kind="stable")
    d = d[order]
    kk, ii, jj = (np.concatenate(parts)[order] for parts in (k_parts, i_parts, j_parts))
    best: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for scale in (1, 4, 16):  # too few matches at the tight tolerance: widen it
        width = 2 * tight * scale + int(DRIFT_MAX_PPM * 1e-6 * span)
        counts = np.searchsorted(d, d + width, side="right") - np.arange(len(d))
        k0 = int(np.argmax(counts))
        sel = slice(k0, k0 + int(counts[k0]))
        seed = {}
        for n_key, k in enumerate(vote_keys):
            m = kk[sel] == n_key
            seed[k] = _one_to_one(ii[sel][m], jj[sel][m], np.abs(d[sel][m] - np.median(d[sel])))
        found = _track(a, b, keys, {k: tol[k] * scale for k in keys}, seed)
        if sum(len(v[0]) for v in found.values()) >= 3:
            return found
        if sum(len(v[0]) for v in found.values()) > sum(len(v[0]) for v in best.values()):
            best = found
    return best


def _one_to_one(ia: np.ndarray, ib: np.ndarray, err: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each end used once: an end claimed twice (either side) goes to the closer partner."""
    order = np.lexsort((err, ib))
    ia, ib, err = ia[order], ib[order], err[order]
    first = np.r_[True, ib[1:] != ib[:-1]] if len(ib) else np.zeros(0, bool)
    ia, ib, err = ia[first], ib[first], err[first]
    order = np.lexsort((err, ia))
    ia, ib = ia[order], ib[order]
    first = np.r_[True, ia[1:] != ia[:-1]] if len(ia) else np.zeros(0, bool)
    ia, ib = ia[first], ib[first]
    srt = np.argsort(ia, kind="stable")
    return ia[srt], ib[srt]


def _fit_pairs(a, b, pairs) -> tuple[float, float, int, int, int, int]:
    """Robust line through the pairs' end differences: (offset, slope, x0, lo, hi, n)."""
    xs = [a[k][ia] for k, (ia, ib) in pairs.items()]
    ys = [b[k][ib] - a[k][ia] for k, (ia, ib) in pairs.items()]
    x = np.concatenate(xs) if xs else np.empty(0, np.int64)
    y = np.concatenate(ys) if ys else np.empty(0, np.int64)
    if len(x) == 0:
        return 0.0, 0.0, 0, 0, 0, 0
    lo, hi = int(x.min()), int(x.max())
    x0 = int(np.median(x))
    if len(x) >= 2 and hi - lo >= 10_000_000:
        off, slope = line_fit(x - x0, y)
    else:
        off, slope = float(np.median(y)), 0.0
    return off, slope, x0, lo, hi, len(x)


def _track(a, b, keys, tol, seed) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Grow matches from ``seed`` pairs: nearest end to the line's prediction, within the tolerance
    plus DRIFT_MAX_PPM of the distance from the time already covered; refit; repeat until stable."""
    result = {k: seed.get(k, (np.empty(0, np.int64), np.empty(0, np.int64))) for k in keys}
    seen: set = set()
    for _ in range(30):
        off, slope, x0, lo, hi, n = _fit_pairs(a, b, result)
        if n == 0:
            return result
        new = {}
        for k in keys:
            ak, bk = a[k], b[k]
            pred = ak + np.rint(off + slope * (ak - x0)).astype(np.int64)
            if len(bk) > 1:
                j = np.clip(np.searchsorted(bk, pred), 1, len(bk) - 1)
                j = np.where(np.abs(bk[j - 1] - pred) <= np.abs(bk[j] - pred), j - 1, j)
            else:
                j = np.zeros(len(ak), np.int64)
            err = np.abs(bk[j] - pred)
            dist = np.maximum(np.maximum(lo - ak, ak - hi), 0)
            ok = err <= tol[k] + DRIFT_MAX_PPM * 1e-6 * dist
            new[k] = _one_to_one(np.flatnonzero(ok), j[ok], err[ok])
        sig = tuple((k, v[0].tobytes(), v[1].tobytes()) for k, v in sorted(new.items()))
        result = new
        if sig in seen:
            break
        seen.add(sig)
    # final: the plain tolerance around the final line
    off, slope, x0, _, _, _ = _fit_pairs(a, b, result)
    final = {}
    for k, (ia, ib) in result.items():
        r = b[k][ib] - a[k][ia] - (off + slope * (a[k][ia] - x0))
        keep = np.abs(r) <= tol[k]
        final[k] = (ia[keep], ib[keep])
    return final


# ---- output -----------------------------------------------------------------------------------
