"""torch.profiler windows by step number: the same steps on every rank, not the same wall time.

``PROFKIT_TORCH_STEPS=A:B`` starts the profiler before this process's step call number A
(0-based) and stops it before call number B (or at exit), then writes
``$PROFKIT_OUT_DIR/torch/rank{r}-pid{pid}.pt.trace.json.gz``. Steps are counted on the hook set's
step targets in the process that runs the model (vLLM: ``Worker.execute_model`` plus
``Worker.execute_dummy_batch``, which an idle DP rank runs instead, so counts stay in lockstep).
torch is imported only when the window opens.
"""
from __future__ import annotations

import atexit
import gzip
import os
import shutil
import sys
import threading
from typing import Any

from . import identity


def parse_steps(text: str, env: str = "PROFKIT_TORCH_STEPS") -> tuple[int, int]:
    """``"A:B"`` -> (A, B) with 0 <= A < B; errors name the variable ``env`` it came from."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"{env}={text!r}: expected A:B (step numbers, A < B)") from None
    if a < 0 or b <= a:
        raise ValueError(f"{env}={text!r}: expected 0 <= A < B")
    return a, b


class StepWindow:
    """A ``pre`` hook that counts step calls and opens a profiler window at call A, closes it at
    call B (and at exit if B lies past the last step): the same step numbers on every rank.
    Subclasses say what opening and closing means (``_start(step)`` / ``_stop(step)``)."""

    def __init__(self, start_step: int, stop_step: int):
        self.start_step, self.stop_step = start_step, stop_step
        self.count = 0
        self._lock = threading.Lock()
        atexit.register(self.finish)

    def __call__(self, args: tuple, kwargs: dict) -> None:
        with self._lock:
            step = self.count
            self.count += 1
        if step == self.start_step:
            self._start(step)
        elif step == self.stop_step:
            self._stop(step)

    def _start(self, step: int) -> None:
        raise NotImplementedError

    def _stop(self, step: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Close a window whose end lies past the last step."""
        self._stop(self.count)


class TorchStepWindow(StepWindow):
    """Opens/closes torch.profiler at steps A and B; the trace goes to ``out_dir/torch``."""

    def __init__(self, start_step: int, stop_step: int, out_dir: str):
        self.out_dir = out_dir
        self.prof: Any = None
        self.written: str | None = None
        super().__init__(start_step, stop_step)

    def _start(self, step: int) -> None:
        try:
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=activities)
            self.prof.start()
        except Exception as exc:  # noqa: BLE001 - profiling must never break serving
            self.prof = None
            print(f"profkit: torch.profiler did not start: {exc!r}", file=sys.stderr)

    def _stop(self, step: int) -> None:
        prof, self.prof = self.prof, None
        if prof is None:
            return
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            prof.stop()
            folder = os.path.join(self.out_dir, "torch")
            os.makedirs(folder, exist_ok=True)
            rank = identity.current().refresh().get("rank")
            stem = f"rank{rank}-pid{os.getpid()}" if rank is not None else f"pid{os.getpid()}"
            raw = os.path.join(folder, f"{stem}.pt.trace.json")
            prof.export_chrome_trace(raw)
            with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            os.unlink(raw)
            self.written = raw + ".gz"
        except Exception as exc:  # noqa: BLE001
            print(f"profkit: torch.profiler trace not written: {exc!r}", file=sys.stderr)


def from_env() -> TorchStepWindow | None:
    text = os.environ.get("PROFKIT_TORCH_STEPS", "").strip()
    if not text:
        return None
    a, b = parse_steps(text)
    return TorchStepWindow(a, b, os.environ.get("PROFKIT_OUT_DIR") or ".")
