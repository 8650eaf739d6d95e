"""What the MCP SDK does not expose publicly is reached in one module only, servers/core/sdk.py, so that an SDK
upgrade has one file to read. Read with ast: an attribute access (`server._tool_manager`) and a string naming the
attribute (`getattr(server, "_lowlevel_server")`) both count."""

import ast
from pathlib import Path

from mcp.server import MCPServer

from servers.core import sdk

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = ROOT / "servers" / "core" / "sdk.py"
# The SDK's private attributes servers/ relies on (SDK 2.3): MCPServer's managers and low-level server, the
# ToolManager's tool dict, a ServerSession's connection.
PRIVATE = frozenset(
    {"_tool_manager", "_tools", "_prompt_manager", "_resource_manager", "_lowlevel_server", "_connection"}
)


def private_uses(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PRIVATE:
            found.append((node.lineno, node.value))
    return found


def test_only_the_adapter_touches_the_sdks_private_attributes() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted((ROOT / "servers").rglob("*.py"))
        if path != ADAPTER
        for line, name in private_uses(path.read_text())
    ]
    assert not offenders, "use servers/core/sdk.py instead:\n" + "\n".join(offenders)


def test_the_check_sees_both_spellings() -> None:
    source = (
        'a = server._tool_manager.get_tool("x")\n'
        'b = getattr(server, "_lowlevel_server", None)\n'
        "c = self._drop_connection\n"
    )
    assert sorted(private_uses(source)) == [(1, "_tool_manager"), (2, "_lowlevel_server")]
    assert {name for _, name in private_uses(ADAPTER.read_text())} >= {"_tool_manager", "_tools", "_connection"}


async def _noop() -> None:
    """A tool for the adapter test: it does nothing."""


def test_the_adapter_works_on_this_sdk() -> None:
    """Each of sdk.py's functions on the installed SDK: a broken private attribute shows here first."""
    server = MCPServer("t")
    assert sdk.lowlevel_server(server) is not None
    server.add_tool(_noop, name="noop")
    tool = sdk.get_tool(server, "noop")
    assert tool is not None and tool.name == "noop" and sdk.get_tool(server, "absent") is None
    assert [t.name for t in sdk.list_tools(server)] == ["noop"]
    try:
        sdk.add_tool(server, tool)
    except ValueError as exc:
        assert "registered twice" in str(exc)
    else:
        raise AssertionError("a second tool of one name was added")

    @server.prompt()
    def hello() -> str:
        return "hi"

    assert sdk.prompt_names(server) == ["hello"] and sdk.get_prompt(server, "hello") is not None
    assert sdk.get_prompt(server, "absent") is None

    class Session:
        _connection = object()

    session = Session()
    assert sdk.connection_of(session) is Session._connection
    plain = object()
    assert sdk.connection_of(plain) is plain
