"""Starting and stopping the process's recorder, and flushing it however the process ends.

Flush points: ``atexit``; SIGTERM/SIGINT (flush, then hand the signal to whatever handled it
before: the previous Python handler or the default action re-raised; a signal the process
ignores is left ignored, with no handler of ours, so the process and the programs it starts
behave as without profkit); multiprocessing children (fork: ``os._exit`` skips atexit, so a
multiprocessing finalizer flushes instead); a full buffer or the periodic timer (writer
thread); ``flush()``.
After ``fork`` the child gets its own file (``spans-pid{childpid}.jsonl``), not the parent's spans.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any

from profkit.flags import env_on

from . import gcspans
from .recorder import Recorder, get_recorder

FLUSH_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state: dict[str, Any] = {"process_hooks": False, "previous": {}}


def start(out_dir: str | None = None, *, gc: bool | None = None, signals: bool = True) -> Recorder:
    """Record to ``out_dir`` (default ``$PROFKIT_OUT_DIR``; neither: memory only) with flushes at
    exit and on signals, plus GC pause spans (``gc``; default: unless ``PROFKIT_GC=0``)."""
    rec = get_recorder()
    out = out_dir or os.environ.get("PROFKIT_OUT_DIR") or None
    if out and rec.out_dir is None:
        rec.set_out_dir(out)
    _install_process_hooks(signals)
    if gc is None:
        gc = env_on("PROFKIT_GC")
    if gc:
        gcspans.install()
    return rec


def start_from_env() -> Recorder | None:
    """``start()`` if ``PROFKIT_OUT_DIR`` is set (the first ``profkit.span`` call does this)."""
    if os.environ.get("PROFKIT_OUT_DIR"):
        return start()
    return None


def flush() -> None:
    """Write every span recorded so far (on this thread)."""
    get_recorder().flush()


def stop() -> None:
    """Flush and close the file; remove GC spans and our signal handlers (restoring the previous)."""
    gcspans.uninstall()
    _restore_signals()
    get_recorder().close()


# -- process hooks --------------------------------------------------------------------------------
def _install_process_hooks(signals: bool) -> None:
    if _state["process_hooks"]:
        return
    _state["process_hooks"] = True
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _register_multiprocessing_finalizer()
    if signals:
        _install_signals()


def _at_exit() -> None:
    try:
        get_recorder().close()
    except Exception as exc:  # noqa: BLE001 - exit must go on
        print(f"profkit: final span flush failed: {exc!r}", file=sys.stderr)


def _after_fork_in_child() -> None:
    get_recorder().after_fork_in_child()


class _FinalFlush:
    """Weak-referenceable owner of the multiprocessing after-fork registration."""

    def __call__(self, _obj: Any = None) -> None:
        from multiprocessing import util

        util.Finalize(None, _at_exit, exitpriority=100)


_final_flush = _FinalFlush()


def _register_multiprocessing_finalizer() -> None:
    """multiprocessing fork children end with ``os._exit`` after running its finalizers (atexit is
    skipped), and clear the finalizer registry first: register one after each fork."""
    try:
        from multiprocessing import util
    except Exception:  # noqa: BLE001
        return
    util.register_after_fork(_final_flush, _final_flush)


def _install_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works only in the main thread; atexit still flushes
    for sig in FLUSH_SIGNALS:
        try:
            previous = signal.getsignal(sig)
            if previous is _on_signal or previous == signal.SIG_IGN:
                continue  # an ignored signal ends nothing: a handler would only change what exec'd children inherit
            signal.signal(sig, _on_signal)
            _state["previous"][sig] = previous
        except (ValueError, OSError):
            continue


def _restore_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, previous in list(_state["previous"].items()):
        try:
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            pass
        del _state["previous"][sig]


def _on_signal(signum: int, frame: Any) -> None:
    try:
        get_recorder().flush()
    except Exception as exc:  # noqa: BLE001
        print(f"profkit: span flush on signal {signum} failed: {exc!r}", file=sys.stderr)
    previous = _state["previous"].get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # SIG_DFL (or a handler set outside Python): the default action, as if we were not here
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
