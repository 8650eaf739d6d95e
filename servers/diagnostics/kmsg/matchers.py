"""The line matchers of the kernel-log scanner: which lines can matter (TRIGGERS), what shape a candidate line has
(match_line), and the pure parts of reading one: its timestamp prefix, the fields of an Xid, SXid or NCCL segfault
line, PCI addresses and recovery actions. Nothing here keeps state; the scanner does.

Every timestamp prefix is understood: ``[171167.621162]`` (uptime), ``[Sun Feb 23 16:24:18 2025]`` (dmesg -T),
``kern  :warn  : 2025-01-21T04:41:44,285060+00:00`` (dmesg --decode --time-format=iso),
``May 18 19:02:39 host kernel:`` (journald, syslog), ``2025-01-21T04:41:44.285060+00:00 host kernel:``
(journalctl -o short-iso) and none.
"""

import re
from typing import Any, Literal

# Substrings that a line must hold to be looked at. Everything recognised contains one of them:
# Xid, GPU-at-PCI, serial, fallen-off-the-bus, rate-limit and recovery lines all carry "NVRM"; NVSwitch lines "SXid";
# NCCL crashes "libnccl"; boot markers "Linux version", "Booting Linux" or "Command line:".
TRIGGERS = ("NVRM", "SXid", "libnccl", "Linux", "Command line:")
TRIGGERS_BYTES = tuple(word.encode() for word in TRIGGERS)

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


def after_nvrm(line: str) -> str:
    """The text after "NVRM:" (the whole line, stripped, when it has none)."""
    at = line.find("NVRM:")
    return line[at + 5 :].strip() if at >= 0 else line.strip()


def pci_in(line: str, start: int = 0) -> str | None:
    """The first PCI address written anywhere in line[start:], normalised; None when there is none."""
    found = _PCI_IN_TEXT_RE.search(line, start)
    return normalize_pci(found.group(1)) if found else None


def new_recovery_action(message: str) -> str | None:
    """The action a "recovery action changed from ... to ..." message names last (by name, else by number)."""
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
# what a candidate line is

Shape = Literal[
    "xid",
    "gpu_at",
    "serial",
    "fallen_off_bus",
    "fallen_off_bus_start",
    "fallen_off_bus_more",
    "recovery_action",
    "rate_limit",
    "sxid",
    "nccl_segfault",
    "boot_marker",
]


def match_line(line: str, fallen_off_bus_open: bool) -> tuple[Shape, re.Match[str] | None] | None:
    """The shape of a candidate line and, for Xid, GPU-at, serial and SXid lines, its match; None for a line of no
    known shape. `fallen_off_bus_open`: a three-line "fallen off the bus" message started just before this line, so
    "installed in this system" continues it."""
    if "NVRM" in line:
        if "Xid (" in line:
            match = _XID_RE.search(line)
            if match is not None:
                return "xid", match
        if "GPU at " in line:
            match = _GPU_AT_RE.search(line)
            if match is not None:
                return "gpu_at", match
        if "Serial Number" in line:
            match = _SERIAL_RE.search(line)
            if match is not None:
                return "serial", match
        if "fallen off the bus" in line:
            return "fallen_off_bus", None
        if "The NVIDIA GPU" in line:
            return "fallen_off_bus_start", None
        if "installed in this system" in line and fallen_off_bus_open:
            return "fallen_off_bus_more", None
        if "recovery action changed" in line:
            return "recovery_action", None
        if "Rate limiting" in line:
            return "rate_limit", None
    if "SXid (" in line:
        match = _SXID_RE.search(line)
        if match is not None:
            return "sxid", match
    if "libnccl" in line and ("segfault" in line or "general protection" in line or "trap" in line):
        return "nccl_segfault", None
    if "Linux" in line or "Command line:" in line:
        _, _, start = parse_prefix(line)
        if line.startswith(_BOOT_MARKERS, start):
            return "boot_marker", None
    return None


# ---------------------------------------------------------------------------------------------------------------
# the fields of one line


def parse_xid(match: re.Match[str]) -> tuple[str, int, str | None, str, dict[str, Any]]:
    """(kind, code, pci, message, extra fields) of an Xid line matched by match_line. Kind is "xid", or
    "recovery_action" for Xid 154 and other recovery-action changes; extra holds pid and process, the NVLink5
    (Xid 144-150) unit, fatal, link, intrinfo, error_status and subcode, and recovery_action."""
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
        extra["recovery_action"] = new_recovery_action(message)
    return kind, code, pci, message, extra


def sxid_continues(match: re.Match[str]) -> bool:
    """The "Severity ..." and "Data {...}" lines that follow each SXid: not events of their own."""
    return match.group(4).strip().startswith(_SXID_CONTINUATION)


def parse_sxid(match: re.Match[str]) -> tuple[int, str | None, str, dict[str, Any]]:
    """(code, pci, message, extra fields: device, fatal, link) of an SXid line matched by match_line."""
    message = match.group(4).strip()
    pci = normalize_pci(match.group(2))
    head = message.split(",", 1)[0].strip().lower()
    fatal = True if head == "fatal" else False if head in ("non-fatal", "nonfatal", "non fatal") else None
    link = _LINK_RE.search(message)
    extra = {"device": match.group(1), "fatal": fatal, "link": int(link.group(1)) if link else None}
    return int(match.group(3)), pci, message, extra


def parse_nccl_segfault(body: str) -> tuple[str, dict[str, Any]]:
    """(message, extra fields: pid, process, device = the NCCL library) of a segfault line, prefix removed."""
    proc = _SEGV_PROC_RE.search(body)
    lib = _SEGV_LIB_RE.search(body)
    extra = {
        "pid": int(proc.group(2)) if proc else None,
        "process": proc.group(1) if proc else None,
        "device": lib.group(1) if lib else None,
    }
    message = body[proc.start() :] if proc else body
    return message, extra
