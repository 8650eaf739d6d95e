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
) -> NetworkProbeSpec:
    """The job's spec, checked: every NIC of a pair is in the topology and has an endpoint; a pinned spine is one of
    the topology's. Pairs None: planned here (at most MAX_PAIRS)."""
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
        {"topology": topology, "endpoints": endpoints, "pairs": pairs, "planned": planned, "options": options or {}}
    )
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
    if problems:
        raise InputError("; ".join(problems[:10]))
    return spec


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
