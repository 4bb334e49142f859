"""The environment that instruments every Python process of the captured command.

Starts from ``profkit.instrument.autostart.capture_env`` (capture switch, output folder, torch
step window, hook sets) and changes two things: the capture bootstrap replaces the instrument
bootstrap first on ``PYTHONPATH`` (it adds exit-status records and the CUDA profiler window, then
activates the same instrumentation), and the folder holding the ``profkit`` package follows it,
since ``sitecustomize`` runs before the current directory is on ``sys.path`` (profkit run from a
checkout, not installed, would otherwise not be importable there).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import profkit
from profkit.instrument.autostart import capture_env

from . import cuda_steps
from .bootstrap import bootstrap_dir

def package_root() -> str:
    """The folder that holds the ``profkit`` package."""
    return str(Path(profkit.__file__).resolve().parent.parent)


def _installed(root: str) -> bool:
    return Path(root).name in ("site-packages", "dist-packages")


def build_env(out_dir: str, *, torch_steps: tuple[int, int] | None = None,
              cuda_steps_window: tuple[int, int] | None = None, hook_sets: Iterable[str] | None = None,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the command: see the module docstring."""
    env = capture_env(out_dir, torch_steps=torch_steps, hook_sets=hook_sets, base=base)
    from profkit.instrument.bootstrap import bootstrap_dir as instrument_bootstrap

    theirs = os.path.abspath(instrument_bootstrap())
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != theirs]
    front = [bootstrap_dir()]
    root = package_root()
    if not _installed(root) and os.path.abspath(root) not in {os.path.abspath(p) for p in rest}:
        front.append(root)
    env["PYTHONPATH"] = os.pathsep.join(front + rest)
    if cuda_steps_window is not None:
        env[cuda_steps.ENV] = f"{cuda_steps_window[0]}:{cuda_steps_window[1]}"
    else:
        env.pop(cuda_steps.ENV, None)
    if torch_steps is None:
        env.pop("PROFKIT_TORCH_STEPS", None)
    return env
