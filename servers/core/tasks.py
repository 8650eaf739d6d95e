"""The job engine served through MCP's own means of following long work: the tasks extension and resource
subscriptions. Nothing here knows what a job does; it maps the engine's jobs onto the protocol.

Tasks: the extension `io.modelcontextprotocol/tasks` (SEP-2663; the wire shapes are those of the extension's own
schema, modelcontextprotocol/ext-tasks schema/draft/schema.ts, and its specification/draft/tasks.md):
- Offered only on a 2026-07-28 request whose `_meta` client capabilities name the extension (the SEP: a server MUST
  NOT return a task to a request that did not declare it, and the extension does not exist at 2025-11-25). Every
  other tools/call is answered exactly as before.
- A tool that starts a job and would answer with the job's handle (a JobView of an unfinished job, or a sweep's
  SweepSubmitted) answers with a CreateTaskResult instead: `resultType: "task"` and a Task, flat. wait_s keeps its
  meaning: work that ends within it answers directly, as the SEP allows. Which tools do that: every tool that is
  neither read-only nor destructive and answers with a job handle (see `task_handle`).
- The task id is the job id (for a sweep, its sweep id), so tasks outlive the server exactly as jobs do: a server
  started later answers tasks/get for them from the job table. A sweep's submit result (its run ids and GPU-hours)
  is kept in the state directory (tasks/<sweep id>.json) to be returned when the sweep is done.
- Status: QUEUED, STARTING, RUNNING -> working; SUCCEEDED, FAILED, LOST -> completed; CANCELLED -> cancelled. A job
  that failed is a tool-level outcome, not a JSON-RPC error: the SEP reserves `failed` for JSON-RPC errors and
  says a tool's own failure is `completed` with its result; the result is what the tool would have returned had it
  waited (the JobView, as wait_for_job shows the job), with isError true when the job FAILED or was LOST.
  statusMessage carries the state, its reason and the job's progress; `_meta["llm-infra-mcp/job"]` the same as data.
- pollIntervalMs: what the job's kind declares (JobKind.poll_s, or for a cluster job its backend's); ttlMs: null,
  since the engine keeps every job until its state directory is removed.
- tasks/get: the DetailedTask (`result` once completed). tasks/cancel: the engine's cancel (audited like
  cancel_job), then an empty ack. tasks/update: these tasks never ask for input (never input_required), so there
  is never an outstanding request: the SEP's answer is to ignore the responses and ack. An unknown task id is
  -32602; a request that did not declare the extension gets -32021 from all three.

Subscriptions: resources/subscribe and resources/unsubscribe (handshake era) and subscriptions/listen resource
subscriptions (2026-07-28) for the jobs' resources infra://jobs/{id}: a watcher polls the engine for the
subscribed, still active jobs only, and sends notifications/resources/updated when a job's state changes. It runs
while somebody is subscribed to a job that may still change, and ends when nobody is (ended and vanished jobs are
not polled). A subscription to a job that does not exist is refused (-32602); a connection holds at most
MAX_SUBSCRIPTIONS_PER_CONNECTION, the server MAX_SUBSCRIPTIONS (subscriptions and listened resources of every
connection together); a connection's subscriptions end with it.
"""

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import anyio
import anyio.abc
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.server import require_client_extension
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    EmptyResult,
    RequestParams,
    SubscribeRequestParams,
    TextContent,
    UnsubscribeRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from servers.core import sdk
from servers.core.audit import AuditLog
from servers.core.db import StateDatabaseError
from servers.core.errors import InputError, NotFoundError
from servers.core.job_tools import SWEEP_ID, summarize_job, sweep_status
from servers.core.jobfiles import atomic_write_json, read_json
from servers.core.jobs import JOB_ID_PATTERN
from servers.core.jobstore import JobRecord, JobState
from servers.core.jobview import JobView, iso, job_view, shown_to_agent
from servers.core.mcp_layer import App, client_name, in_thread

log = logging.getLogger(__name__)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
META_KEY = "llm-infra-mcp/job"  # our own _meta entry on a task: the job's state and progress as data

STATUS = {
    JobState.QUEUED: "working",
    JobState.STARTING: "working",
    JobState.RUNNING: "working",
    JobState.SUCCEEDED: "completed",
    JobState.FAILED: "completed",
    JobState.LOST: "completed",
    JobState.CANCELLED: "cancelled",
}
TOOL_ERROR_STATES = frozenset({JobState.FAILED, JobState.LOST})

# How often a client should ask: what the job's kind declares (JobKind.poll_interval; a cluster job's is its
# backend's), at least MIN_POLL_S; DEFAULT_POLL_S for a kind that declares nothing or is not registered here.
DEFAULT_POLL_S = 1.0
MIN_POLL_S = 0.5

_JOB_ID = re.compile(JOB_ID_PATTERN)
_SWEEP_ID = re.compile(SWEEP_ID)


# ---- wire shapes of the requests (ext-tasks schema/draft/schema.ts) ---------------------------------------------


class TaskRef(RequestParams):
    """params of tasks/get and tasks/cancel: {taskId}."""

    task_id: str = Field(max_length=256)


class TaskUpdate(TaskRef):
    """params of tasks/update: {taskId, inputResponses}."""

    input_responses: dict[str, Any] = Field(default_factory=dict)


# ---- tasks as the engine knows them --------------------------------------------------------------------------------


def task_handle(structured: Any) -> tuple[str, str] | None:
    """("job", job id) when a tool's structured result is the handle of an unfinished job (a JobView), ("sweep",
    sweep id) when it is a sweep's SweepSubmitted; else None (a finished job's result, anything else)."""
    if not isinstance(structured, dict):
        return None
    job_id = structured.get("job_id")
    if (
        isinstance(job_id, str)
        and structured.get("resource_uri") == f"infra://jobs/{job_id}"
        and structured.get("finished") is False
    ):
        return ("job", job_id)
    sweep_id = structured.get("sweep_id")
    if isinstance(sweep_id, str) and _SWEEP_ID.fullmatch(sweep_id) and isinstance(structured.get("job_ids"), list):
        return ("sweep", sweep_id)
    return None


def poll_interval_ms(app: App, record: JobRecord) -> int:
    kind = app.job_kinds.get(record.kind)
    poll_s = kind.poll_interval(record.spec) if kind is not None else None
    return round(max(MIN_POLL_S, poll_s if poll_s is not None else DEFAULT_POLL_S) * 1000)


def _timestamp(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _updated_at(record: JobRecord, view: JobView) -> float:
    times = [record.created_at, record.started_at, record.ended_at]
    if view.progress is not None:
        times.append(_timestamp(view.progress.updated_at))
    return max(t for t in times if t is not None)


def _progress_text(view: JobView) -> str:
    progress = view.progress
    if progress is None or view.finished:
        return ""
    total = f"/{progress.total:g}" if progress.total is not None else ""
    return f"; progress {progress.done:g}{total}" + (f": {progress.message}" if progress.message else "")


def job_tool_result(view: JobView) -> dict[str, Any]:
    """What a job-starting tool would have returned had it waited for the job: the job's view as structured content,
    the summary get_job gives as text; isError when the job FAILED or was LOST."""
    view = shown_to_agent(view)
    text = summarize_job(view) + "".join(f" Warning: {w}." for w in view.warnings)
    result = CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=view.model_dump(mode="json"),
        is_error=view.state in TOOL_ERROR_STATES,
    )
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def job_task(app: App, record: JobRecord) -> dict[str, Any]:
    """The DetailedTask of a job: the Task fields, and `result` once it completed."""
    view = job_view(record)
    status = STATUS[record.state]
    message = f"{record.state.value}" + (f": {view.reason}" if view.reason else "") + _progress_text(view)
    task: dict[str, Any] = {
        "taskId": record.id,
        "status": status,
        "statusMessage": message[:2000],
        "createdAt": iso(record.created_at),
        "lastUpdatedAt": iso(_updated_at(record, view)),
        "ttlMs": None,
        "pollIntervalMs": poll_interval_ms(app, record),
        "_meta": {
            META_KEY: {
                "jobId": record.id,
                "kind": record.kind,
                "state": record.state.value,
                "progress": view.progress.model_dump(mode="json") if view.progress else None,
                "resourceUri": view.resource_uri,
            }
        },
    }
    if status == "completed":
        task["result"] = job_tool_result(view)
    return task


class SweepRecords:
    """A sweep task's submit result, kept so that the finished task returns what submit_sweep returned."""

    def __init__(self, app: App) -> None:
        self.folder = app.settings.home / "tasks"

    def put(self, sweep_id: str, submitted: dict[str, Any]) -> None:
        atomic_write_json(self.folder / f"{sweep_id}.json", submitted)

    def get(self, sweep_id: str) -> dict[str, Any] | None:
        data = read_json(self.folder / f"{sweep_id}.json", 1 << 20)
        return data if isinstance(data, dict) and data.get("sweep_id") == sweep_id else None


def sweep_task(app: App, sweep_id: str, submitted: dict[str, Any]) -> dict[str, Any]:
    """The DetailedTask of a sweep: working while a run is active; cancelled when every run was; else completed,
    with submit_sweep's result and each run's end as text."""
    status = sweep_status(app, sweep_id)
    records = [app.engine.get(run.job_id) for run in status.jobs]
    counts = ", ".join(f"{n} {state}" for state, n in sorted(status.states.items()))
    active = status.finished < status.runs
    if active:
        state = "working"
    elif all(r.state == JobState.CANCELLED for r in records):
        state = "cancelled"
    else:
        state = "completed"
    views = [job_view(r) for r in records]
    task: dict[str, Any] = {
        "taskId": sweep_id,
        "status": state,
        "statusMessage": f"sweep {sweep_id}: {status.finished}/{status.runs} runs done ({counts})",
        "createdAt": iso(min(r.created_at for r in records)),
        "lastUpdatedAt": iso(max(_updated_at(r, v) for r, v in zip(records, views, strict=True))),
        "ttlMs": None,
        "pollIntervalMs": max(poll_interval_ms(app, r) for r in records),
        "_meta": {META_KEY: {"sweepId": sweep_id, "states": status.states, "jobIds": [r.id for r in records]}},
    }
    if state == "completed":
        lines = [task["statusMessage"]]
        lines += [f"- run {run.index}: {summarize_job(v)}" for run, v in zip(status.jobs, views, strict=True)]
        failed = any(r.state in TOOL_ERROR_STATES for r in records)
        task["result"] = CallToolResult(
            content=[TextContent(type="text", text="\n".join(lines))], structured_content=submitted, is_error=failed
        ).model_dump(by_alias=True, mode="json", exclude_none=True)
    return task


def detailed_task(app: App, task_id: str) -> dict[str, Any]:
    """The DetailedTask for a task id (a job id or a sweep id). NotFoundError when there is no such task."""
    if _SWEEP_ID.fullmatch(task_id):
        submitted = SweepRecords(app).get(task_id)
        if submitted is None:
            raise NotFoundError(f"no task {task_id!r}: no sweep was submitted as a task under this id")
        return sweep_task(app, task_id, submitted)
    if not _JOB_ID.fullmatch(task_id):
        raise NotFoundError(f"no task {task_id!r}: task ids are the job ids the tools return")
    return job_task(app, app.engine.get(task_id))


def _task_error(exc: Exception) -> MCPError:
    if isinstance(exc, StateDatabaseError):
        return MCPError(code=INTERNAL_ERROR, message=f"Failed to retrieve task: {exc}")
    return MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: {exc}")


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request may be answered with a task: a 2026-07-28 request naming the extension."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS_EXTENSION in capabilities.extensions)


class TasksExtension(Extension):
    """`io.modelcontextprotocol/tasks` over the job engine (see the module's docstring)."""

    identifier = TASKS_EXTENSION

    def __init__(self, app: App) -> None:
        self.app = app
        self._tool_annotations: Callable[[str], Any] = lambda _name: None

    def bind(self, server: Any) -> None:
        """Let the extension read the tools' annotations (the server is made after its extensions)."""

        def annotations(name: str) -> Any:
            return getattr(sdk.get_tool(server, name), "annotations", None)

        self._tool_annotations = annotations

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskRef, self._get, protocol_versions=modern),
            MethodBinding("tasks/update", TaskUpdate, self._update, protocol_versions=modern),
            MethodBinding("tasks/cancel", TaskRef, self._cancel, protocol_versions=modern),
        ]

    def _starts_work(self, tool_name: str) -> bool:
        hints = self._tool_annotations(tool_name)
        return hints is not None and hints.read_only_hint is False and hints.destructive_hint is False

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        result = await call_next(ctx)
        if not declared(ctx) or not isinstance(result, CallToolResult) or result.is_error:
            return result
        handle = task_handle(result.structured_content)
        if handle is None or not self._starts_work(params.name):
            return result
        try:
            task = await in_thread(self._create, handle, result.structured_content)
        except Exception:  # the job runs and its handle is still an answer: never lose it to a task that failed
            log.exception("making a task of %s %s failed; answering with the job handle", *handle)
            return result
        task.pop("result", None)  # CreateTaskResult is Result & Task: the result comes through tasks/get
        return {"resultType": "task", **task}

    def _create(self, handle: tuple[str, str], structured: dict[str, Any]) -> dict[str, Any]:
        what, task_id = handle
        if what == "sweep":
            SweepRecords(self.app).put(task_id, structured)  # durable before the task is announced
        return detailed_task(self.app, task_id)

    async def _lookup(self, task_id: str) -> dict[str, Any]:
        try:
            return await in_thread(detailed_task, self.app, task_id)
        except InputError as exc:  # NotFoundError; StateDatabaseError (internal)
            raise _task_error(exc) from None

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        require_client_extension(ctx, TASKS_EXTENSION)
        return {"resultType": "complete", **(await self._lookup(params.task_id))}

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: TaskUpdate) -> dict[str, Any]:
        require_client_extension(ctx, TASKS_EXTENSION)
        await self._lookup(params.task_id)  # unknown ids are an error; a job never waits for input, so the
        return {"resultType": "complete"}  # responses answer no outstanding request and are ignored (SEP-2663)

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        require_client_extension(ctx, TASKS_EXTENSION)
        task = await self._lookup(params.task_id)
        job_ids = task["_meta"][META_KEY].get("jobIds") or [params.task_id]
        who = client_name(ctx)

        def cancel() -> None:
            for job_id in job_ids:
                record = self.app.engine.get(job_id)
                if record.state.terminal:
                    continue
                record = self.app.engine.cancel(job_id)
                AuditLog(self.app.settings).record(
                    "cancel", who=who, job_id=job_id, kind=record.kind, state=record.state.value, via="tasks/cancel"
                )

        try:
            await in_thread(cancel)
        except InputError as exc:  # another server's job, or the state database
            raise _task_error(exc) from None
        return {"resultType": "complete"}


# ---- resource subscriptions ------------------------------------------------------------------------------------


JOB_URI = re.compile(rf"^infra://jobs/(?P<job_id>{JOB_ID_PATTERN.removeprefix('^').removesuffix('$')})$")
MAX_SUBSCRIPTIONS_PER_CONNECTION = 256  # resources/subscribe of one connection; resources one listen request names
MAX_SUBSCRIPTIONS = 4096  # all connections and listen streams together


class _Gone:
    """The state of a subscribed job that no longer exists (its folder and row were removed): it never changes."""

    terminal = True

    def __repr__(self) -> str:
        return "GONE"


GONE = _Gone()
WatchedState = JobState | _Gone | None  # None: not read yet (or the state database could not be read)


class JobWatcher:
    """Sends notifications/resources/updated for infra://jobs/{id} when the job's state changes, to the clients
    that subscribed: resources/subscribe (handshake era: to that connection) and subscriptions/listen naming the
    resource (2026-07-28: through the server's subscription bus, which routes it to those streams).

    One task polls the engine (one thread hop per round, the subscribed jobs only, ended and vanished jobs no
    more) every `interval_s`; it starts with the first subscription to a job that may still change and ends when
    there is none (`watching`). It runs in the task group of the server's lifespan (`running`)."""

    def __init__(self, app: App, bus: InMemorySubscriptionBus, interval_s: float = 0.5) -> None:
        self.app = app
        self.bus = bus
        self.interval_s = interval_s
        # uri -> {connection key: (connection, session)} for resources/subscribe
        self._subscribed: dict[str, dict[int, tuple[Any, Any]]] = {}
        self._listening: dict[str, int] = {}  # uri -> open subscriptions/listen streams naming it
        self._states: dict[str, WatchedState] = {}
        self._cleanups: set[int] = set()
        self._group: anyio.abc.TaskGroup | None = None
        self._running = False

    # -- lifetime
    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield
            finally:
                self._group = None
                group.cancel_scope.cancel()

    @property
    def watching(self) -> bool:
        return self._running

    def uris(self) -> set[str]:
        return set(self._subscribed) | {uri for uri, n in self._listening.items() if n > 0}

    def held(self) -> int:
        """Subscriptions held now: each connection's resources/subscribe, each listen stream's job resources."""
        return sum(len(subs) for subs in self._subscribed.values()) + sum(self._listening.values())

    def _ensure_running(self) -> None:
        if self._running:
            return
        if self._group is None:
            log.warning("resource subscriptions: the server's lifespan did not start the watcher; no updates sent")
            return
        self._running = True
        self._group.start_soon(self._run)

    async def _run(self) -> None:
        try:
            while uris := self._watched():
                try:
                    states = await in_thread(self._read_states, uris)
                except Exception:  # the watcher never takes the server down; it tries again next round
                    log.exception("reading the subscribed jobs failed")
                    states = {}
                for uri, state in states.items():
                    if uri in self._states and self._states[uri] != state:
                        self._states[uri] = state
                        try:
                            await self._notify(uri)
                        except Exception:
                            log.exception("notifying the subscribers of %s failed", uri)
                await anyio.sleep(self.interval_s)
        finally:
            self._running = False

    def _watched(self) -> list[str]:
        """Subscribed job resources whose job may still change (active, or not read yet)."""
        out = []
        for uri in sorted(self.uris()):
            state = self._states.get(uri)
            if JOB_URI.match(uri) and (state is None or not state.terminal):
                out.append(uri)
        return out

    def _read_states(self, uris: list[str]) -> dict[str, WatchedState]:
        return {uri: self._state_of(uri) for uri in uris}

    def _state_of(self, uri: str) -> WatchedState:
        match = JOB_URI.match(uri)
        if match is None:
            return None
        try:
            return self.app.engine.get(match["job_id"]).state
        except NotFoundError:
            return GONE

    async def _existing(self, uris: list[str]) -> dict[str, WatchedState]:
        """The state of each job resource among `uris`; MCPError -32602 naming those whose job does not exist
        (nothing would ever be sent for them), -32603 when the job table cannot be read now."""
        jobs = [u for u in uris if JOB_URI.match(u)]
        if not jobs:
            return {}
        try:
            states = await in_thread(self._read_states, jobs)
        except Exception as exc:  # the state database
            log.exception("reading the jobs of a subscription failed")
            raise MCPError(
                code=INTERNAL_ERROR, message=f"the job table cannot be read now ({exc}); try again"
            ) from None
        unknown = [u.removeprefix("infra://jobs/") for u in jobs if states.get(u) is GONE]
        if unknown:
            shown = ", ".join(repr(j) for j in unknown[:5]) + (
                f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            )
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"uri: no job {shown} here; subscribe to the resource_uri of a job a tool returned "
                "(list_jobs shows them)",
            )
        return states

    def _check_room(self, adding: int) -> None:
        held = self.held()
        if held + adding > MAX_SUBSCRIPTIONS:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"uri: the server holds {held} subscriptions, the most it allows is {MAX_SUBSCRIPTIONS}; "
                "unsubscribe from ended jobs, or try again later",
            )

    def _baseline(self, states: dict[str, WatchedState]) -> None:
        for uri, state in states.items():
            self._states.setdefault(uri, state)
        self._ensure_running()

    def _forget(self, uris: list[str]) -> None:
        live = self.uris()
        for uri in uris:
            if uri not in live:
                self._states.pop(uri, None)

    async def _notify(self, uri: str) -> None:
        for key, (_, session) in list(self._subscribed.get(uri, {}).items()):
            try:
                await session.send_resource_updated(uri)
            except Exception:  # that client is gone: its subscriptions go with it
                log.info("dropping the subscriptions of a connection that cannot be reached")
                self._drop_connection(key)
        if self._listening.get(uri):
            await self.bus.publish(ResourceUpdated(uri=uri))

    # -- resources/subscribe, resources/unsubscribe (handshake era)
    async def subscribe(self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams) -> EmptyResult:
        uri = str(params.uri)
        connection = sdk.connection_of(ctx.session)
        key = id(connection)
        states = await self._existing([uri])  # checked first: nothing below awaits, so the counts hold
        if key not in self._subscribed.get(uri, {}):
            mine = sum(1 for subs in self._subscribed.values() if key in subs)
            if mine >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
                raise MCPError(
                    code=INVALID_PARAMS,
                    message=f"uri: this connection holds {mine} subscriptions, the most allowed; unsubscribe some "
                    "first",
                )
            self._check_room(1)
        self._subscribed.setdefault(uri, {})[key] = (connection, ctx.session)
        if key not in self._cleanups and hasattr(connection, "exit_stack"):
            self._cleanups.add(key)
            connection.exit_stack.callback(self._drop_connection, key)  # the client went away without unsubscribing
        self._baseline(states)
        return EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams) -> EmptyResult:
        uri = str(params.uri)
        key = id(sdk.connection_of(ctx.session))
        subs = self._subscribed.get(uri)
        if subs is not None:
            subs.pop(key, None)
            if not subs:
                del self._subscribed[uri]
        self._forget([uri])
        return EmptyResult()

    def _drop_connection(self, key: int) -> None:
        self._cleanups.discard(key)
        dropped = []
        for uri in list(self._subscribed):
            if self._subscribed[uri].pop(key, None) is not None:
                dropped.append(uri)
            if not self._subscribed[uri]:
                del self._subscribed[uri]
        self._forget(dropped)

    # -- subscriptions/listen (2026-07-28): the SDK serves the stream; this only notes which jobs it names
    async def listen_middleware(
        self, ctx: ServerRequestContext[Any, Any], call_next: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        if ctx.method != "subscriptions/listen" or ctx.request_id is None:
            return await call_next(ctx)
        named = _listen_names(ctx.params)
        if len(named) > MAX_SUBSCRIPTIONS_PER_CONNECTION:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"notifications.resourceSubscriptions: {len(named)} resources; a listen request may name "
                f"{MAX_SUBSCRIPTIONS_PER_CONNECTION} at most",
            )
        uris = sorted({u for u in named if JOB_URI.match(u)})
        if not uris:
            return await call_next(ctx)
        states = await self._existing(uris)
        self._check_room(len(uris))  # nothing awaits between this check and the count below
        for uri in uris:
            self._listening[uri] = self._listening.get(uri, 0) + 1
        try:
            self._baseline(states)
            return await call_next(ctx)
        finally:
            for uri in uris:
                left = self._listening.get(uri, 0) - 1
                if left > 0:
                    self._listening[uri] = left
                else:
                    self._listening.pop(uri, None)
            self._forget(uris)


def _listen_names(params: Any) -> list[str]:
    """The resources a subscriptions/listen request names (its notifications.resourceSubscriptions)."""
    notifications = params.get("notifications") if isinstance(params, dict) else None
    wanted = notifications.get("resourceSubscriptions") if isinstance(notifications, dict) else None
    if not isinstance(wanted, list):
        return []
    return [u for u in wanted if isinstance(u, str)]


# ---- what new_server installs ----------------------------------------------------------------------------------


class JobFeatures:
    """The tasks extension and the job resource subscriptions of one server that runs jobs."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.bus = InMemorySubscriptionBus()
        self.extension = TasksExtension(app)
        self.watcher = JobWatcher(app, self.bus)

    def install(self, server: Any) -> None:
        """After the server is made: the extension's tool lookup, resources/subscribe and /unsubscribe (the SDK's
        MCPServer serves neither; registering them makes initialize declare resources.subscribe), and the listen
        observer."""
        self.extension.bind(server)
        lowlevel = sdk.lowlevel_server(server)
        if lowlevel is None:
            raise RuntimeError(
                "this mcp SDK has no low-level server to serve resources/subscribe on (servers/core/sdk.py)"
            )
        lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, self.watcher.subscribe)
        lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, self.watcher.unsubscribe)
        server.middleware.append(self.watcher.listen_middleware)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.watcher.running():
            yield
