"""check_collective_bandwidth through the MCP tools: the node probe here (2 gloo ranks in their own network
namespace), and node / pairwise / all probes as Slurm jobs pinned to their nodes on the session's two-node cluster;
the fleet rule and the matrix on made-up probes; bad inputs refused."""

from pathlib import Path

import pytest
from mcp import Client

from servers.core.mcp_layer import App
from servers.diagnostics.bandwidth import BandwidthCheckSpec, ProbeResult, build_report
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
        for mode, probes in (("node", 2), ("pairwise", 1), ("all", 1)):
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


# ---- detect_stragglers and triage_node through the tools (the modules' own tests: test_diag_stragglers/triage) ----
STRAGGLER_ARGS = ["--steps", "40", "--log-every", "1", "--ckpt-every", "0", "--batch-size", "32", "--d-model", "128"]
STRAGGLER_ARGS += ["--slow-rank", "1", "--slow-factor", "5", "--slow-from-step", "16"]


async def _stragglers_of(client: Client, spec: dict) -> dict:
    job = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
    done = await finish_job(client, job["job_id"], 240)
    assert done["state"] == "SUCCEEDED", done["reason"]
    return await ok(client, "detect_stragglers", {"job_id": job["job_id"]})


@pytest.mark.timeout(300)
async def test_a_slowed_rank_of_a_real_local_job_is_the_straggler(app: App) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        spec = {"recipe": "tiny-gpt", "args": STRAGGLER_ARGS, "nproc_per_node": 2}
        report = await _stragglers_of(client, spec)
        assert [s["rank"] for s in report["stragglers"]] == [1], report["summary"]
        assert "exactly one of" in await error(client, "detect_stragglers", {})


@pytest.mark.timeout(400)
async def test_a_slowed_rank_on_two_slurm_nodes_is_the_straggler(app: App, slurm_cluster: Path) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        spec = {"recipe": "tiny-gpt", "args": STRAGGLER_ARGS, "nproc_per_node": 1, "nnodes": 2, "backend": "slurm"}
        report = await _stragglers_of(client, {**spec, "max_wall_s": 600})
        assert [s["rank"] for s in report["stragglers"]] == [1], report["summary"]


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
