"""Shared test fixtures: where the public reference traces live (../shared/traces)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (derandomize), so CI's verdict on a commit is
# repeatable; HYPOTHESIS_PROFILE=explore draws fresh random examples when hunting for new failures.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLE_TRACES = REPO / "sample_traces"


def benchmark_module(name: str):
    """A script of ``benchmarks/`` imported as a module, for its own logic (the folder is on the
    import path only while it is imported)."""
    import importlib
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.fail(f"public traces not found at {SHARED_TRACES}: the checkout must sit beside shared/")
    return SHARED_TRACES


@pytest.fixture(params=["built", "jit"])
def kernel(request, monkeypatch):
    """The scanner's compiled functions, each way: built ahead of time (``scanbuild``; skipped
    where it cannot be built, e.g. no C compiler) and numba's JIT (``jsonscan``)."""
    pytest.importorskip("numba")
    from profkit.ingest import scanbuild, scanned

    if request.param == "built":
        module = scanbuild.build()
        if module is None:
            pytest.skip("the scanner cannot be built ahead of time here")
    else:
        from profkit.ingest import jsonscan as module
    monkeypatch.setattr(scanned, "_KERNEL", {"scan": module.scan_piece, "gather": module.gather_into,
                                             "threads": request.param == "jit"})
    return request.param
