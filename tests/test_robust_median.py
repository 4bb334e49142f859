"""``robust.median`` is ``float(np.median(a))``, bit for bit: the clock fits take two medians a
pass (20 passes a rank, ~100 fits at DEP32), and the alignment's offsets, and so every time on
the common clock, must not move when the median is spelled without numpy's generic machinery.
Compared on random arrays of both parities, with ties, NaN, infinities, signed zeros,
subnormals and integers (summed as floats, as ``np.median``'s mean sums them)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from profkit.robust import median, robust_line


def _same(want: float, got: float) -> bool:
    return (np.isnan(want) and np.isnan(got)) or (want == got and np.copysign(1, want) == np.copysign(1, got))


@pytest.mark.parametrize("seed", [0, 1])
def test_median_is_numpys_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    specials = [np.inf, -np.inf, 0.0, -0.0, 5e-324, -5e-324, -1e-323, 1e308, -1e308, 1.0]
    for trial in range(6_000):
        n = int(rng.integers(1, 12)) if trial % 3 else int(rng.integers(1, 2_000))
        kind = trial % 6
        if kind == 0:
            a = rng.normal(size=n) * 10.0 ** int(rng.integers(-5, 15))
        elif kind == 1:
            a = rng.integers(-3, 3, n).astype(float)  # ties
        elif kind == 2:
            a = rng.normal(size=n)
            a[rng.integers(0, n)] = np.nan
        elif kind == 3:
            a = rng.choice(specials, n)
        elif kind == 4:
            a = rng.choice(specials[2:7], n)  # zeros of both signs and subnormals only
        else:
            a = rng.integers(-2**62, 2**62, n)  # integers past float64's: the two middle ones summed as floats
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = float(np.median(a))
        got = median(a.copy())
        assert _same(want, got), (a, want, got)


def test_median_of_nothing_is_nan_as_numpys():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(median(np.empty(0)))


def test_robust_line_recovers_a_shift_and_drift_despite_outliers():
    """The fit the medians serve: an exact line with a few far points is found exactly (the
    module's regression equivariance), the far points rejected."""
    x = np.arange(200, dtype=np.float64) * 1e6
    y = 12_345.0 + 2e-6 * x
    y[[5, 50, 120]] += 5e5
    fit = robust_line(x, y)
    assert abs(fit.offset - 12_345.0) < 1e-3 and abs(fit.slope - 2e-6) < 1e-12
    assert (fit.weights[[5, 50, 120]] == 0).all() and fit.n_used == 197
