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
import math
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

import anyio
import pydantic_core
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata, func_metadata
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from servers import __version__
from servers.core import toolcache
from servers.core.audit import AuditLog
from servers.core.db import StateDatabaseError
from servers.core.errors import (
    InputError,
    NotFoundError,
    describe_schema,
    format_path,
    schema_alternatives,
    subschema,
    validation_problems,
)
from servers.core.jobs import JOB_ID_PATTERN, Admit, JobEngine, JobKind
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
from servers.core.models import Model
from servers.core.schemas import description_text, published_input, published_output
from servers.core.settings import Settings

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
        prompt = self._prompt_manager.get_prompt(name)
        if prompt is None:
            known = ", ".join(p.name for p in self._prompt_manager.list_prompts())
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


def new_server(name: str, instructions: str, app: App, *, serves_jobs: bool = False) -> MCPServer:
    """An MCPServer that reconciles the job table when it starts. One that `serves_jobs` also offers the MCP tasks
    extension and subscriptions to its jobs' resources (servers.core.tasks): a client that declares neither sees
    no difference."""
    features = None
    if serves_jobs:
        from servers.core.tasks import JobFeatures

        features = JobFeatures(app)

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
    if isinstance(model, JobView):
        return shown_to_agent(model)
    if isinstance(model, JobWait) and model.job is not None:
        return model.model_copy(update={"job": shown_to_agent(model.job)})
    if isinstance(model, JobList) and model.details:
        return model.model_copy(update={"details": [shown_to_agent(v) for v in model.details]})
    return model


# ---- strict tool arguments -----------------------------------------------------------------------------------------
# The SDK validates a tool's arguments with a pydantic model built from the function's signature, in lax mode:
# unknown arguments are dropped silently, `true` passes as 1, "5" as 5. An agent learns nothing from that, so every
# tool registered through agent_tool validates strictly instead (StrictArguments below):
# - unknown arguments, top level and nested (spec, data, ...), are refused, naming the accepted ones; the published
#   inputSchema says additionalProperties: false on every object with properties;
# - the JSON types are exact: a boolean is not a number, a string is not a number or a boolean, a number is not a
#   string. A number with no fraction (5.0) counts as an integer, as JSON Schema has it;
# - a string given for an argument that cannot be a string (a list or an object) is read as JSON, as the SDK does
#   (Claude Desktop sends such arguments as JSON text); an argument that can be a string is never decoded;
# - problems come back one line each, "field: what is wrong; accepted: ...".

MAX_ARGUMENT_DEPTH = 64
MAX_INTEGER_BITS = 1024  # about 308 digits: larger than any bound of any tool
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


class _BadValueError(Exception):
    def __init__(self, path: list[str | int], problem: str) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem


def _json_ready(value: Any, path: list[str | int]) -> Any:
    """`value` as plain JSON data, integral floats as ints. Raises _BadValueError for data nested deeper than
    MAX_ARGUMENT_DEPTH and integers longer than any bound a tool has (pydantic's JSON parser refuses them)."""
    if len(path) > MAX_ARGUMENT_DEPTH:
        raise _BadValueError(path[:1], f"nested deeper than {MAX_ARGUMENT_DEPTH} levels")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INTEGER_BITS:
        raise _BadValueError(path, f"an integer of {value.bit_length()} bits is far beyond any accepted value")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _json_ready(item, [*path, str(key)]) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(item, [*path, i]) for i, item in enumerate(value)]
    return value


def _accepts_string(schema: dict[str, Any], defs: dict[str, Any]) -> bool:
    for alt in schema_alternatives(schema, defs):
        kind = alt.get("type")
        if kind == "string" or (kind is None and not ({"properties", "items", "enum", "const"} & set(alt))):
            return True
        if any(isinstance(v, str) for v in alt.get("enum", [])) or isinstance(alt.get("const"), str):
            return True
    return False


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` with additionalProperties: false on every object schema that lists its properties."""

    def close(node: Any) -> Any:
        if isinstance(node, list):
            return [close(item) for item in node]
        if not isinstance(node, dict):
            return node
        closed: dict[str, Any] = {}
        for key, value in node.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                closed[key] = {name: close(sub) for name, sub in value.items()}  # names map to schemas
            elif key in ("enum", "const", "default", "examples"):
                closed[key] = value  # data, not schemas
            else:
                closed[key] = close(value)
        if "properties" in closed and "additionalProperties" not in closed:
            closed["additionalProperties"] = False
        return closed

    return close(schema)


class _Rejected(dict[str, Any]):
    """What StrictArguments.validate_arguments returns for arguments it refuses: call_fn raises the problems.

    (The SDK turns a ValidationError from validate_arguments into pydantic's multi-line dump and anything else into
    an opaque crash; a ToolError raised by call_fn reaches the agent with its text.)
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__()
        self.problems = problems


class _NotBuiltYet(ArgModelBase):
    """The argument model of a tool registered from the schema cache, until its first call builds the real one."""


class StrictArguments(FuncMetadata):
    """The SDK's FuncMetadata with strict, readable argument validation (see the comment above).

    `output_schema` is what tools/list publishes (servers.core.schemas.published_output); results are validated
    against `output_model`, the full model. A tool registered from the schema cache starts without its models
    (`_source` set): the first call, or a read of its full output schema, builds them (a few milliseconds)."""

    tool_name: str
    input_schema: dict[str, Any] = Field(default_factory=dict)
    full_output_schema: dict[str, Any] | None = None
    text_fields: frozenset[str] = frozenset()
    _source: tuple[Callable[..., Any], tuple[str, ...]] | None = PrivateAttr(default=None)
    _loader: Callable[[str], Tool] | None = PrivateAttr(default=None)
    _real_fn: Callable[..., Any] | None = PrivateAttr(default=None)

    @classmethod
    def from_metadata(
        cls,
        name: str,
        meta: FuncMetadata,
        published_output_schema: dict[str, Any] | None,
        schema: dict[str, Any] | None = None,
    ) -> "StrictArguments":
        """`schema`: the closed input schema of `meta.arg_model` when the caller has it already."""
        schema = schema if schema is not None else closed_schema(meta.arg_model.model_json_schema(by_alias=True))
        defs = schema.get("$defs", {})
        return cls(
            arg_model=meta.arg_model,
            output_schema=published_output_schema,
            output_model=meta.output_model,
            wrap_output=meta.wrap_output,
            tool_name=name,
            input_schema=schema,
            full_output_schema=meta.output_schema,
            text_fields=frozenset(
                key for key, prop in schema.get("properties", {}).items() if _accepts_string(prop, defs)
            ),
        )

    @classmethod
    def deferred(
        cls, name: str, fn: Callable[..., Any], skip: tuple[str, ...], published_output_schema: dict[str, Any] | None
    ) -> "StrictArguments":
        meta = cls(arg_model=_NotBuiltYet, output_schema=published_output_schema, tool_name=name)
        meta._source = (fn, skip)
        return meta

    @classmethod
    def of_part(
        cls, name: str, loader: Callable[[str], Tool], published_output_schema: dict[str, Any] | None
    ) -> "StrictArguments":
        """A tool of a part not registered yet (register_part_later): `loader(name)` registers the part and gives
        the real tool, whose function and models this one then uses."""
        meta = cls(arg_model=_NotBuiltYet, output_schema=published_output_schema, tool_name=name)
        meta._loader = loader
        return meta

    def ensure_built(self) -> None:
        if self._loader is not None:
            real = self._loader(self.tool_name)
            assert isinstance(real.fn_metadata, StrictArguments)
            real.fn_metadata.ensure_built()
            built = real.fn_metadata
            self._real_fn = real.fn
            self._loader = None
        elif self._source is not None:
            fn, skip = self._source
            built = StrictArguments.from_metadata(
                self.tool_name, func_metadata(fn, skip_names=skip), self.output_schema
            )
            self._source = None
        else:
            return
        for field in ("arg_model", "output_model", "wrap_output", "input_schema", "full_output_schema", "text_fields"):
            setattr(self, field, getattr(built, field))

    def _decode(self, name: str, value: Any) -> Any:
        if not isinstance(value, str) or name in self.text_fields:
            return value
        try:
            decoded = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return decoded if isinstance(decoded, dict | list) else value

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        self.ensure_built()
        names = {field.alias or name: name for name, field in self.arg_model.model_fields.items()}
        problems = [
            f"{key}: unknown argument; accepted: {', '.join(names) or 'no arguments'}"
            for key in arguments_to_validate
            if key not in names
        ]
        try:
            data = _json_ready(
                {key: self._decode(key, value) for key, value in arguments_to_validate.items() if key in names}, []
            )
            text = pydantic_core.to_json(data, inf_nan_mode="constants")
        except _BadValueError as exc:
            defs = self.input_schema.get("$defs", {})
            target = subschema(self.input_schema, exc.path, defs)
            accepted = f"; accepted: {describe_schema(target, defs)}" if target is not None else ""
            return _Rejected([*problems, f"{format_path(exc.path)}: {exc.problem}{accepted}"])
        except (ValueError, TypeError, RecursionError) as exc:
            return _Rejected([*problems, f"arguments: not JSON data ({type(exc).__name__})"])
        try:
            model = self.arg_model.model_validate_json(text, strict=True, extra="forbid")
        except ValidationError as exc:
            return _Rejected(problems + validation_problems(exc.errors(), data, self.input_schema))
        if problems:
            return _Rejected(problems)
        return model.model_dump_one_level()

    async def call_fn(
        self,
        fn: Callable[..., Any | Awaitable[Any]],
        fn_is_async: bool,
        arguments: dict[str, Any],
        arguments_to_pass_directly: dict[str, Any] | None = None,
    ) -> Any:
        if isinstance(arguments, _Rejected):
            raise ToolError("\n".join(arguments.problems))
        return await super().call_fn(self._real_fn or fn, fn_is_async, arguments, arguments_to_pass_directly)

    def convert_result(self, result: Any) -> Any:
        self.ensure_built()
        return super().convert_result(result)


def _refer(schema: dict[str, Any], same_as: dict[str, str]) -> dict[str, Any]:
    """`schema` with each property named in `same_as` published as "the same object as <tool>'s" instead of in
    full (the object travels between tools and is listed in full once); $defs no longer used are dropped."""
    properties = dict(schema.get("properties", {}))
    for name, other in same_as.items():
        if name not in properties:
            raise ValueError(f"same_as names {name!r}, which is not an argument")
        said = properties[name].get("description", "").rstrip(".")
        properties[name] = {
            "type": "object",
            "description": f"{said + '; ' if said else ''}the same object as {other}'s {name}",
        }
    out = {**schema, "properties": properties}
    text = json.dumps({k: v for k, v in out.items() if k != "$defs"})
    defs = dict(schema.get("$defs", {}))
    used: set[str] = set()
    pending = [n for n in defs if f'"#/$defs/{n}"' in text]
    while pending:
        name = pending.pop()
        if name in used:
            continue
        used.add(name)
        inner = json.dumps(defs[name])
        pending += [n for n in defs if n not in used and f'"#/$defs/{n}"' in inner]
    if used:
        out["$defs"] = {n: d for n, d in defs.items() if n in used}
    else:
        out.pop("$defs", None)
    return out


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
            published_in = _refer(published_in, same_as)
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
    return _add(server, _tool_of(name, fn, entry, strict, title, annotations))


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


def _add(server: MCPServer, tool: Tool) -> Tool:
    manager = server._tool_manager  # the SDK keeps no public way to add a Tool it did not build itself
    if tool.name in manager._tools:
        raise ValueError(f"tool {tool.name} is registered twice")
    manager._tools[tool.name] = tool
    return tool


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
                loaded.update({t.name: t for t in private._tool_manager.list_tools()})
        return loaded[name]

    for name, entry in entries.items():
        strict = StrictArguments.of_part(name, load, entry["output"])
        annotations = ToolAnnotations.model_validate(entry["annotations"])
        _add(server, _tool_of(name, _not_loaded, entry, strict, entry["title"], annotations))


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


# ---- jobs ----------------------------------------------------------------------------------------------

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


def job_row(view: JobView) -> JobRow:
    """The listing's row of a job's view (spec values are the job's: only short text is taken from them)."""
    spec = view.spec
    training = spec.get("training_spec") if isinstance(spec.get("training_spec"), dict) else {}

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
        backend=text(spec.get("backend")) or text(training.get("backend")),
        name=text(spec.get("name")) or text(training.get("name")),
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
        await anyio.sleep(min(0.25, max(0.0, timeout_s - waited)))
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


def client_name(ctx: Any) -> str:
    """The client's name and version as it introduced itself (legacy handshake), for the audit log: from a tool's
    Context or a request handler's context alike (both carry the session)."""
    try:
        info = ctx.session.client_params.client_info  # type: ignore[union-attr]
        return f"{info.name} {info.version}"
    except Exception:
        return "unknown client"


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
        rows = [job_row(v) for v in views]
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
        import re

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


def register_schema_resources(server: MCPServer) -> None:
    """The full output schema of every tool (tools/list publishes its top level only: servers.core.schemas)."""

    @server.resource(
        "infra://tools/{name}/output-schema",
        name="tool_output_schema",
        mime_type="application/schema+json",
        description="A tool's full output schema (tools/list carries its top level)",
    )
    async def output_schema_resource(name: str) -> str:
        tool = server._tool_manager.get_tool(name)
        if tool is None or not isinstance(tool.fn_metadata, StrictArguments):
            raise ResourceError(f"{name}: no such tool; tools/list names them")
        tool.fn_metadata.ensure_built()
        if tool.fn_metadata.full_output_schema is None:
            raise ResourceError(f"{name}: this tool returns no structured content")
        return json.dumps(tool.fn_metadata.full_output_schema, indent=1)
