"""In-process half of ``profkit capture``: how this process ends, written where the launcher reads it.

Why: the launcher cannot see the exit status of its grandchildren (their own parents reap them),
yet the manifest must say which rank died. So each process of a capture keeps
``$PROFKIT_OUT_DIR/.capture/pid{pid}.status`` (one JSON object, replaced atomically): written as
``running`` at start, updated on SIGTERM/SIGINT (before profkit's span flush hands the signal on),
on ``sys.exit`` and uncaught exceptions, and at exit (after the span recorder's final flush).
A status still ``running`` after the process is gone means it was killed without running Python
(SIGKILL, a crash in native code, ``os._exit``).

Also opens the CUDA profiler step window (:mod:`.cuda_steps`) before profkit's ``activate()``.
Standard library only: this runs in every Python process of the command.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from . import STATUS_DIR

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state: dict[str, Any] = {"status": None, "previous": {}}


def status_path(out_dir: str, pid: int) -> str:
    return os.path.join(out_dir, STATUS_DIR, f"pid{pid}.status")


class ProcessStatus:
    """This process's status record; ``write()`` replaces the file (tmp + rename)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.pid = os.getpid()
        self.data: dict[str, Any] = {
            "pid": self.pid, "ppid": os.getppid(), "argv": [str(a)[:200] for a in sys.argv[:8]],
            "start_wall_ns": time.time_ns(), "start_mono_ns": time.monotonic_ns(),
            "how": "running", "code": None, "signals": [], "exception": None,
        }
        self._lock = threading.RLock()

    def update(self, **facts: Any) -> None:
        with self._lock:
            self.data.update(facts)
            self.data["updated_wall_ns"] = time.time_ns()
            self.write()

    def write(self) -> None:
        path = status_path(self.out_dir, self.pid)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(self.data))
            os.replace(tmp, path)
        except OSError:
            pass  # a status file is a nicety; never fail the process for it


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _status() -> ProcessStatus | None:
    status = _state["status"]
    return status if status is not None and status.pid == os.getpid() else None


def hook_facts() -> dict[str, Any]:
    """Which hook targets this process patched and how often each fired (for the manifest), and
    which vLLM table it chose. Empty when profkit is not active here."""
    try:
        from profkit.instrument import autostart
        from profkit.instrument.hooksets import vllm as vllm_set

        if not autostart._active:
            return {}
        facts: dict[str, Any] = {"hooks": autostart._active[0].report()}
        if vllm_set.CHOSEN.get("version"):  # vLLM is installed here: which table served it
            facts["vllm_table"] = dict(vllm_set.CHOSEN)
        return facts
    except Exception as exc:  # noqa: BLE001 - the status file must still be written
        return {"hooks_error": repr(exc)[:300]}


def _at_exit() -> None:
    status = _status()
    if status is None:
        return
    how = "exception" if status.data["how"] == "exception" else "exit"
    status.update(how=how, code=status.data["code"] if status.data["code"] is not None else 0,
                  end_wall_ns=time.time_ns(), end_mono_ns=time.monotonic_ns(), **hook_facts())


def _wrap_sys_exit() -> None:
    original = sys.exit

    def exit(code: Any = None) -> None:  # noqa: A001 - stands in for sys.exit
        status = _status()
        if status is not None:
            status.data["code"] = _exit_code(code)
        original(code)

    exit.__wrapped__ = original  # type: ignore[attr-defined]
    sys.exit = exit


def _wrap_excepthook() -> None:
    original = sys.excepthook

    def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
        status = _status()
        if status is not None and not issubclass(exc_type, SystemExit):
            status.update(how="exception", code=1, exception=f"{exc_type.__name__}: {exc}"[:500])
        original(exc_type, exc, tb)

    sys.excepthook = hook


def _on_signal(signum: int, frame: Any) -> None:
    status = _status()
    if status is not None:
        status.update(how="signal", signals=[*status.data["signals"], signal.Signals(signum).name],
                      end_wall_ns=time.time_ns(), **hook_facts())
    previous = _state["previous"].get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        try:
            previous = signal.getsignal(sig)
            if previous is not _on_signal and previous != signal.SIG_IGN:  # ignored: it ends nothing, leave it so
                signal.signal(sig, _on_signal)
                _state["previous"][sig] = previous
        except (ValueError, OSError):
            continue


def _after_fork_in_child() -> None:
    """A forked child is another process: its own status file."""
    parent = _state["status"]
    if parent is not None:
        _state["status"] = ProcessStatus(parent.out_dir)
        _state["status"].write()


def _mp_final(_obj: Any = None) -> None:
    """multiprocessing fork children end with ``os._exit`` (no atexit): finalize from its registry."""
    from multiprocessing import util

    util.Finalize(None, _at_exit, exitpriority=1)  # after profkit's span flush (priority 100)


class _MpHook:
    def __call__(self, obj: Any = None) -> None:
        _mp_final(obj)


_mp_hook = _MpHook()


def start() -> None:
    """Begin the status record, open the step windows, activate profkit (once per process)."""
    if _state["status"] is not None:
        return
    out_dir = os.environ.get("PROFKIT_OUT_DIR")
    if not out_dir:
        return
    _state["status"] = ProcessStatus(out_dir)
    _state["status"].write()
    atexit.register(_at_exit)  # before activate(): atexit is LIFO, so this runs after the span flush
    _wrap_sys_exit()
    _wrap_excepthook()
    os.register_at_fork(after_in_child=_after_fork_in_child)
    try:
        from multiprocessing import util

        util.register_after_fork(_mp_hook, _mp_hook)
    except Exception:  # noqa: BLE001
        pass
    from . import cuda_steps

    cuda_steps.install()
    from profkit.instrument.autostart import activate

    activate()
    _install_signals()  # after activate(): ours runs first, then profkit's flush-and-re-raise
