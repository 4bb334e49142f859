"""``analyze/window.py``: each rank's recorded window and the clip to it, against their pandas
groupby spelling (the first one written) on frames of several ranks and sources, with rows
that have no source, Arrow-backed columns as the store gives them, and one real capture."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import SAMPLE_TRACES
from profkit.analyze.window import clip_to_recorded, recorded_window


def _window_by_groupby(events: pd.DataFrame) -> pd.DataFrame:
    g = events.groupby(["rank", "source"], observed=True)
    ext = pd.DataFrame({"first_ns": g["start_ns"].min(), "last_ns": g["end_ns"].max()}).reset_index()
    out = pd.DataFrame(
        {"first_ns": ext.groupby("rank")["first_ns"].max(), "last_ns": ext.groupby("rank")["last_ns"].min()})
    out.index = out.index.astype("int64")
    return out.astype("int64")


def _clip_by_groupby(events: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, int]]:
    window = _window_by_groupby(events)
    rank = events["rank"].astype("int64")
    lo = rank.map(window["first_ns"]).to_numpy(np.int64)
    hi = rank.map(window["last_ns"]).to_numpy(np.int64)
    inside = (events["start_ns"].to_numpy(np.int64) >= lo) & (events["end_ns"].to_numpy(np.int64) <= hi)
    if inside.all():
        return events, {}
    cut = events.loc[~inside].groupby("rank", observed=True).size()
    return events.loc[inside], {int(r): int(n) for r, n in cut.items() if n}


def _frame(rng: np.random.Generator, arrow: bool) -> pd.DataFrame:
    n = int(rng.integers(1, 400))
    ranks = rng.choice([0, 1, 3, 17], n)
    sources = rng.choice(["torch", "profkit", "nsys"], n)
    start = rng.integers(0, 10_000, n) + 1_000 * np.isin(sources, ["torch"])
    frame = pd.DataFrame({"rank": ranks, "source": sources, "start_ns": start,
                          "end_ns": start + rng.integers(0, 500, n)})
    if arrow:
        frame = frame.astype({"rank": "int32[pyarrow]", "source": "string[pyarrow]",
                              "start_ns": "int64[pyarrow]", "end_ns": "int64[pyarrow]"})
    return frame


@pytest.mark.parametrize("seed", range(20))
def test_recorded_window_and_clip_as_the_groupby_spelling(seed):
    rng = np.random.default_rng(seed)
    frame = _frame(rng, arrow=bool(seed % 2))
    pd.testing.assert_frame_equal(recorded_window(frame), _window_by_groupby(frame), check_exact=True)
    got, cut = clip_to_recorded(frame)
    want, want_cut = _clip_by_groupby(frame)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert cut == want_cut
    if seed == 0:
        assert want_cut  # the torch rows start later: the other sources' early rows are cut
    with_null = frame.astype({"source": "string[pyarrow]"})
    with_null.loc[with_null.index[::3], "source"] = None  # rows without a source take no part
    pd.testing.assert_frame_equal(recorded_window(with_null), _window_by_groupby(with_null), check_exact=True)


def test_real_capture_of_two_sources_per_rank():
    """A profkit capture: span files and torch traces per rank, the torch window the narrower."""
    import profkit

    events = profkit.load(SAMPLE_TRACES / "engine-dep2-h200-capture" / "torch_clean").events
    pd.testing.assert_frame_equal(recorded_window(events), _window_by_groupby(events), check_exact=True)
    got, cut = clip_to_recorded(events)
    want, want_cut = _clip_by_groupby(events)
    assert cut == want_cut and len(got) == len(want) and (got.index == want.index).all()
    assert cut == {0: 415, 1: 415}  # the span files' rows before and after the torch window
