"""check_collective_bandwidth through the MCP tools: the node probe here (2 gloo ranks in their own network
namespace), and node / pairwise / all probes as Slurm jobs pinned to their nodes on the session's two-node cluster;
the fleet rule and the matrix on made-up probes; bad inputs refused."""

import io
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitResult

from servers.core.errors import InputError, QuotaError
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from servers.diagnostics.bandwidth import (
    SUMMARY_LAYOUT,
    BandwidthCheckSpec,
    ProbeResult,
    admit_probes,
    build_report,
    normalise,
    probe_cost,
    probe_launch,
)
from servers.engines.admission import APPROVED_BY_PERSON, Approvals, never_ask
from tests.conftest import CHILD_ENV
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

pytestmark = [pytest.mark.anyio]


def _probe(nodes: list[str], busbw: float) -> ProbeResult:
    return ProbeResult(nodes=nodes, state="SUCCEEDED", busbw_gbps=busbw, status="UNKNOWN", why="no floor")


def test_the_fleet_rule_names_the_slow_pair_and_node() -> None:
    spec = BandwidthCheckSpec(mode="pairwise", backend="slurm", nodes=["a", "b", "c", "d"])
    probes = [
        _probe(["a", "b"], 40.0), _probe(["a", "c"], 41.0), _probe(["b", "c"], 39.0),
        _probe(["a", "d"], 15.0), _probe(["b", "d"], 14.0), _probe(["c", "d"], 25.0),
    ]  # fmt: skip
    report = build_report(spec, ["a", "b", "c", "d"], probes)
    assert report.fleet_median_gbps == pytest.approx(32.0)
    assert report.counts == {"PASS": 3, "DEGRADED": 1, "FAIL": 2, "UNKNOWN": 0}
    assert sum(report.counts.values()) == len(probes)
    assert report.slowest_pairs == [("b", "d"), ("a", "d"), ("c", "d")] and report.slowest_nodes == ["d"]
    assert report.matrix[0][3] == report.matrix[3][0] == 15.0 and report.matrix[0][0] is None
    few = build_report(spec, ["a", "b"], [_probe(["a", "b"], 10.0)])
    assert few.counts["UNKNOWN"] == 1 and "no fleet" in few.probes[0].why


@pytest.mark.timeout(240)
async def test_the_node_probe_here_runs_and_is_judged(app: App) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        view = await ok(client, "check_collective_bandwidth", {"wait_s": 0, "sizes": [65536, 262144]})
        done = await finish_job(client, view["job_id"], 200)
        assert done["state"] == "SUCCEEDED", done["reason"]
        result = done["result"]
        assert result["mode"] == "node" and len(result["probes"]) == 1
        probe = result["probes"][0]
        assert probe["busbw_gbps"] > 0 and probe["wrong"] == 0 and "#wrong" in probe["table"]
        assert probe["status"] == "UNKNOWN" and "no fleet" in probe["why"]  # CPU: no floor, one probe
        assert any("CPU" in w for w in result["warnings"])
        assert "pairwise" in await error(client, "check_collective_bandwidth", {"mode": "pairwise"})
        assert "different" in await error(
            client, "check_collective_bandwidth", {"mode": "pairwise", "backend": "slurm", "pairs": [["a", "a"]]}
        )
        assert "node" in await error(client, "check_collective_bandwidth", {"backend": "slurm", "nodes": ["bad name"]})


@pytest.mark.timeout(400)
async def test_node_pairwise_and_all_on_two_slurm_nodes(app: App, slurm_cluster: Path) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        # mode all runs in the approval test below (the same probe, through the person's approval)
        for mode, probes in (("node", 2), ("pairwise", 1)):
            args = {"mode": mode, "backend": "slurm", "sizes": [65536, 262144], "wait_s": 0}
            view = await ok(client, "check_collective_bandwidth", args)
            done = await finish_job(client, view["job_id"], 300)
            assert done["state"] == "SUCCEEDED", done["reason"]
            result = done["result"]
            assert result["nodes"] == ["node1", "node2"] and len(result["probes"]) == probes, result
            assert all(p["state"] == "SUCCEEDED" and p["busbw_gbps"] > 0 for p in result["probes"]), [
                (p["state"], p["reason"]) for p in result["probes"]
            ]
            assert sum(result["counts"].values()) == probes
            if mode == "node":
                assert [p["nodes"] for p in result["probes"]] == [["node1"], ["node2"]]
                assert result["matrix"][0][0] and result["matrix"][1][1] and result["matrix"][0][1] is None
            if mode == "pairwise":
                assert result["matrix"][0][1] == result["matrix"][1][0] == result["probes"][0]["busbw_gbps"]
                assert result["heatmap"] and "2 ranks" in result["probes"][0]["table"]
                hosts = {line.split(" on ")[1].split()[0] for line in result["probes"][0]["table"].splitlines()
                         if line.startswith("#  Rank")}  # fmt: skip
                assert hosts == {"node1", "node2"}


# ---- admission: the probes' cost, quotas and the person's approval --------------------------------------------------
def test_the_probes_cost_is_probes_x_nodes_x_gpus_x_wall_time() -> None:
    nodes = ["a", "b", "c", "d"]
    node = normalise(BandwidthCheckSpec(backend="slurm", nodes=nodes, gpus_per_node=8, probe_wall_s=900), None)
    cost = probe_cost(node)
    assert (cost.probes, cost.nodes_per_probe, cost.max_gpus_at_once) == (4, 1, 8)
    assert cost.gpu_hours == pytest.approx(4 * 1 * 8 * 0.25) and cost.node_hours == pytest.approx(1.0)
    pairwise = probe_cost(normalise(BandwidthCheckSpec(mode="pairwise", backend="slurm", nodes=nodes), None))
    assert (pairwise.probes, pairwise.nodes_per_probe, pairwise.gpu_hours) == (6, 2, 0.0)
    assert pairwise.node_hours == pytest.approx(6 * 2 * 600 / 3600)
    everything = probe_cost(normalise(BandwidthCheckSpec(mode="all", backend="slurm", gpus_per_node=4), nodes))
    assert (everything.probes, everything.max_gpus_at_once, everything.gpu_hours) == (1, 16, pytest.approx(16 / 6))
    # the pairs' nodes join the node list; sinfo's names pass the spec's own checks
    paired = normalise(BandwidthCheckSpec(mode="pairwise", backend="slurm", pairs=[("x", "y")]), ["a"])
    assert paired.nodes == ["a", "x", "y"] and probe_cost(paired).probes == 1
    with pytest.raises(InputError, match="cannot name"):
        normalise(BandwidthCheckSpec(backend="slurm"), ["ok", "bad name"])
    with pytest.raises(InputError, match="at most 64"):
        normalise(BandwidthCheckSpec(backend="slurm"), [f"n{i}" for i in range(65)])
    with pytest.raises(InputError, match="no usable node"):
        normalise(BandwidthCheckSpec(backend="slurm"), [])


def test_the_approval_shows_every_field_that_decides_the_cost_escaped() -> None:
    from servers.cli import BANDWIDTH_LAYOUT, approval_lines, approval_recap, pending_line

    assert BANDWIDTH_LAYOUT == SUMMARY_LAYOUT
    spec = normalise(
        BandwidthCheckSpec(mode="pairwise", backend="slurm", nodes=["n1", "n2", "n3"], gpus_per_node=8,
                           partition="gpu\x1b[2J\u202e", probe_wall_s=1200),
        None,
    )  # fmt: skip
    launch = probe_launch(spec, probe_cost(spec))
    assert (
        "\x1b" not in launch.message and "\\x1b[2J" in launch.message and "3 bandwidth probe job(s)" in launch.message
    )
    text = "\n".join(approval_lines(launch.plan_id, json.loads(json.dumps(launch.summary))))
    assert "\x1b" not in text and "\u202e" not in text and '"gpu\\x1b[2J\\u202e"' in text
    for expected in (
        "a bandwidth check, 3 probe job(s)", "backend: slurm", "probes: 3", "nodes_per_probe: 2",
        "gpus_per_node: 8", "total_gpus: 16", "probe_wall_s: 1,200 s (0.333 h)", "estimated_gpu_hours: 16.0",
        "estimated_node_hours: 2.0", '"n1"', '"n3"', "mode: pairwise",
    ):  # fmt: skip
        assert expected in text, (expected, text)
    assert text.index("estimated_node_hours") > text.index('"n3"')  # the cost last, nearest the prompt
    recap = approval_recap(launch.summary)
    assert "3 bandwidth probe job(s), up to 16.0 GPU-hours and 2.0 node-hours on slurm" in recap
    row = {"plan_id": launch.plan_id, "summary": json.dumps(launch.summary)}
    assert "bandwidth check (pairwise, all_reduce)" in pending_line(row)
    # the plan id is the normalised spec's: another wall time, another plan
    other = spec.model_copy(update={"probe_wall_s": 1201})
    assert probe_launch(other, probe_cost(other)).plan_id != launch.plan_id


async def test_each_probe_job_meets_the_quotas_before_anything_is_asked(settings: Settings) -> None:
    asked: list[str] = []

    async def ask(launch: object) -> bool:
        asked.append("asked")
        return True

    tight = settings.model_copy(update={"max_gpus_per_job": 8, "max_job_wall_s": 1000.0})
    wide = BandwidthCheckSpec(mode="pairwise", backend="slurm", nodes=["a", "b"], gpus_per_node=8)
    with pytest.raises(QuotaError, match="a probe job would use 16 GPUs; the quota is 8 per job"):
        await admit_probes(tight, wide, ask=ask, who="t")
    long = BandwidthCheckSpec(backend="slurm", nodes=["a"], probe_wall_s=1200)
    with pytest.raises(QuotaError, match="probe_wall_s 1200 s is above the quota of 1000 s"):
        await admit_probes(tight, long, ask=ask, who="t")
    assert asked == []
    cheap = BandwidthCheckSpec(backend="slurm", nodes=["a"], gpus_per_node=1)  # 1/6 GPU-hour: nobody is asked
    fixed, admitted = await admit_probes(tight, cheap, ask=ask, who="t")
    assert asked == [] and admitted.how is None and fixed.nodes == ["a"]
    costly = BandwidthCheckSpec(backend="slurm", nodes=["a", "b", "c"], gpus_per_node=8)  # 4 GPU-hours
    with pytest.raises(InputError, match=r"llm-infra-mcp approve [0-9a-f]{16}"):
        await admit_probes(tight, costly, ask=never_ask, who="t")
    _, admitted = await admit_probes(tight, costly, ask=ask, who="t")
    assert asked == ["asked"] and admitted.how == "confirmed by the person (elicitation)"


@pytest.mark.timeout(120)
async def test_the_check_counts_as_a_job_and_a_refused_start_gives_the_approval_back(settings: Settings) -> None:
    """LLM_INFRA_MCP_MAX_CONCURRENT_JOBS=1 with one job running: the approved check is refused by the job quota
    before any probe is submitted (no Slurm needed: its nodes are named), and its approval stands again."""
    one = App(
        settings.model_copy(update={"max_concurrent_jobs": 1, "confirm_above_node_hours": 0.01}),
        owner="test",
        child_env=CHILD_ENV,
    )
    args = {"backend": "slurm", "nodes": ["node1"], "sizes": [65536], "wait_s": 0}
    async with Client(create_test_suite(one), mode="legacy") as client:
        plan_id = re.search(r"approve ([0-9a-f]{16})", await error(client, "check_collective_bandwidth", args))
        assert plan_id is not None
        assert Approvals(settings).approve(plan_id.group(1), "a person")
        busy = await ok(client, "check_collective_bandwidth", {"wait_s": 0, "sizes": [65536]})  # the local check
        try:
            refused = await error(client, "check_collective_bandwidth", args)
            assert "LLM_INFRA_MCP_MAX_CONCURRENT_JOBS" in refused, refused
        finally:
            await ok(client, "cancel_job", {"job_id": busy["job_id"]})
        row = Approvals(settings).get(plan_id.group(1))
        assert row["approved_at"] is not None and row["used_by_job"] is None  # still the person's, unused
    assert not [e for e in _events(settings) if e["event"] == "submit" and e.get("plan_id") == plan_id.group(1)]


def _probe_jobs() -> set[str]:
    """The ids of the bandwidth probes Slurm knows of (queued, running or just ended)."""
    listed = subprocess.run(
        ["squeue", "-h", "-a", "-t", "all", "-o", "%i %j", "--user", str(os.getuid())],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    rows = [line.split() for line in listed.stdout.splitlines()]
    return {row[0] for row in rows if len(row) == 2 and row[1].startswith("bw-probe-")}


def _events(settings: Settings) -> list[dict]:
    path = settings.home / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _decline(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    assert "bandwidth probe job(s)" in params.message and "node-hours" in params.message
    return ElicitResult(action="decline")


@pytest.mark.timeout(400)
async def test_probes_above_the_ceiling_wait_for_the_persons_approval_on_slurm(
    settings: Settings, slurm_cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One probe over both CPU nodes for up to 600 s: 0.333 node-hours, above a ceiling of 0.1. Refused with the approve
    command and nothing started; approved as the CLI does it, the same call runs; an elicitation decline starts
    nothing."""
    from servers.cli import approve

    strict = App(settings.model_copy(update={"confirm_above_node_hours": 0.1}), owner="test", child_env=CHILD_ENV)
    args = {"mode": "all", "backend": "slurm", "sizes": [65536], "wait_s": 0}
    before = _probe_jobs()
    async with Client(create_test_suite(strict), mode="legacy") as client:  # a client that cannot elicit
        refused = await error(client, "check_collective_bandwidth", args)
        found = re.search(r"llm-infra-mcp approve ([0-9a-f]{16})", refused)
        assert found and "0.333 node-hours, no GPU, above LLM_INFRA_MCP_CONFIRM_ABOVE_NODE_HOURS=0.1" in refused
        plan_id = found.group(1)
        assert (await ok(client, "list_jobs", {}))["total"] == 0 and _probe_jobs() <= before
        assert not [e for e in _events(settings) if e["event"] == "submit"]
        monkeypatch.setenv("LLM_INFRA_MCP_HOME", str(settings.home))  # what `approve` reads
        out = io.StringIO()
        assert approve(plan_id, yes=False, tty=io.StringIO("y\n"), out=out) == 0
        shown = out.getvalue()
        assert '"node1"' in shown and '"node2"' in shown and "probes: 1" in shown, shown
        assert "estimated_node_hours: 0.333" in shown and "check_collective_bandwidth" in shown
        view = await ok(client, "check_collective_bandwidth", args)
        assert Approvals(settings).get(plan_id)["used_by_job"] == view["job_id"]
        done = await finish_job(client, view["job_id"], 300)
        assert done["state"] == "SUCCEEDED", done["reason"]
        assert [p["nodes"] for p in done["result"]["probes"]] == [["node1", "node2"]]
        assert all(p["state"] == "SUCCEEDED" and p["busbw_gbps"] > 0 for p in done["result"]["probes"])
        assert done["result"]["nodes"] == ["node1", "node2"] and sum(done["result"]["counts"].values()) == 1
        # the approval was for that run: the next identical call asks again
        assert f"llm-infra-mcp approve {plan_id}" in await error(client, "check_collective_bandwidth", args)
    submits = [e for e in _events(settings) if e["event"] == "submit"]
    assert [(e["job_id"], e["plan_id"], e["nodes"]) for e in submits] == [(view["job_id"], plan_id, ["node1", "node2"])]
    assert [e["how"] for e in _events(settings) if e["event"] == "confirm"] == [APPROVED_BY_PERSON]
    async with Client(create_test_suite(strict), mode="legacy", elicitation_callback=_decline) as client:
        probes_before = _probe_jobs()
        assert "the person declined the bandwidth check" in await error(client, "check_collective_bandwidth", args)
        assert (await ok(client, "list_jobs", {}))["total"] == 1 and _probe_jobs() <= probes_before
    assert [e["event"] for e in _events(settings)].count("decline") == 1


# ---- detect_stragglers and triage_node through the tools (the modules' own tests: test_diag_stragglers/triage) ----
async def test_triage_joins_the_sources_and_names_the_gpu_nvidia_smi_does_not_list(app: App) -> None:
    folder = Path(__file__).parent / "fixtures" / "diagnostics" / "triage"
    app.settings.allowed_roots = [*app.settings.roots(), folder]
    async with Client(create_test_suite(app), mode="legacy") as client:
        result = await ok(
            client,
            "triage_node",
            {
                "nvidia_smi_path": str(folder / "query-gpu.7of8xH100.synthetic.csv"),
                "kernel_log_path": str(folder / "dmesg-T.8xH100.synthetic.log"),
                "dcgm_path": str(folder / "dcgmi-diag-r2.dcgm4.7xH100.synthetic.json"),
                "nccl_tests_path": str(folder / "all_reduce_perf.7xH100.wrong.synthetic.txt"),
            },
        )
        warnings = " ".join(result["warnings"])
        assert "0000:ab:00" in warnings and "not in the nvidia-smi" in warnings, warnings
        assert result["first_action"]
        assert "at most one" in await error(
            client, "triage_node", {"nvidia_smi_text": "x", "nvidia_smi_path": str(folder / "README.md")}
        )


# ---- plan_network_probes and localize_network_fault through the tools (the modules' tests: test_diag_network) ----
async def test_network_probes_are_planned_and_a_down_nic_localized_through_the_tools(app: App, tmp_path: Path) -> None:
    import json

    from servers.diagnostics.netsim import make_scenario

    scenario = make_scenario(64, {"nic_down": 1}, seed=3)
    topology = scenario.fleet.topology
    [(kind, name)] = sorted(scenario.truth)
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await ok(client, "plan_network_probes", {"topology": topology, "limit": 5})
        assert plan["coverage"]["complete"] and plan["count"] < plan["full_mesh_count"]
        assert len(plan["pairs"]) == 5 and plan["has_more"] and plan["next_offset"] == 5
        topo_file = app.settings.home / "topology.json"
        topo_file.write_text(json.dumps(topology))
        probes_file = app.settings.home / "probes.jsonl"
        probes_file.write_text("\n".join(json.dumps(p) for p in scenario.probes))
        found = await ok(client, "localize_network_fault", {"topology_path": str(topo_file), "path": str(probes_file)})
        faulty = [(s["kind"], s["name"]) for s in found["suspects"] if s["faulty"]]
        assert faulty == [(kind, name)], found["suspects"][:3]
        assert "exactly one of" in await error(client, "localize_network_fault", {"topology": topology})
        bad = [{**scenario.probes[0], "src_nic": "no-such-nic"}]
        assert "no-such-nic" in await error(client, "localize_network_fault", {"topology": topology, "probes": bad})
