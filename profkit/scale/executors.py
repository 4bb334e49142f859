"""Who runs the per-file and per-rank tasks: this process, a local process pool, or Dask.

All three take ``map(fn, calls, labels)`` (one call's arguments per task, a label naming what
the task covers, e.g. "rank 5") and return the results in call order; ``submit`` takes the same
and returns a ``Batch`` at once, whose ``results()`` waits for them, so the driver can work while
the workers do (and a second batch queues behind the first). A task that fails, or whose worker
dies, ends the run with a ``ScaleError`` naming it: never a partial result. A dead worker is
retried first: the pool once on a fresh pool, Dask by its scheduler (a dead worker's tasks go to
another worker, ``distributed.scheduler.allowed-failures`` times).
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import warnings
from concurrent.futures import CancelledError, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

from profkit.analyze.stages import Batch, SerialExecutor, stage_name
from profkit.scale import collector
from profkit.scale.allocator import keep_freed_memory, system_arrow_pool_for_good
from profkit.scale.lifetime import exit_with_parent
from profkit.errors import ScaleError

EXECUTORS = ("serial", "pool", "dask")
START_ENV = "PROFKIT_POOL_START"  # how pool workers start: fork, spawn or forkserver (default: start_method())
START_METHODS = ("fork", "spawn", "forkserver")


def start_method() -> str:
    """How the pool's workers start: ``PROFKIT_POOL_START`` if set; else ``fork`` on Linux while
    this process runs one Python thread, else ``spawn``.

    Why fork: a forked worker starts in milliseconds with every module this process imported,
    where a spawned one imports pandas and the analysis again (~0.8 s of wall time before the
    first task on 2 cores, measured: ``benchmarks/scale.py``), and the main script too. Why only
    then: a thread of ours could hold a lock the child would wait on forever; the C libraries'
    own threads (OpenBLAS, jemalloc) reset themselves at fork. macOS and Windows spawn."""
    asked = os.environ.get(START_ENV, "").strip().lower()
    if asked:
        here = [m for m in START_METHODS if m in multiprocessing.get_all_start_methods()]
        if asked not in here:
            raise ScaleError(f"{START_ENV}={asked!r}: not a start method here (one of {', '.join(here)})")
        return asked
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


def _start_worker() -> None:
    """A pool worker's own settings (the workers are ours, never the caller's process): glibc keeps
    what it frees and Arrow allocates from it (``allocator``), the collector looks less often
    (``collector``), and it leaves when the driver is gone (``lifetime``)."""
    keep_freed_memory()
    system_arrow_pool_for_good()
    collector.in_worker()
    exit_with_parent()


class PoolExecutor(SerialExecutor):
    """A local process pool; its workers fork or spawn (``start_method``), once per pool."""

    name = "pool"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None
        self.method = ""  # how the current pool's workers started

    def _get(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self.method = start_method()
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context(self.method),
                                             initializer=_start_worker)
        return self._pool

    def _submit_all(self, pool: ProcessPoolExecutor, fn: Callable, calls: Sequence[tuple], pending: list[int]) -> dict:
        """Every pending call submitted; a forking pool forks its workers at the first submit, where
        Python 3.12+ warns about the C libraries' threads (see ``start_method``): not ours to act on."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning)
            return {i: pool.submit(fn, *calls[i]) for i in pending}

    def _submit_live(self, fn: Callable, calls: Sequence[tuple], pending: list[int]) -> tuple[ProcessPoolExecutor, dict]:
        """``_submit_all`` on a pool that takes tasks: one that a task of another batch in flight
        broke since it was made is replaced first (its own batch counts that death, not this one)."""
        pool = self._get()
        try:
            return pool, self._submit_all(pool, fn, calls, pending)
        except BrokenProcessPool:
            self.close()
            pool = self._get()
            return pool, self._submit_all(pool, fn, calls, pending)

    def submit(self, fn: Callable, calls: Sequence[tuple], labels: Sequence[str]) -> Batch:
        calls, labels = list(calls), list(labels)
        pool, futures = self._submit_live(fn, calls, list(range(len(calls))))
        return Batch(lambda: self._collect(fn, calls, labels, pool, futures))

    def _collect(self, fn: Callable, calls: list[tuple], labels: list[str], pool: ProcessPoolExecutor,
                 futures: dict) -> list[Any]:
        """The batch's results in call order. A worker that dies breaks its pool: every unfinished
        task of it is lost, of this batch and of any other in flight. They are submitted again to
        a fresh pool, once per pool this batch saw break; a batch whose pool another batch has
        already replaced resubmits without counting a death of its own."""
        results: dict[int, Any] = {}
        deaths = 0
        while True:
            lost: list[int] = []
            for i, fut in futures.items():
                try:
                    results[i] = fut.result()
                except (BrokenProcessPool, CancelledError):
                    lost.append(i)
                except Exception as exc:  # noqa: BLE001
                    self.close()
                    raise ScaleError(f"{labels[i]}: stage {stage_name(fn)!r} failed: {exc!r}") from exc
            if not lost:
                return [results[i] for i in range(len(calls))]
            if self._pool is pool:  # this batch saw its pool break: a death counted against its tasks
                deaths += 1
                self.close()
            if deaths == 2:
                break
            pool, futures = self._submit_live(fn, calls, lost)
        names = ", ".join(labels[i] for i in lost)
        why = "killed, or out of memory?"
        if len(lost) == len(calls) and not results and self.method != "fork":  # no task of the stage ever finished
            why += (" If every task dies at once: the workers start by importing the main script (spawn), so a"
                    " script must call profkit under `if __name__ == \"__main__\":`")
        raise ScaleError(f"{names}: stage {stage_name(fn)!r}: the worker process died twice ({why})")

    def close(self, wait: bool = True) -> None:
        """``wait`` False: the idle workers are told to exit and the caller goes on (9-18 ms a run
        at DEP8 x 100 went to joining them); after a failure, wait: a task still running must
        not outlive the scratch folder its caller removes next."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None

    def stop(self) -> None:
        """Interrupted (Ctrl-C, or SIGTERM through ``cli.terminate``): the workers are ended now,
        not after their running tasks (a rank's task runs for seconds to minutes at DEP256), then
        joined, so none outlives the scratch folder the caller removes next."""
        if self._pool is not None:
            for proc in list((getattr(self._pool, "_processes", None) or {}).values()):  # no public way before 3.14
                if proc.is_alive():
                    proc.terminate()
        self.close()


class DaskExecutor(SerialExecutor):
    """A Dask distributed cluster: ``scheduler`` = its address, or ``local`` = workers of a new
    LocalCluster on this machine (one thread each: the tasks are pandas/numpy, GIL-bound)."""

    name = "dask"

    def __init__(self, scheduler: str | None = None, local: int | None = None) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:  # pragma: no cover - dask is a declared dependency
            raise ScaleError("the Dask executor needs `pip install 'dask[distributed]'`") from exc
        self._cluster = None
        if scheduler:
            self.client = Client(scheduler)
        else:
            import dask.config

            # saturation 1.0: a worker holds only the task it runs, so when a task kills its worker,
            # Dask does not count that death against a bystander queued on the same worker
            with dask.config.set({"distributed.scheduler.worker-saturation": 1.0}):
                self._cluster = LocalCluster(n_workers=max(1, local or 2), threads_per_worker=1, processes=True,
                                             dashboard_address=None)
            self.client = Client(self._cluster)
        self.workers = len(self.client.scheduler_info().get("workers", {})) or (local or 1)

    def submit(self, fn: Callable, calls: Sequence[tuple], labels: Sequence[str]) -> Batch:
        labels = list(labels)
        futures = [self.client.submit(fn, *args, pure=False, key=f"profkit-{stage_name(fn)}-{i}-{os.urandom(4).hex()}")
                   for i, args in enumerate(calls)]
        return Batch(lambda: self._collect(fn, futures, labels))

    def _collect(self, fn: Callable, futures: list, labels: list[str]) -> list[Any]:
        from distributed import KilledWorker

        out = []
        try:
            for fut, label in zip(futures, labels):
                try:
                    out.append(fut.result())
                except KilledWorker as exc:
                    raise ScaleError(_killed_message(fn, futures, labels, label, exc)) from exc
                except ScaleError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    raise ScaleError(f"{label}: stage {stage_name(fn)!r} failed: {exc!r}") from exc
        finally:
            for fut in futures:
                fut.release()
        return out

    def close(self, wait: bool = True) -> None:  # noqa: ARG002 - the client's close is one call either way
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def _killed_message(fn: Callable, futures: list, labels: Sequence[str], label: str, exc: Exception) -> str:
    """Every task of the stage that failed by killed workers, not only the first one awaited: Dask
    counts a worker's death against each task the worker held, so the first failure seen can be a
    bystander of the task that really kills workers (on a shared cluster, saturation above 1)."""
    from distributed import KilledWorker, wait

    wait(futures, return_when="ALL_COMPLETED")
    killed = [lab for fut, lab in zip(futures, labels) if fut.status == "error" and isinstance(fut.exception(), KilledWorker)]
    who = ", ".join(killed or [label])
    them = "them" if len(killed) > 1 else "it"
    return f"{who}: stage {stage_name(fn)!r}: every worker that ran {them} died ({exc})"


def make_executor(executor: str = "pool", workers: int | None = None, scheduler: str | None = None,
                  dask_local: int | None = None) -> SerialExecutor:
    """The executor a user asked for (``--workers``, ``--scheduler``, ``--dask-local``)."""
    if scheduler or dask_local:
        executor = "dask"
    if executor == "serial":
        return SerialExecutor()
    if executor == "pool":
        return PoolExecutor(workers)
    if executor == "dask":
        return DaskExecutor(scheduler, dask_local or workers)
    raise ValueError(f"unknown executor {executor!r}: one of {', '.join(EXECUTORS)}")
