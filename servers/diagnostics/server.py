"""The diagnostics server: GPU inventory and health (kernel-log and DCGM analysis come in their modules)."""

from typing import Annotated

from mcp.server import MCPServer
from mcp.types import CallToolResult

from servers.core.assemble import ServerPart, build_server
from servers.core.mcp_layer import App, agent_tool, in_thread, tool_result
from servers.diagnostics import nvml

NAME = "diagnostics"
INSTRUCTIONS = (
    "GPU and cluster health: what GPUs a node has, whether they are healthy, what an Xid or ECC error means "
    "and what to do about it."
)


def register(server: MCPServer, app: App) -> None:
    @agent_tool(server, title="GPU inventory", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def gpu_inventory() -> Annotated[CallToolResult, nvml.Inventory]:
        """List the NVIDIA GPUs of the machine this server runs on, live from NVML: index, name, UUID, PCI bus id,
        serial, memory, persistence mode, compute capability, driver and CUDA versions. Takes well under a second.
        Where there is no NVIDIA driver, available is false and reason says so (no error)."""
        inventory = await in_thread(nvml.read_inventory)
        if not inventory.available:
            return tool_result(inventory, f"no GPU inventory: {inventory.reason}")
        lines = [
            f"{inventory.gpu_count} GPU(s), driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}"
        ]
        lines += [f"- {g.index}: {g.name} {g.pci_bus_id} {g.uuid}" for g in inventory.gpus]
        return tool_result(inventory, "\n".join(lines))


PART = ServerPart(name=NAME, instructions=INSTRUCTIONS, register=register)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, [PART], app)
