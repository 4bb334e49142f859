"""Host facts of one rank that overhead attribution needs: launching threads, host syncs,
event polling and launch-bound runs of tiny kernels (all from CUDA runtime events).

Thresholds are module constants so tests and users can see (and tune) what "tiny" means.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profkit import distinct
from profkit import intervals as iv
from profkit.names import POLL_RE, SYNC_RE

LAUNCH_RE = re.compile(r"^(?:cuda|cu|hip)(?:LaunchKernel|LaunchCooperativeKernel|GraphLaunch|ModuleLaunchKernel)", re.I)
KERNEL_LAUNCH_RE = re.compile(r"^(?:cuda|cu|hip)(?:LaunchKernel|LaunchCooperativeKernel|ModuleLaunchKernel)", re.I)
COPY_LAUNCH_RE = re.compile(r"^(?:cuda|cu|hip)(?:Memcpy|Memset)", re.I)
# calls that block the host until the GPU (or a copy) is done
POLL_MIN_CALLS = 3  # a busy-polling loop: at least this many queries ...
POLL_MAX_PERIOD_NS = 500_000  # ... each within this of the previous one ...
POLL_MIN_SPAN_NS = 50_000  # ... covering at least this long
TINY_KERNEL_MAX_NS = 10_000  # a kernel shorter than a launch call (~5-8 us) cannot keep the GPU busy
RUN_MAX_PERIOD_NS = 40_000  # launches back to back: start-to-start at most this
RUN_MAX_QUEUE_NS = 50_000  # kernel starts soon after its launch: the GPU was waiting for it
RUN_MIN_LAUNCHES = 16  # a run needs this many tiny launches in a row


def thread_keys(pid: pd.Series, tid: pd.Series) -> np.ndarray:
    """One int64 per (pid, tid): a thread of the rank (null ids read as -1; ``key >> 32`` = pid)."""
    p = pid.fillna(-1).to_numpy(np.int64)
    t = tid.fillna(-1).to_numpy(np.int64)
    return (p << 32) ^ (t & 0xFFFFFFFF)


def runtime_flags(uniques: np.ndarray) -> dict[str, np.ndarray]:
    """Per unique event name: is it a launch (kernel or copy), a kernel launch, a sync, a poll."""
    names = [str(u) for u in uniques]
    every = np.arange(len(names))

    def has(pattern: re.Pattern[str]) -> np.ndarray:
        return distinct.regex_flags(names, every, pattern, "search")

    kernel = has(KERNEL_LAUNCH_RE)
    return {
        "launch": has(LAUNCH_RE) | has(COPY_LAUNCH_RE),
        "kernel_launch": kernel,
        "sync": has(SYNC_RE),
        "poll": has(POLL_RE),
    }


def launching_threads(is_launch: np.ndarray, threads: np.ndarray) -> list[int]:
    """Threads that launch GPU work, busiest first (a thread with <1% of the launches is not one:
    watchdog threads query events, they do not launch)."""
    if not is_launch.any():
        return []
    counts = pd.Series(threads[is_launch]).value_counts()
    keep = counts[counts >= max(1, 0.01 * counts.max())]
    return [int(k) for k in keep.index]


def sync_intervals(is_sync: np.ndarray, is_poll: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> iv.Intervals:
    """Host blocked on the GPU: synchronize calls, blocking copies, and busy-polling loops
    (runs of event/stream queries; vLLM notes event busy-polling can make a rank a straggler)."""
    s = [starts[is_sync]]
    e = [ends[is_sync]]
    if is_poll.sum() >= POLL_MIN_CALLS:
        ps, pe = starts[is_poll], ends[is_poll]
        order = np.argsort(ps, kind="stable")
        ps, pe = ps[order], pe[order]
        run_s, run_e, n = _runs(ps, pe, np.diff(ps) <= POLL_MAX_PERIOD_NS)
        ok = (n >= POLL_MIN_CALLS) & (run_e - run_s >= POLL_MIN_SPAN_NS)
        s.append(run_s[ok])
        e.append(run_e[ok])
    return iv.union(np.concatenate(s), np.concatenate(e))


def launch_runs(
    launch_starts: np.ndarray, kernel_starts: np.ndarray, kernel_ends: np.ndarray
) -> iv.Intervals:
    """Launch-bound runs on one thread: many tiny kernels launched back to back, each starting
    right after its launch (the GPU waited for the host). Returned as [first launch start,
    last kernel end]: the run's wall time, tiny kernels included, is what the launches cost."""
    if launch_starts.size < RUN_MIN_LAUNCHES:
        return iv.empty()
    order = np.argsort(launch_starts, kind="stable")
    ls, ks, ke = launch_starts[order], kernel_starts[order], kernel_ends[order]
    tiny = ((ke - ks) <= TINY_KERNEL_MAX_NS) & ((ks - ls) <= RUN_MAX_QUEUE_NS)
    # link i -> i+1 when both are tiny and the next launch follows quickly
    link = tiny[:-1] & tiny[1:] & (np.diff(ls) <= RUN_MAX_PERIOD_NS)
    run_s, run_e, n = _runs(ls, ke, link)
    ok = n >= RUN_MIN_LAUNCHES  # runs longer than one are tiny throughout (see link)
    return iv.union(run_s[ok], run_e[ok])


def launch_runs_by_thread(
    kernel_corr: np.ndarray, kernel_starts: np.ndarray, kernel_ends: np.ndarray,
    launch_corr: np.ndarray, launch_starts: np.ndarray, launch_threads: np.ndarray,
) -> iv.Intervals:
    """Launch-bound runs of one rank, every launching thread (``launch_runs`` per thread, united).

    Each launch is joined to its kernel by correlation id; a correlation id with more than one
    kernel (a graph replay: one launch, many kernels) is left out, so a replay is never a run.
    One copy for the overhead attribution (``overhead_rank``) and the straggler phases."""
    # one sort by correlation finds the ids held by a single kernel and puts them in order
    # (distinct ids: any sort gives the same order)
    by_corr = np.argsort(kernel_corr, kind="stable")
    sc = kernel_corr[by_corr]
    first = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]]) if sc.size else np.empty(0, np.int64)
    alone = by_corr[first[np.diff(np.r_[first, sc.size]) == 1]]
    kc, ks, ke = kernel_corr[alone], kernel_starts[alone], kernel_ends[alone]
    if not kc.size:
        return iv.empty()
    pos = np.clip(np.searchsorted(kc, launch_corr), 0, kc.size - 1)
    hit = kc[pos] == launch_corr
    ls, lt, kss, kes = launch_starts[hit], launch_threads[hit], ks[pos[hit]], ke[pos[hit]]
    parts_s, parts_e = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for thread in iv.unique_sorted(lt):  # np.unique's hash path is slow on ~10^5 rows
        m = lt == thread
        rs, re_ = launch_runs(ls[m], kss[m], kes[m])
        parts_s.append(rs)
        parts_e.append(re_)
    return iv.union(np.concatenate(parts_s), np.concatenate(parts_e))


def _runs(starts: np.ndarray, ends: np.ndarray, link: np.ndarray):
    """Maximal runs of consecutive items joined by ``link`` (len n-1): start, max end, count."""
    n = starts.size
    brk = np.flatnonzero(~link) + 1
    first = np.concatenate([[0], brk]).astype(np.int64)
    last = np.concatenate([brk - 1, [n - 1]]).astype(np.int64)
    return starts[first], np.maximum.reduceat(ends, first), last - first + 1
