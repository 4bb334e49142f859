"""JSON-ready scalars for the ``to_dict`` of result objects (compare sections, balance cost)."""
from __future__ import annotations

import math

import numpy as np


def json_scalar(x):
    """numpy scalars as Python ones; NaN and infinities as None (JSON has neither)."""
    if isinstance(x, (np.floating, np.integer)):
        x = x.item()
    return None if isinstance(x, float) and not math.isfinite(x) else x
