"""What every reader returns: one ``RankPart`` per (file, process-with-a-rank)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa


@dataclass
class RankPart:
    """Events of one rank from one file, before ranks are reconciled across files.

    ``rank`` is what the file itself says (trace metadata), or None when it does not
    know; the loader then tries the file name and the user's mapping. ``key`` tells
    parts of one file apart (e.g. ``pid=1234`` for one process of a multi-process
    nsys export) and is what a user's mapping can name.
    """

    path: str
    source: str  # kineto | nsys | chrome | profkit | pyspy
    table: pa.Table  # events in profkit.schema.ARROW_SCHEMA; rank column filled by the loader
    rank: int | None = None
    rank_origin: str = "unknown"  # metadata | filename | mapping | order
    key: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # JSON-safe facts (clock anchors, devices, pids)
    warnings: list[str] = field(default_factory=list)
    # the parsed-trace cache's Arrow file holding exactly ``table`` (``ingest.cache``), None when not
    # cached: a scale run's store links it instead of encoding and writing the table again
    cache_file: str | None = None

    @property
    def label(self) -> str:
        return f"{self.path}[{self.key}]" if self.key else self.path
