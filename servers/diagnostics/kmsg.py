"""Kernel-log (dmesg, journald, syslog) scanner for GPU faults. Plain module.

It reads a log as a stream and finds NVIDIA Xid lines in every shape the drivers print (with or without "PCI:",
with pid/name, with '<unknown>', with none; NVLink5 Xids 144-150 with their sub-unit, intrinfo and subcode; Xid 154
recovery-action changes), NVSwitch SXid lines, NCCL segfaults, the "fallen off the bus" message (one line or three,
with no Xid), the lines that map a PCI address to a GPU UUID, and reboots. Every timestamp prefix is understood:
``[171167.621162]`` (uptime), ``[Sun Feb 23 16:24:18 2025]`` (dmesg -T),
``kern  :warn  : 2025-01-21T04:41:44,285060+00:00`` (dmesg --decode --time-format=iso),
``May 18 19:02:39 host kernel:`` (journald, syslog), ``2025-01-21T04:41:44.285060+00:00 host kernel:``
(journalctl -o short-iso) and none.

Speed and memory. The log is handled in blocks of whole lines (4 MiB of bytes when reading a file or a binary
reader, 16,384 lines joined when given an iterable of lines): five ``find`` passes over the block look for the
trigger words (``TRIGGERS``), each running in C at over 1 GB/s, plus one ``count`` of newlines for line numbers; only
the lines that hold a trigger are cut out, decoded (UTF-8, undecodable bytes replaced) and parsed with regular
expressions. An ordinary line costs no Python bytecode and no allocation of its own.

Memory is bounded: the event list stops at ``max_events`` (and at ``FLOOD_THRESHOLD`` events per GPU and code, so a
flood does not crowd out the rest), counts and summaries are aggregated as the lines go by and stay exact, and every
other list has a fixed cap.

Nothing in the log makes it raise: an unreadable line is skipped (counted in ``parse_errors``), a reader that fails
midway ends the scan with a note. Only a wrong argument (``max_events``, ``classify``, a missing file) raises
``InputError``.
"""

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from servers.core.errors import InputError, NotFoundError
from servers.diagnostics.bounds import fit, scaled

EventKind = Literal["xid", "sxid", "nccl_segfault", "fallen_off_bus", "recovery_action"]
Classifier = Callable[[str, int | None, str], tuple[str, str]]

UNKNOWN = "unknown"
DEFAULT_ACTION = "look the code up with explain_xid"
FLOOD_THRESHOLD = 100  # more occurrences than this (or Xid 45 at all): one collapsed row, flood=True
FLOOD_CODES = frozenset({45})  # preemptive cleanup: thousands per failed job are normal
ESCALATION_BOOTS = 3  # a code asking for a reset/reboot in this many distinct boots: inspect the hardware
MAX_SUMMARY_ROWS = 10_000
MAX_UNKNOWN_CODES = 1_000
MAX_NOTES = 50
MAX_GPUS = 4_096
MAX_UNITS = 16
MAX_TEXT = 1_000  # characters kept of a message or raw line
# Most items a result lists (the scan counts everything): summary rows (worst first), unknown codes, GPU identities.
MAX_SUMMARY_LISTED = 200
MAX_UNKNOWN_LISTED = 50
MAX_GPUS_LISTED = 256
MAX_PARSE = 4_096  # characters of a line given to the regular expressions (printk lines are <= 1024)
MAX_LINE = 1 << 20  # a "line" longer than this is cut; the rest up to its newline is skipped
CHUNK_BYTES = 4 << 20
BATCH_LINES = 16_384
BOOT_MARKER_WINDOW = 64  # boot markers this close together, with no event between, belong to one boot
UPTIME_REBOOT_DROP_S = 60.0  # uptime going back by more than this between matched lines means a reboot

# Substrings that a line must hold to be looked at. Everything recognised contains one of them:
# Xid, GPU-at-PCI, serial, fallen-off-the-bus, rate-limit and recovery lines all carry "NVRM"; NVSwitch lines "SXid";
# NCCL crashes "libnccl"; boot markers "Linux version", "Booting Linux" or "Command line:".
TRIGGERS = ("NVRM", "SXid", "libnccl", "Linux", "Command line:")
TRIGGERS_BYTES = tuple(word.encode() for word in TRIGGERS)

SEVERITY_RANK = {
    UNKNOWN: 0,
    "ignore": 1,
    "none": 1,
    "info": 1,
    "informational": 1,
    "non-critical": 2,
    "noncritical": 2,
    "warning": 2,
    "warn": 2,
    "error": 3,
    "critical": 4,
    "fatal": 5,
}
_NEEDS_RESET = re.compile(r"reset|reboot|restart_bm|restart_vm|drain", re.IGNORECASE)

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values, for a 154 line that gives only the number
RECOVERY_ACTIONS = {
    0: "None",
    1: "GPU Reset",
    2: "Node Reboot",
    3: "Drain P2P",
    4: "Drain and Reset",
    5: "Recover IMEX Domain",
    6: "Bus Reset",
    7: "System Reboot",
}


# ---------------------------------------------------------------------------------------------------------------
# output model


class KernelEvent(BaseModel):
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


class EventSummary(BaseModel):
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


class UnknownCode(BaseModel):
    kind: EventKind
    code: int
    line_number: int
    line: str = Field(description="The raw first line with this code")


class GpuIdentity(BaseModel):
    pci_bus_id: str
    uuid: str | None = None
    serial: str | None = None
    line_number: int


class KernelLogScan(BaseModel):
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
        default=0, description="Lines recognised: events, their continuation lines, PCI-UUID maps and boot markers"
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
    notes: list[str] = Field(default_factory=list, description="Rate-limit warnings from the driver, read errors")


# ---------------------------------------------------------------------------------------------------------------
# classification


def default_classify(kind: str, code: int | None, message: str) -> tuple[str, str]:
    """The fallback when the caller gives no classifier: nothing is known about any code."""
    return UNKNOWN, DEFAULT_ACTION


def _recovery_advice(action: str | None) -> tuple[str, str]:
    name = (action or "").strip().lower()
    if not name:
        return UNKNOWN, DEFAULT_ACTION
    if name in ("none", "0x0"):
        return "info", "none: the driver no longer asks for a recovery action"
    if "drain" in name and "reset" in name:
        return "critical", "drain the work from this GPU, then reset it (the driver asks for Drain and Reset)"
    if "drain" in name:
        return "critical", "drain peer-to-peer work from this GPU (the driver asks for Drain P2P)"
    if "imex" in name:
        return "critical", "recover the IMEX domain (the driver asks for it)"
    if "bus" in name and "reset" in name:
        return "critical", "reset the PCIe bus of this GPU (the driver asks for a bus reset)"
    if "reboot" in name:
        return "critical", "reboot the node (the driver asks for it)"
    if "reset" in name:
        return "critical", "reset the GPU (the driver asks for it)"
    return "critical", f"follow the driver's recovery action: {action}"


def _builtin_facts(kind: str, recovery: str | None) -> tuple[str, str] | None:
    """What is known without a catalog about the kinds that are not catalog codes."""
    if kind == "fallen_off_bus":
        return (
            "critical",
            "reboot the node (the GPU no longer answers on PCIe); if it recurs, inspect the GPU, its power and slot",
        )
    if kind == "nccl_segfault":
        return (
            "warning",
            "restart the job; if it recurs, check the NCCL and network-plugin versions and this node's Xid history",
        )
    if kind == "recovery_action":
        return _recovery_advice(recovery)
    return None


def severity_rank(severity: str) -> int:
    return SEVERITY_RANK.get(severity.strip().lower(), 0)


# ---------------------------------------------------------------------------------------------------------------
# line shapes

_HEX = "[0-9A-Fa-f]"
_PREFIX_RE = re.compile(
    r"(?:(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7]) *: *"
    r"(?:emerg|alert|crit|err|warn|notice|info|debug) *: *)?"
    r"(?:\[(?P<ctime>[A-Z][a-z]{2} +(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) +(?P<hms>\d{1,2}:\d{2}:\d{2}) +"
    r"(?P<year>\d{4}))\] *"
    r"|(?P<iso>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?P<tz>Z|[+-]\d{2}:?\d{2})?) +"
    r"(?:[^\s\[]+ +kernel: *)?"
    r"|(?P<syslog>[A-Z][a-z]{2} +\d{1,2} +\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?) +[^\s\[]+ +kernel: *"
    r")?"
    r"(?:\[ *(?P<up>\d{1,12}\.\d{1,9})\] *(?:[^\s\[]+ +kernel: *)?)?"
)
_MONTHS = {
    m: i for i, m in enumerate(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1)
}

_XID_RE = re.compile(r"NVRM: Xid \(([^)]{0,40})\): *(\d{1,9})(?: *,)? *(.*)")
_PID_NAME_RE = re.compile(r"pid=('?<unknown>'?|-?\d{1,10}) *(?:, *name=([^,]*?) *(?:,|$))? *")
_NVL5_RE = re.compile(
    r"([A-Z][A-Z0-9_]*) +(Fatal|Non-?[Ff]atal|NonFatal)\b(?P<mid>[^()]*?)\bLink +(-?\d{1,4}) *"
    rf"\( *(0x{_HEX}{{1,16}})(?:[ ,]+(0x{_HEX}{{1,16}}))?"
)
_RECOVERY_RE = re.compile(
    r"recovery action changed from +(?:(0x[0-9A-Fa-f]+|\d+) *)?(?:\(([^)]*)\))? *to +(?:(0x[0-9A-Fa-f]+|\d+) *)?"
    r"(?:\(([^)]*)\))?",
    re.IGNORECASE,
)
_SXID_RE = re.compile(r"(?:(nvidia-nvswitch\d*): *)?SXid \(([^)]{0,40})\): *(\d{1,9})(?: *,)? *(.*)")
_SXID_CONTINUATION = ("Severity ", "Data {", "Data:", "Data ")
_LINK_RE = re.compile(r"\bLink +(\d{1,4})\b")
_GPU_AT_RE = re.compile(r"NVRM: GPU at (?:PCI:)?([0-9A-Fa-f:.]{5,20}): *(GPU-[0-9A-Fa-f-]{8,64})")
_SERIAL_RE = re.compile(r"NVRM: GPU Board Serial Number: *(\S{1,64})")
_PCI_IN_TEXT_RE = re.compile(rf"(?<![0-9A-Fa-f])({_HEX}{{4,8}}:{_HEX}{{2}}:{_HEX}{{2}}(?:\.[0-7])?)(?![0-9A-Fa-f])")
_PCI_RE = re.compile(rf"(?:PCI:)?(?:({_HEX}{{1,8}}):)?({_HEX}{{1,2}}):({_HEX}{{1,2}})(?:\.([0-7]))?")
_SEGV_PROC_RE = re.compile(r"([^\s\[\]]{1,64})\[(\d{1,10})\]:? +(?:segfault|general protection|trap)")
_SEGV_LIB_RE = re.compile(r" in (libnccl[^\s\[]{0,64})")
_BOOT_MARKERS = ("Linux version ", "Booting Linux on physical CPU", "Command line:")


def normalize_pci(text: str | None) -> str | None:
    """'PCI:0000:3B:00' -> '0000:3b:00', '00000000:3b:00.0' -> '0000:3b:00.0', '3b:00' -> '0000:3b:00'."""
    if not text:
        return None
    match = _PCI_RE.fullmatch(text.strip())
    if not match:
        cleaned = text.strip().lower().removeprefix("pci:")
        return cleaned[:40] or None
    domain, bus, dev, fn = match.groups()
    domain = (domain or "0").lower()[-4:].rjust(4, "0")
    out = f"{domain}:{bus.lower().rjust(2, '0')}:{dev.lower().rjust(2, '0')}"
    return f"{out}.{fn}" if fn is not None else out


def device_of(pci: str | None) -> str | None:
    """The device part of a normalised PCI address (no function): the key of a GPU."""
    if pci is None:
        return None
    return pci.split(".", 1)[0]


def parse_prefix(line: str) -> tuple[str | None, float | None, int]:
    """(time, uptime_s, where the message starts) for one line; see KernelEvent.time."""
    match = _PREFIX_RE.match(line)
    if match is None:  # the pattern is all optional, so this does not happen; kept for safety
        return None, None, 0
    up = match.group("up")
    uptime = float(up) if up is not None else None
    time: str | None = None
    if match.group("ctime") is not None:
        month = _MONTHS.get(match.group("mon"))
        hms = match.group("hms").rjust(8, "0")
        if month is not None:
            time = f"{match.group('year')}-{month:02d}-{int(match.group('day')):02d}T{hms}"
        else:
            time = match.group("ctime")
    elif match.group("iso") is not None:
        iso = match.group("iso").replace(",", ".")
        iso = iso[:10] + "T" + iso[11:]
        tz = match.group("tz")
        if tz and tz != "Z" and ":" not in tz:
            iso = iso[: -len(tz)] + tz[:3] + ":" + tz[3:]
        time = iso
    elif match.group("syslog") is not None:
        time = " ".join(match.group("syslog").split())
    return time, uptime, match.end()


# ---------------------------------------------------------------------------------------------------------------
# the scanner


@dataclass
class _Row:
    kind: str
    code: int | None
    pci: str | None
    count: int = 0
    first_time: str | None = None
    last_time: str | None = None
    first_up: float | None = None
    last_up: float | None = None
    first_line: int = 0
    last_line: int = 0
    boots: int = 0
    last_boot: int = -1
    severity: str = UNKNOWN
    rank: int = -1
    action: str = DEFAULT_ACTION
    needs_reset: bool = False
    listed: int = 0
    example: str = ""
    units: list[str] = field(default_factory=list)


class _Scanner:
    def __init__(self, classify: Classifier | None, max_events: int) -> None:
        self.classify = classify
        self.max_events = max_events
        self.lines_read = 0
        self.bytes_read: int | None = None
        self.matched = 0
        self.parse_errors = 0
        self.boot = 0
        self.boot_started = False
        self.last_marker_line = -(10**9)
        self.events_in_boot = 0
        self.last_uptime: float | None = None
        self.events: list[dict[str, Any]] = []
        self.omitted = 0
        self.rows: dict[tuple[str | None, str, int | None], _Row] = {}
        self.summary_truncated = False
        self.unknown: dict[tuple[str, int], UnknownCode] = {}
        self.notes: list[str] = []
        self.gpus: dict[str, GpuIdentity] = {}
        self.uuid_by_boot: dict[tuple[int, str], str] = {}
        self.last_gpu_at: tuple[int, str] | None = None  # (line, device) of the last "GPU at PCI" line
        self.rate_limited: set[str] = set()
        self.fob_pending: list[Any] | None = None  # [first line no, pci, time, uptime, last line no, texts]
        self.carry: list[Any] = []  # pieces of a line not yet ended (str or bytes, never both)
        self.carry_len = 0
        self.skipping = False

    # --- feeding -----------------------------------------------------------------------------------------------

    def feed(self, piece: str | bytes) -> None:
        """Any piece of the log, text or UTF-8 bytes (one kind per scan); a line may span pieces."""
        nl: Any = b"\n" if isinstance(piece, bytes) else "\n"
        begin = 0
        if self.skipping:  # the rest of a line that was cut at MAX_LINE
            cut = piece.find(nl)
            if cut < 0:
                return
            begin = cut + 1
            self.skipping = False
        if self.carry:  # the start of a line left by the previous piece
            cut = piece.find(nl, begin)
            if cut < 0:
                self._carry(piece[begin:])
                return
            self.carry.append(piece[begin : cut + 1])
            head = nl[:0].join(self.carry)
            self.carry, self.carry_len = [], 0
            self.block(head, 0, len(head))
            begin = cut + 1
        end = piece.rfind(nl, begin) + 1
        if end > begin:
            self.block(piece, begin, end)
        else:
            end = begin
        if end < len(piece):
            self._carry(piece[end:])

    def _carry(self, part: str | bytes) -> None:
        self.carry.append(part)
        self.carry_len += len(part)
        if self.carry_len > MAX_LINE:  # no newline for too long: scan the start as one line, skip the rest
            nl: Any = b"\n" if isinstance(part, bytes) else "\n"
            head = nl[:0].join(self.carry)[:MAX_LINE] + nl
            self.carry, self.carry_len = [], 0
            self.block(head, 0, len(head))
            self.skipping = True

    def block(self, text: str | bytes, begin: int, end: int) -> None:
        """text[begin:end] is whole lines, each ending in a newline. Only lines holding a trigger are looked at."""
        raw = isinstance(text, bytes)
        nl: Any = b"\n" if raw else "\n"
        find = text.find
        rfind = text.rfind
        starts: set[int] = set()
        for word in TRIGGERS_BYTES if raw else TRIGGERS:
            pos = find(word, begin, end)  # type: ignore[arg-type]
            while pos >= 0:
                starts.add((rfind(nl, begin, pos) + 1) or begin)
                pos = find(word, find(nl, pos, end) + 1, end)  # type: ignore[arg-type]
        base = self.lines_read
        count = text.count
        if starts:
            seen = 0
            prev = begin
            for start in sorted(starts):
                seen += count(nl, prev, start)
                prev = start
                stop = find(nl, start, end)
                line: Any = text[start : min(stop, start + MAX_PARSE)]
                if raw:
                    line = line.decode("utf-8", "replace")
                self.line(line.rstrip("\r"), base + seen + 1)
        self.lines_read = base + count(nl, begin, end)

    def finish(self) -> None:
        if self.carry:
            nl: Any = b"\n" if isinstance(self.carry[0], bytes) else "\n"
            tail = nl[:0].join(self.carry) + nl
            self.carry, self.carry_len = [], 0
            self.block(tail, 0, len(tail))

    # --- one candidate line ------------------------------------------------------------------------------------

    def line(self, line: str, number: int) -> None:
        try:
            self._line(line, number)
        except Exception:  # a line no shape foresaw: skip it, never fail the scan
            self.parse_errors += 1

    def _line(self, line: str, number: int) -> None:
        if "NVRM" in line:
            if "Xid (" in line:
                match = _XID_RE.search(line)
                if match is not None:
                    self._xid(line, number, match)
                    return
            if "GPU at " in line:
                match = _GPU_AT_RE.search(line)
                if match is not None:
                    self._gpu_at(match, number)
                    return
            if "Serial Number" in line:
                match = _SERIAL_RE.search(line)
                if match is not None:
                    self._serial(match.group(1), number)
                    return
            if "fallen off the bus" in line:
                self._fallen_off_bus(line, number)
                return
            if "The NVIDIA GPU" in line:
                self._fob_start(line, number)
                return
            if "installed in this system" in line and self._fob_continues(number):
                self.fob_pending[4] = number  # type: ignore[index]
                self.fob_pending[5].append(_after_nvrm(line))  # type: ignore[index]
                return
            if "recovery action changed" in line:
                self._recovery_without_xid(line, number)
                return
            if "Rate limiting" in line:
                self._rate_limit(line, number)
                return
        if "SXid (" in line:
            match = _SXID_RE.search(line)
            if match is not None:
                self._sxid(line, number, match)
                return
        if "libnccl" in line and ("segfault" in line or "general protection" in line or "trap" in line):
            self._nccl_segfault(line, number)
            return
        if "Linux" in line or "Command line:" in line:
            _, uptime, start = parse_prefix(line)
            if line.startswith(_BOOT_MARKERS, start):
                self.matched += 1
                self._boot_hint(number)
                if uptime is not None:
                    self.last_uptime = uptime

    # --- boots -------------------------------------------------------------------------------------------------

    def _boot_hint(self, number: int) -> None:
        if self.events_in_boot or (self.boot_started and number - self.last_marker_line > BOOT_MARKER_WINDOW):
            self.boot += 1
            self.events_in_boot = 0
            self.fob_pending = None
        self.boot_started = True
        self.last_marker_line = number

    def _stamp(self, line: str, number: int) -> tuple[str | None, float | None, int]:
        time, uptime, start = parse_prefix(line)
        if uptime is not None:
            if self.last_uptime is not None and uptime + UPTIME_REBOOT_DROP_S < self.last_uptime:
                self._boot_hint(number)
            self.last_uptime = uptime
        return time, uptime, start

    # --- shapes ------------------------------------------------------------------------------------------------

    def _xid(self, line: str, number: int, match: re.Match[str]) -> None:
        time, uptime, start = self._stamp(line, number)
        pci = normalize_pci(match.group(1))
        code = int(match.group(2))
        rest = match.group(3)
        pid: int | None = None
        process: str | None = None
        who = _PID_NAME_RE.match(rest)
        if who is not None:
            if who.group(1).lstrip("-").isdigit():
                pid = int(who.group(1))
            name = who.group(2)
            if name is not None and name.strip("'") != "<unknown>":
                process = name[:64]
            rest = rest[who.end() :]
        message = rest.strip()
        extra: dict[str, Any] = {"pid": pid, "process": process}
        kind = "xid"
        nvl = _NVL5_RE.search(message)
        if nvl is not None:
            intrinfo = nvl.group(5)
            extra.update(
                unit=nvl.group(1),
                fatal=nvl.group(2).lower() == "fatal",
                link=int(nvl.group(4)),
                intrinfo=intrinfo,
                error_status=nvl.group(6),
                subcode=(int(intrinfo, 16) >> 20) & 0x3F,
            )
        if code == 154 or "recovery action changed" in message:
            kind = "recovery_action"
            extra["recovery_action"] = _new_recovery_action(message)
        self._event(kind, code, pci, time, uptime, number, message, line[start:], line, extra)

    def _sxid(self, line: str, number: int, match: re.Match[str]) -> None:
        message = match.group(4).strip()
        if message.startswith(_SXID_CONTINUATION):
            self.matched += 1  # the "Severity ..." and "Data {...}" lines that follow each SXid
            return
        time, uptime, start = self._stamp(line, number)
        pci = normalize_pci(match.group(2))
        head = message.split(",", 1)[0].strip().lower()
        fatal = True if head == "fatal" else False if head in ("non-fatal", "nonfatal", "non fatal") else None
        link = _LINK_RE.search(message)
        extra = {"device": match.group(1), "fatal": fatal, "link": int(link.group(1)) if link else None}
        self._event("sxid", int(match.group(3)), pci, time, uptime, number, message, line[start:], line, extra)

    def _gpu_at(self, match: re.Match[str], number: int) -> None:
        self.matched += 1
        pci = normalize_pci(match.group(1))
        device = device_of(pci)
        if device is None:
            return
        uuid = match.group(2)
        self.uuid_by_boot[(self.boot, device)] = uuid
        self.last_gpu_at = (number, device)
        known = self.gpus.get(device)
        if known is not None:
            known.uuid = uuid
        elif len(self.gpus) < MAX_GPUS:
            self.gpus[device] = GpuIdentity(pci_bus_id=device, uuid=uuid, line_number=number)
        if len(self.uuid_by_boot) > MAX_GPUS * 4:  # bounded: forget the oldest boots' maps
            for key in list(self.uuid_by_boot)[: MAX_GPUS * 2]:
                del self.uuid_by_boot[key]

    def _serial(self, serial: str, number: int) -> None:
        self.matched += 1
        if self.last_gpu_at is not None and number - self.last_gpu_at[0] <= 3:
            known = self.gpus.get(self.last_gpu_at[1])
            if known is not None:
                known.serial = serial

    def _fob_start(self, line: str, number: int) -> None:
        found = _PCI_IN_TEXT_RE.search(line)
        time, uptime, _ = self._stamp(line, number)
        self.fob_pending = [
            number,
            normalize_pci(found.group(1)) if found else None,
            time,
            uptime,
            number,
            [_after_nvrm(line)],
        ]

    def _fob_continues(self, number: int) -> bool:
        return self.fob_pending is not None and number - self.fob_pending[4] <= 2

    def _fallen_off_bus(self, line: str, number: int) -> None:
        text = _after_nvrm(line)
        if self._fob_continues(number):
            first, pci, time, uptime, _, texts = self.fob_pending  # type: ignore[misc]
            self.fob_pending = None
            self.matched += len(texts)
            self._stamp(line, number)
            message = " ".join([*texts, text])
            self._event("fallen_off_bus", None, pci, time, uptime, first, message, message, line, {})
            return
        self.fob_pending = None
        time, uptime, start = self._stamp(line, number)
        found = _PCI_IN_TEXT_RE.search(line, start)
        pci = normalize_pci(found.group(1)) if found else None
        self._event("fallen_off_bus", None, pci, time, uptime, number, text, line[start:], line, {})

    def _recovery_without_xid(self, line: str, number: int) -> None:
        time, uptime, start = self._stamp(line, number)
        found = _PCI_IN_TEXT_RE.search(line, start)
        pci = normalize_pci(found.group(1)) if found else None
        text = _after_nvrm(line)
        extra = {"recovery_action": _new_recovery_action(text)}
        self._event("recovery_action", None, pci, time, uptime, number, text, line[start:], line, extra)

    def _rate_limit(self, line: str, number: int) -> None:
        self.matched += 1
        found = _PCI_IN_TEXT_RE.search(line)
        if found is not None:
            device = device_of(normalize_pci(found.group(1)))
            if device is not None and len(self.rate_limited) < MAX_GPUS:
                self.rate_limited.add(device)
        self._note(f"line {number}: {' '.join(_after_nvrm(line).split())} (counts for this GPU are lower bounds)")

    def _nccl_segfault(self, line: str, number: int) -> None:
        time, uptime, start = self._stamp(line, number)
        body = line[start:]
        proc = _SEGV_PROC_RE.search(body)
        lib = _SEGV_LIB_RE.search(body)
        extra = {
            "pid": int(proc.group(2)) if proc else None,
            "process": proc.group(1) if proc else None,
            "device": lib.group(1) if lib else None,
        }
        message = body[proc.start() :] if proc else body
        self._event("nccl_segfault", None, None, time, uptime, number, message, body, line, extra)

    def _note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text[:MAX_TEXT])

    # --- aggregation -------------------------------------------------------------------------------------------

    def _classify(self, kind: str, code: int | None, message: str, recovery: str | None) -> tuple[str, str]:
        severity, action = UNKNOWN, DEFAULT_ACTION
        if self.classify is not None:
            try:
                result = self.classify(kind, code, message)
                severity, action = str(result[0]), str(result[1])
            except Exception:
                severity, action = UNKNOWN, DEFAULT_ACTION
        if severity.strip().lower() == UNKNOWN:
            facts = _builtin_facts(kind, recovery)
            if facts is not None:
                severity, action = facts
        return severity, action

    def _event(
        self,
        kind: str,
        code: int | None,
        pci: str | None,
        time: str | None,
        uptime: float | None,
        number: int,
        message: str,
        example: str,
        raw: str,
        extra: dict[str, Any],
    ) -> None:
        self.matched += 1
        self.events_in_boot += 1
        message = message[:MAX_TEXT]
        severity, action = self._classify(kind, code, message, extra.get("recovery_action"))
        rank = severity_rank(severity)
        if code is not None and rank == 0 and severity.strip().lower() == UNKNOWN:
            key_u = (kind, code)
            if key_u not in self.unknown and len(self.unknown) < MAX_UNKNOWN_CODES:
                self.unknown[key_u] = UnknownCode(kind=kind, code=code, line_number=number, line=raw[:MAX_TEXT])  # type: ignore[arg-type]
        device = device_of(pci)
        key = (device, kind, code)
        row = self.rows.get(key)
        if row is None:
            if len(self.rows) >= MAX_SUMMARY_ROWS:
                self.summary_truncated = True
                self.omitted += 1
                return
            row = _Row(kind=kind, code=code, pci=device, first_time=time, first_up=uptime, first_line=number)
            row.example = example.strip()[:MAX_TEXT]
            self.rows[key] = row
        row.count += 1
        row.last_time = time
        row.last_up = uptime
        row.last_line = number
        if row.last_boot != self.boot:
            row.last_boot = self.boot
            row.boots += 1
        if rank > row.rank:
            row.rank, row.severity, row.action = rank, severity, action
        if not row.needs_reset and _NEEDS_RESET.search(action):
            row.needs_reset = True
        unit = extra.get("unit")
        if unit and unit not in row.units and len(row.units) < MAX_UNITS:
            row.units.append(unit)
        if row.listed >= FLOOD_THRESHOLD or len(self.events) >= self.max_events:
            self.omitted += 1
            return
        row.listed += 1
        event = {
            "kind": kind,
            "code": code,
            "pci_bus_id": pci,
            "time": time,
            "uptime_s": uptime,
            "boot": self.boot,
            "line_number": number,
            "message": message,
            "severity": severity,
            "action": action,
        }
        event.update(extra)
        self.events.append(event)

    # --- result ------------------------------------------------------------------------------------------------

    def _uuid(self, boot: int, device: str | None) -> str | None:
        if device is None:
            return None
        uuid = self.uuid_by_boot.get((boot, device))
        if uuid is None:
            known = self.gpus.get(device)
            uuid = known.uuid if known is not None else None
        return uuid

    def result(self) -> KernelLogScan:
        events = []
        for event in self.events:
            event["uuid"] = self._uuid(event["boot"], device_of(event["pci_bus_id"]))
            events.append(KernelEvent(**event))
        summary = []
        for row in self.rows.values():
            flood = row.count > FLOOD_THRESHOLD or (row.kind == "xid" and row.code in FLOOD_CODES)
            escalation = None
            if row.needs_reset and row.boots >= ESCALATION_BOOTS:
                escalation = f"seen across {row.boots} boots: hardware inspection"
            summary.append(
                EventSummary(
                    kind=row.kind,  # type: ignore[arg-type]
                    code=row.code,
                    pci_bus_id=row.pci,
                    uuid=self._uuid(row.last_boot, row.pci),
                    count=row.count,
                    first_time=row.first_time,
                    last_time=row.last_time,
                    first_uptime_s=row.first_up,
                    last_uptime_s=row.last_up,
                    first_line=row.first_line,
                    last_line=row.last_line,
                    boots=row.boots,
                    severity=row.severity,
                    action=row.action,
                    flood=flood,
                    escalation=escalation,
                    rate_limited=row.pci in self.rate_limited,
                    units=row.units,
                    example=row.example,
                )
            )
        summary.sort(key=lambda s: (-severity_rank(s.severity), s.first_line))
        gpus = list(self.gpus.values())
        unknown = list(self.unknown.values())

        def build(scale: float) -> KernelLogScan:
            listed = events[: scaled(len(events), scale)] if events else []
            rows = summary[: scaled(MAX_SUMMARY_LISTED, scale)]
            omitted = self.omitted + len(events) - len(listed)
            return KernelLogScan(
                events=listed,
                summary=rows,
                summary_rows=len(summary),
                summary_omitted=len(summary) - len(rows),
                gpus=gpus[: scaled(MAX_GPUS_LISTED, scale)],
                gpus_omitted=max(0, len(gpus) - scaled(MAX_GPUS_LISTED, scale)),
                boots=self.boot + 1 if self.lines_read else 0,
                lines_read=self.lines_read,
                bytes_read=self.bytes_read,
                matched_lines=self.matched,
                unknown_codes=unknown[: scaled(MAX_UNKNOWN_LISTED, scale)],
                unknown_codes_omitted=max(0, len(unknown) - scaled(MAX_UNKNOWN_LISTED, scale)),
                events_truncated=omitted > 0,
                events_omitted=omitted,
                summary_truncated=self.summary_truncated,
                parse_errors=self.parse_errors,
                notes=self.notes[: scaled(MAX_NOTES, scale)],
            )

        return fit(build)


def _after_nvrm(line: str) -> str:
    at = line.find("NVRM:")
    return line[at + 5 :].strip() if at >= 0 else line.strip()


def _new_recovery_action(message: str) -> str | None:
    match = _RECOVERY_RE.search(message)
    if match is None:
        return None
    name = (match.group(4) or "").strip()
    if name:
        return name
    number = match.group(3)
    if number is None:
        return None
    try:
        return RECOVERY_ACTIONS.get(int(number, 0), number)
    except ValueError:
        return number


# ---------------------------------------------------------------------------------------------------------------
# entry points


def _check(classify: Classifier | None, max_events: int) -> None:
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 0:
        raise InputError(f"max_events must be a whole number >= 0, got {max_events!r}")
    if classify is not None and not callable(classify):
        raise InputError("classify must be a function (kind, code, message) -> (severity, action), or None")


def _as_text(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item).decode("utf-8", "replace")
    return str(item)


def _feed_reader(scanner: _Scanner, read: Callable[[int], Any]) -> None:
    chunk = read(CHUNK_BYTES)
    if isinstance(chunk, bytes | bytearray | memoryview):  # binary: scanned as bytes, only matched lines decoded
        scanner.bytes_read = 0
        while chunk:
            chunk = bytes(chunk)
            scanner.bytes_read += len(chunk)
            scanner.feed(chunk)
            chunk = read(CHUNK_BYTES)
        return
    while chunk:
        scanner.feed(_as_text(chunk))
        chunk = read(CHUNK_BYTES)


def _guarded(lines: Iterable[Any], errors: list[BaseException]) -> Iterator[Any]:
    """The items of lines until it fails; the failure is kept, so the lines read before it are still scanned."""
    try:
        yield from lines
    except Exception as exc:
        errors.append(exc)


def _feed_lines(scanner: _Scanner, lines: Iterable[Any]) -> None:
    errors: list[BaseException] = []
    iterator: Iterator[Any] = _guarded(lines, errors)
    while True:
        batch = list(islice(iterator, BATCH_LINES))
        if not batch:
            break
        try:
            joined = "".join(batch)
        except TypeError:
            batch = [_as_text(item) for item in batch]
            joined = "".join(batch)
        if "\n" not in joined:  # lines without terminators (str.splitlines(), most generators): one per item
            text = "\n".join(batch)
        else:  # terminated lines (a file's iterator) or a mix: an item ends a line, and so does each newline in it
            text = "\n".join([item[:-1] if item.endswith("\n") else item for item in batch])
        scanner.feed(text + "\n")
    if errors:
        raise errors[0]


def scan_kernel_log(
    lines: Iterable[str], *, classify: Classifier | None = None, max_events: int = 5000
) -> KernelLogScan:
    """Scan a kernel log given as lines (a text file object, ``text.splitlines()``, a generator).

    ``classify(kind, code, message) -> (severity, action)`` places each event; without it, codes come back with
    severity 'unknown' and action 'look the code up with explain_xid' (fallen-off-the-bus, NCCL segfaults and
    recovery-action changes get built-in advice whenever the classifier says 'unknown'). Never raises on the log's
    content; a reader that fails midway ends the scan with a note.
    """
    _check(classify, max_events)
    scanner = _Scanner(classify, max_events)
    try:
        if isinstance(lines, str):
            scanner.feed(lines)
        elif isinstance(lines, bytes | bytearray):
            scanner.bytes_read = len(lines)
            scanner.feed(bytes(lines))
        elif callable(getattr(lines, "read", None)):
            _feed_reader(scanner, lines.read)  # type: ignore[attr-defined]
        else:
            _feed_lines(scanner, lines)
    except Exception as exc:  # the reader failed (I/O error, a generator that raised): keep what was read
        scanner._note(f"reading stopped after line {scanner.lines_read}: {type(exc).__name__}: {exc}")
    scanner.finish()
    return scanner.result()


def scan_text(text: str, *, classify: Classifier | None = None, max_events: int = 5000) -> KernelLogScan:
    """Scan a kernel log held in a string."""
    return scan_kernel_log(_as_text(text), classify=classify, max_events=max_events)


def scan_file(path: str | Path, *, classify: Classifier | None = None, max_events: int = 5000) -> KernelLogScan:
    """Scan a kernel log file in 4 MiB blocks (undecodable bytes become U+FFFD); bytes_read is the file's size read."""
    target = Path(path)
    if not target.is_file():
        raise NotFoundError(f"no such log file: {target} (give the path of a dmesg or journalctl -k output file)")
    _check(classify, max_events)
    try:
        handle = target.open("rb")
    except OSError as exc:
        raise InputError(f"cannot open {target}: {exc.strerror or exc}") from exc
    with handle:
        return scan_kernel_log(handle, classify=classify, max_events=max_events)  # type: ignore[arg-type]
