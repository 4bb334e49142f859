"""Collective instances of a whole capture (all ranks' events at hand, one clock): the per-rank
candidates of ``profkit.collectives`` with the sync-point names decided over those ranks, matched.

The stage path computes the same per rank and reduces on the driver (``analyze.pipeline``);
these are its whole-capture compositions for tests, notebooks and the whole-capture helpers.
"""
from __future__ import annotations

import pandas as pd

from profkit.collectives.candidates import collective_candidates
from profkit.collectives.instances import instances_from_candidates
from profkit.collectives.syncpoints import decide_sync_names, span_facts
from profkit.analyze.steps import marker_regex


def collective_instances(events: pd.DataFrame, complete_only: bool = True,
                         sync_names: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per (rank, collective instance), ``instance`` shared by the same instance on all ranks.

    ``complete_only`` drops instances some participant lacks (window edges, dropped events);
    alignment passes False, since two ranks that both saw an instance still share its end.
    ``df.attrs["report"]``: counts of instances, complete ones, dropped rows, and notes.
    """
    if sync_names is None:
        sync_names = find_sync_names(events)
    return instances_from_candidates(collective_candidates(events, sync_names), complete_only)


def find_sync_names(events: pd.DataFrame, exclude=None) -> dict[str, str]:
    """Span names that are sync points by cross-rank evidence in ``events`` (all ranks, one
    clock): ``syncpoints.decide_sync_names`` over ``syncpoints.span_facts``. Step markers are
    never sync points (``exclude``: a regex; by default every built-in step marker)."""
    facts, samples = span_facts(events, exclude if exclude is not None else marker_regex())
    return decide_sync_names(facts, samples)
