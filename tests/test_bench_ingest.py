"""``benchmarks/ingest.py``'s own logic (its runs need HTA, which the test setup does not install)."""
from __future__ import annotations

from tests.conftest import benchmark_module


def test_ingest_benchmark_warns_where_profkit_did_not_read_with_its_scanner():
    """``benchmarks/ingest.py`` against HTA says so when the cold runs read with msgspec (a Python
    without numba: a venv made for HTA without profkit's ``fast`` extra), never when they scanned."""
    ingest = benchmark_module("ingest")
    assert "profkit[fast]" in ingest.reader_note(["msgspec"])
    assert ingest.reader_note(["scanner, built ahead of time"]) is None
    assert ingest.reader_note(["msgspec", "scanner, numba JIT"]) is None
    assert ingest.reader_note([]) is None
