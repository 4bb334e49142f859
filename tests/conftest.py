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


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.fail(f"public traces not found at {SHARED_TRACES}: the checkout must sit beside shared/")
    return SHARED_TRACES
