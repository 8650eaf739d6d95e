"""One result type for every diagnostic check, in the manner of gpud's CheckResult: a Finding says which check found
what about which GPU (or the node), with one status and one severity alphabet, its evidence and the action; the
checks are listed once, in CHECKS, and triage joins their findings. Plain module (no MCP imports).

The alphabets used inside every check:
- Severity: info, warning, critical (how urgent a finding is);
- Status: healthy, degraded, unhealthy, unknown (what a finding, a GPU or a node is judged to be).

The tools' published alphabets are made from Status by one mapping each: health and triage publish Status itself,
nccl-tests PASS / DEGRADED / FAIL / UNKNOWN (VERDICT_WORD), DCGM its own words pass / warn / fail / skip
(DCGM_WORD, read back with DCGM_STATUS).

A new diagnostic parser is one module with a function from its parsed input to a CheckReport, and one
``register_check`` line below; triage_node takes its input by the check's name (``others``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, WithJsonSchema

from servers.core.refs import resolve

Severity = Literal["info", "warning", "critical"]
Status = Literal["healthy", "degraded", "unhealthy", "unknown"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
STATUSES: tuple[Status, ...] = ("unhealthy", "degraded", "unknown", "healthy")  # the order counts are listed in
SEVERITY_RANK: dict[Severity, int] = {"critical": 3, "warning": 2, "info": 1}
STATUS_RANK: dict[Status, int] = {"unhealthy": 3, "degraded": 2, "healthy": 1, "unknown": 0}
# The order gpu_health and the exporter list GPUs in and take a node's worst in: a GPU that cannot be judged needs a
# look before a healthy one (triage's STATUS_RANK instead lets any source's judgement outrank unknown).
ATTENTION_RANK: dict[Status, int] = {"unhealthy": 3, "degraded": 2, "unknown": 1, "healthy": 0}

# The published alphabets, one mapping from Status each.
VerdictWord = Literal["PASS", "DEGRADED", "FAIL", "UNKNOWN"]
DcgmWord = Literal["pass", "fail", "warn", "skip"]
VERDICT_WORD: dict[Status, VerdictWord] = {
    "healthy": "PASS",
    "degraded": "DEGRADED",
    "unhealthy": "FAIL",
    "unknown": "UNKNOWN",
}
DCGM_WORD: dict[Status, DcgmWord] = {"healthy": "pass", "degraded": "warn", "unhealthy": "fail", "unknown": "skip"}
DCGM_STATUS: dict[DcgmWord, Status] = {word: status for status, word in DCGM_WORD.items()}


def severity_status(severity: Severity) -> Status:
    """The status a finding of this severity implies: critical unhealthy, warning degraded, info healthy."""
    return {"critical": "unhealthy", "warning": "degraded", "info": "healthy"}[severity]


def worst_status(statuses: Sequence[Status]) -> Status:
    """The worst of the statuses; unknown only when none is known (or none is given)."""
    return max(statuses, key=lambda s: STATUS_RANK[s], default="unknown")


_BUS_ID = re.compile(
    r"^(?:pci:)?(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<device>[0-9a-f]{1,2})(?:\.(?P<fn>[0-7]))?$"
)
_BUS_NUMBER = re.compile(r"^(?:0x)?([0-9a-f]{1,2})$")


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


@dataclass(frozen=True)
class GpuRef:
    """Which GPU a finding is about, by whatever ids its source prints (triage joins on them).

    bus_id: normalised ``dddd:bb:dd``; only_bus_number: the source gives no full bus id, only a bus number (old
    nccl-tests' ``[0x9b]``; bus_number, None when unreadable), joined when exactly one GPU has it, else left out
    (label names it); index: nvidia-smi's; dcgm_gpu_id with index_hint: the id is in NVML order (nvidia-smi's
    index), joined on it when no serial ties the GPU."""

    bus_id: str | None = None
    uuid: str | None = None
    serial: str | None = None
    index: int | None = None
    name: str | None = None
    dcgm_gpu_id: int | None = None
    index_hint: bool = False
    only_bus_number: bool = False
    bus_number: int | None = None
    label: str | None = None  # how to name it when it cannot be joined, e.g. "rank 3 [0x9b]"
    nccl_rank: int | None = None
    lost: bool = False  # the driver lists it but cannot reach it


@dataclass(frozen=True)
class Finding:
    """What one check found about one GPU (gpu) or the node (gpu None).

    status: what it implies for its subject (None: evidence only, no verdict); severity: how urgent; what and
    evidence: the finding and the values behind it; action: what to do; headline: the few words that name it
    when sources disagree; detail: what the check keeps as structured detail."""

    check: str
    rule: str
    status: Status | None
    severity: Severity
    what: str
    evidence: str = ""
    action: str | None = None
    gpu: GpuRef | None = None
    headline: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class CheckReport:
    """One check's findings on one node, and what it says about its own reading.

    seen: GPUs it names without a finding (e.g. identity lines); lists_every_gpu: it lists every GPU of the node,
    so a GPU another source names but it does not is worth a warning (missing_means says what that means, with
    {it} and {they}); read: False when it was given but nothing could be read (summary says why); node: the node it
    names; index_note / unmatched_warning: texts (with {ids} / {devices}) for GPUs joined on index_hint, or whose
    bus number named no single GPU."""

    check: str
    findings: list[Finding]
    summary: str
    seen: list[GpuRef] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lists_every_gpu: bool = False
    missing_means: str | None = None
    read: bool = True
    node: str | None = None
    index_note: str | None = None
    unmatched_warning: str | None = None


@dataclass(frozen=True)
class Check:
    """A registered check: its name (the key of its input and of its findings), how it is named in text, and the
    function from its input to a CheckReport (a callable, or "module:attr" imported when first run)."""

    name: str
    title: str
    run: str | Callable[[Any], CheckReport]

    def report(self, value: Any) -> CheckReport:
        run = resolve(self.run)
        assert callable(run)
        result = run(value)
        if not isinstance(result, CheckReport) or result.check != self.name:
            raise TypeError(f"check {self.name} returned {type(result).__name__}, not its CheckReport")
        return result


CHECKS: dict[str, Check] = {}


def register_check(check: Check) -> Check:
    """Add a check (its name must be new); triage lists checks in registration order."""
    if check.name in CHECKS:
        raise ValueError(f"a check named {check.name!r} is already registered")
    CHECKS[check.name] = check
    return check


register_check(Check("nvidia_smi", "nvidia-smi output", "servers.diagnostics.health:smi_report"))
register_check(Check("kernel_log", "kernel log", "servers.diagnostics.kmsg.findings:kernel_log_report"))
register_check(Check("dcgm", "DCGM diagnostic", "servers.diagnostics.dcgm:dcgm_report"))
register_check(Check("nccl_tests", "nccl-tests output", "servers.diagnostics.nccl_tests:nccl_report"))
BUILTIN_CHECKS: tuple[str, ...] = tuple(CHECKS)


def _registered(name: str) -> str:
    if name not in CHECKS:
        raise ValueError(f"{name!r} is not a registered check; registered: {', '.join(CHECKS)}")
    return name


# A check's name in a published result: validated against the registry; published as the bundled checks' enum.
CheckName = Annotated[
    str, AfterValidator(_registered), WithJsonSchema({"enum": list(BUILTIN_CHECKS), "type": "string"})
]
