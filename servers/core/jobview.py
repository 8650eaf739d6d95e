"""What the job tools return: a job's view, chunks of its logs, rows of its metrics. Plain pydantic models
and functions over the job folder; the MCP layer only wraps them.

The job folder is written by the job's own code, so nothing read from it may break a view: a file that is not
what it should be (not JSON, a wrong type, a symbolic link, a FIFO) is left out of that one job's view and named
in its `warnings`."""

import json
import os
import stat
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError

from servers.core.errors import InputError, NotFoundError
from servers.core.jobfiles import MAIN_PROCESS, BadJobFileError, JobFiles, load_json, open_regular
from servers.core.jobstore import JobRecord, JobState
from servers.core.models import Model

RESULT_INLINE_LIMIT = 256 * 1024  # bytes of result.json read into a view (the server's own use; the result resource)
# Bytes of a result (compact JSON) a tool's answer carries whole; above it, its small top-level fields, and the whole
# at infra://jobs/{id}/result. An agent's default answer stays under ~16 KB (issue 22, defect 9).
RESULT_SHOWN_BYTES = 10 * 1024
_PREVIEW_FIELD_BYTES = 4 * 1024
_PROGRESS_LIMIT = 64 * 1024
_METRICS_LINE_LIMIT = 1024 * 1024  # a longer metrics line is skipped


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")


class Progress(Model):
    done: float = Field(description="Work done so far, in the unit of total")
    total: float | None = Field(default=None, description="Work in all, when known")
    message: str | None = None
    updated_at: str | None = Field(default=None, description="When the job last reported progress (UTC)")


class LogInfo(Model):
    process: str = Field(description="Name to pass to read_job_logs")
    size_bytes: int


class JobView(Model):
    """A job as the tools show it."""

    job_id: str
    kind: str
    state: JobState = Field(description="QUEUED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED or LOST")
    finished: bool = Field(description="True once the state is final (SUCCEEDED, FAILED, CANCELLED, LOST)")
    created_at: str | None
    started_at: str | None = None
    ended_at: str | None = None
    elapsed_s: float | None = Field(default=None, description="Run time so far, or in all once ended")
    timeout_s: float = Field(description="Wall-time limit; the job is ended when it runs past it")
    exit_code: int | None = Field(default=None, description="Worker's exit status; negative means killed by signal")
    reason: str | None = Field(default=None, description="Why it ended the way it did, or a note while it runs")
    spec: dict[str, Any]
    result: Any | None = Field(default=None, description="The job's result once it SUCCEEDED (inline when small)")
    result_truncated: bool = Field(
        default=False, description="True if result is only a part (its small fields): read result_uri for all"
    )
    result_uri: str | None = Field(default=None, description="MCP resource with the whole result, when cut")
    result_omitted: list[str] = Field(default_factory=list, description="The result's fields left out here")
    progress: Progress | None = None
    logs: list[LogInfo] = Field(default_factory=list)
    metrics_bytes: int = Field(default=0, description="Size of the metrics file; read_job_metrics reads it")
    resource_uri: str = Field(description="MCP resource with this view")
    next_step: str = Field(description="What to call next")
    warnings: list[str] = Field(
        default_factory=list,
        description="What could not be read for this job (a damaged database row, a job-folder file that is not "
        "valid); the rest of the view stands",
    )


def _compact_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def result_uri(job_id: str) -> str:
    return f"infra://jobs/{job_id}/result"


def shown_to_agent(view: JobView) -> JobView:
    """The view as a tool answers with it: a result over RESULT_SHOWN_BYTES becomes its top-level fields that fit
    (each at most 4 KiB, in their order, up to RESULT_SHOWN_BYTES in all), with the names of those left out and the
    resource that has it whole. A result too big even for the server to read is pointed at the same way."""
    if view.result_truncated and view.result is None:
        return view.model_copy(
            update={"result_uri": result_uri(view.job_id), "next_step": f"read the resource {result_uri(view.job_id)}"}
        )
    if view.result is None or _compact_size(view.result) <= RESULT_SHOWN_BYTES:
        return view
    kept: dict[str, Any] = {}
    omitted: list[str] = []
    if isinstance(view.result, dict):
        used = 2
        for key, value in view.result.items():
            size = _compact_size({key: value})
            if size <= _PREVIEW_FIELD_BYTES and used + size <= RESULT_SHOWN_BYTES:
                kept[key] = value
                used += size
            else:
                omitted.append(str(key))
    return view.model_copy(
        update={
            "result": kept or None,
            "result_truncated": True,
            "result_uri": result_uri(view.job_id),
            "result_omitted": omitted[:50],
            "next_step": f"the result's small fields are above; read the resource {result_uri(view.job_id)} for all",
        }
    )


def _finite(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or abs(value) == float("inf"):
        raise ValueError("must be a finite number")
    return value


def _short_text(value: Any) -> Any:
    if isinstance(value, str):
        return value[:1000]
    if value is not None:
        raise ValueError("must be text")
    return value


class _ProgressFile(Model):
    """progress.json as JobContext.progress writes it."""

    model_config = ConfigDict(extra="ignore")

    done: Annotated[float, BeforeValidator(_finite)]
    total: Annotated[float, BeforeValidator(_finite)] | None = None
    message: Annotated[str | None, BeforeValidator(_short_text)] = None
    time: Annotated[float, BeforeValidator(_finite)] | None = None


def check_progress(files: JobFiles) -> tuple[Progress | None, str | None]:
    """(the job's progress or None, what was wrong with progress.json if it was there but not valid)."""
    try:
        data = _ProgressFile.model_validate(load_json(files.progress, _PROGRESS_LIMIT))
    except FileNotFoundError:
        return None, None
    except (OSError, BadJobFileError) as exc:
        return None, f"progress.json is not usable ({exc}); progress is not shown"
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return None, f"progress.json is not valid ({where}: {first['msg']}); progress is not shown"
    try:
        updated = iso(data.time)
    except (OverflowError, OSError, ValueError):
        updated = None
    return Progress(done=data.done, total=data.total, message=data.message, updated_at=updated), None


def _regular_size(path: Path) -> int | None:
    """Size of a regular file (not followed through a symbolic link); None if absent; BadJobFileError if not
    a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadJobFileError(f"{path.name} cannot be read ({exc.strerror})") from exc
    if stat.S_ISLNK(info.st_mode):
        raise BadJobFileError(f"{path.name} is a symbolic link, which is not followed")
    if not stat.S_ISREG(info.st_mode):
        raise BadJobFileError(f"{path.name} is not a regular file")
    return info.st_size


def job_view(record: JobRecord) -> JobView:
    """The view of one job. Never raises for what is in the job folder: problems become warnings."""
    files = JobFiles(record.job_dir)
    warnings = [f"the database row of this job is damaged: {d}" for d in record.damage]
    finished = record.state.terminal
    result: Any | None = None
    truncated = False
    if record.state == JobState.SUCCEEDED:
        try:
            size = _regular_size(files.result)
            if size is not None and size > RESULT_INLINE_LIMIT:
                truncated = True
            elif size is not None:
                result = load_json(files.result, RESULT_INLINE_LIMIT)
        except FileNotFoundError:
            pass
        except (OSError, BadJobFileError) as exc:
            warnings.append(f"the result is not shown: {exc}")
    elapsed = None
    if record.started_at is not None:
        elapsed = round((record.ended_at or time.time()) - record.started_at, 3)
    logs = []
    for process in files.processes():
        try:
            size = _regular_size(files.log(process))
        except BadJobFileError as exc:
            warnings.append(f"log {process!r} is left out: {exc}")
            continue
        if size is not None:
            logs.append(LogInfo(process=process, size_bytes=size))
    try:
        metrics_bytes = _regular_size(files.metrics) or 0
    except BadJobFileError as exc:
        warnings.append(f"the metrics are not readable: {exc}")
        metrics_bytes = 0
    progress, progress_problem = check_progress(files)
    if progress_problem:
        warnings.append(progress_problem)
    if finished:
        next_step = (
            "read_job_logs and read_job_metrics show what it left"
            if record.state != JobState.SUCCEEDED
            else "the result is above; read_job_metrics has the rows"
        )
    else:
        next_step = f"wait_for_job(job_id={record.id!r}) until it finishes, or cancel_job to stop it"
    return JobView(
        job_id=record.id,
        kind=record.kind,
        state=record.state,
        finished=finished,
        created_at=iso(record.created_at),
        started_at=iso(record.started_at),
        ended_at=iso(record.ended_at),
        elapsed_s=elapsed,
        timeout_s=record.timeout_s,
        exit_code=record.exit_code,
        reason=record.reason,
        spec=record.spec,
        result=result,
        result_truncated=truncated,
        progress=progress,
        logs=logs,
        metrics_bytes=metrics_bytes,
        resource_uri=f"infra://jobs/{record.id}",
        next_step=next_step,
        warnings=warnings,
    )


class LogChunk(Model):
    job_id: str
    process: str
    offset: int = Field(description="Byte offset this chunk starts at")
    next_offset: int = Field(description="Pass as offset to read on")
    size_bytes: int = Field(description="Size of the log file now")
    eof: bool = Field(description="True if the chunk reaches the end of the file as it is now")
    job_finished: bool = Field(description="True once the job ended, so the log will not grow any more")
    cut_at_bytes: int | None = Field(
        default=None,
        description="Set when this log was cut at the job's log cap (LLM_INFRA_MCP_MAX_LOG_BYTES_PER_JOB): nothing "
        "the process wrote after this offset was kept",
    )
    text: str


def read_log_chunk(record: JobRecord, process: str | None, offset: int, limit_bytes: int) -> LogChunk:
    files = JobFiles(record.job_dir)
    name = process or MAIN_PROCESS
    available = files.processes()
    if name not in available:
        listed = ", ".join(available) or "none yet"
        raise NotFoundError(f"job {record.id!r} has no log for process {name!r}; its logs: {listed}")
    path = files.log(name)
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise NotFoundError(f"job {record.id!r} has no log for process {name!r} any more") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if offset > size:
            raise InputError(f"offset {offset} is past the end of the log ({size} bytes); use an offset in [0, {size}]")
        f.seek(offset)
        data = f.read(limit_bytes)
    end = offset + len(data)
    if end < size:
        data = _trim_partial_utf8(data)
        end = offset + len(data)
    return LogChunk(
        job_id=record.id,
        process=name,
        offset=offset,
        next_offset=end,
        size_bytes=size,
        eof=end >= size,
        job_finished=record.state.terminal,
        cut_at_bytes=_cut_at(files, name),
        text=data.decode("utf-8", errors="replace"),
    )


def _cut_at(files: JobFiles, process: str) -> int | None:
    """Where a log was cut at the job's cap (its `<process>.cut` record beside it), if it was."""
    from servers.core.jobfiles import read_json

    record = read_json(files.log(process).with_suffix(".cut"), 4096)
    value = record.get("cut_at_bytes") if isinstance(record, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _trim_partial_utf8(data: bytes) -> bytes:
    """Drop a UTF-8 sequence cut at the end of a chunk, so the next chunk starts on a character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: the start of the last character
            width = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return data if width <= back else data[:-back]
    return data


class MetricsPage(Model):
    job_id: str
    rows: list[dict[str, Any]] = Field(description="One dict per metrics line: step, time and the values")
    last_step: int | None = Field(description="Largest step among the rows returned; pass as since_step to read on")
    truncated: bool = Field(description="True if more rows match than limit allowed")
    skipped_lines: int = Field(description="Lines that were not valid JSON objects (e.g. one being written)")
    job_finished: bool
    reader: str | None = Field(default=None, description="The run reader of a framework job's run; null: metrics.jsonl")
    source_keys: list[str] = Field(default_factory=list, description="A framework run's keys (first 200)")
    notes: list[str] = Field(default_factory=list)


# A job whose spec declares the run its framework writes (servers/runs/jobs.py) is read by the run readers: named
# by reference, so that core imports no servers.runs.
RUN_ROWS = "servers.runs.points:job_rows"


def read_metrics(record: JobRecord, keys: list[str] | None, since_step: int | None, limit: int) -> MetricsPage:
    files = JobFiles(record.job_dir)
    spec = record.spec if isinstance(record.spec, dict) else {}
    if isinstance(spec.get("run_source"), dict):
        from servers.core.refs import resolve

        try:
            page = resolve(RUN_ROWS)(record.job_dir, spec, files.metrics, (), keys, since_step, limit)
        except InputError as exc:  # not written yet, or unreadable: said, with no rows
            page = {"rows": [], "last_step": None, "truncated": False, "skipped_lines": 0, "notes": [str(exc)]}
            page["reader"] = str(spec["run_source"].get("reader"))
        return MetricsPage(job_id=record.id, job_finished=record.state.terminal, **page)
    rows: list[dict[str, Any]] = []
    skipped = 0
    truncated = False
    try:
        f = open_regular(files.metrics)
    except FileNotFoundError:
        f = None
    if f is not None:
        with f:
            while line := f.readline(_METRICS_LINE_LIMIT):
                if not line.endswith(b"\n"):
                    if len(line) < _METRICS_LINE_LIMIT:
                        break  # a line still being written
                    skipped += 1  # an overlong line: skip to its end
                    while (rest := f.readline(_METRICS_LINE_LIMIT)) and not rest.endswith(b"\n"):
                        pass
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    skipped += 1
                    continue
                if not isinstance(row, dict):
                    skipped += 1
                    continue
                step = row.get("step")
                if since_step is not None and (not isinstance(step, int) or step <= since_step):
                    continue
                if keys:
                    row = {k: v for k, v in row.items() if k in keys or k in ("step", "time")}
                if len(rows) >= limit:
                    truncated = True
                    break
                rows.append(row)
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
    return MetricsPage(
        job_id=record.id,
        rows=rows,
        last_step=max(steps) if steps else None,
        truncated=truncated,
        skipped_lines=skipped,
        job_finished=record.state.terminal,
    )
