"""What the kernel-log scanner decides, apart from reading and matching: how an event is placed (the caller's
classifier, then built-in advice for the kinds that are not catalog codes), which boot a line belongs to, and when
a code is a flood or an escalation. The numbers are here, in one place."""

import re
from collections.abc import Callable

Classifier = Callable[[str, int | None, str], tuple[str, str]]

UNKNOWN = "unknown"
DEFAULT_ACTION = "look the code up with explain_xid"
FLOOD_THRESHOLD = 100  # more occurrences than this (or Xid 45 at all): one collapsed row, flood=True
FLOOD_CODES = frozenset({45})  # preemptive cleanup: thousands per failed job are normal
ESCALATION_BOOTS = 3  # a code asking for a reset/reboot in this many distinct boots: inspect the hardware
BOOT_MARKER_WINDOW = 64  # boot markers this close together, with no event between, belong to one boot
UPTIME_REBOOT_DROP_S = 60.0  # uptime going back by more than this between matched lines means a reboot

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


def place(
    classify: Classifier | None, kind: str, code: int | None, message: str, recovery: str | None
) -> tuple[str, str]:
    """(severity, action) of one event: the classifier's answer (a classifier that fails counts as 'unknown'),
    else the built-in advice for fallen-off-the-bus, NCCL segfaults and recovery-action changes."""
    severity, action = UNKNOWN, DEFAULT_ACTION
    if classify is not None:
        try:
            result = classify(kind, code, message)
            severity, action = str(result[0]), str(result[1])
        except Exception:
            severity, action = UNKNOWN, DEFAULT_ACTION
    if severity.strip().lower() == UNKNOWN:
        facts = _builtin_facts(kind, recovery)
        if facts is not None:
            severity, action = facts
    return severity, action


def severity_rank(severity: str) -> int:
    return SEVERITY_RANK.get(severity.strip().lower(), 0)


def needs_reset(action: str) -> bool:
    """The action asks for a reset, reboot or drain (what escalates when it recurs across boots)."""
    return _NEEDS_RESET.search(action) is not None


# ---------------------------------------------------------------------------------------------------------------
# floods and escalation


def is_flood(kind: str, code: int | None, count: int) -> bool:
    """More than FLOOD_THRESHOLD lines, or a code that floods by nature (Xid 45): one collapsed row."""
    return count > FLOOD_THRESHOLD or (kind == "xid" and code in FLOOD_CODES)


def escalation(needs_reset: bool, boots: int) -> str | None:
    """Set when a code that asks for a reset or reboot came back in ESCALATION_BOOTS or more boots."""
    if needs_reset and boots >= ESCALATION_BOOTS:
        return f"seen across {boots} boots: hardware inspection"
    return None


# ---------------------------------------------------------------------------------------------------------------
# boots


class Boots:
    """Which boot the lines belong to: 0 for the first boot in the log, +1 at each reboot seen.

    A reboot hint is a boot marker ("Linux version", ...) or an uptime that goes back by more than
    UPTIME_REBOOT_DROP_S between matched lines. A hint starts a new boot when an event of the current boot came
    before it, or when the previous hint is more than BOOT_MARKER_WINDOW lines back (the markers of one boot come
    together)."""

    def __init__(self) -> None:
        self.boot = 0
        self.started = False
        self.last_marker_line = -(10**9)
        self.events_in_boot = 0
        self.last_uptime: float | None = None

    def event(self) -> None:
        self.events_in_boot += 1

    def marker(self, number: int, uptime: float | None = None) -> bool:
        """A reboot hint on line `number` (a boot marker, with its uptime prefix if any); True when it starts a new
        boot."""
        new = bool(self.events_in_boot or (self.started and number - self.last_marker_line > BOOT_MARKER_WINDOW))
        if new:
            self.boot += 1
            self.events_in_boot = 0
        self.started = True
        self.last_marker_line = number
        if uptime is not None:
            self.last_uptime = uptime
        return new

    def uptime(self, uptime: float | None, number: int) -> bool:
        """The uptime prefix of matched line `number`; True when it went back far enough to be a reboot hint and that
        hint started a new boot."""
        new = False
        if uptime is not None:
            if self.last_uptime is not None and uptime + UPTIME_REBOOT_DROP_S < self.last_uptime:
                new = self.marker(number)
            self.last_uptime = uptime
        return new
