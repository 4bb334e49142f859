"""Everything ``profkit analyze -o`` writes equals the recorded golden (issue #15: no behaviour change).

Recorded before the restructuring of issue #15, on every capture of ``sample_traces/`` (real H200
captures and the public HTA pair) and two small simulated captures with injected faults
(``GOLDEN_SIMS`` in ``scripts/golden_outputs.py``: DEP4 x 12 Kineto, DEP8 x 8 nsys, fixed seeds).
Per output file: row count, header in order, and per column a hash of the cells in row order (float
cells rounded to ``FLOAT_DIGITS`` = 10 significant digits, everything else exact) with the sum of
numeric columns; ``summary.json`` whole (floats rounded the same way, without ``profkit_version``,
paths relative). ``report.html`` is left out (it embeds a timestamp and is drawn from these tables).
A deliberate change to an output regenerates the golden with

    python scripts/golden_outputs.py outputs --write tests/golden/analyze_outputs.json

and the diff of that file shows what changed.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "analyze_outputs.json"
REGENERATE = "python scripts/golden_outputs.py outputs --write tests/golden/analyze_outputs.json"

pytestmark = pytest.mark.xdist_group("analyze_golden")  # one worker generates the simulated captures once


def _golden_module():
    spec = importlib.util.spec_from_file_location("golden_outputs", REPO / "scripts" / "golden_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


G = _golden_module()
WANT = json.loads(GOLDEN.read_text())


@pytest.fixture(scope="session")
def golden_inputs(tmp_path_factory):
    """(inputs, roots, work folder): sample_traces/ captures and the simulated ones, generated once."""
    work = tmp_path_factory.mktemp("analyze-golden")
    inputs, roots = G.default_output_inputs(work / "sim")
    return inputs, roots, work / "out"


def test_the_inputs_are_those_of_the_golden(golden_inputs):
    inputs, _, _ = golden_inputs
    assert sorted(inputs) == sorted(WANT), f"the inputs changed: regenerate with `{REGENERATE}`"


@pytest.mark.parametrize("name", sorted(WANT))
def test_analyze_outputs_equal_the_golden(golden_inputs, name):
    inputs, roots, work = golden_inputs
    if name not in inputs:
        pytest.fail(f"{name} is in the golden but not among the inputs: regenerate with `{REGENERATE}`")
    got = G.analyze_outputs(inputs[name], work / name, roots)
    diffs = G.output_differences(WANT[name], got)
    assert not diffs, (f"profkit analyze on {name} wrote something else than the golden "
                       f"(if intended: {REGENERATE}):\n" + "\n".join(diffs))


def test_the_fingerprint_sees_a_changed_cell(tmp_path):
    """The check can fail: a changed cell, a reordered row, a renamed column, a float moved in its
    10th digit change the fingerprint; a float moved in its 16th digit does not."""
    def fp(text: str) -> dict:
        path = tmp_path / "t.csv"
        path.write_text(text)
        return G.csv_fingerprint(path)

    base = fp("rank,step_ns,share\n0,100,0.25\n1,200,0.5\n")
    for other in ("rank,step_ns,share\n0,101,0.25\n1,200,0.5\n",
                  "rank,step_ns,share\n1,200,0.5\n0,100,0.25\n",
                  "rank,step_ms,share\n0,100,0.25\n1,200,0.5\n",
                  "rank,step_ns,share\n0,100,0.2500000001\n1,200,0.5\n"):
        assert fp(other) != base, other
        assert G.output_differences(base, fp(other))
    assert fp("rank,step_ns,share\n0,100,0.2500000000000001\n1,200,0.5\n") == base
