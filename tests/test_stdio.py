"""Every server as a real subprocess over stdio; and a server killed with SIGKILL mid-job and restarted."""

import json
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from servers.cli import SERVER_NAMES
from tests.conftest import PYTHON, REPO_ROOT, server_env

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

EXPECTED_TOOLS = {
    "scaling": {"predict_scaling", "convert_compute_units"},
    "diagnostics": {"gpu_health"},
    "overlap": {"benchmark_gemm", "get_job", "wait_for_job", "cancel_job", "read_job_logs", "read_job_metrics"},
    "launch": {"list_backends", "get_job", "list_jobs"},
}


def stdio(args: list[str], home: Path) -> StdioServerParameters:
    return StdioServerParameters(command=PYTHON, args=args, env=server_env(home), cwd=str(REPO_ROOT))


@pytest.mark.parametrize("name", SERVER_NAMES)
async def test_each_server_serves_stdio(name: str, home: Path) -> None:
    async with Client(stdio(["-m", "servers.cli", "serve", name], home), mode="legacy") as client:
        assert client.server_info is not None and client.server_info.name == f"llm-infra-{name}"
        tools = {t.name: t for t in (await client.list_tools()).tools}
        if name != "suite":
            assert EXPECTED_TOOLS[name] <= set(tools)
        for tool in tools.values():
            assert tool.output_schema is not None and tool.annotations is not None, tool.name
        resources = {str(r.uri) for r in (await client.list_resources()).resources}
        assert "infra://gpus.json" in resources


@pytest.mark.parametrize(
    "module", ["servers.scaling", "servers.diagnostics", "servers.overlap", "servers.launch", "servers.suite"]
)
async def test_python_dash_m_serves_stdio(module: str, home: Path) -> None:
    async with Client(stdio(["-m", module], home), mode="legacy") as client:
        assert (await client.list_tools()).tools


async def test_suite_over_stdio_lists_every_tool_of_the_other_servers(home: Path) -> None:
    names: set[str] = set()
    for name in ("scaling", "diagnostics", "overlap", "launch"):
        async with Client(stdio(["-m", "servers.cli", "serve", name], home), mode="legacy") as client:
            names |= {t.name for t in (await client.list_tools()).tools}
    async with Client(stdio(["-m", "servers.cli", "serve", "suite"], home), mode="legacy") as client:
        suite = {t.name: t for t in (await client.list_tools()).tools}
    assert set(suite) == names
    for tool in suite.values():
        hints = tool.annotations
        assert tool.output_schema and hints and hints.read_only_hint is not None and hints.open_world_hint is not None


# ---- SIGKILL of the server mid-job, then a restart ----------------------------------------------------------


@asynccontextmanager
async def running_test_suite(home: Path) -> AsyncIterator[tuple[Client, int]]:
    """The test build of the suite over stdio; yields the client and the server's pid."""
    params = stdio(
        [
            "-c",
            "import os, sys; print(os.getpid(), file=open(sys.argv[1], 'w'), flush=True); "
            "from tests.helpers import create_test_suite; create_test_suite().run()",
            str(home.parent / "server.pid"),
        ],
        home,
    )
    async with Client(params, mode="legacy") as client:
        pid = int((home.parent / "server.pid").read_text())
        yield client, pid


async def start(client: Client, spec: dict) -> dict:
    result = await client.call_tool("start_test_job", {"kind": "test_sleep", "spec": spec})
    assert not result.is_error, result.content[0].text
    return result.structured_content


def kill_and_wait(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.05)


async def run_until_killed(home: Path, spec: dict) -> dict:
    """Start a job, then SIGKILL the server while the job runs. Returns the job as the server last saw it."""
    job: dict = {}
    killed = False
    try:
        async with running_test_suite(home) as (client, pid):
            job = await start(client, spec)
            for _ in range(400):  # until the work itself runs (it logs "sleeping" first)
                log = await client.call_tool("read_job_logs", {"job_id": job["job_id"]})
                if not log.is_error and "sleeping" in log.structured_content["text"]:
                    break
                await anyio.sleep(0.05)
            else:
                raise AssertionError("the job never started its work")
            kill_and_wait(pid)
            killed = True
            await client.list_tools()  # the server is gone: this fails
    except BaseException:  # the client sees its server die, in whatever form; anything before that is a failure
        if not killed:
            raise
    assert killed
    assert job
    return job


async def test_job_survives_a_sigkilled_server_and_is_tracked_after_restart(home: Path) -> None:
    job = await run_until_killed(home, {"seconds": 4})
    async with running_test_suite(home) as (client, _):
        current = (await client.call_tool("get_job", {"job_id": job["job_id"]})).structured_content
        assert current["state"] == "RUNNING"  # still tracked: its supervisor outlived the server
        waited = await client.call_tool("wait_for_job", {"job_id": job["job_id"], "wait_s": 30})
        assert waited.structured_content["job"]["state"] == "SUCCEEDED", waited.content[0].text
        assert waited.structured_content["job"]["result"] == {"slept": 4}


async def test_job_whose_processes_died_with_the_server_is_lost_after_restart(home: Path) -> None:
    job = await run_until_killed(home, {"seconds": 60})
    record = json.loads((home / "jobs" / job["job_id"] / "job.json").read_text())
    assert record["id"] == job["job_id"]
    import sqlite3

    with sqlite3.connect(home / "state.db") as db:
        supervisor, worker = db.execute(
            "SELECT supervisor_pid, worker_pid FROM jobs WHERE id = ?", (job["job_id"],)
        ).fetchone()
    os.killpg(supervisor, signal.SIGKILL)
    os.killpg(worker, signal.SIGKILL)
    kill_and_wait(supervisor)
    kill_and_wait(worker)
    async with running_test_suite(home) as (client, _):
        # the restarted server reconciled at start: the job is LOST, with a reason, and its log still readable
        listed = (await client.call_tool("list_jobs", {"state": "LOST", "detail": True})).structured_content
        assert [j["job_id"] for j in listed["jobs"]] == [job["job_id"]]
        assert "vanished without recording an exit" in listed["jobs"][0]["summary"]  # the row says why, in short
        assert "vanished without recording an exit" in listed["details"][0]["reason"]
        log = await client.call_tool("read_job_logs", {"job_id": job["job_id"]})
        assert not log.is_error and "sleeping" in log.structured_content["text"]


async def test_training_job_survives_a_sigkilled_launch_server(home: Path) -> None:
    """A torchrun job keeps running when the server dies; after a restart it is tracked, logs and metrics intact."""
    job: dict = {}
    killed = False
    try:
        async with running_test_suite(home) as (client, pid):
            result = await client.call_tool(
                "submit_training_job",
                {"spec": {"recipe": "tiny-gpt", "args": ["--steps", "150"], "nproc_per_node": 1}, "wait_s": 0},
            )
            assert not result.is_error, result.content[0].text
            job = result.structured_content
            for _ in range(600):  # until the run has logged metrics
                page = await client.call_tool("read_job_metrics", {"job_id": job["job_id"]})
                if page.structured_content and page.structured_content["rows"]:
                    break
                await anyio.sleep(0.1)
            else:
                raise AssertionError("the training job logged no metrics")
            kill_and_wait(pid)
            killed = True
            await client.list_tools()
    except BaseException:
        if not killed:
            raise
    async with running_test_suite(home) as (client, _):
        current = (await client.call_tool("get_job", {"job_id": job["job_id"]})).structured_content
        assert current["state"] in ("RUNNING", "SUCCEEDED")
        for _ in range(20):
            waited = await client.call_tool("wait_for_job", {"job_id": job["job_id"], "wait_s": 30})
            if waited.structured_content["job"]["finished"]:
                break
        final = waited.structured_content["job"]
        assert final["state"] == "SUCCEEDED", final["reason"]
        rows = (await client.call_tool("read_job_metrics", {"job_id": job["job_id"]})).structured_content["rows"]
        steps = [r["step"] for r in rows if r.get("step") is not None]
        assert steps and steps == sorted(steps)
        log = await client.call_tool("read_job_logs", {"job_id": job["job_id"], "process": "rank0"})
        assert not log.is_error
