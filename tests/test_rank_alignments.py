"""``stages.rank_alignments`` splits the alignment's tables by rank once; each rank's tables are the
rows a filter by that rank gives (what ``rank_alignment`` did per rank), on a real capture whose
ranks have two clock sources each (Kineto and the profkit span file), and for a rank it lacks."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from profkit.align import Alignment
from profkit.analyze import stages
from profkit.scale import analyze_paths

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "sample_traces/engine-dep4-h200-capture/torch_faults"


@pytest.fixture(scope="module")
def alignment(tmp_path_factory) -> Alignment:
    with pytest.MonkeyPatch.context() as m:
        m.setenv("PROFKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        a = analyze_paths([str(CAPTURE)], executor="serial")
    assert len(a.alignment.ranks) == 4 and len(a.alignment.sources) == 8  # two sources a rank
    return a.alignment


def _filtered(alignment: Alignment, rank: int) -> Alignment:
    ranks = alignment.ranks[alignment.ranks["rank"] == rank]
    sources = alignment.sources[alignment.sources["rank"] == rank] if len(alignment.sources) else alignment.sources
    return Alignment(ranks=ranks.reset_index(drop=True), sources=sources.reset_index(drop=True), t0_ns=alignment.t0_ns)


@pytest.mark.parametrize("no_sources", [False, True])
def test_each_rank_gets_its_rows_as_a_filter_gives_them(alignment, no_sources):
    if no_sources:
        alignment = Alignment(ranks=alignment.ranks, sources=alignment.sources.iloc[:0], t0_ns=alignment.t0_ns)
    asked = [3, 0, 9, 1, 2]  # 9: no such rank (its tables empty, typed as the others)
    split = stages.rank_alignments(alignment, asked)
    assert list(split) == asked
    for r in asked:
        want, got = _filtered(alignment, r), split[r]
        assert got.t0_ns == want.t0_ns
        pd.testing.assert_frame_equal(got.ranks, want.ranks, check_exact=True)
        pd.testing.assert_frame_equal(got.sources, want.sources, check_exact=True)
        assert len(got.ranks) == (0 if r == 9 else 1)
        assert len(got.sources) == (0 if r == 9 or no_sources else 2)
        one = stages.rank_alignment(alignment, r)
        pd.testing.assert_frame_equal(one.ranks, want.ranks, check_exact=True)
        pd.testing.assert_frame_equal(one.sources, want.sources, check_exact=True)
