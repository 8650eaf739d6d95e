"""The job states and the writes of one job's row, with the standard library only.

The job table itself (records validated as models, listing, admission) is jobstore.py. This module holds what a
process that owns a single row needs: the states, and the update that moves a row only while it is in the states
allowed. The supervisor uses it alone, so that it imports no model library and starts its worker sooner (its start
is on every job's critical path: benchmarks/launch.py).
"""

import sqlite3
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any

from servers.core.db import BUSY_TIMEOUT_S, as_state_error, connect


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
BOOL_COLUMNS = ("cancel_requested", "supervisor_ready")


def states_sql(states: Iterable[JobState]) -> str:
    """The states as an SQL list of literals (their values are fixed names, never input)."""
    return ", ".join(f"'{s.value}'" for s in sorted(states, key=lambda s: s.value))


def update_row(
    conn: sqlite3.Connection, job_id: str, fields: dict[str, Any], *, only_in: frozenset[JobState] | None = None
) -> bool:
    """Set columns of one job's row; with `only_in`, only while the row is in one of those states (so that of two
    processes recording an end, the first one wins). Column names come from the caller's code, never from input.
    Returns whether a row changed."""
    if not fields:
        return False
    values = {k: (v.value if isinstance(v, JobState) else v) for k, v in fields.items()}
    for column in BOOL_COLUMNS:
        if column in values:
            values[column] = int(bool(values[column]))
    sql = f"UPDATE jobs SET {', '.join(f'{k} = :{k}' for k in values)} WHERE id = :_id"
    if only_in is not None:
        sql += f" AND state IN ({states_sql(only_in)})"
    return conn.execute(sql, {**values, "_id": job_id}).rowcount > 0


class JobRow:
    """One job's row, for the process that runs it: read a few columns, update it. A failing database becomes a
    StateDatabaseError (db.as_state_error), as in jobstore."""

    def __init__(self, db_path: Path, job_id: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.db_path = db_path
        self.job_id = job_id
        self._busy_timeout_s = busy_timeout_s

    def update(
        self, *, only_if_active: bool = False, only_in: frozenset[JobState] | None = None, **fields: Any
    ) -> bool:
        """As JobStore.update: with only_if_active, a row already in a terminal state is left as it is."""
        states = only_in if only_in is not None else (ACTIVE_STATES if only_if_active else None)
        try:
            with connect(self.db_path, busy_timeout_s=self._busy_timeout_s) as conn:
                return update_row(conn, self.job_id, fields, only_in=states)
        except sqlite3.Error as exc:
            raise as_state_error(exc, self.db_path) from exc

    def cancel_requested(self) -> bool | None:
        """Whether a cancel is recorded in the row; None when there is no such row."""
        try:
            with connect(self.db_path, busy_timeout_s=self._busy_timeout_s) as conn:
                row = conn.execute("SELECT cancel_requested FROM jobs WHERE id = ?", (self.job_id,)).fetchone()
        except sqlite3.Error as exc:
            raise as_state_error(exc, self.db_path) from exc
        return None if row is None else row[0] in (1, True)
