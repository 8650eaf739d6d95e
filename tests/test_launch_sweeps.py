"""Sweeps through the MCP tools: a grid planned once (every run's plan, the total), submitted as one job per run,
idempotent, followed by the sweep id; quotas and approval for the sweep as a whole; bad grids refused."""

import time

import pytest
from mcp import Client

from servers.core.mcp_layer import App
from servers.launch.sweeps import with_values
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]
BASE = {"recipe": "tiny-gpt", "args": ["--steps", "3", "--lr", "0.003"], "nproc_per_node": 1}


def test_grid_values_replace_or_append_flags() -> None:
    assert with_values(["--steps", "3", "--lr", "0.003"], {"--lr": "0.01"}) == ["--steps", "3", "--lr", "0.01"]
    assert with_values(["--lr=0.003"], {"--lr": "0.01", "--seed": "1"}) == ["--lr=0.01", "--seed", "1"]


async def test_a_grid_sweep_runs_once_per_combination_and_is_followed_by_its_id(app: App) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await ok(client, "plan_sweep", {"spec": BASE, "grid": {"--lr": ["0.01", "0.001"], "--seed": ["0"]}})
        assert [r["args"] for r in plan["runs"]] == [
            ["--steps", "3", "--lr", "0.01", "--seed", "0"],
            ["--steps", "3", "--lr", "0.001", "--seed", "0"],
        ]
        assert plan["total_gpu_hours"] == sum(r["plan"]["estimated_gpu_hours"] for r in plan["runs"])
        assert (await ok(client, "list_jobs", {}))["total"] == 0  # planning starts nothing
        submitted = await ok(client, "submit_sweep", {"sweep_token": plan["sweep_token"]})
        assert submitted["sweep_id"] == plan["sweep_id"] and len(submitted["job_ids"]) == 2
        again = await ok(client, "submit_sweep", {"sweep_token": plan["sweep_token"]})
        assert again["job_ids"] == submitted["job_ids"]  # idempotent: nothing started twice
        listed = await ok(client, "list_jobs", {"sweep_id": plan["sweep_id"]})
        assert listed["total"] == 2 and (await ok(client, "list_jobs", {}))["total"] == 2
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            waited = await ok(client, "wait_for_job", {"job_id": plan["sweep_id"], "wait_s": 30})
            if not waited["timed_out"]:
                break
        sweep = waited["sweep"]
        assert sweep["runs"] == 2 and sweep["finished"] == 2 and sweep["states"] == {"SUCCEEDED": 2}
        assert [j["index"] for j in sweep["jobs"]] == [0, 1]
        assert sum(sweep["states"].values()) == sweep["runs"]
        assert "no sweep" in await error(client, "wait_for_job", {"job_id": "sweep-0000000000000000"})


async def test_sweep_quotas_approval_and_bad_grids(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        five = {"--seed": ["0", "1", "2", "3", "4"]}  # five runs; at most 4 jobs at once (the default)
        assert "job slots" in await error(client, "plan_sweep", {"spec": BASE, "grid": five})
        assert "exactly one of grid" in await error(client, "plan_sweep", {"spec": BASE})
        assert "not a flag" in await error(client, "plan_sweep", {"spec": BASE, "grid": {"lr": ["1"]}})
        too_many = {"--a": [str(i) for i in range(9)], "--b": [str(i) for i in range(9)]}
        assert "at most 64" in await error(client, "plan_sweep", {"spec": BASE, "grid": too_many})
        keyed = {**BASE, "idempotency_key": "k"}
        assert "own key" in await error(client, "plan_sweep", {"spec": keyed, "variants": [["--seed", "1"]]})

        import servers.core.machine as machine

        monkeypatch.setattr(machine, "gpus_present", lambda: 2)
        costly = {**BASE, "gpus_per_node": 1, "max_wall_s": 3600}  # 1 GPU-hour each, 2 in all: above 1.0
        plan = await ok(client, "plan_sweep", {"spec": costly, "variants": [["--seed", "1"], ["--seed", "2"]]})
        assert plan["needs_confirmation"] and plan["total_gpu_hours"] == pytest.approx(2.0)
        text = await error(client, "submit_sweep", {"sweep_token": plan["sweep_token"]})
        assert f"llm-infra-mcp approve {plan['plan_id']}" in text and "submit_sweep" in text
        assert (await ok(client, "list_jobs", {}))["total"] == 0
