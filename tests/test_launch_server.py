"""The launch tools in process, in both protocol eras: recipes run to completion through the MCP tools (tiny-gpt on
2 gloo ranks, tiny-grpo fitted by the scaling server), metrics readable while a job runs, plans without side
effects, confirmation (accepted, declined, client without elicitation, plan_token), idempotency keys, the audit
log, and every bad input refused with nothing started."""

import json
import os
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitResult

from servers.core.mcp_layer import App
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "launch"


async def finish(client: Client, job_id: str, limit_s: float = 240) -> dict:
    return await finish_job(client, job_id, limit_s)


async def test_backends_and_recipes(suite_client: Client) -> None:
    backends = {b["name"]: b for b in (await ok(suite_client, "list_backends", {}))["backends"]}
    assert backends["local"]["detected"] and backends["local"]["launch_supported"]
    recipes = {r["name"]: r for r in (await ok(suite_client, "list_recipes", {}))["recipes"]}
    assert {"tiny-gpt", "tiny-grpo"} <= set(recipes)
    assert any(a["name"] in ("steps", "--steps") for a in recipes["tiny-gpt"]["arguments"])
    [doc] = (await suite_client.read_resource("infra://recipes")).contents
    assert "tiny-grpo" in doc.text


async def test_plan_has_no_side_effects_but_is_audited(suite_client: Client, app: App) -> None:
    plan = await ok(
        suite_client,
        "plan_training_job",
        {"spec": {"recipe": "tiny-gpt", "args": ["--steps", "5"], "nproc_per_node": 2}},
    )
    argv = plan["argv"]
    assert "torch.distributed.run" in argv and "--nproc-per-node" in argv and argv[-2:] == ["--steps", "5"]
    assert plan["gpus"] == 0 and not plan["needs_confirmation"] and plan["plan_token"]
    assert (await ok(suite_client, "list_jobs", {}))["total"] == 0
    audit = [json.loads(line) for line in (app.settings.home / "audit.jsonl").read_text().splitlines()]
    assert audit[-1]["event"] == "plan" and audit[-1]["plan_hash"] == plan["plan_hash"]
    job = await ok(suite_client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
    await ok(suite_client, "cancel_job", {"job_id": job["job_id"]})
    events = [json.loads(line) for line in (app.settings.home / "audit.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events[-2:]] == ["submit", "cancel"] and events[-1]["job_id"] == job["job_id"]


async def test_tiny_gpt_on_two_ranks_with_metrics_while_running(suite_client: Client) -> None:
    job = await ok(
        suite_client,
        "submit_training_job",
        {
            "spec": {"recipe": "tiny-gpt", "args": ["--steps", "60"], "nproc_per_node": 2, "name": "gpt-smoke"},
            "wait_s": 0,
        },
    )
    seen_running = False
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        page = await ok(suite_client, "read_job_metrics", {"job_id": job["job_id"]})
        if page["rows"] and not page["job_finished"]:
            seen_running = True
            break
        if page["job_finished"]:
            break
        await anyio.sleep(0.2)
    done = await finish(suite_client, job["job_id"])
    assert done["state"] == "SUCCEEDED", done["reason"]
    assert seen_running, "no metrics row was readable while the job ran"
    rows = (await ok(suite_client, "read_job_metrics", {"job_id": job["job_id"], "keys": ["loss"]}))["rows"]
    losses = [r["loss"] for r in rows if r.get("loss") is not None]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    processes = {log["process"] for log in done["logs"]}
    assert {"rank0", "rank1"} <= processes


async def test_tiny_grpo_end_to_end_with_the_scaling_fit(suite_client: Client) -> None:
    job = await ok(suite_client, "submit_training_job", {"spec": {"recipe": "tiny-grpo"}, "wait_s": 0})
    done = await finish(suite_client, job["job_id"])
    assert done["state"] == "SUCCEEDED", done["reason"]
    fit = await ok(
        suite_client,
        "fit_scaling_law",
        {
            "model": "scalerl",
            "bootstrap": 0,
            "compute_unit": "flops",
            "data": {"job_id": job["job_id"], "columns": {"compute": "compute_flops", "value": "pass_rate"}},
        },
    )
    assert fit["converged"] and fit["rmse"] < 0.08 and 0 < fit["parameters"]["A"]["value"] <= 1


async def test_shell_syntax_reaches_the_script_literally(suite_client: Client, tmp_path: Path) -> None:
    script = tmp_path / "echo_args.py"
    script.write_text((FIXTURES / "echo_args.py").read_text())
    out = tmp_path / "args.json"
    tricky = ["; rm -rf /", "$(whoami)", "`id`", "a && b", "| cat"]
    job = await ok(
        suite_client,
        "submit_training_job",
        {"spec": {"script": str(script), "args": tricky, "env": {"JOB_ECHO_ARGS_OUT": str(out)}}, "wait_s": 45},
    )
    done = await finish(suite_client, job["job_id"])
    assert done["state"] == "SUCCEEDED", done["reason"]
    assert json.loads(out.read_text()) == tricky


async def test_bad_inputs_start_nothing(suite_client: Client, tmp_path: Path) -> None:
    outside = await error(suite_client, "plan_training_job", {"spec": {"script": "/etc/hostname"}})
    assert "outside the allowed roots" in outside
    (tmp_path / "escape.py").symlink_to("/etc/hostname")  # a symlink out of the root
    assert "outside the allowed roots" in await error(
        suite_client, "submit_training_job", {"spec": {"script": str(tmp_path / "escape.py")}}
    )
    assert "LD_PRELOAD" in await error(
        suite_client, "submit_training_job", {"spec": {"recipe": "tiny-gpt", "env": {"LD_PRELOAD": "/tmp/evil.so"}}}
    )
    assert "PYTHONPATH" in await error(
        suite_client, "plan_training_job", {"spec": {"recipe": "tiny-gpt", "env": {"PYTHONPATH": "/tmp"}}}
    )
    assert "at most" in await error(
        suite_client, "submit_training_job", {"spec": {"recipe": "tiny-gpt", "nproc_per_node": 64}}
    )
    assert "quota" in await error(
        suite_client, "submit_training_job", {"spec": {"recipe": "tiny-gpt", "max_wall_s": 10 * 86400}}
    )
    assert "tiny-gpt" in await error(suite_client, "submit_training_job", {"spec": {"recipe": "huge-gpt"}})
    assert "exactly one of recipe" in await error(suite_client, "plan_training_job", {"spec": {}})
    assert "no job with id" in await error(suite_client, "cancel_job", {"job_id": "training-20990101-000000-abcdef"})
    assert "not valid here" in await error(
        suite_client, "submit_training_job", {"plan_token": "abc.0123456789abcdef0123456789abcdef"}
    )
    assert (await ok(suite_client, "list_jobs", {}))["total"] == 0


async def test_idempotency_key(suite_client: Client) -> None:
    spec = {"recipe": "tiny-gpt", "args": ["--steps", "3"], "idempotency_key": "run-42"}
    first = await ok(suite_client, "submit_training_job", {"spec": spec, "wait_s": 0})
    again = await ok(suite_client, "submit_training_job", {"spec": spec, "wait_s": 0})
    assert again["job_id"] == first["job_id"]
    assert (await ok(suite_client, "list_jobs", {}))["total"] == 1
    assert "different spec" in await error(
        suite_client, "submit_training_job", {"spec": {**spec, "args": ["--steps", "4"]}}
    )
    done = await finish(suite_client, first["job_id"])
    assert done["state"] == "SUCCEEDED"
    assert (await ok(suite_client, "cancel_job", {"job_id": first["job_id"]}))["state"] == "SUCCEEDED"  # no-op


@pytest.fixture
def pretend_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two GPUs as far as planning goes, so that a launch costs GPU-hours (the scripts still run on CPU)."""
    import servers.core.machine as machine

    monkeypatch.setattr(machine, "gpus_present", lambda: 2)


def answer(accept: bool):
    async def callback(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        assert "GPU-hours" in params.message
        return ElicitResult(action="accept", content={"confirm": True}) if accept else ElicitResult(action="decline")

    return callback


COSTLY = {
    "recipe": "tiny-gpt",
    "args": ["--steps", "3"],
    "nproc_per_node": 1,
    "gpus_per_node": 1,
    "max_wall_s": 7200,
}  # 2 GPU-hours at most, above the 1.0 default threshold


async def test_confirmation_accepted_and_declined(app: App, pretend_gpus: None) -> None:
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    async with Client(create_test_suite(app), mode="legacy", elicitation_callback=answer(False)) as client:
        text = await error(client, "submit_training_job", {"spec": COSTLY})
        assert "declined" in text
        assert (await ok(client, "list_jobs", {}))["total"] == 0
    async with Client(create_test_suite(app), mode="legacy", elicitation_callback=answer(True)) as client:
        job = await ok(client, "submit_training_job", {"spec": COSTLY, "wait_s": 0})
        done = await finish(client, job["job_id"])
        assert done["state"] == "SUCCEEDED", done["reason"]
        assert done["spec"]["gpus"] == [0]
    events = [json.loads(line)["event"] for line in (app.settings.home / "audit.jsonl").read_text().splitlines()]
    assert events.count("decline") == 1 and events.count("confirm") == 1 and events.count("submit") == 1


async def test_a_client_that_cannot_ask_needs_the_plan_token_and_the_persons_approval(
    app: App, pretend_gpus: None, mode: str
) -> None:
    async with Client(create_test_suite(app), mode=mode) as client:
        assert "plan_token" in await error(client, "submit_training_job", {"spec": COSTLY})
        plan = await ok(client, "plan_training_job", {"spec": COSTLY})
        assert plan["needs_confirmation"] and plan["estimated_gpu_hours"] == pytest.approx(2.0)
        other = {**COSTLY, "args": ["--steps", "4"]}
        assert "different spec" in await error(
            client, "submit_training_job", {"spec": other, "plan_token": plan["plan_token"]}
        )
        # The token binds the submit to the plan; it does not stand for the person (the agent holds it).
        assert "llm-infra-mcp approve" in await error(client, "submit_training_job", {"plan_token": plan["plan_token"]})
        from servers.engines.admission import Approvals

        assert Approvals(app.settings).approve(plan["plan_id"], "a person")
        job = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        done = await finish(client, job["job_id"])
        assert done["state"] == "SUCCEEDED", done["reason"]


async def test_annotations_are_true(suite_client: Client) -> None:
    """plan_training_job writes the audit log (and an approval request): not read-only. submit_training_job starts
    a new job on every call without an idempotency_key: not idempotent."""
    tools = {t.name: t.annotations for t in (await suite_client.list_tools()).tools}
    assert tools["plan_training_job"].read_only_hint is False
    assert tools["submit_training_job"].idempotent_hint is False
    recipes = {r["name"]: r for r in (await ok(suite_client, "list_recipes", {}))["recipes"]}
    assert "process wall time" in recipes["tiny-grpo"]["description"]
    assert "CPU" in recipes["tiny-grpo"]["metric_notes"]["compute_gpu_hours"]


async def test_the_submit_runs_the_plan_that_was_shown(app: App, settings) -> None:
    """One plan (the backend's), bound by the token: the job runs exactly it; a plan that would differ now (here the
    job network setting changed) is refused until planned and shown again."""
    spec = {"recipe": "tiny-gpt", "args": ["--steps", "3"], "nproc_per_node": 1}
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await ok(client, "plan_training_job", {"spec": spec})
        assert plan["argv"] == plan["backend_plan"]["argv"] and "$JOB_DIR" in " ".join(plan["argv"])
        job = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        done = await finish(client, job["job_id"])
        assert done["state"] == "SUCCEEDED", done["reason"]
        assert done["spec"]["plan"]["argv"] == plan["backend_plan"]["argv"]
    other = App(settings.model_copy(update={"job_network": "host"}), owner="test", child_env=app._child_env)
    async with Client(create_test_suite(other), mode="legacy") as client:
        text = await error(client, "submit_training_job", {"plan_token": plan["plan_token"]})
        assert "the plan changed since it was shown" in text


async def test_a_key_whose_submit_died_is_recovered(app: App) -> None:
    import time as clock

    from servers.launch.training import IdempotencyKeys, TrainingJobSpec, spec_hash

    spec = {"recipe": "tiny-gpt", "args": ["--steps", "3"], "nproc_per_node": 1, "idempotency_key": "lost-bind"}
    async with Client(create_test_suite(app), mode="legacy") as client:
        first = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
        keys = IdempotencyKeys(app.settings)
        # The server died after starting the job, before recording it against the key:
        with keys_db(app) as conn:
            conn.execute("UPDATE launch_keys SET job_id = NULL WHERE key = 'lost-bind'")
        again = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
        assert again["job_id"] == first["job_id"] and keys.lookup("lost-bind")[1] == first["job_id"]
        # A claim whose submit died before any job started: released once stale, then the submit goes ahead.
        stale = {**spec, "idempotency_key": "never-started"}
        digest = spec_hash(TrainingJobSpec.model_validate({**stale, "gpus_per_node": 0}))
        assert keys.claim("never-started", digest)
        assert "starting right now" in await error(client, "submit_training_job", {"spec": stale})
        with keys_db(app) as conn:
            conn.execute("UPDATE launch_keys SET created_at = ? WHERE key = 'never-started'", (clock.time() - 3600,))
        started = await ok(client, "submit_training_job", {"spec": stale, "wait_s": 0})
        assert started["job_id"] != first["job_id"]
        for job_id in (first["job_id"], started["job_id"]):
            await finish(client, job_id)


def keys_db(app: App):
    from servers.core.db import connect

    return connect(app.settings.db_path)
