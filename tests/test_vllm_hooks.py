"""Every vLLM hook table resolves against its release's wheel source (0.33.0 and 0.26.0), without
installing vLLM.

Each wheel (~300-340 MB) is downloaded once with ``pip download --no-deps`` into
``~/.cache/profkit-test/wheels`` (``PROFKIT_WHEEL_CACHE`` overrides; a file lock makes parallel
workers download it once) and read with ``zipfile`` + ``ast``: each module, class and method must
exist, no target may be a generator (a span would time only its creation) or a property, and each
use-site patch (a function imported by name into the module that calls it) must name an attribute
that module really imports, from a module that defines it. Skipped, with the reason, when the wheel
cannot be downloaded.
"""
from __future__ import annotations

import ast
import fcntl
import os
import subprocess
import sys
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest

from profkit.instrument.hooksets import vllm as vllm_hooks

VERSIONS = {"0.33.0": vllm_hooks.VLLM_033, "0.26.0": vllm_hooks.VLLM_026}
VERSION = "0.33.0"  # the release vllm.md was read from (REQUIRED below, the use-site checks)
WHEEL_CACHE = Path(os.environ.get("PROFKIT_WHEEL_CACHE", "~/.cache/profkit-test/wheels")).expanduser()
#: targets vllm.md names explicitly (use sites included): the table must keep them
REQUIRED = [
    "vllm.v1.engine.core:EngineCore.step", "vllm.v1.engine.core:EngineCore.step_with_batch_queue",
    "vllm.v1.engine.core:EngineCoreProc._process_engine_step", "vllm.v1.core.sched.scheduler:Scheduler.schedule",
    "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
    "vllm.v1.structured_output:StructuredOutputManager.grammar_bitmask",
    "vllm.v1.engine.core:DPEngineCoreProc._has_global_unfinished_reqs",
    "vllm.config.parallel:ParallelConfig.sync_dp_state",
    "vllm.v1.worker.gpu_model_runner:coordinate_batch_across_dp",
    "vllm.v1.worker.gpu.model_runner:dispatch_cg_and_sync_dp", "vllm.config.parallel:cpu_all_reduce_",
    "vllm.distributed.parallel_state:cpu_all_reduce_", "vllm.v1.worker.gpu_worker:Worker.execute_model",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs",
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.prepare_inputs",
    "vllm.v1.worker.gpu.eplb_utils:EPLBController.step", "vllm.distributed.eplb.eplb_state:EplbState.rearrange",
    "vllm.v1.worker.gpu.async_utils:AsyncOutput.get_output",
    "vllm.v1.engine.output_processor:OutputProcessor.process_outputs",
    "vllm.v1.engine.detokenizer:BaseIncrementalDetokenizer.update",
    "vllm.v1.engine.core_client:AsyncMPClient.get_output_async",
]


def _download(version: str = VERSION) -> Path:
    """The cached wheel, downloaded first if missing. Several xdist workers (or test runs) may ask
    at once: an exclusive lock on the cache serializes them (the second finds the first's wheel),
    and pip downloads into a private folder first, so a wheel in the cache is always complete."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    with open(WHEEL_CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        found = sorted(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
        if found:
            return found[0]
        with tempfile.TemporaryDirectory(dir=WHEEL_CACHE, prefix=".download-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--platform", "manylinux_2_28_x86_64", f"vllm=={version}", "-d", tmp]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            except (OSError, subprocess.TimeoutExpired) as exc:
                pytest.skip(f"cannot download vllm=={version}: {exc}")
            got = sorted(Path(tmp).glob(f"vllm-{version}-*.whl"))
            if proc.returncode != 0 or not got:
                last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                pytest.skip(f"cannot download vllm=={version} (pip exit {proc.returncode}): {last[0]}")
            final = WHEEL_CACHE / got[0].name
            os.replace(got[0], final)  # atomic: same file system
        return final


class Source:
    """Modules of the wheel, parsed on demand."""

    def __init__(self, wheel: Path):
        self.zip = zipfile.ZipFile(wheel)
        self.names = set(self.zip.namelist())

    @lru_cache(maxsize=None)
    def module(self, name: str) -> ast.Module | None:
        base = name.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if path in self.names:
                return ast.parse(self.zip.read(path), filename=path)
        return None


@pytest.fixture(scope="module")
def source() -> Source:
    return Source(_download())


@pytest.fixture(scope="module", params=sorted(VERSIONS))
def versioned(request) -> tuple[str, Source, dict]:
    """(version, its wheel's source, profkit's table for it)."""
    return request.param, Source(_download(request.param)), VERSIONS[request.param]


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Module statements, including those under top-level if/try (version switches)."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        out.append(node)
        if isinstance(node, ast.If) and not _is_type_checking(node.test):
            todo[:0] = node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo[:0] = node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _defines(stmts: list[ast.stmt], name: str) -> ast.AST | None:
    for node in stmts:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
    return None


def _import_of(stmts: list[ast.stmt], module: str, name: str) -> str | None:
    """The absolute module ``name`` is imported from by ``from X import name``, or None."""
    for node in stmts:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name and alias.name == name:
                    if node.level:
                        package = module.split(".")[: -node.level]
                        return ".".join(package + ([node.module] if node.module else []))
                    return node.module
    return None


def _is_generator(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    todo = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return False


def resolve(source: Source, target: str) -> str:
    """'' when ``target`` resolves; else what is wrong. Use sites say where the name comes from."""
    module, _, qual = target.partition(":")
    tree = source.module(module)
    if tree is None:
        return f"no module {module} in the wheel"
    stmts = _top_level(tree)
    parts = qual.split(".")
    if len(parts) == 1:
        node = _defines(stmts, parts[0])
        if node is None:
            origin = _import_of(stmts, module, parts[0])
            if origin is None:
                return f"{module} neither defines nor imports {parts[0]}"
            origin_tree = source.module(origin)
            if origin_tree is None or _defines(_top_level(origin_tree), parts[0]) is None:
                return f"{module} imports {parts[0]} from {origin}, which does not define it"
            return ""
    elif len(parts) == 2:
        cls = _defines(stmts, parts[0])
        if not isinstance(cls, ast.ClassDef):
            return f"{module} has no class {parts[0]}"
        node = _defines(cls.body, parts[1])
        if node is None:
            return f"class {module}.{parts[0]} has no {parts[1]}"
    else:
        return f"unsupported qualname depth: {qual}"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        decorators = {ast.unparse(d).split("(")[0].split(".")[-1] for d in node.decorator_list}
        if "property" in decorators or {"setter", "getter"} & decorators:
            return f"{target} is a property"
        if _is_generator(node):
            return f"{target} is a generator function (a span would time only its creation)"
    elif isinstance(node, ast.ClassDef):
        return f"{target} is a class"
    return ""


def test_every_vllm_target_resolves(versioned):
    """Each release's table resolves in full against that release's source."""
    version, source, table = versioned
    problems = {t: why for t in table if (why := resolve(source, t))}
    assert not problems, f"vllm {version}:\n" + "\n".join(f"{t}: {why}" for t, why in problems.items())


def test_026_table_is_033_minus_what_026_lacks(versioned):
    """The 0.26 table drops exactly the 0.33 targets its source lacks, and nothing it has."""
    version, source, _ = versioned
    if version != "0.26.0":
        pytest.skip("0.26-only check")
    lacking = {t for t in vllm_hooks.VLLM_033 if resolve(source, t)}
    assert lacking == set(vllm_hooks.NOT_IN_026)
    assert set(vllm_hooks.VLLM_026) == set(vllm_hooks.VLLM_033) - lacking


def test_use_site_patches_name_imported_attributes(versioned):
    """Module-level targets not defined in their module must be imported there by name."""
    version, source, table = versioned
    use_sites = []
    for target in table:
        module, _, qual = target.partition(":")
        if "." in qual:
            continue
        stmts = _top_level(source.module(module))
        if _defines(stmts, qual) is None:
            use_sites.append(target)
            assert _import_of(stmts, module, qual), f"vllm {version} {target}: not imported by name"
    required = ["vllm.v1.worker.gpu_model_runner:coordinate_batch_across_dp",
                "vllm.v1.worker.gpu.model_runner:dispatch_cg_and_sync_dp"]
    if version == "0.33.0":
        required += ["vllm.config.parallel:cpu_all_reduce_", "vllm.distributed.parallel_state:cpu_all_reduce_"]
    for target in required:
        assert target in use_sites


def test_table_keeps_the_reference_targets():
    missing = [t for t in REQUIRED if t not in vllm_hooks.VLLM_033]
    assert not missing
    assert set(vllm_hooks.STEP_TARGETS) <= set(vllm_hooks.VLLM_033)
    assert set(vllm_hooks.LEARNERS) <= set(vllm_hooks.VLLM_033)
    assert vllm_hooks.VLLM_033["vllm.v1.engine.core:EngineCore.step"] == ("EngineCore.step", "step")


def test_resolver_catches_mistakes(source):
    assert "no module" in resolve(source, "vllm.v1.nope:X.y")
    assert "has no class" in resolve(source, "vllm.v1.engine.core:Nope.step")
    assert "has no" in resolve(source, "vllm.v1.engine.core:EngineCore.nope")
    assert "neither defines nor imports" in resolve(source, "vllm.v1.worker.gpu_model_runner:nope")
    assert "generator" in resolve(source, "vllm.v1.worker.gpu_model_runner:GPUModelRunner.synchronize_input_prep")


def test_version_table_selection():
    assert vllm_hooks.table_for("0.33.0") is vllm_hooks.VLLM_033
    assert vllm_hooks.table_for("0.26.0") is vllm_hooks.VLLM_026
    assert vllm_hooks.table_for("0.26.1") is vllm_hooks.VLLM_026  # patch releases share a table
    assert vllm_hooks.table_for("0.28.2") is vllm_hooks.VLLM_026  # nearest: 2 minors from 0.26, 5 from 0.33
    assert vllm_hooks.table_for("0.31.0") is vllm_hooks.VLLM_033
    assert vllm_hooks.table_for("0.40.1.dev3") is vllm_hooks.VLLM_033  # newest known for newer
    assert vllm_hooks.table_for(None) is vllm_hooks.VLLM_033
    assert vllm_hooks.describe_choice("0.26.0") == ("0.26", None)
    label, warning = vllm_hooks.describe_choice("0.28.2")
    assert label == "0.26" and "0.28.2" in warning and "0.26" in warning


def test_unknown_version_warns_and_unresolved_targets_are_named(monkeypatch):
    """A release without a table: one VersionWarning naming it; then each target that does not
    resolve warns by name and the Hooks report says why (what the manifest lists)."""
    import types

    from profkit.instrument import hooks as hooks_mod

    with pytest.warns(vllm_hooks.VersionWarning, match="0.29.0"):
        specs = vllm_hooks.specs("0.29.0")
    assert vllm_hooks.CHOSEN == {"version": "0.29.0", "table": "0.26"}
    target = "vllm.v1.core.sched.scheduler:Scheduler.schedule"
    fake = types.ModuleType("vllm.v1.core.sched.scheduler")
    fake.Scheduler = type("Scheduler", (), {"update_from_output": lambda self: None})  # no schedule
    monkeypatch.setitem(sys.modules, "vllm.v1.core.sched.scheduler", fake)
    monkeypatch.setattr(hooks_mod, "_warned", set())
    wanted = [s for s in specs if s.module == "vllm.v1.core.sched.scheduler" and s.qualname.startswith("Scheduler.")]
    with pytest.warns(hooks_mod.HookWarning, match="Scheduler.schedule"):
        h = hooks_mod.Hooks(wanted).install()
    try:
        report = h.report()
        assert report[target]["status"].startswith("missing")
        fired = "vllm.v1.core.sched.scheduler:Scheduler.update_from_output"
        assert report[fired]["status"] == "patched" and report[fired]["calls"] == 0
        fake.Scheduler().update_from_output()
        assert h.report()[fired]["calls"] == 1
    finally:
        h.remove()
