"""Kernel-log (dmesg, journald, syslog) scanner for GPU faults. Plain package.

It reads a log as a stream and finds NVIDIA Xid lines in every shape the drivers print (with or without "PCI:",
with pid/name, with '<unknown>', with none; NVLink5 Xids 144-150 with their sub-unit, intrinfo and subcode; Xid 154
recovery-action changes), NVSwitch SXid lines, NCCL segfaults, the "fallen off the bus" message (one line or three,
with no Xid), the lines that map a PCI address to a GPU UUID, and reboots, in every timestamp form.

Split by concern:
- ``reader.py``: block reading (strings, bytes, readers, iterables of lines, in bounded blocks; only the lines that
  hold a trigger word are handed on, found in blocks of bytes by a vectorised search for each word's rarest byte);
- ``matchers.py``: the line shapes and timestamp prefixes, and the pure parsing of one line;
- ``policy.py``: classification and built-in advice, boots, floods and escalation (the numbers);
- ``scanner.py``: the bounded aggregation into the result, and the entry points;
- ``models.py``: the result models.

Counts are exact at every size (``counts``, per kind); only the lists are bounded.

Nothing in the log makes it raise: an unreadable line is skipped (counted in ``parse_errors``), a reader that fails
midway ends the scan with a note. Only a wrong argument (``max_events``, ``classify``, a missing file) raises
``InputError``.
"""

from servers.diagnostics.kmsg.matchers import (
    RECOVERY_ACTIONS,
    TRIGGERS,
    TRIGGERS_BYTES,
    device_of,
    normalize_pci,
    parse_prefix,
)
from servers.diagnostics.kmsg.models import (
    MAX_GPUS_LISTED,
    MAX_SUMMARY_LISTED,
    MAX_UNKNOWN_LISTED,
    EventKind,
    EventSummary,
    GpuIdentity,
    KernelEvent,
    KernelLogScan,
    UnknownCode,
)
from servers.diagnostics.kmsg.policy import (
    BOOT_MARKER_WINDOW,
    DEFAULT_ACTION,
    ESCALATION_BOOTS,
    FLOOD_CODES,
    FLOOD_THRESHOLD,
    SEVERITY_RANK,
    UNKNOWN,
    UPTIME_REBOOT_DROP_S,
    Classifier,
    default_classify,
    severity_rank,
)
from servers.diagnostics.kmsg.reader import BATCH_LINES, CHUNK_BYTES, MAX_LINE, MAX_PARSE, VECTOR_BYTES
from servers.diagnostics.kmsg.scanner import (
    MAX_GPUS,
    MAX_NOTES,
    MAX_SUMMARY_ROWS,
    MAX_TEXT,
    MAX_UNITS,
    MAX_UNKNOWN_CODES,
    scan_file,
    scan_kernel_log,
    scan_text,
)

__all__ = [
    "BATCH_LINES",
    "BOOT_MARKER_WINDOW",
    "CHUNK_BYTES",
    "DEFAULT_ACTION",
    "ESCALATION_BOOTS",
    "FLOOD_CODES",
    "FLOOD_THRESHOLD",
    "MAX_GPUS",
    "MAX_GPUS_LISTED",
    "MAX_LINE",
    "MAX_NOTES",
    "MAX_PARSE",
    "MAX_SUMMARY_LISTED",
    "MAX_SUMMARY_ROWS",
    "MAX_TEXT",
    "MAX_UNITS",
    "MAX_UNKNOWN_CODES",
    "MAX_UNKNOWN_LISTED",
    "RECOVERY_ACTIONS",
    "SEVERITY_RANK",
    "TRIGGERS",
    "TRIGGERS_BYTES",
    "UNKNOWN",
    "UPTIME_REBOOT_DROP_S",
    "VECTOR_BYTES",
    "Classifier",
    "EventKind",
    "EventSummary",
    "GpuIdentity",
    "KernelEvent",
    "KernelLogScan",
    "UnknownCode",
    "default_classify",
    "device_of",
    "normalize_pci",
    "parse_prefix",
    "scan_file",
    "scan_kernel_log",
    "scan_text",
    "severity_rank",
]
