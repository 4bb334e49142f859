"""Read-only access to an Nsight Systems SQLite export: open, sniff, schema discovery, fetch.

nsys table and column sets drift between versions (2022.1 schema 2.9 vs 2025.3 schema 3.20), so
every query is built from what ``sqlite_master`` says exists. Errors from SQLite are turned into
``TraceError`` here, so callers never see ``sqlite3.DatabaseError``.

Event rows come straight into Arrow through the ADBC SQLite driver where it is installed (the
``fast`` extra): the standard library's ``sqlite3`` builds a Python tuple per row, ~5x slower. ADBC
infers each column's type from the values it meets, so its result is kept only when every column
has the type asked for (or holds only nulls) and its strings are valid UTF-8; else, and on any
ADBC error, the query runs again through ``sqlite3``, which is the authority for what a damaged or
odd file yields (the same table, or the same ``TraceError``).
"""
from __future__ import annotations

import sqlite3
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from profkit.errors import TraceError

try:  # the fast extra; imported with this module, so a pool's preload covers it (~20 ms a worker)
    import adbc_driver_sqlite.dbapi as adbc_sqlite
except ImportError:  # pragma: no cover - sqlite3 alone reads every file, slower
    adbc_sqlite = None

SQLITE_MAGIC = b"SQLite format 3\x00"
FETCH_BATCH_ROWS = 65_536  # also the ADBC driver's batch (and type inference window)
MAX_TEXT_CHARS = 4096  # longer names/texts are cut here (hostile or runaway NVTX text)

# Tables whose presence marks a file as an nsys export (any one is enough for the sniff).
NSYS_MARKER_TABLES = (
    "StringIds",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "NVTX_EVENTS",
    "TARGET_INFO_SESSION_START_TIME",
    "META_DATA_EXPORT",
    "EXPORT_META_DATA",
)
# Tables that hold the captured environment (secrets included): no query may touch them.
FORBIDDEN_TABLES = frozenset({"TARGET_INFO_SYSTEM_ENV", "META_DATA_CAPTURE"})


def _decode_text(raw: bytes) -> str:
    """SQLite TEXT -> str; nsys writes Latin-1 user names on Windows, so never fail on bad UTF-8."""
    return raw.decode("utf-8", "replace")


def has_sqlite_header(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


class NsysDb:
    """An open, read-only nsys export plus its table -> columns map."""

    def __init__(self, path: Path, con: sqlite3.Connection, uri: str | None = None):
        self.path = path
        self.con = con
        self.uri = uri  # the read-only URI both drivers open
        self._arrow_con = None  # the ADBC connection, opened at the first fetch_table
        self.columns: dict[str, set[str]] = {}
        rows = self._execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        for (name,) in rows:
            if not isinstance(name, str):
                continue
            if name in FORBIDDEN_TABLES:  # known to exist; never queried, not even for columns
                self.columns[name] = set()
                continue
            info = self._execute(f'PRAGMA table_info("{quote_ident(name)}")').fetchall()
            self.columns[name] = {str(r[1]) for r in info}

    # -- schema ---------------------------------------------------------------------------------
    def has(self, table: str, *columns: str) -> bool:
        cols = self.columns.get(table)
        return cols is not None and all(c in cols for c in columns)

    def missing_columns(self, table: str, columns: tuple[str, ...]) -> list[str]:
        cols = self.columns.get(table, set())
        return [c for c in columns if c not in cols]

    def col(self, table: str, column: str, default: str = "NULL") -> str:
        """The quoted column if the table has it, else a SQL default (for drifting schemas)."""
        return f'"{column}"' if self.has(table, column) else default

    # -- queries --------------------------------------------------------------------------------
    @staticmethod
    def _guard(sql: str) -> None:
        upper = sql.upper()
        if any(t.upper() in upper for t in FORBIDDEN_TABLES):
            raise RuntimeError(f"profkit bug: a query touches a table that holds the captured environment: {sql}")

    def _execute(self, sql: str, params: tuple = ()) -> sqlite3.Cursor:
        self._guard(sql)
        try:
            return self.con.execute(sql, params)
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # bad UTF-8 in a damaged schema's names
            raise corrupt_error(self.path, exc) from exc

    def scalar_rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Small result sets (metadata tables)."""
        cur = self._execute(sql, params)
        try:
            return cur.fetchall()
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise corrupt_error(self.path, exc) from exc

    def fetch_table(self, sql: str, schema: pa.Schema, params: tuple = ()) -> pa.Table:
        """Run ``sql`` and return its rows as an Arrow table: through ADBC where it gives exactly
        that table, else through ``sqlite3``."""
        self._guard(sql)
        fast = None if params else self._fetch_arrow(sql, schema)
        return fast if fast is not None else self._fetch_rows(sql, schema, params)

    def _arrow_connection(self):
        if self._arrow_con is None and self.uri is not None and adbc_sqlite is not None:
            try:
                self._arrow_con = adbc_sqlite.connect(self.uri)
            except Exception:  # noqa: BLE001 - any failure leaves the file to sqlite3
                self.uri = None
        return self._arrow_con

    def _fetch_arrow(self, sql: str, schema: pa.Schema) -> pa.Table | None:
        """The rows through ADBC, or None where its table could differ from sqlite3's."""
        con = self._arrow_connection()
        if con is None:
            return None
        try:
            with con.cursor() as cur:
                cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(FETCH_BATCH_ROWS)})
                cur.execute(sql)
                tbl = cur.fetch_arrow_table()
        except Exception:  # noqa: BLE001 - a type change between batches, a damaged page: sqlite3 decides
            return None
        if tbl.num_columns != len(schema):
            return None
        columns = []
        for col, f in zip(tbl.columns, schema):
            if col.type != f.type:
                if col.null_count != len(col) and not (pa.types.is_integer(col.type) and pa.types.is_integer(f.type)):
                    return None  # e.g. REAL or TEXT among the integers, which sqlite3 refuses
                try:
                    col = col.cast(f.type)  # all nulls, or integers that must fit (checked, as pa.array does)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    return None
            elif pa.types.is_string(col.type):
                try:
                    col.validate(full=True)  # ADBC passes SQLite's bytes through; sqlite3 decodes them
                except pa.ArrowInvalid:
                    return None
            columns.append(col)
        return pa.Table.from_arrays(columns, schema=schema)

    def close(self) -> None:
        if self._arrow_con is not None:
            try:
                self._arrow_con.close()
            finally:
                self._arrow_con = None
        self.con.close()

    def _fetch_rows(self, sql: str, schema: pa.Schema, params: tuple) -> pa.Table:
        """Through ``sqlite3``, batch by batch."""
        cur = self._execute(sql, params)
        batches = []
        try:
            while True:
                rows = cur.fetchmany(FETCH_BATCH_ROWS)
                if not rows:
                    break
                columns = list(zip(*rows))
                arrays = [pa.array(columns[i], type=f.type) for i, f in enumerate(schema)]
                batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise corrupt_error(self.path, exc) from exc
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise TraceError(self.path, f"unexpected value types in an nsys table ({exc})") from exc
        return pa.Table.from_batches(batches, schema=schema)


def quote_ident(name: str) -> str:
    return name.replace('"', '""')


def corrupt_error(path: Path, exc: BaseException) -> TraceError:
    return TraceError(path, f"corrupt or unreadable SQLite database ({type(exc).__name__}: {exc})")


@contextmanager
def open_nsys_db(path: Path) -> Iterator[NsysDb]:
    """Open read-only and immutable (inputs may sit on read-only media such as ../shared)."""
    if not path.exists():
        raise TraceError(path, "no such file")
    if not path.is_file():
        raise TraceError(path, "not a regular file")
    if not has_sqlite_header(path):
        size = path.stat().st_size
        what = "empty file" if size == 0 else "no 'SQLite format 3' header"
        raise TraceError(path, f"not a SQLite file ({what}); expected an Nsight Systems SQLite export "
                               "(nsys export --type sqlite)")
    uri = f"file:{urllib.request.pathname2url(str(path.resolve()))}?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.Error as exc:
        raise corrupt_error(path, exc) from exc
    con.text_factory = _decode_text
    try:
        db = NsysDb(path, con, uri)
    except BaseException:
        con.close()
        raise
    try:
        yield db
    finally:
        db.close()


def is_nsys_sqlite(path: str | Path) -> bool:
    """Cheap sniff: SQLite header and at least one table that only nsys exports have."""
    p = Path(path)
    if not p.is_file() or not has_sqlite_header(p):
        return False
    try:
        with open_nsys_db(p) as db:
            return any(t in db.columns for t in NSYS_MARKER_TABLES)
    except TraceError:
        return False


# -- string table ------------------------------------------------------------------------------
class StringTable:
    """The ``StringIds`` rows that events reference (only those: it also holds captured stdout)."""

    def __init__(self, ids: pa.Array, values: pa.Array, truncated: int):
        self.ids = ids
        self.values = values
        self.truncated = truncated  # referenced strings cut at MAX_TEXT_CHARS
        self.missing = 0  # lookups of ids that StringIds lacks (names left null)

    @classmethod
    def load(cls, db: NsysDb, id_queries: list[str]) -> StringTable:
        """``id_queries``: SELECTs of one integer column each (the ids that events use)."""
        if not id_queries or "StringIds" not in db.columns:
            return cls(pa.array([], pa.int64()), pa.array([], pa.string()), 0)
        union = " UNION ALL ".join(id_queries)  # each query's ids distinct already; IN takes a set
        sql = (f"SELECT id, substr(CAST(value AS TEXT), 1, {MAX_TEXT_CHARS}), "
               f"length(CAST(value AS TEXT)) > {MAX_TEXT_CHARS} "
               f"FROM StringIds WHERE id IN ({union})")
        schema = pa.schema([("id", pa.int64()), ("value", pa.string()), ("cut", pa.int64())])
        tbl = db.fetch_table(sql, schema)
        return cls(tbl["id"].combine_chunks(), tbl["value"].combine_chunks(),
                   int(pc.sum(tbl["cut"]).as_py() or 0))

    def lookup(self, ids: pa.Array | pa.ChunkedArray) -> pa.Array:
        """ids -> strings (null where the id is null or absent from StringIds)."""
        positions = pc.index_in(ids, value_set=self.ids)
        self.missing += int(pc.sum(pc.and_(pc.is_valid(ids), pc.is_null(positions))).as_py() or 0)
        return pc.take(self.values, positions)
