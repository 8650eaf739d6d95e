"""What a kernel-log scan returns: its events, the per-GPU summary, GPU identities and counts. Plain pydantic."""

from typing import Literal

from pydantic import Field

from servers.core.models import Model

EventKind = Literal["xid", "sxid", "nccl_segfault", "fallen_off_bus", "recovery_action"]

# Most items a result lists (the scan counts everything): summary rows (worst first), unknown codes, GPU identities.
MAX_SUMMARY_LISTED = 200
MAX_UNKNOWN_LISTED = 50
MAX_GPUS_LISTED = 256


class KernelEvent(Model):
    kind: EventKind
    code: int | None = Field(default=None, description="Xid or SXid number; None for kinds without one")
    pci_bus_id: str | None = Field(
        default=None, description="Lowercase DDDD:BB:DD, with .F when the line gives the function"
    )
    uuid: str | None = Field(default=None, description="GPU UUID from an 'NVRM: GPU at PCI:...' line, when logged")
    time: str | None = Field(
        default=None,
        description="ISO 8601 when the line's prefix gives a date; else the raw wall-clock prefix (journald has no "
        "year); None when the line has only an uptime or no prefix",
    )
    uptime_s: float | None = Field(default=None, description="Seconds since boot, from a [12345.678901] prefix")
    boot: int = Field(description="0 for the first boot in the log, +1 at each reboot seen")
    line_number: int = Field(description="1-based line of the log")
    message: str = Field(description="The text after the code (and pid/name): what the driver said")
    severity: str = Field(description="From the classifier; 'unknown' when it could not place the code")
    action: str = Field(description="What to do, from the classifier")
    pid: int | None = None
    process: str | None = Field(default=None, description="name= of an Xid, or the crashing process of a segfault")
    device: str | None = Field(default=None, description="The reporting device, e.g. nvidia-nvswitch3 for an SXid")
    unit: str | None = Field(default=None, description="NVLink5 (Xid 144-150) sub-unit, e.g. NETIR_LINK_EVT")
    fatal: bool | None = Field(default=None, description="NVLink5 Fatal/Nonfatal, SXid Fatal/Non-fatal")
    link: int | None = Field(default=None, description="NVLink or NVSwitch link number")
    intrinfo: str | None = Field(default=None, description="NVLink5 interrupt info word, hex as logged")
    error_status: str | None = Field(default=None, description="NVLink5 error status word, hex as logged")
    subcode: int | None = Field(default=None, description="NVLink5 subcode: bits 20-25 of intrinfo")
    recovery_action: str | None = Field(default=None, description="Xid 154: the recovery action the driver now asks")


class EventSummary(Model):
    kind: EventKind
    code: int | None = None
    pci_bus_id: str | None = Field(default=None, description="The device (DDDD:BB:DD, no function); None for NCCL")
    uuid: str | None = None
    count: int = Field(description="Exact number of lines, listed as events or not")
    first_time: str | None = None
    last_time: str | None = None
    first_uptime_s: float | None = None
    last_uptime_s: float | None = None
    first_line: int
    last_line: int
    boots: int = Field(description="Number of distinct boots it appeared in")
    severity: str = Field(description="The worst severity among its lines")
    action: str = Field(description="The action given with the worst severity")
    flood: bool = Field(description="Xid 45, or more than 100 lines: one collapsed row, not one alarm per line")
    escalation: str | None = Field(
        default=None, description="Set when it asked for a reset or reboot in 3 or more boots: inspect the hardware"
    )
    rate_limited: bool = Field(
        default=False, description="The driver said it rate-limits prints for this GPU: the count is a lower bound"
    )
    units: list[str] = Field(default_factory=list, description="NVLink5 sub-units seen (up to 16)")
    example: str = Field(description="The first line, without its timestamp prefix")


class UnknownCode(Model):
    kind: EventKind
    code: int
    line_number: int
    line: str = Field(description="The raw first line with this code")


class GpuIdentity(Model):
    pci_bus_id: str
    uuid: str | None = None
    serial: str | None = None
    line_number: int


class KernelLogScan(Model):
    events: list[KernelEvent] = Field(default_factory=list, description="In log order, capped (see events_truncated)")
    summary: list[EventSummary] = Field(
        default_factory=list,
        description=f"One row per GPU (PCI or UUID) and kind+code; worst severity first; at most {MAX_SUMMARY_LISTED} "
        "(see summary_omitted)",
    )
    summary_rows: int = Field(default=0, description="Distinct GPU/code rows found, listed or not")
    summary_omitted: int = Field(default=0, description="Summary rows found but not listed (the least severe)")
    gpus: list[GpuIdentity] = Field(
        default_factory=list,
        description=f"PCI address to UUID (and serial) as logged; at most {MAX_GPUS_LISTED} (see gpus_omitted)",
    )
    gpus_omitted: int = 0
    boots: int = Field(default=0, description="Boots the log covers (reboot markers seen + 1); 0 for an empty log")
    lines_read: int = 0
    bytes_read: int | None = Field(default=None, description="Known when reading a file or bytes")
    matched_lines: int = Field(
        default=0,
        description="Lines recognised: events, their continuation lines, PCI-UUID maps and boot markers (a note "
        "says which when none is an event)",
    )
    counts: dict[str, int] = Field(
        default_factory=dict, description="Events per kind in the whole log, exact (never capped like the lists)"
    )
    unknown_codes: list[UnknownCode] = Field(
        default_factory=list,
        description=f"Codes the classifier could not place, each with its raw first line; at most {MAX_UNKNOWN_LISTED}",
    )
    unknown_codes_omitted: int = 0
    events_truncated: bool = Field(default=False, description="True when some events are counted but not listed")
    events_omitted: int = Field(default=0, description="How many events are counted but not listed")
    summary_truncated: bool = False
    parse_errors: int = Field(default=0, description="Candidate lines that could not be read (skipped)")
    notes: list[str] = Field(
        default_factory=list, description="Rate-limit warnings from the driver, read errors, what matched if no event"
    )
