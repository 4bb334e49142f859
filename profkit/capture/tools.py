"""External profilers: finding them, their versions, and the command lines that wrap CMD.

Nsight Systems: ``$PROFKIT_NSYS``, else ``nsys`` on PATH, else the copy Nsight Compute ships
(``/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys``, where the lent GPU machines have
it). Flags for multi-process serving: trace CUDA, NVTX (profkit's spans are NVTX ranges) and OS
runtime calls; follow children that fork before exec (vLLM's workers); trace CUDA graphs per node;
with a step window, record only between cudaProfilerStart and cudaProfilerStop.

py-spy: ``record --subprocesses`` (follows every Python child) in Chrome trace format,
``--nonblocking`` (never pauses the ranks). It needs ptrace rights over the children, which
containers often withhold, so :func:`pyspy_preflight` tries it on a throwaway process first.
"""
from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

NSYS_ENV = "PROFKIT_NSYS"  # also read by profkit.ingest.nsys_rep
NSYS_GLOBS = ("/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
              "/opt/nvidia/nsight-systems/*/bin/nsys", "/usr/local/cuda/bin/nsys")
NSYS_TRACE_FLAGS = ("-t", "cuda,nvtx,osrt", "--trace-fork-before-exec=true", "--cuda-graph-trace=node")
NSYS_RANGE_FLAGS = ("--capture-range=cudaProfilerApi", "--capture-range-end=stop")
PYSPY_ENV = "PROFKIT_PYSPY"


class ToolMissing(RuntimeError):
    """A requested profiler is not installed (the message says where profkit looked)."""


def find_nsys() -> str:
    explicit = os.environ.get(NSYS_ENV)
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise ToolMissing(f"${NSYS_ENV}={explicit} is not an executable file")
    found = shutil.which("nsys")
    if found:
        return found
    for pattern in NSYS_GLOBS:
        hits = sorted(glob.glob(pattern), reverse=True)  # newest version first
        if hits and os.access(hits[0], os.X_OK):
            return hits[0]
    raise ToolMissing(f"--nsys: no Nsight Systems binary: ${NSYS_ENV} is unset, no nsys on PATH, none at "
                      + ", ".join(NSYS_GLOBS) + f". Install Nsight Systems or set {NSYS_ENV}=/path/to/nsys")


def find_pyspy() -> str:
    explicit = os.environ.get(PYSPY_ENV)
    found = explicit or shutil.which("py-spy")
    if not found:
        bindir = Path(sys.executable).parent / "py-spy"  # pip installs it beside this python
        found = str(bindir) if bindir.is_file() else None
    if not found or not os.access(found, os.X_OK):
        raise ToolMissing("--pyspy: py-spy not found (pip install py-spy, or set PROFKIT_PYSPY)")
    return found


def tool_version(binary: str | None) -> str | None:
    """First line of ``binary --version`` (None if it cannot run)."""
    if not binary:
        return None
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    return lines[0] if lines else None


def package_version(name: str) -> str | None:
    """Installed version of a distribution, read from metadata (never imports it: torch is slow)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(nsys: str | None, pyspy: str | None) -> dict[str, str | None]:
    import profkit

    return {"profkit": profkit.__version__, "python": platform.python_version(),
            "python_executable": sys.executable, "torch": package_version("torch"),
            "vllm": package_version("vllm"), "nvtx": package_version("nvtx"),
            "nsys": tool_version(nsys), "py-spy": tool_version(pyspy), "platform": platform.platform()}


def nsys_command(nsys: str, report_stem: str, cmd: list[str], window: bool, extra: list[str]) -> list[str]:
    """``nsys profile`` around CMD; ``window``: record only between cudaProfilerStart/Stop."""
    flags = [*NSYS_TRACE_FLAGS, *(NSYS_RANGE_FLAGS if window else ()), *extra]
    return [nsys, "profile", *flags, "-o", report_stem, "-f", "true", *cmd]


def nsys_export_command(nsys: str, report: str, sqlite: str) -> list[str]:
    return [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", sqlite, report]


def pyspy_command(pyspy: str, out: str, cmd: list[str], rate: int) -> list[str]:
    return [pyspy, "record", "--subprocesses", "--format", "chrometrace", "--nonblocking",
            "--rate", str(rate), "-o", out, "--", *cmd]


def pyspy_preflight(pyspy: str, timeout_s: float = 15.0) -> str | None:
    """None if py-spy can read a child Python process here, else why not (ptrace refused...)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)  # let the interpreter come up, or py-spy finds no Python in it yet
        out = subprocess.run([pyspy, "dump", "--pid", str(sleeper.pid)], capture_output=True, text=True,
                             timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"py-spy could not run: {exc}"
    finally:
        sleeper.kill()
        sleeper.wait()
    if out.returncode == 0:
        return None
    lines = [ln.strip() for ln in (out.stderr + out.stdout).splitlines() if ln.strip()]
    reason = lines[-1] if lines else f"exit {out.returncode}"
    if "ermission" in reason or "ptrace" in reason.lower():
        reason += " (ptrace is forbidden here: needs CAP_SYS_PTRACE or kernel.yama.ptrace_scope <= 1)"
    return f"py-spy cannot attach: {reason}"
