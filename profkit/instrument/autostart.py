"""Switch instrumentation on in a process of a capture (``PROFKIT_CAPTURE=1``).

``activate()`` starts the recorder (file output to ``PROFKIT_OUT_DIR``, flushes at exit and on
signals, GC spans) and installs the hook sets named in ``PROFKIT_HOOKS`` (comma-separated;
default ``vllm,engine``; ``none`` for spans only). A set's hooks cost nothing until its modules
are imported. With ``PROFKIT_TORCH_STEPS=A:B`` the sets' step targets also drive a torch.profiler
window. Idempotent: the vLLM plugin and the bootstrap ``sitecustomize`` may both call it.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable

from .hooks import Hooks, HookSpec
from .lifecycle import start

CAPTURE_ENV = "PROFKIT_CAPTURE"
_active: list[Hooks] = []


def capture_enabled() -> bool:
    return os.environ.get(CAPTURE_ENV, "").strip() == "1"


def hook_set_names(names: Iterable[str] | None = None) -> list[str]:
    if names is None:
        text = os.environ.get("PROFKIT_HOOKS", "vllm,engine")
        names = [n.strip() for n in text.split(",")]
    return [n for n in names if n and n != "none"]


def activate(hook_sets: Iterable[str] | None = None) -> Hooks:
    """Start recording and install hooks (once per process); returns the installed Hooks."""
    if _active:
        return _active[0]
    from . import hooksets, torch_steps

    start()
    specs: list[HookSpec] = []
    step_targets: set[str] = set()
    for name in hook_set_names(hook_sets):
        try:
            specs.extend(hooksets.load(name))
        except ValueError as exc:
            print(f"profkit: {exc}", file=sys.stderr)
            continue
        module = sys.modules[f"{hooksets.__name__}.{name}"]
        step_targets.update(getattr(module, "STEP_TARGETS", ()))
    try:
        window = torch_steps.from_env()
    except ValueError as exc:
        print(f"profkit: {exc}", file=sys.stderr)
        window = None
    if window is not None:
        specs = [s._replace(pre=window) if s.target in step_targets else s for s in specs]
    hooks = Hooks(specs).install()
    _active.append(hooks)
    return hooks


def capture_env(out_dir: str, *, torch_steps: tuple[int, int] | None = None, hook_sets: Iterable[str] | None = None,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a command whose every Python process should record into ``out_dir``:
    the bootstrap folder first on ``PYTHONPATH`` (reaches processes no plugin reaches), the
    capture switch, the output folder, and optionally a torch step window and the hook sets."""
    from .bootstrap import bootstrap_dir

    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = bootstrap_dir() + (os.pathsep + path if path else "")
    env[CAPTURE_ENV] = "1"
    env["PROFKIT_OUT_DIR"] = os.path.abspath(out_dir)
    if torch_steps is not None:
        env["PROFKIT_TORCH_STEPS"] = f"{torch_steps[0]}:{torch_steps[1]}"
    if hook_sets is not None:
        env["PROFKIT_HOOKS"] = ",".join(hook_sets) or "none"
    return env


def activate_from_env() -> Hooks | None:
    """``activate()`` if this process is part of a capture, else nothing."""
    return activate() if capture_enabled() else None
