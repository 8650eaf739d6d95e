"""The baseline for benchmarks/startup.py: the smallest useful MCPServer, one trivial tool, served over stdio.

Its cold start is what the MCP SDK itself costs (interpreter, `mcp` import, handshake); every server of this
package is measured against it. Run it directly with `python benchmarks/minimal_server.py`.
"""

from mcp.server import MCPServer


def create_server() -> MCPServer:
    server = MCPServer("minimal")

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    return server


if __name__ == "__main__":
    create_server().run()
