"""The consistency line: the straggler verdict and the cause table must tell one story.

The tables below are the misdiagnosis of issue #18 as profkit printed it before sync points were
found from evidence: rank 0 is the straggler (``update_from_output``), rank 1 waited ~500 ms a GC
at the Gloo padding all-reduce, and the cause table charged that wait to the span it waited in
(``dp_padding_allreduce``, 48.8% of step time) with 0.7% as ``waiting for rank 0``.
On every real capture in ``sample_traces/`` the line must stay silent: ``test_name_invariance``
asserts that for each of them.
"""
from __future__ import annotations

import pandas as pd

from profkit.analyze.consistency import verdict_consistency
from profkit.analyze.pipeline import Analysis
from profkit.report.html import render_report
from profkit.report.terminal import render_summary

MS = 1_000_000


def per_rank(wait1_ms: float = 1500.0) -> pd.DataFrame:
    return pd.DataFrame({"rank": [0, 1], "straggler": [True, False], "wait_ns": [int(30 * MS), int(wait1_ms * MS)],
                         "step_total_ns": [int(3100 * MS), int(3100 * MS)], "waited_for_rank": pd.array([1, 0], "Int64"),
                         "top_cause": ["update_from_output", "dp_padding_allreduce"]})


def cause_steps(wait_label_ms: float, span_ms: float) -> pd.DataFrame:
    rows = [(0, 10, "update_from_output", 1250 * MS), (1, 10, "dp_padding_allreduce", span_ms * MS),
            (1, 10, "waiting for rank 0", wait_label_ms * MS), (0, 11, "waiting for rank 1", 20 * MS)]
    return pd.DataFrame(rows, columns=["rank", "step", "cause", "ns"]).astype({"ns": "int64"})


def test_the_old_misdiagnosis_is_a_disagreement():
    lines = verdict_consistency(per_rank(), [0], cause_steps(wait_label_ms=21, span_ms=1513))
    assert len(lines) == 1
    assert lines[0].startswith("rank 1 waited 1500.0 ms at sync points for rank 0, but the cause table charges only 21.0 ms")
    assert "'dp_padding_allreduce'" in lines[0]


def test_a_straggler_nobody_waited_for_is_a_disagreement():
    cs = cause_steps(wait_label_ms=1490, span_ms=5)
    cs = cs[cs["cause"] != "waiting for rank 0"]
    lines = verdict_consistency(per_rank(wait1_ms=100), [0], cs)
    assert lines == ["rank 0 is named a straggler, but no rank's causes include 'waiting for rank 0'"]


def test_agreement_is_silent():
    assert verdict_consistency(per_rank(), [0], cause_steps(wait_label_ms=1490, span_ms=5)) == []
    assert verdict_consistency(None, [0], None) == []


def test_the_line_reaches_the_terminal_and_the_report():
    from profkit import schema
    from profkit.ingest.loader import Capture

    cap = Capture(events=schema.empty_frame(), parts=pd.DataFrame(columns=["rank", "source", "path", "key",
                                                                             "rank_origin", "n_events"]),
                  meta={}, skipped=[], warnings=[])
    ranks = pd.DataFrame(columns=["rank", "n_steps", "step_ns_p50", "gpu_busy_ns_p50", "gap_ns_p50",
                                  "step_gpu_idle_share", "window_ns", "gpu_busy_ns", "gpu_idle_ns"])
    steps = pd.DataFrame(columns=["rank", "step", "start_ns", "end_ns", "step_ns", "gpu_busy_ns", "gap_ns"])
    a = Analysis(capture=cap, events=None, alignment=None, steps=steps, timelines=pd.DataFrame(), ranks=ranks,
                 step_marker=None, causes=pd.DataFrame(), consistency=["rank 1 waited <b>5</b> ms"])
    assert "consistency: rank 1 waited <b>5</b> ms" in render_summary(a)
    html = render_report(a)
    assert "rank 1 waited &lt;b&gt;5&lt;/b&gt; ms" in html and "<b>5</b>" not in html
