"""The job engine as MCP tasks (io.modelcontextprotocol/tasks, SEP-2663) and job resource subscriptions, over a real
stdio session and a real streamable HTTP session of the test suite (every real part plus the test job kinds).

The client side of the extension is written here on the SDK's own extension API (a ClientExtension that claims
resultType "task", and tasks/get, tasks/update, tasks/cancel sent with ClientSession.send_request): the SDK 2.3
client has no tasks runtime. The same tool calls are made by a client that does not declare the extension, which
must see exactly what it saw before. Each test stops what it starts: the client's server process, and every job
still active at the end (cancelled through the state directory's engine).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim, advertise
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp.types import (
    CallToolResult,
    Request,
    RequestParams,
    ResourceUpdatedNotification,
    Result,
)
from pydantic import ConfigDict, Field

from servers.core import sdk
from servers.core.jobs import JOB_ID_PATTERN, JobKind
from servers.core.jobstore import JobRecord, JobState
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from servers.core.tasks import TASKS_EXTENSION, poll_interval_ms, task_handle
from tests.conftest import CHILD_ENV, PYTHON, REPO_ROOT, server_env
from tests.test_http import serving

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

TEST_SUITE_OWNER = "test-suite"  # build_server names the test suite's App after it: its jobs are this owner's
SERVE_STDIO = (
    "from servers.core.transport import serve_stdio; from tests.helpers import create_test_suite; "
    "serve_stdio(create_test_suite())"
)
SERVE_HTTP = (
    "import sys; from servers.core.transport import serve_http; from tests.helpers import create_test_suite; "
    "serve_http(create_test_suite(), '127.0.0.1', int(sys.argv[1]), None)"
)
MISSING_CAPABILITY = -32021
INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
TASK_FIELDS = {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs"}
STATUSES = {"working", "input_required", "completed", "failed", "cancelled"}
POLL_CAP_S = 1.0  # the tests honour pollIntervalMs up to this, to stay quick


# ---- the client side of the extension -------------------------------------------------------------------------------


class TaskParams(RequestParams):
    task_id: str


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict)


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"  # SEP-2663: Mcp-Name carries the task id over streamable HTTP


class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class Raw(Result):
    """Any result, every wire field kept (in model_extra, by wire name)."""

    model_config = ConfigDict(extra="allow")


class CreateTaskResult(Result):
    """CreateTaskResult = Result & Task, resultType "task" (ext-tasks schema/draft/schema.ts); every field kept."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"]
    task_id: str
    status: str


def wire(result: Result) -> dict[str, Any]:
    """A result as it came over the wire (nulls kept)."""
    return result.model_dump(by_alias=True, mode="json")


async def tasks_request(session: Any, request: Request[Any, Any]) -> dict[str, Any]:
    return wire(await session.send_request(request, Raw))


async def get_task(session: Any, task_id: str) -> dict[str, Any]:
    return await tasks_request(session, GetTask(params=TaskParams(task_id=task_id)))


async def poll_until_done(session: Any, task_id: str, limit_s: float = 150) -> tuple[dict[str, Any], list[str]]:
    """tasks/get, honouring pollIntervalMs (up to POLL_CAP_S), until the task is terminal; (last, statuses seen)."""
    seen: list[str] = []
    with anyio.fail_after(limit_s):
        while True:
            task = await get_task(session, task_id)
            check_task(task, task_id)
            seen.append(task["status"])
            if task["status"] in ("completed", "failed", "cancelled"):
                return task, seen
            await anyio.sleep(min(POLL_CAP_S, task["pollIntervalMs"] / 1000))


async def resolve_by_polling(created: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
    """What an SDK that drives tasks transparently does: poll to the end, hand back the tool's result."""
    task, _ = await poll_until_done(ctx.session, created.task_id)
    if task["status"] != "completed":
        raise RuntimeError(f"task {created.task_id} ended {task['status']}: {task.get('statusMessage')}")
    return CallToolResult.model_validate(task["result"])


class TasksClientExtension(ClientExtension):
    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=resolve_by_polling)]


def check_task(task: dict[str, Any], task_id: str) -> None:
    """The Task fields every task answer carries (ext-tasks schema: Task)."""
    assert TASK_FIELDS <= set(task), sorted(task)
    assert task["taskId"] == task_id and task["status"] in STATUSES
    assert task["ttlMs"] is None  # the engine keeps jobs: no expiry
    assert isinstance(task["pollIntervalMs"], int) and task["pollIntervalMs"] > 0
    for key in ("createdAt", "lastUpdatedAt"):
        assert time.time() - 3600 < _parse_iso(task[key]) <= time.time() + 5, task[key]
    assert "ttl" not in task and "pollInterval" not in task and "requestState" not in task
    if task["status"] == "completed":
        assert isinstance(task["result"], dict) and "error" not in task
    else:
        assert "result" not in task


def _parse_iso(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


# ---- servers over stdio and streamable HTTP -------------------------------------------------------------------------


class Transport:
    """One way to reach the test suite: `connect` opens a client session (a new server process for stdio; the
    one HTTP server for http)."""

    def __init__(self, name: str, home: Path, url: str | None = None) -> None:
        self.name = name
        self.home = home
        self.url = url

    @asynccontextmanager
    async def connect(
        self, *, tasks: bool, mode: str = "auto", message_handler: Any = None, extensions: list[Any] | None = None
    ) -> AsyncIterator[Client]:
        target: Any
        if self.url is not None:
            target = self.url + "/mcp"
        else:
            target = StdioServerParameters(
                command=PYTHON, args=["-c", SERVE_STDIO], env=server_env(self.home), cwd=str(REPO_ROOT)
            )
        if extensions is None and tasks:
            extensions = [TasksClientExtension()]
        async with Client(
            target, mode=mode, extensions=extensions, message_handler=message_handler, read_timeout_seconds=120
        ) as client:
            yield client


@contextmanager
def http_test_suite(home: Path, log_dir: Path) -> Iterator[str]:
    with serving(lambda port: [PYTHON, "-c", SERVE_HTTP, str(port)], server_env(home), log_dir) as url:
        yield url


def cancel_leftovers(home: Path) -> None:
    """End every job still active in `home` (the servers are gone by now; their jobs are not)."""
    if not (home / "state.db").exists() and not (home / "jobs").exists():
        return
    engine = App(Settings(home=home, cancel_grace_s=1.0), owner=TEST_SUITE_OWNER, child_env=CHILD_ENV).engine
    for record in engine.reconcile_all():
        engine.cancel(record.id)


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest, home: Path, tmp_path: Path) -> Iterator[Transport]:
    try:
        if request.param == "stdio":
            yield Transport("stdio", home)
        else:
            with http_test_suite(home, tmp_path) as url:
                yield Transport("http", home, url)
    finally:
        cancel_leftovers(home)


# ---- helpers for the tools ------------------------------------------------------------------------------------------


async def tool_args(client: Client, tool: str, fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """`fields` as the tool takes them: under `spec` when its input schema has one, else flat."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    properties = tools[tool].input_schema.get("properties", {})
    return {"spec": fields, **extra} if "spec" in properties and "spec" not in fields else {**fields, **extra}


GEMM = {"m": 32, "n": 32, "k": 32, "dtype": "fp32", "device": "cpu", "warmup": 1, "iters": 3}


def training(steps: int, **extra: Any) -> dict[str, Any]:
    return {"recipe": "tiny-gpt", "args": ["--steps", str(steps)], "nproc_per_node": 1, **extra}


async def start_task(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tools/call that must answer with a task; the CreateTaskResult as it came over the wire."""
    created = await client.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(created, CreateTaskResult), created
    task = wire(created)
    assert task["resultType"] == "task" and "task" not in task  # flat Result & Task, no wrapper
    check_task(task, task["taskId"])
    assert task["status"] in ("working", "completed", "cancelled")
    return task


async def call_ok(client: Client, tool: str, arguments: dict[str, Any]) -> CallToolResult:
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult) and not result.is_error, result.content
    return result


async def expect_error(code: int, request: Any) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await request
    assert caught.value.code == code, (caught.value.code, caught.value.message)
    return caught.value


# ---- tests ----------------------------------------------------------------------------------------------------------


async def test_a_client_without_the_extension_sees_no_change(transport: Transport) -> None:
    async with transport.connect(tasks=True) as with_tasks:
        listed_with = [t.model_dump(mode="json") for t in (await with_tasks.list_tools()).tools]
        caps = with_tasks.session.server_capabilities
        assert caps is not None and caps.extensions is not None and TASKS_EXTENSION in caps.extensions
    async with transport.connect(tasks=False) as plain:
        listed_without = [t.model_dump(mode="json") for t in (await plain.list_tools()).tools]
        assert listed_with == listed_without
        handle = await call_ok(plain, "benchmark_gemm", await tool_args(plain, "benchmark_gemm", GEMM, wait_s=0))
        view = handle.structured_content
        assert view is not None and task_handle(view) == ("job", view["job_id"]) and not view["finished"]
        # the task methods refuse a request that did not declare the extension (SEP-2663: -32021)
        error = await expect_error(MISSING_CAPABILITY, get_task(plain.session, view["job_id"]))
        assert (error.data or {}).get("requiredCapabilities") == {"extensions": {TASKS_EXTENSION: {}}}
        await expect_error(MISSING_CAPABILITY, tasks_request(plain.session, CancelTask(params=TaskParams(task_id="x"))))
        waited = await call_ok(plain, "wait_for_job", {"job_id": view["job_id"], "wait_s": 45})
        assert waited.structured_content["job"]["state"] == "SUCCEEDED"
    # the handshake era has no such extension (SEP-2663): a client declaring it in initialize gets the job handle
    async with transport.connect(tasks=True, mode="legacy", extensions=[advertise(TASKS_EXTENSION)]) as legacy:
        assert legacy.protocol_version == "2025-11-25"
        handle = await call_ok(legacy, "benchmark_gemm", await tool_args(legacy, "benchmark_gemm", GEMM, wait_s=0))
        assert handle.structured_content["finished"] is False
        await expect_error(METHOD_NOT_FOUND, get_task(legacy.session, handle.structured_content["job_id"]))


async def test_a_benchmark_is_a_task_followed_to_its_result(transport: Transport) -> None:
    async with transport.connect(tasks=True) as client:
        arguments = await tool_args(client, "benchmark_gemm", GEMM, wait_s=0)
        created = await start_task(client, "benchmark_gemm", arguments)
        task_id = created["taskId"]
        assert re.fullmatch(JOB_ID_PATTERN, task_id) and task_id.startswith("gemm_benchmark-")
        meta = created["_meta"]["llm-infra-mcp/job"]
        assert meta["jobId"] == task_id and meta["resourceUri"] == f"infra://jobs/{task_id}"
        # durably created: the job exists as the task does, and tasks/get answers at once
        job = (await call_ok(client, "get_job", {"job_id": task_id})).structured_content
        assert job["kind"] == "gemm_benchmark"
        done, seen = await poll_until_done(client.session, task_id)
        assert done["status"] == "completed" and done["resultType"] == "complete", done
        assert set(seen) <= {"working", "completed"}
        result = CallToolResult.model_validate(done["result"])
        assert not result.is_error and result.content[0].type == "text" and task_id in result.content[0].text
        view = result.structured_content
        assert view["state"] == "SUCCEEDED" and view["finished"] and view["result"]["median_ms"] > 0
        # the same structured content as wait_for_job's job and get_job
        waited = await call_ok(client, "wait_for_job", {"job_id": task_id, "wait_s": 1})
        assert view == waited.structured_content["job"]
        assert view == (await call_ok(client, "get_job", {"job_id": task_id})).structured_content
        # tasks/get is a pure read: asked again, the same answer
        again = await get_task(client.session, task_id)
        assert again["result"] == done["result"] and again["status"] == "completed"

        # the way an SDK drives tasks transparently: tools/call answers, in the end, with the tool's result
        final = await client.call_tool("benchmark_gemm", arguments)
        assert not final.is_error and final.structured_content["state"] == "SUCCEEDED"
        assert final.structured_content["job_id"] != task_id
        # work that ends within wait_s answers directly, as without the extension (the SEP's immediate result)
        direct = await client.session.call_tool("benchmark_gemm", {**arguments, "wait_s": 45}, allow_claimed=True)
        assert isinstance(direct, CallToolResult) and direct.structured_content["state"] == "SUCCEEDED"
        # tools that do not start jobs are untouched
        assert not isinstance(
            await client.session.call_tool("get_job", {"job_id": task_id}, allow_claimed=True), CreateTaskResult
        )


async def test_a_training_job_is_a_task_followed_to_its_result(transport: Transport) -> None:
    async with transport.connect(tasks=True) as client:
        created = await start_task(client, "submit_training_job", {"spec": training(4), "wait_s": 0})
        task_id = created["taskId"]
        assert task_id.startswith("training-") and created["pollIntervalMs"] == 2000
        done, seen = await poll_until_done(client.session, task_id, limit_s=160)
        assert done["status"] == "completed", done
        view = done["result"]["structuredContent"]
        assert view["state"] == "SUCCEEDED" and view["kind"] == "training" and done["result"]["isError"] is False
        assert view == (await call_ok(client, "get_job", {"job_id": task_id})).structured_content
        metrics = (await call_ok(client, "read_job_metrics", {"job_id": task_id})).structured_content
        assert metrics["rows"], metrics
        assert set(seen) <= {"working", "completed"}


async def test_tasks_cancel_ends_a_running_job(transport: Transport) -> None:
    async with transport.connect(tasks=True) as client:
        created = await start_task(
            client, "start_test_job", {"kind": "test_count", "spec": {"steps": 600, "step_s": 0.1}, "wait_s": 0}
        )
        task_id = created["taskId"]
        with anyio.fail_after(60):  # until it runs and reports progress
            while True:
                task = await get_task(client.session, task_id)
                if "progress" in task["statusMessage"]:
                    break
                await anyio.sleep(0.2)
        assert task["status"] == "working" and task["statusMessage"].startswith("RUNNING")
        progress = task["_meta"]["llm-infra-mcp/job"]["progress"]
        assert progress["total"] == 600 and progress["done"] >= 1
        # tasks/update: these tasks never wait for input, so the responses answer nothing outstanding: an ack
        ack = await tasks_request(client.session, UpdateTask(params=UpdateParams(task_id=task_id, input_responses={})))
        assert ack["resultType"] == "complete" and set(ack) - {"_meta"} == {"resultType"}
        ack = await tasks_request(client.session, CancelTask(params=TaskParams(task_id=task_id)))
        assert ack["resultType"] == "complete" and set(ack) - {"_meta"} == {"resultType"}
        done, _ = await poll_until_done(client.session, task_id, limit_s=30)
        assert done["status"] == "cancelled" and "result" not in done
        job = (await call_ok(client, "get_job", {"job_id": task_id})).structured_content
        assert job["state"] == "CANCELLED"
        # cancelling an ended task is the same ack; an unknown task is -32602 for all three methods
        ack = await tasks_request(client.session, CancelTask(params=TaskParams(task_id=task_id)))
        assert ack["resultType"] == "complete"
        for request in (
            GetTask(params=TaskParams(task_id="training-20990101-000000-abcdef")),
            CancelTask(params=TaskParams(task_id="no such task")),
            UpdateTask(params=UpdateParams(task_id="sweep-0123456789abcdef")),
        ):
            error = await expect_error(INVALID_PARAMS, tasks_request(client.session, request))
            assert error.message.startswith("Failed to retrieve task")
        # a training job (torchrun and its ranks): cancelled once it runs
        created = await start_task(client, "submit_training_job", {"spec": training(100_000), "wait_s": 0})
        training_id = created["taskId"]
        with anyio.fail_after(90):
            while not (await get_task(client.session, training_id))["statusMessage"].startswith("RUNNING"):
                await anyio.sleep(0.3)
        await tasks_request(client.session, CancelTask(params=TaskParams(task_id=training_id)))
        done, _ = await poll_until_done(client.session, training_id, limit_s=30)
        assert done["status"] == "cancelled" and done["_meta"]["llm-infra-mcp/job"]["state"] == "CANCELLED"
    events = [json.loads(line) for line in (transport.home / "audit.jsonl").read_text().splitlines()]
    for job_id in (task_id, training_id):
        assert any(e["event"] == "cancel" and e["job_id"] == job_id and e.get("via") == "tasks/cancel" for e in events)


async def test_a_failed_job_is_a_completed_task_with_an_error_result(transport: Transport) -> None:
    async with transport.connect(tasks=True) as client:
        created = await start_task(client, "start_test_job", {"kind": "test_fail", "spec": {"raise": True}})
        done, _ = await poll_until_done(client.session, created["taskId"], limit_s=60)
        # SEP-2663: `failed` is for JSON-RPC errors; a tool's own failure completes with isError
        assert done["status"] == "completed" and done["result"]["isError"] is True
        assert done["result"]["structuredContent"]["state"] == "FAILED"
        assert "NaN" in done["statusMessage"] and "NaN" in done["result"]["content"][0]["text"]


async def test_a_task_outlives_the_server_that_made_it(home: Path) -> None:
    stdio = Transport("stdio", home)
    try:
        async with stdio.connect(tasks=True) as first:
            created = await start_task(
                first, "start_test_job", {"kind": "test_count", "spec": {"steps": 20, "step_s": 0.1}}
            )
        async with stdio.connect(tasks=True) as second:  # a new server process on the same state directory
            done, _ = await poll_until_done(second.session, created["taskId"], limit_s=60)
            assert done["status"] == "completed" and done["result"]["structuredContent"]["result"]["steps"] == 20
            assert done["createdAt"] == created["createdAt"]
    finally:
        cancel_leftovers(home)


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
async def test_subscribers_learn_of_each_state_change_handshake_era(transport: Transport) -> None:
    send, receive = anyio.create_memory_object_stream[str](100)

    async def on_message(message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            send.send_nowait(str(message.params.uri))

    async with transport.connect(tasks=False, mode="legacy", message_handler=on_message) as client:
        caps = client.session.server_capabilities
        assert caps is not None and caps.resources is not None and caps.resources.subscribe is True
        start = {"kind": "test_count", "spec": {"steps": 15, "step_s": 0.1}, "wait_s": 0}
        job = (await call_ok(client, "start_test_job", start)).structured_content
        uri = job["resource_uri"]
        await client.session.subscribe_resource(uri)
        await client.session.subscribe_resource("infra://gpus.json")  # a static resource: accepted, never changes
        states: list[str] = []
        with anyio.fail_after(60):
            async for updated in receive:  # each notification: read the resource again, as a client would
                assert updated == uri
                states.append(json.loads((await client.read_resource(uri)).contents[0].text)["state"])
                if states[-1] == "SUCCEEDED":
                    break
        # one notification per change after the subscription (at most STARTING -> RUNNING -> SUCCEEDED)
        assert 1 <= len(states) <= 3 and states[-1] == "SUCCEEDED", states
        await client.session.unsubscribe_resource(uri)
        await client.session.unsubscribe_resource("infra://gpus.json")
        second = (
            await call_ok(client, "start_test_job", {**start, "spec": {"steps": 2}, "wait_s": 20})
        ).structured_content
        assert second["finished"]
        await client.session.subscribe_resource(second["resource_uri"])  # an ended job: nothing more to say
        await anyio.sleep(1.5)
        with pytest.raises(anyio.WouldBlock):  # nobody subscribed to a job that changed: no notification
            receive.receive_nowait()


async def test_listeners_learn_of_each_state_change_stateless_era(transport: Transport) -> None:
    async with transport.connect(tasks=True) as client:
        created = await start_task(
            client, "start_test_job", {"kind": "test_count", "spec": {"steps": 15, "step_s": 0.1}, "wait_s": 0}
        )
        uri = f"infra://jobs/{created['taskId']}"
        seen: list[str] = []
        with anyio.fail_after(60):
            async with client.listen(resource_subscriptions=[uri]) as subscription:
                assert subscription.honored.resource_subscriptions == [uri]
                async for event in subscription:
                    assert isinstance(event, ResourceUpdated) and event.uri == uri
                    state = json.loads((await client.read_resource(uri)).contents[0].text)["state"]
                    seen.append(state)
                    if state == "SUCCEEDED":
                        break
        assert seen[-1] == "SUCCEEDED"


# ---- in process: which tools answer with tasks, and sweeps ----------------------------------------------------------


JOB_STARTING_TOOLS = {
    "benchmark_gemm",
    "benchmark_collective",
    "tune_overlap",
    "run_dcgm_diag",
    "check_collective_bandwidth",
    "run_network_probes",
    "submit_training_job",
    "submit_sweep",
    "start_test_job",
}


async def test_the_tools_that_answer_with_tasks_are_the_ones_that_start_jobs(app: App) -> None:
    """A tool answers with a task when it is neither read-only nor destructive and answers with a job handle: that
    is exactly the tools that start jobs (this catches a new job-starting tool, and a tool that changed)."""
    from tests.helpers import create_test_suite

    server = create_test_suite(app)
    starting = set()
    for tool in sdk.list_tools(server):
        hints = tool.annotations
        title = (tool.fn_metadata.output_schema or {}).get("title")
        if hints.read_only_hint is False and hints.destructive_hint is False and title in ("JobView", "SweepSubmitted"):
            starting.add(tool.name)
    assert starting == JOB_STARTING_TOOLS


async def test_a_sweep_is_one_task_in_process(app: App) -> None:
    from tests.helpers import create_test_suite

    async with Client(create_test_suite(app), extensions=[TasksClientExtension()]) as client:
        assert client.protocol_version == "2026-07-28"
        variants = [["--lr", "0.01"], ["--lr", "0.02"]]
        plan = await call_ok(client, "plan_sweep", {"spec": training(2), "variants": variants})
        token = plan.structured_content["sweep_token"]
        created = await start_task(client, "submit_sweep", {"sweep_token": token})
        assert created["taskId"] == plan.structured_content["sweep_id"]
        job_ids = created["_meta"]["llm-infra-mcp/job"]["jobIds"]
        assert len(job_ids) == 2
        done, _ = await poll_until_done(client.session, created["taskId"], limit_s=160)
        assert done["status"] == "completed" and done["result"]["isError"] is False, done
        submitted = done["result"]["structuredContent"]
        assert submitted["sweep_id"] == created["taskId"] and submitted["job_ids"] == job_ids
        assert "2/2 runs done" in done["statusMessage"]
        # a sweep's tasks/cancel cancels every run still active
        long_plan = await call_ok(client, "plan_sweep", {"spec": training(100_000), "variants": variants})
        long_task = await start_task(
            client, "submit_sweep", {"sweep_token": long_plan.structured_content["sweep_token"]}
        )
        await tasks_request(client.session, CancelTask(params=TaskParams(task_id=long_task["taskId"])))
        cancelled, _ = await poll_until_done(client.session, long_task["taskId"], limit_s=30)
        assert cancelled["status"] == "cancelled" and cancelled["_meta"]["llm-infra-mcp/job"]["states"] == {
            "CANCELLED": 2
        }
    # without the extension the same submit (idempotent) answers with its ids, as before
    async with Client(create_test_suite(app)) as plain:
        again = await call_ok(plain, "submit_sweep", {"sweep_token": token})
        assert again.structured_content["job_ids"] == job_ids


@pytest.mark.timeout(30)
async def test_the_task_methods_only_exist_in_the_stateless_era(app: App) -> None:
    from tests.helpers import create_test_suite

    async with Client(create_test_suite(app), mode="legacy") as legacy:
        caps = legacy.session.server_capabilities
        assert caps is not None and caps.resources is not None and caps.resources.subscribe is True
        await expect_error(METHOD_NOT_FOUND, get_task(legacy.session, "anything"))
    # a server that runs no jobs offers neither tasks nor subscriptions
    from servers.scaling.server import create_server

    async with Client(create_server(app), mode="legacy") as scaling:
        caps = scaling.session.server_capabilities
        assert caps is not None and not caps.extensions
        assert caps.resources is not None and not caps.resources.subscribe


# ---- issue 21, defect 10: subscriptions to jobs that do not exist, caps, and the watcher at rest --------------------


def job_watcher(server: Any) -> Any:
    """The JobWatcher a server of the suite observes subscriptions/listen with (its listen middleware's owner)."""
    from servers.core.tasks import JobWatcher

    for middleware in server.middleware:
        owner = getattr(middleware, "__self__", None)
        if isinstance(owner, JobWatcher):
            return owner
    raise AssertionError("the server has no JobWatcher")


@contextmanager
def suite_over_http(app: App) -> Iterator[tuple[str, Any]]:
    """The test suite served over streamable HTTP by uvicorn in a thread of this process (so that the test can look
    at its watcher); yields (the /mcp URL, the watcher)."""
    from servers.core.transport import http_app
    from tests.helpers import create_test_suite
    from tests.test_http import uvicorn_in_thread

    server = create_test_suite(app)
    with uvicorn_in_thread(http_app(server, "127.0.0.1", None)) as port:
        yield f"http://127.0.0.1:{port}/mcp", job_watcher(server)


async def eventually(check: Any, limit_s: float = 10) -> None:
    with anyio.fail_after(limit_s):
        while not check():
            await anyio.sleep(0.05)


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
async def test_subscriptions_to_jobs_that_do_not_exist_are_refused_and_the_watcher_rests(app: App) -> None:
    """The reviewer's reproduction, scaled down: many sessions subscribing to infra://jobs/fake-* kept the watcher
    polling them forever. Each is refused now (-32602, the job unknown), nothing is held, and the watcher is not
    running once the clients go idle."""
    sessions, fakes = 10, 20
    with suite_over_http(app) as (url, watcher):
        refused: list[str] = []

        async def subscriber(i: int) -> None:
            async with Client(url, mode="legacy") as client:
                for j in range(fakes):
                    error = await expect_error(
                        INVALID_PARAMS, client.session.subscribe_resource(f"infra://jobs/fake-{i}-{j}")
                    )
                    refused.append(error.message)
                await anyio.sleep(1.0)  # idle, still connected: nothing may be polled meanwhile
                assert not watcher.watching and watcher.held() == 0

        async with anyio.create_task_group() as group:
            for i in range(sessions):
                group.start_soon(subscriber, i)
        assert len(refused) == sessions * fakes
        assert all(re.search(r"^uri: no job 'fake-\d+-\d+' here; .*list_jobs", m) for m in refused), refused[:3]
        # 2026-07-28: a listen stream naming a job that does not exist is refused the same way
        async with Client(url) as modern:
            with pytest.raises(MCPError) as caught:
                async with modern.listen(resource_subscriptions=["infra://jobs/fake-listen"]):
                    pass
            assert caught.value.code == INVALID_PARAMS and "fake-listen" in caught.value.message
        assert watcher.held() == 0 and not watcher.watching and not watcher._states


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
async def test_the_watcher_stops_when_the_job_ends_and_the_subscription_goes_with_its_session(app: App) -> None:
    with suite_over_http(app) as (url, watcher):
        async with Client(url, mode="legacy") as client:
            start = {"kind": "test_count", "spec": {"steps": 5, "step_s": 0.1}, "wait_s": 0}
            job = (await call_ok(client, "start_test_job", start)).structured_content
            await client.session.subscribe_resource(job["resource_uri"])
            assert watcher.held() == 1
            await call_ok(client, "wait_for_job", {"job_id": job["job_id"], "wait_s": 45})
            await eventually(lambda: not watcher.watching)  # the job ended: nothing left to poll
            assert watcher.held() == 1  # still subscribed, and nothing is polled for it
        await eventually(lambda: watcher.held() == 0)  # the session ended: its subscriptions with it
        assert not watcher._states


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
async def test_subscriptions_are_capped_per_connection_and_in_total(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    from servers.core import tasks

    monkeypatch.setattr(tasks, "MAX_SUBSCRIPTIONS_PER_CONNECTION", 2)
    monkeypatch.setattr(tasks, "MAX_SUBSCRIPTIONS", 3)
    static = ["infra://gpus.json", "infra://xid-catalog.json"]
    with suite_over_http(app) as (url, watcher):
        async with Client(url, mode="legacy") as first, Client(url, mode="legacy") as second:
            job = (
                await call_ok(first, "start_test_job", {"kind": "test_count", "spec": {"steps": 1}, "wait_s": 20})
            ).structured_content
            for uri in static:
                await first.session.subscribe_resource(uri)
            await first.session.subscribe_resource(static[0])  # again: still one subscription
            error = await expect_error(INVALID_PARAMS, first.session.subscribe_resource(job["resource_uri"]))
            assert "this connection holds 2 subscriptions" in error.message
            await second.session.subscribe_resource(static[0])
            error = await expect_error(INVALID_PARAMS, second.session.subscribe_resource(job["resource_uri"]))
            assert "the server holds 3 subscriptions" in error.message
            assert watcher.held() == 3
            await first.session.unsubscribe_resource(static[1])
            await second.session.subscribe_resource(job["resource_uri"])  # room again
            assert watcher.held() == 3
        async with Client(url) as modern:  # a listen request naming more than a connection may hold
            with pytest.raises(MCPError) as caught:
                async with modern.listen(resource_subscriptions=[*static, job["resource_uri"]]):
                    pass
            assert caught.value.code == INVALID_PARAMS and "2 at most" in caught.value.message
        await eventually(lambda: watcher.held() == 0)


def _record(kind: str, spec: dict[str, Any]) -> JobRecord:
    return JobRecord(
        id="job-1", kind=kind, spec=spec, state=JobState.RUNNING, created_at=0.0, timeout_s=60.0, owner="t", job_dir="/"
    )


@pytest.mark.parametrize(
    ("kind", "spec", "expected_ms"),
    [
        ("training_remote", {"backend": "kubernetes"}, 2000),
        ("training_remote", {"backend": "skypilot"}, 10000),
        ("training_remote", {"backend": "slurm"}, 1000),
        ("training_remote", {"backend": "ray"}, 500),  # Ray's 0.25 s, raised to the least the server tells
        ("training_remote", {"backend": "no-such-engine"}, 1000),  # the default, no crash
        ("training_remote", {"backend": ["kubernetes"]}, 1000),
        ("training_remote", {}, 1000),
        ("training", {"training_spec": {"backend": "local"}}, 2000),
        ("overlap_tune", {}, 5000),
        ("dcgm_diag", {}, 5000),
        ("bandwidth_check_cluster", {}, 5000),
        ("gemm_benchmark", {}, 1000),  # declares nothing: the default
        ("a_kind_not_served_here", {}, 1000),
    ],
)
async def test_a_tasks_poll_interval_is_what_its_job_kind_declares(
    app: App, kind: str, spec: dict[str, Any], expected_ms: int
) -> None:
    """pollIntervalMs comes from the job's kind (the servers declare theirs on their JobKinds); a cluster job's from
    its backend in the engines' registry, so a Kubernetes or SkyPilot task is not told to ask every second."""
    from servers.diagnostics.server import JOB_KINDS as DIAGNOSTICS
    from servers.engines import registry
    from servers.launch.server import JOB_KINDS as LAUNCH
    from servers.overlap.server import JOB_KINDS as OVERLAP

    for job_kind in [*LAUNCH, *OVERLAP, *DIAGNOSTICS]:
        app.add_job_kind(job_kind)
    assert poll_interval_ms(app, _record(kind, spec)) == expected_ms
    backend = spec.get("backend")
    if kind == "training_remote" and isinstance(backend, str) and backend in registry.names():
        assert expected_ms == round(max(0.5, registry.get(backend).poll_s) * 1000)


async def test_a_kind_whose_interval_function_fails_falls_back_to_its_own(app: App) -> None:
    def broken(spec: Any) -> float:
        raise KeyError("backend")

    app.add_job_kind(JobKind("k1", "m:f", "d", poll_s=3.0, poll_s_of=broken))
    app.add_job_kind(JobKind("k2", "m:f", "d", poll_s_of=lambda spec: float("nan")))
    app.add_job_kind(JobKind("k3", "m:f", "d", poll_s_of=lambda spec: spec["seconds"]))
    assert poll_interval_ms(app, _record("k1", {})) == 3000
    assert poll_interval_ms(app, _record("k2", {})) == 1000
    assert poll_interval_ms(app, _record("k3", {"seconds": 7})) == 7000
    assert poll_interval_ms(app, _record("k3", {"seconds": True})) == 1000
