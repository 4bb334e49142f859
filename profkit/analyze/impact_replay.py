"""The what-if replay: every rank's points (``impact_program``) re-timed with some work removed.

Pure numpy over the programs of all ranks. The points of one rank are evaluated in their order;
ranks advance together in a wavefront (one point per rank per round), and a rank waits at a
sync exit until every participant's arrival has been evaluated. Every scenario is a column of
the same arrays, so one pass replays them all. Each round is a few vector operations over
(ranks x scenarios): the cost grows with the points per rank (tens per step), not with the
number of ranks.

Shift form (see ``impact_program``): ``delta`` = replayed - observed time, int64 ns.
``cut`` (removed ns) per edge and per scenario; ``node_cut`` per point (a rank's arrival made
earlier by a fixed amount: the straggler-free bound).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from profkit import native
from profkit.analyze import impact_program as prog

NEG = np.iinfo(np.int64).min // 4  # "no such edge": never the max, never overflows when shifted
NO_JIT_ENV = "PROFKIT_NO_JIT"  # set (any value): the numpy replay even where numba is installed
MIN_COMPILED_ROUNDS = 10_000  # points on a rank from which the compiled replay pays (see ``compiled``)
IN = 3  # incoming edges per point at most: its lane, and two anchors (a GPU point) or its GPU (a resume)


@dataclass
class WorkArrays:
    """The removable work of all ranks as numpy (phases coded once: ``names[code]``)."""

    rank: np.ndarray
    edge: np.ndarray  # global edge id
    step: np.ndarray
    lane: np.ndarray
    code: np.ndarray
    ns: np.ndarray
    names: np.ndarray
    median_share: np.ndarray | None = None  # cache of ``impact._median_step_share``
    _wait_rows: np.ndarray | None = None  # cache of ``wait_rows``

    @property
    def size(self) -> int:
        return int(self.ns.size)

    def wait_rows(self) -> np.ndarray:
        """Which rows are a sync's wait (lane ``WAIT_ON_GPU``): computed once (blocks of scenarios
        on several threads may each compute it the first time; the same array)."""
        if self._wait_rows is None:
            self._wait_rows = self.lane == prog.WAIT_ON_GPU
        return self._wait_rows

    def code_of(self, phase: str) -> int:
        hit = np.flatnonzero(self.names == phase)
        return int(hit[0]) if hit.size else -1

    @classmethod
    def of(cls, work: pd.DataFrame) -> "WorkArrays":
        codes, names = _factorized(work["phase"]) if len(work) else (np.empty(0, np.int64), [])
        return cls(rank=work["rank"].to_numpy(np.int64), edge=work["gedge"].to_numpy(np.int64),
                   step=work["step"].to_numpy(np.int64), lane=work["lane"].to_numpy(np.int64),
                   code=np.asarray(codes, np.int64), ns=work["ns"].to_numpy(np.int64),
                   names=np.asarray(list(names), dtype=object))


@dataclass
class ReplayGraph:
    """All ranks' programs with global point and edge ids."""

    nodes: pd.DataFrame  # NODE_COLUMNS + gid, in rank order then evaluation order
    offsets: np.ndarray  # (ranks + 1,) first gid of each rank's points
    ranks: np.ndarray  # rank of each block
    in_src: np.ndarray  # (n, IN) gid of each incoming edge's source; -1 none; SYNC edges have none
    in_edge: np.ndarray  # (n, IN) global edge id (row of ``edges``), -1 none
    in_slack: np.ndarray  # (n, IN)
    is_exit: np.ndarray  # (n,)
    is_arrive: np.ndarray  # (n,)
    inst: np.ndarray  # (n,) compact instance index of arrivals and exits, -1 otherwise
    arr_nodes: np.ndarray  # arrivals sorted by instance (CSR over instances)
    arr_slack: np.ndarray  # last arrival - this arrival
    arr_bounds: np.ndarray  # (instances + 1,)
    edges: pd.DataFrame  # one row per global edge id: its rank and kind (the links are in in_src / in_edge / in_slack)
    work: WorkArrays
    residual_ns: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return int(self.offsets[-1])


def build_graph(programs: list[prog.RankProgram], consume: bool = False) -> ReplayGraph:
    """Join the ranks' programs: global ids, the arrivals of every instance. ``consume``: each
    program table is released once joined (the driver then never holds the programs and the whole
    graph at once: at DEP256 x 200 each is hundreds of MB)."""
    programs = sorted((p for p in programs if p is not None and len(p.nodes)), key=lambda p: p.rank)
    sizes = np.array([len(p.nodes) for p in programs], np.int64)
    offsets = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    n = int(offsets[-1])
    if not n:
        return _empty_graph()
    nodes = _stack([p.nodes for p in programs], prog.NODE_COLUMNS)
    nodes["gid"] = np.arange(n, dtype=np.int64)
    if consume:
        for p in programs:
            p.nodes = None
    e_sizes = np.array([len(p.edges) for p in programs], np.int64)
    e_base = np.r_[0, np.cumsum(e_sizes)[:-1]].astype(np.int64)  # each rank's first global edge id
    # the edges go into the incoming-edge arrays column by column, each released once used
    edges = _stack([p.edges for p in programs], prog.EDGE_COLUMNS)
    if consume:
        for p in programs:
            p.edges = None
    gid = edges.pop("edge").to_numpy(np.int64) + np.repeat(e_base, e_sizes)
    off_of_edge = np.repeat(offsets[:-1], e_sizes)
    gdst = edges.pop("dst").to_numpy(np.int64) + off_of_edge
    src = edges.pop("src").to_numpy(np.int64)
    gsrc = np.where(src >= 0, src + off_of_edge, -1)
    del src, off_of_edge
    in_src = np.full((n, IN), -1, np.int64)
    in_edge = np.full((n, IN), -1, np.int64)
    in_slack = np.zeros((n, IN), np.int64)
    slot = _slot_in_group(gdst)
    if (slot >= IN).any():
        raise ValueError(f"impact replay: a point with more than {IN} incoming edges")
    in_src[gdst, slot] = gsrc
    in_edge[gdst, slot] = gid
    in_slack[gdst, slot] = edges.pop("slack_ns").to_numpy(np.int64)
    del slot, gdst, gsrc, gid
    # the edges' links now live in in_src / in_edge / in_slack: of the table, each edge's rank and kind stay
    with_work = [(p, base) for p, base in zip(programs, e_base) if len(p.work)]
    if with_work:
        work_rows = [len(p.work) for p, _ in with_work]
        work = _stack([p.work for p, _ in with_work], prog.WORK_COLUMNS, text=("phase",))
        if consume:
            for p, _ in with_work:
                p.work = None
        work["gedge"] = work["edge"].to_numpy(np.int64) + np.repeat(
            np.array([b for _, b in with_work], np.int64), work_rows)
    else:
        work = prog._empty_work().assign(gedge=pd.Series(dtype="int64"))
    del with_work
    kind = nodes["kind"].to_numpy(np.int64)
    is_exit = kind == prog.EXIT
    is_arrive = kind == prog.ARRIVE
    raw_inst = nodes["instance"].to_numpy(np.int64)
    inst = np.full(n, -1, np.int64)
    sync = is_exit | is_arrive
    uniq, compact = np.unique(raw_inst[sync], return_inverse=True)
    inst[sync] = compact
    arr = np.flatnonzero(is_arrive)
    arr = arr[np.argsort(inst[arr], kind="stable")]
    counts = np.bincount(inst[arr], minlength=uniq.size)
    bounds = np.r_[0, np.cumsum(counts)].astype(np.int64)
    t = nodes["time_ns"].to_numpy(np.int64)
    last = np.maximum.reduceat(t[arr], bounds[:-1][counts > 0]) if arr.size else np.empty(0, np.int64)
    # (reduceat over the non-empty instances only: every instance has its arrivals, see below)
    last_of = np.zeros(uniq.size, np.int64)
    last_of[counts > 0] = last
    arr_slack = last_of[inst[arr]] - t[arr]
    notes = [note for p in programs for note in p.notes]
    # an exit whose instance has no arrival would never be released
    orphan = is_exit & (counts[np.maximum(inst, 0)] == 0) if uniq.size else is_exit
    if orphan.any():
        raise ValueError("impact replay: a sync exit without arrivals")
    return ReplayGraph(nodes=nodes, offsets=offsets, ranks=np.array([p.rank for p in programs], np.int64),
                       in_src=in_src, in_edge=in_edge, in_slack=in_slack, is_exit=is_exit, is_arrive=is_arrive,
                       inst=inst, arr_nodes=arr, arr_slack=arr_slack, arr_bounds=bounds, edges=edges,
                       work=WorkArrays.of(work),
                       residual_ns=int(sum(p.residual_ns for p in programs)), notes=notes)


def _stack(frames: list[pd.DataFrame], columns: list[str], text: tuple[str, ...] = ()) -> pd.DataFrame:
    """The ranks' program tables one after the other, every column int64 (``text`` ones object,
    or a category where every rank's is one: ``_stacked_text``): column by column, not
    through ``pd.concat`` of millions of rows per table."""
    cols = {c: (_stacked_text([f[c] for f in frames]) if c in text
                else np.concatenate([f[c].to_numpy(np.int64) for f in frames])) for c in columns}
    return pd.DataFrame(cols, copy=False)  # object stays object (not inferred as "str": it is coded next)


def _stacked_text(columns: list[pd.Series]) -> pd.Series:
    """A text column of every rank, one after the other: a category where each rank's is one
    without missing values (programs read back from the store: ``stages.load_program``; each
    rank's categories mapped onto their union, no string touched per row), else object."""
    if columns and all(_whole_category(c) for c in columns):
        cats = [np.asarray(c.array.categories, dtype=object) for c in columns]
        union = pd.Index(np.concatenate(cats), dtype=object).unique()
        codes = np.concatenate([union.get_indexer(k)[c.array.codes] for k, c in zip(cats, columns)])
        return pd.Series(pd.Categorical.from_codes(codes, categories=union), copy=False)
    return pd.Series(np.concatenate([c.to_numpy(dtype=object) for c in columns]), dtype=object, copy=False)


def _factorized(text: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize`` of a text column's strings (codes in order of first appearance): of a
    category's codes where it is one (the same codes and names, without hashing a string a row)."""
    if _whole_category(text):
        codes, first = pd.factorize(text.array.codes.astype(np.int64))
        return codes, np.asarray(text.array.categories, dtype=object)[first]
    return pd.factorize(text.to_numpy(dtype=object))


def _whole_category(text: pd.Series) -> bool:
    """A category column without missing values: its codes stand for its strings one to one."""
    return isinstance(text.dtype, pd.CategoricalDtype) and not (text.array.codes < 0).any()


def _slot_in_group(keys: np.ndarray) -> np.ndarray:
    """Each row's position among the earlier rows with its key (``groupby(keys).cumcount()``)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    run_start = np.r_[True, ordered[1:] != ordered[:-1]] if keys.size else np.zeros(0, bool)
    first = np.maximum.accumulate(np.where(run_start, np.arange(keys.size), 0))
    slot = np.empty(keys.size, np.int64)
    slot[order] = np.arange(keys.size) - first
    return slot


def _empty_graph() -> ReplayGraph:
    z2 = np.zeros((0, IN), np.int64)
    z = np.zeros(0, np.int64)
    nodes = pd.DataFrame({c: pd.Series(dtype="int64") for c in prog.NODE_COLUMNS + ["gid"]})
    edges = pd.DataFrame({c: pd.Series(dtype="int64") for c in ("rank", "kind")})
    work = WorkArrays.of(prog._empty_work().assign(gedge=pd.Series(dtype="int64")))
    return ReplayGraph(nodes, np.zeros(1, np.int64), z, z2, z2.copy(), z2.copy(), z.astype(bool), z.astype(bool), z,
                       z, z, np.zeros(1, np.int64), edges, work)


# the kernel compiled ahead of time (``profkit.native``): imported without numba in about a millisecond
_BUILT_SIGNATURE = ("i8(i8[::1], i8[:, ::1], i8[:, ::1], i8[:, ::1], b1[::1], b1[::1], i8[::1], i8[::1], i8[::1], "
                    "i8[::1], i8[::1], i8[:, ::1], i8[:, ::1], b1, i8[:, ::1])")
BUILT_TARGET = native.Target("_profkit_replay", "profkit.analyze.replay_kernel",
                             (Path(__file__).with_name("replay_kernel.py"),), (("replay_points", _BUILT_SIGNATURE),),
                             Path(__file__).parent, use_nrt=True,  # the kernel allocates its work arrays
                             release_gil=True)  # scenario blocks replay side by side on threads


@functools.lru_cache(maxsize=1)
def _built_name() -> str | None:
    return native.name(BUILT_TARGET)


def _built():
    """The kernel compiled ahead of time, if it was built on this machine (never builds; no numba)."""
    module = native.compiled(BUILT_TARGET, _built_name())
    return None if module is None else module.replay_points


def build_kernel():
    """Build the kernel ahead of time (numba and a C compiler; ~10 s, once per machine) unless it
    is built or its build failed here; the module, or None."""
    return native.build(BUILT_TARGET, _built_name())


def why_kernel_not_built() -> str:
    return native.why_not_built(BUILT_TARGET, _built_name())


def _kernel():
    """The replay compiled by numba's JIT (``replay_kernel``) when numba is installed and not switched off."""
    if os.environ.get(NO_JIT_ENV):
        return None
    try:
        from profkit.analyze.replay_kernel import replay_points
    except ImportError:
        return None
    return replay_points


def kernel_kind(g: ReplayGraph) -> str | None:
    """Which replay runs on ``g``: ``"built"`` (the kernel compiled ahead of time: any size, it
    costs no numba), ``"jit"`` (numba's JIT, on a rank of at least ``MIN_COMPILED_ROUNDS``
    points: below, numpy's rounds cost less than importing numba and loading the kernel, ~0.9 s a
    process) or None (numpy; also with ``PROFKIT_NO_JIT`` set)."""
    if os.environ.get(NO_JIT_ENV):
        return None
    if _built() is not None:
        return "built"
    rounds = int(np.diff(g.offsets).max()) if g.offsets.size > 1 else 0
    return "jit" if rounds >= MIN_COMPILED_ROUNDS and _kernel() is not None else None


def compiled(g: ReplayGraph) -> bool:
    """Whether ``replay`` runs a compiled kernel on ``g`` (``kernel_kind``)."""
    return kernel_kind(g) is not None


def releases_gil(g: ReplayGraph) -> bool:
    """Whether the replay of ``g`` runs without the GIL, so scenario blocks replay side by side on
    threads: both compiled kernels do (numba's JIT one is ``nogil``, the built one is built so)."""
    return kernel_kind(g) is not None


def replay(g: ReplayGraph, cut: np.ndarray, node_cut: np.ndarray | None = None,
           use_kernel: bool | str | None = None) -> tuple[np.ndarray, int]:
    """Shift of every point per scenario: ``cut`` (edges x scenarios, ns removed on each edge),
    ``node_cut`` (points x scenarios, ns a point is made earlier). Returns (deltas (points x
    scenarios), number of instances released early where clocks disagreed about an order).
    A compiled kernel (``kernel_kind``) where there is one for ``g``, else ``replay_numpy``: the
    same numbers. ``use_kernel``: False the numpy replay; ``"jit"`` / ``"built"`` that kernel
    (numba, or the module built ahead of time); True the built one where built, else the JIT."""
    if use_kernel is None:
        use_kernel = kernel_kind(g) or False
    if not use_kernel or not g.n:
        return replay_numpy(g, cut, node_cut)
    if use_kernel is True:
        use_kernel = "built" if _built() is not None else "jit"
    if use_kernel == "built":
        replay_points = _built()
        if replay_points is None:
            raise RuntimeError(f"the replay kernel is not built ahead of time here ({why_kernel_not_built()})")
    else:
        from profkit.analyze.replay_kernel import replay_points

    args = kernel_args(g, cut, node_cut)
    forced = replay_points(*args)
    return args[-1], int(forced)


def kernel_args(g: ReplayGraph, cut: np.ndarray, node_cut: np.ndarray | None = None) -> list:
    """The compiled kernel's arguments for ``replay``'s inputs; the last is the deltas it fills."""
    s_count = cut.shape[1] if cut.ndim == 2 else 1
    delta = np.zeros((g.n, s_count), np.int64)
    cut2 = np.ascontiguousarray(cut.reshape(len(cut), s_count), dtype=np.int64)
    use_node_cut = node_cut is not None
    nc = (np.ascontiguousarray(node_cut.reshape(g.n, s_count), dtype=np.int64) if use_node_cut
          else np.zeros((1, s_count), np.int64))
    # writable C arrays, as ``warm_up``'s (numba compiles, or loads, one kernel per array type; the
    # built module takes exactly those)
    a = [np.require(x, dtype=dt, requirements=["C", "W"]) for x, dt in (
        (g.offsets, np.int64), (g.in_src, np.int64), (g.in_edge, np.int64), (g.in_slack, np.int64),
        (g.is_exit, np.bool_), (g.is_arrive, np.bool_), (g.inst, np.int64), (g.arr_nodes, np.int64),
        (g.arr_slack, np.int64), (g.arr_bounds, np.int64), (g.nodes["time_ns"].to_numpy(np.int64), np.int64))]
    return [*a, cut2, nc, use_node_cut, delta]


WARM_UP_EVENTS = 250_000  # events on one rank from which a run warms the kernel up while workers prepare


def warm_up() -> bool:
    """Have a compiled kernel ready for the driver's replay, in a background thread while the
    workers prepare the ranks of a large capture (``pipeline.run_stages``): build the kernel ahead
    of time where it is not built yet (once per machine, ~10 s of CPU), else, where it cannot be
    built, import numba and load the JIT kernel (from its cache, or compile it) on a graph of no
    points (~2 s the driver would otherwise wait for at the end). False when there is nothing to
    do (the built kernel serves) or no kernel to warm."""
    if os.environ.get(NO_JIT_ENV):
        return False
    if _built() is not None or build_kernel() is not None:
        return False
    kernel = _kernel()
    if kernel is None:
        return False
    z = np.zeros(0, np.int64)
    z2 = np.zeros((0, IN), np.int64)
    kernel(np.zeros(1, np.int64), z2, z2.copy(), z2.copy(), np.zeros(0, bool), np.zeros(0, bool), z.copy(), z.copy(),
           z.copy(), np.zeros(1, np.int64), z.copy(), np.zeros((0, 1), np.int64), np.zeros((1, 1), np.int64), False,
           np.zeros((0, 1), np.int64))
    return True


def main() -> int:
    """``python -m profkit.analyze.impact_replay``: build the replay kernel ahead of time now (e.g. in
    an image) and say where it is, or why numba's JIT or numpy will replay instead. Exit status 1
    if it is not built."""
    return native.say_built(BUILT_TARGET, _built_name(), build_kernel(),
                            ": numba's JIT replays large programs, numpy the others")


def replay_numpy(g: ReplayGraph, cut: np.ndarray, node_cut: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """``replay`` in numpy: all ranks advance together, one point per rank per round."""
    n = g.n
    s_count = cut.shape[1] if cut.ndim == 2 else 1
    delta = np.zeros((n, s_count), np.int64)
    if not n:
        return delta, 0
    n_inst = g.arr_bounds.size - 1
    comp = np.zeros((max(n_inst, 1), s_count), np.int64)
    released = np.zeros(max(n_inst, 1), bool)  # (one spare slot: indexing with -1 -> 0 never fails)
    seen = np.zeros(max(n_inst, 1), np.int64)
    need = np.diff(g.arr_bounds)
    ptr = g.offsets[:-1].copy()
    end = g.offsets[1:]
    forced = 0
    has_edge = g.in_edge >= 0
    edge_idx = np.maximum(g.in_edge, 0)
    src_idx = np.maximum(g.in_src, 0)
    has_src = g.in_src >= 0
    while True:
        act = np.flatnonzero(ptr < end)
        if not act.size:
            break
        cur = ptr[act]
        ex = g.is_exit[cur]
        blocked = ex & ~released[np.maximum(g.inst[cur], 0)]
        if blocked.all():  # clocks disagree about the order of two instances: release the earliest
            k = _earliest(g, cur[blocked])
            _release(g, comp, delta, ptr, k, partial=True)
            released[k] = True
            forced += 1
            continue
        go = cur[~blocked]
        lane_pts = go[~g.is_exit[go]]
        if lane_pts.size:
            src_ok = has_src[lane_pts]
            val = delta[src_idx[lane_pts]] - g.in_slack[lane_pts][:, :, None]  # (k, IN, S)
            val -= np.where(has_edge[lane_pts][:, :, None], cut[edge_idx[lane_pts]], 0)
            val = np.where(src_ok[:, :, None], val, NEG)
            best = val.max(axis=1)
            best = np.where(src_ok.any(axis=1)[:, None], best, 0)  # the start: no edge, no shift
            if node_cut is not None:
                best -= node_cut[lane_pts]
            delta[lane_pts] = best
            arrivals = lane_pts[g.is_arrive[lane_pts]]
            if arrivals.size:
                np.add.at(seen, g.inst[arrivals], 1)
                done = np.unique(g.inst[arrivals])
                done = done[(seen[done] == need[done]) & ~released[done]]
                for k in done:
                    _release(g, comp, delta, ptr, int(k), partial=False)
                released[done] = True
        exits = go[g.is_exit[go]]
        if exits.size:
            delta[exits] = comp[g.inst[exits]]
        ptr[act[~blocked]] += 1
    return delta, forced


def _release(g: ReplayGraph, comp, delta, ptr, k: int, partial: bool) -> None:
    """The completion shift of instance ``k``: the latest shifted arrival (relative to the last
    observed one). ``partial``: only the arrivals already evaluated count."""
    a, b = g.arr_bounds[k], g.arr_bounds[k + 1]
    nodes = g.arr_nodes[a:b]
    slack = g.arr_slack[a:b]
    if partial:
        rank_block = np.searchsorted(g.offsets, nodes, side="right") - 1
        ok = nodes < ptr[rank_block]
        nodes, slack = nodes[ok], slack[ok]
        if not nodes.size:
            comp[k] = 0
            return
    comp[k] = (delta[nodes] - slack[:, None]).max(axis=0)


def _earliest(g: ReplayGraph, exits: np.ndarray) -> int:
    t = g.nodes["time_ns"].to_numpy(np.int64)[exits]
    return int(g.inst[exits[int(np.argmin(t))]])


if __name__ == "__main__":
    import sys

    sys.exit(main())
