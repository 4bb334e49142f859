"""SIGTERM as an exception for the CLI's long runs, so they clean up as Ctrl-C does (the pool's
workers told to stop, the scratch folder removed: ``profkit.scale.lifetime`` says what was left
behind before). Not for a library call: handlers belong to the program, and only its main thread
may set them. Standard library only: ``profkit.cli.main`` imports it for every command."""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

TERMINATED_EXIT_CODE = 128 + signal.SIGTERM  # the shell's code for a command ended by SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread was (a ``KeyboardInterrupt``: every clean-up that
    Ctrl-C runs, runs)."""


@contextmanager
def terminate_raises() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` inside the ``with``; the previous handler is back after. A
    no-op outside the main thread (only it may set handlers) or where SIGTERM is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN:
        yield
        return

    def raise_terminated(signum, frame) -> None:  # noqa: ARG001 - the signal handler's signature
        raise Terminated(f"terminated (signal {signum})")

    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
