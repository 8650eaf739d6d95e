"""llm-infra-mcp: serve one of the servers, print a Claude Desktop configuration, show the settings.

llm-infra-mcp serve {scaling,diagnostics,overlap,launch,suite} [--transport stdio|http] [--host H] [--port N]
llm-infra-mcp config claude [--server NAME]... [--roots DIR...] [--toolsets A,B] [--write PATH]
llm-infra-mcp approve [PLAN_ID] [--yes]
llm-infra-mcp settings
llm-infra-mcp loop [--quick] [--backend local|slurm|ray] ...   (the experiment loop; --help for its options)
llm-infra-mcp --version
"""

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

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


def claude_config(
    names: Sequence[str], roots: Sequence[Path] | None = None, toolsets: Sequence[str] | None = None
) -> dict:
    """A claude_desktop_config.json fragment that starts each server with this very interpreter, with the allowed
    roots stated: GUI clients start servers in '/' or the home directory, and that must never decide."""
    from servers.core.settings import Settings

    settings = Settings()
    chosen = [Path(r).expanduser().resolve() for r in roots] if roots else [settings.home, default_workspace()]
    env = {"LLM_INFRA_MCP_ALLOWED_ROOTS": os.pathsep.join(str(r) for r in chosen)}
    if os.environ.get("LLM_INFRA_MCP_HOME"):
        env["LLM_INFRA_MCP_HOME"] = str(settings.home)
    if toolsets:
        env["LLM_INFRA_MCP_TOOLSETS"] = ",".join(toolsets)
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


class ConfigWriteError(Exception):
    """`config claude --write` refused the file; nothing was changed."""


def _backup_path(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.bak-{stamp}-{n}")
        n += 1
    return candidate


def write_claude_config(path: Path, fragment: dict) -> str:
    """Merge a `claude_config` fragment into the claude_desktop_config.json at `path`: every other top-level key and
    every other server stay as they are, the fragment's servers replace those of the same names. The previous file is
    copied to PATH.bak-<time> first; the new one replaces it atomically (a temporary file in the same folder, then a
    rename), with the old file's permissions. A file that is not a JSON object (or whose mcpServers is not one) is
    refused with ConfigWriteError and left untouched. A missing file is created (mode 0600). Says what it did."""
    path = Path(os.path.realpath(path.expanduser()))  # a symlinked config: write the file it points to
    if path.is_dir():
        raise ConfigWriteError(f"{path} is a folder; name the claude_desktop_config.json file")
    old_bytes: bytes | None = None
    config: dict = {}
    if path.exists():
        old_bytes = path.read_bytes()
        try:
            config = json.loads(old_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigWriteError(f"{path} is not valid JSON ({exc}); fix or move it, nothing was changed") from None
        if not isinstance(config, dict):
            raise ConfigWriteError(
                f"{path} holds a JSON {type(config).__name__}, not an object; fix or move it, nothing was changed"
            )
    servers = config.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise ConfigWriteError(
            f"{path}: mcpServers is a JSON {type(servers).__name__}, not an object; fix it, nothing was changed"
        )
    ours = fragment["mcpServers"]
    replaced = [name for name in ours if name in servers]
    kept = [name for name in servers if name not in ours]
    config["mcpServers"] = {**servers, **ours}
    text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"

    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if old_bytes is not None:
        backup = _backup_path(path)
        with open(backup, "xb") as out:  # exclusive: never overwrites an earlier backup
            out.write(old_bytes)
        os.chmod(backup, path.stat().st_mode & 0o777)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if old_bytes is not None:
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    from servers.core.display import visible  # names from the person's file: shown escaped

    lines = [f"{'updated' if old_bytes is not None else 'created'} {visible(path)}"]
    added = [visible(name) for name in ours if name not in replaced]
    if added:
        lines.append(f"  added: {', '.join(added)}")
    if replaced:
        lines.append(f"  replaced: {', '.join(visible(name) for name in replaced)}")
    shown_kept = ", ".join(visible(name) for name in kept)
    lines.append(f"  kept {len(kept)} other server(s){': ' + shown_kept if kept else ''}")
    others = [visible(key) for key in config if key != "mcpServers"]
    if others:
        lines.append(f"  kept the other top-level keys: {', '.join(others)}")
    if backup is not None:
        lines.append(f"  previous file saved as {visible(backup)}")
    lines.append("  restart Claude Desktop to load the change")
    return "\n".join(lines)


def refuse_broad_roots(roots: Sequence[Path]) -> str | None:
    """Why these roots are too broad to hand an agent, or None."""
    home = Path.home().resolve()
    for root in roots:
        resolved = Path(root).expanduser().resolve()
        if resolved == Path(resolved.anchor) or resolved == home or home.is_relative_to(resolved):
            return f"{resolved} as a root would let the agent read every file of the user; name a project folder"
    return None


BANDWIDTH_LAYOUT = "bandwidth-check/1"  # servers/diagnostics/bandwidth.py SUMMARY_LAYOUT (checked by its tests)


def _hours(value: object) -> str:
    """Hours for the person: 5,120.0, 0.167 (three decimals at most, never a bare integer)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        from servers.core.display import visible

        return visible(value) if value is not None else "(not recorded)"
    text = f"{value:,.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _wall(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        from servers.core.display import visible

        return visible(value)
    return f"{value:,g} s ({_hours(value / 3600)} h)"


def approval_lines(plan_id: str, summary: dict[str, Any]) -> list[str]:
    """What `approve` shows of a waiting plan, every value escaped (servers/core/display.py): a fixed layout with
    every field that decides what runs and what it costs, those that decide the cost last (nearest the prompt)."""
    from servers.core.display import quoted, quoted_list, visible
    from servers.launch.training import SUMMARY_LAYOUT, SWEEP_SUMMARY_LAYOUT

    layout = summary.get("layout")
    if layout == BANDWIDTH_LAYOUT:
        return bandwidth_lines(plan_id, summary)
    if layout not in (SUMMARY_LAYOUT, SWEEP_SUMMARY_LAYOUT):  # an older version's summary: every key, escaped
        lines = [f"Plan {visible(plan_id)} (recorded by an older version: plan it again to see every field):"]
        lines += [f"  {visible(k)}: {visible(json.dumps(v, ensure_ascii=False))}" for k, v in summary.items()]
        return lines
    sweep = layout == SWEEP_SUMMARY_LAYOUT
    script = f"script {quoted(summary.get('script'))}"
    what = f"recipe {quoted(summary['recipe'])} ({script})" if summary.get("recipe") else script
    lines = [
        f"Plan {visible(plan_id)}: "
        + (f"a sweep of {visible(summary.get('runs'))} runs" if sweep else "a training job")
        + f" on {visible(summary.get('backend'))}",
        f"  what: {what}",
        "  command" + (" of run 0" if sweep else "") + " (argv, one element a line, quoted):",
        *(f"    {quoted(item)}" for item in summary.get("argv") or []),
    ]
    if sweep:
        lines.append("  args of each run:")
        lines += [f"    run {i}: {quoted_list(args)}" for i, args in enumerate(summary.get("args_of_each_run") or [])]
    env = summary.get("env") or {}
    lines.append(f"  env names: {', '.join(visible(k) for k in env) or '(none)'}")
    lines += [f"    {visible(k)}={quoted(v)}" for k, v in env.items()]
    packages = summary.get("pip_packages") or []
    lines.append(f"  pip_packages: {quoted_list(packages) if packages else '(none)'}")
    lines.append(f"  workdir: {quoted(summary['workdir']) if summary.get('workdir') else '(none)'}")
    lines.append(f"  cwd: {quoted(summary.get('cwd'))}")
    for key, value in (summary.get("placement") or {}).items():
        lines.append(f"  {visible(key)}: {quoted(value) if isinstance(value, str) else visible(value)}")
    for key in ("name", "max_restarts", "share_gpus"):
        if summary.get(key) not in (None, "", 0, False):
            lines.append(f"  {key}: {visible(summary[key])}")
    lines.append(f"  network: {visible(str(summary.get('network')).removeprefix('network: '))}")
    lines += [f"  warning: {visible(w)}" for w in summary.get("warnings") or []]
    lines += [
        f"  backend: {visible(summary.get('backend'))}",
        f"  image: {quoted(summary['image']) if summary.get('image') else '(none: the machines as they are)'}",
        f"  nnodes: {visible(summary.get('nnodes'))}",
        f"  nproc_per_node: {visible(summary.get('nproc_per_node'))}",
        f"  gpus_per_node: {visible(summary.get('gpus_per_node'))}",
        f"  total_gpus: {visible(summary.get('total_gpus'))}" + (" (all runs at once)" if sweep else ""),
        f"  max_wall_s: {_wall(summary.get('max_wall_s'))}" + (" (each run)" if sweep else ""),
        f"  estimated_gpu_hours: {_hours(summary.get('estimated_gpu_hours'))}" + (" (all runs)" if sweep else ""),
        f"  estimated_node_hours: {_hours(summary.get('estimated_node_hours'))}" + (" (all runs)" if sweep else ""),
    ]
    return lines


def bandwidth_lines(plan_id: str, summary: dict[str, Any]) -> list[str]:
    """A bandwidth check's probe jobs (check_collective_bandwidth on Slurm), every value escaped, the fields that
    decide the cost last."""
    from servers.core.display import quoted, visible

    nodes = summary.get("nodes") if isinstance(summary.get("nodes"), list) else []
    return [
        f"Plan {visible(plan_id)}: a bandwidth check, {visible(summary.get('probes'))} probe job(s) one at a time "
        f"on {visible(summary.get('backend'))}",
        f"  what: {visible(summary.get('what'))}",
        f"  mode: {visible(summary.get('mode'))}",
        f"  op: {visible(summary.get('op'))}",
        f"  message sizes (bytes): {visible(summary.get('sizes'))}",
        f"  partition: {quoted(summary['partition']) if summary.get('partition') else '(the default)'}",
        f"  nodes ({len(nodes)}, each probe pinned to its own):",
        *(f"    {quoted(n)}" for n in nodes),
        f"  backend: {visible(summary.get('backend'))}",
        f"  probes: {visible(summary.get('probes'))}",
        f"  nodes_per_probe: {visible(summary.get('nodes_per_probe'))} (the widest probe)",
        f"  nproc_per_node: {visible(summary.get('nproc_per_node'))}",
        f"  gpus_per_node: {visible(summary.get('gpus_per_node'))}",
        f"  total_gpus: {visible(summary.get('total_gpus'))} (the widest probe; one probe runs at a time)",
        f"  probe_wall_s: {_wall(summary.get('probe_wall_s'))} (each probe)",
        f"  estimated_gpu_hours: {_hours(summary.get('estimated_gpu_hours'))} (all probes)",
        f"  estimated_node_hours: {_hours(summary.get('estimated_node_hours'))} (all probes)",
    ]


def approval_recap(summary: dict[str, Any]) -> str:
    """One line of what is approved, for the prompt itself: the last thing the person reads is ours."""
    from servers.core.display import quoted, visible
    from servers.launch.training import SUMMARY_LAYOUT, SWEEP_SUMMARY_LAYOUT

    hours = f"{_hours(summary.get('estimated_gpu_hours'))} GPU-hours"
    if summary.get("layout") == BANDWIDTH_LAYOUT:
        return (
            f"{visible(summary.get('probes'))} bandwidth probe job(s), up to {hours} and "
            f"{_hours(summary.get('estimated_node_hours'))} node-hours on {visible(summary.get('backend'))}: up to "
            f"{visible(summary.get('nodes_per_probe'))} node(s) x {visible(summary.get('gpus_per_node'))} GPU(s) "
            f"each, up to {_wall(summary.get('probe_wall_s'))} each"
        )
    if summary.get("layout") not in (SUMMARY_LAYOUT, SWEEP_SUMMARY_LAYOUT):
        return f"up to {hours}"
    image = f", image {quoted(summary['image'])}" if summary.get("image") else ""
    runs = f"{visible(summary.get('runs'))} runs, " if summary.get("layout") == SWEEP_SUMMARY_LAYOUT else ""
    return (
        f"{runs}up to {hours} and {_hours(summary.get('estimated_node_hours'))} node-hours on "
        f"{visible(summary.get('backend'))}{image}: {visible(summary.get('nnodes'))} node(s) x "
        f"{visible(summary.get('gpus_per_node'))} GPU(s) = {visible(summary.get('total_gpus'))} GPU(s), "
        f"up to {_wall(summary.get('max_wall_s'))}"
    )


def pending_line(row: dict[str, Any]) -> str:
    """One waiting plan in `approve`'s list, escaped."""
    from servers.core.display import visible

    try:
        summary = json.loads(row["summary"])
    except (TypeError, ValueError):
        summary = {}
    if not isinstance(summary, dict):
        summary = {}
    what = summary.get("what") or summary.get("recipe") or summary.get("script")
    return f"{visible(row.get('plan_id'))}  {visible(what)}  {approval_recap(summary)}"


def approve(plan_id: str, *, yes: bool, tty: TextIO | None = None, out: TextIO | None = None) -> int:
    """`llm-infra-mcp approve PLAN_ID`: show a plan waiting for the person and record their approval. The answer
    is read from the terminal (/dev/tty), never from stdin (`tty`: a stand-in for tests); `out`: stdout."""
    from servers.core.display import quoted, visible
    from servers.core.settings import Settings
    from servers.engines.admission import PLAN_ID_PATTERN, Approvals

    out = out or sys.stdout

    def say(text: str = "", end: str = "\n") -> None:
        print(text, end=end, file=out, flush=True)

    approvals = Approvals(Settings())
    if not plan_id:
        pending = approvals.pending()
        if not pending:
            say("no launch waits for approval")
        for row in pending:
            say(pending_line(row))
        return 0
    if not PLAN_ID_PATTERN.fullmatch(plan_id):
        say(f"llm-infra-mcp: {quoted(plan_id)} is not a plan id (16 hex digits, as the submit's error names it)")
        return 2
    row = approvals.get(plan_id)
    if row is None:
        home = visible(Settings().home)
        say(f"llm-infra-mcp: no launch with plan id {plan_id} waits for approval here (state: {home})")
        return 2
    try:
        summary = json.loads(row["summary"])
    except (TypeError, ValueError):
        summary = None
    if not isinstance(summary, dict):
        say(f"llm-infra-mcp: the record of plan {plan_id} cannot be read; plan it again")
        return 2
    for line in approval_lines(plan_id, summary):
        say(line)
    recap = approval_recap(summary)
    if not yes:
        try:
            with contextlib.ExitStack() as stack:
                source = tty if tty is not None else stack.enter_context(open("/dev/tty"))
                say(f"Approve {recap}? [y/N] ", end="")
                answer = source.readline().strip().lower()
        except OSError:
            say("llm-infra-mcp: no terminal to ask on; run this in a terminal, or pass --yes")
            return 2
        if answer not in ("y", "yes"):
            say("not approved")
            return 1
    else:
        say(f"approving (--yes): {recap}")
    who = os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid())
    if not approvals.approve(plan_id, f"{who} (llm-infra-mcp approve)"):
        say(f"llm-infra-mcp: plan {plan_id} was already used by a job; plan it again")
        return 2
    if summary.get("layout") == BANDWIDTH_LAYOUT:
        say(f"approved: the next check_collective_bandwidth with the same arguments (plan {plan_id}) starts it, "
            "within a day")  # fmt: skip
    else:
        say(f"approved: the next submit of plan {plan_id} (its plan_token) starts it, within a day")
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
    config.add_argument(
        "--toolsets",
        type=lambda text: [t.strip() for t in text.split(",") if t.strip()],
        default=None,
        metavar="A,B",
        help="serve only these parts of the suite (scaling, diagnostics, overlap, launch): LLM_INFRA_MCP_TOOLSETS",
    )
    config.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="PATH",
        help="merge into this claude_desktop_config.json instead of printing: other servers and keys are kept, "
        "ours replaced, the previous file backed up to PATH.bak-<time>; a missing file is created",
    )

    approve_cmd = commands.add_parser(
        "approve", help="approve a launch an agent planned (for clients that cannot ask you); no id: list them"
    )
    approve_cmd.add_argument("plan_id", nargs="?", default="")
    approve_cmd.add_argument("--yes", action="store_true", help="approve without asking on the terminal")

    commands.add_parser("settings", help="print every setting, its environment variable, default and current value")
    docs = commands.add_parser("docs", help="print README's generated sections (servers, tools, settings)")
    docs.add_argument(
        "--write", action="store_true", help="rewrite them in README.md, and tests/snapshots/tools.json (a checkout)"
    )
    commands.add_parser(
        "loop", help="run the experiment loop (examples/experiment_loop.py; see `llm-infra-mcp loop --help`)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["loop"]:  # the loop has its own options (servers/loop/cli.py): one implementation
        from servers.loop.cli import main as loop_main

        raise SystemExit(loop_main(given[1:]))
    args = _parser().parse_args(argv)
    if args.command == "config":
        if args.roots and (why := refuse_broad_roots(args.roots)):
            print(f"llm-infra-mcp: {why}", file=sys.stderr)
            raise SystemExit(2)
        if not args.roots:
            default_workspace().mkdir(parents=True, exist_ok=True)
        if args.toolsets is not None:
            known = ("scaling", "diagnostics", "overlap", "launch")
            if (
                not args.toolsets
                or any(t not in known for t in args.toolsets)
                or (args.servers or ["suite"]) != ["suite"]
            ):
                print(
                    f"llm-infra-mcp: --toolsets: {','.join(args.toolsets) or '(none)'}; accepted: a comma-separated "
                    f"list of {', '.join(known)}, with the suite (no --server)",
                    file=sys.stderr,
                )
                raise SystemExit(2)
        fragment = claude_config(args.servers or ["suite"], args.roots, args.toolsets)
        if args.write is None:
            print(json.dumps(fragment, indent=2))
            return
        try:
            print(write_claude_config(args.write, fragment))
        except (ConfigWriteError, OSError) as exc:
            print(f"llm-infra-mcp: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        return
    if args.command == "approve":
        raise SystemExit(approve(args.plan_id, yes=args.yes))
    if args.command == "docs":
        from servers.docs import generated_sections, write_all

        if args.write:
            for path in write_all():
                print(f"wrote {path}")
            return
        print(generated_sections())
        return
    if args.command == "settings":
        from servers.core.display import visible
        from servers.core.settings import Settings, settings_table

        current = Settings().model_dump()
        for env, default, description in settings_table():
            value = current[env.removeprefix("LLM_INFRA_MCP_").lower()]
            shown = "(set)" if "token" in env.lower() and value else value
            print(f"{env}={visible(shown)}\n    default: {visible(default)}\n    {description}")
        return

    # serve: logs go to stderr; stdout belongs to the protocol on stdio
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request (a job's engine is polled)
    from pydantic import ValidationError

    try:
        server = load_server(args.name)
    except ValidationError as exc:  # a setting the environment got wrong: one line each, no library dump
        for error in exc.errors():
            field = "_".join(str(part) for part in error["loc"]).upper()
            message = str(error["msg"]).removeprefix("Value error, ")
            print(f"llm-infra-mcp: setting LLM_INFRA_MCP_{field}: {message}", file=sys.stderr)
        raise SystemExit(2) from None
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
        serve_http(
            server,
            host,
            port,
            token,
            body_timeout_s=settings.http_body_timeout_s,
            token_file=settings.home / "http-token",  # made only where the peer's user cannot be told (not Linux)
        )
    except TransportConfigError as exc:
        print(f"llm-infra-mcp: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
