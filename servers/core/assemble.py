"""Building a server from parts: each domain server is one part, the suite is all of them on one server."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mcp.server import MCPServer

from servers.core import sdk, toolcache
from servers.core.job_tools import register_job_resources, register_job_tools
from servers.core.jobs import JobKind
from servers.core.mcp_layer import App, new_server, register_part_later, register_schema_resources
from servers.core.paths import prompts_dir
from servers.core.resources import prompt_entries, register_file_resources, register_prompts


@dataclass(frozen=True)
class ServerPart:
    """One domain: its tools (registered by `register`), the job kinds it runs, whether it starts jobs."""

    name: str
    instructions: str
    register: Callable[[MCPServer, App], None]
    job_kinds: Sequence[JobKind] = field(default_factory=tuple)
    starts_jobs: bool = False
    # `register` adds tools and nothing else: a start whose tool cache has them all publishes them from it and
    # runs `register` at the first call of one (mcp_layer.register_part_later; it imports what they need then).
    tools_only: bool = False


def build_server(name: str, instructions: str, parts: Sequence[ServerPart], app: App | None = None) -> MCPServer:
    """One MCPServer carrying `parts`, the job tools once if any part starts jobs, the resources and prompts."""
    app = app or App(owner=name)
    features = None
    if any(part.starts_jobs for part in parts):
        from servers.core.tasks import JobFeatures  # the tasks extension and job subscriptions: only for jobs

        features = JobFeatures(app)
    server = new_server(name, instructions, app, features=features)
    cache = toolcache.attach(server, app.settings.home / "cache")
    for part in parts:
        for kind in part.job_kinds:
            app.add_job_kind(kind)
        cached = cache.part(part.name) if part.tools_only else None
        if cached:
            register_part_later(server, app, part.register, cached)
            continue
        before = {t.name for t in sdk.list_tools(server)}
        part.register(server, app)
        cache.put_part(part.name, [t.name for t in sdk.list_tools(server) if t.name not in before])
    if any(part.starts_jobs for part in parts):
        register_job_tools(server, app)
        register_job_resources(server, app)
    register_file_resources(server)
    register_schema_resources(server)
    entries = cache.prompts()
    if entries is None:
        entries = prompt_entries(prompts_dir())
        cache.put_prompts(entries)
    register_prompts(server, entries=entries)
    cache.save()
    return server
