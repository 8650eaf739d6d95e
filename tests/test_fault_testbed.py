"""Real faults on a real fabric: the testbed of network namespaces (servers/diagnostics/testbed.py: 8 nodes x 2 rails,
2 leaves per rail, 2 spines, ECMP), faults injected by the kernel (links down, rate limits), probes on real sockets
(servers/diagnostics/netprobe.py) and localize_network_fault naming the component. One testbed for the module; every
test clears what it injected, also when it fails. Needs root and iproute2 (CI has both: it fails there otherwise)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client

from servers.core.errors import InputError
from servers.core.mcp_layer import App
from servers.diagnostics import netprobe
from servers.diagnostics.netloc import localize_network_fault, plan_pairs
from servers.diagnostics.netrun import build_spec
from servers.diagnostics.testbed import Testbed, available
from tests.conftest import skip_unless_present
from tests.helpers import call_error, call_ok, create_test_suite, finish_job

pytestmark = pytest.mark.timeout(120)
THROUGHPUT = 1 << 19  # bytes a throughput probe sends: ~10 ms at the 400 Mbit/s line rate, ~100 ms at 40


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    skip_unless_present(available())
    testbed = Testbed().build()
    try:
        yield testbed
    finally:
        testbed.close()


@pytest.fixture
def fabric(bed: Testbed) -> Iterator[Testbed]:
    try:
        yield bed
    finally:
        bed.clear_all()


def probe(bed: Testbed, pairs: list[tuple[str, str, str | None]], throughput: int = THROUGHPUT) -> list[dict]:
    specs = netprobe.probe_specs(bed.endpoints(), pairs)
    results = netprobe.run_probes(
        specs, netprobe.ProbeSettings(bandwidth_bytes=throughput, timeout_s=0.2), concurrency=4
    )
    assert all(r.error is None for r in results), [r.error for r in results if r.error]
    return [r.row() for r in results]


def touches(bed: Testbed, pair: tuple[str, str, str | None], target: str) -> bool:
    """The pair's path crosses target (a NIC, a node or a leaf~spine link; ECMP pairs: the pinned spine only)."""
    a, b, spine = pair
    if "~" in target:
        leaf, via = target.split("~")
        leaves = {nic["name"]: nic["leaf"] for node in bed.topology()["nodes"] for nic in node["nics"]}
        return spine == via and leaf in (leaves[a], leaves[b])
    return target in (a, b) or target in (a.split("-")[0], b.split("-")[0])


def faulty(bed: Testbed, rows: list[dict]) -> set[tuple[str, str]]:
    found = localize_network_fault(bed.topology(), rows)
    return {(s.kind, s.name) for s in found.suspects if s.faulty}


def test_the_fabric_routes_every_pair_and_pins_spines_by_tos(fabric: Testbed) -> None:
    """Clean: every pair of the full mesh echoes everything at the line rate, and no component is named; a pin is a
    real route: with one uplink down, the probes pinned to that spine from its leaf are lost, the others are not."""
    pairs = plan_pairs(fabric.topology(), "full_mesh")
    rows = probe(fabric, pairs)
    assert len(rows) == len(pairs) >= 100
    assert all(r["loss_rate"] == 0 for r in rows)
    # the line rate is 0.4 Gbit/s; a loaded CPU moves less (0.15 seen with CI running beside), a slow fault 0.04
    assert all(0.05 < r["bandwidth_gbps"] < 2 for r in rows), sorted(r["bandwidth_gbps"] for r in rows)
    assert faulty(fabric, rows) == set()
    fabric.inject("uplink_down", "leaf0-0~spine0")
    a, b = "node0-r0", "node4-r0"  # leaf0-0 and leaf0-1
    rows = probe(fabric, [(a, b, "spine0"), (a, b, "spine1")], throughput=0)
    assert [r["loss_rate"] for r in rows] == [1.0, 0.0]
    assert rows[0]["latency_us"] is None and rows[1]["spine"] == "spine1"


@pytest.mark.parametrize(
    ("kind", "target", "rate", "component"),
    [
        ("nic_down", "node3-r1", None, "nic"),
        ("node_down", "node5", None, "node"),
        ("uplink_down", "leaf1-1~spine0", None, "leaf_spine_link"),
        ("nic_slow", "node6-r0", 40, "nic"),
        ("link_slow", "leaf0-1~spine1", 40, "leaf_spine_link"),
        ("spine_slow", "spine1", 40, "spine"),
    ],
)
def test_an_injected_fault_is_localized_to_its_component(
    fabric: Testbed, kind: str, target: str, rate: float | None, component: str
) -> None:
    pairs = plan_pairs(fabric.topology(), "full_mesh")
    fabric.inject(kind, target, rate)
    assert faulty(fabric, probe(fabric, pairs)) == {(component, target)}
    fabric.clear_all()
    if kind.endswith("_down"):  # cleared for real: the routes through the link are made again
        rows = probe(fabric, [p for p in pairs if touches(fabric, p, target)], throughput=0)
        assert rows and all(r["loss_rate"] == 0 for r in rows)


@pytest.mark.anyio
async def test_plan_run_and_localize_in_three_calls(fabric: Testbed, app: App, tmp_path: Path) -> None:
    """The agent's path through the tools: plan_network_probes on the testbed's topology, run_network_probes (a job)
    on its pairs, localize_network_fault on the job; a NIC down is named, with nothing else."""
    topology_path, endpoints_path = fabric.write(tmp_path / "fabric")
    fabric.inject("nic_down", "node2-r0")

    async with Client(create_test_suite(app)) as client:
        plan = await call_ok(client, "plan_network_probes", {"path": str(topology_path), "mode": "full_mesh",
                                                              "limit": 5000})  # fmt: skip
        pairs = [[p["src_nic"], p["dst_nic"], p["via_spine"]] for p in plan["pairs"]]
        job = await call_ok(client, "run_network_probes", {
            "topology_path": str(topology_path), "endpoints_path": str(endpoints_path), "pairs": pairs,
            "bandwidth_bytes": THROUGHPUT, "wait_s": 50,
        })  # fmt: skip
        assert job["state"] == "SUCCEEDED", job
        result = job["result"]
        assert result["pairs"] == result["measured"] == len(pairs) and result["not_run"] == 0
        assert result["pinned"] + result["unpinned_cross_leaf"] <= result["measured"]
        assert result["all_lost"] >= 4  # every probe to or from node2-r0
        found = await call_ok(client, "localize_network_fault", {"job_id": job["job_id"]})
        named = {(s["kind"], s["name"]) for s in found["suspects"] if s["faulty"]}
        assert named == {("nic", "node2-r0")}
        # a job that is not there, endpoints that are not JSON, a NIC without an address: refused, saying why
        text = await call_error(client, "localize_network_fault", {"job_id": "not-a-job"})
        assert "job" in text
        (tmp_path / "bad.json").write_text("{nics")
        text = await call_error(
            client,
            "run_network_probes",
            {"topology_path": str(topology_path), "endpoints_path": str(tmp_path / "bad.json")},
        )
        assert "not JSON" in text
        (tmp_path / "empty.json").write_text('{"nics": {}}')
        text = await call_error(
            client,
            "run_network_probes",
            {"topology_path": str(topology_path), "endpoints_path": str(tmp_path / "empty.json")},
        )
        assert "no endpoint" in text


@pytest.mark.anyio
@pytest.mark.timeout(400)
async def test_plan_run_and_localize_over_slurm_agents(fabric: Testbed, app: App, tmp_path: Path,
                                                       slurm_cluster: Path) -> None:  # fmt: skip
    """run_network_probes with backend slurm: the testbed's 8 nodes are served by the two Slurm nodes' agents
    (node0-3 on node1, node4-7 on node2, endpoints.hosts), one Slurm job pinned to both; each agent joins the
    namespaces of its NICs, answers only signed datagrams, and probes from its own NICs. A NIC down is named, with
    nothing else; a probe job above the node-hour ceiling waits for the person."""
    topology_path, endpoints_path = fabric.write(tmp_path / "fabric")
    ends = json.loads(endpoints_path.read_text())
    ends["hosts"] = {f"node{i}": "node1" if i < 4 else "node2" for i in range(8)}
    endpoints_path.write_text(json.dumps(ends))
    fabric.inject("nic_down", "node5-r1")

    async with Client(create_test_suite(app)) as client:
        args = {"topology_path": str(topology_path), "endpoints_path": str(endpoints_path), "mode": "full_mesh",
                "backend": "slurm", "bandwidth_bytes": THROUGHPUT, "max_wall_s": 300, "wait_s": 0}  # fmt: skip
        view = await call_ok(client, "run_network_probes", args)
        job = await finish_job(client, view["job_id"], 300)
        assert job["state"] == "SUCCEEDED", job["reason"]
        result = job["result"]
        assert result["pairs"] == result["measured"] and result["not_run"] == 0, result["errors"]
        assert result["all_lost"] >= 7 and result["median_bandwidth_gbps"] > 0
        folder = Path(app.engine.get(job["job_id"]).job_dir)
        key = folder / "agent.key"
        assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
        scripts = " ".join(p.read_text(errors="replace") for p in folder.rglob("*.sh"))
        assert "agent-plan.json" in scripts and key.read_bytes().hex() not in scripts  # the key's path only
        agents = next(n for n in result["notes"] if "agents on 2 Slurm node(s)" in n)
        assert "node1, node2" in agents and "refused 0" in agents
        found = await call_ok(client, "localize_network_fault", {"job_id": job["job_id"]})
        named = {(s["kind"], s["name"]) for s in found["suspects"] if s["faulty"]}
        assert named == {("nic", "node5-r1")}
        text = await call_error(client, "run_network_probes", {**args, "max_wall_s": 6 * 3600})
        assert "llm-infra-mcp approve" in text, text


def test_bad_endpoints_are_refused_or_reported_never_probed(fabric: Testbed, tmp_path: Path) -> None:
    """A NIC without an endpoint, a spine that is not one, a namespace name with a slash: refused before the job;
    an address that is not on this machine: that probe is not run (binding fails: nothing is sent anywhere)."""
    topology, ends = fabric.topology(), fabric.endpoints()
    with pytest.raises(InputError, match="no endpoint"):
        build_spec(topology, {"nics": {}, "spines": {}}, [{"src_nic": "node0-r0", "dst_nic": "node1-r0"}])
    with pytest.raises(InputError, match="not a spine"):
        build_spec(topology, ends, [{"src_nic": "node0-r0", "dst_nic": "node4-r0", "via_spine": "leaf0-0"}])
    with pytest.raises(Exception, match="netns"):
        build_spec(topology, {"nics": {"node0-r0": {"address": "198.18.0.10", "netns": "../x"}}}, [])
    far = netprobe.Endpoint("192.0.2.1", ends["nics"]["node1-r0"]["netns"])  # TEST-NET-1: no NIC here has it
    near = netprobe.Endpoint(**ends["nics"]["node0-r0"])
    (result,) = netprobe.run_probes([netprobe.ProbeSpec("node0-r0", "node1-r0", near, far)], netprobe.ProbeSettings())
    assert result.error is not None and "cannot bind" in result.error and result.sent == 0
    json.dumps(result.row())  # still a well-formed row for a reader that wants it


def test_topology_and_endpoints_agree(bed: Testbed) -> None:
    topology, ends = bed.topology(), bed.endpoints()
    nics = [nic["name"] for node in topology["nodes"] for nic in node["nics"]]
    assert sorted(nics) == sorted(ends["nics"]) and len(nics) == 16
    assert len({e["address"] for e in ends["nics"].values()}) == 16
    spines = [s["name"] for s in topology["switches"] if s["tier"] == "spine"]
    assert spines == list(ends["spines"]) == ["spine0", "spine1"]
    with pytest.raises(ValueError, match="accepted"):
        bed.inject("nic_lossy", "node0-r0")
    with pytest.raises(ValueError, match="not in this testbed"):
        bed.inject("nic_down", "node99-r0")


def test_the_command_line_builds_injects_clears_and_removes(tmp_path: Path) -> None:
    """scripts/fault-testbed.py: up writes the files the tools read, fault breaks a real path, clear mends it
    (from another process: it keeps no memory of the fault), down leaves no namespace behind."""
    import subprocess
    import sys

    skip_unless_present(available())
    script = [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "fault-testbed.py")]

    def cli(*args: str) -> str:
        done = subprocess.run([*script, *args], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    folder = tmp_path / "bed"
    cli("up", str(folder), "--nodes", "4", "--leaves-per-rail", "1", "--rails", "1", "--spines", "1")
    state = json.loads((folder / "testbed.json").read_text())
    try:
        bed = Testbed.attach(state)
        pair = [("node0-r0", "node1-r0", None)]
        assert probe(bed, pair, throughput=0)[0]["loss_rate"] == 0
        cli("fault", str(folder), "nic_down", "node1-r0")
        assert probe(bed, pair, throughput=0)[0]["loss_rate"] == 1
        cli("clear", str(folder))
        assert probe(bed, pair, throughput=0)[0]["loss_rate"] == 0
        bad = subprocess.run([*script, "fault", str(folder), "nic_down", "node9-r0"], capture_output=True, text=True,
                             timeout=60, check=False)  # fmt: skip
        assert bad.returncode == 1 and "not in this testbed" in bad.stderr
    finally:
        cli("down", str(folder))
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    assert state["prefix"] not in listed


def test_a_spine_without_a_tos_is_probed_unpinned_and_its_rows_name_no_spine() -> None:
    """No root needed: a pin is only claimed when the endpoints say how to route it."""
    ends = {"nics": {"a": {"address": "198.18.0.10"}, "b": {"address": "198.18.1.11", "netns": "x"}},
            "spines": {"spine0": {"tos": 4}}}  # fmt: skip
    pinned, unknown, plain = netprobe.probe_specs(ends, [("a", "b", "spine0"), ("a", "b", "spine9"), ("b", "a", None)])
    assert (pinned.tos, pinned.spine) == (4, "spine0")
    assert (unknown.tos, unknown.spine) == (0, None)
    assert (plain.tos, plain.spine, plain.src.netns, plain.dst.netns) == (0, None, "x", None)


def test_a_probe_over_loopback_needs_no_root() -> None:
    """The probe engine itself, in this namespace: every echo back, a throughput, and settings out of bounds
    refused with what is accepted."""
    here = netprobe.Endpoint("127.0.0.1")
    result = netprobe.run_probe(
        netprobe.ProbeSpec("a", "b", here, here), netprobe.ProbeSettings(bandwidth_bytes=1 << 18)
    )
    assert result.error is None and result.loss_rate == 0 and result.received == result.sent == 20
    assert result.latency_us is not None and result.latency_us > 0 and (result.bandwidth_gbps or 0) > 0
    with pytest.raises(ValueError, match="accepted"):
        netprobe.ProbeSettings(count=0)
    with pytest.raises(ValueError, match="accepted"):
        netprobe.run_probes([], netprobe.ProbeSettings(), concurrency=0)
