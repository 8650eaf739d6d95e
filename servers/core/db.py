"""The state database: one SQLite file in WAL mode under the state directory, shared by every server and by job
supervisors. Each operation opens its own short-lived connection: safe across threads and processes.

The file holds the jobs (jobstore), the scaling fits (scaling/fitstore) and the launch idempotency keys, so a
damaged file must not take a server down. Before a process first uses it, `prepare` checks it:
- written by a newer llm-infra-mcp (user_version above SCHEMA_VERSION): left unchanged; every use raises
  StateDatabaseError saying so and what to do;
- not a database or damaged (SQLITE_NOTADB, SQLITE_CORRUPT, a failed quick_check): moved aside, never deleted
  (state.db.damaged-<UTC time>, with its -wal and -shm), a fresh file is started and the move is recorded in the
  table db_events, whose messages the tools show; the job engine then re-imports the jobs from their folders;
- unusable for another reason (permissions, a full disk, a folder in its place): left alone; StateDatabaseError.
"""

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servers.core.errors import InputError

BUSY_TIMEOUT_S = 30.0
# The schema version of the whole file (PRAGMA user_version). 1: jobs, fits, launch_keys. 2: jobs.supervisor_ready.
SCHEMA_VERSION = 2

log = logging.getLogger(__name__)

_EVENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS db_events (
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
"""
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26

_prepared: set[str] = set()
_prepared_lock = threading.Lock()


class StateDatabaseError(InputError):
    """The state database cannot be used; the message says what is wrong with it and what to do."""


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


def is_damage(exc: BaseException) -> bool:
    """Whether an sqlite3 error says the file is not a database or is corrupt (rather than busy or unwritable)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text


def as_state_error(exc: sqlite3.Error, db_path: Path) -> StateDatabaseError:
    """A readable error for a failed database operation: what is wrong with the file and what to do."""
    text = str(exc)
    if is_damage(exc):
        return StateDatabaseError(
            f"the state database {db_path} is damaged ({text}). Restart the server: at start it moves the damaged "
            "file aside (kept, never deleted) and rebuilds the job list from the job folders"
        )
    if "locked" in text.lower() or "busy" in text.lower():
        return StateDatabaseError(
            f"the state database {db_path} is locked by another process ({text}); try again in a moment"
        )
    return StateDatabaseError(
        f"the state database {db_path} cannot be used ({type(exc).__name__}: {text}); check the file and its folder "
        "(permissions, free disk space), or set LLM_INFRA_MCP_HOME to another state directory"
    )


def newer_schema_error(db_path: Path, version: int) -> StateDatabaseError:
    return StateDatabaseError(
        f"the state database {db_path} was written by a newer llm-infra-mcp (schema version {version}; this one "
        f"knows up to {SCHEMA_VERSION}) and was left unchanged. Upgrade llm-infra-mcp, or set LLM_INFRA_MCP_HOME "
        "to another state directory. Tools that need no stored jobs or fits keep working"
    )


def _diagnose(db_path: Path) -> str | None:
    """None if the file is absent or usable; a description if it is damaged. Raises StateDatabaseError for a file
    that must be left alone (newer schema, unreadable for another reason)."""
    if not db_path.exists() and not db_path.is_symlink():
        return None
    try:
        # Read-only: a read-write connection would, on closing, checkpoint the -wal into a damaged file and
        # delete it (also next to a file that is not a database), and must not touch a newer schema's file.
        conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        with contextlib.closing(conn):
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise newer_schema_error(db_path, version)
            problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
    except sqlite3.Error as exc:
        if is_damage(exc):
            return str(exc)
        raise as_state_error(exc, db_path) from exc
    if problems != ["ok"]:
        return "quick_check found: " + "; ".join(problems)
    return None


@contextmanager
def _recovery_lock(db_path: Path) -> Iterator[None]:
    """One process at a time moves a damaged file aside (two must not both move: the second would move the fresh
    file the first one started)."""
    lock_path = db_path.with_name(db_path.name + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _move_aside(db_path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target = db_path.with_name(f"{db_path.name}.damaged-{stamp}")
    n = 1
    while any(Path(f"{target}{s}").exists() for s in ("", "-wal", "-shm", "-journal")):
        target = db_path.with_name(f"{db_path.name}.damaged-{stamp}-{n}")
        n += 1
    os.rename(db_path, target)
    for suffix in ("-wal", "-shm", "-journal"):
        side = Path(f"{db_path}{suffix}")
        if side.exists():
            os.rename(side, Path(f"{target}{suffix}"))
    return target


def record_event(db_path: Path, kind: str, message: str) -> None:
    """Remember something the tools should tell (a damaged file moved aside, jobs re-imported)."""
    with connect(db_path) as conn:
        conn.executescript(_EVENTS_SCHEMA)
        conn.execute("INSERT INTO db_events (at, kind, message) VALUES (?, ?, ?)", (time.time(), kind, message))


def notices(db_path: Path, *, kinds: tuple[str, ...] | None = None, max_age_s: float = 30 * 86400) -> list[str]:
    """The recorded events of the last `max_age_s` seconds, newest first, as sentences with their UTC time. Never
    raises: an unreadable table means nothing to tell."""
    try:
        with connect(db_path) as conn:
            rows = conn.execute(
                "SELECT at, kind, message FROM db_events WHERE at >= ? ORDER BY at DESC LIMIT 20",
                (time.time() - max_age_s,),
            ).fetchall()
    except sqlite3.Error:
        return []
    out = []
    for at, kind, message in rows:
        if kinds is not None and kind not in kinds:
            continue
        try:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(at)))
        except (TypeError, ValueError, OverflowError):
            when = "at an unknown time"
        out.append(f"{when}: {message}")
    return out


def prepare(db_path: Path) -> None:
    """Check the file once per process (see the module docstring): recover a damaged one, refuse a newer one."""
    key = str(db_path)
    with _prepared_lock:
        if key in _prepared:
            return
    db_path.parent.mkdir(parents=True, exist_ok=True)
    problem = _diagnose(db_path)
    if problem is not None:
        with _recovery_lock(db_path):
            problem = _diagnose(db_path)  # another process may have recovered it meanwhile
            if problem is not None:
                moved = _move_aside(db_path)
                message = (
                    f"the state database was damaged ({problem}) and was moved aside to {moved} (kept, with its "
                    "-wal and -shm files; never deleted) and a fresh one started. Jobs are re-imported from their "
                    "folders; scaling fits and launch idempotency keys stored before are only in the moved-aside "
                    "file (the sqlite3 shell's .recover may get them back)"
                )
                log.error("%s", message)
                with connect(db_path) as conn:
                    conn.execute("PRAGMA journal_mode=WAL")
                record_event(db_path, "moved_aside", message)
    with _prepared_lock:
        _prepared.add(key)


def forget_prepared(db_path: Path) -> None:
    """Check the file again on its next use (tests; a server told the file was replaced)."""
    with _prepared_lock:
        _prepared.discard(str(db_path))


def initialise(db_path: Path, schema: str) -> None:
    """Check the file (`prepare`), then create it (WAL mode) and the tables of `schema` if they are missing.
    Raises StateDatabaseError, with what is wrong and what to do, if the file cannot be used."""
    prepare(db_path)
    try:
        with connect(db_path) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:  # written by a newer version since this process checked it
                raise newer_schema_error(db_path, version)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_EVENTS_SCHEMA + schema)
    except sqlite3.Error as exc:
        if is_damage(exc):
            forget_prepared(db_path)  # the next use checks it again, and so moves it aside
        raise as_state_error(exc, db_path) from exc
