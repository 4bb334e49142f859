"""Shared test fixtures: where the public reference traces live (../shared/traces)."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLE_TRACES = REPO / "sample_traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.fail(f"public traces not found at {SHARED_TRACES}: the checkout must sit beside shared/")
    return SHARED_TRACES
