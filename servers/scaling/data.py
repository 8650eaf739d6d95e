"""Getting scaling data in, and refusing bad data before anything is fitted or stored.

Three sources: points given inline, a CSV or JSON-lines file inside the allowed roots, or a job's metrics
file. Curves (scalerl, power_law) are (compute, value, run) triples; pretraining data (chinchilla) are
(params, tokens, loss) triples. Plain Python: no numpy here, so the server can import it at start.
"""

import csv
import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from servers.core.errors import InputError

Finite = Annotated[float, Field(allow_inf_nan=False)]
ModelName = Literal["scalerl", "power_law", "chinchilla"]
FREE_PARAMETERS = {"scalerl": 4, "power_law": 3, "chinchilla": 5}
MAX_POINTS = 100_000


class DataPoint(BaseModel):
    """One observation: compute and value (and run) for a curve, or params, tokens and loss for chinchilla."""

    compute: Annotated[Finite, Field(gt=0, le=1e40)] | None = Field(
        default=None, description="Training compute so far (scalerl, power_law), > 0"
    )
    value: Annotated[Finite, Field(ge=-1e12, le=1e12)] | None = Field(
        default=None, description="Metric at that compute, e.g. pass rate (curves); within [0, y_max]"
    )
    run: Annotated[str, Field(max_length=128)] | None = Field(default=None, description="Run or seed label")
    params: Annotated[Finite, Field(gt=0, le=1e20)] | None = Field(
        default=None, description="Model parameters N (chinchilla), > 0"
    )
    tokens: Annotated[Finite, Field(gt=0, le=1e20)] | None = Field(
        default=None, description="Training tokens D (chinchilla), > 0"
    )
    loss: Annotated[Finite, Field(gt=0, le=1e6)] | None = Field(
        default=None, description="Final loss at (N, D) (chinchilla), > 0"
    )


Column = Annotated[str, Field(max_length=128)]


class Columns(BaseModel):
    """Which column of a file (or key of a metrics row) holds each quantity."""

    compute: Column = Field(default="compute", description="Column with the compute (curves)")
    value: Column = Field(default="value", description="Column with the metric (curves)")
    run: Column | None = Field(default="run", description="Column with a run or seed label; optional")
    params: Column = Field(default="params", description="Column with N (chinchilla)")
    tokens: Column = Field(default="tokens", description="Column with D (chinchilla)")
    loss: Column = Field(default="loss", description="Column with the loss (chinchilla)")


class CurveData(BaseModel):
    compute: list[float]
    value: list[float]
    run: list[str]


class LossData(BaseModel):
    params: list[float]
    tokens: list[float]
    loss: list[float]


class Excluded(BaseModel):
    index: int
    reason: str


def _number(raw: Any, what: str, row: int) -> float:
    try:
        number = float(raw)
    except (TypeError, ValueError):
        raise InputError(f"row {row}: {what} is {raw!r}, not a number") from None
    if not math.isfinite(number):
        raise InputError(f"row {row}: {what} is {raw!r}; only finite numbers are accepted (no NaN or inf)")
    return number


JSON_LINES = (".jsonl", ".ndjson", ".json")
DELIMITED = (".csv", ".tsv", ".txt")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV (with a header) or JSON-lines file, as dicts."""
    suffix = path.suffix.lower()
    if suffix not in JSON_LINES + DELIMITED:
        raise InputError(f"{path}: unsupported file type {path.suffix!r}; accepted: .csv, .tsv, .jsonl, .ndjson")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    if suffix in JSON_LINES:
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise InputError(f"{path}: line {number} is not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}: line {number} is not a JSON object")
            rows.append(row)
        return rows
    reader = csv.DictReader(text.splitlines(), dialect="excel-tab" if suffix == ".tsv" else "excel")
    if not reader.fieldnames:
        raise InputError(f"{path}: no header row; the first line must name the columns")
    return [dict(row) for row in reader]


def points_from_rows(rows: list[dict[str, Any]], model: ModelName, columns: Columns, source: str) -> list[DataPoint]:
    if not rows:
        raise InputError(f"{source} holds no rows")
    if len(rows) > MAX_POINTS:
        raise InputError(f"{source} holds {len(rows)} rows; at most {MAX_POINTS} are accepted")
    wanted = ["params", "tokens", "loss"] if model == "chinchilla" else ["compute", "value"]
    present = set().union(*(row.keys() for row in rows))
    missing = [getattr(columns, name) for name in wanted if getattr(columns, name) not in present]
    if missing:
        raise InputError(
            f"{source} has no column(s) {missing}; its columns are {sorted(present)}; "
            "name the right ones with `columns`"
        )
    points = []
    for i, row in enumerate(rows):
        if any(row.get(getattr(columns, name)) in (None, "") for name in wanted):
            continue  # a row without this metric (metrics files mix kinds of rows)
        values = {name: _number(row[getattr(columns, name)], getattr(columns, name), i) for name in wanted}
        run = row.get(columns.run) if columns.run else None
        try:
            points.append(DataPoint(**values, run=None if run in (None, "") else str(run)[:128]))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise InputError(f"{source}, row {i}: {problems}") from None
    if not points:
        raise InputError(f"{source}: no row has all of {[getattr(columns, n) for n in wanted]}")
    return points


def curve_data(
    points: list[DataPoint], *, y_max: float, min_compute: float | None, max_compute: float | None, model: ModelName
) -> tuple[CurveData, list[Excluded]]:
    """Validate curve points and split them into those fitted and those excluded (with the reason)."""
    compute, value, run = [], [], []
    excluded: list[Excluded] = []
    seen: dict[tuple[str, float], int] = {}
    for i, p in enumerate(points):
        if p.compute is None or p.value is None:
            raise InputError(f"point {i}: {model} needs 'compute' and 'value' in every point")
        if p.compute <= 0:
            raise InputError(f"point {i}: compute must be > 0, got {p.compute}")
        if not 0 <= p.value <= y_max:
            raise InputError(
                f"point {i}: value {p.value} is outside [0, y_max={y_max:g}] for a bounded metric; "
                "set y_max if the metric's maximum is not 1"
            )
        label = p.run or ""
        key = (label, p.compute)
        if key in seen:
            where = f" in run {label!r}" if label else ""
            raise InputError(
                f"points {seen[key]} and {i} have the same compute {p.compute:g}{where}; give each "
                "run a 'run' label, or average repeated evaluations first"
            )
        seen[key] = i
        if min_compute is not None and p.compute < min_compute:
            excluded.append(Excluded(index=i, reason=f"compute below min_compute={min_compute:g}"))
            continue
        if max_compute is not None and p.compute > max_compute:
            excluded.append(Excluded(index=i, reason=f"compute above max_compute={max_compute:g}"))
            continue
        compute.append(p.compute)
        value.append(p.value)
        run.append(label)
    need = FREE_PARAMETERS[model]
    if len(compute) < need:
        raise InputError(
            f"{len(compute)} point(s) remain to fit after min_compute/max_compute; {model} needs at "
            f"least {need} (and 3x that for a trustworthy fit)"
        )
    return CurveData(compute=compute, value=value, run=run), excluded


def loss_data(points: list[DataPoint]) -> LossData:
    params, tokens, loss = [], [], []
    seen: dict[tuple[float, float], int] = {}
    for i, p in enumerate(points):
        if p.params is None or p.tokens is None or p.loss is None:
            raise InputError(f"point {i}: chinchilla needs 'params', 'tokens' and 'loss' in every point")
        for name, v in (("params", p.params), ("tokens", p.tokens), ("loss", p.loss)):
            if v <= 0:
                raise InputError(f"point {i}: {name} must be > 0, got {v}")
        if (p.params, p.tokens) in seen:
            raise InputError(
                f"points {seen[(p.params, p.tokens)]} and {i} have the same params and tokens; "
                "average repeated runs first"
            )
        seen[(p.params, p.tokens)] = i
        params.append(p.params)
        tokens.append(p.tokens)
        loss.append(p.loss)
    if len(params) < FREE_PARAMETERS["chinchilla"]:
        raise InputError(
            f"{len(params)} point(s) given; chinchilla has 5 parameters and needs at least 5 points "
            "(and 3x that for a trustworthy fit)"
        )
    return LossData(params=params, tokens=tokens, loss=loss)
