"""vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM calls ``register()`` in every engine-core process, every worker and the front end. It does
nothing unless ``PROFKIT_CAPTURE=1`` (set by ``profkit capture``), so a pip-installed profkit is
inert in ordinary serving. Then it starts the span recorder and installs the vLLM hook set for
the installed vLLM version (plus a torch.profiler step window if ``PROFKIT_TORCH_STEPS=A:B``).
"""
from __future__ import annotations

import sys


def register() -> None:
    from .autostart import activate, capture_enabled

    if not capture_enabled():
        return
    try:
        activate(("vllm",))
    except Exception as exc:  # noqa: BLE001 - a profiler must never stop vLLM from serving
        print(f"profkit: vLLM plugin not active: {exc!r}", file=sys.stderr)
