"""Fits kept in the state database (table `fits`), so that later calls, other servers and resources can use
them: the outcome with its bootstrap draws, the data it was fitted on, and the options.

The file is shared with the jobs, and may be damaged: opening the store checks it (servers.core.db.prepare: a
newer schema is refused unchanged, a damaged file is moved aside), every failing operation raises a
StateDatabaseError saying what is wrong, and a row that cannot be read is skipped by list_fits (and named by
get) rather than breaking the listing. A database moved aside lately is told by notices() (list_scaling_fits shows
them): the fits stored before are in the moved file.

A fit is stored once: add() with a digest of what determines the fit (fit_digest: the law, the points, the settings,
the label) returns the readable fit stored before under that digest instead of adding a copy, so a rerun of a study
does not grow the store. The digest is a column of its own (added to a table made before it, NULL for old rows,
which older versions of the suite ignore)."""

import hashlib
import json
import logging
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from servers.core.db import as_state_error, connect, initialise, notices
from servers.core.errors import InputError, NotFoundError
from servers.core.models import Model
from servers.core.settings import Settings
from servers.scaling.data import DataPoint, Excluded
from servers.scaling.fitting import FitOutcome

FIT_ID_PATTERN = r"^fit-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS fits (
    id TEXT PRIMARY KEY,
    label TEXT,
    model TEXT NOT NULL,
    method TEXT NOT NULL,
    compute_unit TEXT NOT NULL,
    created_at REAL NOT NULL,
    source TEXT NOT NULL,
    options TEXT NOT NULL,
    outcome TEXT NOT NULL,
    points TEXT NOT NULL,
    excluded TEXT NOT NULL,
    digest TEXT
);
CREATE INDEX IF NOT EXISTS fits_created ON fits(created_at);
"""


class StoredFit(Model):
    id: str
    label: str | None
    model: str
    method: str
    compute_unit: str
    created_at: float
    source: str
    options: dict[str, Any]
    outcome: FitOutcome
    points: list[DataPoint]
    excluded: list[Excluded]

    @property
    def resource_uri(self) -> str:
        return f"infra://fits/{self.id}"


log = logging.getLogger(__name__)
_JSON_COLUMNS = ("options", "outcome", "points", "excluded")


def fit_digest(
    *, model: str, label: str | None, compute_unit: str, options: dict[str, Any], points: list[DataPoint]
) -> str:
    """What determines a stored fit, as a SHA-256 hex digest: the law, the label, the compute unit, the options
    (min/max compute, r0, y_max, method, bootstrap, seed, level, thinning, the metric's name, a run's reading) and
    the points as read (floats in JSON's exact round-trip form). Where the points came from is not part of it: the
    same points fitted the same way are the same fit."""
    key = {
        "model": model,
        "label": label,
        "compute_unit": compute_unit,
        "options": options,
        "points": [p.model_dump(mode="json") for p in points],
    }
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def new_fit(
    fit_id: str,
    *,
    label: str | None,
    compute_unit: str,
    source: str,
    options: dict[str, Any],
    outcome: FitOutcome,
    points: list[DataPoint],
    excluded: list[Excluded],
) -> StoredFit:
    """A fit made now from its outcome (its model and method are the outcome's), with id `fit_id`."""
    return StoredFit(
        id=fit_id,
        label=label,
        model=outcome.model,
        method=outcome.method,
        compute_unit=compute_unit,
        created_at=time.time(),
        source=source,
        options=options,
        outcome=outcome,
        points=points,
        excluded=excluded,
    )


class FitStore:
    def __init__(self, settings: Settings) -> None:
        self.db_path = settings.db_path
        initialise(self.db_path, _SCHEMA)  # StateDatabaseError (what is wrong, what to do) if it cannot be used
        self._migrate()

    def _migrate(self) -> None:
        """A fits table made before the digest column gets it (NULL for its rows: they are never matched), and the
        index on it; in one write transaction, so two processes opening the store at once do not both add it."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                columns = {r["name"] for r in conn.execute("PRAGMA table_info(fits)").fetchall()}
                if "digest" not in columns:
                    conn.execute("ALTER TABLE fits ADD COLUMN digest TEXT")
                conn.execute("CREATE INDEX IF NOT EXISTS fits_digest ON fits(digest)")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            with connect(self.db_path) as conn:
                yield conn
        except sqlite3.Error as exc:
            raise as_state_error(exc, self.db_path) from exc

    def notices(self) -> list[str]:
        """A damaged state database moved aside lately: the fits stored before are only in the moved-aside file."""
        return notices(self.db_path, kinds=("moved_aside",))

    @staticmethod
    def _parse(row: sqlite3.Row) -> StoredFit:
        """A row as a StoredFit; InputError saying what is wrong if it cannot be read."""
        data = dict(row)
        try:
            for key in _JSON_COLUMNS:
                data[key] = json.loads(data[key])
            return StoredFit.model_validate(data)
        except (TypeError, ValueError, RecursionError) as exc:  # ValidationError is a ValueError
            if isinstance(exc, ValidationError) and exc.errors():
                first = exc.errors()[0]
                problem = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
            else:
                problem = f"{type(exc).__name__}: {str(exc)[:200]}"
            raise InputError(
                f"fit {data.get('id')!r} is damaged in the state database ({problem}) and cannot be used; other "
                "fits are unaffected. Fit again (fit_scaling_law) to replace it"
            ) from None

    def _stored(self, conn: sqlite3.Connection, digest: str) -> StoredFit | None:
        """The newest readable fit stored under `digest`, or None (a damaged one is skipped, and logged)."""
        rows = conn.execute(
            "SELECT * FROM fits WHERE digest = ? ORDER BY created_at DESC, id DESC LIMIT 20", (digest,)
        ).fetchall()
        for row in rows:
            try:
                return self._parse(row)
            except InputError as exc:
                log.warning("%s", exc)
        return None

    def find(self, digest: str) -> StoredFit | None:
        """The readable fit stored under `digest` (fit_digest), or None."""
        with self._connect() as conn:
            return self._stored(conn, digest)

    def add(
        self,
        *,
        label: str | None,
        compute_unit: str,
        source: str,
        options: dict[str, Any],
        outcome: FitOutcome,
        points: list[DataPoint],
        excluded: list[Excluded],
        digest: str | None = None,
    ) -> tuple[StoredFit, bool]:
        """Store a fit: (the fit, False). With a digest (fit_digest) under which a readable fit is stored already:
        (that fit, True), nothing added; the check and the insert are one write transaction, so two identical fits
        finishing at once are stored once."""
        fit = new_fit(
            f"fit-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}",
            label=label,
            compute_unit=compute_unit,
            source=source,
            options=options,
            outcome=outcome,
            points=points,
            excluded=excluded,
        )
        row = fit.model_dump(mode="json")
        for key in _JSON_COLUMNS:
            row[key] = json.dumps(row[key])
        row["digest"] = digest
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                before = self._stored(conn, digest) if digest is not None else None
                if before is None:
                    conn.execute(
                        "INSERT INTO fits (id, label, model, method, compute_unit, created_at, source, options, "
                        "outcome, points, excluded, digest) VALUES (:id, :label, :model, :method, :compute_unit, "
                        ":created_at, :source, :options, :outcome, :points, :excluded, :digest)",
                        row,
                    )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return (before, True) if before is not None else (fit, False)

    def get(self, fit_id: str) -> StoredFit:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM fits WHERE id = ?", (fit_id,)).fetchone()
        if row is None:
            message = (
                f"no fit with id {fit_id!r}; fit_scaling_law returns fit ids, list_scaling_fits lists the stored ones"
            )
            moved = self.notices()
            if moved:
                message += f". Note: {moved[0]}"
            raise NotFoundError(message)
        return self._parse(row)

    def list_fits(self, *, limit: int, offset: int) -> "FitPage":
        """A page of fits, newest first. Rows whose stored JSON is broken are left out of the listing and of
        `total` and counted in `damaged` (a cheap check in SQL over every row); a row on the page that still cannot
        be read is left out too, counted in `damaged` (and named in `problems`); get names what is wrong with any."""
        intact = " AND ".join(f"json_valid({c})" for c in _JSON_COLUMNS)
        with self._connect() as conn:
            total, damaged = conn.execute(
                f"SELECT COALESCE(SUM({intact}), 0), COALESCE(SUM(NOT ({intact})), 0) FROM fits"
            ).fetchone()
            rows = conn.execute(
                f"SELECT * FROM fits WHERE {intact} ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
        page = FitPage(fits=[], total=int(total), damaged=int(damaged), consumed=len(rows), listed=int(total))
        for row in rows:
            try:
                page.fits.append(self._parse(row))
            except InputError as exc:
                log.warning("%s", exc)
                page.total -= 1
                page.damaged += 1
                page.problems.append(str(exc))
        return page


@dataclass
class FitPage:
    """What list_fits returns: the readable fits of the page, the number of readable rows (`total`, as far as
    known), the damaged ones (`damaged`), how many rows the page went through (`consumed`) and how many the
    listing pages over (`listed`): the next offset is offset + consumed while that is below `listed`."""

    fits: list[StoredFit]
    total: int
    damaged: int
    consumed: int
    listed: int
    problems: list[str] = field(default_factory=list)
