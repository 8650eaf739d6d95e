"""The diagnostics server: GPU inventory and health (NVML live or captured nvidia-smi), kernel-log scans for Xid,
SXid, NCCL crashes and GPUs fallen off the bus, the Xid catalog with the sources' disagreements, nccl-tests and
DCGM diagnostics, and dcgm-exporter endpoints. Parsers and rules live in the plain modules beside this one."""

import json
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field, ValidationError

from servers.core.assemble import ServerPart, build_server
from servers.core.errors import InputError, validation_problems
from servers.core.job_tools import JobId, WaitS, run_job, summarize_job
from servers.core.jobs import JobKind
from servers.core.jobview import JobView
from servers.core.mcp_layer import App, agent_tool, in_thread, png_content, tool_result
from servers.core.models import Model
from servers.core.paths import resolve_inside_roots
from servers.diagnostics.bandwidth import BandwidthCheckSpec
from servers.diagnostics.bounds import (
    DEFAULT_CONTENT_BYTES,
    MAX_NOTES,
    MAX_RESULT_BYTES,
    RESULT_GOAL_BYTES,
    cap_notes,
    fit,
    omitted_note,
    pick,
    scaled,
    summary_text,
)
from servers.diagnostics.findings import ATTENTION_RANK, Status
from servers.diagnostics.snapshot import GpuHealth, GpuSnapshot

if TYPE_CHECKING:
    from servers.engines.admission import Admission

NAME = "diagnostics"
INSTRUCTIONS = (
    "GPU and cluster health: what GPUs a node has and whether they are healthy (NVML live, or captured nvidia-smi "
    "output), what the kernel log says (Xid, SXid, NCCL crashes, GPUs fallen off the bus), what an Xid means and "
    "where the sources disagree, nccl-tests and DCGM diagnostics, and dcgm-exporter metrics."
)
JOB_KINDS = [
    JobKind(
        "dcgm_diag",
        "servers.diagnostics.dcgm:run_dcgm_diag_job",
        "dcgmi diag -r N -j",
        default_timeout_s=7200,
        poll_s=5.0,
    ),
    # Ranks here meet through a torch.distributed store: a private network namespace (servers/core/netns.py).
    JobKind(
        "bandwidth_check",
        "servers.diagnostics.bandwidth:run_bandwidth_check",
        "collective bus bandwidth of this node",
        default_timeout_s=3600,
        isolated_network=True,
    ),
    # Both ends of every probe are opened by the job, in the endpoints' namespaces: it needs the host's view of them.
    JobKind(
        "network_probes",
        "servers.diagnostics.netrun:run_network_probes_job",
        "latency, loss and throughput of NIC pairs, both ends opened by the job",
        default_timeout_s=3600,
        poll_s=1.0,
    ),
    # Probes as Slurm jobs: this process needs the host's network to reach slurmctld.
    JobKind(
        "bandwidth_check_cluster",
        "servers.diagnostics.bandwidth:run_bandwidth_check",
        "collective bus bandwidth per node / pair of nodes / allocation, as Slurm jobs",
        default_timeout_s=6 * 3600,
        poll_s=5.0,
    ),
]
SLURM_QUEUE_S = 600  # a Slurm probe job's wait in the queue, on top of its time limit, before its job times out
MAX_TEXT = 64 * 2**20  # captured nvidia-smi, nccl-tests and DCGM outputs are far smaller; logs are streamed
MAX_GPUS_LISTED = 128  # GPUs one gpu_health result lists; counts cover them all
TEXT_BYTES = RESULT_GOAL_BYTES - DEFAULT_CONTENT_BYTES - 512  # a default answer's text summary (the rest: framing)
MAX_EVENTS_LISTED = 500  # kernel-log events one scan lists (max_events' upper bound)

Text = Annotated[str, Field(max_length=MAX_TEXT)]
PathArg = Annotated[str, Field(max_length=4096)]


def _resolve(app: App, path: str, what: str) -> Path:
    resolved = resolve_inside_roots(path, app.settings.roots(), what=what)
    if not resolved.is_file():
        raise InputError(f"{what} {path!r} does not exist or is not a file (resolved to {resolved})")
    return resolved


def read_text_input(app: App, text: str, path: str | None, what: str) -> tuple[str, str]:
    """Exactly one of text ("" when not given) and path; a path must lie inside the allowed roots.
    Returns (text, source)."""
    if bool(text) == (path is not None):
        raise InputError(f"give exactly one of the {what} text or a path to it")
    if text:
        if not text.strip():
            raise InputError(f"the {what} text holds only whitespace")
        return text, "text"
    assert path is not None
    resolved = _resolve(app, path, f"{what} file")
    size = resolved.stat().st_size
    if size > MAX_TEXT:
        raise InputError(f"{resolved} is {size} bytes; at most {MAX_TEXT} are read for a {what}")
    data = resolved.read_bytes()
    if b"\x00" in data[:65536]:
        raise InputError(f"{resolved} looks binary (NUL bytes); expected the text of a {what}")
    return data.decode("utf-8", errors="replace"), f"file:{resolved}"


class Inventory(Model):
    """What was read of a node's GPUs (NVML or captured nvidia-smi), before judging them."""

    source: str
    available: bool
    reason: str | None = None
    format: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: list[GpuSnapshot]
    warnings: list[str] = Field(default_factory=list)


class NodeHealth(Model):
    source: str = Field(description="nvml (live) or where the captured text came from")
    available: bool = Field(description="False when nothing could be read; reason says why")
    reason: str | None = None
    format: str | None = Field(
        default=None, description="q, xml, csv, or message (only nvidia-smi's error lines) for captured output"
    )
    driver_version: str | None = None
    cuda_version: str | None = None
    gpu_count: int = Field(default=0, description="GPUs found, listed or not")
    node_status: Status = Field(description="The worst GPU status")
    counts: dict[str, int] = Field(description="GPUs per status, listed or not")
    gpus: list[GpuHealth] = Field(
        description=f"At most {MAX_GPUS_LISTED} (unhealthy, degraded and unknown ones first), in input order; each "
        "with its inventory (gpu: index, name, UUID, PCI bus id, serial, memory...); see gpus_omitted"
    )
    gpus_omitted: int = Field(default=0, description="GPUs judged but not listed")
    warnings: list[str] = Field(default_factory=list)


def bounded_health(health: NodeHealth, detail: bool = True) -> NodeHealth:
    """The health listing at most MAX_GPUS_LISTED GPUs, those not healthy first; counts cover them all. Without
    detail (a tool's default answer): a healthy GPU without findings by its identity only, all within
    DEFAULT_CONTENT_BYTES."""
    listed = health.gpus
    if not detail:
        listed = [h.by_identity() if h.status == "healthy" and not h.findings else h for h in health.gpus]

    def build(scale: float) -> NodeHealth:
        gpus, omitted = pick(listed, scaled(MAX_GPUS_LISTED, scale), lambda h: STATUS_ORDER[h.status])
        return health.model_copy(
            update={
                "gpus": gpus,
                "gpus_omitted": omitted,
                "warnings": cap_notes(health.warnings, scaled(MAX_NOTES, scale)),
            }
        )

    return fit(build, MAX_RESULT_BYTES if detail else DEFAULT_CONTENT_BYTES)


def snapshots(app: App, nvidia_smi_output: str, path: str | None, fields: list[str] | None) -> Inventory:
    if not nvidia_smi_output and path is None:
        from servers.diagnostics.nvml import live_gpus

        live = live_gpus()
        if not live.available:
            return Inventory(source="nvml", available=False, reason=live.missing, gpus=[])
        return Inventory(
            source="nvml",
            available=True,
            driver_version=live.driver_version,
            cuda_version=live.cuda_version,
            gpus=live.snapshots,
        )
    from servers.diagnostics.smi import parse_nvidia_smi

    text, source = read_text_input(app, nvidia_smi_output, path, "nvidia-smi output")
    parsed = parse_nvidia_smi(text, fields=fields)
    return Inventory(
        source=source,
        available=True,
        format=parsed.format,
        driver_version=parsed.driver_version,
        cuda_version=parsed.cuda_version,
        gpus=parsed.gpus,
        warnings=parsed.warnings,
    )


STATUS_ORDER = ATTENTION_RANK


def node_health(inventory: Inventory) -> NodeHealth:
    from servers.diagnostics.health import evaluate_all

    read = {
        "source": inventory.source,
        "format": inventory.format,
        "driver_version": inventory.driver_version,
        "cuda_version": inventory.cuda_version,
        "gpu_count": len(inventory.gpus),
    }
    if not inventory.available:
        return NodeHealth(**read, available=False, reason=inventory.reason, node_status="unknown", counts={}, gpus=[])
    healths = evaluate_all(inventory.gpus)
    counts: dict[str, int] = {}
    for h in healths:
        counts[h.status] = counts.get(h.status, 0) + 1
    worst = max((h.status for h in healths), key=lambda s: STATUS_ORDER[s], default="unknown")
    return NodeHealth(
        **read, available=True, node_status=worst, counts=counts, gpus=healths, warnings=inventory.warnings
    )


SmiOutput = Annotated[Text, Field(description="nvidia-smi -q, -q -x or --query-gpu CSV output")]
SmiPath = PathArg | None
Detail = Annotated[bool, Field(description="Every reading and item (default: ~16 KB, healthy GPUs by identity)")]
SmiFields = Annotated[
    list[Annotated[str, Field(max_length=128)]] | None,
    Field(max_length=512, description="--query-gpu names, for noheader CSV"),
]


def _register_gpu_tools(server: MCPServer, app: App) -> None:
    """gpu_health, scan_kernel_log, explain_xid."""

    @agent_tool(server, title="GPU health", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def gpu_health(
        text: SmiOutput = "", path: SmiPath = None, fields: SmiFields = None, detail: Detail = False
    ) -> Annotated[CallToolResult, NodeHealth]:
        """List a node's GPUs (name, UUID, PCI bus id, serial, memory, driver, CUDA) and judge each healthy,
        degraded, unhealthy or unknown, with findings and actions. No input: live NVML. Instant."""
        inventory = await in_thread(snapshots, app, text, path, fields)
        health = await in_thread(lambda: bounded_health(node_health(inventory), detail))
        if not health.available:
            return tool_result(health, f"no GPUs read: {health.reason}")
        lines = [
            f"{health.gpu_count} GPU(s) from {health.source}, driver {health.driver_version}, CUDA "
            f"{health.cuda_version}; node {health.node_status}: "
            + ", ".join(f"{n} {s}" for s, n in sorted(health.counts.items()))
            + omitted_note(len(health.gpus), health.gpus_omitted, "GPUs")
        ]
        for h in health.gpus:
            g = h.gpu
            known = [g.name, g.pci_bus_id, g.uuid, f"serial {g.serial}" if g.serial else None]
            lines.append(
                f"- GPU {g.index if g.index is not None else '(index unknown)'} "
                + " ".join(k for k in known if k)
                + f": {h.status}"
            )
            lines += [
                f"    {f.severity}: {f.what} ({f.evidence}); {f.action}" for f in h.findings if f.severity != "info"
            ]
        lines += [f"warning: {w}" for w in health.warnings]
        if not detail:
            return tool_result(health, summary_text(lines, TEXT_BYTES, "the structured content lists the GPUs"))
        return tool_result(health, "\n".join(lines))

    from servers.diagnostics.kmsg import KernelLogScan

    @agent_tool(server, title="Scan a kernel log", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def scan_kernel_log(
        ctx: Context,
        text: Text = "",
        path: PathArg | None = None,
        source: Annotated[
            Literal["dmesg", "journal"] | None, Field(description="This machine's log, live (may need root)")
        ] = None,
        max_events: Annotated[int, Field(ge=1, le=MAX_EVENTS_LISTED)] = 200,
    ) -> Annotated[CallToolResult, KernelLogScan]:
        """GPU errors in a kernel log (Xid, SXid, NCCL segfaults, GPUs off the bus): events and a summary per GPU
        and code with severity and action, worst first; floods collapsed. One of text, path or source. Seconds."""
        from servers.diagnostics.kmsg import scan_file, scan_text
        from servers.diagnostics.xid import classify

        given = [name for name, v in (("text", text or None), ("path", path), ("source", source)) if v is not None]
        if len(given) != 1:
            raise InputError(f"give exactly one of text, path or source (got {', '.join(given) or 'none'})")
        await ctx.report_progress(0, 1, "scanning")
        if text:
            scan = await in_thread(scan_text, text, classify=classify, max_events=max_events)
        elif path is not None:
            resolved = _resolve(app, path, "kernel log")
            scan = await in_thread(scan_file, resolved, classify=classify, max_events=max_events)
        else:
            live = await in_thread(read_live_kernel_log, source)
            scan = await in_thread(scan_text, live, classify=classify, max_events=max_events)
        await ctx.report_progress(1, 1, "scanned")
        lines = [
            f"{scan.matched_lines} GPU-related line(s) in {scan.lines_read} lines; {scan.summary_rows} "
            f"distinct GPU/code pair(s); {len(scan.events)} event(s) listed"
            + (f", {scan.events_omitted} more counted but not listed" if scan.events_omitted else "")
            + (f"; {scan.summary_omitted} least severe pair(s) not listed" if scan.summary_omitted else "")
        ]
        if scan.counts:
            lines.append("events in the whole log: " + ", ".join(f"{n} {k}" for k, n in sorted(scan.counts.items())))
        lines += [f"note: {note}" for note in scan.notes[:5]]
        for row in scan.summary[:30]:
            lines.append(
                f"- {row.kind} {row.code if row.code is not None else ''} on "
                f"{row.pci_bus_id or row.uuid or 'unknown GPU'}: x{row.count}, {row.severity}; {row.action}"
                + (f" [{row.escalation}]" if row.escalation else "")
                + (" (flood)" if row.flood else "")
            )
        return tool_result(scan, "\n".join(lines))

    from servers.diagnostics.xid import XidExplanation

    @agent_tool(server, title="Explain an Xid", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def explain_xid(
        code: Annotated[int, Field(ge=1, le=999)],
    ) -> Annotated[CallToolResult, XidExplanation]:
        """What an NVIDIA Xid means: causes, NVIDIA's action, how gpud, k8s, Meta GCM and Azure NHC read it and
        where they disagree, a consensus action. Instant; all: infra://xid-catalog.json."""
        from servers.diagnostics.xid import explain_xid as explain

        result = explain(code)
        if not result.known:
            return tool_result(result, f"Xid {code} is not in the catalog: {result.description}")
        text = (
            f"Xid {code} ({result.mnemonic}): {result.description}. Consensus: {result.consensus.severity}; "
            f"{result.consensus.action}"
        )
        if result.disagreement:
            text += f"\nSources disagree: {result.disagreement}"
        return tool_result(result, text)


def _register_test_tools(server: MCPServer, app: App) -> None:
    """parse_nccl_tests, parse_dcgm_diag, run_dcgm_diag."""

    from servers.diagnostics.nccl_tests import NcclTestsReport

    @agent_tool(
        server, title="Parse nccl-tests output", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def parse_nccl_tests(
        text: Text = "",
        path: PathArg | None = None,
        expected_busbw_gbps: Annotated[
            float | None, Field(gt=0, le=100_000, description="Default: the GPU model's known floor")
        ] = None,
    ) -> Annotated[CallToolResult, NcclTestsReport]:
        """Parse nccl-tests output: rows per size, average bus bandwidth and a verdict against the GPU model's
        floor (8x H100 all-reduce: 460 GB/s with NVLS); #wrong > 0 flags corruption. Instant."""
        from servers.diagnostics.nccl_tests import parse_nccl_tests as parse

        body, _ = await in_thread(read_text_input, app, text, path, "nccl-tests output")
        report = await in_thread(parse, body, expected_busbw_gbps=expected_busbw_gbps)
        return tool_result(report, report.verdict.text + report.listing_note())

    from servers.diagnostics.dcgm import DcgmDiagReport

    @agent_tool(
        server, title="Parse DCGM diagnostics", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def parse_dcgm_diag(
        text: Text = "",
        path: PathArg | None = None,
    ) -> Annotated[CallToolResult, DcgmDiagReport]:
        """Read `dcgmi diag -r N -j` JSON: pass, fail, warn or skip per test and GPU with error ids, failures
        first, and a verdict; run_dcgm_diag runs it here. Instant."""
        from servers.diagnostics.dcgm import parse_dcgm_diag as parse

        body, _ = await in_thread(read_text_input, app, text, path, "DCGM diagnostic JSON")
        report = await in_thread(parse, body)
        return tool_result(report, f"DCGM diagnostic: {report.verdict}. {report.summary}{report.listing_note()}")

    @agent_tool(
        server, title="Run DCGM diagnostics", read_only=False, destructive=False, idempotent=False, open_world=False
    )
    async def run_dcgm_diag(
        ctx: Context,
        level: Annotated[
            int,
            Field(
                ge=1,
                le=4,
                description="1: seconds; 2: ~2 min; 3: 10-15 min; 4: > 1 h",
            ),
        ] = 1,
        wait_s: WaitS = 20,
        max_wall_s: Annotated[
            float | None,
            Field(gt=0, le=8 * 3600, description="Default per level: 600, 1800, 3600, 14400"),
        ] = None,
    ) -> Annotated[CallToolResult, JobView]:
        """Run `dcgmi diag -r LEVEL -j` here as a job: parse_dcgm_diag's report, or the job handle. Levels 2-4
        load the GPUs: not under training. Refused without DCGM."""
        from servers.diagnostics.dcgm import dcgm_available

        ok, why = dcgm_available()
        if not ok:
            raise InputError(f"DCGM is not available on this machine: {why}")
        timeout = max_wall_s or {1: 600, 2: 1800, 3: 3600, 4: 4 * 3600}[level]
        view = await run_job(
            app, "dcgm_diag", {"level": level, "timeout_s": timeout}, wait_s=wait_s, ctx=ctx, timeout_s=timeout
        )
        return tool_result(view, summarize_job(view))


def _register_bandwidth(server: MCPServer, app: App) -> None:
    """check_collective_bandwidth."""

    @agent_tool(
        server,
        title="Check collective bandwidth",
        read_only=False,
        destructive=False,
        idempotent=False,
        open_world=False,
    )
    async def check_collective_bandwidth(
        ctx: Context,
        mode: Literal["node", "pairwise", "all"] = "node",
        backend: Annotated[Literal["local", "slurm"], Field(description="local: this node, mode node")] = "local",
        nodes: Annotated[
            list[Annotated[str, Field(max_length=64)]] | None,
            Field(max_length=64, description="Default: all usable in sinfo"),
        ] = None,
        pairs: Annotated[
            list[tuple[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=64)]]] | None,
            Field(max_length=256, description="pairwise: only these"),
        ] = None,
        op: Literal["all_reduce", "all_gather", "reduce_scatter"] = "all_reduce",
        sizes: Annotated[
            list[Annotated[int, Field(ge=1, le=1 << 34)]] | None,
            Field(max_length=16, description="Bytes; default 1, 4, 16 MiB; floors judge >= 256 MiB"),
        ] = None,
        nproc_per_node: Annotated[int, Field(ge=0, le=64, description="0: one per GPU, or 2 on CPU")] = 0,
        gpus_per_node: Annotated[int, Field(ge=0, le=64)] = 0,
        partition: Annotated[str | None, Field(max_length=64)] = None,
        wait_s: WaitS = 20,
        max_wall_s: Annotated[float, Field(gt=0, le=6 * 3600)] = 3600,
    ) -> Annotated[CallToolResult, JobView]:
        """Measure collective bus bandwidth per node, node pair or allocation, here or as Slurm jobs:
        PASS, DEGRADED or FAIL per probe vs known floors or the median, the slowest nodes, a heatmap. A job;
        minutes. Slurm probes past the GPU-/node-hour ceiling need the person's approval."""
        try:
            spec = BandwidthCheckSpec(
                mode=mode, backend=backend, nodes=nodes, pairs=pairs, op=op, nproc_per_node=nproc_per_node,
                gpus_per_node=gpus_per_node, partition=partition, **({"sizes": sizes} if sizes else {}),
            )  # fmt: skip
        except ValidationError as exc:
            raise InputError("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())) from None
        view = await start_bandwidth_check(app, ctx, spec, wait_s=wait_s, max_wall_s=max_wall_s)
        extra = []
        result = view.result or {}
        if view.finished and isinstance(result.get("heatmap"), str):
            png = Path(app.engine.get(view.job_id).job_dir) / result["heatmap"]
            if png.is_file() and png.stat().st_size < 4 * 2**20:
                extra.append(png_content(png.read_bytes()))
        summary = summarize_job(view)
        if "counts" in result:
            probes = result.get("probes") or []
            lines = [
                f"{result['op']} {result['mode']} check on {len(result['nodes'])} node(s), {len(probes)} probe(s): "
                + ", ".join(f"{k} {v}" for k, v in result["counts"].items() if v)
            ]
            lines += [
                f"- {'+'.join(p['nodes'])}: {p['status']}"
                + (f" {p['busbw_gbps']:.4g} GB/s" if p.get("busbw_gbps") is not None else "")
                + f" ({p['why'][:160]})"
                for p in probes[:20]
            ]
            if result.get("slowest_nodes"):
                lines.append(f"slowest nodes: {', '.join(result['slowest_nodes'][:10])}")
            summary = "\n".join(lines)
        return tool_result(view, summary, *extra)


def _register_stragglers(server: MCPServer, app: App) -> None:
    """detect_stragglers."""

    from servers.diagnostics.stragglers import StragglerReport

    @agent_tool(server, title="Find stragglers", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def detect_stragglers(
        text: Annotated[
            Text,
            Field(description="Rows {rank, step, step_time_s, node?, compute_s?, comm_s?}: JSON, JSONL or CSV"),
        ] = "",
        path: PathArg | None = None,
        job_id: Annotated[str | None, Field(max_length=64, pattern=r"^[A-Za-z0-9_-]{1,64}$")] = None,
        ranks_per_node: Annotated[int | None, Field(ge=1, le=65536, description="Default: the job's")] = None,
        tp: Annotated[int, Field(ge=1, le=65536)] = 1,
        pp: Annotated[int, Field(ge=1, le=65536)] = 1,
        dp: Annotated[int | None, Field(ge=1, le=65536, description="Default: the rest")] = None,
        order: Annotated[
            Literal["tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"],
            Field(description="Rank order, fastest first"),
        ] = "tp-dp-pp",
        signal: Annotated[
            Literal["auto", "step_time_s", "compute_s"], Field(description="auto: compute_s when every row has it")
        ] = "auto",
        z_threshold: Annotated[float, Field(gt=0, le=100)] = 3.5,
        window: Annotated[int, Field(ge=2, le=10000)] = 10,
        min_flagged: Annotated[int, Field(ge=1, le=10000, description="Slow steps in window for a straggler")] = 6,
    ) -> Annotated[CallToolResult, StragglerReport]:
        """Find a training job's slow ranks from per-rank step times (robust z-scores, persistence, change
        points), and slow nodes and TP/DP/PP groups given a layout, with actions. One of text, path or job_id.
        Seconds."""
        from servers.diagnostics import stragglers

        layout = {"tp": tp, "pp": pp, "dp": dp, "order": order} if tp * pp > 1 or dp is not None else None
        params = {"z_threshold": z_threshold, "window": window, "min_flagged": min_flagged}
        given = [n for n, v in (("text", text or None), ("path", path), ("job_id", job_id)) if v is not None]
        if len(given) != 1:
            raise InputError(f"give exactly one of text, path or job_id (got {', '.join(given) or 'none'})")

        def run() -> StragglerReport:
            if job_id is not None:
                from servers.core.jobfiles import JobFiles
                from servers.launch.metrics import read_metrics

                record = app.engine.get(job_id)
                per_node = ranks_per_node or int((record.spec.get("training_spec") or record.spec).get(
                    "nproc_per_node"
                ) or 1)  # fmt: skip
                rows, _ = read_metrics(JobFiles(record.job_dir).metrics)
                if not rows:
                    raise InputError(f"job {job_id} has no metrics rows (yet); the recipes log per-rank step times")
                return stragglers.detect_stragglers_in_metrics(
                    rows, ranks_per_node=per_node, layout=layout, signal=signal, params=params
                )
            body, _ = read_text_input(app, text, path, "step-time rows")
            rows, notes = stragglers.load_rows(body, ranks_per_node=ranks_per_node)
            return stragglers.detect_stragglers(rows, layout=layout, signal=signal, params=params, warnings=notes)

        report = await in_thread(run)
        lines = [report.summary, f"first action: {report.first_action}"]
        lines += [
            f"- rank {r.rank}{f' ({r.node})' if r.node else ''}: {r.verdict}, {r.ratio or 0:.2f}x the fleet's median"
            + (f" since step {r.since_step}" if r.since_step is not None else "")
            + f"; {r.action}"
            for r in (report.stragglers + report.likely_stragglers)[:20]
        ]
        if report.job_slowdown is not None:
            slow = report.job_slowdown
            lines.append(
                f"job slowdown: {slow.change_point.ratio:.2f}x from step {slow.change_point.since_step}, "
                f"{slow.attribution}; {slow.action}"
            )
        lines += [f"warning: {w}" for w in report.warnings]
        return tool_result(report, "\n".join(lines))


def _register_triage(server: MCPServer, app: App) -> None:
    """triage_node."""

    from servers.diagnostics.triage import NodeTriage

    @agent_tool(server, title="Triage a node", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def triage_node(
        nvidia_smi_text: Text = "",
        nvidia_smi_path: PathArg | None = None,
        fields: SmiFields = None,
        live_nvml: bool = False,
        kernel_log_text: Text = "",
        kernel_log_path: PathArg | None = None,
        kernel_log_source: Literal["dmesg", "journal"] | None = None,
        dcgm_text: Text = "",
        dcgm_path: PathArg | None = None,
        nccl_tests_text: Text = "",
        nccl_tests_path: PathArg | None = None,
        node: Annotated[str | None, Field(max_length=256)] = None,
        interconnect_expected: Literal["nvlink", "pcie"] | None = None,
        detail: Detail = False,
    ) -> Annotated[CallToolResult, NodeTriage]:
        """One node's verdict per GPU from any of nvidia-smi output or live NVML, kernel log, DCGM JSON and
        nccl-tests output, joined on PCI bus id, with disagreements and the first action. Instant."""
        from servers.diagnostics.triage import triage_node as triage

        def one(name: str, *values: object) -> None:
            if sum(bool(v) for v in values) > 1:
                raise InputError(f"{name}: give at most one of its text, path or live source")

        one("nvidia-smi", nvidia_smi_text, nvidia_smi_path, live_nvml)
        one("kernel log", kernel_log_text, kernel_log_path, kernel_log_source)
        one("DCGM", dcgm_text, dcgm_path)
        one("nccl-tests", nccl_tests_text, nccl_tests_path)

        def run() -> NodeTriage:
            from servers.diagnostics.kmsg import scan_file
            from servers.diagnostics.nvml import live_gpus
            from servers.diagnostics.xid import classify

            kwargs: dict = {
                "node": node,
                "interconnect_expected": interconnect_expected,
                "budget": MAX_RESULT_BYTES if detail else DEFAULT_CONTENT_BYTES,
            }
            if nvidia_smi_text or nvidia_smi_path:
                kwargs["nvidia_smi"] = read_text_input(app, nvidia_smi_text, nvidia_smi_path, "nvidia-smi output")[0]
                kwargs["smi_fields"] = fields
            elif live_nvml:  # read the way gpu_health reads it: where it cannot be, the GPU part is unknown
                live = live_gpus()
                if live.available:
                    kwargs["snapshots"] = live.snapshots
                else:
                    kwargs["snapshots_missing"] = live.missing
            else:
                kwargs["nvml_here"] = live_gpus  # read only when no source judges a GPU, for the first action
            if kernel_log_path is not None:
                kwargs["kernel_scan"] = scan_file(_resolve(app, kernel_log_path, "kernel log file"), classify=classify)
            elif kernel_log_text:
                kwargs["kernel_log"] = kernel_log_text
            elif kernel_log_source is not None:
                kwargs["kernel_log"] = read_live_kernel_log(kernel_log_source)
            if dcgm_text or dcgm_path:
                kwargs["dcgm"] = read_text_input(app, dcgm_text, dcgm_path, "DCGM diagnostic JSON")[0]
            if nccl_tests_text or nccl_tests_path:
                kwargs["nccl_tests"] = read_text_input(app, nccl_tests_text, nccl_tests_path, "nccl-tests output")[0]
            return triage(**kwargs)

        result = await in_thread(run)
        lines = [result.summary, f"first action: {result.first_action}"]
        lines += [f"warning: {w}" for w in result.warnings]
        if not detail:
            return tool_result(result, summary_text(lines, TEXT_BYTES, "warnings has them all"))
        return tool_result(result, "\n".join(lines))


def _register_network(server: MCPServer, app: App) -> None:
    """plan_network_probes, localize_network_fault."""

    from servers.diagnostics.netmodels import Localization, ProbePlan, ProbeRow, Topology
    from servers.diagnostics.netmodels import summary_text as network_summary

    def read_topology(topology: Topology | None, text: str, path: str | None, what: str) -> dict:
        return read_topology_input(app, topology, text, path, what)

    @agent_tool(
        server, title="Plan network probes", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def plan_network_probes(
        topology: Topology | None = None,
        text: Annotated[
            Text,
            Field(
                description="Topology JSON, or a probe table CSV: src_/dst_ ip (or real_ip), node_id, asw (leaf), dsw"
            ),
        ] = "",
        path: PathArg | None = None,
        mode: Annotated[
            Literal["skeleton", "rail", "full_mesh"], Field(description="skeleton: training traffic's pairs, O(N)")
        ] = "skeleton",
        tp: Annotated[int | None, Field(ge=1, le=1 << 20, description="Default: NICs per node")] = None,
        pp: Annotated[int | None, Field(ge=1, le=1 << 20)] = None,
        dp: Annotated[int | None, Field(ge=1, le=1 << 20, description="Default: the rest")] = None,
        cross_leaf_per_uplink: Annotated[int, Field(ge=0, le=64)] = 2,
        min_probes_per_nic: Annotated[int, Field(ge=0, le=64)] = 4,
        limit: Annotated[int | None, Field(ge=0, le=5000, description="Default: up to 100 (~16 KB)")] = None,
        offset: Annotated[int, Field(ge=0, le=10_000_000)] = 0,
    ) -> Annotated[CallToolResult, ProbePlan]:
        """Plan the NIC pairs to probe in a rail-optimised fat tree (tp, pp, dp: the skeleton's layout) and
        whether they cover every NIC, switch and link; results go to localize_network_fault. Paged. Seconds."""
        from servers.diagnostics.netloc import plan_network_probes as plan

        def run() -> ProbePlan:
            topo = read_topology(topology, text, path, "plan_network_probes")
            return plan(
                topo, mode, tp=tp, pp=pp, dp=dp, cross_leaf_per_uplink=cross_leaf_per_uplink,
                min_probes_per_nic=min_probes_per_nic, limit=limit, offset=offset,
            )  # fmt: skip

        result = await in_thread(run)
        cover = "covers every component" if result.coverage.complete else "does NOT cover every component"
        left = result.count - result.offset - len(result.pairs)
        lines = [
            f"{result.mode}: {result.count:,} pair(s) ({result.ratio_to_full_mesh:.3g} of full mesh's "
            f"{result.full_mesh_count:,}; rail {result.rail_count:,}); {cover}; listed {len(result.pairs)} from "
            f"offset {result.offset}"
            + (f"; {left:,} more not listed: offset={result.next_offset} (limit up to 5000)" if result.has_more else "")
        ]
        lines += [f"note: {n}" for n in result.notes[:5]]
        return tool_result(result, network_summary(lines))

    @agent_tool(
        server,
        title="Localize a network fault",
        read_only=True,
        destructive=False,
        idempotent=True,
        open_world=False,
        same_as={"topology": "plan_network_probes"},
    )
    async def localize_network_fault(
        topology: Topology | None = None,
        topology_path: Annotated[
            PathArg | None, Field(description="Topology JSON; neither: from the probe table")
        ] = None,
        probes: Annotated[list[ProbeRow] | None, Field(max_length=100_000)] = None,
        text: Annotated[Text, Field(description="Probe rows: JSON, JSONL, CSV or a probe table")] = "",
        path: PathArg | None = None,
        job_id: Annotated[JobId | None, Field(description="A run_network_probes job: its rows")] = None,
        loss_threshold: Annotated[float, Field(ge=0, lt=1)] = 0.01,
        latency_factor: Annotated[float, Field(gt=1, le=1000, description="Bad above this x baseline")] = 2.0,
        bandwidth_factor: Annotated[float, Field(gt=0, lt=1, description="Bad below this x baseline")] = 0.5,
        limit: Annotated[
            int | None, Field(ge=0, le=500, description="Default: the faulty (up to 20) and 3 more (~16 KB)")
        ] = None,
        offset: Annotated[int, Field(ge=0, le=1_000_000)] = 0,
    ) -> Annotated[CallToolResult, Localization]:
        """Find faulty NICs, nodes, switches and leaf-spine links from probe results: each suspect with a
        score, symptom and its probes; copes with partial faults, noise, ECMP, overlay vs underlay. Seconds."""
        from servers.diagnostics.netloc import localize_network_fault as localize
        from servers.diagnostics.netloc import parse_probes_text

        sources = (("probes", probes), ("text", text or None), ("path", path), ("job_id", job_id))
        given = [n for n, v in sources if v is not None]
        if len(given) != 1:
            raise InputError(f"give exactly one of probes, text, path or job_id (got {', '.join(given) or 'none'})")

        def run() -> Localization:
            notes: list[str] = []
            body = None
            job_topology = None
            if job_id is not None:
                job_topology, rows = probe_job_rows(app, job_id)
            elif probes is not None:
                rows: list = [p.model_dump(mode="json") for p in probes]
            else:
                body, _ = read_text_input(app, text, path, "probe rows")
                rows = []
            if topology is not None or topology_path is not None:
                topo = read_topology(topology, "", topology_path, "localize_network_fault")
            elif job_topology is not None:
                topo = job_topology
            elif body is not None:
                topo = read_topology(None, body, None, "localize_network_fault")  # a probe table: derived from it
                notes.append("the topology was derived from the probe table's endpoint columns")
            else:
                raise InputError("topology: give topology or topology_path (rows alone do not say the fabric)")
            if body is not None:
                spines = [s["name"] for s in topo.get("switches", []) if s.get("tier") == "spine"]
                table = parse_probes_text(body, spines=spines)
                rows, notes = table.rows, notes + table.notes
            thresholds = {
                "loss_threshold": loss_threshold, "latency_factor": latency_factor,
                "bandwidth_factor": bandwidth_factor,
            }  # fmt: skip
            found = localize(topo, rows, thresholds, limit=limit, offset=offset)
            if notes:
                found.warnings = [*notes, *found.warnings]
            return found

        result = await in_thread(run)
        faulty = [s for s in result.suspects if s.faulty]
        near = len(result.suspects) - len(faulty)
        lines = [
            f"{result.faulty_count} faulty component(s); layer: {result.layer_verdict}; {result.probes.bad} of "
            f"{result.probes.total} probes bad; listed {len(faulty)} faulty and {near} of "
            f"{result.suspects_total - result.faulty_count} near miss(es) from offset {result.offset}"
        ]
        if result.has_more:
            left = result.suspects_total - result.offset - len(result.suspects)
            lines[0] += f"; {left} more ranked not listed: offset={result.next_offset} (limit up to 500)"
        lines += [
            f"- {s.kind} {s.name}: {s.symptom}, score {s.score:.3g}, {s.evidence.failed} bad / {s.evidence.passed} "
            "good probes through it"
            + (f" (ambiguous with {', '.join(s.ambiguous_with[:3])})" if s.ambiguous_with else "")
            for s in faulty[:20]
        ]
        lines += [f"warning: {w}" for w in result.warnings[:10]]
        return tool_result(result, network_summary(lines))


def _register_network_probes(server: MCPServer, app: App) -> None:
    """run_network_probes."""

    from servers.diagnostics.netrun import MAX_PAIRS

    Name = Annotated[str, Field(max_length=128)]  # noqa: N806 (a type alias)

    @agent_tool(
        server, title="Run network probes", read_only=False, destructive=False, idempotent=False, open_world=False
    )
    async def run_network_probes(
        ctx: Context,
        topology_path: PathArg,
        endpoints_path: Annotated[PathArg, Field(description="{nics:{NIC:{address,netns?}},spines:{SPINE:{tos}}}")],
        pairs: Annotated[
            list[tuple[Name, Name, Name | None]] | None,
            Field(max_length=MAX_PAIRS, description="[src_nic, dst_nic, via_spine]; default: planned by mode"),
        ] = None,
        mode: Literal["skeleton", "rail", "full_mesh"] = "skeleton",
        bandwidth_bytes: Annotated[int, Field(ge=0, le=64 * 2**20, description="TCP bytes a pair; 0: none")] = 0,
        backend: Annotated[Literal["local", "slurm"], Field(description="slurm: endpoints.hosts")] = "local",
        partition: Annotated[str | None, Field(max_length=64)] = None,
        wait_s: WaitS = 20,
        max_wall_s: Annotated[float, Field(gt=0, le=6 * 3600)] = 1800,
    ) -> Annotated[CallToolResult, JobView]:
        """Probe NIC pairs on real sockets, both ends opened by the job or by agents on Slurm nodes (UDP echo
        latency, loss; TCP throughput), pinned by TOS; then localize_network_fault(job_id)."""
        from servers.core.mcp_layer import client_name
        from servers.diagnostics.netrun import admit_probe_job, build_spec, probe_hosts
        from servers.engines.admission import elicit_asker

        def make() -> dict:
            topo = read_topology_input(app, None, "", topology_path, "run_network_probes")
            body, _ = read_text_input(app, "", endpoints_path, "endpoints")
            try:
                ends = json.loads(body)
            except ValueError as exc:
                raise InputError(f"endpoints: not JSON ({exc})") from None
            given = None if pairs is None else [{"src_nic": a, "dst_nic": b, "via_spine": v} for a, b, v in pairs]
            try:
                return build_spec(
                    topo, ends, given, mode=mode, options={"bandwidth_bytes": bandwidth_bytes}, backend=backend,
                    partition=partition, probe_wall_s=max_wall_s,
                )  # fmt: skip
            except ValidationError as exc:
                raise InputError("; ".join(validation_problems(exc.errors()))) from None

        spec = await in_thread(make)
        if backend == "local":
            view = await run_job(
                app, "network_probes", spec.model_dump(mode="json"), wait_s=wait_s, ctx=ctx, timeout_s=max_wall_s
            )
        else:
            who = client_name(ctx)
            admitted = await admit_probe_job(app.settings, spec, ask=elicit_asker(ctx), who=who)
            view = await start_admitted(
                app, ctx, "network_probes", spec.model_dump(mode="json"), admitted, who=who, wait_s=wait_s,
                max_wall_s=max_wall_s + SLURM_QUEUE_S, audit={"nodes": probe_hosts(spec), "pairs": len(spec.pairs)},
            )  # fmt: skip
        summary = summarize_job(view)
        result = view.result or {}
        if "measured" in result:
            summary = (
                f"{result['measured']} of {result['pairs']} probe(s) measured ({result['not_run']} not set up); "
                f"{result['all_lost']} lost every echo, {result['with_loss']} lost some; pinned {result['pinned']}, "
                f"unpinned cross-leaf {result['unpinned_cross_leaf']}; median latency {result['median_latency_us']} "
                f"us, bandwidth {result['median_bandwidth_gbps']} Gbit/s. Next: localize_network_fault(job_id="
                f"{view.job_id!r})"
            )
            summary += "".join(f"\nnote: {n}" for n in result.get("notes", [])[:5])
            summary += "".join(
                f"\nnot run: {e['src_nic']} -> {e['dst_nic']}: {e['error']}" for e in result.get("errors", [])[:5]
            )
        return tool_result(view, summary)


def read_topology_input(app: App, topology: Any, text: str, path: str | None, what: str) -> dict:
    """A topology given as the object, its text (JSON or a probe table) or its path: as a dict."""
    from servers.diagnostics.netloc import parse_topology_text, topology_from_probe_table

    if topology is not None:
        if text or path is not None:
            raise InputError(f"{what}: give the topology object, its text or its path, one of them")
        return topology.model_dump(mode="json")
    body, _ = read_text_input(app, text, path, "topology")
    head = body.lstrip()[:1]
    return parse_topology_text(body) if head in ("{", "[") else topology_from_probe_table(body)


def probe_job_rows(app: App, job_id: str) -> tuple[dict, list]:
    """The topology and rows of a finished run_network_probes job."""
    from servers.core.jobstore import JobState
    from servers.diagnostics.netrun import read_job_rows

    record = app.engine.get(job_id)
    if record.kind != "network_probes":
        raise InputError(f"job_id {job_id!r} is a {record.kind} job; accepted: a run_network_probes job")
    if record.state is not JobState.SUCCEEDED:
        raise InputError(f"job {job_id} is {record.state.value}; its rows are read once it SUCCEEDED")
    return read_job_rows(Path(record.job_dir))


def _register_exporter(server: MCPServer, app: App) -> None:
    """read_dcgm_exporter."""

    from servers.diagnostics.exporter import ExporterSummary

    @agent_tool(
        server,
        title="Read a dcgm-exporter endpoint",
        read_only=True,
        destructive=False,
        idempotent=True,
        open_world=True,
    )
    async def read_dcgm_exporter(
        url: Annotated[
            str,
            Field(
                max_length=2048,
                pattern=r"^https?://",
                description="e.g. http://127.0.0.1:9400/metrics",
            ),
        ],
        http_timeout_s: Annotated[float, Field(gt=0, le=30)] = 10,
    ) -> Annotated[CallToolResult, ExporterSummary]:
        """Scrape a dcgm-exporter endpoint: per GPU temperature, power, Xid, ECC, remaps, NVLink, clock
        events, judged by gpu_health's rules. Only URLs LLM_INFRA_MCP_EXPORTER_URLS allows. Seconds."""
        from servers.diagnostics.exporter import read_exporter

        summary = await read_exporter(url, allowed=app.settings.exporter_urls, timeout_s=http_timeout_s)
        return tool_result(summary, summary.text)


def register(server: MCPServer, app: App) -> None:
    """Every diagnostics tool, one group of tools after another."""
    for group in (
        _register_gpu_tools,
        _register_test_tools,
        _register_bandwidth,
        _register_stragglers,
        _register_triage,
        _register_network,
        _register_network_probes,
        _register_exporter,
    ):
        group(server, app)


def read_live_kernel_log(source: str | None) -> str:
    """This machine's kernel log: `dmesg` or `journalctl -k` (argv lists, bounded time)."""
    argv = {"dmesg": ["dmesg", "--time-format=iso"], "journal": ["journalctl", "-k", "--no-pager", "-o", "short-iso"]}[
        source or "dmesg"
    ]
    if shutil.which(argv[0]) is None:
        raise InputError(f"{argv[0]} is not installed on this machine; pass the log as text or path instead")
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(f"{' '.join(argv)} did not finish within 60 s") from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[:500]
        raise InputError(
            f"{' '.join(argv)} failed (exit {done.returncode}): {err or 'no message'}; reading the "
            "kernel log may need root or the adm/systemd-journal group"
        )
    return done.stdout.decode(errors="replace")


async def start_bandwidth_check(
    app: App, ctx: Context, spec: BandwidthCheckSpec, *, wait_s: float, max_wall_s: float
) -> JobView:
    """The check's job, started; on Slurm through admission first (quotas, the person's approval above the
    ceilings, the audit log as a launch), its approval bound to the job before the wait."""
    from servers.core.mcp_layer import client_name
    from servers.diagnostics.bandwidth import admit_probes
    from servers.engines.admission import elicit_asker

    if spec.backend == "local":
        return await run_job(app, "bandwidth_check", spec.model_dump(mode="json"), wait_s=wait_s, ctx=ctx,
                             timeout_s=max_wall_s)  # fmt: skip
    who = client_name(ctx)
    spec, admitted = await admit_probes(app.settings, spec, ask=elicit_asker(ctx), who=who)
    audit = {"nodes": spec.nodes, "mode": spec.mode, "gpus_per_node": spec.gpus_per_node,
             "probe_wall_s": spec.probe_wall_s}  # fmt: skip
    return await start_admitted(
        app, ctx, "bandwidth_check_cluster", spec.model_dump(mode="json"), admitted, who=who, wait_s=wait_s,
        max_wall_s=max_wall_s, audit=audit,
    )  # fmt: skip


async def start_admitted(
    app: App, ctx: Context, kind: str, spec: dict, admitted: "Admission", *, who: str, wait_s: float,
    max_wall_s: float, audit: dict,
) -> JobView:  # fmt: skip
    """An admitted job started: its approval bound to the job (given back when the start fails), the start in the
    audit log, then the wait."""
    from servers.core.audit import AuditLog

    try:
        view = await run_job(app, kind, spec, wait_s=0, ctx=ctx, timeout_s=max_wall_s)
    except BaseException:
        await admitted.started(app.settings, None)
        raise
    await admitted.started(app.settings, view.job_id)
    AuditLog(app.settings).record("submit", who=who, plan_id=admitted.plan_id, job_id=view.job_id, kind=kind, **audit)
    if wait_s <= 0:
        return view
    from servers.core.job_tools import wait_for

    waited = await wait_for(app, view.job_id, wait_s, ctx)
    assert waited.job is not None
    return waited.job


PART = ServerPart(
    name=NAME, instructions=INSTRUCTIONS, register=register, job_kinds=JOB_KINDS, starts_jobs=True, tools_only=True
)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, [PART], app)
