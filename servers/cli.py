"""llm-infra-mcp: serve one of the servers, print a Claude Desktop configuration, show the settings.

llm-infra-mcp serve {scaling,diagnostics,overlap,launch,suite} [--transport stdio|http] [--host H] [--port N]
llm-infra-mcp config claude [--server NAME]...
llm-infra-mcp settings
llm-infra-mcp --version
"""

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Sequence

from servers import __version__

SERVER_NAMES = ("scaling", "diagnostics", "overlap", "launch", "suite")
SERVER_MODULES = {name: f"servers.{name}.server" for name in SERVER_NAMES if name != "suite"} | {
    "suite": "servers.suite"
}


def load_server(name: str):  # -> MCPServer; imported lazily so that `--version` stays instant
    if name not in SERVER_MODULES:
        raise SystemExit(f"unknown server {name!r}; choose one of {', '.join(SERVER_NAMES)}")
    return importlib.import_module(SERVER_MODULES[name]).create_server()


def claude_config(names: Sequence[str]) -> dict:
    """A claude_desktop_config.json fragment that starts each server with this very interpreter."""
    return {
        "mcpServers": {
            f"llm-infra-{name}": {"command": sys.executable, "args": ["-m", "servers.cli", "serve", name]}
            for name in names
        }
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-infra-mcp", description="MCP servers for LLM-infrastructure work")
    parser.add_argument("--version", action="version", version=f"llm-infra-mcp {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve one server (stdio by default)")
    serve.add_argument("name", choices=SERVER_NAMES)
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    serve.add_argument("--host", default=None, help="HTTP address (default LLM_INFRA_MCP_HTTP_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="HTTP port (default LLM_INFRA_MCP_HTTP_PORT, 8765)")

    config = commands.add_parser("config", help="print client configuration")
    config.add_argument("client", choices=("claude",))
    config.add_argument(
        "--server",
        action="append",
        choices=SERVER_NAMES,
        dest="servers",
        help="a server to include (repeatable; default: suite)",
    )

    commands.add_parser("settings", help="print every setting, its environment variable, default and current value")
    commands.add_parser("docs", help="print README's generated sections (servers, tools, settings)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "config":
        print(json.dumps(claude_config(args.servers or ["suite"]), indent=2))
        return
    if args.command == "docs":
        from servers.docs import generated_sections

        print(generated_sections())
        return
    if args.command == "settings":
        from servers.core.settings import Settings, settings_table

        current = Settings().model_dump()
        for env, default, description in settings_table():
            value = current[env.removeprefix("LLM_INFRA_MCP_").lower()]
            shown = "(set)" if "token" in env.lower() and value else value
            print(f"{env}={shown}\n    default: {default}\n    {description}")
        return

    # serve: logs go to stderr; stdout belongs to the protocol on stdio
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server = load_server(args.name)
    if args.transport == "stdio":
        server.run()
        return
    from servers.core.settings import Settings
    from servers.core.transport import TransportConfigError, serve_http

    settings = Settings()
    host = args.host or settings.http_host
    port = args.port or settings.http_port
    token = settings.http_token.get_secret_value() if settings.http_token else None
    try:
        serve_http(server, host, port, token)
    except TransportConfigError as exc:
        print(f"llm-infra-mcp: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
