"""The MCP side of the conventions every tool follows, in one place so that no server re-invents them.

- `App`: one server's settings and job engine (the engine is created on first use); `new_server` makes the server.
- `agent_tool`: registers a tool with annotations stated explicitly and strict arguments (servers.core.arguments),
  and turns domain errors into readable is_error results (what was wrong, what is accepted) instead of opaque
  crashes.
- `tool_result`: structured content plus a short text summary.
- The job tools and the helpers that run jobs are in servers.core.job_tools; what the SDK does not expose publicly
  is reached through servers.core.sdk only.
"""

import functools
import json
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.mcpserver.tools.base import Tool
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, ValidationError

from servers import __version__
from servers.core import sdk, toolcache
from servers.core.arguments import StrictArguments, closed_schema, refer
from servers.core.db import StateDatabaseError
from servers.core.errors import InputError, validation_problems
from servers.core.jobs import JobEngine, JobKind
from servers.core.jobview import JobView, shown_to_agent
from servers.core.schemas import description_text, published_input, published_output
from servers.core.settings import Settings

if TYPE_CHECKING:
    from servers.core.tasks import JobFeatures

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class App:
    """What one running server holds: its settings and, if it starts jobs, its job engine.

    The engine is made on first use. If the state database cannot be used (a newer schema, a file it cannot
    open), making it raises StateDatabaseError saying what is wrong and what to do; every job tool answers with
    that, the server keeps serving the rest, and the next call tries again."""

    def __init__(
        self, settings: Settings | None = None, *, owner: str = "llm-infra-mcp", child_env: dict[str, str] | None = None
    ) -> None:
        self.settings = settings or Settings()
        self.owner = owner
        self.job_kinds: dict[str, JobKind] = {}
        self._child_env = child_env
        self._engine: JobEngine | None = None
        self._engine_lock = threading.Lock()

    def add_job_kind(self, kind: JobKind) -> None:
        self.job_kinds[kind.name] = kind
        if self._engine is not None:
            self._engine.register_kind(kind)

    @property
    def engine(self) -> JobEngine:
        if self._engine is not None:
            return self._engine
        with self._engine_lock:
            if self._engine is None:
                try:
                    engine = JobEngine(self.settings, owner=self.owner, child_env=self._child_env)
                except StateDatabaseError:
                    raise
                except (sqlite3.Error, OSError) as exc:
                    raise StateDatabaseError(
                        f"the job engine cannot use the state directory {self.settings.home} "
                        f"({type(exc).__name__}: {exc}); check its permissions and free disk space, or set "
                        "LLM_INFRA_MCP_HOME to another folder"
                    ) from exc
                for kind in self.job_kinds.values():
                    engine.register_kind(kind)
                self._engine = engine
            return self._engine

    def reconcile(self) -> None:
        """Bring every job left by earlier servers up to date: still running, or ended, or LOST. Never raises:
        a state database that cannot be used leaves the job tools answering why, and the rest serving."""
        if not self.job_kinds:
            return
        try:
            active = self.engine.reconcile_all()
        except StateDatabaseError as exc:
            log.error("job tools unavailable: %s", exc)
            return
        except Exception:
            log.exception("reconciling the jobs failed; the server serves on")
            return
        if active:
            log.info("tracking %d job(s) still active: %s", len(active), ", ".join(r.id for r in active))


class _Server(MCPServer):
    """The SDK's MCPServer, but prompts/get with an unknown prompt or wrong arguments answers -32602 (invalid
    params) with the reason, as the spec asks, in both protocol eras (the SDK turns both into a bare ValueError,
    which one era reports as code 0 and the other as an internal error)."""

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None, context: Any = None) -> Any:
        prompt = sdk.get_prompt(self, name)
        if prompt is None:
            known = ", ".join(sdk.prompt_names(self))
            raise MCPError(code=INVALID_PARAMS, message=f"unknown prompt {name!r}; prompts: {known}")
        declared = {a.name: a for a in prompt.arguments or []}
        given = set(arguments or {})
        problems = [f"{key}: unknown argument" for key in sorted(given - set(declared))]
        problems += [
            f"{key}: required argument missing" for key, a in declared.items() if a.required and key not in given
        ]
        if problems:
            accepted = ", ".join(declared) or "no arguments"
            raise MCPError(code=INVALID_PARAMS, message=f"{'; '.join(problems)}; accepted: {accepted}")
        return await super().get_prompt(name, arguments, context)


def new_server(name: str, instructions: str, app: App, *, features: "JobFeatures | None" = None) -> MCPServer:
    """An MCPServer that reconciles the job table when it starts. One given `features` (a server that serves jobs:
    servers.core.tasks.JobFeatures, made by assemble.build_server) also offers the MCP tasks extension and
    subscriptions to its jobs' resources: a client that declares neither sees no difference."""

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        try:
            await anyio.to_thread.run_sync(app.reconcile)
        except Exception:  # never let the job table keep the server (and its tools that need no jobs) down
            log.exception("reconciling the jobs at start failed; the server serves on")
        if features is None:
            yield {}
            return
        async with features.running():
            yield {}

    server = _Server(
        f"llm-infra-{name}",
        version=__version__,
        instructions=instructions,
        lifespan=lifespan,
        extensions=[features.extension] if features else None,
        subscriptions=features.bus if features else None,
    )
    if features is not None:
        features.install(server)
    return server


def png_content(png: bytes) -> ImageContent:
    """A PNG as MCP image content (base64)."""
    import base64

    return ImageContent(type="image", data=base64.b64encode(png).decode(), mime_type="image/png")


def tool_result(model: BaseModel, summary: str, *extra: ContentBlock) -> CallToolResult:
    """A tool's answer: the model as structured content, and a short summary for a person or a model to read.
    A job's view in it (a JobView, a JobWait's job, a JobList's details) carries a large result only in part
    (shown_to_agent): every tool that answers with a job stays small the same way."""
    return CallToolResult(
        content=[TextContent(type="text", text=summary), *extra],
        structured_content=_jobs_shown(model).model_dump(mode="json"),
    )


def _jobs_shown(model: BaseModel) -> BaseModel:
    """`model` with each job view in it shown_to_agent: the model itself, or a field of it (a view or a list of
    views, as job_tools' JobWait.job and JobList.details)."""
    if isinstance(model, JobView):
        return shown_to_agent(model)
    update: dict[str, Any] = {}
    for field in type(model).model_fields:
        value = getattr(model, field)
        if isinstance(value, JobView):
            update[field] = shown_to_agent(value)
        elif isinstance(value, list) and value and all(isinstance(v, JobView) for v in value):
            update[field] = [shown_to_agent(v) for v in value]
    return model.model_copy(update=update) if update else model


def register_tool(
    server: MCPServer,
    fn: Callable[..., Awaitable[Any]],
    *,
    title: str,
    annotations: ToolAnnotations,
    same_as: dict[str, str] | None = None,
) -> Tool:
    """Register `fn` as a tool with StrictArguments and the published (small) schemas of servers.core.schemas.

    With a schema cache for this server (servers.core.toolcache, set up by build_server) a tool seen before is
    registered from it without generating any schema; its models are built on its first call."""
    name = fn.__name__
    cache = toolcache.for_server(server)
    entry = cache.get(name) if cache is not None else None
    if entry is None:
        sdk_tool = Tool.from_function(fn, name=name, title=title, annotations=annotations)
        meta = sdk_tool.fn_metadata
        enforced = closed_schema(sdk_tool.parameters)
        published_in = published_input(enforced)
        if same_as:
            published_in = refer(published_in, same_as)
        entry = {
            "description": description_text(sdk_tool.description),
            "input": published_in,
            "output": published_output(meta.output_schema) if meta.output_schema is not None else None,
            "context": sdk_tool.context_kwarg,
            "title": title,
            "annotations": annotations.model_dump(mode="json", by_alias=True, exclude_none=True),
        }
        strict = StrictArguments.from_metadata(name, meta, entry["output"], enforced)
        if cache is not None:
            cache.put(name, entry)
    else:
        skip = (entry["context"],) if entry["context"] else ()
        strict = StrictArguments.deferred(name, fn, skip, entry["output"])
    return sdk.add_tool(server, _tool_of(name, fn, entry, strict, title, annotations))


def _tool_of(
    name: str,
    fn: Callable[..., Any],
    entry: dict[str, Any],
    strict: "StrictArguments",
    title: str,
    annotations: ToolAnnotations,
) -> Tool:
    return Tool(
        fn=fn,
        name=name,
        title=title,
        description=entry["description"],
        parameters=entry["input"],
        fn_metadata=strict,
        is_async=True,
        context_kwarg=entry["context"],
        annotations=annotations,
    )


async def _not_loaded(**_: Any) -> Any:  # never called: StrictArguments.call_fn runs the real function
    raise RuntimeError("a tool of a part that was not loaded")


def register_part_later(
    server: MCPServer, app: App, register: Callable[[MCPServer, App], None], entries: dict[str, dict[str, Any]]
) -> None:
    """Publish a part's tools from the cache `entries` and register the part itself only when one of its tools is
    first called (or its full output schema read): then `register` runs once, on a private server, and each tool
    takes the function and models it got there. For a part whose `register` adds tools and nothing else."""
    loaded: dict[str, Tool] = {}
    lock = threading.Lock()

    def load(name: str) -> Tool:
        with lock:
            if not loaded:
                private = MCPServer(f"{server.name}-part")
                register(private, app)
                loaded.update({t.name: t for t in sdk.list_tools(private)})
        return loaded[name]

    for name, entry in entries.items():
        strict = StrictArguments.of_part(name, load, entry["output"])
        annotations = ToolAnnotations.model_validate(entry["annotations"])
        sdk.add_tool(server, _tool_of(name, _not_loaded, entry, strict, entry["title"], annotations))


def _readable_errors(fn: F) -> F:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except (ToolError, ResourceError):
            raise
        except InputError as exc:
            raise ToolError(str(exc)) from exc
        except ValidationError as exc:
            # Raised by domain code validating its own models: the same one-line-per-problem wording as arguments.
            raise ToolError("\n".join(validation_problems(exc.errors(), root=exc.title))) from exc
        except Exception as exc:
            # A bug on our side: say so plainly, keep the traceback in the server's log, keep serving.
            log.exception("tool %s failed", fn.__name__)
            detail = " ".join(str(exc).split())[:300]
            raise ToolError(f"internal error ({type(exc).__name__}: {detail}); the server keeps running") from exc

    return wrapper  # type: ignore[return-value]


def agent_tool(
    server: MCPServer,
    *,
    title: str,
    read_only: bool,
    destructive: bool,
    idempotent: bool,
    open_world: bool,
    same_as: dict[str, str] | None = None,
) -> Callable[[F], F]:
    """Register an async tool. Every hint is a required argument, so none is left to a default by accident.
    `same_as` {argument: tool}: an object argument that travels between tools, published in full by that tool."""

    def decorator(fn: F) -> F:
        if not fn.__doc__ or len(fn.__doc__.strip()) < 80:
            raise ValueError(f"tool {fn.__name__} needs a docstring written for an agent (what, when, cost, returns)")
        register_tool(
            server,
            _readable_errors(fn),
            title=title,
            annotations=ToolAnnotations(  # the title once, on the tool: annotations.title would repeat it
                read_only_hint=read_only,
                destructive_hint=destructive,
                idempotent_hint=idempotent,
                open_world_hint=open_world,
            ),
            same_as=same_as,
        )
        return fn

    return decorator


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run blocking work (SQLite, /proc, files) off the event loop."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def client_name(ctx: Any) -> str:
    """The client's name and version as it introduced itself (legacy handshake), for the audit log: from a tool's
    Context or a request handler's context alike (both carry the session)."""
    try:
        info = ctx.session.client_params.client_info  # type: ignore[union-attr]
        return f"{info.name} {info.version}"
    except Exception:
        return "unknown client"


def register_schema_resources(server: MCPServer) -> None:
    """The full output schema of every tool (tools/list publishes its top level only: servers.core.schemas)."""

    @server.resource(
        "infra://tools/{name}/output-schema",
        name="tool_output_schema",
        mime_type="application/schema+json",
        description="A tool's full output schema (tools/list carries its top level)",
    )
    async def output_schema_resource(name: str) -> str:
        tool = sdk.get_tool(server, name)
        if tool is None or not isinstance(tool.fn_metadata, StrictArguments):
            raise ResourceError(f"{name}: no such tool; tools/list names them")
        tool.fn_metadata.ensure_built()
        if tool.fn_metadata.full_output_schema is None:
            raise ResourceError(f"{name}: this tool returns no structured content")
        return json.dumps(tool.fn_metadata.full_output_schema, indent=1)
