"""run_network_probes' job: a probe plan's pairs measured on real sockets (servers/diagnostics/netprobe.py), written
as the rows localize_network_fault reads. Plain module (no MCP imports).

Input: a topology (plan_network_probes' format), the endpoints (where each NIC's address lives: ``{"nics": {nic:
{"address", "netns"?}}, "spines": {spine: {"tos"}}}``, as servers/diagnostics/testbed.py writes them for its
fabric), and the pairs: given, or planned here from the topology by the same planner as plan_network_probes (mode,
tp, pp, dp). A pair pinned to a spine (``via_spine``) is sent with that spine's TOS byte and its row names the spine
(the route is known); a spine without a TOS in the endpoints cannot be pinned: its pairs go unpinned (ECMP) and
their rows carry no spine, which the result says.

The job's folder gets ``topology.json`` (the fabric probed) and ``probes.jsonl`` (one row per probe, in the order of
the pairs), so localize_network_fault can be given just the job. Rows of probes that could not be set up (an address
that is not on this machine, a namespace that cannot be joined) are not measurements: they are left out of the rows
and counted, with their reasons, in the result; a job where no probe could be set up fails with the first reason.
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from servers.core.errors import InputError
from servers.core.models import Model
from servers.diagnostics import netprobe
from servers.diagnostics.netmodels import Topology

MAX_PAIRS = 5000
MAX_ERRORS_LISTED = 10
ROWS_FILE = "probes.jsonl"
TOPOLOGY_FILE = "topology.json"
NETNS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HOST_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # a Slurm node name (it reaches --nodelist)
MAX_HOSTS = 64  # Slurm nodes one probe job holds
SUMMARY_LAYOUT = "network-probes/1"


class NicEndpoint(Model):
    model_config = ConfigDict(extra="forbid")
    address: str = Field(max_length=15, description="The NIC's IPv4 address")
    netns: str | None = Field(default=None, max_length=64, description="Its network namespace (/run/netns); null: here")

    @field_validator("address")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        try:
            return str(ipaddress.IPv4Address(value))
        except ValueError:
            raise ValueError(f"address {value!r} is not an IPv4 address") from None

    @field_validator("netns")
    @classmethod
    def _netns(cls, value: str | None) -> str | None:
        if value is not None and not NETNS_NAME.match(value):
            raise ValueError(f"netns {value!r}: accepted: a name of letters, digits, '_', '.', '-' (up to 64)")
        return value


class SpineRoute(Model):
    model_config = ConfigDict(extra="forbid")
    tos: int = Field(ge=4, le=252, multiple_of=4, description="IP TOS byte the fabric routes to this spine by")


class Endpoints(Model):
    model_config = ConfigDict(extra="forbid")
    nics: dict[Annotated[str, Field(max_length=128)], NicEndpoint] = Field(max_length=65_536)
    spines: dict[Annotated[str, Field(max_length=128)], SpineRoute] = Field(default_factory=dict, max_length=4096)
    hosts: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(pattern=HOST_NAME)]] = Field(
        default_factory=dict, max_length=65_536,
        description="backend slurm: {topology node: its Slurm node}; a node not named is its own Slurm node",
    )  # fmt: skip


class Pair(Model):
    model_config = ConfigDict(extra="forbid")
    src_nic: str = Field(min_length=1, max_length=128)
    dst_nic: str = Field(min_length=1, max_length=128)
    via_spine: str | None = Field(default=None, max_length=128)


class ProbeOptions(Model):
    model_config = ConfigDict(extra="forbid")
    # The bounds are netprobe's (ProbeSettings checks them again): one place says what a probe may do.
    count: int = Field(default=20, ge=1, le=netprobe.MAX_COUNT, description="UDP echoes per probe")
    size: int = Field(default=64, ge=netprobe.HEADER.size, le=netprobe.MAX_SIZE, description="Bytes per echo")
    interval_s: float = Field(default=0.002, ge=0, le=1)
    timeout_s: float = Field(default=0.5, ge=0.01, le=30, description="Wait for echoes after the last send")
    bandwidth_bytes: int = Field(default=0, ge=0, le=netprobe.MAX_BANDWIDTH_BYTES, description="0: no throughput probe")
    bandwidth_timeout_s: float = Field(default=5.0, ge=0.1, le=120)
    concurrency: int = Field(
        default=4, ge=1, le=netprobe.MAX_CONCURRENCY, description="Probes at once (NIC-disjoint with throughput)"
    )


class NetworkProbeSpec(Model):
    model_config = ConfigDict(extra="forbid")
    topology: Topology
    endpoints: Endpoints
    pairs: list[Pair] = Field(max_length=MAX_PAIRS)
    planned: str | None = Field(default=None, description="The plan's mode, when the pairs were planned here")
    options: ProbeOptions = Field(default_factory=ProbeOptions)
    backend: Literal["local", "slurm"] = Field(
        default="local", description="local: both ends here; slurm: an agent on each pair's nodes (netagent.py)"
    )
    partition: str | None = Field(default=None, pattern=HOST_NAME)
    probe_wall_s: float = Field(default=1800, gt=0, le=6 * 3600, description="slurm: the agents' job's time limit")


class NotRun(Model):
    """A probe that could not be set up, and why."""

    src_nic: str
    dst_nic: str
    error: str


class NetworkProbeReport(Model):
    pairs: int = Field(description="Probes asked for")
    measured: int = Field(description="Probes that ran (rows written)")
    not_run: int = Field(description="Probes that could not be set up (no row)")
    pinned: int = Field(description="Rows whose spine is known (pinned by TOS)")
    unpinned_cross_leaf: int = Field(description="Cross-leaf rows with ECMP routes (spine unknown)")
    with_loss: int = Field(description="Rows that lost any echo")
    all_lost: int = Field(description="Rows that lost every echo")
    median_latency_us: float | None = None
    median_bandwidth_gbps: float | None = None
    rows_file: str = Field(description="In the job folder: the rows, one JSON object a line")
    topology_file: str
    planned: str | None = None
    errors: list[NotRun] = Field(default_factory=list, description=f"At most {MAX_ERRORS_LISTED}")
    notes: list[str] = Field(default_factory=list)
    wall_s: float


def build_spec(
    topology: dict[str, Any],
    endpoints: dict[str, Any],
    pairs: list[dict[str, Any]] | None,
    *,
    mode: Literal["skeleton", "rail", "full_mesh"] = "skeleton",
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    options: dict[str, Any] | None = None,
    backend: Literal["local", "slurm"] = "local",
    partition: str | None = None,
    probe_wall_s: float = 1800,
) -> NetworkProbeSpec:
    """The job's spec, checked: every NIC of a pair is in the topology and has an endpoint; a pinned spine is one of
    the topology's; on Slurm, every host is a node name and at most MAX_HOSTS of them. Pairs None: planned here (at
    most MAX_PAIRS)."""
    from servers.diagnostics.netloc import build_index, plan_pairs

    build_index(topology)  # the topology's own checks (names, leaves, uplinks), with its clear errors
    planned = None
    if pairs is None:
        planned = mode
        pairs = [
            {"src_nic": a, "dst_nic": b, "via_spine": v}
            for a, b, v in plan_pairs(topology, mode, tp=tp, pp=pp, dp=dp, max_pairs=MAX_PAIRS)
        ]
    if len(pairs) > MAX_PAIRS:
        raise InputError(f"pairs: {len(pairs):,}; accepted: at most {MAX_PAIRS:,} a job (split the plan by offset)")
    spec = NetworkProbeSpec.model_validate(
        {
            "topology": topology, "endpoints": endpoints, "pairs": pairs, "planned": planned, "options": options or {},
            "backend": backend, "partition": partition, "probe_wall_s": probe_wall_s,
        }
    )  # fmt: skip
    nics = {nic.name for node in spec.topology.nodes for nic in node.nics}
    spines = {s.name for s in spec.topology.switches if s.tier == "spine"}
    problems = []
    for i, pair in enumerate(spec.pairs):
        for end in (pair.src_nic, pair.dst_nic):
            if end not in nics:
                problems.append(f"pairs[{i}]: NIC {end!r} is not in the topology")
            elif end not in spec.endpoints.nics:
                problems.append(f"pairs[{i}]: NIC {end!r} has no endpoint (address) in endpoints.nics")
        if pair.src_nic == pair.dst_nic:
            problems.append(f"pairs[{i}]: a NIC probed against itself ({pair.src_nic})")
        if pair.via_spine is not None and pair.via_spine not in spines:
            problems.append(f"pairs[{i}]: via_spine {pair.via_spine!r} is not a spine of the topology")
        if len(problems) >= 10:
            break
    if spec.backend == "slurm":
        node_names = {node.name for node in spec.topology.nodes}
        problems += [f"endpoints.hosts: {n!r} is not a node of the topology" for n in spec.endpoints.hosts
                     if n not in node_names][:3]  # fmt: skip
        if spec.options.size < netprobe.HEADER.size + netprobe.MAC_SIZE:
            problems.append(f"size: at least {netprobe.HEADER.size + netprobe.MAC_SIZE} bytes on Slurm (signed echoes)")
        used = probe_hosts(spec)
        if len(used) > MAX_HOSTS:
            problems.append(f"the pairs span {len(used)} Slurm nodes; at most {MAX_HOSTS} a job (split the plan)")
        bad = [h for h in used if not re.match(HOST_NAME, h)]
        if bad:
            problems.append(f"node {bad[0]!r} is not a Slurm node name (name it in endpoints.hosts)")
    if problems:
        raise InputError("; ".join(problems[:10]))
    return spec


def hosts_of(spec: NetworkProbeSpec) -> dict[str, str]:
    """{nic: the Slurm node it is on}: its topology node, or what endpoints.hosts names for that node."""
    hosts = spec.endpoints.hosts
    return {nic.name: hosts.get(node.name, node.name) for node in spec.topology.nodes for nic in node.nics}


def probe_hosts(spec: NetworkProbeSpec) -> list[str]:
    """The Slurm nodes the pairs' NICs are on, in order of first use."""
    where = hosts_of(spec)
    return list(dict.fromkeys(where[end] for p in spec.pairs for end in (p.src_nic, p.dst_nic) if end in where))


def run_network_probes_job(spec_data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The job's work: every pair probed, the rows written, the report returned."""
    import statistics

    from servers.core.procs import stop_on_sigterm

    spec = NetworkProbeSpec.model_validate(spec_data)
    started = time.time()
    opts = spec.options
    settings = netprobe.ProbeSettings(**opts.model_dump(exclude={"concurrency"}))
    leaf_of = {nic.name: nic.leaf for node in spec.topology.nodes for nic in node.nics}
    notes: list[str] = []
    unroutable = sorted({p.via_spine for p in spec.pairs if p.via_spine and p.via_spine not in spec.endpoints.spines})
    if unroutable:
        notes.append(
            f"spine(s) {', '.join(unroutable[:5])} have no TOS in endpoints.spines: their pairs ran unpinned (ECMP) "
            "and their rows name no spine"
        )
    probes = netprobe.probe_specs(
        spec.endpoints.model_dump(mode="json"), [(p.src_nic, p.dst_nic, p.via_spine) for p in spec.pairs]
    )
    folder = Path(ctx.files.dir)
    (folder / TOPOLOGY_FILE).write_text(json.dumps(spec.topology.model_dump(mode="json")))
    ctx.progress(0, len(probes), f"probing {len(probes)} pair(s)")

    def on_done(done: int, total: int) -> None:
        ctx.progress(done, total, f"{done}/{total} probes")

    with stop_on_sigterm() as stop:
        if spec.backend == "slurm":
            results, agents = run_agents(spec, probes, settings, ctx, stop)
            notes.append(
                f"probed by agents on {len(agents['hosts'])} Slurm node(s) ({', '.join(agents['hosts'][:8])}); their "
                f"responders echoed {agents['echoed']} signed datagram(s) and refused {agents['refused']}"
            )
        else:
            results = netprobe.run_probes(probes, settings, concurrency=opts.concurrency, on_done=on_done, stop=stop)
    measured = [r for r in results if r.error is None]
    failed = [r for r in results if r.error is not None]
    if probes and not measured:
        raise RuntimeError(f"no probe could be set up ({len(failed)} tried); the first: {failed[0].error}")
    with open(folder / ROWS_FILE, "w") as f:
        for r in measured:
            f.write(json.dumps(r.row()) + "\n")
    latencies = [r.latency_us for r in measured if r.latency_us is not None]
    bandwidths = [r.bandwidth_gbps for r in measured if r.bandwidth_gbps is not None]
    if opts.bandwidth_bytes == 0:
        notes.append("latency and loss only: a rate-limited (slow) link shows in throughput (bandwidth_bytes > 0)")
    report = NetworkProbeReport(
        pairs=len(probes), measured=len(measured), not_run=len(failed),
        pinned=sum(r.spine is not None for r in measured),
        unpinned_cross_leaf=sum(r.spine is None and leaf_of[r.src_nic] != leaf_of[r.dst_nic] for r in measured),
        with_loss=sum(r.loss_rate > 0 for r in measured), all_lost=sum(r.loss_rate >= 1 for r in measured),
        median_latency_us=round(statistics.median(latencies), 2) if latencies else None,
        median_bandwidth_gbps=round(statistics.median(bandwidths), 6) if bandwidths else None,
        rows_file=ROWS_FILE, topology_file=TOPOLOGY_FILE, planned=spec.planned,
        errors=[NotRun(src_nic=r.src_nic, dst_nic=r.dst_nic, error=r.error or "") for r in failed[:MAX_ERRORS_LISTED]],
        notes=notes, wall_s=round(time.time() - started, 3),
    )  # fmt: skip
    return report.model_dump(mode="json")


# ---- on Slurm: an agent per node (netagent.py) ------------------------------------------------------------------


class AgentRow(Model):
    """One probe's result as an agent wrote it: read as hostile (the job folder is the job's to write)."""

    model_config = ConfigDict(extra="forbid")
    src_nic: str = Field(max_length=128)
    dst_nic: str = Field(max_length=128)
    latency_us: float | None = Field(ge=0, le=1e9)
    loss_rate: float = Field(ge=0, le=1)
    bandwidth_gbps: float | None = Field(default=None, ge=0, le=1e6)
    spine: str | None = Field(default=None, max_length=128)
    sent: int = Field(default=0, ge=0, le=netprobe.MAX_COUNT)
    received: int = Field(default=0, ge=0, le=netprobe.MAX_COUNT)
    error: str | None = Field(default=None, max_length=500)


class AgentResults(Model):
    model_config = ConfigDict(extra="forbid")
    results: list[AgentRow] = Field(max_length=MAX_PAIRS)
    hosts: list[Annotated[str, Field(max_length=128)]] = Field(max_length=MAX_HOSTS)
    echoed: int = Field(ge=0)
    refused: int = Field(ge=0)


MAX_RESULTS_BYTES = 16 * 2**20


def agent_plan(spec: NetworkProbeSpec, probes: list[netprobe.ProbeSpec], settings: netprobe.ProbeSettings) -> dict:
    """What every agent reads: the probes with their hosts, the settings, the concurrency, the deadline."""
    from dataclasses import asdict

    where = hosts_of(spec)
    return {
        "probes": [
            {**asdict(p), "src_host": where[p.src_nic], "dst_host": where[p.dst_nic]} for p in probes
        ],
        "settings": asdict(settings), "concurrency": spec.options.concurrency,
        "deadline_s": max(10.0, spec.probe_wall_s * 0.9),  # the rest of the time limit: the agents' start and end
    }  # fmt: skip


def run_agents(
    spec: NetworkProbeSpec, probes: list[netprobe.ProbeSpec], settings: netprobe.ProbeSettings, ctx: Any, stop: Any
) -> tuple[list[netprobe.ProbeResult], dict[str, Any]]:
    """The probes run by one Slurm job of an agent per node (pinned with --nodelist, one task a node) through the
    engines registry's Slurm backend; the job's key made here (mode 0600, in the job folder, never in argv). The
    results (validated) in the probes' order, and what the agents said of themselves."""
    import os
    import secrets

    from servers.core.jobstore import JobState
    from servers.diagnostics import netagent
    from servers.engines import registry
    from servers.engines.backend import SubmitRequest
    from servers.engines.follow import follow

    folder = Path(ctx.files.dir)
    fd = os.open(folder / netagent.KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(netagent.KEY_BYTES))
    plan_path, out_path = folder / netagent.PLAN_FILE, folder / netagent.RESULTS_FILE
    plan_path.write_text(json.dumps(agent_plan(spec, probes, settings)))
    hosts = probe_hosts(spec)
    info = registry.get("slurm")
    backend = info.build({"job_root": str(folder / "agents")})
    job = {
        "script": str(Path(netagent.__file__).resolve()), "args": ["--plan", str(plan_path), "--out", str(out_path)],
        "nnodes": len(hosts), "nproc_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1,
        "max_wall_s": spec.probe_wall_s, "run_id": "agents", "name": "net-probes",
        "options": {"nodelist": ",".join(hosts), "partition": spec.partition}, "env": {}, "max_restarts": 0,
    }  # fmt: skip
    plan = backend.plan(job, job_dir=folder / "agents" / "agents")
    handle = backend.submit(plan, SubmitRequest(key=f"{ctx.job_id}-agents", spec=job))
    status = follow(
        backend, handle, ctx, stop, info=info, total=len(probes), prefix=f"agents on {len(hosts)} node(s): "
    )
    if status.state is not JobState.SUCCEEDED:
        raise RuntimeError(
            f"the agents' Slurm job ended {status.state.value}: {status.reason or 'no reason given'} (its logs: "
            "read_job_logs of this job, agents/agents in its folder)"
        )
    try:
        if out_path.stat().st_size > MAX_RESULTS_BYTES:
            raise ValueError(f"over {MAX_RESULTS_BYTES} bytes")
        data = AgentResults.model_validate_json(out_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"the agents' results ({netagent.RESULTS_FILE}) cannot be read: {str(exc)[:300]}") from None
    if len(data.results) != len(probes) or any(
        (r.src_nic, r.dst_nic) != (p.src_nic, p.dst_nic) for r, p in zip(data.results, probes, strict=False)
    ):
        raise RuntimeError(f"the agents' results ({netagent.RESULTS_FILE}) are not those of this job's probes")
    results = [netprobe.ProbeResult(**r.model_dump()) for r in data.results]
    return results, {"hosts": data.hosts, "echoed": data.echoed, "refused": data.refused}


def probe_launch(spec: NetworkProbeSpec) -> Any:
    """The admission Launch of a Slurm probe job: its nodes held for its time limit (node-hours; no GPU)."""
    from servers.core.display import visible
    from servers.engines.admission import Launch, hours, spec_plan_id

    hosts = probe_hosts(spec)
    _, node_hours = hours(jobs=1, nodes=len(hosts), gpus_per_node=0, wall_s=spec.probe_wall_s)
    shown = ", ".join(visible(h) for h in hosts[:16]) + (f" and {len(hosts) - 16} more" if len(hosts) > 16 else "")
    summary = {
        "layout": SUMMARY_LAYOUT, "what": f"network probes ({len(spec.pairs)} pairs)", "backend": "slurm",
        "nodes": hosts, "pairs": len(spec.pairs), "partition": spec.partition, "gpus_per_node": 0,
        "probe_wall_s": spec.probe_wall_s, "estimated_node_hours": node_hours,
    }  # fmt: skip
    return Launch(
        plan_id=spec_plan_id(SUMMARY_LAYOUT, spec.model_dump(mode="json")), gpu_hours=0.0, node_hours=node_hours,
        message=(
            f"Start a network probe job on Slurm: {len(spec.pairs)} pair(s) on {len(hosts)} node(s): {shown}"
            + (f", partition {visible(spec.partition)}" if spec.partition else "")
            + f"; one CPU a node, no GPU, for at most {spec.probe_wall_s:g} s: up to {node_hours:,.4g} node-hours."
        ),
        summary=summary, plan_tool="run_network_probes", submit_tool="run_network_probes", token_name="arguments",
        confirm_label="Start these probes",
    )  # fmt: skip


async def admit_probe_job(settings: Any, spec: NetworkProbeSpec, *, ask: Any, who: str) -> Any:
    """A Slurm probe job through admission (the wall-time quota; the person's approval above the node-hour
    ceiling): its Admission. Raises InputError (QuotaError) when it may not start."""
    from servers.engines import admission, registry

    if not registry.get("slurm").can("node_pinning"):
        raise InputError("backend slurm: its registered backend cannot pin a job to nodes, which the agents need")
    admission.check_wall(settings, spec.probe_wall_s)
    launch = probe_launch(spec)
    return await admission.admit(
        settings, launch,
        needed=admission.confirmation_needed(
            settings, backend="slurm", gpus_per_node=0, gpu_hours=0.0, node_hours=launch.node_hours
        ),
        ask=ask, has_token=True, who=who, audit={"plan_id": launch.plan_id, "estimated_node_hours": launch.node_hours},
        declined=f"not started: the person declined the network probes ({launch.node_hours:.3g} node-hours at most)",
    )  # fmt: skip


def read_job_rows(job_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A finished probe job's topology and rows (what localize_network_fault reads by job)."""
    try:
        topology = json.loads((job_dir / TOPOLOGY_FILE).read_text())
        text = (job_dir / ROWS_FILE).read_text()
    except (OSError, ValueError) as exc:
        raise InputError(f"the job's probe rows cannot be read ({exc}); did it finish?") from None
    try:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as exc:
        raise InputError(f"the job's {ROWS_FILE} is damaged ({exc})") from None
    if not isinstance(topology, dict) or not all(isinstance(r, dict) for r in rows):
        raise InputError(f"the job's {TOPOLOGY_FILE} or {ROWS_FILE} is not what the job writes")
    return topology, rows
