"""The trl-grpo recipe through the launch tools in process (one protocol era: the tools are the same in both, and
test_launch_server covers the eras): the plan validates the args against TRL's own GRPOConfig and says so, refuses
bad ones with TRL's error, and a submitted job runs GRPOTrainer on CPU to completion; its spec declares its run,
which servers.runs reads with no further argument."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from servers.core.jobfiles import JobFiles
from servers.core.mcp_layer import App
from servers.launch.recipes import RECIPES
from servers.runs import registry
from servers.runs.jobs import RUN_SOURCE_KEY, job_target
from servers.runs.vocabulary import mapping
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]
STEPS = 6  # ScaleRL's sigmoid has 4 parameters: the fit by job id below needs more points than that


@pytest.fixture
async def client(app: App) -> AsyncIterator[Client]:
    async with Client(create_test_suite(app), mode="auto") as connected:
        yield connected


def test_the_recipe_lists_what_its_parser_accepts() -> None:
    info = RECIPES["trl-grpo"]
    flags = {a.name for a in info.arguments}
    assert {"--steps", "--num-generations", "--grpo-arg", "--check"} <= flags
    assert info.run_reader == "trl" and info.run_path == "checkpoints/trl"
    assert "GRPOConfig" in info.description


async def test_the_plan_refuses_bad_args_with_the_reason(client: Client) -> None:
    unknown = await error(
        client, "plan_training_job", {"spec": {"recipe": "trl-grpo", "args": ["--grpo-arg", "not_a_field=1"]}}
    )
    assert "GRPOConfig" in unknown and "not_a_field" in unknown
    owned = await error(
        client, "plan_training_job", {"spec": {"recipe": "trl-grpo", "args": ["--grpo-arg", "report_to=[]"]}}
    )
    assert "refused" in owned and "report_to" in owned
    moved = await error(client, "plan_training_job", {"spec": {"recipe": "trl-grpo", "args": ["--output-dir", "x"]}})
    assert "checkpoints/trl" in moved
    flag = await error(client, "plan_training_job", {"spec": {"recipe": "trl-grpo", "args": ["--letters", "40"]}})
    assert "--letters 40: accepted 2 to 26" in flag


async def test_a_trl_grpo_job_runs_and_its_run_is_read(client: Client, app: App) -> None:
    args = ["--steps", str(STEPS), "--grpo-arg", 'loss_type="dr_grpo"']
    plan = await ok(client, "plan_training_job", {"spec": {"recipe": "trl-grpo", "args": args}})
    assert any("validated" in n and "GRPOConfig" in n for n in plan["notes"]), plan["notes"]
    assert plan["backend_spec"][RUN_SOURCE_KEY] == {"reader": "trl", "path": "checkpoints/trl"}
    job = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
    done = await finish_job(client, job["job_id"], 240)
    assert done["state"] == "SUCCEEDED", done["reason"]
    record = app.engine.get(job["job_id"])
    assert record.spec[RUN_SOURCE_KEY] == {"reader": "trl", "path": "checkpoints/trl"}
    job_dir = Path(record.job_dir)
    target, reader = job_target(job_dir, record.spec, JobFiles(job_dir).metrics)
    assert reader == "trl" and target.path == job_dir / "checkpoints" / "trl"
    run = registry.read_run(target, reader=reader)
    assert list(run.series["reward"].steps) == list(range(1, STEPS + 1))
    assert run.facts["max_steps"] == STEPS and run.facts["params"] > 0
    assert mapping(run.keys)["response_length"] == "completions/mean_length"
    rows = (await ok(client, "read_job_metrics", {"job_id": job["job_id"], "keys": ["reward"]}))["rows"]
    assert [r["step"] for r in rows if r.get("reward") is not None] == list(range(1, STEPS + 1))
    # Fitted and forecast by its job id alone: the metric, the compute axis and the planned end come from the job.
    fit = await ok(
        client, "fit_scaling_law", {"model": "scalerl", "data": {"run": {"source": job["job_id"]}}, "bootstrap": 20}
    )
    assert fit["points_used"] == STEPS and fit["run"]["reader"] == "trl"
    assert fit["run"]["metric_key"] == "reward", fit["run"]
    assert "CPU-process hours, not GPU-hours" in fit["run"]["compute_assumption"]  # a CPU job says what it counted
    forecast = (await ok(client, "predict_scaling", {"fit_id": fit["fit_id"]}))["forecast"]
    assert forecast["planned_steps"] == STEPS and forecast["reached"] is True
    assert forecast["observed"] is not None


def test_grpo_args_are_json_or_text_and_the_recipes_own_fields_are_refused() -> None:
    trl_grpo = importlib.import_module("servers.launch.recipes.trl_grpo")  # the package's trl_grpo is the parser

    fields = trl_grpo.extra_fields(
        ["loss_type=dr_grpo", "epsilon=0.3", "reward_weights=[1.0]", "mask_truncated_completions=true"]
    )
    assert fields == {
        "loss_type": "dr_grpo",
        "epsilon": 0.3,
        "reward_weights": [1.0],
        "mask_truncated_completions": True,
    }
    for item, reason in (
        ("max_steps=3", "sets it from --steps"),
        ("report_to=[]", "fixes it"),
        ("deepspeed=/etc/ds.json", "outside the job"),
        ("hub_token=x", "files, hosts or services"),
        ("fsdp_config=x", "files, hosts or services"),
        ("weird_path=x", "files, hosts or services"),
        ("no-equals", "FIELD=VALUE"),
        ("2x=1", "FIELD=VALUE"),
    ):
        with pytest.raises(ValueError, match=reason):
            trl_grpo.extra_fields([item])
    with pytest.raises(SystemExit):  # no abbreviations: "--output" is not --output-dir
        trl_grpo.parse(["--output", "elsewhere"])
    assert trl_grpo.parse(["--steps", "2"]).steps == 2
