"""One-call node triage: every source about a node's GPUs joined per GPU, one verdict each, and the node's first
action. Plain module (no MCP imports).

Sources, any of them (each parsed by its own module, never re-parsed here):
- nvidia-smi text (``-q``, ``-q -x`` XML or ``--query-gpu`` CSV; servers.diagnostics.smi) or live NVML snapshots,
  judged by the health rules (servers.diagnostics.health);
- a kernel log (servers.diagnostics.kmsg, classified with the Xid catalog of servers.diagnostics.xid);
- DCGM diagnostics JSON (``dcgmi diag -j``; servers.diagnostics.dcgm);
- nccl-tests output (servers.diagnostics.nccl_tests): which GPUs took part, and the node's bandwidth verdict.

Each source is a check registered in servers.diagnostics.findings (CHECKS): its module turns its parsed input into a
CheckReport of Findings (one status and severity alphabet), and triage joins the findings, whatever the check; a
check registered elsewhere takes its input through ``others``. A finding about a GPU is evidence on it and, with its
status, that source's verdict; a finding about the node counts by its status (by its severity when it has none).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
from servers.diagnostics.findings import (
    CHECKS,
    SEVERITY_RANK,
    STATUS_RANK,
    STATUSES,
    CheckName,
    CheckReport,
    Finding,
    GpuRef,
    Severity,
    Status,
    normalise_bus_id,
    severity_status,
    worst_status,
)
from servers.diagnostics.kmsg import KernelLogScan
from servers.diagnostics.nccl_tests import NcclTestsReport
from servers.diagnostics.nvml import LiveGpus
from servers.diagnostics.smi import SmiParse
from servers.diagnostics.snapshot import GpuSnapshot

Source = CheckName  # a registered check's name (servers.diagnostics.findings.CHECKS)
T = TypeVar("T")

MAX_GPUS = 1024  # GPUs one triage joins (a node has at most a few dozen)
MAX_GPUS_LISTED = 128
MAX_EVIDENCE = 16  # evidence items listed per GPU (the worst first)
MAX_NODE_EVIDENCE = 50

_GSP_NAME = re.compile(r"\bGPU(\d{1,3})\s+(?:GSP|RPC)\b")
_XID_PCI = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]{5,20})\)")


def _sources() -> tuple[str, ...]:
    """The registered checks, in registration order (the order sources are listed and evidence ranked in)."""
    return tuple(CHECKS)


def _title(source: str) -> str:
    return CHECKS[source].title


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
    seen_by: list[str] = field(default_factory=list)
    verdicts: dict[str, Status] = field(default_factory=dict)
    evidence: list[TriageEvidence] = field(default_factory=list)
    headline: dict[str, str] = field(default_factory=dict)  # the worst thing each source said, for warnings
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

    def saw(self, source: str, verdict: Status | None, headline: str | None = None) -> None:
        if source not in self.seen_by:
            self.seen_by.append(source)
        if verdict is not None and STATUS_RANK[verdict] >= STATUS_RANK.get(self.verdicts.get(source, "unknown"), 0):
            self.verdicts[source] = verdict
            if headline:
                self.headline[source] = headline


@dataclass
class _Placing:
    """What the join knew when a check's GPUs began to be placed, and what the placing found."""

    by_index: dict[int, _Gpu]
    serials_known: bool
    placed: dict[int, _Gpu | None] = field(default_factory=dict)  # id(GpuRef) -> its GPU: one placing per reference
    matched_by_index: list[int] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)


class _Join:
    def __init__(self) -> None:
        self.gpus: list[_Gpu] = []
        self.by_bus: dict[str, _Gpu] = {}
        self.by_uuid: dict[str, _Gpu] = {}
        self.by_serial: dict[str, _Gpu] = {}
        self.warnings: list[str] = []
        self.node_evidence: list[TriageEvidence] = []
        self.node_statuses: list[Status] = []  # what each finding about the node judges it: its status, else severity
        self.notes: list[str] = []
        self.summaries: dict[str, str] = {}
        self.missing_means: dict[str, str] = {}  # the sources that list every GPU: what a GPU missing from one means

    def find(self, bus: str | None = None, uuid: str | None = None, serial: str | None = None) -> _Gpu | None:
        return (
            (self.by_bus.get(bus) if bus else None)
            or (self.by_uuid.get(uuid.lower()) if uuid else None)
            or (self.by_serial.get(serial) if serial else None)
        )

    def get(self, source: str, *, bus: str | None = None, uuid: str | None = None, serial: str | None = None) -> _Gpu:
        """The GPU these ids name (created when new); identities that disagree are warned about."""
        gpu = self.find(bus, uuid, serial)
        if gpu is None:
            if len(self.gpus) >= MAX_GPUS:
                raise InputError(f"the sources name more than {MAX_GPUS} GPUs; triage one node at a time")
            gpu = _Gpu()
            self.gpus.append(gpu)
        where = _title(source)
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

    def place(self, source: str, ref: GpuRef, placing: _Placing) -> _Gpu | None:
        """The GPU a reference names: on its bus id, UUID or serial; a bus number alone when exactly one GPU has it
        (else None: left out, named in a warning); a DCGM-style id as nvidia-smi's index when no serial ties it.
        A reference (one object) is placed once, however many findings share it."""
        if id(ref) not in placing.placed:
            placing.placed[id(ref)] = self._place(source, ref, placing)
        return placing.placed[id(ref)]

    def _place(self, source: str, ref: GpuRef, placing: _Placing) -> _Gpu | None:
        if ref.only_bus_number:
            number = ref.bus_number
            candidates = [g for g in self.gpus if g.bus_id and int(g.bus_id.split(":")[1], 16) == number]
            if number is None or len(candidates) != 1:
                placing.unmatched.append(ref.label or "a GPU")
                return None
            gpu = candidates[0]
        else:
            gpu = self.find(ref.bus_id, ref.uuid, ref.serial)
            hint = ref.dcgm_gpu_id
            if (
                gpu is None
                and ref.index_hint
                and hint in placing.by_index
                and not (ref.serial and placing.serials_known)
            ):
                gpu = placing.by_index[hint]
                placing.matched_by_index.append(hint)
                if ref.serial and gpu.serial is None:
                    gpu.serial = ref.serial
                    self.by_serial[ref.serial] = gpu
            else:
                gpu = self.get(source, bus=ref.bus_id, uuid=ref.uuid, serial=ref.serial)
        if ref.index is not None or ref.lost:
            gpu.index = ref.index
        gpu.name = gpu.name or ref.name
        gpu.lost = gpu.lost or ref.lost
        if ref.dcgm_gpu_id is not None:
            gpu.dcgm_gpu_id = ref.dcgm_gpu_id
        if ref.nccl_rank is not None and ref.nccl_rank not in gpu.nccl_ranks:
            gpu.nccl_ranks.append(ref.nccl_rank)
        return gpu

    def add(self, report: CheckReport) -> None:
        """One check's report: its GPUs placed, each finding as evidence on its GPU (or the node's), its verdicts."""
        source = report.check
        placing = _Placing(
            by_index={g.index: g for g in self.gpus if g.index is not None and "nvidia_smi" in g.seen_by},
            serials_known=any(g.serial for g in self.gpus),
        )
        for ref in report.seen:
            gpu = self.place(source, ref, placing)
            if gpu is not None:
                gpu.saw(source, None)
        for finding in report.findings:
            evidence = _evidence(finding)
            if finding.gpu is None:
                self.node_evidence.append(evidence)
                self.node_statuses.append(finding.status or severity_status(finding.severity))
                continue
            gpu = self.place(source, finding.gpu, placing)
            if gpu is None:
                continue
            gpu.saw(source, finding.status, finding.headline)
            gpu.evidence.append(evidence)
        if placing.matched_by_index and report.index_note:
            self.notes.append(report.index_note.format(ids=", ".join(map(str, placing.matched_by_index[:16]))))
        if placing.unmatched and report.unmatched_warning:
            devices = ", ".join(placing.unmatched[:8]) + (" ..." if len(placing.unmatched) > 8 else "")
            self.warnings.append(report.unmatched_warning.format(devices=devices))
        self.warnings.extend(report.warnings)
        self.notes.extend(report.notes)
        self.summaries[source] = report.summary
        if report.lists_every_gpu:
            self.missing_means[source] = report.missing_means or f"the {_title(source)} does not list {{it}}"


def _evidence(finding: Finding) -> TriageEvidence:
    what = f"{finding.what} ({finding.evidence})" if finding.evidence else finding.what
    return TriageEvidence(
        source=finding.check, severity=finding.severity, what=clip_str(what, MAX_LINE_TEXT), action=finding.action
    )


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


def _gpu_action(gpu: _Gpu, verdict: Status, missing: list[str]) -> str:
    worst = max(gpu.evidence, key=lambda e: SEVERITY_RANK[e.severity], default=None)
    if "nvidia_smi" in missing and verdict == "unhealthy":
        said = "; ".join(gpu.headline.values())
        because = f" ({said})" if said else ""
        seen = ", ".join(_title(s) for s in gpu.seen_by)
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
    missing_means: dict[str, str],
    join: _Join,
) -> list[str]:
    """One warning per group of GPUs that the same sources list and the same sources do not (each source that lists
    every GPU says what missing from it means), and, when two sources that each list every GPU of the node have none
    in common, that they are probably not of one node and boot."""
    out = []
    for (seen_by, missing), labels in absent.items():
        seen = ", ".join(_title(s) for s in seen_by)
        it, they = ("it", "it") if len(labels) == 1 else ("them", "they")
        reasons = [missing_means[s].format(it=it, they=they) for s in missing]
        if len(labels) == 1:  # one GPU: with what the sources that list it say (a group's is in its GPUs' evidence)
            label, said = labels[0]
            subject = f"GPU {label} is in the {seen}{' (' + said + ')' if said else ''}"
        else:
            subject = f"{len(labels)} GPUs ({text_list([label for label, _ in labels], 12)}) are in the {seen}"
        out.append(
            clip_str(
                f"{subject} but not in the {' or the '.join(_title(s) for s in missing)}: " + "; ".join(reasons),
                2 * MAX_LINE_TEXT,
            )
        )
    enumerating = list(missing_means)
    if len(enumerating) == 2:
        first, second = enumerating
        counts = [sum(1 for g in join.gpus if s in g.seen_by) for s in enumerating]
        shared = sum(1 for g in join.gpus if first in g.seen_by and second in g.seen_by)
        if shared == 0 and all(counts):
            out.insert(
                0,
                f"The {_title(first)} ({counts[0]} GPUs) and the {_title(second)} ({counts[1]} GPUs) "
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


# ---------------------------------------------------------------------------------------------------------------------
# the triage


def _read_sources(
    *,
    nvidia_smi: str | None,
    smi_fields: list[str] | None,
    snapshots: Sequence[GpuSnapshot] | None,
    snapshots_missing: str | None,
    kernel_log: str | None,
    kernel_scan: KernelLogScan | None,
    dcgm: str | DcgmDiagReport | None,
    nccl_tests: str | NcclTestsReport | None,
    interconnect_expected: str | None,
    others: Mapping[str, Any],
) -> dict[str, Any]:
    """Each given source parsed by its own module: the input of its check, by the check's name. Raises InputError
    naming every source that cannot be read."""
    from servers.diagnostics.dcgm import parse_dcgm_diag
    from servers.diagnostics.health import NodeGpus
    from servers.diagnostics.kmsg import scan_text
    from servers.diagnostics.nccl_tests import parse_nccl_tests
    from servers.diagnostics.smi import parse_nvidia_smi
    from servers.diagnostics.xid import classify

    problems = []
    if sum(v is not None for v in (nvidia_smi, snapshots, snapshots_missing)) > 1:
        problems.append("nvidia_smi: give captured nvidia-smi text, snapshots or why they are missing, one of them")
    if kernel_log is not None and kernel_scan is not None:
        problems.append("kernel_log: give the kernel log text or its scan, not both")
    unknown = [name for name in others if name not in CHECKS or name in _BUILTIN_INPUTS]
    if unknown:
        extra = [name for name in CHECKS if name not in _BUILTIN_INPUTS]
        problems.append(
            f"others: {', '.join(map(repr, unknown[:8]))} is not a registered check taking its input there; "
            f"accepted: {', '.join(extra) or 'none (the bundled checks have their own arguments)'}"
        )
    given = (nvidia_smi, snapshots, snapshots_missing, kernel_log, kernel_scan, dcgm, nccl_tests, *others.values())
    if not problems and all(v is None for v in given):
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

    inputs: dict[str, Any] = {}
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
    smi_gpus = list(smi.gpus) if smi is not None else list(snapshots) if snapshots is not None else None
    if smi_gpus is not None or snapshots_missing is not None:
        inputs["nvidia_smi"] = NodeGpus(
            gpus=smi_gpus,
            missing=snapshots_missing,
            warnings=tuple(smi.warnings) if smi is not None else (),
            interconnect_expected=interconnect_expected,
        )
    for name, value in (("kernel_log", scan), ("dcgm", dcgm_report), ("nccl_tests", nccl_report)):
        if value is not None:
            inputs[name] = value
    inputs.update({name: value for name, value in others.items() if value is not None})
    return inputs


_BUILTIN_INPUTS = ("nvidia_smi", "kernel_log", "dcgm", "nccl_tests")  # the checks triage_node has arguments for


def _gpu_results(join: _Join) -> tuple[list[GpuTriage], list[str]]:
    """Each GPU's verdict (the worst of its sources'), evidence worst first and action; the warnings: sources that
    disagree on a GPU, GPUs missing from a source that lists every GPU."""
    sources = _sources()
    enumerating = list(join.missing_means)
    warnings = list(join.warnings)
    results: list[GpuTriage] = []
    # GPUs one source lists and another does not: one warning per (seen by, missing from), naming the GPUs
    absent: dict[tuple[tuple[str, ...], tuple[str, ...]], list[tuple[str, str]]] = {}
    for gpu in join.gpus:
        missing = [s for s in enumerating if s not in gpu.seen_by]
        verdict = worst_status([v for v in gpu.verdicts.values() if v != "unknown"])
        if missing:
            said = "; ".join(h if len(gpu.headline) == 1 else f"{_title(s)}: {h}" for s, h in gpu.headline.items())
            key = (tuple(s for s in sources if s in gpu.seen_by), tuple(missing))
            absent.setdefault(key, []).append((gpu.label, said))
        judged = {s: v for s, v in gpu.verdicts.items() if v != "unknown"}
        if "unhealthy" in judged.values() and "healthy" in judged.values():
            positions = ", ".join(
                f"{_title(s)} {v}" + (f" ({gpu.headline[s]})" if s in gpu.headline and v != "healthy" else "")
                for s, v in judged.items()
            )
            warnings.append(
                f"Sources disagree on GPU {gpu.label}: {positions}. A kernel log covers the time since boot, "
                "nvidia-smi and DCGM the present: a fault may have been cleared by a reset since; act on the worse "
                "until dcgmi diag -r 3 passes."
            )
        evidence = sorted(gpu.evidence, key=lambda e: (-SEVERITY_RANK[e.severity], sources.index(e.source)))
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
                seen_by=[s for s in sources if s in gpu.seen_by],
                missing_from=missing,
                source_verdicts={s: gpu.verdicts[s] for s in sources if s in gpu.verdicts},
                verdict=verdict,
                evidence=evidence,
                action=_gpu_action(gpu, verdict, missing),
            )
        )
    warnings += _absence_warnings(absent, join.missing_means, join)
    results.sort(key=lambda g: (g.index is None, g.index if g.index is not None else 0, g.bus_id or "", g.label))
    return results, warnings


def _bounded_triage(
    fields: dict[str, Any], results: list[GpuTriage], node_evidence: list[TriageEvidence], budget: int
) -> NodeTriage:
    """The triage within budget bytes: fewer GPUs (the worst kept) and items listed; the counts cover them all."""

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
            **{k: v for k, v in fields.items() if k not in ("warnings", "notes")},
            gpu_count=len(results),
            gpus=listed,
            gpus_omitted=len(results) - len(listed),
            node_evidence=node_items,
            node_evidence_omitted=node_omitted,
            # warnings and notes are few and say what the GPUs cannot: they shrink last
            warnings=cap_notes(fields["warnings"], max(8, scaled(MAX_NOTES, scale))),
            notes=cap_notes(fields["notes"], max(8, scaled(MAX_NOTES, scale))),
        )

    return fit(build, budget)


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
    others: Mapping[str, Any] | None = None,
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
    nccl_tests: nccl-tests output (or its parsed report); others: the input of any other registered check
    (servers.diagnostics.findings.register_check), by its name. At least one source. budget: bytes of the result's
    JSON (fewer GPUs and items listed until it fits; the counts cover them all). Raises InputError naming every
    source that cannot be read."""
    inputs = _read_sources(
        nvidia_smi=nvidia_smi, smi_fields=smi_fields, snapshots=snapshots, snapshots_missing=snapshots_missing,
        kernel_log=kernel_log, kernel_scan=kernel_scan, dcgm=dcgm, nccl_tests=nccl_tests,
        interconnect_expected=interconnect_expected, others=others or {},
    )  # fmt: skip
    join = _Join()
    reports = [CHECKS[name].report(inputs[name]) for name in _sources() if name in inputs]
    for report in reports:
        join.add(report)
    node = node or next((r.node for r in reports if r.node), None)
    join.notes.extend(_gsp_notes(join, kernel_log, inputs.get("kernel_log")))
    results, warnings = _gpu_results(join)
    node_evidence = sorted(join.node_evidence, key=lambda e: -SEVERITY_RANK[e.severity])
    counts = {s: sum(1 for g in results if g.verdict == s) for s in STATUSES}
    # a finding about the node counts by its own status where it has one (nccl-tests' FAIL: unhealthy, as it says),
    # else by its severity
    node_status = worst_status([g.verdict for g in results] + join.node_statuses)
    if not results and not node_evidence:
        node_status = "unknown"
    smi = inputs.get("nvidia_smi")
    smi_count = len(smi.gpus) if smi is not None and smi.gpus is not None else None
    missing_here = clip(snapshots_missing, MAX_LINE_TEXT) if smi_count is None else None
    first_action = _first_action(
        results, node_evidence, {gpu.label for gpu in join.gpus if gpu.lost},
        lambda: _no_gpu_judged(smi_count, missing_here, nvml_here),
    )  # fmt: skip
    shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    read = [_title(r.check) for r in reports if r.read]
    summary = (
        f"Node{' ' + node if node else ''} {node_status}: {len(results)} GPU(s) ({shown or 'none'}) from "
        + (", ".join(read) or "no source that could be read")
        + f". {len(warnings)} warning(s). First action: {first_action}"
    )
    sources = [
        SourceSummary(
            source=s,
            given=s in join.summaries,
            gpus=sum(1 for g in results if s in g.seen_by),
            summary=join.summaries.get(s, "not given"),
        )
        for s in _sources()
    ]
    fields = {
        "node": clip(node), "verdict": node_status, "first_action": first_action, "summary": summary,
        "counts": counts, "sources": sources, "warnings": warnings, "notes": join.notes,
    }  # fmt: skip
    return _bounded_triage(fields, results, node_evidence, budget)
