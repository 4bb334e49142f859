"""The notebooks in notebooks/ run top to bottom on the shipped sample traces (kernel python3).

How long they take is not judged here (it depends on the machine's load; the cost is the
analysis of each capture, and each notebook analyzes a capture once: the walkthrough two, the
regressions notebook two). The per-cell timeout only guards against a hang.
"""
from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="install the test extras (nbformat, nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="install the test extras (nbformat, nbclient, ipykernel)")
pytest.importorskip("ipykernel", reason="install the test extras (nbformat, nbclient, ipykernel)")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CELL_TIMEOUT_S = 240  # a hang guard per cell


def run_notebook(name: str) -> str:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name}: commit it without outputs"
    # cwd = notebooks/, as when a user opens it there; the kernel inherits PROFKIT_CACHE_DIR
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text.append(out["text"])
            elif "data" in out:
                text.append(str(out["data"].get("text/plain", "")))
    return "\n".join(text)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))


def test_walkthrough(capsys):
    text = run_notebook("walkthrough.ipynb")
    assert "steps found by marker 'engine_step'" in text
    assert "rank 0 waited longest at: [2, 4, 6, 8, 10, 12, 14, 16, 18]" in text  # the injected steps
    assert "regressed: top cause: waiting for rank 1" in text


def test_regressions(capsys):
    text = run_notebook("regressions.ipynb")
    assert "within noise: no metric moved" in text
    assert "regressed: step time p50 +" in text
    assert "7 panels" in text
