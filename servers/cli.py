"""llm-infra-mcp: serve one of the servers, print a Claude Desktop configuration, show the settings.

llm-infra-mcp serve {scaling,diagnostics,overlap,launch,suite} [--transport stdio|http] [--host H] [--port N]
llm-infra-mcp config claude [--server NAME]... [--roots DIR...]
llm-infra-mcp approve [PLAN_ID] [--yes]
llm-infra-mcp settings
llm-infra-mcp --version
"""

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from servers import __version__

SERVER_NAMES = ("scaling", "diagnostics", "overlap", "launch", "suite")
SERVER_MODULES = {name: f"servers.{name}.server" for name in SERVER_NAMES if name != "suite"} | {
    "suite": "servers.suite"
}


def load_server(name: str):  # -> MCPServer; imported lazily so that `--version` stays instant
    if name not in SERVER_MODULES:
        raise SystemExit(f"unknown server {name!r}; choose one of {', '.join(SERVER_NAMES)}")
    return importlib.import_module(SERVER_MODULES[name]).create_server()


def default_workspace() -> Path:
    """The folder `config claude` creates for the files a person hands the servers (scripts, data, logs)."""
    return Path.home() / "llm-infra-workspace"


def claude_config(names: Sequence[str], roots: Sequence[Path] | None = None) -> dict:
    """A claude_desktop_config.json fragment that starts each server with this very interpreter, with the allowed
    roots stated: GUI clients start servers in '/' or the home directory, and that must never decide."""
    from servers.core.settings import Settings

    settings = Settings()
    chosen = [Path(r).expanduser().resolve() for r in roots] if roots else [settings.home, default_workspace()]
    env = {"LLM_INFRA_MCP_ALLOWED_ROOTS": os.pathsep.join(str(r) for r in chosen)}
    if os.environ.get("LLM_INFRA_MCP_HOME"):
        env["LLM_INFRA_MCP_HOME"] = str(settings.home)
    return {
        "mcpServers": {
            f"llm-infra-{name}": {
                "command": sys.executable,
                "args": ["-m", "servers.cli", "serve", name],
                "env": env,
            }
            for name in names
        }
    }


def refuse_broad_roots(roots: Sequence[Path]) -> str | None:
    """Why these roots are too broad to hand an agent, or None."""
    home = Path.home().resolve()
    for root in roots:
        resolved = Path(root).expanduser().resolve()
        if resolved == Path(resolved.anchor) or resolved == home or home.is_relative_to(resolved):
            return f"{resolved} as a root would let the agent read every file of the user; name a project folder"
    return None


def approve(plan_id: str, *, yes: bool) -> int:
    """`llm-infra-mcp approve PLAN_ID`: show a plan waiting for the person and record their approval."""
    from servers.core.settings import Settings
    from servers.launch.training import PLAN_ID_PATTERN, Approvals

    approvals = Approvals(Settings())
    if not plan_id:
        pending = approvals.pending()
        if not pending:
            print("no launch waits for approval")
        for row in pending:
            summary = json.loads(row["summary"])
            what = summary.get("what") or summary.get("recipe") or summary.get("script")
            print(f"{row['plan_id']}  {what}  up to {summary['estimated_gpu_hours']:.3g} GPU-hours")
        return 0
    if not PLAN_ID_PATTERN.fullmatch(plan_id):
        print(f"llm-infra-mcp: {plan_id!r} is not a plan id (16 hex digits, as the submit's error names it)")
        return 2
    row = approvals.get(plan_id)
    if row is None:
        print(f"llm-infra-mcp: no launch with plan id {plan_id} waits for approval here (state: {Settings().home})")
        return 2
    summary = json.loads(row["summary"])
    print(f"Plan {plan_id}:")
    for key, value in summary.items():
        print(f"  {key}: {value}")
    if not yes:
        try:
            with open("/dev/tty") as tty:
                print("Approve this launch? [y/N] ", end="", flush=True)
                answer = tty.readline().strip().lower()
        except OSError:
            print("llm-infra-mcp: no terminal to ask on; run this in a terminal, or pass --yes")
            return 2
        if answer not in ("y", "yes"):
            print("not approved")
            return 1
    who = os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid())
    if not approvals.approve(plan_id, f"{who} (llm-infra-mcp approve)"):
        print(f"llm-infra-mcp: plan {plan_id} was already used by a job; plan it again")
        return 2
    print(f"approved: the next submit of plan {plan_id} (its plan_token) starts it, within a day")
    return 0


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

    config.add_argument(
        "--roots",
        nargs="+",
        type=Path,
        default=None,
        help="folders the servers may read files and training scripts from (default: the state directory and "
        "~/llm-infra-workspace, which is created)",
    )

    approve_cmd = commands.add_parser(
        "approve", help="approve a launch an agent planned (for clients that cannot ask you); no id: list them"
    )
    approve_cmd.add_argument("plan_id", nargs="?", default="")
    approve_cmd.add_argument("--yes", action="store_true", help="approve without asking on the terminal")

    commands.add_parser("settings", help="print every setting, its environment variable, default and current value")
    commands.add_parser("docs", help="print README's generated sections (servers, tools, settings)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "config":
        if args.roots and (why := refuse_broad_roots(args.roots)):
            print(f"llm-infra-mcp: {why}", file=sys.stderr)
            raise SystemExit(2)
        if not args.roots:
            default_workspace().mkdir(parents=True, exist_ok=True)
        print(json.dumps(claude_config(args.servers or ["suite"], args.roots), indent=2))
        return
    if args.command == "approve":
        raise SystemExit(approve(args.plan_id, yes=args.yes))
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
        from servers.core.transport import serve_stdio

        serve_stdio(server)  # the SDK's stdio transport, with the lines it would leave unanswered answered
        return
    from servers.core.settings import Settings
    from servers.core.transport import TransportConfigError, serve_http

    settings = Settings()
    host = args.host or settings.http_host
    port = args.port or settings.http_port
    token = settings.http_token.get_secret_value() if settings.http_token else None
    try:
        serve_http(server, host, port, token, body_timeout_s=settings.http_body_timeout_s)
    except TransportConfigError as exc:
        print(f"llm-infra-mcp: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
