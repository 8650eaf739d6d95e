"""Training on Ray through the MCP tools: the launch server plans through the Ray backend, a job of the engine here
follows the Ray job (its state, its rank logs and metrics in the job folder), and a cancel stops it on Ray. Against
the session's real local Ray head (tests/conftest.py `ray_head`)."""

from typing import Any

import pytest
from mcp import Client

from servers.core.mcp_layer import App
from servers.core.settings import Settings
from tests.conftest import CHILD_ENV
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]
SMALL_GRPO = ["--steps", "200", "--evals", "5", "--eval-size", "256"]


def ray_app(settings: Settings, ray_head: Any, monkeypatch: pytest.MonkeyPatch) -> App:
    monkeypatch.setenv("RAY_AUTH_TOKEN", ray_head.token)  # the server's own calls (list_backends) need it too
    configured = settings.model_copy(update={"ray_address": ray_head.address})
    return App(configured, owner="test", child_env={**CHILD_ENV, "RAY_AUTH_TOKEN": ray_head.token})


async def test_tiny_grpo_on_ray_through_the_tools(
    settings: Settings, ray_head: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = ray_app(settings, ray_head, monkeypatch)
    spec = {"recipe": "tiny-grpo", "args": SMALL_GRPO, "nproc_per_node": 1, "backend": "ray"}
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await ok(client, "plan_training_job", {"spec": spec})
        assert plan["backend"] == "ray" and "cluster" in plan["network"]
        job = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        done = await finish_job(client, job["job_id"], 240)
        assert done["state"] == "SUCCEEDED", done["reason"]
        assert done["result"]["backend"] == "ray" and done["result"]["native_state"] == "SUCCEEDED"
        rows = (await ok(client, "read_job_metrics", {"job_id": job["job_id"], "keys": ["pass_rate"]}))["rows"]
        assert any(r.get("pass_rate") is not None for r in rows)
        log = await ok(client, "read_job_logs", {"job_id": job["job_id"], "process": "rank0"})
        assert "eval pass rate" in log["text"]
        backends = {b["name"]: b for b in (await ok(client, "list_backends", {}))["backends"]}
        assert backends["ray"]["detected"] and backends["ray"]["launch_supported"]


async def test_a_ray_job_cancelled_through_the_tools_stops_on_ray(
    settings: Settings, ray_head: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = ray_app(settings, ray_head, monkeypatch)
    spec = {"recipe": "tiny-grpo", "args": ["--steps", "200000"], "nproc_per_node": 1, "backend": "ray"}
    async with Client(create_test_suite(app), mode="legacy") as client:
        job = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 8})
        assert not job["finished"], job["reason"]
        cancelled = await ok(client, "cancel_job", {"job_id": job["job_id"]})
        assert cancelled["state"] == "CANCELLED", cancelled["reason"]
    native = cancelled["result"] or {}
    assert not native  # a cancelled job has no result; the Ray job it followed was stopped:
    import time

    from servers.launch.ray_backend import JOB_DIR_METADATA

    def ours() -> dict[str, str]:
        """This job's Ray jobs (its folder in their metadata): the session's head holds other tests' too, e.g. a
        PENDING one Ray cannot stop (ray-project/ray#58353)."""
        return {
            j.submission_id: str(j.status)
            for j in ray_head.client().list_jobs()
            if job["job_id"] in str((j.metadata or {}).get(JOB_DIR_METADATA, ""))
        }

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # Ray ends the entrypoint after stop_job: give it the time it takes
        jobs = ours()
        if jobs and not any(status.endswith("RUNNING") or status.endswith("PENDING") for status in jobs.values()):
            break
        time.sleep(0.5)
    assert len(jobs) == 1 and all(status.endswith("STOPPED") for status in jobs.values()), jobs


async def test_ray_without_an_address_is_refused_clearly(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    app = App(settings, owner="test", child_env=CHILD_ENV)
    async with Client(create_test_suite(app), mode="legacy") as client:
        spec = {"recipe": "tiny-gpt", "backend": "ray", "nnodes": 2}
        assert "nnodes" in await error(client, "plan_training_job", {"spec": spec})
