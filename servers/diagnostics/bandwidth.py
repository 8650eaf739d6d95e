"""check_collective_bandwidth: collective bus bandwidth per node, per pair of nodes, or over the whole allocation,
measured by real jobs and judged.

Modes (what each probe is):
- ``node``: every node alone, with all its ranks (GPUs): the intra-node fabric (NVLink/NVSwitch, or PCIe);
- ``pairwise``: every pair of nodes (or the pairs given, e.g. from plan_network_probes), one rank per GPU on both:
  the network between them;
- ``all``: one probe over every node.

Where: ``local`` runs the node probe here (ranks spawned by the job, NCCL on the GPUs, gloo on CPU); ``slurm`` runs
each probe as a Slurm job pinned to its nodes (--nodelist), one probe at a time so that probes do not share links,
through the engines registry's Slurm backend (the batch script, the exit record, states exact). Every probe runs
bandwidth_probe.py (the same timing and exact check as benchmark_collective) and writes an nccl-tests-layout table.

Admission (slurm): before the check's job starts, its nodes are fixed (sinfo's, when none are given) and the probes'
cost bounded (probes x nodes each x GPUs per node x probe_wall_s; node-hours for CPU nodes); admission
(servers/engines/admission.py) then applies the quotas (GPUs per probe job, the wall-time limit) and, above the
confirmation ceilings, asks the person exactly as a training launch does, the plan id derived from the normalised
spec (`admit_probes`).

Judging: each probe's table goes through parse_nccl_tests, whose verdict compares the best large-message bus
bandwidth with the floors of known single-node configurations (8x H100 460 GB/s with NVLS, ~370 without; 8x H200
431; 8x A100 228), each floor with its assumption. Probes no floor covers (CPU, cross-node pairs, other GPU
counts) are judged against the fleet instead: a probe below FLEET_DEGRADED (80%) of the median of its mode's
probes is DEGRADED, below FLEET_FAIL (50%) FAIL, stated as such; with fewer than 3 probes there is no fleet to
compare with, and the status is UNKNOWN unless a floor applies. The result names the slowest nodes and pairs and
holds a node x node matrix of the peak bus bandwidth (pairs off the diagonal, single nodes on it), drawn as a
heatmap PNG in the job folder.

Plain module (no MCP); torch and matplotlib are imported inside functions.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError, model_validator

from servers.core.errors import InputError
from servers.core.models import Model

if TYPE_CHECKING:
    from servers.core.settings import Settings
    from servers.engines.admission import Admission, Ask, Launch

PROBE_SCRIPT = Path(__file__).resolve().with_name("bandwidth_probe.py")
MAX_NODES = 64
MAX_PROBES = 256
FLEET_DEGRADED = 0.8
FLEET_FAIL = 0.5
MIN_FLEET = 3
HEATMAP = "bandwidth-heatmap.png"
SUMMARY_LAYOUT = "bandwidth-check/1"  # what `llm-infra-mcp approve` knows how to show field by field
NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

Status = Literal["PASS", "DEGRADED", "FAIL", "UNKNOWN"]


class BandwidthCheckSpec(Model):
    mode: Literal["node", "pairwise", "all"] = Field(default="node", description="What each probe spans")
    backend: Literal["local", "slurm"] = Field(default="local", description="local: this node; slurm: the cluster")
    nodes: list[str] | None = Field(
        default=None,
        max_length=MAX_NODES,
        description="Slurm nodes to check (default: every node sinfo lists as idle or mixed)",
    )
    pairs: list[tuple[str, str]] | None = Field(
        default=None, max_length=MAX_PROBES, description="pairwise: just these pairs (e.g. a probe plan's)"
    )
    op: Literal["all_reduce", "all_gather", "reduce_scatter"] = "all_reduce"
    sizes: list[int] = Field(
        default_factory=lambda: [1 << 20, 4 << 20, 16 << 20],
        min_length=1,
        max_length=16,
        description="Message sizes in bytes (on GPUs the floors read rows of 256 MiB and more: ask for them)",
    )
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    nproc_per_node: int = Field(default=0, ge=0, le=64, description="Ranks per node; 0: the GPUs, or 2 on CPU")
    gpus_per_node: int = Field(default=0, ge=0, le=64, description="Slurm: GPUs to ask for per node")
    partition: str | None = Field(default=None, max_length=64)
    warmup: int = Field(default=3, ge=0, le=100)
    iters: int = Field(default=10, ge=1, le=1000)
    probe_wall_s: float = Field(default=600, gt=0, le=6 * 3600, description="Slurm: time limit of each probe job")

    @model_validator(mode="after")
    def _check(self) -> BandwidthCheckSpec:
        import re

        for name in [*(self.nodes or []), *(n for p in self.pairs or [] for n in p)]:
            if not re.fullmatch(NODE_NAME, name):
                raise ValueError(f"node {name!r}: accepted: a Slurm node name (letters, digits, '_', '.', '-')")
        for a, b in self.pairs or []:
            if a == b:
                raise ValueError(f"pair ({a}, {b}): a pair is two different nodes")
        if self.pairs and self.mode != "pairwise":
            raise ValueError("pairs: given with mode pairwise only")
        if self.backend == "local" and (self.mode != "node" or self.nodes or self.pairs):
            raise ValueError(
                "backend local checks this node only (mode node, no nodes or pairs); accepted for pairwise, all or "
                "named nodes: backend slurm"
            )
        if self.mode == "node" and self.nproc_per_node == 1:
            raise ValueError("nproc_per_node 1 with mode node: one rank alone moves no data; accepted: 0 or >= 2")
        if any(s < 1 or s > 1 << 34 for s in self.sizes):
            raise ValueError("sizes: accepted: 1 byte to 16 GiB each")
        return self


class ProbeResult(Model):
    nodes: list[str] = Field(description="The nodes the probe spanned (one: a node check; two: a pair)")
    state: str = Field(description="SUCCEEDED, or how the probe's job ended")
    busbw_gbps: float | None = Field(default=None, description="The best bus bandwidth over the probe's rows")
    at_bytes: int | None = Field(default=None, description="The message size of that row")
    wrong: int = Field(default=0, description="Elements that differed from the expected result (all rows)")
    floor_status: str | None = Field(default=None, description="parse_nccl_tests' verdict against known floors")
    floor_detail: str | None = None
    fleet_ratio: float | None = Field(default=None, description="busbw / the median of this mode's probes")
    status: Status
    why: str
    table: str | None = Field(default=None, description="The probe's table in nccl-tests' layout")
    reason: str | None = Field(default=None, description="Why the probe has no measurement")


class BandwidthReport(Model):
    mode: str
    backend: str
    op: str
    nodes: list[str]
    probes: list[ProbeResult]
    counts: dict[str, int] = Field(description="Probes per status; they add up to the probes")
    fleet_median_gbps: float | None = None
    matrix: list[list[float | None]] = Field(
        description="node x node peak busbw (GB/s): pairs off the diagonal, single-node probes on it; None: not probed"
    )
    slowest_nodes: list[str] = Field(description="Nodes of the probes below the fleet or a floor, worst first")
    slowest_pairs: list[tuple[str, str]] = Field(description="Pairs below the fleet, worst first")
    heatmap: str | None = Field(default=None, description="The matrix as a PNG in the job folder (file name)")
    assumptions: list[str]
    warnings: list[str] = Field(default_factory=list)


# ---- probes --------------------------------------------------------------------------------------------------------
def probe_groups(spec: BandwidthCheckSpec, nodes: list[str]) -> list[list[str]]:
    """The node sets of the probes, in order."""
    if spec.mode == "node":
        return [[n] for n in nodes]
    if spec.mode == "all":
        return [list(nodes)]
    pairs = [list(p) for p in spec.pairs] if spec.pairs else [list(p) for p in itertools.combinations(nodes, 2)]
    if not pairs:
        raise InputError("pairwise: needs at least two nodes")
    if len(pairs) > MAX_PROBES:
        raise InputError(f"pairwise: {len(pairs)} pairs; at most {MAX_PROBES} (give pairs, e.g. a probe plan's)")
    return pairs


def best_row(rows: list[dict[str, Any]]) -> tuple[float | None, int | None]:
    good = [r for r in rows if isinstance(r.get("busbw"), int | float) and r.get("wrong", 0) <= 0]
    if not good:
        return None, None
    top = max(good, key=lambda r: r["busbw"])
    return float(top["busbw"]), int(top["size"])


def judge_probe(nodes: list[str], record: dict[str, Any] | None, text: str | None, state: str) -> ProbeResult:
    """One probe's measurement and its verdict against the known floors (fleet comparison comes later)."""
    if record is None or text is None:
        return ProbeResult(
            nodes=nodes, state=state, status="FAIL" if state != "CANCELLED" else "UNKNOWN",
            why="the probe produced no measurement", reason=state,
        )  # fmt: skip
    from servers.diagnostics.nccl_tests import parse_nccl_tests

    rows = list(record.get("rows") or [])
    busbw, size = best_row(rows)
    if not busbw:
        return ProbeResult(
            nodes=nodes, state=state, status="UNKNOWN", table=text[-20000:],
            why="no row moved data (a single rank, or every row wrong): nothing to judge",
        )  # fmt: skip
    wrong = sum(int(r.get("wrong", 0)) for r in rows if int(r.get("wrong", 0)) > 0)
    verdict = parse_nccl_tests(text).verdict
    floor_status = verdict.status if verdict.judged_on == "bandwidth" and verdict.status != "UNKNOWN" else None
    if wrong:
        status: Status = "FAIL"
        why = f"{wrong} element(s) of the results were wrong: data corruption on this path"
    elif floor_status is not None:
        status, why = floor_status, verdict.text  # type: ignore[assignment]
    else:
        status, why = "UNKNOWN", f"no known floor applies ({verdict.text})"
    return ProbeResult(
        nodes=nodes, state=state, busbw_gbps=busbw, at_bytes=size, wrong=wrong, floor_status=floor_status,
        floor_detail=verdict.text, status=status, why=why, table=text[-20000:],
    )  # fmt: skip


def against_fleet(probes: list[ProbeResult]) -> float | None:
    """Judge the probes no floor judged against the median of all measured probes (in place); the median."""
    measured = [p.busbw_gbps for p in probes if p.busbw_gbps is not None and p.busbw_gbps > 0]
    if len(measured) < MIN_FLEET:
        for p in probes:
            if p.status == "UNKNOWN" and p.busbw_gbps is not None:
                p.why += f"; {len(measured)} measured probe(s): fewer than {MIN_FLEET}, no fleet to compare with"
        return statistics.median(measured) if measured else None
    median = statistics.median(measured)
    for p in probes:
        if p.busbw_gbps is None:
            continue
        p.fleet_ratio = p.busbw_gbps / median
        if p.status != "UNKNOWN":
            continue
        if p.fleet_ratio < FLEET_FAIL:
            p.status = "FAIL"
        elif p.fleet_ratio < FLEET_DEGRADED:
            p.status = "DEGRADED"
        else:
            p.status = "PASS"
        p.why = (
            f"{p.busbw_gbps:.4g} GB/s is {p.fleet_ratio:.0%} of the fleet's median {median:.4g} GB/s (DEGRADED "
            f"below {FLEET_DEGRADED:.0%}, FAIL below {FLEET_FAIL:.0%}); no absolute floor applies"
        )
    return median


def build_report(spec: BandwidthCheckSpec, nodes: list[str], probes: list[ProbeResult]) -> BandwidthReport:
    median = against_fleet(probes)
    index = {n: i for i, n in enumerate(nodes)}
    matrix: list[list[float | None]] = [[None] * len(nodes) for _ in nodes]
    for p in probes:
        if p.busbw_gbps is None or len(p.nodes) > 2:
            continue
        a, b = index[p.nodes[0]], index[p.nodes[-1]]
        matrix[a][b] = matrix[b][a] = p.busbw_gbps
    bad = sorted(
        (p for p in probes if p.status in ("FAIL", "DEGRADED")),
        key=lambda p: (p.status != "FAIL", p.busbw_gbps if p.busbw_gbps is not None else -1.0),
    )
    slow_nodes: list[str] = []
    for p in bad:
        if len(p.nodes) == 1 and p.nodes[0] not in slow_nodes:
            slow_nodes.append(p.nodes[0])
    if spec.mode == "pairwise":  # a node in several slow pairs is the likely culprit
        hits: dict[str, int] = {}
        for p in bad:
            for n in p.nodes:
                hits[n] = hits.get(n, 0) + 1
        slow_nodes += [n for n, k in sorted(hits.items(), key=lambda kv: -kv[1]) if k >= 2 and n not in slow_nodes]
    counts = {s: sum(p.status == s for p in probes) for s in ("PASS", "DEGRADED", "FAIL", "UNKNOWN")}
    assumptions = [
        "floors (parse_nccl_tests): single-node 8-GPU all_reduce, e.g. 8x H100 460 GB/s with NVLink SHARP (NVLS), "
        "~370 GB/s without; 8x H200 431; 8x A100 228; judged on rows of 256 MiB and more",
        f"fleet: a probe no floor covers is compared with the median of this check's probes (DEGRADED below "
        f"{FLEET_DEGRADED:.0%}, FAIL below {FLEET_FAIL:.0%}; at least {MIN_FLEET} measured probes)",
        "busbw: nccl-tests' bus bandwidth (all_reduce algbw x 2(n-1)/n); the best row of each probe",
    ]
    warnings = []
    if any(p.state != "SUCCEEDED" for p in probes):
        warnings.append("some probes did not run to the end: their nodes or pairs count as FAIL (see reason)")
    if all(p.floor_status is None for p in probes) and any(
        p.table and " cpu" in p.table for p in probes
    ):  # gloo on CPU
        warnings.append("the probes ran on CPU (gloo): the figures check the plumbing and the network path, not GPUs")
    return BandwidthReport(
        mode=spec.mode, backend=spec.backend, op=spec.op, nodes=nodes, probes=probes, counts=counts,
        fleet_median_gbps=median, matrix=matrix, slowest_nodes=slow_nodes,
        slowest_pairs=[(p.nodes[0], p.nodes[1]) for p in bad if len(p.nodes) == 2],
        assumptions=assumptions, warnings=warnings,
    )  # fmt: skip


def draw_heatmap(report: BandwidthReport, path: Path) -> bool:
    """The matrix as a PNG (matplotlib, Agg); False when there is nothing to draw."""
    if not any(v is not None for row in report.matrix for v in row):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    values = np.array([[np.nan if v is None else v for v in row] for row in report.matrix], dtype=float)
    n = len(report.nodes)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * n + 2), max(3.5, 0.5 * n + 1.5)), dpi=100)
    image = ax.imshow(values, cmap="viridis", interpolation="nearest")
    ax.set_xticks(range(n), report.nodes, rotation=90, fontsize=8)
    ax.set_yticks(range(n), report.nodes, fontsize=8)
    if n <= 16:
        for i in range(n):
            for j in range(n):
                if not np.isnan(values[i, j]):
                    ax.text(j, i, f"{values[i, j]:.3g}", ha="center", va="center", fontsize=7, color="white")
    fig.colorbar(image, ax=ax, label=f"{report.op} busbw (GB/s)")
    ax.set_title(f"{report.op} bus bandwidth, {report.mode} ({report.backend}); blank: not probed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return True


# ---- admission (slurm) ---------------------------------------------------------------------------------------------
class ProbeCost(Model):
    """What the probes of a Slurm check hold at most: they run one at a time, each for up to probe_wall_s."""

    probes: int
    nodes_per_probe: int = Field(description="The widest probe's nodes")
    gpus_per_node: int
    probe_wall_s: float
    max_gpus_at_once: int = Field(description="The widest probe's GPUs (one probe runs at a time)")
    gpu_hours: float
    node_hours: float


def normalise(spec: BandwidthCheckSpec, listed: list[str] | None) -> BandwidthCheckSpec:
    """The spec with its nodes fixed: those given, else `listed` (sinfo's usable nodes), then the nodes of the
    given pairs; what the check costs and what its approval names. Refuses more nodes or probes than a check runs."""
    nodes = list(spec.nodes if spec.nodes is not None else listed or [])
    if not nodes and not spec.pairs:
        raise InputError("slurm: no usable node (sinfo lists none idle, mixed or allocated)")
    nodes += [n for p in spec.pairs or [] for n in p if n not in nodes]
    if len(nodes) > MAX_NODES:
        raise InputError(
            f"nodes: {len(nodes)} (sinfo's usable nodes, or those of the pairs); at most {MAX_NODES} a check: name "
            "them with nodes, or give a partition"
        )
    try:  # sinfo's names pass the spec's own checks (they reach --nodelist and the person's screen)
        fixed = BandwidthCheckSpec.model_validate({**spec.model_dump(mode="json"), "nodes": nodes})
    except ValidationError as exc:
        said = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise InputError(f"nodes: sinfo listed a node this check cannot name: {said}") from None
    groups = probe_groups(fixed, nodes)
    if len(groups) > MAX_PROBES:
        raise InputError(f"{len(groups)} probes; at most {MAX_PROBES} a check")
    return fixed


def probe_cost(spec: BandwidthCheckSpec) -> ProbeCost:
    """The upper bound of a normalised Slurm spec's probes (every probe held for its whole probe_wall_s)."""
    from servers.engines.admission import hours

    assert spec.nodes is not None
    groups = probe_groups(spec, list(spec.nodes))
    widest = max(len(g) for g in groups)
    gpu_hours = node_hours = 0.0
    for group in groups:
        gpus, nodes = hours(jobs=1, nodes=len(group), gpus_per_node=spec.gpus_per_node, wall_s=spec.probe_wall_s)
        gpu_hours, node_hours = gpu_hours + gpus, node_hours + nodes
    return ProbeCost(
        probes=len(groups), nodes_per_probe=widest, gpus_per_node=spec.gpus_per_node, probe_wall_s=spec.probe_wall_s,
        max_gpus_at_once=widest * spec.gpus_per_node, gpu_hours=gpu_hours, node_hours=node_hours,
    )  # fmt: skip


def plan_id(spec: BandwidthCheckSpec) -> str:
    """The approval's id: the normalised spec's digest (another node, size or wall time: another plan)."""
    from servers.engines.admission import spec_plan_id

    return spec_plan_id(SUMMARY_LAYOUT, spec.model_dump(mode="json"))


def probe_launch(spec: BandwidthCheckSpec, cost: ProbeCost) -> Launch:
    """The admission Launch of a Slurm check: its message (escaped: the client shows it to the person) and the
    summary `llm-infra-mcp approve` shows, with every field that decides the cost."""
    from servers.core.display import visible
    from servers.engines.admission import Launch

    nodes = list(spec.nodes or [])
    shown = ", ".join(visible(n) for n in nodes[:16]) + (f" and {len(nodes) - 16} more" if len(nodes) > 16 else "")
    summary = {
        "layout": SUMMARY_LAYOUT, "what": f"bandwidth check ({spec.mode}, {spec.op})", "backend": spec.backend,
        "mode": spec.mode, "op": spec.op, "partition": spec.partition, "nodes": nodes, "probes": cost.probes,
        "nodes_per_probe": cost.nodes_per_probe, "nproc_per_node": spec.nproc_per_node,
        "gpus_per_node": cost.gpus_per_node, "total_gpus": cost.max_gpus_at_once, "probe_wall_s": cost.probe_wall_s,
        "sizes": list(spec.sizes), "estimated_gpu_hours": cost.gpu_hours, "estimated_node_hours": cost.node_hours,
    }  # fmt: skip
    return Launch(
        plan_id=plan_id(spec),
        gpu_hours=cost.gpu_hours,
        node_hours=cost.node_hours,
        message=(
            f"Start {cost.probes} bandwidth probe job(s) on Slurm ({visible(spec.mode)} {visible(spec.op)}), one at "
            f"a time, on {len(nodes)} node(s): {shown}"
            + (f", partition {visible(spec.partition)}" if spec.partition else "")
            + f". Each probe: up to {cost.nodes_per_probe} node(s) x {cost.gpus_per_node} GPU(s) for at most "
            f"{cost.probe_wall_s:g} s: up to {cost.gpu_hours:,.4g} GPU-hours, {cost.node_hours:,.4g} node-hours "
            "in all."
        ),
        summary=summary,
        plan_tool="check_collective_bandwidth",
        submit_tool="check_collective_bandwidth",
        token_name="arguments",
        confirm_label="Start these probe jobs",
    )


async def admit_probes(
    settings: Settings, spec: BandwidthCheckSpec, *, ask: Ask, who: str
) -> tuple[BandwidthCheckSpec, Admission]:
    """A Slurm check through admission before its job starts: its nodes fixed, the quotas each probe job meets,
    and the person's approval above the ceilings (elicitation by `ask`, else `llm-infra-mcp approve PLAN_ID`).
    The normalised spec and the Admission (`started(job_id)` once the check's job exists). Raises InputError
    (QuotaError) when it may not start."""
    from anyio import to_thread

    from servers.engines import admission, registry

    info = registry.get("slurm")
    if not info.can("node_pinning"):
        raise InputError("backend slurm: its registered backend cannot pin a job to nodes, which every probe needs")
    listed: list[str] | None = None
    if spec.nodes is None:
        backend = info.build(info.config_for(settings))
        try:
            listed = await to_thread.run_sync(backend.nodes, spec.partition)
        except RuntimeError as exc:  # no Slurm here
            raise InputError(f"backend slurm: {exc}") from None
    fixed = normalise(spec, listed)
    cost = probe_cost(fixed)
    admission.check_wall(settings, fixed.probe_wall_s, name="probe_wall_s")
    admission.check_gpus_per_job(settings, cost.max_gpus_at_once, what="a probe job")
    launch = probe_launch(fixed, cost)
    admitted = await admission.admit(
        settings,
        launch,
        needed=admission.confirmation_needed(
            settings,
            backend="slurm",
            gpus_per_node=fixed.gpus_per_node,
            gpu_hours=cost.gpu_hours,
            node_hours=cost.node_hours,
        ),
        ask=ask,
        has_token=True,  # the arguments stand for the plan: its id is their digest
        who=who,
        audit={"plan_id": launch.plan_id, "estimated_gpu_hours": cost.gpu_hours},
        declined=f"not started: the person declined the bandwidth check ({cost.probes} probe job(s), "
        f"{cost.gpu_hours:.3g} GPU-hours, {cost.node_hours:.3g} node-hours at most)",
    )
    return fixed, admitted


# ---- running -------------------------------------------------------------------------------------------------------
def run_local(spec: BandwidthCheckSpec, ctx: Any) -> dict[str, Any]:
    """The node probe here (the `bandwidth_check` job kind, in a private network namespace)."""
    import socket

    from servers.overlap.collectives import run_collective_benchmark
    from servers.overlap.limits import probe_machine

    gpus = probe_machine().cuda_gpus
    world = spec.nproc_per_node or (gpus if gpus else 2)
    measured = run_collective_benchmark(
        {
            "op": spec.op, "sizes": spec.sizes, "dtype": spec.dtype, "world_size": world,
            "warmup": spec.warmup, "iters": spec.iters,
        },
        ctx,
    )  # fmt: skip
    host = socket.gethostname()
    if measured["backend"] == "nccl":
        names = [measured.get("device_name") or "GPU"] * world
        devices = [f"#  Rank {r:2d} Group  0 Pid      0 on {host} device {r:2d} [{r}] {names[r]}" for r in range(world)]
    else:
        devices = [f"#  Rank {r:2d} Group  0 Pid      0 on {host} device {r:2d} [cpu] cpu" for r in range(world)]
    text = "\n".join(
        [f"# Collective test starting: {spec.op}_perf (llm-infra-mcp)", "# Using devices", *devices, measured["table"]]
    )
    probes = [judge_probe([host], {"rows": measured["rows"]}, text, "SUCCEEDED")]
    report = build_report(spec, [host], probes)
    return finish(report, ctx)


def finish(report: BandwidthReport, ctx: Any) -> dict[str, Any]:
    folder = Path(ctx.files.dir)
    if draw_heatmap(report, folder / HEATMAP):
        report.heatmap = HEATMAP
    return report.model_dump(mode="json")


def run_slurm(spec: BandwidthCheckSpec, ctx: Any) -> dict[str, Any]:
    """Every probe as a Slurm job pinned to its nodes, one at a time (the `bandwidth_check_cluster` job kind)."""
    from servers.core.jobstore import JobState
    from servers.core.procs import stop_on_sigterm
    from servers.engines import registry
    from servers.engines.backend import SubmitRequest
    from servers.engines.follow import follow

    if spec.nodes is None:  # admit_probes fixes them: the probes run on the nodes whose cost was admitted
        raise InputError("nodes: a Slurm check's job needs its nodes fixed before it starts (admit_probes)")
    info = registry.get("slurm")
    backend = info.build({"job_root": str(Path(ctx.files.dir) / "probes")})
    nodes = list(spec.nodes)
    groups = probe_groups(spec, nodes)
    probes: list[ProbeResult] = []
    # Ranks per node: the GPUs asked for, else 2 for a node alone (one rank moves no data), 1 across nodes.
    nproc = spec.nproc_per_node or spec.gpus_per_node or (2 if spec.mode == "node" else 1)
    with stop_on_sigterm() as stop:
        for i, group in enumerate(groups):
            if stop.is_set():
                raise RuntimeError(f"cancelled after {i} of {len(groups)} probes")
            ctx.progress(i, len(groups), f"probe {i + 1}/{len(groups)}: {', '.join(group)}")
            folder = Path(ctx.files.dir) / "probes" / f"probe-{i}"
            probe_spec = {
                "script": str(PROBE_SCRIPT),
                "args": [
                    "--op", spec.op, "--sizes", ",".join(str(s) for s in spec.sizes), "--dtype", spec.dtype,
                    "--warmup", str(spec.warmup), "--iters", str(spec.iters),
                ],
                "nnodes": len(group), "nproc_per_node": nproc, "gpus_per_node": spec.gpus_per_node,
                "cpus_per_task": nproc if spec.gpus_per_node else 1,  # CPU probes: one CPU a node will do
                "max_wall_s": spec.probe_wall_s, "run_id": f"probe-{i}", "name": f"bw-probe-{i}",
                "options": {"nodelist": ",".join(group), "partition": spec.partition}, "env": {}, "max_restarts": 0,
            }  # fmt: skip
            plan = backend.plan(probe_spec, job_dir=folder)
            handle = backend.submit(plan, SubmitRequest(key=f"{ctx.job_id}-probe-{i}", spec=probe_spec))
            prefix = f"probe {i + 1}/{len(groups)} ({', '.join(group)}): "
            status = follow(backend, handle, ctx, stop, info=info, done=i, total=len(groups), prefix=prefix)
            record = _read_json(folder / "bandwidth.json") if status.state is JobState.SUCCEEDED else None
            text = _read_text(folder / "bandwidth.txt") if record is not None else None
            state = status.state.value if record is not None or status.state is not JobState.SUCCEEDED else "NO_RESULT"
            result = judge_probe(group, record, text, state)
            if record is None:
                result.reason = f"{status.state.value}: {status.reason or 'no bandwidth.json'}"[:500]
            probes.append(result)
    ctx.progress(len(groups), len(groups), "probes done")
    return finish(build_report(spec, nodes, probes), ctx)


def run_bandwidth_check(spec_data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    spec = BandwidthCheckSpec.model_validate(spec_data)
    started = time.time()
    result = run_local(spec, ctx) if spec.backend == "local" else run_slurm(spec, ctx)
    result["wall_s"] = time.time() - started
    return result


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text()[:4_000_000])
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")[-200_000:]
    except OSError:
        return None
