"""``benchmarks/captures.py``: which captures it takes, its table, and one real run end to end."""
from __future__ import annotations

from tests.conftest import benchmark_module


def _captures():
    return benchmark_module("captures")


def test_default_captures_are_the_sample_capture_folders_with_torch_or_nsys_traces():
    mod = _captures()
    names = {str(p.relative_to(mod.SAMPLES)) for p in mod.default_captures()}
    assert {"vllm-0.26-h200/torch_clean", "vllm-0.26-h200/nsys_clean", "engine-dep4-h200-capture/torch_faults"} <= names
    assert "vllm-0.26-h200/native_clean" not in names  # spans only: no trace to compare with a floor
    for name in names:
        assert (mod.SAMPLES / name / "manifest.json").is_file()


def test_the_table_shows_the_median_the_floor_ratio_and_the_change_against_a_baseline():
    mod = _captures()
    this = mod.summary([{"wall_s": w, "cpu_s": 2 * w, "ranks": 4} for w in (0.9, 0.5, 0.6)])
    base = mod.summary([{"wall_s": w, "cpu_s": 2 * w, "ranks": 4} for w in (0.8, 0.75, 0.7)])
    assert (this["wall_s"], this["wall_min_s"], this["wall_max_s"], this["cpu_s"], this["n"]) == (0.6, 0.5, 0.9, 1.2, 3)
    row = {"capture": "x", "mb": 3.0, "floor_s": 0.1, "this": this, "baseline": base}
    line = mod.table([row], baseline=True).splitlines()[-1]
    assert line == "| x | 4 | 3.0 | 0.600 | 0.500-0.900 | 1.20 | 0.100 | 6.0 | 0.750 | 1.50 | -20% |"
    no_floor = mod.table([{**row, "floor_s": None}], baseline=False).splitlines()
    assert no_floor[-1].endswith("| 1.20 | n/a | n/a |") and "baseline" not in no_floor[0]


def test_one_run_of_a_real_capture_end_to_end(capsys):
    mod = _captures()
    capture = mod.SAMPLES / "vllm-0.26-h200" / "torch_clean"
    assert mod.main([str(capture), "--repeat", "1", "--no-build"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| vllm-0.26-h200/torch_clean |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "1" and float(cells[3]) > 0 and float(cells[6]) > 0  # one rank, a wall time, a floor

