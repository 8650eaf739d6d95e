"""The job table: SQLite in WAL mode in the state directory, the source of truth for every job.

Several processes write it: the server that creates a job, the supervisor that runs it, and any later
server that reconciles it. Each opens its own connection; writes are short transactions with a busy
timeout, so they queue instead of failing.
"""

import json
import sqlite3
import time
from contextlib import AbstractContextManager
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from servers.core.db import BUSY_TIMEOUT_S, connect, initialise


class JobState(str, Enum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST})
ACTIVE_STATES = frozenset(set(JobState) - TERMINAL_STATES)

SCHEMA_VERSION = 1
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
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_kind_created ON jobs(kind, created_at);
"""


class JobRecord(BaseModel):
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


class JobPage(BaseModel):
    jobs: list[JobRecord]
    total: int = Field(description="Jobs matching the filter, all pages together")


class JobStore:
    """Short-lived connections per operation: safe across threads and processes, cheap with WAL."""

    def __init__(self, db_path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.db_path = db_path
        self._busy_timeout_s = busy_timeout_s
        initialise(db_path, "")
        with self._connect() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{db_path} was written by a newer llm-infra-mcp (schema {version} > {SCHEMA_VERSION}); "
                    "upgrade this installation or point LLM_INFRA_MCP_HOME elsewhere"
                )
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _connect(self) -> AbstractContextManager[sqlite3.Connection]:
        return connect(self.db_path, busy_timeout_s=self._busy_timeout_s)

    @staticmethod
    def _record(row: sqlite3.Row) -> JobRecord:
        data = dict(row)
        data["spec"] = json.loads(data["spec"])
        data["cancel_requested"] = bool(data["cancel_requested"])
        return JobRecord.model_validate(data)

    def insert(self, record: JobRecord) -> None:
        data = record.model_dump(mode="json")
        data["spec"] = json.dumps(record.spec, sort_keys=True)
        data["cancel_requested"] = int(record.cancel_requested)
        columns = ", ".join(data)
        placeholders = ", ".join(f":{c}" for c in data)
        with self._connect() as conn:
            conn.execute(f"INSERT INTO jobs ({columns}) VALUES ({placeholders})", data)

    def get(self, job_id: str) -> JobRecord | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else self._record(row)

    def update(self, job_id: str, *, only_if_active: bool = False, **fields: Any) -> bool:
        """Set columns of one job. With only_if_active, a job already in a terminal state is left as it is,
        so that of two processes recording an end, the first one wins. Returns whether a row changed."""
        if not fields:
            return False
        values = {k: (v.value if isinstance(v, JobState) else v) for k, v in fields.items()}
        if "cancel_requested" in values:
            values["cancel_requested"] = int(bool(values["cancel_requested"]))
        assignments = ", ".join(f"{k} = :{k}" for k in values)
        sql = f"UPDATE jobs SET {assignments} WHERE id = :_id"
        if only_if_active:
            active = ", ".join(f"'{s.value}'" for s in ACTIVE_STATES)
            sql += f" AND state IN ({active})"
        with self._connect() as conn:
            cursor = conn.execute(sql, {**values, "_id": job_id})
            return cursor.rowcount > 0

    def list_jobs(
        self,
        *,
        kind: str | None = None,
        states: list[JobState] | None = None,
        limit: int = 20,
        offset: int = 0,
    ) -> JobPage:
        where: list[str] = []
        params: list[Any] = []
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
        states = ", ".join(f"'{s.value}'" for s in ACTIVE_STATES)
        with self._connect() as conn:
            rows = conn.execute(f"SELECT * FROM jobs WHERE state IN ({states}) ORDER BY created_at").fetchall()
        return [self._record(r) for r in rows]


def now() -> float:
    return time.time()
