"""The MCP side of the conventions every tool follows, in one place so that no server re-invents them.

- `App`: one server's settings and job engine (the engine is created on first use).
- `agent_tool`: registers a tool with annotations stated explicitly, and turns domain errors into readable
  is_error results (what was wrong, what is accepted) instead of opaque crashes.
- `tool_result`: structured content plus a short text summary.
- `register_job_tools`: get_job, list_jobs, wait_for_job, cancel_job, read_job_logs, read_job_metrics.
- `run_job`: start long work as a job and wait up to wait_s for its result.
"""

import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import CallToolResult, ContentBlock, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from servers import __version__
from servers.core.audit import AuditLog
from servers.core.errors import InputError
from servers.core.jobs import JOB_ID_PATTERN, JobEngine, JobKind
from servers.core.jobstore import JobState
from servers.core.jobview import JobView, LogChunk, MetricsPage, job_view, read_log_chunk, read_metrics
from servers.core.settings import Settings

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class App:
    """What one running server holds: its settings and, if it starts jobs, its job engine."""

    def __init__(
        self, settings: Settings | None = None, *, owner: str = "llm-infra-mcp", child_env: dict[str, str] | None = None
    ) -> None:
        self.settings = settings or Settings()
        self.owner = owner
        self.job_kinds: dict[str, JobKind] = {}
        self._child_env = child_env
        self._engine: JobEngine | None = None

    def add_job_kind(self, kind: JobKind) -> None:
        self.job_kinds[kind.name] = kind
        if self._engine is not None:
            self._engine.register_kind(kind)

    @property
    def engine(self) -> JobEngine:
        if self._engine is None:
            engine = JobEngine(self.settings, owner=self.owner, child_env=self._child_env)
            for kind in self.job_kinds.values():
                engine.register_kind(kind)
            self._engine = engine
        return self._engine

    def reconcile(self) -> None:
        """Bring every job left by earlier servers up to date: still running, or ended, or LOST."""
        if self.job_kinds:
            active = self.engine.reconcile_all()
            if active:
                log.info("tracking %d job(s) still active: %s", len(active), ", ".join(r.id for r in active))


def new_server(name: str, instructions: str, app: App) -> MCPServer:
    """An MCPServer that reconciles the job table when it starts."""

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        await anyio.to_thread.run_sync(app.reconcile)
        yield {}

    return MCPServer(f"llm-infra-{name}", version=__version__, instructions=instructions, lifespan=lifespan)


def tool_result(model: BaseModel, summary: str, *extra: ContentBlock) -> CallToolResult:
    """A tool's answer: the model as structured content, and a short summary for a person or a model to read."""
    return CallToolResult(
        content=[TextContent(type="text", text=summary), *extra],
        structured_content=model.model_dump(mode="json"),
    )


def _readable_errors(fn: F) -> F:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except (ToolError, ResourceError):
            raise
        except (InputError, ValidationError) as exc:
            raise ToolError(str(exc)) from exc
        except Exception as exc:
            # A bug on our side: say so plainly, keep the traceback in the server's log, keep serving.
            log.exception("tool %s failed", fn.__name__)
            raise ToolError(f"internal error ({type(exc).__name__}: {exc}); the server keeps running") from exc

    return wrapper  # type: ignore[return-value]


def agent_tool(
    server: MCPServer,
    *,
    title: str,
    read_only: bool,
    destructive: bool,
    idempotent: bool,
    open_world: bool,
) -> Callable[[F], F]:
    """Register an async tool. Every hint is a required argument, so none is left to a default by accident."""

    def decorator(fn: F) -> F:
        if not fn.__doc__ or len(fn.__doc__.strip()) < 80:
            raise ValueError(f"tool {fn.__name__} needs a docstring written for an agent (what, when, cost, returns)")
        server.add_tool(
            _readable_errors(fn),
            title=title,
            annotations=ToolAnnotations(
                title=title,
                read_only_hint=read_only,
                destructive_hint=destructive,
                idempotent_hint=idempotent,
                open_world_hint=open_world,
            ),
        )
        return fn

    return decorator


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run blocking work (SQLite, /proc, files) off the event loop."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


# ---- jobs ----------------------------------------------------------------------------------------------

JobId = Annotated[
    str,
    Field(
        pattern=JOB_ID_PATTERN,
        max_length=96,
        description="A job id as returned by the tool that started the job or by list_jobs",
    ),
]
WaitS = Annotated[
    float,
    Field(
        ge=0,
        le=50,
        description="Seconds to wait for the result before returning the job handle instead "
        "(0: return at once). Clients cut tool calls at about a minute, so at most 50.",
    ),
]


class JobList(BaseModel):
    jobs: list[JobView]
    total: int = Field(description="Jobs matching the filter, all pages together")
    next_offset: int | None = Field(description="Offset of the next page, or null on the last page")


class JobWait(BaseModel):
    job: JobView
    waited_s: float
    timed_out: bool = Field(description="True if the job was still running when the wait ended")


def summarize_job(view: JobView) -> str:
    text = f"job {view.job_id} ({view.kind}): {view.state.value}"
    if view.elapsed_s is not None:
        text += f" after {view.elapsed_s:.1f} s"
    if view.reason:
        text += f"; {view.reason}"
    if view.progress and view.progress.message and not view.finished:
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
        await anyio.sleep(min(0.25, max(0.0, timeout_s - waited)))
        record = await in_thread(app.engine.get, job_id)
    waited = round(time.monotonic() - start, 3)
    return JobWait(job=job_view(record), waited_s=waited, timed_out=not record.state.terminal)


async def run_job(
    app: App, kind: str, spec: dict[str, Any], *, wait_s: float, ctx: Context | None, timeout_s: float | None = None
) -> JobView:
    """Start long work as a job; return its view with the result if it ends within wait_s, else the handle."""
    record = await in_thread(app.engine.submit, kind, spec, timeout_s=timeout_s)
    if wait_s <= 0:
        return job_view(record)
    return (await wait_for(app, record.id, wait_s, ctx)).job


def client_name(ctx: Context) -> str:
    """The client's name and version as it introduced itself (legacy handshake), for the audit log."""
    try:
        info = ctx.session.client_params.client_info  # type: ignore[union-attr]
        return f"{info.name} {info.version}"
    except Exception:
        return "unknown client"


def register_job_tools(server: MCPServer, app: App) -> None:
    """The shared job tools. A server that starts jobs registers them once (the suite once for all)."""

    @agent_tool(server, title="Get job", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def get_job(job_id: JobId) -> Annotated[CallToolResult, JobView]:
        """Show one job: its state (QUEUED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED, LOST), times, exit
        code and reason, its spec, its result once it succeeded, its latest progress, and which logs it has.
        Cheap; use it to check on a job started earlier, also by an earlier server run."""
        view = job_view(await in_thread(app.engine.get, job_id))
        return tool_result(view, summarize_job(view))

    @agent_tool(server, title="List jobs", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def list_jobs(
        kind: Annotated[
            str | None, Field(max_length=64, description="Only jobs of this kind, e.g. 'gemm_benchmark'")
        ] = None,
        state: Annotated[JobState | None, Field(description="Only jobs in this state")] = None,
        limit: Annotated[int, Field(ge=1, le=200, description="Jobs per page")] = 20,
        offset: Annotated[int, Field(ge=0, le=1_000_000, description="Jobs to skip (newest first)")] = 0,
    ) -> Annotated[CallToolResult, JobList]:
        """List jobs, newest first, optionally only one kind or state; pages with limit and offset. Cheap. Each
        entry is the same view get_job gives. Use it to find a job id or see what is running."""
        page = await in_thread(app.engine.list_jobs, kind=kind, state=state, limit=limit, offset=offset)
        views = [job_view(r) for r in page.jobs]
        next_offset = offset + len(views) if offset + len(views) < page.total else None
        result = JobList(jobs=views, total=page.total, next_offset=next_offset)
        lines = [f"{page.total} job(s) match; showing {len(views)} from offset {offset}"]
        lines += [f"- {v.job_id}: {v.state.value}" + (f" ({v.reason})" if v.reason else "") for v in views]
        return tool_result(result, "\n".join(lines))

    @agent_tool(server, title="Wait for job", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def wait_for_job(
        ctx: Context,
        job_id: JobId,
        timeout_s: Annotated[
            float,
            Field(
                ge=0,
                le=50,
                description="Longest wait in seconds (at most 50, since clients cut tool calls at about a minute)",
            ),
        ] = 30,
    ) -> Annotated[CallToolResult, JobWait]:
        """Wait until a job ends or timeout_s passes, sending progress notifications meanwhile; then return the
        job as get_job shows it, with timed_out telling which happened. Call it again to keep waiting. Costs
        nothing but the wait."""
        waited = await wait_for(app, job_id, timeout_s, ctx)
        prefix = "still running after the wait; " if waited.timed_out else ""
        return tool_result(waited, prefix + summarize_job(waited.job))

    @agent_tool(server, title="Cancel job", read_only=False, destructive=True, idempotent=True, open_world=False)
    async def cancel_job(ctx: Context, job_id: JobId) -> Annotated[CallToolResult, JobView]:
        """Cancel a job: its whole process group gets SIGTERM, then SIGKILL after the grace period
        (LLM_INFRA_MCP_CANCEL_GRACE_S). Idempotent: a job that already ended is returned unchanged. Takes up to
        the grace period. Logs, metrics and partial results stay readable."""
        view = job_view(await in_thread(app.engine.cancel, job_id))
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
                description="Which "
                "log: 'main' (default: the work's stdout and stderr), 'supervisor', or a rank name that "
                "get_job lists",
            ),
        ] = None,
        offset: Annotated[int, Field(ge=0, description="Byte offset to start at; pass next_offset to go on")] = 0,
        limit_bytes: Annotated[int, Field(ge=1, le=1 << 20, description="Most bytes to return")] = 65536,
    ) -> Annotated[CallToolResult, LogChunk]:
        """Read a chunk of one of a job's logs by byte offset: returns the text, next_offset to continue from,
        eof, and whether the job has finished (so the log will not grow). Cheap; page through long logs."""
        record = await in_thread(app.engine.get, job_id)
        chunk = await in_thread(read_log_chunk, record, process, offset, limit_bytes)
        head = f"{chunk.process} log of {job_id}, bytes {chunk.offset}-{chunk.next_offset} of {chunk.size_bytes}"
        return tool_result(chunk, f"{head}{' (end)' if chunk.eof else ''}:\n{chunk.text}")

    @agent_tool(server, title="Read job metrics", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def read_job_metrics(
        job_id: JobId,
        keys: Annotated[
            list[Annotated[str, Field(max_length=128)]] | None,
            Field(max_length=64, description="Only these metrics (step and time always come)"),
        ] = None,
        since_step: Annotated[
            int | None,
            Field(
                ge=-1, description="Only rows with a step above this; pass last_step of the previous call to read on"
            ),
        ] = None,
        limit: Annotated[int, Field(ge=1, le=5000, description="Most rows to return")] = 500,
    ) -> Annotated[CallToolResult, MetricsPage]:
        """Read a job's metrics rows (one dict per logged step: step, time and values such as loss or TFLOP/s),
        optionally only some keys and only steps after since_step. Cheap. Also works while the job runs."""
        record = await in_thread(app.engine.get, job_id)
        page = await in_thread(read_metrics, record, keys, since_step, limit)
        summary = f"{len(page.rows)} metrics row(s) of {job_id}"
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
        return job_view(record).model_dump_json(indent=2)

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
