"""In-process instrumentation: spans (NVTX + a monotonic-clock record), hooks, GC pauses, rank.

Runs inside every serving rank, so it imports only the standard library (``nvtx`` optionally, on
first use); never torch, pandas or pyarrow. Public API:

- ``span(name, category="profkit")``: context manager / decorator (also ``profkit.span``);
- ``start(out_dir=None)``, ``flush()``, ``stop()``: the process recorder's file output;
- ``get_recorder()``, ``use_recorder(rec)``, ``Recorder``, ``SpanRecord``;
- ``Hooks``, ``HookSpec``, ``install_hooks(table)``, ``HookWarning``;
- ``current_identity()``: this process's rank facts.

Environment: ``PROFKIT_OUT_DIR`` (write ``spans-pid{pid}.jsonl`` there), ``PROFKIT_NVTX=0``,
``PROFKIT_GC=0``, ``PROFKIT_SPAN_BUFFER`` (spans per buffer), ``PROFKIT_FLUSH_S`` (periodic flush),
``PROFKIT_RANK``; capture: ``PROFKIT_CAPTURE=1``, ``PROFKIT_HOOKS``, ``PROFKIT_TORCH_STEPS=A:B``.
"""
from __future__ import annotations

from .api import Span, span
from .hooks import HookSpec, Hooks, HookWarning, install_hooks
from .identity import current as current_identity
from .lifecycle import flush, start, stop
from .recorder import Recorder, SpanRecord, get_recorder, use_recorder

__all__ = [
    "span", "Span", "start", "flush", "stop", "get_recorder", "use_recorder", "Recorder", "SpanRecord",
    "Hooks", "HookSpec", "HookWarning", "install_hooks", "current_identity",
]
