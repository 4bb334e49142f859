"""The regression history: an SQLite file of runs, their headline metrics and per-step samples.

Several CI jobs may write one file at once: the database runs in WAL mode (readers never block
the writer), every connection waits up to ``timeout_s`` for the write lock (``busy_timeout``)
instead of failing, and each run is written in one ``BEGIN IMMEDIATE`` transaction, so a run is
either all there or not at all.
"""
from __future__ import annotations

import json
import math
import sqlite3
import time
from pathlib import Path
from typing import Iterable

import pandas as pd

from profkit.analyze import compare as cmp
from profkit.history.runs import (
    BALANCE_COLUMNS,
    CAUSE_COLUMNS,
    CAUSE_SAMPLE_COLUMNS,
    LATENESS_COLUMNS,
    STEP_SAMPLE_COLUMNS,
    STRAGGLER_COLUMNS,
    RunData,
    RunError,
)
from profkit.history.schema import migrate

DEFAULT_TIMEOUT_S = 120.0
# stored per run in ``metrics`` (point values; the dashboard and compare recompute from samples)
STORED_METRICS = (
    cmp.metric("step_ns", "p50"), cmp.metric("step_ns", "p90"), cmp.metric("step_ns", "p99"),
    cmp.metric("gpu_busy_ns", "p50"), cmp.metric("gap_ns", "p50"),
    cmp.metric("late_ns"), cmp.metric("straggler_score"), cmp.metric("balancedness"),
)


def connect(path: str | Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, waiting on locks."""
    conn = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
    deadline = time.monotonic() + timeout_s
    while True:  # switching to WAL needs a moment alone with the file; wait for it like any lock
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    if str(mode).lower() != "wal":
        conn.close()
        raise sqlite3.OperationalError(f"{path}: cannot use WAL journal mode (got {mode!r}); is it on a network file system?")
    conn.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; safe with WAL
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


class HistoryDB:
    """``with HistoryDB("runs.sqlite") as db: db.add(run, "nightly")``."""

    def __init__(self, path: str | Path, timeout_s: float = DEFAULT_TIMEOUT_S, create: bool = True):
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise RunError(f"{self.path}: no such history database (record runs with `profkit history add`)")
        if self.path.parent and not self.path.parent.exists():
            raise RunError(f"{self.path}: folder {self.path.parent} does not exist")
        self.conn = connect(self.path, timeout_s)
        try:
            self.version = migrate(self.conn)
        except Exception:
            self.conn.close()
            raise

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "HistoryDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- writing ------------------------------------------------------------------------------
    def add(self, run: RunData, label: str | None = None, meta: dict[str, str] | None = None,
            created_ns: int | None = None) -> int:
        """Record a run (metrics, causes, stragglers, every per-step sample) in one transaction."""
        label = label or run.label
        meta = {**run.meta, **(meta or {})}
        created_ns = int(created_ns if created_ns is not None else time.time_ns())
        samples = samples_of(run)
        metrics = [(m.key, _real(samples.point(m))) for m in STORED_METRICS]
        summary = run.summary or {}
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            cur = c.execute(
                "INSERT INTO runs (label, created_ns, source, profkit_version, step_marker, n_ranks, n_steps,"
                " has_cause_samples, summary_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (label, created_ns, run.source, summary.get("profkit_version"), summary.get("step_marker"),
                 run.n_ranks, int(len(run.steps)), int(run.cause_steps is not None), json.dumps(summary)),
            )
            rid = int(cur.lastrowid)
            c.executemany("INSERT INTO run_meta VALUES (?, ?, ?)", [(rid, str(k), str(v)) for k, v in meta.items()])
            c.executemany("INSERT INTO metrics VALUES (?, ?, ?)", [(rid, k, v) for k, v in metrics if v is not None])
            _insert(c, "step_samples", rid, run.steps, STEP_SAMPLE_COLUMNS)
            _insert(c, "causes", rid, run.causes, CAUSE_COLUMNS)
            if run.cause_steps is not None:
                _insert(c, "cause_samples", rid, run.cause_steps[run.cause_steps["ns"] != 0], CAUSE_SAMPLE_COLUMNS)
            if run.stragglers is not None:
                _insert(c, "stragglers", rid, run.stragglers, STRAGGLER_COLUMNS)
            if run.lateness is not None:
                _insert(c, "lateness_samples", rid, run.lateness, LATENESS_COLUMNS)
            if run.balance is not None:
                _insert(c, "balance_samples", rid, run.balance, BALANCE_COLUMNS)
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return rid

    # ---- reading ------------------------------------------------------------------------------
    def runs(self, label_glob: str | Iterable[str] | None = None, meta: dict[str, str] | None = None) -> pd.DataFrame:
        """Runs in time order: id, label, created_ns, source, n_ranks, n_steps, meta (a dict).

        ``label_glob``: shell patterns (``nightly-*``), any may match; ``meta``: every key=value must.
        """
        where, args = [], []
        globs = [label_glob] if isinstance(label_glob, str) else list(label_glob or [])
        if globs:
            where.append("(" + " OR ".join("label GLOB ?" for _ in globs) + ")")
            args += globs
        for k, v in (meta or {}).items():
            where.append("EXISTS (SELECT 1 FROM run_meta m WHERE m.run_id = runs.id AND m.key = ? AND m.value = ?)")
            args += [k, v]
        sql = "SELECT id, label, created_ns, source, n_ranks, n_steps FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        df = pd.read_sql_query(sql + " ORDER BY created_ns, id", self.conn, params=args)
        metas: dict[int, dict[str, str]] = {int(i): {} for i in df["id"]}
        for rid, k, v in self.conn.execute("SELECT run_id, key, value FROM run_meta ORDER BY run_id, key"):
            if rid in metas:
                metas[rid][k] = v
        df["meta"] = [metas[int(i)] for i in df["id"]]
        return df

    def find(self, ref: str) -> int | None:
        """A run id from ``#ID`` or a label (the latest run with that label)."""
        if ref.startswith("#") and ref[1:].isdigit():
            row = self.conn.execute("SELECT id FROM runs WHERE id = ?", (int(ref[1:]),)).fetchone()
        else:
            row = self.conn.execute("SELECT id FROM runs WHERE label = ? ORDER BY created_ns DESC, id DESC LIMIT 1",
                                    (ref,)).fetchone()
        return int(row[0]) if row else None

    def load(self, run_id: int) -> RunData:
        c = self.conn
        row = c.execute("SELECT label, created_ns, source, has_cause_samples, summary_json FROM runs WHERE id = ?",
                        (run_id,)).fetchone()
        if row is None:
            raise RunError(f"{self.path}: no run #{run_id}")
        label, created_ns, source, has_causes, summary_json = row

        def table(name: str, cols: list[str], order: str) -> pd.DataFrame:
            return pd.read_sql_query(f"SELECT {', '.join(cols)} FROM {name} WHERE run_id = ? ORDER BY {order}",
                                     c, params=(run_id,))

        steps = table("step_samples", STEP_SAMPLE_COLUMNS, "rank, step").astype("int64")
        causes = table("causes", CAUSE_COLUMNS, "total_ns DESC, cause")
        cause_steps = table("cause_samples", CAUSE_SAMPLE_COLUMNS, "rank, step, cause") if has_causes else None
        stragglers = table("stragglers", STRAGGLER_COLUMNS, "rank")
        lateness = table("lateness_samples", LATENESS_COLUMNS, "rank, step")
        balance = table("balance_samples", BALANCE_COLUMNS, "step, layer")
        meta = dict(c.execute("SELECT key, value FROM run_meta WHERE run_id = ? ORDER BY key", (run_id,)).fetchall())
        return RunData(
            label=label, source=source or "", summary=json.loads(summary_json or "{}"), steps=steps, causes=causes,
            cause_steps=cause_steps, stragglers=stragglers if len(stragglers) else None,
            lateness=lateness if len(lateness) else None, balance=balance if len(balance) else None,
            meta=meta, run_id=int(run_id), created_ns=int(created_ns),
        )


def samples_of(run: RunData) -> cmp.Samples:
    """The comparison samples of a run."""
    return cmp.samples_from_tables(run.steps, run.causes, run.cause_steps, run.lateness, run.balance, run.stragglers)


def _insert(conn: sqlite3.Connection, table: str, run_id: int, df: pd.DataFrame, cols: list[str]) -> None:
    if df is None or not len(df):
        return
    rows = df[cols].astype(object).where(df[cols].notna(), None).itertuples(index=False, name=None)
    marks = ", ".join("?" for _ in range(len(cols) + 1))
    conn.executemany(f"INSERT INTO {table} (run_id, {', '.join(cols)}) VALUES ({marks})",
                     ((run_id, *(_plain(v) for v in r)) for r in rows))


def _plain(v):
    """numpy scalars to Python (sqlite3 stores numpy ints as blobs otherwise)."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _real(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None
