"""Fits kept in the state database (table `fits`), so that later calls, other servers and resources can use
them: the outcome with its bootstrap draws, the data it was fitted on, and the options."""

import json
import secrets
import time
from typing import Any

from pydantic import BaseModel

from servers.core.db import connect, initialise
from servers.core.errors import NotFoundError
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
    excluded TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS fits_created ON fits(created_at);
"""


class StoredFit(BaseModel):
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


class FitStore:
    def __init__(self, settings: Settings) -> None:
        self.db_path = settings.db_path
        initialise(self.db_path, _SCHEMA)

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
    ) -> StoredFit:
        fit = StoredFit(
            id=f"fit-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}",
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
        row = fit.model_dump(mode="json")
        for key in ("options", "outcome", "points", "excluded"):
            row[key] = json.dumps(row[key])
        with connect(self.db_path) as conn:
            conn.execute(
                "INSERT INTO fits (id, label, model, method, compute_unit, created_at, source, options, outcome, "
                "points, excluded) VALUES (:id, :label, :model, :method, :compute_unit, :created_at, :source, "
                ":options, :outcome, :points, :excluded)",
                row,
            )
        return fit

    def get(self, fit_id: str) -> StoredFit:
        with connect(self.db_path) as conn:
            row = conn.execute("SELECT * FROM fits WHERE id = ?", (fit_id,)).fetchone()
        if row is None:
            raise NotFoundError(
                f"no fit with id {fit_id!r}; fit_scaling_law returns fit ids, list_scaling_fits lists the stored ones"
            )
        data = dict(row)
        for key in ("options", "outcome", "points", "excluded"):
            data[key] = json.loads(data[key])
        return StoredFit.model_validate(data)

    def list_fits(self, *, limit: int, offset: int) -> tuple[list[StoredFit], int]:
        with connect(self.db_path) as conn:
            total = conn.execute("SELECT COUNT(*) FROM fits").fetchone()[0]
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM fits ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?", (limit, offset)
                ).fetchall()
            ]
        return [self.get(i) for i in ids], total
