"""The history database's schema, as an ordered list of migrations applied on open.

Each migration runs in its own ``BEGIN IMMEDIATE`` transaction that first re-reads the version,
so two processes opening an old (or brand-new) database at once apply each step exactly once:
the second waits on the write lock (``busy_timeout``), then sees the step is done.
A database written by a newer profkit (version above ``LATEST``) is refused, never downgraded.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    why: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "runs, their metadata and headline metrics, and per-step samples for bootstrap intervals",
        (
            """CREATE TABLE runs (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                label TEXT NOT NULL,
                created_ns INTEGER NOT NULL,      -- wall clock (ns since epoch) of the run
                source TEXT,                      -- the analysis folder it came from
                profkit_version TEXT,
                step_marker TEXT,
                n_ranks INTEGER,
                n_steps INTEGER,
                has_cause_samples INTEGER NOT NULL DEFAULT 0,  -- cause_steps.csv was recorded
                summary_json TEXT                 -- OUT/summary.json as written
            )""",
            """CREATE TABLE run_meta (
                run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                key TEXT NOT NULL,
                value TEXT NOT NULL,
                PRIMARY KEY (run_id, key)
            )""",
            """CREATE TABLE metrics (
                run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                name TEXT NOT NULL,
                value REAL,
                PRIMARY KEY (run_id, name)
            )""",
            """CREATE TABLE step_samples (
                run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                rank INTEGER NOT NULL,
                step INTEGER NOT NULL,
                step_ns INTEGER NOT NULL,
                gpu_busy_ns INTEGER NOT NULL,
                gap_ns INTEGER NOT NULL,
                PRIMARY KEY (run_id, rank, step)
            )""",
            """CREATE TABLE causes (
                run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                cause TEXT NOT NULL,
                total_ns INTEGER NOT NULL,
                per_step_ns INTEGER NOT NULL,
                step_share REAL,
                ranks INTEGER,
                category TEXT,
                PRIMARY KEY (run_id, cause)
            )""",
            """CREATE TABLE cause_samples (       -- non-zero (rank, step, cause) charged time only
                run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                rank INTEGER NOT NULL,
                step INTEGER NOT NULL,
                cause TEXT NOT NULL,
                ns INTEGER NOT NULL,
                PRIMARY KEY (run_id, rank, step, cause)
            )""",
            """CREATE TABLE stragglers (
                run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                rank INTEGER NOT NULL,
                times_last INTEGER,
                late_ns_p50 INTEGER,
                late_ns_p99 INTEGER,
                caused_wait_ns INTEGER,
                score REAL,
                top_cause TEXT,
                PRIMARY KEY (run_id, rank)
            )""",
        ),
    ),
    Migration(
        2,
        "per-step lateness and balance samples; indexes for the label and time filters",
        (
            """CREATE TABLE lateness_samples (
                run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                rank INTEGER NOT NULL,
                step INTEGER NOT NULL,
                late_ns INTEGER NOT NULL,
                PRIMARY KEY (run_id, rank, step)
            )""",
            """CREATE TABLE balance_samples (
                run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                step INTEGER NOT NULL,
                layer INTEGER NOT NULL,           -- -1: the step as a whole
                balancedness REAL NOT NULL,
                PRIMARY KEY (run_id, step, layer)
            )""",
            "CREATE INDEX runs_by_label ON runs(label, created_ns)",
            "CREATE INDEX runs_by_time ON runs(created_ns)",
        ),
    ),
)

LATEST = MIGRATIONS[-1].version


class SchemaError(Exception):
    """The database cannot be used by this profkit (e.g. it was written by a newer one)."""


def stored_version(conn: sqlite3.Connection) -> int:
    """The schema version in the file (0 for a new, empty database)."""
    has = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if not has:
        return 0
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _check(version: int) -> None:
    if version > LATEST:
        raise SchemaError(f"schema version {version} is newer than this profkit knows ({LATEST}); upgrade profkit")


def migrate(conn: sqlite3.Connection) -> int:
    """Apply every migration above the stored version, in order; return the final version.

    ``conn`` must be in autocommit mode (``isolation_level=None``): transactions are explicit.
    """
    version = stored_version(conn)
    _check(version)
    for m in MIGRATIONS:
        if m.version <= version:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            version = stored_version(conn)  # another process may have migrated while we waited
            _check(version)
            if version < m.version:
                for sql in m.statements:
                    conn.execute(sql)
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (m.version,))
                version = m.version
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return version
