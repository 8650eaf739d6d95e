"""The suite: one server carrying every tool, resource and prompt of the others (job tools once).

`python -m servers.suite` serves it over stdio.
"""

from mcp.server import MCPServer

from servers.core.assemble import ServerPart, build_server
from servers.core.mcp_layer import App
from servers.diagnostics.server import PART as DIAGNOSTICS
from servers.launch.server import PART as LAUNCH
from servers.overlap.server import PART as OVERLAP
from servers.scaling.server import PART as SCALING

NAME = "suite"
PARTS = (SCALING, DIAGNOSTICS, OVERLAP, LAUNCH)


def instructions(parts: tuple[ServerPart, ...]) -> str:
    return (
        "LLM-infrastructure experiments on real GPUs, in one server. "
        + " ".join(f"{part.name}: {part.instructions}" for part in parts)
        + " Long work runs as jobs; a tool that starts one takes wait_s and returns the result or a job handle."
    )


INSTRUCTIONS = instructions(PARTS)


def chosen_parts(toolsets: list[str]) -> tuple[ServerPart, ...]:
    """The parts LLM_INFRA_MCP_TOOLSETS names (all when it is empty), in the suite's order."""
    return tuple(part for part in PARTS if not toolsets or part.name in toolsets)


def create_server(app: App | None = None) -> MCPServer:
    """The suite, or the toolsets the settings name. Every part's job kinds stay known (a job started by a part
    that is now off can still be listed, followed and cancelled)."""
    app = app or App(owner=NAME)
    parts = chosen_parts(app.settings.toolsets)
    for part in PARTS:
        if part not in parts:
            for kind in part.job_kinds:
                app.add_job_kind(kind)
    return build_server(NAME, instructions(parts), parts, app)


if __name__ == "__main__":
    from servers.cli import main

    main(["serve", "suite"])
