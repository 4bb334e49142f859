"""Process-wide string table: span names and categories become small ints on the hot path.

Ids are global to the process (not per recorder), so a wrapper built once at import time stays
valid if the recorder is replaced (tests) or re-created after ``fork``.
"""
from __future__ import annotations

import threading


class StringTable:
    """Append-only ``str <-> int`` interning; lock-free lookups, locked inserts."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._strings: list[str] = []
        self._lock = threading.Lock()

    def id(self, text: str) -> int:
        found = self._ids.get(text)
        if found is not None:
            return found
        with self._lock:
            found = self._ids.get(text)
            if found is None:
                found = len(self._strings)
                self._strings.append(text)
                self._ids[text] = found
            return found

    def text(self, string_id: int) -> str:
        return self._strings[string_id]

    def __len__(self) -> int:
        return len(self._strings)


STRINGS = StringTable()
