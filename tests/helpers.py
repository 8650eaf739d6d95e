"""A test build of the suite: every real part plus test job kinds and a tool to start them.

Also runnable as a stdio server (`python -m tests.helpers`), for the tests that kill and restart a server.
"""

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from servers.core.assemble import ServerPart, build_server
from servers.core.job_tools import WaitS, run_job, summarize_job
from servers.core.jobview import JobView
from servers.core.mcp_layer import App, agent_tool, tool_result
from servers.suite import PARTS
from tests.jobkinds import TEST_KINDS


def register_test_tools(server: MCPServer, app: App) -> None:
    @agent_tool(
        server, title="Start a test job", read_only=False, destructive=False, idempotent=False, open_world=False
    )
    async def start_test_job(
        ctx: Context,
        kind: Literal["test_count", "test_fail", "test_sleep", "test_crash", "test_curve", "test_big"],
        spec: Annotated[dict[str, Any], Field(description="Spec for the test work function")],
        wait_s: WaitS = 0,
        timeout_s: Annotated[float | None, Field(gt=0, le=3600, description="Wall-time limit")] = None,
    ) -> Annotated[CallToolResult, JobView]:
        """Start one of the job-engine test kinds (count, fail, sleep, crash) with a spec; only in the test
        build of the suite. Returns the job view after waiting up to wait_s."""
        view = await run_job(app, kind, spec, wait_s=wait_s, ctx=ctx, timeout_s=timeout_s)
        return tool_result(view, summarize_job(view))


TEST_PART = ServerPart(
    name="test", instructions="test jobs", register=register_test_tools, job_kinds=TEST_KINDS, starts_jobs=True
)


def create_test_suite(app: App | None = None) -> MCPServer:
    return build_server("test-suite", "the suite plus test job kinds", [*PARTS, TEST_PART], app)


async def call_ok(client: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """Call a tool that must succeed; its structured content (a readable summary must come with it)."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content[0].text
    assert result.content[0].type == "text" and result.content[0].text
    return result.structured_content


async def call_error(client: Any, tool: str, args: dict[str, Any]) -> str:
    """Call a tool that must refuse; its error text (readable: no traceback)."""
    result = await client.call_tool(tool, args)
    assert result.is_error, f"{tool} accepted {str(args)[:200]}"
    text = result.content[0].text
    assert "Traceback" not in text
    return text


if __name__ == "__main__":
    create_test_suite().run()


async def finish_job(client: Any, job_id: str, limit_s: float = 240) -> dict[str, Any]:
    """Wait (through wait_for_job, 30 s at a time) until a job ends; its view. Fails the test after limit_s."""
    import time

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        waited = await call_ok(client, "wait_for_job", {"job_id": job_id, "wait_s": 30})
        if waited["job"]["finished"]:
            return waited["job"]
    raise AssertionError(f"job {job_id} did not finish in {limit_s} s")


def host_pids(ns_pids: list[int], marker: str) -> list[int]:
    """The host's pids of processes that a sandboxed job saw (and logged) as `ns_pids` in its own PID namespace: the
    processes whose command line holds `marker` and whose innermost pid (NSpid in /proc/PID/status) is one of them."""
    import re
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        nspid = re.search(r"^NSpid:\s*(.*)$", status, re.M)
        if marker in cmdline and nspid and int(nspid.group(1).split()[-1]) in ns_pids:
            found.append(int(entry.name))
    return found


def wandb_offline_env(root: Path) -> dict[str, str]:
    """The environment for a child process in which wandb writes an offline run under `root`: no network, no
    proxy, no git or code capture, and its config, cache and data folders (and HOME) inside `root`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and "proxy" not in k.lower()}
    env.update(
        WANDB_MODE="offline",
        WANDB_DIR=str(root),
        WANDB_SILENT="true",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
        WANDB_CONFIG_DIR=str(root / "config"),
        WANDB_CACHE_DIR=str(root / "cache"),
        WANDB_DATA_DIR=str(root / "data"),
        HOME=str(root),
    )
    return env
