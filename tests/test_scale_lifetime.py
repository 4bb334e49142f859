"""A run stopped from outside leaves no process running and, by the next run, nothing on disk.

Before: SIGKILL or SIGTERM to the driver alone left its forked workers blocked for good (holding
their peak heap) and its scratch folder in the temporary directory (``profkit.scale.lifetime``).
The workers here are held inside a read task (a stand-in read that waits), so the driver is
stopped while both are busy: the case where nothing told them to end before.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from profkit.analyze import scratch
from profkit.cli.terminate import TERMINATED_EXIT_CODE, Terminated, terminate_raises
from profkit.scale.executors import START_ENV

pytestmark = [
    pytest.mark.xdist_group("multiprocess"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, flock and /proc: Linux"),
]

# a stand-in for the read task, defined in __main__ (forked workers have it): says it started, waits
STALLED = r'''
import os, sys, time
from pathlib import Path
from profkit.analyze import stages
READY = Path(os.environ["READY_DIR"])

def stalled_read(*args, **kwargs):
    (READY / str(os.getpid())).write_text("in a task\n")
    time.sleep(300)

stages.read_file_task = stalled_read
'''
LIBRARY = STALLED + r'''
from profkit.scale import analyze_paths
analyze_paths(sys.argv[1:], executor="pool", workers=2)
'''
CLI = STALLED + r'''
from profkit.cli.main import main
sys.exit(main(["analyze", *sys.argv[1:], "--executor", "pool", "--workers", "2", "-q"]))
'''
WAIT_S = 60  # liveness bounds, not timings: what normally takes well under a second, on a loaded machine


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lifetime") / "sim"
    subprocess.run([sys.executable, "-m", "profkit.cli.main", "simulate", "--ranks", "2", "--steps", "2", "--seed", "9",
                    "--layers", "1", "-o", str(out), "-q", "--workers", "1"], check=True)
    return out


def _start(code: str, args: list[str], tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """The driver, its scratch under its own temporary directory; returns once both workers are in a task."""
    ready, tmp = tmp_path / "ready", tmp_path / "tmp"
    ready.mkdir()
    tmp.mkdir()
    env = dict(os.environ, READY_DIR=str(ready), TMPDIR=str(tmp), PROFKIT_CACHE="0", **{START_ENV: "fork"})
    driver = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.DEVNULL,
                              stderr=(tmp_path / "stderr").open("w"))
    deadline = time.monotonic() + WAIT_S
    while len(list(ready.iterdir())) < 2:
        assert driver.poll() is None, (tmp_path / "stderr").read_text()
        assert time.monotonic() < deadline, "the workers never started their tasks"
        time.sleep(0.05)
    return driver, ready, tmp


def _running(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie waiting for its new parent to reap it has ended)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def _wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + WAIT_S
    while _running(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _running(pids)


def _scratch_folders(tmp: Path) -> list[Path]:
    return sorted(p for p in tmp.iterdir() if p.name.startswith(scratch.PREFIX))


def _cleaned_up(driver: subprocess.Popen, ready: Path) -> None:
    """Whatever a failed test left running: the driver, then its workers."""
    if driver.poll() is None:
        driver.kill()
        driver.wait()
    for pid in _running([int(p.name) for p in ready.iterdir()]):
        os.kill(pid, signal.SIGKILL)


def test_killed_driver_workers_exit_and_next_run_removes_its_scratch(two_ranks, tmp_path):
    driver, ready, tmp = _start(LIBRARY, [str(two_ranks)], tmp_path)
    try:
        workers = [int(p.name) for p in ready.iterdir()]
        [folder] = _scratch_folders(tmp)
        driver.kill()  # as the OOM killer would: no clean-up runs in the driver
        driver.wait(WAIT_S)
        assert _wait_gone(workers) == [], "the workers outlived their driver"
    finally:
        _cleaned_up(driver, ready)
    assert (folder / scratch.LOCK_NAME).is_file()  # left behind, nobody holds its lock now
    # a young folder is never taken (made, not yet locked, it would look dead), an old one is
    os.utime(folder / scratch.LOCK_NAME)  # young whatever the machine's load made of the wait above
    assert scratch.sweep_dead(tmp) == []
    old = time.time() - 2 * scratch.STALE_AFTER_S
    os.utime(folder / scratch.LOCK_NAME, (old, old))
    assert scratch.sweep_dead(tmp) == [folder]
    assert not folder.exists()


def test_sweep_keeps_live_and_foreign_folders(tmp_path):
    foreign = tmp_path / f"{scratch.PREFIX}not-ours"  # no lock file: an older profkit's, or not profkit's
    foreign.mkdir()
    # a live owner: another process holding its folder's lock
    owner = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom profkit.analyze import scratch\n"
                              "f = scratch.OwnedFolder(); print(f.path, flush=True); time.sleep(300)"],
                             env=dict(os.environ, TMPDIR=str(tmp_path)), stdout=subprocess.PIPE, text=True)
    try:
        live = Path(owner.stdout.readline().strip())
        old = time.time() - 2 * scratch.STALE_AFTER_S
        os.utime(live / scratch.LOCK_NAME, (old, old))
        assert scratch.sweep_dead(tmp_path) == []
        assert live.is_dir() and foreign.is_dir()
    finally:
        owner.kill()
        owner.wait()
    assert scratch.sweep_dead(tmp_path) == [live]  # its owner gone: now it goes
    assert foreign.is_dir()


def test_sigterm_to_the_cli_cleans_up_as_ctrl_c(two_ranks, tmp_path):
    driver, ready, tmp = _start(CLI, [str(two_ranks)], tmp_path)
    try:
        workers = [int(p.name) for p in ready.iterdir()]
        assert len(_scratch_folders(tmp)) == 1
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(WAIT_S) == TERMINATED_EXIT_CODE
        assert "terminated" in (tmp_path / "stderr").read_text()
        assert _running(workers) == [], "the driver returned before its workers ended"  # stopped and joined
    finally:
        _cleaned_up(driver, ready)
    assert _scratch_folders(tmp) == []


def test_terminate_raises_only_inside_and_in_the_main_thread():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        with terminate_raises():
            signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
    seen = []

    def other_thread() -> None:
        with terminate_raises():
            seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen == [before]  # a thread cannot set handlers: left as it was


def test_an_interrupted_cache_write_leaves_no_temporary_folder(two_ranks, tmp_path, monkeypatch):
    from profkit.ingest import cache
    from profkit.ingest.loader import read_file

    root = tmp_path / "cache"
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(root))
    monkeypatch.setenv("PROFKIT_CACHE", "1")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "write_arrow_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        read_file(two_ranks / "rank0.pt.trace.json.gz", None)
    assert root.is_dir() and list(root.iterdir()) == []


def test_a_killed_writers_temporary_folder_goes_once_stale(two_ranks, tmp_path, monkeypatch):
    from profkit.ingest import cache
    from profkit.ingest.loader import read_file

    root = tmp_path / "cache"
    old, young = root / ".tmp-killed", root / ".tmp-writing"
    for folder in (old, young):
        folder.mkdir(parents=True)
        (folder / "part-0.arrow").write_bytes(b"half")
    then = time.time() - 2 * cache.STALE_TMP_S
    os.utime(old, (then, then))
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(root))
    monkeypatch.setenv("PROFKIT_CACHE", "1")
    monkeypatch.setattr(cache, "_swept", set())
    read_file(two_ranks / "rank0.pt.trace.json.gz", None)
    left = sorted(p.name for p in root.iterdir())
    assert ".tmp-killed" not in left and ".tmp-writing" in left  # another writer's may be at work
    assert len(left) == 2  # and the file's own entry was written
