"""profkit.instrument: the span recorder, its flushes, GC spans, hooks and rank identity.

Anything that touches process-wide state (atexit, signals, fork, the bootstrap) runs in a child
process; in this process each test gets a fresh in-memory or temp-dir recorder.
"""
from __future__ import annotations

import ast
import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

import profkit.instrument as pi
from profkit.instrument import identity
from profkit.instrument.hooks import Hooks, HookSpec, HookWarning
from profkit.instrument.recorder import Recorder, use_recorder
from profkit.instrument.spanfile import SpanFile

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def rec():
    """A fresh in-memory recorder as the process recorder."""
    fresh = Recorder(capacity=100_000, flush_interval_s=0)
    previous = use_recorder(fresh)
    yield fresh
    use_recorder(previous)


@pytest.fixture
def file_rec(tmp_path):
    fresh = Recorder(str(tmp_path / "spans"), capacity=100_000, flush_interval_s=0)
    previous = use_recorder(fresh)
    yield fresh
    fresh.close()
    use_recorder(previous)


@pytest.fixture
def fresh_identity():
    ident = identity.reset()
    yield ident
    identity.reset()


def run_child(code: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=full_env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def wait_until(condition, message: str, timeout_s: float = 120) -> None:
    """Poll ``condition`` until it holds; ``timeout_s`` only guards against a hang."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.01)


def ready_within(child: subprocess.Popen, timeout_s: float) -> bool:
    """True once the child printed ``ready``; False if it did not within ``timeout_s`` (killed)."""
    timer = threading.Timer(timeout_s, child.kill)
    timer.start()
    try:
        return child.stdout.readline().strip() == "ready"
    finally:
        timer.cancel()


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def span_names(path: Path, gc: bool = False) -> list[str]:
    """Span names in a file, in start order; GC pauses only with ``gc`` (they come and go)."""
    from profkit.ingest.spans import read_spans

    table = read_spans(path)[0].table
    return [n for n, k in zip(table.column("name").to_pylist(), table.column("kind").to_pylist())
            if gc or k != "gc"]


# -- the recorder -----------------------------------------------------------------------------------
def test_import_is_light():
    code = ("import sys, profkit.instrument, profkit.instrument.hooksets.vllm, profkit.instrument.vllm_plugin;"
            "print(sorted(m for m in ('torch','pandas','pyarrow','numpy','nvtx','vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_nested_spans_order_and_threads(rec):
    with pi.span("outer"):
        with pi.span("inner", category="cat"):
            time.sleep(0.001)

    def worker():
        with pi.span("in-thread"):
            pass

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    spans = {s.name: s for s in rec.spans()}
    outer, inner, other = spans["outer"], spans["inner"], spans["in-thread"]
    assert [s.name for s in rec.spans()] == ["inner", "outer", "in-thread"]  # recorded when they end
    assert outer.start_ns <= inner.start_ns < inner.end_ns <= outer.end_ns
    assert inner.end_ns - inner.start_ns >= 1_000_000
    assert inner.category == "cat" and outer.category == "profkit"
    assert outer.tid == inner.tid == threading.get_native_id()
    assert other.tid == t.native_id != outer.tid


def test_decorator_and_context_manager(rec):
    @pi.span("named", category="c")
    def f(x, *, y=1):
        """doc"""
        return x + y

    @pi.span
    def bare():
        return 7

    class K:
        @pi.span("K.method")
        def method(self):
            return self

    assert f(1, y=2) == 3 and f.__name__ == "f" and f.__doc__ == "doc" and f.__wrapped__(1) == 2
    assert bare() == 7
    k = K()
    assert k.method() is k
    with pytest.raises(ZeroDivisionError):
        with pi.span("raises"):
            1 / 0
    names = [s.name for s in rec.spans()]
    assert names == ["named", f"{bare.__qualname__}", "K.method", "raises"]
    assert bare.__qualname__.endswith("bare")


def test_async_decorator(rec):
    @pi.span("coro")
    async def coro(delay):
        await asyncio.sleep(delay)
        return delay

    assert asyncio.iscoroutinefunction(coro)
    assert asyncio.run(coro(0.01)) == 0.01
    (s,) = rec.spans()
    assert s.name == "coro" and s.end_ns - s.start_ns >= 10_000_000


def test_buffer_full_is_written_off_thread(file_rec, monkeypatch):
    file_rec.capacity = 50
    writers: list[str] = []
    real_write = SpanFile.write

    def spy(self, spans, *args, **kwargs):
        result = real_write(self, spans, *args, **kwargs)
        writers.append(threading.current_thread().name)  # once the batch is on disk
        return result

    monkeypatch.setattr(SpanFile, "write", spy)
    for _ in range(120):  # 120 spans, 2 buffer swaps
        with pi.span("s"):
            pass
    # the caller never waits for the file: no write ran on this thread during the loop
    assert threading.current_thread().name not in writers
    wait_until(lambda: len(writers) >= 2, "the writer thread never wrote both full buffers")
    assert writers == ["profkit-span-writer"] * 2
    assert len(file_rec._buf) == 20
    assert span_names(Path(file_rec.path)).count("s") == 100
    file_rec.flush()  # the rest, on this thread
    assert writers[-1] == threading.current_thread().name
    assert span_names(Path(file_rec.path)).count("s") == 120


def test_periodic_flush(tmp_path):
    fresh = Recorder(str(tmp_path), capacity=100_000, flush_interval_s=0.05)
    previous = use_recorder(fresh)
    try:
        with pi.span("tick"):
            pass
        # nobody flushes: the timer must (the file appears with its header, the span line after it)
        wait_until(lambda: fresh.path and os.path.exists(fresh.path) and span_names(Path(fresh.path)),
                   "the periodic flush never wrote the span")
        assert span_names(Path(fresh.path)) == ["tick"]
    finally:
        fresh.close()
        use_recorder(previous)


def test_memory_mode_is_bounded(rec):
    rec.capacity = 10
    for _ in range(100):
        with pi.span("m"):
            pass
    assert len(rec.spans()) <= 10 * 2 + 10
    assert rec.dropped > 0 and rec.path is None


def test_gc_spans(rec):
    from profkit.instrument import gcspans

    gcspans.install()
    try:
        gc.collect()
    finally:
        gcspans.uninstall()
    gcs = [s for s in rec.spans() if s.category == "gc"]
    assert gcs and gcs[-1].name == "gc.gen2"
    assert gcs[-1].end_ns > gcs[-1].start_ns
    assert set(gcs[-1].args) == {"collected", "uncollectable"}


def test_gc_only_process_writes_no_file(tmp_path):
    fresh = Recorder(str(tmp_path), capacity=5, flush_interval_s=0)
    previous = use_recorder(fresh)
    from profkit.instrument import gcspans

    gcspans.install()
    try:
        for _ in range(10):
            gc.collect(0)
        fresh.flush()
        assert not os.listdir(tmp_path)  # only GC pauses: a helper process, no file
        with pi.span("real"):
            pass
        fresh.flush()
        names = span_names(Path(fresh.path), gc=True)
        assert "real" in names and names.count("gc.gen0") >= 5  # held GC spans written with it
    finally:
        gcspans.uninstall()
        fresh.close()
        use_recorder(previous)


def test_round_trip_absolute_times(file_rec):
    """Spans come back on wall time: each one's monotonic bracket, moved by the (wall - monotonic)
    offset of an anchor in its file, contains it exactly, and the flush anchors were read on the
    wall clock between the test's own reads of it. Only the order of clock reads is compared, so
    a loaded machine cannot move the verdict (a 1 us wall-clock bound could)."""
    from profkit.ingest.spans import read_spans

    wall_before = time.time_ns()
    bracket = []
    for i in range(50):
        m0 = time.monotonic_ns()  # the recorder's clock (profkit.instrument.clock)
        with pi.span(f"r{i % 5}"):
            time.sleep(0.0002)
        bracket.append((m0, time.monotonic_ns()))
        if i == 25:
            file_rec.flush()  # a second anchor mid-way
    file_rec.flush()
    wall_after = time.time_ns()
    (part,) = read_spans(file_rec.path)
    assert part.source == "profkit" and part.key == f"pid={os.getpid()}"
    starts = part.table.column("start_ns").to_pylist()
    ends = part.table.column("end_ns").to_pylist()
    assert len(starts) == 50
    anchors = [tuple(a) for a in part.meta["anchors"]]
    flushes = [(w, m) for w, m in anchors if m >= bracket[0][0]]
    assert len(flushes) >= 2 and all(wall_before <= w <= wall_after for w, _ in flushes)
    offsets = {w - m for w, m in anchors}
    for (m0, m1), start, end in zip(bracket, starts, ends):
        assert any(m0 + o <= start < end <= m1 + o for o in offsets), (m0, m1, start, end, offsets)
    assert part.table.column("name").to_pylist()[:6] == ["r0", "r1", "r2", "r3", "r4", "r0"]
    assert set(part.table.column("tid").to_pylist()) == {threading.get_native_id()}
    assert len(part.meta["anchors"]) >= 3


# -- process ends: atexit, signals, SIGKILL, fork --------------------------------------------------
CHILD_PRELUDE = """
    import os, sys, time
    import profkit.instrument as pi
    rec = pi.start()
"""


def test_atexit_flush(tmp_path):
    code = CHILD_PRELUDE + """
    for i in range(1000):
        with pi.span("work"):
            pass
    print(rec.path)
    """
    child = run_child(code, {"PROFKIT_OUT_DIR": str(tmp_path), "PROFKIT_SPAN_BUFFER": "300"})
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    path = Path(out.strip())
    assert path.name == f"spans-pid{child.pid}.jsonl"
    assert span_names(path).count("work") == 1000


#: a child that starts the way an interactive Python does: SIGINT raises KeyboardInterrupt and
#: SIGTERM ends it. Run as a background job of a non-interactive shell (``bash .ci/run &``, nohup
#: scripts, some CI runners), the test process inherits SIGINT *ignored*, and so would the child.
DEFAULT_SIGNALS = """
    import signal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_flush_keeps_default_action(tmp_path, sig):
    code = DEFAULT_SIGNALS + CHILD_PRELUDE + """
    for i in range(500):
        with pi.span("before-signal"):
            pass
    print("ready", flush=True)
    time.sleep(600)
    """
    child = run_child(code, {"PROFKIT_OUT_DIR": str(tmp_path)})
    assert ready_within(child, 120), "the child never got ready"
    child.send_signal(sig)
    _, err = child.communicate(timeout=60)  # a hang guard: it ends within a second
    # not swallowed: the default action still ends the process (the child's stderr says why not)
    assert child.returncode == -sig, f"return code {child.returncode}; stderr:\n{err}"
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err  # Python's own handler ran (chained)
    path = tmp_path / f"spans-pid{child.pid}.jsonl"
    names = span_names(path)
    assert names.count("before-signal") == 500, f"{names.count('before-signal')} of 500 spans; stderr:\n{err}"


def test_ignored_signal_stays_ignored(tmp_path):
    """A process that ignores SIGINT (a background job's children inherit that) keeps ignoring it:
    profkit installs no handler for it, so it neither dies nor changes what the processes it
    starts inherit; SIGTERM still flushes."""
    code = """
    import signal, subprocess, sys
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    """ + CHILD_PRELUDE + """
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    inherited = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"],
                               capture_output=True, text=True).stdout.strip()
    with pi.span("before-signals"):
        pass
    print(inherited, flush=True)
    print("ready", flush=True)
    sys.stdin.readline()  # SIGINT arrives here, ignored
    print("survived", flush=True)
    time.sleep(600)
    """
    child = run_child(code, {"PROFKIT_OUT_DIR": str(tmp_path)}, stdin=subprocess.PIPE)
    assert child.stdout.readline().strip() == "True"  # what a subprocess inherits: still ignored
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGINT)
    child.stdin.write("next\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "survived"
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGTERM
    assert span_names(tmp_path / f"spans-pid{child.pid}.jsonl") == ["before-signals"]


def test_sigterm_chains_to_previous_handler(tmp_path):
    code = """
    import os, signal, sys, time
    def mine(signum, frame):
        print("mine", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, mine)
    import profkit.instrument as pi
    pi.start()
    with pi.span("x"):
        pass
    print("ready", flush=True)
    time.sleep(60)
    """
    child = run_child(code, {"PROFKIT_OUT_DIR": str(tmp_path)})
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 3 and "mine" in out
    assert span_names(tmp_path / f"spans-pid{child.pid}.jsonl") == ["x"]


def test_sigkill_keeps_flushed_batches(tmp_path):
    code = CHILD_PRELUDE + """
    for i in range(250):
        with pi.span("k"):
            pass
    while not (os.path.exists(rec.path) and open(rec.path).read().count('"spans"') >= 2):
        time.sleep(0.01)  # until the writer wrote both full buffers (the test's timeout guards a hang)
    print("ready", flush=True)
    time.sleep(600)
    """
    child = run_child(code, {"PROFKIT_OUT_DIR": str(tmp_path), "PROFKIT_SPAN_BUFFER": "100",
                             "PROFKIT_FLUSH_S": "0"})
    assert ready_within(child, 120), "the child's writer never wrote both full buffers"
    child.kill()
    child.communicate(timeout=30)
    path = tmp_path / f"spans-pid{child.pid}.jsonl"
    assert all(line.endswith("\n") for line in path.read_text().splitlines(keepends=True))
    assert span_names(path).count("k") == 200  # the unflushed 50 are lost, nothing else


def test_fork_children_get_their_own_files(tmp_path):
    code = CHILD_PRELUDE + """
    import multiprocessing as mp
    with pi.span("parent-before-fork"):
        pass
    def child():
        with pi.span("mp-child"):
            pass
    p = mp.get_context("fork").Process(target=child)
    p.start(); p.join()
    pid = os.fork()
    if pid == 0:
        with pi.span("os-fork-child"):
            pass
        pi.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    print(p.pid, pid)
    """
    child = run_child(code, {"PROFKIT_OUT_DIR": str(tmp_path)})
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    mp_pid, fork_pid = (int(x) for x in out.split())
    assert span_names(tmp_path / f"spans-pid{child.pid}.jsonl") == ["parent-before-fork"]
    assert span_names(tmp_path / f"spans-pid{mp_pid}.jsonl") == ["mp-child"]  # flushed by os._exit path
    assert span_names(tmp_path / f"spans-pid{fork_pid}.jsonl") == ["os-fork-child"]


def test_no_out_dir_writes_nothing(tmp_path):
    code = CHILD_PRELUDE + """
    with pi.span("x"):
        pass
    print(rec.path, len(rec.spans()))
    """
    env = {k: v for k, v in os.environ.items() if k != "PROFKIT_OUT_DIR"}
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True,
                           text=True, env={**env, "PYTHONPATH": str(REPO)})
    assert child.stdout.split() == ["None", "1"] and not os.listdir(tmp_path)


# -- hooks ----------------------------------------------------------------------------------------
@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A fresh importable package ``hk_<n>`` under tmp_path; returns (name, write(module, code))."""
    name = f"hk_{abs(hash(str(tmp_path))) % 10**8}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text('__version__ = "9.9.1"\n')
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(module: str, code: str) -> None:
        (root / f"{module}.py").write_text(textwrap.dedent(code))

    yield name, write
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


MODULE = """
class Base:
    def inherited(self):
        return "base"

class Cls(Base):
    def method(self, x):
        return x * 2

    @staticmethod
    def stat(x):
        return x + 1

    @classmethod
    def klass(cls, x):
        return (cls.__name__, x)

    async def amethod(self, delay):
        import asyncio
        await asyncio.sleep(delay)
        return delay

def func(x):
    return -x
"""


def test_patch_on_import(pkg, rec):
    name, write = pkg
    write("mod", MODULE)
    hooks = Hooks({f"{name}.mod:Cls.method": ("Cls.method", "test"), f"{name}.mod:func": "func"}).install()
    try:
        assert f"{name}.mod" not in sys.modules
        mod = __import__(f"{name}.mod", fromlist=["x"])
        assert mod.Cls().method(3) == 6 and mod.func(2) == -2
        assert [(s.name, s.category) for s in rec.spans()] == [("Cls.method", "test"), ("func", "profkit")]
        assert type(mod.__spec__.loader).__name__ == "SourceFileLoader"  # the real loader, unshimmed
        assert "exec_module" not in vars(mod.__spec__.loader)
        assert hooks.status() == {f"{name}.mod:Cls.method": "patched", f"{name}.mod:func": "patched"}
    finally:
        hooks.remove()


def test_already_imported_and_remove_restores_exactly(pkg, rec):
    name, write = pkg
    write("mod", MODULE)
    mod = __import__(f"{name}.mod", fromlist=["x"])
    originals = dict(vars(mod.Cls))
    func = mod.func
    targets = ["Cls.method", "Cls.stat", "Cls.klass", "Cls.inherited", "func"]
    hooks = Hooks({f"{name}.mod:{t}": (t, "test") for t in targets}).install()
    assert all(v == "patched" for v in hooks.status().values())
    c = mod.Cls()
    assert c.method(2) == 4 and mod.Cls.stat(1) == 2 and c.stat(1) == 2
    assert mod.Cls.klass(5) == ("Cls", 5) and c.inherited() == "base" and mod.func(1) == -1
    assert [s.name for s in rec.spans()] == ["Cls.method", "Cls.stat", "Cls.stat", "Cls.klass", "Cls.inherited",
                                             "func"]
    assert isinstance(vars(mod.Cls)["stat"], staticmethod) and isinstance(vars(mod.Cls)["klass"], classmethod)
    hooks.remove()
    for key in ("method", "stat", "klass"):
        assert vars(mod.Cls)[key] is originals[key]
    assert "inherited" not in vars(mod.Cls)  # it was inherited: the patch on Cls is gone again
    assert mod.func is func
    n = len(rec.spans())
    c.method(1), mod.func(1)
    assert len(rec.spans()) == n


def test_missing_target_warns_once(pkg, rec):
    name, write = pkg
    write("mod", MODULE)
    table = {f"{name}.mod:Cls.nope": "x", f"{name}.mod:Nope.method": "y", f"{name}.mod:func": "func"}
    with pytest.warns(HookWarning) as caught:
        hooks = Hooks(table).install()
        __import__(f"{name}.mod")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert any(f"{name}.mod:Cls.nope" in m and f"{name} 9.9.1" in m for m in messages)
    assert hooks.status()[f"{name}.mod:func"] == "patched"
    assert hooks.status()[f"{name}.mod:Nope.method"].startswith("missing:")
    hooks.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Hooks(table).install().remove()  # the same targets again: no second warning


def test_async_method_hook(pkg, rec):
    name, write = pkg
    write("mod", MODULE)
    mod = __import__(f"{name}.mod", fromlist=["x"])
    hooks = Hooks({f"{name}.mod:Cls.amethod": ("Cls.amethod", "test")}).install()
    try:
        assert asyncio.iscoroutinefunction(mod.Cls.amethod)
        assert asyncio.run(mod.Cls().amethod(0.01)) == 0.01
        (s,) = rec.spans()
        assert s.name == "Cls.amethod" and s.end_ns - s.start_ns >= 10_000_000
    finally:
        hooks.remove()


def test_generator_target_is_refused(pkg, rec):
    name, write = pkg
    write("gen", "def gen():\n    yield 1\n")
    with pytest.warns(HookWarning, match="generator"):
        hooks = Hooks({f"{name}.gen:gen": "gen"}).install()
        __import__(f"{name}.gen")
    hooks.remove()


def test_use_site_patch(pkg, rec):
    name, write = pkg
    write("defs", "def helper(x):\n    return x + 100\n")
    write("user", f"from {name}.defs import helper\n\ndef call(x):\n    return helper(x)\n")
    hooks = Hooks({f"{name}.defs:helper": ("helper", "dp_sync"),
                   f"{name}.user:helper": ("helper", "dp_sync")}).install()
    user = __import__(f"{name}.user", fromlist=["x"])
    defs = sys.modules[f"{name}.defs"]
    original = defs.helper.__wrapped__
    assert user.call(1) == 101
    assert [s.name for s in rec.spans()] == ["helper"]  # one span, not one per patch
    assert defs.helper(1) == 101 and len(rec.spans()) == 2
    hooks.remove()
    assert defs.helper is original and user.helper is original
    user.call(1)
    assert len(rec.spans()) == 2


def test_use_site_of_already_imported_module(pkg, rec):
    name, write = pkg
    write("defs", "def helper(x):\n    return x\n")
    write("user", f"from {name}.defs import helper\n\ndef call(x):\n    return helper(x)\n")
    user = __import__(f"{name}.user", fromlist=["x"])
    original = user.helper
    hooks = Hooks({f"{name}.user:helper": ("helper", "dp_sync")}).install()
    user.call(1)
    assert [s.name for s in rec.spans()] == ["helper"]
    hooks.remove()
    assert user.helper is original


def test_hook_learns_identity(pkg, rec, fresh_identity, monkeypatch):
    for var in ("PROFKIT_RANK", "VLLM_DP_RANK", "RANK"):
        monkeypatch.delenv(var, raising=False)
    name, write = pkg
    write("mod", "class Engine:\n    rank = 5\n    def step(self):\n        return 1\n")
    learn = lambda args, kwargs: {"rank": args[0].rank}  # noqa: E731
    hooks = Hooks([HookSpec(f"{name}.mod:Engine.step", "Engine.step", "step", learn)]).install()
    mod = __import__(f"{name}.mod", fromlist=["x"])
    mod.Engine().step()
    assert identity.current().rank == 5 and identity.current().header["rank_origin"] == "hook"
    hooks.remove()


# -- identity -------------------------------------------------------------------------------------
def test_identity_from_env(monkeypatch, fresh_identity):
    for var in ("PROFKIT_RANK", "VLLM_DP_RANK", "RANK", "LOCAL_RANK", "VLLM_DP_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert fresh_identity.refresh()["rank"] is None
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("LOCAL_RANK", "3")
    h = fresh_identity.refresh()
    assert (h["rank"], h["rank_origin"], h["local_rank"], h["global_rank"]) == (7, "RANK", 3, 7)
    monkeypatch.setenv("VLLM_DP_RANK", "2")
    h = fresh_identity.refresh()
    assert (h["rank"], h["dp_rank"], h["rank_origin"]) == (2, 2, "VLLM_DP_RANK")
    monkeypatch.setenv("PROFKIT_RANK", "11")
    h = fresh_identity.refresh()
    assert (h["rank"], h["rank_origin"], h["dp_rank"]) == (11, "PROFKIT_RANK", 2)


@pytest.mark.parametrize("title, want", [
    ("VLLM::EngineCore_DP3", {"title_dp_rank": 3, "role": "engine_core"}),
    ("VLLM::Worker_DP2_TP1_DCP1_EP5", {"title_dp_rank": 2, "title_tp_rank": 1, "title_ep_rank": 5,
                                        "role": "worker"}),
    ("EngineCore_DP0", {"title_dp_rank": 0, "role": "engine_core"}),
    ("Worker_DP1", {"title_dp_rank": 1, "role": "worker"}),
    ("VLLM::Worker_PCP1_DCP2", {"role": "worker"}),
    ("python", {}),
])
def test_identity_from_title(title, want):
    facts = identity.from_title(title)
    facts.pop("process_name")
    assert facts == want


def test_identity_priority():
    r = identity.resolve
    assert r({"title_dp_rank": 3, "env_rank": 9})["rank"] == 3  # DP rank beats the global RANK
    assert r({"vllm_dp_rank": 1, "title_dp_rank": 3})["rank"] == 1
    assert r({"learned_rank": 4, "vllm_dp_rank": 1})["rank"] == 4
    assert r({"profkit_rank": 0, "learned_rank": 4})["rank"] == 0
    assert r({"torch_rank": 6})["rank"] == 6 and r({})["rank"] is None


def test_identity_from_vllm_parallel_state(monkeypatch, fresh_identity):
    import types

    group = lambda rank, size: types.SimpleNamespace(rank_in_group=rank, world_size=size)  # noqa: E731
    ps = types.ModuleType("vllm.distributed.parallel_state")
    ps.model_parallel_is_initialized = lambda: True
    ps.get_dp_group = lambda: group(3, 4)
    ps.get_ep_group = lambda: group(3, 4)
    ps.get_tp_group = lambda: group(0, 1)
    ps.get_pp_group = lambda: (_ for _ in ()).throw(AssertionError("pp group is not initialized"))
    monkeypatch.setitem(sys.modules, "vllm.distributed.parallel_state", ps)
    monkeypatch.delenv("PROFKIT_RANK", raising=False)
    h = fresh_identity.refresh()
    assert (h["rank"], h["dp_rank"], h["dp_size"], h["ep_rank"], h["tp_rank"], h["pp_rank"]) == (3, 3, 4, 3, 0, None)
    assert h["rank_origin"] == "vllm parallel state"
    monkeypatch.delitem(sys.modules, "vllm.distributed.parallel_state")
    assert fresh_identity.refresh()["rank"] == 3  # never forgotten (vLLM tears groups down at exit)


# -- hook sets and the plugin ---------------------------------------------------------------------
def test_engine_hookset_targets_exist():
    """Every bundled-engine target is a function in profkit/engine's source (read with ast)."""
    from profkit.instrument.hooksets import engine

    for spec in engine.specs():
        module, qual = spec.module, spec.qualname
        tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
        cls, _, meth = qual.rpartition(".")
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        assert node is not None, f"{spec.target}: no class {cls}"
        assert any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == meth for n in node.body), \
            f"{spec.target}: no method {meth}"
        assert spec.name == qual
    assert any(s.name == "EngineCore.step" for s in engine.specs())


def test_vllm_plugin_is_inert_without_capture_env(tmp_path):
    code = """
    import sys
    from profkit.instrument import vllm_plugin, hooks
    vllm_plugin.register()
    print(any(isinstance(f, hooks._PostImportFinder) for f in sys.meta_path))
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFKIT_")}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(REPO)}, check=True)
    assert out.stdout.strip() == "False"


def test_bootstrap_instruments_a_process(tmp_path):
    """``PYTHONPATH=<bootstrap>`` + ``PROFKIT_CAPTURE=1`` instruments a plain process; the
    sitecustomize it shadows still runs; a process that records nothing leaves no file."""
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_SITECUSTOMIZE_RAN'] = '1'\n")
    bootstrap = REPO / "profkit" / "instrument" / "bootstrap"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bootstrap), str(REPO), str(tmp_path)]),
           "PROFKIT_CAPTURE": "1", "PROFKIT_OUT_DIR": str(tmp_path / "out"), "PROFKIT_RANK": "6"}
    idle = "import os, sys\nprint(os.environ.get('SHADOWED_SITECUSTOMIZE_RAN'), 'profkit.instrument' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", idle], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "True"]
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")
    busy = "import profkit.instrument as pi\nwith pi.span('boot'):\n    pass\n"
    proc = subprocess.run([sys.executable, "-c", busy], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    (path,) = (tmp_path / "out").glob("spans-pid*.jsonl")
    header = read_lines(path)[0]
    assert header["profkit_spans"] == 1 and header["rank"] == 6 and header["rank_origin"] == "PROFKIT_RANK"


def test_bundled_engine_capture(tmp_path):
    """The engine hook set on the real bundled engine (CPU, 2 ranks, engine and worker processes):
    every process names its rank, and each rank has one ``EngineCore.step`` span per step."""
    pytest.importorskip("torch")
    from profkit.ingest.spans import read_spans

    from profkit.instrument.autostart import capture_env

    env = capture_env(str(tmp_path / "spans"), base={**os.environ, "PYTHONPATH": str(REPO)})
    env.pop("PROFKIT_RANK", None)
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith(os.path.join("instrument", "bootstrap"))
    proc = subprocess.run([sys.executable, "-m", "profkit.engine", "--ranks", "2", "--steps", "6", "--split-procs",
                           "--out", str(tmp_path / "out"), "--inject", "gc:rank=1,every=3"],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = [read_spans(p)[0] for p in sorted((tmp_path / "spans").glob("spans-pid*.jsonl"))]
    roles = sorted((p.rank, p.meta["role"]) for p in parts)
    assert roles == [(0, "engine_core"), (0, "worker"), (1, "engine_core"), (1, "worker")]
    for part in parts:
        names = part.table.column("name").to_pylist()
        if part.meta["role"] == "engine_core":
            assert names.count("EngineCore.step") == 6 and names.count("Scheduler.schedule") == 6
        else:
            assert names.count("GPUModelRunner.sync_dp_padding") == 6
    gc_rank1 = [p for p in parts if p.rank == 1 and p.meta["role"] == "engine_core"][0]
    kinds = gc_rank1.table.column("kind").to_pylist()
    assert "gc" in kinds and gc_rank1.meta["gc_collected"] > 0


def test_torch_step_window_counts_calls(tmp_path, monkeypatch):
    from profkit.instrument import torch_steps

    started, stopped = [], []
    window = torch_steps.TorchStepWindow(2, 4, str(tmp_path))
    monkeypatch.setattr(window, "_start", lambda step: started.append(window.count))
    monkeypatch.setattr(window, "_stop", lambda step: stopped.append(window.count))
    for _ in range(6):
        window((), {})
    assert started == [3] and stopped == [5]  # before call #2 and call #4 (0-based)
    assert torch_steps.parse_steps("3:7") == (3, 7)
    with pytest.raises(ValueError):
        torch_steps.parse_steps("7:3")


def test_nvtx_toggle(rec, monkeypatch):
    from profkit.instrument import api, nvtx_ranges

    monkeypatch.setenv("PROFKIT_NVTX", "0")
    api.reset_caches()
    try:
        assert nvtx_ranges.ranges() is None
        with pi.span("no-nvtx"):
            pass
        monkeypatch.setenv("PROFKIT_NVTX", "1")
        api.reset_caches()
        pytest.importorskip("nvtx")
        assert nvtx_ranges.ranges() is not None
        with pi.span("with-nvtx"):
            pass
        assert [s.name for s in rec.spans()] == ["no-nvtx", "with-nvtx"]
    finally:
        api.reset_caches()


def test_vllm_plugin_active_under_capture(tmp_path):
    """With ``PROFKIT_CAPTURE=1`` the plugin starts the recorder and waits for vLLM's modules."""
    code = """
    import sys
    from profkit.instrument import vllm_plugin, hooks, autostart
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM calls it in several places: idempotent
    finder = next(f for f in sys.meta_path if isinstance(f, hooks._PostImportFinder))
    (active,) = autostart._active
    print("vllm.v1.engine.core" in finder.waiting, len(active.specs) > 50, "torch" in sys.modules)
    """
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROFKIT_CAPTURE": "1", "PROFKIT_OUT_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                         env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "False"]


def test_torch_step_window_writes_a_kineto_trace(tmp_path, monkeypatch, fresh_identity):
    pytest.importorskip("torch")
    import gzip

    from profkit.instrument import torch_steps

    monkeypatch.setenv("PROFKIT_RANK", "3")
    window = torch_steps.TorchStepWindow(1, 3, str(tmp_path))
    import torch

    for _ in range(4):
        window((), {})
        torch.ones(64, 64) @ torch.ones(64, 64)
    assert window.written == str(tmp_path / "torch" / f"rank3-pid{os.getpid()}.pt.trace.json.gz")
    doc = json.loads(gzip.open(window.written).read())
    assert "traceEvents" in doc and any(e.get("name") == "aten::mm" for e in doc["traceEvents"])
