"""Do the straggler verdict and the cause table tell the same story?

They are computed from different views (who arrived late at sync points and why, on each rank's
host timeline; what held the GPU-idle time of each step), so a misdiagnosis shows as a
disagreement. The one profkit exists to prevent: a slow rank's victims wait at the next sync
point, and a cause table that charges that wait to the span they waited in names the victims'
sync span as the problem while the verdict names the slow rank. Checked:

- every straggler made others wait: some other rank carries ``waiting for rank <straggler>``;
- every rank that waited at sync points for a substantial part of its steps (``wait_ns`` in
  ``stragglers.csv``, at least ``MIN_WAIT_SHARE`` of its step time) has that wait in the cause
  table as waiting (``waiting for rank k``, ``wait:...``, ``transfer:...``), at least
  ``MIN_CHARGED_SHARE`` of it. The cause table charges GPU-idle time only, so a wait during which
  the GPU still ran earlier work is not charged: hence half, not all.

``verdict_consistency`` returns one line per disagreement (empty when they agree); the terminal
and the report print them.
"""
from __future__ import annotations

import pandas as pd

from profkit.analyze.vocabulary import VICTIM_PREFIXES, waiting_for_rank

MIN_WAIT_SHARE = 0.10
MIN_CHARGED_SHARE = 0.5


def verdict_consistency(per_rank: pd.DataFrame | None, straggler_ranks: list[int] | None,
                        cause_steps: pd.DataFrame | None) -> list[str]:
    """Lines naming each disagreement between the straggler verdict and the cause table."""
    if per_rank is None or not len(per_rank) or cause_steps is None:
        return []
    out: list[str] = []
    cs = cause_steps
    per = cs.groupby(["rank", "cause"])["ns"].sum() if len(cs) else pd.Series(dtype="int64")
    for s in straggler_ranks or []:
        label = waiting_for_rank(int(s))
        waited = [int(r) for (r, c), ns in per.items() if c == label and ns > 0 and int(r) != int(s)]
        if not waited:
            out.append(f"rank {int(s)} is named a straggler, but no rank's causes include '{label}'")
    waits = cs[cs["cause"].astype(str).str.startswith(VICTIM_PREFIXES)] if len(cs) else cs
    charged = waits.groupby("rank")["ns"].sum() if len(waits) else pd.Series(dtype="int64")
    for row in per_rank.itertuples():
        step_total = float(getattr(row, "step_total_ns", 0) or 0)
        wait = float(getattr(row, "wait_ns", 0) or 0)
        if step_total <= 0 or wait < MIN_WAIT_SHARE * step_total:
            continue
        got = float(charged.get(int(row.rank), 0))
        if got < MIN_CHARGED_SHARE * wait:
            whom = getattr(row, "waited_for_rank", None)
            who = f" for rank {int(whom)}" if whom is not None and not pd.isna(whom) else ""
            mine = per.loc[int(row.rank)] if int(row.rank) in per.index.get_level_values(0) else pd.Series(dtype=float)
            mine = mine[~mine.index.astype(str).str.startswith(VICTIM_PREFIXES)]
            top = f"; its top cause is '{mine.idxmax()}'" if len(mine) else ""
            out.append(f"rank {int(row.rank)} waited {wait / 1e6:.1f} ms at sync points{who}, but the cause table "
                       f"charges only {got / 1e6:.1f} ms of its time to waiting{top}")
    return out
