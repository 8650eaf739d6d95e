"""The job table: SQLite in WAL mode in the state directory, the source of truth for every job.

Several processes write it: the server that creates a job, the supervisor that runs it, and any later
server that reconciles it. Each opens its own connection; writes are short transactions with a busy
timeout, so they queue instead of failing. Admission (quota check and insert) is one transaction.

A row that cannot be read as it should (a spec that is not JSON, a state that is not a job state, a column of
the wrong type) does not break the listing: it comes back as a record with `damage` saying what is wrong and,
unless only its spec is damaged, in state LOST (in memory; the row is left as it is).
"""

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from servers.core.db import BUSY_TIMEOUT_S, SCHEMA_VERSION, as_state_error, connect, initialise
from servers.core.jobrow import ACTIVE_STATES, BOOL_COLUMNS, JobState, states_sql, update_row
from servers.core.models import Model

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    exit_code INTEGER,
    reason TEXT,
    timeout_s REAL NOT NULL,
    owner TEXT NOT NULL,
    job_dir TEXT NOT NULL,
    supervisor_pid INTEGER,
    supervisor_start INTEGER,
    worker_pid INTEGER,
    worker_start INTEGER,
    boot_id TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    supervisor_ready INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_kind_created ON jobs(kind, created_at);
"""


class JobRecord(Model):
    """One row of the job table."""

    id: str
    kind: str
    spec: dict[str, Any]
    state: JobState
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    timeout_s: float
    owner: str
    job_dir: str
    supervisor_pid: int | None = None
    supervisor_start: int | None = None
    worker_pid: int | None = None
    worker_start: int | None = None
    boot_id: str | None = None
    cancel_requested: bool = False
    supervisor_ready: bool = Field(
        default=False, description="The supervisor has installed its signal handlers: a SIGTERM now means cancel"
    )
    damage: list[str] = Field(
        default_factory=list, exclude=True, description="What could not be read from this job's row (not stored)"
    )


_ACTIVE_SQL = states_sql(ACTIVE_STATES)
_REQUIRED_FALLBACK: dict[str, Any] = {"kind": "?", "created_at": 0.0, "timeout_s": 0.0, "owner": "?", "job_dir": ""}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class JobPage(Model):
    jobs: list[JobRecord]
    total: int = Field(description="Jobs matching the filter, all pages together")


class JobStore:
    """Short-lived connections per operation: safe across threads and processes, cheap with WAL.

    With `prepare` (the servers) the file is checked, created or migrated first; the supervisor, which only
    updates its own row, skips that."""

    def __init__(self, db_path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S, prepare: bool = True) -> None:
        self.db_path = db_path
        self._busy_timeout_s = busy_timeout_s
        if prepare:
            initialise(db_path, _SCHEMA)
            self._migrate()

    def _migrate(self) -> None:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                columns = {r["name"] for r in conn.execute("PRAGMA table_info(jobs)").fetchall()}
                if "supervisor_ready" not in columns:  # schema 1: its RUNNING jobs' supervisors were ready
                    conn.execute("ALTER TABLE jobs ADD COLUMN supervisor_ready INTEGER NOT NULL DEFAULT 0")
                    conn.execute("UPDATE jobs SET supervisor_ready = 1 WHERE state = 'RUNNING'")
                if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection; a failing database becomes a StateDatabaseError saying what is wrong and what to do."""
        try:
            with connect(self.db_path, busy_timeout_s=self._busy_timeout_s) as conn:
                yield conn
        except sqlite3.Error as exc:
            raise as_state_error(exc, self.db_path) from exc

    @staticmethod
    def _record(row: sqlite3.Row) -> JobRecord:
        data = dict(row)
        damage: list[str] = []
        raw_spec = data.get("spec")
        try:
            spec = json.loads(raw_spec)
        except (TypeError, ValueError, RecursionError):
            spec = None
        if not isinstance(spec, dict):
            damage.append(f"its spec in the database is not a JSON object ({_short(raw_spec)}); shown empty")
            spec = {}
        data["spec"] = spec
        for column in BOOL_COLUMNS:
            data[column] = data.get(column) in (1, True)
        data["id"] = str(data.get("id"))
        only_spec = bool(damage)
        try:
            data["state"] = JobState(data.get("state"))
        except ValueError:
            damage.append(f"its state {_short(data.get('state'))} is not a job state")
            data["state"] = JobState.LOST
        for _ in range(2):
            try:
                record = JobRecord.model_validate(data)
                break
            except ValidationError as exc:
                for error in exc.errors():
                    column = str(error["loc"][0]) if error["loc"] else ""
                    if column not in JobRecord.model_fields or column in ("id", "spec", "state", "damage"):
                        continue
                    damage.append(f"its column {column} holds {_short(data.get(column))}, not a valid value")
                    data[column] = _REQUIRED_FALLBACK.get(column)
        else:  # cannot happen with the fallbacks above; keep the listing working regardless
            record = JobRecord(
                id=data["id"],
                kind="?",
                spec={},
                state=JobState.LOST,
                created_at=0.0,
                timeout_s=0.0,
                owner="?",
                job_dir="",
            )
            damage.append("its row could not be read")
        if damage:
            updates: dict[str, Any] = {"damage": damage}
            if len(damage) > 1 or not only_spec:  # more than the spec: the row cannot be tracked, show it as lost
                updates["state"] = JobState.LOST
            record = record.model_copy(update=updates)
        return record

    @staticmethod
    def _row(record: JobRecord) -> dict[str, Any]:
        data = record.model_dump(mode="json")
        data["spec"] = json.dumps(record.spec, sort_keys=True)
        for column in BOOL_COLUMNS:
            data[column] = int(bool(data[column]))
        return data

    def _insert(self, conn: sqlite3.Connection, record: JobRecord, *, or_ignore: bool = False) -> bool:
        data = self._row(record)
        columns = ", ".join(data)
        placeholders = ", ".join(f":{c}" for c in data)
        verb = "INSERT OR IGNORE" if or_ignore else "INSERT"
        return conn.execute(f"{verb} INTO jobs ({columns}) VALUES ({placeholders})", data).rowcount > 0

    def insert(self, record: JobRecord, *, or_ignore: bool = False) -> bool:
        """Store a new row; with or_ignore, one whose id exists already is left as it is. Returns whether stored."""
        with self._connect() as conn:
            return self._insert(conn, record, or_ignore=or_ignore)

    def admit(self, build: Callable[[list[JobRecord]], JobRecord]) -> JobRecord:
        """Admit a job in one write transaction (BEGIN IMMEDIATE): `build` gets the jobs in active states as the
        database has them and returns the record to insert, or raises (a quota is full) and nothing is written.
        Two admissions, from threads or processes, never see the same set of active jobs."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                rows = conn.execute(f"SELECT * FROM jobs WHERE state IN ({_ACTIVE_SQL}) ORDER BY created_at").fetchall()
                active = [r for r in (self._record(row) for row in rows) if r.state in ACTIVE_STATES]
                record = build(active)
                self._insert(conn, record)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return record

    def get(self, job_id: str) -> JobRecord | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else self._record(row)

    def ids(self) -> set[str]:
        with self._connect() as conn:
            return {str(r[0]) for r in conn.execute("SELECT id FROM jobs").fetchall()}

    def update(
        self,
        job_id: str,
        *,
        only_if_active: bool = False,
        only_in: frozenset[JobState] | None = None,
        **fields: Any,
    ) -> bool:
        """Set columns of one job. With only_if_active, a job already in a terminal state is left as it is,
        so that of two processes recording an end, the first one wins; only_in narrows that to the given
        states. Returns whether a row changed."""
        states = only_in if only_in is not None else (ACTIVE_STATES if only_if_active else None)
        with self._connect() as conn:
            return update_row(conn, job_id, fields, only_in=states)

    def list_jobs(
        self,
        *,
        kind: str | None = None,
        states: list[JobState] | None = None,
        limit: int = 20,
        offset: int = 0,
        sweep_id: str | None = None,
    ) -> JobPage:
        where: list[str] = []
        params: list[Any] = []
        if sweep_id is not None:  # a damaged spec (not JSON) matches nothing instead of failing the query
            where.append("(CASE WHEN json_valid(spec) THEN json_extract(spec, '$.sweep_id') END) = ?")
            params.append(sweep_id)
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        if states:
            where.append(f"state IN ({', '.join('?' for _ in states)})")
            params.extend(s.value for s in states)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._connect() as conn:
            total = conn.execute(f"SELECT COUNT(*) FROM jobs{clause}", params).fetchone()[0]
            rows = conn.execute(
                f"SELECT * FROM jobs{clause} ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?",
                [*params, limit, offset],
            ).fetchall()
        return JobPage(jobs=[self._record(r) for r in rows], total=total)

    def active(self) -> list[JobRecord]:
        """Jobs in active states (a damaged row, shown as LOST, is left out)."""
        with self._connect() as conn:
            rows = conn.execute(f"SELECT * FROM jobs WHERE state IN ({_ACTIVE_SQL}) ORDER BY created_at").fetchall()
        return [r for r in (self._record(row) for row in rows) if r.state in ACTIVE_STATES]


def now() -> float:
    return time.time()
