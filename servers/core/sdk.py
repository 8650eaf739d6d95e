"""The one place that reaches into what the MCP SDK does not expose publicly.

Everything else in servers/ goes through these functions (tests/test_sdk_private.py checks it). Each relies on a
private attribute of the `mcp` SDK 2.3 (the version pinned in pyproject.toml); its docstring says which, and what
stops working if a later SDK renames or removes it. On an SDK upgrade, read this file first.
"""

from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver.tools.base import Tool


def get_tool(server: MCPServer, name: str) -> Tool | None:
    """The registered Tool of this name, or None (MCPServer has no public lookup of its Tool objects).

    Relies on SDK 2.3's `MCPServer._tool_manager.get_tool`. If it changes: the tasks extension no longer sees a
    tool's annotations (no tool answers with a task) and the infra://tools/{name}/output-schema resource fails."""
    return server._tool_manager.get_tool(name)


def list_tools(server: MCPServer) -> list[Tool]:
    """Every registered Tool, in registration order (MCPServer.list_tools gives wire shapes, not Tool objects).

    Relies on SDK 2.3's `MCPServer._tool_manager.list_tools`. If it changes: the tool cache cannot note a part's
    tools, and a part registered later (register_part_later) cannot take up its tools."""
    return server._tool_manager.list_tools()


def add_tool(server: MCPServer, tool: Tool) -> Tool:
    """Add a Tool built by us (our argument model, our published schemas); a second tool of one name is refused.

    Relies on SDK 2.3's `MCPServer._tool_manager._tools`, the name -> Tool dict (ToolManager.add_tool only takes a
    function and builds the Tool and its lax schemas itself). If it changes: no tool registers, and no server
    starts."""
    manager = server._tool_manager
    if tool.name in manager._tools:
        raise ValueError(f"tool {tool.name} is registered twice")
    manager._tools[tool.name] = tool
    return tool


def get_prompt(server: MCPServer, name: str) -> Any | None:
    """The registered Prompt of this name, or None.

    Relies on SDK 2.3's `MCPServer._prompt_manager.get_prompt`. If it changes: prompts/get answers every request
    with an internal error instead of checking its arguments."""
    return server._prompt_manager.get_prompt(name)


def prompt_names(server: MCPServer) -> list[str]:
    """The names of the registered prompts.

    Relies on SDK 2.3's `MCPServer._prompt_manager.list_prompts`. If it changes: as get_prompt."""
    return [p.name for p in server._prompt_manager.list_prompts()]


def lowlevel_server(server: MCPServer) -> Any | None:
    """The low-level Server inside an MCPServer, or None if this SDK has none by that name.

    Relies on SDK 2.3's `MCPServer._lowlevel_server` (MCPServer has no public way to add a handler for a spec
    method, nor to run its server on streams of our own). If it changes: resources/subscribe is not served (the
    server refuses to start with subscriptions: JobFeatures.install raises), and stdio is served without the
    malformed-line guard (transport.serve_stdio_async warns)."""
    return getattr(server, "_lowlevel_server", None)


def connection_of(session: Any) -> Any:
    """The connection a request's session belongs to, to key per-connection state (falls back to the session).

    Relies on SDK 2.3's `ServerSession._connection` (the session object is per request in this SDK, its
    connection is not). If it changes: each request counts as a connection of its own, so resources/unsubscribe
    no longer finds its subscription and a connection's subscriptions are not dropped when it closes."""
    return getattr(session, "_connection", session)
