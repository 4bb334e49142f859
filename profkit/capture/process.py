"""The captured command as a child in its own session: Ctrl-C forwarding, escalation, no orphans.

Why its own session: a terminal's Ctrl-C would otherwise hit every rank at once *and* be
forwarded by us, and ranks that start their own process groups would escape a group kill. We
find every process of the session (and, as a child subreaper, every orphaned descendant that
left it) by scanning ``/proc``, and signal them all: first SIGINT (ranks flush their spans; nsys
and py-spy write their reports), after ``grace_s`` SIGTERM, ``kill_after_s`` later SIGKILL. A
second Ctrl-C skips to the next level at once. When the command's main process is gone, whatever
it left behind is stopped the same way, so nothing outlives ``profkit capture``.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

PR_SET_CHILD_SUBREAPER = 36
LEVELS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def become_subreaper() -> bool:
    """Orphaned descendants get reparented to this process (Linux), so they can still be found."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str


def scan_proc() -> dict[int, ProcInfo]:
    """Every process's parent, group, session and state, from ``/proc/*/stat``."""
    out: dict[int, ProcInfo] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2:].split()
        try:
            out[int(entry.name)] = ProcInfo(int(entry.name), int(rest[1]), int(rest[2]), int(rest[3]),
                                            rest[0].decode())
        except (IndexError, ValueError):
            continue
    return out


def related(root_sid: int, me: int, table: dict[int, ProcInfo] | None = None) -> list[int]:
    """Live processes of the command: its session, plus descendants of ``me`` outside it."""
    table = scan_proc() if table is None else table
    kids: dict[int, list[int]] = {}
    for info in table.values():
        kids.setdefault(info.ppid, []).append(info.pid)
    found = {p.pid for p in table.values() if p.sid == root_sid}
    stack = list(kids.get(me, ()))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(kids.get(pid, ()))
    found.discard(me)
    return sorted(p for p in found if p in table and table[p].state != "Z")


@dataclass
class Child:
    """The command's main process, and the escalation ladder used to stop it and its family."""

    argv: list[str]
    env: dict[str, str]
    grace_s: float = 5.0
    kill_after_s: float = 3.0
    proc: subprocess.Popen | None = None
    level: int = -1  # index in LEVELS of the last signal sent; -1: none
    next_at: float | None = None  # monotonic time of the next escalation
    signals_sent: list[str] = field(default_factory=list)
    leftovers: list[int] = field(default_factory=list)  # pids still running after the main process ended

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def members(self) -> list[int]:
        return related(self.pid, os.getpid())

    def send(self, sig: signal.Signals, pids: list[int] | None = None, record: bool = True) -> int:
        """Signal every related process (or ``pids``); returns how many were signalled."""
        pids = self.members() if pids is None else pids
        if self.proc is not None and self.proc.poll() is None and self.pid not in pids:
            pids = [self.pid, *pids]
        n = 0
        for pid in pids:
            try:
                os.kill(pid, sig)
                n += 1
            except (ProcessLookupError, PermissionError):
                continue
        if record:
            self.signals_sent.append(sig.name)
        return n

    def escalate(self, at_least: signal.Signals = signal.SIGINT) -> signal.Signals | None:
        """Send the next signal of the ladder (SIGINT, SIGTERM, SIGKILL), skipping any below
        ``at_least``; None once SIGKILL was sent."""
        level = max(self.level + 1, LEVELS.index(at_least))
        if level >= len(LEVELS):
            return None
        self.level = level
        sig = LEVELS[level]
        self.send(sig)
        wait = self.grace_s if sig == signal.SIGINT else self.kill_after_s
        self.next_at = time.monotonic() + wait if sig != signal.SIGKILL else None
        return sig

    def tick(self) -> signal.Signals | None:
        """Escalate if the current level's wait is over."""
        if self.next_at is not None and time.monotonic() >= self.next_at:
            return self.escalate()
        return None

    def reap_orphans(self) -> None:
        """Collect exit statuses of reparented descendants (we are their subreaper)."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def stop_leftovers(self, settle_s: float = 1.0, timeout_s: float = 3.0) -> list[int]:
        """After the main process ended: give what it left running ``settle_s`` to end by itself
        (helpers such as multiprocessing's resource tracker exit just after their parent), then
        SIGTERM, then SIGKILL. Returns the pids that had to be signalled."""
        deadline = time.monotonic() + settle_s
        while True:
            self.reap_orphans()
            left = self.members()
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if not left:
            return []
        self.send(signal.SIGTERM, left, record=False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.reap_orphans()
            if not self.members():
                return left
            time.sleep(0.1)
        self.send(signal.SIGKILL, self.members(), record=False)
        time.sleep(0.2)
        self.reap_orphans()
        return left
