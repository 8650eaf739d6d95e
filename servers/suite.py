"""The suite: one server carrying every tool, resource and prompt of the others (job tools once).

`python -m servers.suite` serves it over stdio.
"""

from mcp.server import MCPServer

from servers.core.assemble import build_server
from servers.core.mcp_layer import App
from servers.diagnostics.server import PART as DIAGNOSTICS
from servers.launch.server import PART as LAUNCH
from servers.overlap.server import PART as OVERLAP
from servers.scaling.server import PART as SCALING

NAME = "suite"
PARTS = (SCALING, DIAGNOSTICS, OVERLAP, LAUNCH)
INSTRUCTIONS = (
    "LLM-infrastructure experiments on real GPUs, in one server. "
    + " ".join(f"{part.name}: {part.instructions}" for part in PARTS)
    + " Long work runs as jobs; a tool that starts one takes wait_s and returns the result or a job handle."
)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, PARTS, app)


if __name__ == "__main__":
    from servers.cli import main

    main(["serve", "suite"])
