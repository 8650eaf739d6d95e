"""The launch server: which engines are here, and the job tools for following any job of this state directory."""

from typing import Annotated

from mcp.server import MCPServer
from mcp.types import CallToolResult
from pydantic import BaseModel

from servers.core.assemble import ServerPart, build_server
from servers.core.mcp_layer import App, agent_tool, in_thread, tool_result
from servers.launch.backends import BackendStatus, detect_all

NAME = "launch"
INSTRUCTIONS = (
    "Start, watch and stop training jobs: locally with torchrun, and on Slurm, Kubernetes or SkyPilot. Every job "
    "is followed with get_job, wait_for_job, read_job_logs and read_job_metrics, and stopped with cancel_job."
)


class BackendList(BaseModel):
    backends: list[BackendStatus]


def register(server: MCPServer, app: App) -> None:
    @agent_tool(
        server, title="List launch backends", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def list_backends() -> Annotated[CallToolResult, BackendList]:
        """Say which launch engines this machine offers (local torchrun, Slurm, Kubernetes, SkyPilot), what was
        found for each or why it is missing (e.g. 'sbatch not found on PATH'), and whether this server version
        can launch on it. Instant; starts nothing."""
        backends = await in_thread(detect_all)
        lines = [
            f"- {b.name}: {'found' if b.detected else 'missing'} ({b.detail})"
            + ("" if b.launch_supported else f"; {b.launch_note}")
            for b in backends
        ]
        return tool_result(BackendList(backends=backends), "\n".join(lines))


PART = ServerPart(name=NAME, instructions=INSTRUCTIONS, register=register, starts_jobs=True)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, [PART], app)
