"""The job tools every server that starts jobs shares, and the helpers its own tools use to run and follow jobs.

- `register_job_tools`: get_job, list_jobs, wait_for_job, cancel_job, read_job_logs, read_job_metrics.
- `register_job_resources`: infra://jobs/{id}, its result and the tail of each of its logs.
- `run_job`: start long work as a job and wait up to wait_s for its result; `wait_for`, `wait_for_sweep` follow one.
- `summarize_job`: a job's one-line text, the same in every tool's answer.
"""

import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Annotated, Any

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.types import CallToolResult
from pydantic import Field

from servers.core.audit import AuditLog
from servers.core.errors import InputError, NotFoundError
from servers.core.jobs import JOB_ID_PATTERN, Admit, JobKind
from servers.core.jobstore import JobState
from servers.core.jobview import (
    RESULT_INLINE_LIMIT,
    JobView,
    LogChunk,
    MetricsPage,
    job_view,
    read_log_chunk,
    read_metrics,
    shown_to_agent,
)
from servers.core.mcp_layer import App, agent_tool, client_name, in_thread, tool_result
from servers.core.models import Model
from servers.core.procs import sleep_until_exit

log = logging.getLogger(__name__)

JobId = Annotated[
    str,
    Field(
        pattern=JOB_ID_PATTERN,
        max_length=96,
    ),
]
WaitS = Annotated[
    float,
    Field(
        ge=0,
        le=50,
        description="Wait up to this for the result, else return the job handle",
    ),
]


LIST_DETAIL_MAX = 10  # full views list_jobs returns at most (each can be several KB)
ROW_SUMMARY_CHARS = 200


class JobRow(Model):
    """One job in a listing: enough to pick it; get_job has the rest."""

    job_id: str
    kind: str
    state: JobState
    finished: bool
    backend: str | None = Field(default=None, description="Where a training job runs (local, slurm, ray...)")
    name: str | None = None
    created_at: str | None
    elapsed_s: float | None = Field(default=None, description="Run time from its start (none while queued)")
    summary: str = Field(description="State and reason or progress, one line")


def _listed(view: JobView, kind: JobKind | None) -> Mapping[str, Any]:
    if kind is None or kind.listed is None:
        return view.spec
    try:
        listed = kind.listed(view.spec)
    except Exception:  # a kind's own reading of a spec never takes the listing down
        log.exception("job kind %s could not read the spec of %s for its row", view.kind, view.job_id)
        return view.spec
    return listed if isinstance(listed, Mapping) else view.spec


def job_row(view: JobView, kind: JobKind | None = None) -> JobRow:
    """The listing's row of a job's view: its backend and name as its kind reads them from its spec (JobKind.listed;
    by default the spec's own), only short text taken."""
    listed = _listed(view, kind)

    def text(value: Any) -> str | None:
        return value[:100] if isinstance(value, str) and value else None

    summary = view.state.value
    note = view.reason or (view.progress.message if view.progress else None)
    if note:
        summary += f": {note}"
    if view.warnings:
        summary += f" ({len(view.warnings)} warning(s): get_job)"
    if len(summary) > ROW_SUMMARY_CHARS:
        summary = summary[: ROW_SUMMARY_CHARS - 3] + "..."
    return JobRow(
        job_id=view.job_id,
        kind=view.kind,
        state=view.state,
        finished=view.finished,
        backend=text(listed.get("backend")),
        name=text(listed.get("name")),
        created_at=view.created_at,
        elapsed_s=view.elapsed_s,
        summary=summary,
    )


class JobList(Model):
    jobs: list[JobRow] = Field(description="One short row per job; get_job (or detail) for the full view")
    details: list[JobView] = Field(default_factory=list, description="Full views, only with detail")
    total: int = Field(description="Jobs matching the filter, all pages together")
    next_offset: int | None = Field(description="Offset of the next page, or null on the last page")
    notices: list[str] = Field(
        default_factory=list,
        description="What happened to the state database lately (a damaged file moved aside, jobs re-imported "
        "from their folders)",
    )


SWEEP_ID = r"^sweep-[0-9a-f]{16}$"


class SweepRunState(Model):
    job_id: str
    index: int | None
    state: JobState
    reason: str | None = None
    elapsed_s: float | None = None


class SweepStatus(Model):
    sweep_id: str
    runs: int = Field(description="Jobs of the sweep")
    finished: int = Field(description="Runs that have ended (any final state)")
    states: dict[str, int] = Field(description="Runs per state; the counts add up to runs")
    jobs: list[SweepRunState] = Field(description="Each run, in run order")


class JobWait(Model):
    job: JobView | None = Field(default=None, description="The job waited for (absent when a sweep was)")
    sweep: SweepStatus | None = Field(default=None, description="The sweep waited for, when job_id named one")
    waited_s: float
    timed_out: bool = Field(description="True if the job (or a run of the sweep) was still running when the wait ended")


def sweep_status(app: App, sweep_id: str) -> SweepStatus:
    page = app.engine.list_jobs(sweep_id=sweep_id, limit=1000)
    if page.total == 0:
        raise NotFoundError(f"no sweep with id {sweep_id!r}; submit_sweep returns it, list_jobs(sweep_id=...) too")
    records = sorted(
        page.jobs,
        key=lambda r: (r.spec.get("sweep_index") if isinstance(r.spec.get("sweep_index"), int) else 1 << 30, r.id),
    )
    runs = []
    states: dict[str, int] = {}
    for r in records:
        index = r.spec.get("sweep_index")
        elapsed = round((r.ended_at or time.time()) - r.started_at, 3) if r.started_at else None
        runs.append(
            SweepRunState(
                job_id=r.id,
                index=index if isinstance(index, int) else None,
                state=r.state,
                reason=r.reason,
                elapsed_s=elapsed,
            )
        )
        states[r.state.value] = states.get(r.state.value, 0) + 1
    finished = sum(1 for r in records if r.state.terminal)
    return SweepStatus(sweep_id=sweep_id, runs=len(records), finished=finished, states=states, jobs=runs)


async def wait_for_sweep(app: App, sweep_id: str, timeout_s: float, ctx: Context | None) -> JobWait:
    """Poll a sweep until every run ends or `timeout_s` passes; progress: runs done of all."""
    start = time.monotonic()
    status = await in_thread(sweep_status, app, sweep_id)
    last_note = -1.0
    while status.finished < status.runs:
        waited = time.monotonic() - start
        if waited >= timeout_s:
            break
        if ctx is not None and waited - last_note >= 1.0:
            last_note = waited
            await ctx.report_progress(round(waited, 2), timeout_s, f"{status.finished}/{status.runs} runs done")
        await anyio.sleep(min(0.5, max(0.0, timeout_s - waited)))
        status = await in_thread(sweep_status, app, sweep_id)
    waited = round(time.monotonic() - start, 3)
    return JobWait(sweep=status, waited_s=waited, timed_out=status.finished < status.runs)


def summarize_job(view: JobView) -> str:
    text = f"job {view.job_id} ({view.kind}): {view.state.value}"
    if view.elapsed_s is not None:
        text += f" after {view.elapsed_s:.1f} s"
    if view.reason:
        text += f"; {view.reason}"
    if view.progress and view.progress.message and not view.finished and view.progress.message not in text:
        text += f"; progress: {view.progress.message}"
    return text + f". Next: {view.next_step}."


async def wait_for(app: App, job_id: str, timeout_s: float, ctx: Context | None) -> JobWait:
    """Poll a job until it ends or `timeout_s` passes, sending progress notifications meanwhile."""
    start = time.monotonic()
    record = await in_thread(app.engine.get, job_id)
    last_note = 0.0
    while not record.state.terminal:
        waited = time.monotonic() - start
        if waited >= timeout_s:
            break
        if ctx is not None and waited - last_note >= 1.0:
            last_note = waited
            view = job_view(record)
            note = view.state.value
            if view.progress is not None:
                total = f"/{view.progress.total:g}" if view.progress.total is not None else ""
                note += f": {view.progress.done:g}{total} {view.progress.message or ''}".rstrip()
            # progress counts seconds waited: it must rise with every notification, job progress may not
            await ctx.report_progress(round(waited, 2), timeout_s, note)
        # woken at once by the supervisor's exit: it records the job's end just before
        await sleep_until_exit(record.supervisor_pid, record.supervisor_start, min(0.25, max(0.0, timeout_s - waited)))
        record = await in_thread(app.engine.get, job_id)
    waited = round(time.monotonic() - start, 3)
    return JobWait(job=job_view(record), waited_s=waited, timed_out=not record.state.terminal)


async def run_job(
    app: App,
    kind: str,
    spec: dict[str, Any],
    *,
    wait_s: float,
    ctx: Context | None,
    timeout_s: float | None = None,
    admit: Admit | None = None,
) -> JobView:
    """Start long work as a job; return its view with the result if it ends within wait_s, else the handle.
    `admit` is JobEngine.submit's admission hook (run inside the admitting transaction)."""
    record = await in_thread(lambda: app.engine.submit(kind, spec, timeout_s=timeout_s, admit=admit))
    if wait_s <= 0:
        return job_view(record)
    waited = await wait_for(app, record.id, wait_s, ctx)
    assert waited.job is not None
    return waited.job


def _warning_text(view: JobView) -> str:
    return "".join(f" Warning: {w}." for w in view.warnings)


def register_job_tools(server: MCPServer, app: App) -> None:
    """The shared job tools. A server that starts jobs registers them once (the suite once for all)."""

    @agent_tool(server, title="Get job", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def get_job(job_id: JobId) -> Annotated[CallToolResult, JobView]:
        """One job: state, exit reason, result, progress, logs; also jobs of an earlier server run. Instant."""
        view = await in_thread(lambda: job_view(app.engine.get(job_id)))
        return tool_result(view, summarize_job(view) + _warning_text(view))

    @agent_tool(server, title="List jobs", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def list_jobs(
        kind: Annotated[str | None, Field(max_length=64, description="e.g. training")] = None,
        state: JobState | None = None,
        sweep_id: Annotated[str | None, Field(pattern=SWEEP_ID)] = None,
        limit: Annotated[
            int | None, Field(ge=1, le=200, description=f"Default 20 ({LIST_DETAIL_MAX} with detail)")
        ] = None,
        offset: Annotated[int, Field(ge=0, le=1_000_000)] = 0,
        detail: Annotated[bool, Field(description=f"Also the full views (limit <= {LIST_DETAIL_MAX})")] = False,
    ) -> Annotated[CallToolResult, JobList]:
        """Jobs, newest first, by kind, state or sweep, one short row each: to find a job id or what is running.
        Instant."""
        if limit is None:
            limit = LIST_DETAIL_MAX if detail else 20
        if detail and limit > LIST_DETAIL_MAX:
            raise InputError(f"limit: {limit} with detail; accepted: at most {LIST_DETAIL_MAX} full views a page")

        def listing() -> tuple[Any, list[JobView], list[str]]:
            page = app.engine.list_jobs(kind=kind, state=state, limit=limit, offset=offset, sweep_id=sweep_id)
            return page, [job_view(r) for r in page.jobs], app.engine.notices()

        page, views, notices = await in_thread(listing)
        rows = [job_row(v, app.job_kinds.get(v.kind)) for v in views]
        next_offset = offset + len(views) if offset + len(views) < page.total else None
        result = JobList(
            jobs=rows, details=views if detail else [], total=page.total, next_offset=next_offset, notices=notices
        )
        more = f"; {page.total - offset - len(rows)} more (offset {next_offset})" if next_offset is not None else ""
        lines = [f"{page.total} job(s) match; showing {len(rows)} from offset {offset}{more}"]
        lines += [f"- {r.job_id}: {r.summary}" for r in rows]
        lines += [f"Note: {n}" for n in notices]
        return tool_result(result, "\n".join(lines))

    @agent_tool(server, title="Wait for job", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def wait_for_job(
        ctx: Context,
        job_id: JobId,
        wait_s: Annotated[float, Field(ge=0, le=50)] = 30,
    ) -> Annotated[CallToolResult, JobWait]:
        """Wait for a job (or all runs of a sweep id) to end, up to wait_s, with progress; if timed_out, call
        again."""
        if re.fullmatch(SWEEP_ID, job_id):
            waited = await wait_for_sweep(app, job_id, wait_s, ctx)
            assert waited.sweep is not None
            counts = ", ".join(f"{n} {state}" for state, n in sorted(waited.sweep.states.items()))
            text = f"sweep {job_id}: {waited.sweep.finished}/{waited.sweep.runs} runs done ({counts})"
            return tool_result(waited, ("still running after the wait; " if waited.timed_out else "") + text)
        waited = await wait_for(app, job_id, wait_s, ctx)
        assert waited.job is not None
        prefix = "still running after the wait; " if waited.timed_out else ""
        return tool_result(waited, prefix + summarize_job(waited.job))

    @agent_tool(server, title="Cancel job", read_only=False, destructive=True, idempotent=True, open_world=False)
    async def cancel_job(ctx: Context, job_id: JobId) -> Annotated[CallToolResult, JobView]:
        """Cancel a job: SIGTERM, then SIGKILL (or the cluster's cancel). A job that already ended is returned
        unchanged."""
        view = await in_thread(lambda: job_view(app.engine.cancel(job_id)))
        AuditLog(app.settings).record(
            "cancel", who=client_name(ctx), job_id=job_id, kind=view.kind, state=view.state.value
        )
        return tool_result(view, summarize_job(view))

    @agent_tool(server, title="Read job logs", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def read_job_logs(
        job_id: JobId,
        process: Annotated[
            str | None,
            Field(
                pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                description="Default main; get_job lists the others",
            ),
        ] = None,
        offset: Annotated[int, Field(ge=0)] = 0,
        limit: Annotated[int, Field(ge=1, le=1 << 20, description="Bytes; default 6 KiB (a ~16 KB result)")] = 6144,
    ) -> Annotated[CallToolResult, LogChunk]:
        """Read one of a job's logs from a byte offset; page on with next_offset until eof. Instant."""
        record = await in_thread(app.engine.get, job_id)
        chunk = await in_thread(read_log_chunk, record, process, offset, limit)
        head = f"{chunk.process} log of {job_id}, bytes {chunk.offset}-{chunk.next_offset} of {chunk.size_bytes}"
        if chunk.cut_at_bytes is not None:
            head += f" (cut at byte {chunk.cut_at_bytes}: the job's logs reached LLM_INFRA_MCP_MAX_LOG_BYTES_PER_JOB)"
        return tool_result(chunk, f"{head}{' (end)' if chunk.eof else ''}:\n{chunk.text}")

    @agent_tool(server, title="Read job metrics", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def read_job_metrics(
        job_id: JobId,
        keys: Annotated[
            list[Annotated[str, Field(max_length=128)]] | None,
            Field(max_length=64),
        ] = None,
        since_step: Annotated[
            int | None,
            Field(ge=-1, description="Pass last_step to read on"),
        ] = None,
        limit: Annotated[int, Field(ge=1, le=5000, description="Rows; default 100 (a ~16 KB result)")] = 100,
    ) -> Annotated[CallToolResult, MetricsPage]:
        """A job's metrics rows (step, time, loss, TFLOP/s...), also while it runs. Instant."""
        record = await in_thread(app.engine.get, job_id)
        page = await in_thread(read_metrics, record, keys, since_step, limit)
        summary = f"{len(page.rows)} metrics row(s) of {job_id}"
        if page.reader is not None:
            summary += f" (its {page.reader} run)" + "".join(f"; {n}" for n in page.notes[:3])
        if page.rows:
            summary += f"; last: {json.dumps(page.rows[-1])}"
        if page.truncated:
            summary += f"; more rows follow: call again with since_step={page.last_step}"
        return tool_result(page, summary)


def register_job_resources(server: MCPServer, app: App) -> None:
    """Every job is a resource: its view, and the tail of each of its logs."""

    @server.resource(
        "infra://jobs/{job_id}", name="job", mime_type="application/json", description="A job as get_job shows it"
    )
    async def job_resource(job_id: str) -> str:
        try:
            record = await in_thread(app.engine.get, job_id)
        except InputError as exc:
            raise ResourceError(str(exc)) from exc
        return shown_to_agent(job_view(record)).model_dump_json(indent=2)

    @server.resource(
        "infra://jobs/{job_id}/result",
        name="job_result",
        mime_type="application/json",
        description=f"A succeeded job's whole result (up to {RESULT_INLINE_LIMIT // 1024} KiB)",
    )
    async def job_result_resource(job_id: str) -> str:
        try:
            record = await in_thread(app.engine.get, job_id)
        except InputError as exc:
            raise ResourceError(str(exc)) from exc
        view = await in_thread(job_view, record)
        if view.state != JobState.SUCCEEDED:
            raise ResourceError(f"job {job_id} is {view.state.value}: only a SUCCEEDED job has a result")
        if view.result is None:
            why = "; ".join(w for w in view.warnings if "result" in w) or (
                f"it is larger than the {RESULT_INLINE_LIMIT // 1024} KiB this resource serves"
                if view.result_truncated
                else "the job left none"
            )
            raise ResourceError(f"job {job_id}'s result cannot be served: {why}")
        return json.dumps(view.result, indent=1)

    @server.resource(
        "infra://jobs/{job_id}/logs/{process}",
        name="job_log",
        mime_type="text/plain",
        description="The last 256 KiB of one of a job's logs",
    )
    async def job_log_resource(job_id: str, process: str) -> str:
        try:
            record = await in_thread(app.engine.get, job_id)
            size = (await in_thread(read_log_chunk, record, process, 0, 1)).size_bytes
            start = max(0, size - 256 * 1024)
            return (await in_thread(read_log_chunk, record, process, start, 256 * 1024)).text
        except InputError as exc:
            raise ResourceError(str(exc)) from exc
