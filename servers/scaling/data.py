"""Getting scaling data in, and refusing bad data before anything is fitted or stored.

Four sources: points given inline, a CSV or JSON-lines file inside the allowed roots, a job's metrics file, or
a run (servers/runs: a framework's run by path, URI or job id, its metric against its compute axis). Curves
(scalerl, power_law) are (compute, value, run) triples; pretraining data (chinchilla) are (params, tokens, loss)
triples. Plain Python: no numpy here, so the server can import it at start.
"""

import csv
import itertools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, BinaryIO

from pydantic import Field, ValidationError

from servers.core.errors import InputError
from servers.core.models import Model
from servers.scaling import laws
from servers.scaling.limits import MAX_FILE_BYTES, MAX_LINE_BYTES, MAX_ROWS

Finite = Annotated[float, Field(allow_inf_nan=False)]
MAX_POINTS = MAX_ROWS  # inline points, file rows and metrics rows alike


# One observation: compute, value (and run) for a curve; params, tokens and loss for chinchilla. (Comments, not
# docstrings, on the input models: a docstring would be published in every tool schema that uses the model, and
# the argument that takes them says it already.)
class DataPoint(Model):
    compute: Annotated[Finite, Field(gt=0, le=1e40)] | None = None
    value: Annotated[Finite, Field(ge=-1e12, le=1e12)] | None = None
    run: Annotated[str, Field(max_length=128)] | None = None
    params: Annotated[Finite, Field(gt=0, le=1e20)] | None = None
    tokens: Annotated[Finite, Field(gt=0, le=1e20)] | None = None
    loss: Annotated[Finite, Field(gt=0, le=1e6)] | None = None


Column = Annotated[str, Field(max_length=128)]


# Which column of a file (or key of a metrics row) holds each quantity.
class Columns(Model):
    compute: Column = "compute"
    value: Column = "value"
    run: Column | None = "run"
    params: Column = "params"
    tokens: Column = "tokens"
    loss: Column = "loss"


class CurveData(Model):
    compute: list[float]
    value: list[float]
    run: list[str]


class LossData(Model):
    params: list[float]
    tokens: list[float]
    loss: list[float]


class Excluded(Model):
    index: int
    reason: str


def _kind(raw: Any) -> str:
    """What a cell holds, in words, without its content (a file inside the roots may hold anything)."""
    if isinstance(raw, bool):
        return "true/false"
    if isinstance(raw, str):
        return f"a text of {len(raw)} character(s)"
    if isinstance(raw, (int, float)):
        return "a number out of range"
    return {dict: "a JSON object", list: "a JSON array"}.get(type(raw), type(raw).__name__)


def _number(raw: Any, what: str, row: int) -> float:
    try:
        number = float(raw)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"row {row}: column {what!r} holds {_kind(raw)}, not a number") from None
    if not math.isfinite(number):
        raise InputError(
            f"row {row}: column {what!r} is not finite (NaN or infinity); only finite numbers are accepted"
        )
    return number


JSON_LINES = (".jsonl", ".ndjson", ".json")
DELIMITED = (".csv", ".tsv", ".txt")


def check_file_size(path: Path, source: str) -> int:
    """The file's size in bytes; refused (before anything is read) above MAX_FILE_BYTES."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read {source}: {exc.strerror or type(exc).__name__}") from None
    if size > MAX_FILE_BYTES:
        raise InputError(
            f"{source} is {size:,} bytes ({size / 2**20:,.1f} MiB); scaling data files are read up to "
            f"{MAX_FILE_BYTES // 2**20} MiB ({MAX_FILE_BYTES:,} bytes): average or thin the data first, or split it"
        )
    return size


def _lines(handle: BinaryIO, source: str) -> Iterator[str]:
    """The file's lines as text, each at most MAX_LINE_BYTES, MAX_FILE_BYTES in all (even if the file grows)."""
    total = 0
    for number in itertools.count(1):
        raw = handle.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        total += len(raw)
        if total > MAX_FILE_BYTES:
            raise InputError(
                f"{source} grew past {MAX_FILE_BYTES // 2**20} MiB while it was read; at most that is read"
            )
        if len(raw) > MAX_LINE_BYTES:
            raise InputError(
                f"{source}: line {number} is longer than {MAX_LINE_BYTES // 2**10} KiB; rows of scaling data are "
                "short (a few numbers): is this the right file?"
            )
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            raise InputError(f"cannot read {source}: line {number} is not UTF-8 text") from None
        yield text


def read_rows(path: Path, keys: list[str], source: str) -> tuple[list[dict[str, Any]], set[str]]:
    """The cells of `keys` in each row of a CSV (with a header) or JSON-lines file, and which of `keys` occur.

    Bounded: refused above MAX_FILE_BYTES before reading; at most MAX_ROWS rows and MAX_LINE_BYTES per line; only
    the named columns are kept. Errors name lines and columns, never the file's content."""
    suffix = path.suffix.lower()
    if suffix not in JSON_LINES + DELIMITED:
        raise InputError(f"{source}: unsupported file type {path.suffix!r}; accepted: .csv, .tsv, .jsonl, .ndjson")
    check_file_size(path, source)
    rows: list[dict[str, Any]] = []
    present: set[str] = set()

    def add(row: dict[str, Any]) -> None:
        if len(rows) >= MAX_ROWS:
            raise InputError(f"{source} holds more than {MAX_ROWS:,} rows; at most {MAX_ROWS:,} are read")
        rows.append(row)
        present.update(row)

    try:
        with path.open("rb") as handle:
            lines = _lines(handle, source)
            if suffix in JSON_LINES:
                for number, line in enumerate(lines, start=1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise InputError(f"{source}: line {number} is not JSON ({exc.msg})") from None
                    except (ValueError, RecursionError):
                        raise InputError(f"{source}: line {number} is not JSON this reader accepts") from None
                    if not isinstance(row, dict):
                        raise InputError(f"{source}: line {number} is not a JSON object")
                    add({k: row[k] for k in keys if k in row})
                return rows, present
            reader = csv.reader(lines, dialect="excel-tab" if suffix == ".tsv" else "excel")
            try:
                header = next(reader, None)
                if not header:
                    raise InputError(f"{source}: no header row; the first line must name the columns")
                where = {k: header.index(k) for k in keys if k in header}
                for cells in reader:
                    if cells:
                        add({k: cells[i] if i < len(cells) else None for k, i in where.items()})
            except csv.Error as exc:
                raise InputError(f"{source}: line {reader.line_num} is not valid CSV ({str(exc)[:80]})") from None
    except OSError as exc:
        raise InputError(f"cannot read {source}: {exc.strerror or type(exc).__name__}") from None
    return rows, present


def points_from_rows(
    rows: list[dict[str, Any]], present: set[str], model: str, columns: Columns, source: str
) -> list[DataPoint]:
    if not rows:
        raise InputError(f"{source} holds no rows")
    wanted = list(laws.get(model).columns)
    missing = [getattr(columns, name) for name in wanted if getattr(columns, name) not in present]
    if missing:
        expected = ", ".join(f"{name}={getattr(columns, name)!r}" for name in wanted)
        raise InputError(
            f"{source} has no column(s) {', '.join(repr(m) for m in missing)}; {model} reads the columns {expected}: "
            "name the file's own columns with `columns`, e.g. columns={'compute': 'gpu_hours', 'value': 'pass_rate'}"
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
    points: list[DataPoint], *, y_max: float, min_compute: float | None, max_compute: float | None, model: str
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
    need = len(laws.get(model).parameters)
    if len(compute) < need:
        raise InputError(
            f"{len(compute)} point(s) remain to fit after min_compute/max_compute; {model} needs at "
            f"least {need} (and 3x that for a trustworthy fit)"
        )
    return CurveData(compute=compute, value=value, run=run), excluded


def loss_data(points: list[DataPoint], model: str) -> LossData:
    params, tokens, loss = [], [], []
    seen: dict[tuple[float, float], int] = {}
    for i, p in enumerate(points):
        if p.params is None or p.tokens is None or p.loss is None:
            raise InputError(f"point {i}: {model} needs 'params', 'tokens' and 'loss' in every point")
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
    need = len(laws.get(model).parameters)
    if len(params) < need:
        raise InputError(
            f"{len(params)} point(s) given; {model} has {need} parameters and needs at least {need} points "
            "(and 3x that for a trustworthy fit)"
        )
    return LossData(params=params, tokens=tokens, loss=loss)


# A run as the data source (servers/runs): a TRL output directory, a verl JSONL file, TensorBoard event files, an
# MLflow URI, a W&B offline run, or a job id (its declared run, else its metrics file).
class RunSource(Model):
    source: Annotated[str, Field(min_length=1, max_length=4096, description="Path, URI or job id")]
    metric: Annotated[
        str | None, Field(max_length=256, description="Name or key; default val_accuracy, else reward")
    ] = None
    compute: Annotated[str, Field(max_length=256, description="auto, gpu_hours, flops, steps or a key")] = "auto"
    gpus: Annotated[int | None, Field(ge=1, le=1_000_000)] = None
    params: Annotated[float | None, Field(gt=0, le=1e15, allow_inf_nan=False)] = None
    steps: Annotated[int | None, Field(ge=1, le=10**9, description="Planned last step")] = None
    reader: Annotated[str | None, Field(max_length=32)] = None


@dataclass
class LoadedRun:
    """Curve points read from a run, with what the fit reports about it."""

    points: list[DataPoint]
    source: str
    unit: str
    notes: list[str]
    info: dict[str, Any]
    result: Any  # servers.runs.points.RunPoints
    plan: Any  # servers.runs.points.JobPlan, for a job


def _job_record(engine: Any, text: str) -> Any:
    """The job named `text`, or None when `text` is not a job id the engine knows (then it is a path)."""
    from servers.core.errors import NotFoundError
    from servers.core.jobs import JOB_ID_PATTERN

    if not re.fullmatch(JOB_ID_PATTERN, text):
        return None
    try:
        return engine.get(text)
    except NotFoundError:
        return None


def load_run(settings: Any, engine: Any, source: RunSource) -> LoadedRun:
    """The points of a run source: a job (its declared run, else its metrics file), else a path or URI (through
    servers.runs.registry, inside the allowed roots and tracking hosts); the metric against the compute chosen."""
    from servers.runs import compute as axes
    from servers.runs.jobs import job_target
    from servers.runs.points import job_plan, read_points
    from servers.runs.registry import target
    from servers.runs.series import RunError

    hosts = settings.tracking_hosts
    record = _job_record(engine, source.source)
    plan = None
    if record is not None:
        spec = record.spec if isinstance(record.spec, dict) else {}
        where, reader = job_target(Path(record.job_dir), spec, engine.files(record).metrics, hosts)
        if reader == "suite" and not where.path.exists():  # type: ignore[union-attr]
            raise InputError(f"job {source.source!r} has logged no metrics yet")
        reader, plan, label = source.reader or reader, job_plan(spec, record.id), f"job:{record.id}"
    else:
        where, reader, label = target(source.source, roots=settings.roots(), hosts=hosts), source.reader, ""
        if where.uri is not None:  # refused before any reader connects (each reader checks it again)
            try:
                where.check_host()
            except RunError as exc:
                raise InputError(str(exc)) from None
    if source.gpus is not None:
        given = axes.Given(source.gpus, "given (data.run.gpus)", False, source.params)
    elif plan is not None and plan.gpus is not None:
        given = axes.Given(plan.gpus, plan.where, plan.cpu, source.params)
    else:
        given = axes.Given(params=source.params)
    result = read_points(where, reader=reader, metric=source.metric, choice=source.compute, given=given)
    name = (result.run.name or label or "run")[:128]
    points = [DataPoint(compute=c, value=v, run=name) for c, v, _ in result.points[:MAX_POINTS]]
    notes = list(result.notes)
    if len(result.points) > MAX_POINTS:
        notes.append(f"the first {MAX_POINTS:,} of {len(result.points):,} points were used")
    unit = re.sub(r"[^A-Za-z0-9_./ -]", "_", result.axis.unit)[:32]
    info = result.info()
    info["end"] = run_end(result, source.steps, plan)
    notes.insert(0, f"Compute ({result.axis.choice}): {result.axis.assumption}.")
    notes.insert(
        0,
        f"Run {result.run.reader}:{result.run.source}; metric {result.metric.requested!r} -> "
        f"{result.metric.key!r} ({result.metric.how}).",
    )
    return LoadedRun(points, label or f"run:{result.run.reader}:{result.run.source}", unit, notes, info, result, plan)


def run_end(result: Any, steps: int | None, plan: Any) -> dict[str, Any] | None:
    """The run's planned end (servers.runs.points.planned_steps) on its compute axis, and the metric observed there
    when the run has reached it; None when the planned end is unknown."""
    from servers.runs.points import end_compute, planned_steps

    planned = planned_steps(result.run, steps, plan)
    if planned is None:
        return None
    end, where = planned
    compute, how = end_compute(result, end)
    last = result.points[-1][2]
    reached = [v for _, v, s in result.points if s <= end]
    return {
        "steps": end,
        "steps_from": where,
        "compute": compute,
        "compute_how": how,
        "reached": last >= end,
        "observed": reached[-1] if last >= end and reached else None,
    }
