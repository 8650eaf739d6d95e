"""A scripted agent that knows only tools/list walks the README's workflows against the suite over stdio.

Before each call it checks its arguments against the published input schema, the way a model builds a call from
tools/list alone: every name it uses must be listed there (nested ones too, and an object published as "the same
object as <tool>'s <name>" against that tool's schema), every required one given, and the values must validate.
Then the server must answer without an argument error. The workflows: node triage, a training job followed to its
end with its logs, metrics and stragglers, a sweep, a scaling study, fleet network probes and the bandwidth check,
and overlap prediction, GEMM and collective benchmarks and tuning (README: "Training jobs", "Clusters", "Fleet
health", "The experiment loop"; the tune-tp-overlap prompt).
"""

import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import PYTHON, REPO_ROOT, server_env

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "diagnostics"
SAME_AS = re.compile(r"the same object as (\w+)'s (\w+)$")


class ScriptedAgent:
    """Calls tools the way a model that read tools/list would, refusing (in the test) any call it could not
    have built from it."""

    def __init__(self, client: Client, tools: dict[str, Any]) -> None:
        self.client = client
        self.tools = tools
        self.calls: list[str] = []

    def schema_for(self, tool: str) -> dict[str, Any]:
        published = self.tools[tool].input_schema
        properties = dict(published.get("properties", {}))
        defs = dict(published.get("$defs", {}))
        for name, prop in properties.items():
            found = SAME_AS.search(prop.get("description", ""))
            if found:
                owner = self.tools[found.group(1)].input_schema
                properties[name] = owner["properties"][found.group(2)]
                defs.update(owner.get("$defs", {}))
        return {**published, "properties": properties, "$defs": defs}

    async def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        assert tool in self.tools, f"{tool} is not in tools/list"
        schema = self.schema_for(tool)
        unknown = set(args) - set(schema.get("properties", {}))
        assert not unknown, f"{tool}: {sorted(unknown)} not in tools/list ({sorted(schema['properties'])})"
        jsonschema.validate(args, schema)  # names nested too (additionalProperties: false), types, enums
        result = await self.client.call_tool(tool, args)
        text = " ".join(getattr(c, "text", "") for c in result.content)
        assert "unknown argument" not in text and "unknown field" not in text, (tool, text)
        self.calls.append(tool)
        if result.is_error:
            raise AssertionError(f"{tool}({args}) failed: {text}")
        assert result.structured_content is not None, tool
        return result.structured_content

    async def finish(self, job_id: str, limit_s: float = 300) -> dict[str, Any]:
        import time

        deadline = time.monotonic() + limit_s
        while True:
            waited = await self.call("wait_for_job", {"job_id": job_id, "wait_s": 30})
            if not waited["timed_out"] or time.monotonic() > deadline:
                return waited


def _curve(a: float, b: float, c_mid: float, seed: int) -> list[dict[str, Any]]:
    """A ScaleRL curve sampled at 24 computes with a little deterministic scatter."""
    points = []
    for i in range(24):
        c = 10 ** (1 + 3 * i / 23)
        noise = 0.004 * math.sin(7 * i + seed)
        points.append({"compute": c, "value": 0.1 + (a - 0.1) / (1 + (c_mid / c) ** b) + noise, "run": f"s{seed}"})
    return points


@pytest.fixture
async def agent(home: Path) -> Any:
    params = StdioServerParameters(
        command=PYTHON,
        args=["-m", "servers.cli", "serve", "suite"],
        env=server_env(home, LLM_INFRA_MCP_ALLOWED_ROOTS=str(REPO_ROOT)),
        cwd=str(REPO_ROOT),
    )
    async with Client(params, mode="legacy") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        yield ScriptedAgent(client, tools)


async def test_node_triage_workflow(agent: ScriptedAgent) -> None:
    kmsg = (FIXTURES / "kmsg" / "dmesg-T.log").read_text()
    smi = (FIXTURES / "smi" / "nvidia-smi-q.8xH100.550.synthetic.txt").read_text()
    nccl = (FIXTURES / "nccl" / "all_reduce_perf.8xH100.pass.txt").read_text()
    dcgm = (FIXTURES / "dcgm" / "dcgmi-diag-r3.dcgm4.8xH100.json").read_text()
    await agent.call("gpu_health", {"text": smi})
    events = await agent.call("scan_kernel_log", {"text": kmsg})
    assert events
    await agent.call("explain_xid", {"code": 79})
    await agent.call("parse_nccl_tests", {"text": nccl})
    await agent.call("parse_dcgm_diag", {"text": dcgm})
    triage = await agent.call(
        "triage_node", {"nvidia_smi_text": smi, "kernel_log_text": kmsg, "nccl_tests_text": nccl, "dcgm_text": dcgm}
    )
    assert triage


async def test_training_sweep_and_scaling_workflows(agent: ScriptedAgent) -> None:
    await agent.call("list_backends", {})
    await agent.call("list_recipes", {})
    spec = {"recipe": "tiny-gpt", "args": ["--steps", "4"], "nproc_per_node": 2, "max_wall_s": 300}
    plan = await agent.call("plan_training_job", {"spec": spec})
    started = await agent.call("submit_training_job", {"spec": spec, "plan_token": plan["plan_token"], "wait_s": 0})
    done = await agent.finish(started["job_id"])
    assert done["job"]["state"] == "SUCCEEDED", done
    job_id = started["job_id"]
    await agent.call("get_job", {"job_id": job_id})
    await agent.call("read_job_logs", {"job_id": job_id, "process": "rank0"})
    await agent.call("read_job_metrics", {"job_id": job_id, "limit": 50})
    await agent.call("detect_stragglers", {"job_id": job_id})
    await agent.call("list_jobs", {"limit": 5})

    sweep = await agent.call(
        "plan_sweep",
        {
            "spec": {"recipe": "tiny-gpt", "args": ["--steps", "2"], "nproc_per_node": 1},
            "grid": {"--lr": ["0.01", "0.02"]},
        },
    )
    submitted = await agent.call("submit_sweep", {"sweep_token": sweep["sweep_token"]})
    await agent.call("list_jobs", {"sweep_id": submitted["sweep_id"]})
    finished = await agent.finish(submitted["sweep_id"])
    assert not finished["timed_out"], finished

    fits = []
    for label, (a, b, c_mid) in {"recipe-a": (0.7, 1.5, 300.0), "recipe-b": (0.6, 1.8, 150.0)}.items():
        fit = await agent.call(
            "fit_scaling_law",
            {"model": "scalerl", "data": {"points": _curve(a, b, c_mid, 1)}, "label": label, "bootstrap": 50},
        )
        fits.append(fit["fit_id"])
    await agent.call("predict_scaling", {"fit_id": fits[0], "compute": [5000.0], "target": 0.5})
    await agent.call("check_extrapolation", {"data": {"points": _curve(0.7, 1.5, 300.0, 2)}, "bootstrap": 20})
    await agent.call("compare_scaling_fits", {"fit_ids": fits})
    await agent.call("plot_scaling_fit", {"fit_ids": fits})
    await agent.call("list_scaling_fits", {"limit": 5})
    await agent.call(
        "predict_scaling",
        {"model": "scalerl", "compute": [10000.0], "parameters": {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.1}},
    )
    await agent.call("predict_scaling", {"model": "chinchilla", "compute": [1e21, 1e23]})
    await agent.call("convert_compute_units", {"value": 1000.0, "unit": "gpu_hours", "gpu": "H100-SXM"})


async def test_fleet_and_overlap_workflows(agent: ScriptedAgent) -> None:
    topology = {
        "nodes": [
            {"name": f"n{i}", "nics": [{"name": f"n{i}-r{r}", "rail": r, "leaf": f"leaf{r}"} for r in range(2)]}
            for i in range(4)
        ],
        "switches": [
            *({"name": f"leaf{r}", "tier": "leaf", "uplinks": ["spine0", "spine1"]} for r in range(2)),
            {"name": "spine0", "tier": "spine"},
            {"name": "spine1", "tier": "spine"},
        ],
    }
    planned = await agent.call("plan_network_probes", {"topology": topology, "mode": "rail"})
    assert planned
    probes = [
        {"src_nic": f"n{i}-r{r}", "dst_nic": f"n{j}-r{r}", "latency_us": 5.0, "loss_rate": 0.3 if i == 2 else 0.0}
        for r in range(2)
        for i in range(4)
        for j in range(4)
        if i != j
    ]
    located = await agent.call("localize_network_fault", {"topology": topology, "probes": probes, "limit": 5})
    assert located
    checked = await agent.call("check_collective_bandwidth", {"mode": "node", "nproc_per_node": 2, "wait_s": 0})
    await agent.finish(checked["job_id"])

    presets = await agent.call("list_shape_presets", {})
    assert presets
    await agent.call(
        "predict_overlap",
        {"pattern": "ag_gemm", "m": 8192, "n": 4096, "k": 4096, "world_size": 8, "gpu": "H100-SXM"},
    )
    # The measurements of the tune-tp-overlap prompt, flat arguments as tools/list gives them, then the tuning.
    gemm = await agent.call("benchmark_gemm", {"m": 64, "n": 64, "k": 64, "dtype": "fp32", "iters": 2, "wait_s": 0})
    collective = await agent.call(
        "benchmark_collective",
        {"op": "all_gather", "sizes": [4096, 65536], "world_size": 2, "iters": 2, "warmup": 1, "wait_s": 0},
    )
    for job in (gemm, collective):
        assert (await agent.finish(job["job_id"]))["job"]["state"] == "SUCCEEDED"
    tuned = await agent.call(
        "tune_overlap",
        {
            "layers": [{"layer": "qkv", "pattern": "ag_gemm", "m": 64, "n": 64, "k": 64}],
            "world_size": 2,
            "dtype": "fp32",
            "iters": 2,
            "warmup": 1,
            "wait_s": 0,
        },
    )
    await agent.finish(tuned["job_id"])


async def test_the_scripted_agent_refuses_a_call_it_could_not_have_built_from_tools_list() -> None:
    from mcp.types import Tool

    spec = {"type": "object", "properties": {"recipe": {"type": "string"}}, "additionalProperties": False}
    tools = {
        "plan": Tool(name="plan", input_schema={"type": "object", "properties": {"spec": spec}}),
        "submit": Tool(
            name="submit",
            input_schema={
                "type": "object",
                "properties": {"spec": {"type": "object", "description": "the same object as plan's spec"}},
            },
        ),
    }
    agent = ScriptedAgent(client=None, tools=tools)  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="not in tools/list"):
        await agent.call("plan", {"specs": {}})
    with pytest.raises(AssertionError, match="not in tools/list"):
        await agent.call("nope", {})
    with pytest.raises(jsonschema.ValidationError, match="rcipe"):
        await agent.call("submit", {"spec": {"rcipe": "x"}})  # checked against plan's spec
