"""Issue 21, defect 11: node-hours without GPUs cost nothing.

The attack: a Slurm or Kubernetes plan with nnodes 64, max_wall_s 86,400 and gpus_per_node omitted was estimated at
0 GPU-hours and needed no confirmation, so its plan_token alone started 1,536 node-hours. Every plan now carries
its node-hours; a cluster launch that asks for no GPUs needs the person above LLM_INFRA_MCP_CONFIRM_ABOVE_NODE_HOURS,
and a token alone approves it only within LLM_INFRA_MCP_AUTO_APPROVE_GPU_HOURS of node-hours too.
"""

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from servers.core.mcp_layer import App
from servers.core.settings import Settings, settings_table
from servers.engines.admission import confirmation_needed
from servers.launch.training import TrainingJobSpec
from tests.conftest import CHILD_ENV
from tests.fixtures.k8s import goldens
from tests.helpers import call_error, call_ok, create_test_suite

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

WIDE = {"recipe": "tiny-gpt", "nnodes": 64, "max_wall_s": 86400}  # 1,536 node-hours, no GPU asked for
ATTACKS = {
    "slurm": {**WIDE, "backend": "slurm"},
    "kubernetes": {**WIDE, "backend": "kubernetes", "options": {"image": "evil.example/miner:latest"}},
    "kubernetes, gpus 0": {
        **WIDE,
        "backend": "kubernetes",
        "options": {"image": "evil.example/miner:latest"},
        "gpus_per_node": 0,
    },
    "skypilot": {**WIDE, "backend": "skypilot"},
}


@pytest.fixture(autouse=True)
def offline_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(goldens.KUBECONFIG))
    # No Slurm cluster: the session's two-node test cluster, when an earlier test started it, would refuse the
    # 64-node plans at plan time (more nodes than its partition has); the cost rules are what is tested here.
    monkeypatch.delenv("SLURM_CONF", raising=False)


def make_app(settings: Settings, **changes: Any) -> App:
    return App(settings.model_copy(update=changes), owner="test", child_env=CHILD_ENV)


@pytest.mark.parametrize("case", list(ATTACKS))
async def test_a_wide_launch_without_gpus_needs_the_person_and_shows_its_node_hours(
    settings: Settings, case: str
) -> None:
    async with Client(create_test_suite(make_app(settings)), mode="legacy") as client:
        plan = await call_ok(client, "plan_training_job", {"spec": ATTACKS[case]})
        assert plan["gpus"] == 0 and plan["estimated_gpu_hours"] == 0
        assert plan["estimated_node_hours"] == pytest.approx(64 * 24) and plan["needs_confirmation"], plan
        result = await client.call_tool("plan_training_job", {"spec": ATTACKS[case]})
        assert "64 node(s)" in result.content[0].text and "1.54e+03 node-hours" in result.content[0].text
        assert "needs the person's approval" in result.content[0].text
        # The token alone (the agent holds it) does not start it; nothing was started.
        refused = await call_error(client, "submit_training_job", {"plan_token": plan["plan_token"]})
        assert f"llm-infra-mcp approve {plan['plan_id']}" in refused
        assert (await call_ok(client, "list_jobs", {}))["total"] == 0
    if case.startswith("kubernetes"):  # the plan says what the pods get, as the manifest has it
        (said,) = [w for w in plan["warnings"] if w.startswith("no GPU asked for")]
        assert "node-hours (1.54e+03)" in said
        if "NVIDIA_VISIBLE_DEVICES: void" in plan["rendered"] or "value: void" in plan["rendered"]:
            assert "NVIDIA_VISIBLE_DEVICES=void: no GPU" in said
        else:
            assert "torch-distributed runtime sets none" in said and "NVIDIA_VISIBLE_DEVICES=all" in said


async def test_the_auto_approve_ceiling_bounds_node_hours_too(settings: Settings) -> None:
    """LLM_INFRA_MCP_AUTO_APPROVE_GPU_HOURS=2.5 lets a 2-GPU-hour launch through on its token; with 0 GPU-hours a
    1,536 node-hour launch used to pass it too (0 <= 2.5)."""
    async with Client(create_test_suite(make_app(settings, auto_approve_gpu_hours=2.5)), mode="legacy") as client:
        plan = await call_ok(client, "plan_training_job", {"spec": ATTACKS["slurm"]})
        refused = await call_error(client, "submit_training_job", {"plan_token": plan["plan_token"]})
        assert "llm-infra-mcp approve" in refused


async def test_small_cluster_launches_and_gpu_launches_keep_their_rules(settings: Settings) -> None:
    async with Client(create_test_suite(make_app(settings)), mode="legacy") as client:
        small = {"recipe": "tiny-gpt", "backend": "slurm", "nnodes": 2, "max_wall_s": 1200}  # 0.67 node-hours
        plan = await call_ok(client, "plan_training_job", {"spec": small})
        assert plan["estimated_node_hours"] == pytest.approx(2 / 3) and not plan["needs_confirmation"]
        local = await call_ok(client, "plan_training_job", {"spec": {"recipe": "tiny-gpt", "max_wall_s": 7200}})
        assert local["estimated_node_hours"] == pytest.approx(2.0) and not local["needs_confirmation"]  # this machine
    # GPUs asked for: GPU-hours decide, whatever the node-hours threshold says
    async with Client(create_test_suite(make_app(settings, confirm_above_node_hours=0)), mode="legacy") as client:
        gpu = {"recipe": "tiny-gpt", "backend": "kubernetes", "options": {"image": "i:1"}, "gpus_per_node": 1}
        gpu |= {"max_wall_s": 1800}
        plan = await call_ok(client, "plan_training_job", {"spec": gpu})
        assert plan["estimated_gpu_hours"] == pytest.approx(0.5) and not plan["needs_confirmation"]
        plan = await call_ok(client, "plan_training_job", {"spec": {**gpu, "gpus_per_node": 0}})
        assert plan["needs_confirmation"]  # the same nodes without GPUs: node-hours decide


async def test_a_sweep_of_wide_launches_without_gpus_needs_the_person(settings: Settings) -> None:
    spec = {"recipe": "tiny-gpt", "backend": "slurm", "nnodes": 2, "max_wall_s": 1800}  # 1 node-hour a run
    async with Client(create_test_suite(make_app(settings)), mode="legacy") as client:
        swept = await call_ok(client, "plan_sweep", {"spec": spec, "variants": [["--steps", "3"], ["--steps", "4"]]})
        assert swept["total_gpu_hours"] == 0 and swept["needs_confirmation"]
        assert sum(r["plan"]["estimated_node_hours"] for r in swept["runs"]) == pytest.approx(2.0)
        refused = await call_error(client, "submit_sweep", {"sweep_token": swept["sweep_token"]})
        assert "llm-infra-mcp approve" in refused


def test_the_rule_and_its_setting(settings: Settings, tmp_path: Path) -> None:
    rule = {"gpu_hours": 0.0, "node_hours": 1536.0}
    assert confirmation_needed(settings, backend="slurm", gpus_per_node=0, **rule)
    assert confirmation_needed(settings, backend="ray", gpus_per_node=0, **rule)
    assert not confirmation_needed(settings, backend="local", gpus_per_node=0, **rule)
    assert not confirmation_needed(settings, backend="slurm", gpus_per_node=1, gpu_hours=0.5, node_hours=0.5)
    assert confirmation_needed(settings, backend="local", gpus_per_node=1, gpu_hours=1.5, node_hours=1.5)
    relaxed = settings.model_copy(update={"confirm_above_node_hours": 2000.0})
    assert not confirmation_needed(relaxed, backend="slurm", gpus_per_node=0, **rule)
    names = [env for env, _, _ in settings_table()]
    assert "LLM_INFRA_MCP_CONFIRM_ABOVE_NODE_HOURS" in names
    assert Settings(home=tmp_path).confirm_above_node_hours == 1.0
    assert TrainingJobSpec.model_validate(ATTACKS["slurm"]).gpus_per_node is None
