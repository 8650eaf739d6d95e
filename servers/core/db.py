"""The state database: one SQLite file in WAL mode under the state directory, shared by every server and by job
supervisors. Each operation opens its own short-lived connection: safe across threads and processes."""

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BUSY_TIMEOUT_S = 30.0


@contextmanager
def connect(db_path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> Iterator[sqlite3.Connection]:
    """A connection in autocommit mode (each statement its own transaction) with rows as sqlite3.Row."""
    conn = sqlite3.connect(db_path, timeout=busy_timeout_s, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("PRAGMA synchronous=NORMAL")
        yield conn
    finally:
        conn.close()


def initialise(db_path: Path, schema: str) -> None:
    """Create the file (WAL mode) and the tables of `schema` if they are missing."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with connect(db_path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(schema)
