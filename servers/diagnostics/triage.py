"""One-call node triage: every source about a node's GPUs joined per GPU, one verdict each, and the node's first
action. Plain module (no MCP imports).

Sources, any of them (each parsed by its own module, never re-parsed here):
- nvidia-smi text (``-q``, ``-q -x`` XML or ``--query-gpu`` CSV; servers.diagnostics.smi) or live NVML snapshots,
  judged by the health rules (servers.diagnostics.health);
- a kernel log (servers.diagnostics.kmsg, classified with the Xid catalog of servers.diagnostics.xid);
- DCGM diagnostics JSON (``dcgmi diag -j``; servers.diagnostics.dcgm);
- nccl-tests output (servers.diagnostics.nccl_tests): which GPUs took part, and the node's bandwidth verdict.

The join key is the PCI bus id, normalised by ``normalise_bus_id`` to ``dddd:bb:dd`` (lowercase, the function
dropped: a GPU is function 0), so the kernel log's ``0000:9b:00`` and nvidia-smi's ``00000000:9B:00.0`` are one GPU.
Sources without a bus id join on what they have: DCGM on the board serial (else on its GPU id as nvidia-smi's index,
said in a note), nccl-tests' device lines on a full bus id or, in older builds that print only ``[0x9b]``, on a bus
number that exactly one GPU has. UUIDs and serials that disagree at one bus id are warned about.

Each source's own verdict per GPU (healthy, degraded, unhealthy, unknown) is kept; the GPU's verdict is the worst.
Warnings say when sources disagree (one says healthy, another unhealthy: a kernel log covers the time since boot,
nvidia-smi and DCGM the present) and when a GPU appears in some sources but is missing from one that lists every GPU
(nvidia-smi, DCGM): a kernel-log GPU that nvidia-smi does not show has usually fallen off the bus or hung. The
driver's "GPU4" in GSP messages is its own numbering, not nvidia-smi index 4: a note says so, and which GPU it is.

A GPU nvidia-smi or NVML lists but cannot reach (``Unable to determine the device handle for GPU...``, GPU_IS_LOST) is
an unhealthy GPU at its bus id, joined with the kernel log's Xid 79 there, and the first to act on. Live NVML that
cannot be read here (no driver) leaves the GPU part unknown, with the reason, and the rest of the triage proceeds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from pydantic import Field, model_validator

from servers.core.errors import InputError
from servers.core.models import Model
from servers.diagnostics.bounds import (
    MAX_LINE_TEXT,
    MAX_NOTES,
    MAX_RESULT_BYTES,
    cap_notes,
    clip,
    clip_str,
    fit,
    pick,
    scaled,
)
from servers.diagnostics.dcgm import DcgmDiagReport
from servers.diagnostics.kmsg import KernelLogScan
from servers.diagnostics.nccl_tests import NcclTestsReport
from servers.diagnostics.nvml import LiveGpus
from servers.diagnostics.smi import SmiParse
from servers.diagnostics.snapshot import GpuSnapshot, Status

Source = Literal["nvidia_smi", "kernel_log", "dcgm", "nccl_tests"]
SOURCES: tuple[Source, ...] = ("nvidia_smi", "kernel_log", "dcgm", "nccl_tests")
SOURCE_NAMES: dict[Source, str] = {
    "nvidia_smi": "nvidia-smi output",
    "kernel_log": "kernel log",
    "dcgm": "DCGM diagnostic",
    "nccl_tests": "nccl-tests output",
}
Severity = Literal["info", "warning", "critical"]
T = TypeVar("T")
STATUSES: tuple[Status, ...] = ("unhealthy", "degraded", "unknown", "healthy")
STATUS_RANK: dict[str, int] = {"unhealthy": 3, "degraded": 2, "healthy": 1, "unknown": 0}
SEVERITY_RANK: dict[str, int] = {"critical": 3, "warning": 2, "info": 1}

MAX_GPUS = 1024  # GPUs one triage joins (a node has at most a few dozen)
MAX_GPUS_LISTED = 128
MAX_EVIDENCE = 16  # evidence items listed per GPU (the worst first)
MAX_NODE_EVIDENCE = 50

_BUS_ID = re.compile(
    r"^(?:pci:)?(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<device>[0-9a-f]{1,2})(?:\.(?P<fn>[0-7]))?$"
)
_BUS_NUMBER = re.compile(r"^(?:0x)?([0-9a-f]{1,2})$")
_GSP_NAME = re.compile(r"\bGPU(\d{1,3})\s+(?:GSP|RPC)\b")
_XID_PCI = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]{5,20})\)")


def normalise_bus_id(value: str | None) -> str | None:
    """A PCI address in any of the forms GPU tools print -> ``dddd:bb:dd`` (lowercase hex, function dropped); None
    when it is not one. ``00000000:9B:00.0`` (nvidia-smi), ``0000:9b:00`` and ``PCI:0000:9b:00`` (kernel log),
    ``9b:00.0`` (no domain: 0000) all give ``0000:9b:00``. A domain longer than 4 digits keeps its significant digits
    (``00010000:01:00.0`` -> ``10000:01:00``: VMD domains are not folded onto domain 0)."""
    if not isinstance(value, str):
        return None
    match = _BUS_ID.match(value.strip().lower())
    if match is None:
        return None
    domain = (match.group("domain") or "0").lstrip("0").rjust(4, "0")
    return f"{domain}:{match.group('bus').rjust(2, '0')}:{match.group('device').rjust(2, '0')}"


def bus_number(value: str | None) -> int | None:
    """The PCI bus number of an older nccl-tests device line (``[0x9b]``), or of a full bus id; else None."""
    if not isinstance(value, str):
        return None
    full = normalise_bus_id(value)
    if full is not None:
        return int(full.split(":")[1], 16)
    match = _BUS_NUMBER.match(value.strip().lower())
    return int(match.group(1), 16) if match else None


# ---------------------------------------------------------------------------------------------------------------------
# result


class TriageEvidence(Model):
    source: Source
    severity: Severity
    what: str = Field(description="what the source says, with its numbers")
    action: str | None = Field(default=None, description="what the source's rules advise")


class GpuTriage(Model):
    bus_id: str | None = Field(description="normalised dddd:bb:dd; None for a GPU known only by another id")
    label: str = Field(description="how the text names it: the bus id, else 'DCGM GPU 3', 'nvidia-smi index 2', ...")
    index: int | None = Field(default=None, description="nvidia-smi / NVML index")
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    dcgm_gpu_id: int | None = None
    nccl_ranks: list[int] = Field(default_factory=list, description="nccl-tests ranks that ran on it")
    seen_by: list[Source] = Field(description="the sources that mention this GPU")
    missing_from: list[Source] = Field(
        default_factory=list, description="sources that list every GPU (nvidia-smi, DCGM) but not this one"
    )
    source_verdicts: dict[str, Status] = Field(description="each source's own verdict on this GPU")
    verdict: Status = Field(description="the worst of the source verdicts (unknown only when none knows)")
    evidence: list[TriageEvidence] = Field(default_factory=list, description=f"worst first, at most {MAX_EVIDENCE}")
    evidence_omitted: int = 0
    action: str


class SourceSummary(Model):
    source: Source
    given: bool
    gpus: int = Field(default=0, description="GPUs this source mentions")
    summary: str


class NodeTriage(Model):
    node: str | None = None
    verdict: Status = Field(description="the worst GPU verdict, or worse when a node-level finding says so")
    first_action: str
    summary: str
    counts: dict[str, int] = Field(description="GPUs per verdict; they add up to gpu_count")
    gpu_count: int
    gpus: list[GpuTriage] = Field(description=f"by nvidia-smi index, then bus id; at most {MAX_GPUS_LISTED}")
    gpus_omitted: int = 0
    node_evidence: list[TriageEvidence] = Field(
        default_factory=list,
        description="findings about the node rather than one GPU: nccl-tests bandwidth, NVSwitch SXid, NCCL crashes",
    )
    node_evidence_omitted: int = 0
    sources: list[SourceSummary]
    warnings: list[str] = Field(default_factory=list, description="sources that disagree, GPUs missing from a source")
    notes: list[str] = Field(default_factory=list, description="how sources were joined; GSP 'GPUn' names")

    @model_validator(mode="after")
    def _counts_add_up(self) -> NodeTriage:
        if sum(self.counts.values()) != self.gpu_count or len(self.gpus) + self.gpus_omitted != self.gpu_count:
            raise ValueError(f"verdict counts {self.counts} do not add up to {self.gpu_count} GPUs")
        return self


# ---------------------------------------------------------------------------------------------------------------------
# the join


@dataclass
class _Gpu:
    bus_id: str | None = None
    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    dcgm_gpu_id: int | None = None
    nccl_ranks: list[int] = field(default_factory=list)
    seen_by: list[Source] = field(default_factory=list)
    verdicts: dict[Source, Status] = field(default_factory=dict)
    evidence: list[TriageEvidence] = field(default_factory=list)
    headline: dict[Source, str] = field(default_factory=dict)  # the worst thing each source said, for warnings
    lost: bool = False  # nvidia-smi / NVML lists it but cannot reach it

    @property
    def label(self) -> str:
        if self.bus_id:
            return self.bus_id + (f" (nvidia-smi index {self.index})" if self.index is not None else "")
        if self.index is not None:
            return f"nvidia-smi index {self.index}"
        if self.dcgm_gpu_id is not None:
            return f"DCGM GPU {self.dcgm_gpu_id}"
        return self.uuid or self.serial or "an unidentified GPU"

    def saw(self, source: Source, verdict: Status | None, headline: str | None = None) -> None:
        if source not in self.seen_by:
            self.seen_by.append(source)
        if verdict is not None and STATUS_RANK[verdict] >= STATUS_RANK.get(self.verdicts.get(source, "unknown"), 0):
            self.verdicts[source] = verdict
            if headline:
                self.headline[source] = headline


class _Join:
    def __init__(self) -> None:
        self.gpus: list[_Gpu] = []
        self.by_bus: dict[str, _Gpu] = {}
        self.by_uuid: dict[str, _Gpu] = {}
        self.by_serial: dict[str, _Gpu] = {}
        self.warnings: list[str] = []

    def find(self, bus: str | None = None, uuid: str | None = None, serial: str | None = None) -> _Gpu | None:
        return (
            (self.by_bus.get(bus) if bus else None)
            or (self.by_uuid.get(uuid.lower()) if uuid else None)
            or (self.by_serial.get(serial) if serial else None)
        )

    def get(
        self, source: Source, *, bus: str | None = None, uuid: str | None = None, serial: str | None = None
    ) -> _Gpu:
        """The GPU these ids name (created when new); identities that disagree are warned about."""
        gpu = self.find(bus, uuid, serial)
        if gpu is None:
            if len(self.gpus) >= MAX_GPUS:
                raise InputError(f"the sources name more than {MAX_GPUS} GPUs; triage one node at a time")
            gpu = _Gpu()
            self.gpus.append(gpu)
        where = SOURCE_NAMES[source]
        if bus:
            if gpu.bus_id and gpu.bus_id != bus:
                self.warnings.append(
                    f"the {where} puts GPU {uuid or serial} at {bus}, another source at {gpu.bus_id}: the sources may "
                    "come from different nodes"
                )
            elif gpu.bus_id is None:
                gpu.bus_id = bus
                self.by_bus[bus] = gpu
        if uuid:
            if gpu.uuid and gpu.uuid.lower() != uuid.lower():
                self.warnings.append(
                    f"GPU {gpu.label}: the {where} says UUID {uuid}, another source {gpu.uuid}: a different board at "
                    "the same address (swapped since?) or sources from different nodes"
                )
            elif gpu.uuid is None:
                gpu.uuid = uuid
                self.by_uuid[uuid.lower()] = gpu
        if serial:
            if gpu.serial and gpu.serial != serial:
                self.warnings.append(
                    f"GPU {gpu.label}: the {where} says serial {serial}, another source {gpu.serial}: a different "
                    "board at the same address (swapped since?) or sources from different nodes"
                )
            elif gpu.serial is None:
                gpu.serial = serial
                self.by_serial[serial] = gpu
        return gpu


def _worst_status(statuses: Sequence[Status]) -> Status:
    return max(statuses, key=lambda s: STATUS_RANK[s], default="unknown")


def _severity_status(severity: Severity) -> Status:
    return {"critical": "unhealthy", "warning": "degraded", "info": "healthy"}[severity]


def _kernel_severity(severity: str) -> Severity:
    key = severity.strip().lower()
    if key in ("critical", "fatal"):
        return "critical"
    if key in ("info", "informational", "ignore", "none"):
        return "info"
    return "warning"  # warning, error, non-critical, and unknown codes: worth a look, not a verdict of failure


# ---------------------------------------------------------------------------------------------------------------------
# the sources


def _add_smi(join: _Join, gpus: Sequence[GpuSnapshot], interconnect: str | None) -> str:
    from servers.diagnostics.health import evaluate

    for position, snapshot in enumerate(gpus):
        health = evaluate(snapshot, interconnect_expected=interconnect)
        bus = normalise_bus_id(snapshot.pci_bus_id)
        gpu = join.get("nvidia_smi", bus=bus, uuid=snapshot.uuid, serial=snapshot.serial)
        # an unreachable GPU without an index keeps none: its position in the list is not its nvidia-smi index
        gpu.index = snapshot.index if snapshot.index is not None or snapshot.unreachable else position
        gpu.name = gpu.name or snapshot.name
        gpu.lost = gpu.lost or bool(snapshot.unreachable)
        worst = max(health.findings, key=lambda f: SEVERITY_RANK[f.severity], default=None)
        headline = f"{worst.check} ({worst.evidence})" if worst is not None and worst.severity != "info" else None
        gpu.saw("nvidia_smi", health.status, headline)
        for finding in health.findings:
            gpu.evidence.append(
                TriageEvidence(
                    source="nvidia_smi",
                    severity=finding.severity,
                    what=clip_str(f"{finding.what} ({finding.evidence})", MAX_LINE_TEXT),
                    action=finding.action,
                )
            )
        if not health.findings:
            gpu.evidence.append(
                TriageEvidence(
                    source="nvidia_smi",
                    severity="info",
                    what="no finding (ECC, row remapping, reset and recovery, clocks, temperature, power, PCIe, "
                    "NVLink, fabric checked where reported)"
                    if health.status == "healthy"
                    else "no finding, but the key fields (ECC or row-remap counters, temperature) are not reported",
                )
            )
    counts: dict[str, int] = {}
    for gpu in join.gpus:
        if "nvidia_smi" in gpu.verdicts:
            counts[gpu.verdicts["nvidia_smi"]] = counts.get(gpu.verdicts["nvidia_smi"], 0) + 1
    lost = sum(1 for s in gpus if s.unreachable)
    return (
        f"{len(gpus)} GPU(s): "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + (f"; {lost} listed but unreachable (fallen off the bus?)" if lost else "")
    )


def _add_kernel_log(join: _Join, scan: KernelLogScan, node_evidence: list[TriageEvidence]) -> str:
    for identity in scan.gpus:
        bus = normalise_bus_id(identity.pci_bus_id)
        if bus is None:
            continue
        gpu = join.get("kernel_log", bus=bus, uuid=identity.uuid, serial=identity.serial)
        gpu.saw("kernel_log", None)  # logged at driver load: seen, but silence is no verdict
    gpu_rows = 0
    for row in scan.summary:
        severity = _kernel_severity(row.severity)
        label = {
            "xid": f"Xid {row.code}",
            "sxid": f"NVSwitch SXid {row.code}",
            "nccl_segfault": "NCCL segfault",
            "fallen_off_bus": "fallen off the bus",
            "recovery_action": "recovery action changed",
        }[row.kind]
        when = (
            f", {row.first_time or row.first_uptime_s} .. {row.last_time or row.last_uptime_s}" if row.count > 1 else ""
        )
        boots = f", {row.boots} boots" if row.boots > 1 else ""
        flags = (", a flood" if row.flood else "") + (
            ", rate-limited by the driver (a lower bound)" if row.rate_limited else ""
        )
        what = clip_str(
            f"{label}: {row.count} line(s){when} (first at line {row.first_line}{boots}){flags}: {row.example}",
            MAX_LINE_TEXT,
        )
        action = row.action + (f" ({row.escalation})" if row.escalation else "")
        evidence = TriageEvidence(source="kernel_log", severity=severity, what=what, action=action)
        bus = normalise_bus_id(row.pci_bus_id)
        if row.kind in ("sxid", "nccl_segfault") or bus is None:
            # an SXid's address is the NVSwitch's, not a GPU's; NCCL crashes name no GPU
            node_evidence.append(evidence)
            continue
        gpu_rows += 1
        gpu = join.get("kernel_log", bus=bus, uuid=row.uuid)
        gpu.saw("kernel_log", _severity_status(severity), f"{label} ({row.severity})")
        gpu.evidence.append(evidence)
    if scan.summary_omitted:
        join.warnings.append(
            f"the kernel log has {scan.summary_rows} GPU/code rows; the {scan.summary_omitted} least severe were not "
            "listed by the scanner and are not in this triage"
        )
    return (
        f"{scan.lines_read} line(s), {scan.summary_rows} GPU/code row(s) ({gpu_rows} about a GPU), "
        f"{len(scan.gpus)} GPU identity line(s), {scan.boots} boot(s)"
    )


_DCGM_STATUS: dict[str, Status] = {"fail": "unhealthy", "warn": "degraded", "pass": "healthy", "skip": "unknown"}


def _add_dcgm(join: _Join, report: DcgmDiagReport, node_evidence: list[TriageEvidence], notes: list[str]) -> str:
    by_index = {g.index: g for g in join.gpus if g.index is not None and "nvidia_smi" in g.seen_by}
    serials_known = any(g.serial for g in join.gpus)
    matched_by_index = []
    for summary in report.gpus:
        gpu = join.find(serial=summary.serial) if summary.serial else None
        if gpu is None and summary.gpu_id in by_index and not (summary.serial and serials_known):
            gpu = by_index[summary.gpu_id]
            matched_by_index.append(summary.gpu_id)
            if summary.serial and gpu.serial is None:
                gpu.serial = summary.serial
                join.by_serial[summary.serial] = gpu
        if gpu is None:
            gpu = join.get("dcgm", serial=summary.serial)
        gpu.dcgm_gpu_id = summary.gpu_id
        status = _DCGM_STATUS[summary.status]
        failed = ", ".join(summary.failed_tests)
        warned = ", ".join(summary.warned_tests)
        headline = f"failed {failed}" if failed else (f"warned on {warned}" if warned else None)
        gpu.saw("dcgm", status, headline)
        texts = []
        for result in report.results:
            mine = result.entity_group.upper() == "GPU" and summary.gpu_id in result.entity_ids
            if mine and result.status in ("fail", "warn"):
                for warning in result.warnings:
                    name = f" [{warning.error_name}]" if warning.error_name else ""
                    texts.append(f"{result.test} {result.status}{name}: {warning.text}")
                if not result.warnings:
                    texts.append(f"{result.test} {result.status}")
        if summary.status in ("fail", "warn"):
            severity: Severity = "critical" if summary.status == "fail" else "warning"
            what = f"dcgmi diag {summary.status}: " + ("; ".join(texts) if texts else headline or summary.status)
            action = (
                "Drain the GPU; act on the error ids above (DCGM's severity ISOLATE or RESET means take it out of "
                "service), then rerun dcgmi diag at the same level."
                if summary.status == "fail"
                else "Read the warnings before trusting the GPU; rerun dcgmi diag -r 3 when it is idle."
            )
        else:
            severity, action = "info", None
            tested = len(summary.skipped_tests)
            what = f"dcgmi diag {summary.status}" + (f" ({tested} test(s) skipped)" if tested else "")
        gpu.evidence.append(
            TriageEvidence(source="dcgm", severity=severity, what=clip_str(what, MAX_LINE_TEXT), action=action)
        )
    if matched_by_index:
        notes.append(
            "DCGM GPU ids were matched to nvidia-smi indexes (DCGM numbers GPUs in NVML order, nvidia-smi's), as no "
            f"serials tie them: DCGM GPU(s) {', '.join(map(str, matched_by_index[:16]))}"
        )
    if report.gpus_omitted:
        join.warnings.append(
            f"the DCGM report lists {report.gpus_omitted} more GPU(s) than were read; they are left out"
        )
    if report.runtime_error:
        node_evidence.append(
            TriageEvidence(source="dcgm", severity="warning", what=f"DCGM runtime error: {report.runtime_error}")
        )
    return f"DCGM {report.layout} {report.verdict}: {clip(report.summary, 200)}"


def _add_nccl(join: _Join, report: NcclTestsReport, node_evidence: list[TriageEvidence]) -> str:
    unmatched: list[str] = []
    for device in report.devices:
        full = normalise_bus_id(device.bus_id)
        gpu = join.find(bus=full) if full else None
        if gpu is None and full is None:
            number = bus_number(device.bus_id)
            candidates = [g for g in join.gpus if g.bus_id and int(g.bus_id.split(":")[1], 16) == number]
            if number is not None and len(candidates) == 1:
                gpu = candidates[0]
            else:
                unmatched.append(f"rank {device.rank} [{device.bus_id}]")
                continue
        if gpu is None:
            gpu = join.get("nccl_tests", bus=full)
        if device.rank not in gpu.nccl_ranks:
            gpu.nccl_ranks.append(device.rank)
        gpu.name = gpu.name or device.name
        gpu.saw("nccl_tests", None)
        where = f" on {device.host}" if device.host else ""
        gpu.evidence.append(
            TriageEvidence(
                source="nccl_tests",
                severity="info",
                what=f"nccl-tests rank {device.rank}{where}, CUDA device {device.device}: the node-level bandwidth "
                "verdict is in node_evidence",
            )
        )
    if unmatched:
        join.warnings.append(
            "nccl-tests device(s) whose bus id names no single GPU of the other sources (old nccl-tests print only "
            f"the bus number): {', '.join(unmatched[:8])}" + (" ..." if len(unmatched) > 8 else "")
        )
    verdict = report.verdict
    severity: Severity = verdict.severity if verdict.status != "PASS" else "info"
    node_evidence.append(
        TriageEvidence(
            source="nccl_tests",
            severity=severity,
            what=clip_str(f"nccl-tests {report.collective or ''} {verdict.status}: {verdict.text}", MAX_LINE_TEXT),
            action=None if verdict.status == "PASS" else "see the verdict text; run gpu_health and check NVLink",
        )
    )
    if len(report.hosts) > 1:
        join.warnings.append(
            f"the nccl-tests run spans {len(report.hosts)} hosts ({', '.join(report.hosts[:4])}); triage judges one "
            "node"
        )
    return f"{report.collective or 'collective'} on {report.nranks or len(report.devices)} rank(s): {verdict.status}"


def _gsp_notes(join: _Join, text: str | None, scan: KernelLogScan | None) -> list[str]:
    """The driver's 'GPU4' in GSP messages is its own GPU number: say so, and which GPU (by bus id) it is."""
    found: dict[int, tuple[int, str | None]] = {}  # GPUn -> (first line, bus id from an Xid line naming it)
    lines: list[tuple[int, str]] = []
    if text is not None:
        for number, line in enumerate(text.splitlines(), start=1):
            if "NVRM" in line and ("GSP" in line or "RPC" in line):
                lines.append((number, line[:4096]))
    elif scan is not None:
        lines = [(e.line_number, f"NVRM: Xid (PCI:{e.pci_bus_id}): {e.message}") for e in scan.events if e.pci_bus_id]
    for number, line in lines:
        for match in _GSP_NAME.finditer(line):
            n = int(match.group(1))
            pci = _XID_PCI.search(line)
            bus = normalise_bus_id(pci.group(1)) if pci else None
            first, known = found.get(n, (number, None))
            found[n] = (first, known or bus)
    notes = []
    by_index = {g.index: g for g in join.gpus if g.index is not None and "nvidia_smi" in g.seen_by}
    smi_given = any("nvidia_smi" in g.seen_by for g in join.gpus)
    for n, (line_number, bus) in sorted(found.items()):
        text_note = (
            f"The kernel log says 'GPU{n}' in GSP messages (first at line {line_number}): that is the driver's own "
            f"number for the GPU, not nvidia-smi index {n} (nor CUDA device {n})"
        )
        if bus:
            gpu = join.find(bus=bus)
            text_note += f"; the Xid line ties it to PCI {bus}"
            if gpu is not None and gpu.index is not None and "nvidia_smi" in gpu.seen_by:
                text_note += f", which nvidia-smi lists as index {gpu.index}"
            elif smi_given:
                text_note += ", which is not in the nvidia-smi capture"
        if n in by_index and by_index[n].bus_id != bus:
            text_note += f"; nvidia-smi index {n} is {by_index[n].bus_id or 'another GPU'}, a different GPU"
        notes.append(text_note + ".")
    return notes


# ---------------------------------------------------------------------------------------------------------------------
# verdicts and actions


def _gpu_action(gpu: _Gpu, verdict: Status, missing: list[Source]) -> str:
    worst = max(gpu.evidence, key=lambda e: SEVERITY_RANK[e.severity], default=None)
    if "nvidia_smi" in missing and verdict == "unhealthy":
        said = "; ".join(gpu.headline.values())
        because = f" ({said})" if said else ""
        seen = ", ".join(SOURCE_NAMES[s] for s in gpu.seen_by)
        return (
            f"Drain and reboot the node: GPU {gpu.label} is reported by the {seen}{because} but nvidia-smi does not "
            "list it, so it cannot be reset on its own; if it is still missing after the reboot, send the node for "
            "hardware inspection." + (f" The catalog's advice: {worst.action}" if worst and worst.action else "")
        )
    if verdict in ("unhealthy", "degraded") and worst is not None and worst.action:
        return worst.action
    if verdict == "unknown":
        return "Unknown: no source judged this GPU; capture nvidia-smi -q for it."
    return "None."


def _no_gpu_judged(smi_gpus: int | None, smi_missing: str | None, probe: Callable[[], LiveGpus] | None) -> str:
    """The first action when no GPU is judged: what is missing, here, for a verdict (probe: reads NVML here)."""
    if smi_missing is not None:
        return f"Unknown: {smi_missing}; give nvidia-smi -q output captured on the node."
    if smi_gpus == 0:
        return (
            "Unknown: nvidia-smi (or NVML) reaches no GPU on the node. If it should have GPUs they are lost or "
            "unbound: count them with lspci -d 10de:, look for Xid 79 in the kernel log and reboot the node."
        )
    if smi_gpus is not None:
        return (
            "Unknown: the nvidia-smi output given lacks the key fields (ECC or row-remap counters, temperature); "
            "capture the full nvidia-smi -q on the node."
        )
    if probe is None:
        return "Unknown: the sources given judge no GPU; give nvidia-smi -q output from the node."
    nvml_here = probe()
    if not nvml_here.available:
        return (
            f"Unknown: the sources given judge no GPU and this host has no live GPU source ({nvml_here.missing}); "
            "give nvidia-smi -q output from the node."
        )
    return (
        f"Unknown: the sources given judge no GPU; NVML reads {len(nvml_here.snapshots)} GPU(s) on this host: if "
        "this is the node, ask again with live NVML, else give nvidia-smi -q output from the node."
    )


def _absence_warnings(
    absent: dict[tuple[tuple[str, ...], tuple[str, ...]], list[tuple[str, str]]],
    enumerating: Sequence[str],
    join: _Join,
) -> list[str]:
    """One warning per group of GPUs that the same sources list and the same sources do not, and, when two sources
    that each list every GPU of the node have none in common, that they are probably not of one node and boot."""
    out = []
    for (seen_by, missing), labels in absent.items():
        seen = ", ".join(SOURCE_NAMES[s] for s in seen_by)
        it, they = ("it", "it") if len(labels) == 1 else ("them", "they")
        reasons = []
        if "nvidia_smi" in missing:
            reasons.append(
                f"nvidia-smi cannot see {it}: {they} may have fallen off the bus or hung, or the sources come from "
                "different nodes or boots (count the GPUs with lspci -d 10de:; reboot the node if one is gone)"
            )
        if "dcgm" in missing:
            reasons.append(f"DCGM did not test {it} (it could not reach {it}, or the run excluded {it})")
        if len(labels) == 1:  # one GPU: with what the sources that list it say (a group's is in its GPUs' evidence)
            label, said = labels[0]
            subject = f"GPU {label} is in the {seen}{' (' + said + ')' if said else ''}"
        else:
            subject = f"{len(labels)} GPUs ({text_list([label for label, _ in labels], 12)}) are in the {seen}"
        out.append(
            clip_str(
                f"{subject} but not in the {' or the '.join(SOURCE_NAMES[s] for s in missing)}: " + "; ".join(reasons),
                2 * MAX_LINE_TEXT,
            )
        )
    if len(enumerating) == 2:
        first, second = enumerating
        counts = [sum(1 for g in join.gpus if s in g.seen_by) for s in enumerating]
        shared = sum(1 for g in join.gpus if first in g.seen_by and second in g.seen_by)
        if shared == 0 and all(counts):
            out.insert(
                0,
                f"The {SOURCE_NAMES[first]} ({counts[0]} GPUs) and the {SOURCE_NAMES[second]} ({counts[1]} GPUs) "
                "have no GPU in common (joined on PCI bus id, UUID, serial or DCGM's GPU id): they are probably "
                "from different nodes or boots; triage each node with its own outputs",
            )
    return out


def text_list(items: Sequence[str], limit: int) -> str:
    """Up to `limit` items, comma-separated, and how many more."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _first_action(
    gpus: list[GpuTriage], node_evidence: list[TriageEvidence], lost: set[str], no_gpu_judged: Callable[[], str]
) -> str:
    # GPUs nvidia-smi cannot reach (lost, or missing from its list) come first: they cannot be reset on their own
    unhealthy = sorted(
        (g for g in gpus if g.verdict == "unhealthy"),
        key=lambda g: not ("nvidia_smi" in g.missing_from or g.label in lost),
    )
    node_critical = [e for e in node_evidence if e.severity == "critical"]
    missing = [g for g in unhealthy if "nvidia_smi" in g.missing_from]
    if missing:
        return missing[0].action
    if len(unhealthy) >= 2 or (unhealthy and node_critical):
        names = ", ".join(g.label for g in unhealthy[:4]) + (" ..." if len(unhealthy) > 4 else "")
        return f"Drain the node: {len(unhealthy)} GPU(s) are unhealthy ({names}). First, {unhealthy[0].label}: " + (
            unhealthy[0].action
        )
    if node_critical:
        return f"Drain the node: {node_critical[0].what[:200]}" + (
            f" {node_critical[0].action}" if node_critical[0].action else ""
        )
    if unhealthy:
        return f"GPU {unhealthy[0].label}: {unhealthy[0].action}"
    degraded = [g for g in gpus if g.verdict == "degraded"]
    node_warning = [e for e in node_evidence if e.severity == "warning"]
    if degraded:
        return f"No urgent action; GPU {degraded[0].label} is degraded: {degraded[0].action}"
    if node_warning:
        return f"No GPU is unhealthy; the node has a warning: {node_warning[0].what[:300]}"
    if all(g.verdict == "unknown" for g in gpus):
        return no_gpu_judged()
    return "None: every source given says the node's GPUs are healthy."


def triage_node(
    *,
    nvidia_smi: str | None = None,
    smi_fields: list[str] | None = None,
    snapshots: Sequence[GpuSnapshot] | None = None,
    snapshots_missing: str | None = None,
    nvml_here: Callable[[], LiveGpus] | None = None,
    kernel_log: str | None = None,
    kernel_scan: KernelLogScan | None = None,
    dcgm: str | DcgmDiagReport | None = None,
    nccl_tests: str | NcclTestsReport | None = None,
    node: str | None = None,
    interconnect_expected: str | None = None,
    budget: int = MAX_RESULT_BYTES,
) -> NodeTriage:
    """Triage one node from any of its sources (see the module docstring).

    nvidia_smi: captured nvidia-smi text (smi_fields for a noheader CSV), or snapshots (e.g. live NVML), or
    snapshots_missing: why the live snapshots asked for cannot be read here (the GPU part is then unknown, with it);
    nvml_here: reads NVML on this host (e.g. nvml.live_gpus), called only when no source judges a GPU, for the
    first action to say what this host offers; kernel_log:
    kernel log text, or kernel_scan (an already scanned log); dcgm: `dcgmi diag -j` JSON (or its parsed report);
    nccl_tests: nccl-tests output (or its parsed report). At least one source. budget: bytes of the result's JSON
    (fewer GPUs and items listed until it fits; the counts cover them all). Raises InputError naming every source
    that cannot be read."""
    from servers.diagnostics.dcgm import parse_dcgm_diag
    from servers.diagnostics.kmsg import scan_text
    from servers.diagnostics.nccl_tests import parse_nccl_tests
    from servers.diagnostics.smi import parse_nvidia_smi
    from servers.diagnostics.xid import classify

    problems = []
    if sum(v is not None for v in (nvidia_smi, snapshots, snapshots_missing)) > 1:
        problems.append("nvidia_smi: give captured nvidia-smi text, snapshots or why they are missing, one of them")
    if kernel_log is not None and kernel_scan is not None:
        problems.append("kernel_log: give the kernel log text or its scan, not both")
    if all(v is None for v in (nvidia_smi, snapshots, snapshots_missing, kernel_log, kernel_scan, dcgm, nccl_tests)):
        problems.append(
            "no source given; accepted: any of nvidia-smi output (or live NVML), a kernel log, DCGM diagnostic JSON, "
            "nccl-tests output"
        )
    if problems:
        raise InputError("; ".join(problems))

    def attempt(name: str, parse: Callable[[], T]) -> T | None:
        try:
            return parse()
        except InputError as exc:
            problems.append(f"{name}: {exc}")
            return None

    smi: SmiParse | None = None
    if nvidia_smi is not None:
        smi = attempt("nvidia_smi", lambda: parse_nvidia_smi(nvidia_smi, fields=smi_fields))
    scan = kernel_scan
    if kernel_log is not None:
        scan = attempt("kernel_log", lambda: scan_text(kernel_log, classify=classify))
    dcgm_report = dcgm if isinstance(dcgm, DcgmDiagReport) else None
    if isinstance(dcgm, str):
        dcgm_report = attempt("dcgm", lambda: parse_dcgm_diag(dcgm))
    nccl_report = nccl_tests if isinstance(nccl_tests, NcclTestsReport) else None
    if isinstance(nccl_tests, str):
        nccl_report = attempt("nccl_tests", lambda: parse_nccl_tests(nccl_tests))
    if problems:
        raise InputError("; ".join(problems))

    join = _Join()
    node_evidence: list[TriageEvidence] = []
    notes: list[str] = []
    summaries: dict[Source, str] = {}
    smi_gpus = list(smi.gpus) if smi is not None else list(snapshots) if snapshots is not None else None
    if smi_gpus is not None:
        summaries["nvidia_smi"] = _add_smi(join, smi_gpus, interconnect_expected)
        if smi is not None:
            join.warnings.extend(f"nvidia-smi: {w}" for w in smi.warnings)
    elif snapshots_missing is not None:
        summaries["nvidia_smi"] = clip_str(f"unknown: {snapshots_missing}", MAX_LINE_TEXT)
        join.warnings.append(clip_str(f"the GPU part is unknown: {snapshots_missing}", MAX_LINE_TEXT))
    if scan is not None:
        summaries["kernel_log"] = _add_kernel_log(join, scan, node_evidence)
    if dcgm_report is not None:
        summaries["dcgm"] = _add_dcgm(join, dcgm_report, node_evidence, notes)
    if nccl_report is not None:
        summaries["nccl_tests"] = _add_nccl(join, nccl_report, node_evidence)
    if node is None and nccl_report is not None and len(nccl_report.hosts) == 1:
        node = nccl_report.hosts[0]
    notes.extend(_gsp_notes(join, kernel_log, scan))

    # Sources that list every GPU of the node: a GPU another source names but they do not is worth a warning.
    enumerating: list[Source] = [
        s
        for s, given in (("nvidia_smi", smi_gpus is not None), ("dcgm", bool(dcgm_report and dcgm_report.gpus)))
        if given
    ]
    warnings = list(join.warnings)
    results: list[GpuTriage] = []
    lost = {gpu.label for gpu in join.gpus if gpu.lost}
    # GPUs one source lists and another does not: one warning per (seen by, missing from), naming the GPUs
    absent: dict[tuple[tuple[str, ...], tuple[str, ...]], list[tuple[str, str]]] = {}
    for gpu in join.gpus:
        missing = [s for s in enumerating if s not in gpu.seen_by]
        verdict = _worst_status([v for v in gpu.verdicts.values() if v != "unknown"])
        if missing:
            said = "; ".join(
                h if len(gpu.headline) == 1 else f"{SOURCE_NAMES[s]}: {h}" for s, h in gpu.headline.items()
            )
            key = (tuple(s for s in SOURCES if s in gpu.seen_by), tuple(missing))
            absent.setdefault(key, []).append((gpu.label, said))
        judged = {s: v for s, v in gpu.verdicts.items() if v != "unknown"}
        if "unhealthy" in judged.values() and "healthy" in judged.values():
            positions = ", ".join(
                f"{SOURCE_NAMES[s]} {v}" + (f" ({gpu.headline[s]})" if s in gpu.headline and v != "healthy" else "")
                for s, v in judged.items()
            )
            warnings.append(
                f"Sources disagree on GPU {gpu.label}: {positions}. A kernel log covers the time since boot, "
                "nvidia-smi and DCGM the present: a fault may have been cleared by a reset since; act on the worse "
                "until dcgmi diag -r 3 passes."
            )
        evidence = sorted(gpu.evidence, key=lambda e: (-SEVERITY_RANK[e.severity], SOURCES.index(e.source)))
        results.append(
            GpuTriage(
                bus_id=gpu.bus_id,
                label=gpu.label,
                index=gpu.index,
                name=gpu.name,
                uuid=gpu.uuid,
                serial=gpu.serial,
                dcgm_gpu_id=gpu.dcgm_gpu_id,
                nccl_ranks=sorted(gpu.nccl_ranks)[:64],
                seen_by=[s for s in SOURCES if s in gpu.seen_by],
                missing_from=missing,
                source_verdicts={s: gpu.verdicts[s] for s in SOURCES if s in gpu.verdicts},
                verdict=verdict,
                evidence=evidence,
                action=_gpu_action(gpu, verdict, missing),
            )
        )
    warnings += _absence_warnings(absent, enumerating, join)
    results.sort(key=lambda g: (g.index is None, g.index if g.index is not None else 0, g.bus_id or "", g.label))
    node_evidence.sort(key=lambda e: -SEVERITY_RANK[e.severity])
    counts = {s: sum(1 for g in results if g.verdict == s) for s in STATUSES}
    node_status = _worst_status([g.verdict for g in results] + [_severity_status(e.severity) for e in node_evidence])
    if not results and not node_evidence:
        node_status = "unknown"
    smi_count = len(smi_gpus) if smi_gpus is not None else None
    missing_here = clip(snapshots_missing, MAX_LINE_TEXT) if smi_gpus is None else None
    first_action = _first_action(
        results, node_evidence, lost, lambda: _no_gpu_judged(smi_count, missing_here, nvml_here)
    )
    shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    read = [SOURCE_NAMES[s] for s in SOURCES if s in summaries and not (s == "nvidia_smi" and smi_gpus is None)]
    summary = (
        f"Node{' ' + node if node else ''} {node_status}: {len(results)} GPU(s) ({shown or 'none'}) from "
        + (", ".join(read) or "no source that could be read")
        + f". {len(warnings)} warning(s). First action: {first_action}"
    )
    sources = [
        SourceSummary(
            source=s,
            given=s in summaries,
            gpus=sum(1 for g in results if s in g.seen_by),
            summary=summaries.get(s, "not given"),
        )
        for s in SOURCES
    ]

    def build(scale: float) -> NodeTriage:
        ranked = sorted(range(len(results)), key=lambda i: (-STATUS_RANK[results[i].verdict], i))
        keep = set(ranked[: scaled(MAX_GPUS_LISTED, scale)])
        listed = []
        for i, gpu in enumerate(results):
            if i not in keep:
                continue
            items, omitted = pick(gpu.evidence, scaled(MAX_EVIDENCE, scale))
            listed.append(gpu.model_copy(update={"evidence": items, "evidence_omitted": omitted}))
        node_items, node_omitted = pick(node_evidence, scaled(MAX_NODE_EVIDENCE, scale))
        return NodeTriage(
            node=clip(node),
            verdict=node_status,
            first_action=first_action,
            summary=summary,
            counts=counts,
            gpu_count=len(results),
            gpus=listed,
            gpus_omitted=len(results) - len(listed),
            node_evidence=node_items,
            node_evidence_omitted=node_omitted,
            sources=sources,
            # warnings and notes are few and say what the GPUs cannot: they shrink last
            warnings=cap_notes(warnings, max(8, scaled(MAX_NOTES, scale))),
            notes=cap_notes(notes, max(8, scaled(MAX_NOTES, scale))),
        )

    return fit(build, budget)
