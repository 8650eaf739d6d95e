"""The kernel-log scanner: each candidate line (from the block reader) is matched (matchers), placed and counted
into bounded aggregates (policy), and the scan's result built; with the entry points scan_kernel_log, scan_text
and scan_file.

Memory is bounded: the event list stops at ``max_events`` (and at ``FLOOD_THRESHOLD`` events per GPU and code, so a
flood does not crowd out the rest), counts and summaries are aggregated as the lines go by and stay exact, and every
other list has a fixed cap. Counting is never capped: ``counts`` (per kind) holds every event of the log, whatever
the summary and the event list could list; when the result must shrink to fit its byte budget, the event list
shrinks first and the summary only after it.

Nothing in the log makes it raise: an unreadable line is skipped (counted in ``parse_errors``), a reader that fails
midway ends the scan with a note. Only a wrong argument (``max_events``, ``classify``, a missing file) raises
``InputError``.
"""

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers.core.errors import InputError, NotFoundError
from servers.diagnostics.bounds import MAX_RESULT_BYTES, fit, scaled
from servers.diagnostics.kmsg.matchers import (
    TRIGGERS,
    after_nvrm,
    device_of,
    match_line,
    new_recovery_action,
    normalize_pci,
    parse_nccl_segfault,
    parse_prefix,
    parse_sxid,
    parse_xid,
    pci_in,
    sxid_continues,
)
from servers.diagnostics.kmsg.models import (
    MAX_GPUS_LISTED,
    MAX_SUMMARY_LISTED,
    MAX_UNKNOWN_LISTED,
    EventSummary,
    GpuIdentity,
    KernelEvent,
    KernelLogScan,
    UnknownCode,
)
from servers.diagnostics.kmsg.policy import (
    DEFAULT_ACTION,
    FLOOD_THRESHOLD,
    UNKNOWN,
    Boots,
    Classifier,
    escalation,
    is_flood,
    needs_reset,
    place,
    severity_rank,
)
from servers.diagnostics.kmsg.reader import BlockReader, as_text

MAX_SUMMARY_ROWS = 10_000
MAX_UNKNOWN_CODES = 1_000
MAX_NOTES = 50
MAX_GPUS = 4_096
MAX_UNITS = 16
MAX_TEXT = 1_000  # characters kept of a message or raw line
MAX_QUOTED = 160  # characters of a recognised line quoted in the note that says what matched without an event
SUMMARY_SHRINKS_LATER = 64  # the summary shrinks only once the event list has shrunk this many times over

# What a recognised line that is not an event is, for the note of a scan that found no event.
_RECOGNISED = {
    "boot_marker": "boot marker",
    "gpu_at": "PCI-to-UUID line",
    "serial": "board serial line",
    "sxid_more": "SXid continuation line",
    "rate_limit": "driver rate-limit notice",
    "fallen_off_bus_part": "line of a fallen-off-the-bus message",
}


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
    """Takes the candidate lines of one log (``line``) and keeps what the result needs: the listed events, one
    summary row per GPU and kind+code, GPU identities per boot, unknown codes and notes, each bounded."""

    def __init__(self, classify: Classifier | None, max_events: int) -> None:
        self.classify = classify
        self.max_events = max_events
        self.reader = BlockReader(self.line, TRIGGERS)
        self.matched = 0
        self.counts: dict[str, int] = {}  # events per kind, every one (the rows and the list are capped, this is not)
        self.recognised: dict[str, list[Any]] = {}  # what, for matched lines that are no event: [count, line, text]
        self.parse_errors = 0
        self.boots = Boots()
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
        self.shapes: dict[str, Callable[[str, int, re.Match[str] | None], None]] = {
            "xid": self._xid,
            "gpu_at": self._gpu_at,
            "serial": self._serial,
            "fallen_off_bus": self._fallen_off_bus,
            "fallen_off_bus_start": self._fob_start,
            "fallen_off_bus_more": self._fob_more,
            "recovery_action": self._recovery_without_xid,
            "rate_limit": self._rate_limit,
            "sxid": self._sxid,
            "nccl_segfault": self._nccl_segfault,
            "boot_marker": self._boot_marker,
        }

    # --- one candidate line ------------------------------------------------------------------------------------

    def line(self, line: str, number: int) -> None:
        try:
            pending = self.fob_pending  # (inline _fob_continues: this runs for every candidate line)
            found = match_line(line, pending is not None and number - pending[4] <= 2)
            if found is not None:
                self.shapes[found[0]](line, number, found[1])
        except Exception:  # a line no shape foresaw: skip it, never fail the scan
            self.parse_errors += 1

    def _stamp(self, line: str, number: int) -> tuple[str | None, float | None, int]:
        time, uptime, start = parse_prefix(line)
        if self.boots.uptime(uptime, number):
            self.fob_pending = None
        return time, uptime, start

    def _recognised(self, what: str, line: str, number: int, lines: int = 1) -> None:
        """`lines` matched lines that are no event of their own (a boot marker, a PCI-to-UUID map...)."""
        self.matched += lines
        seen = self.recognised.get(what)
        if seen is None:
            self.recognised[what] = [lines, number, line.strip()[:MAX_QUOTED]]
        else:
            seen[0] += lines

    def _boot_marker(self, line: str, number: int, match: re.Match[str] | None) -> None:
        _, uptime, _ = parse_prefix(line)
        self._recognised("boot_marker", line, number)
        if self.boots.marker(number, uptime):
            self.fob_pending = None

    # --- shapes ------------------------------------------------------------------------------------------------

    def _xid(self, line: str, number: int, match: re.Match[str] | None) -> None:
        assert match is not None
        time, uptime, start = self._stamp(line, number)
        kind, code, pci, message, extra = parse_xid(match)
        self._event(kind, code, pci, time, uptime, number, message, line[start:], line, extra)

    def _sxid(self, line: str, number: int, match: re.Match[str] | None) -> None:
        assert match is not None
        if sxid_continues(match):  # the "Severity ..." and "Data {...}" lines that follow each SXid
            self._recognised("sxid_more", line, number)
            return
        time, uptime, start = self._stamp(line, number)
        code, pci, message, extra = parse_sxid(match)
        self._event("sxid", code, pci, time, uptime, number, message, line[start:], line, extra)

    def _gpu_at(self, line: str, number: int, match: re.Match[str] | None) -> None:
        assert match is not None
        self._recognised("gpu_at", line, number)
        pci = normalize_pci(match.group(1))
        device = device_of(pci)
        if device is None:
            return
        uuid = match.group(2)
        self.uuid_by_boot[(self.boots.boot, device)] = uuid
        self.last_gpu_at = (number, device)
        known = self.gpus.get(device)
        if known is not None:
            known.uuid = uuid
        elif len(self.gpus) < MAX_GPUS:
            self.gpus[device] = GpuIdentity(pci_bus_id=device, uuid=uuid, line_number=number)
        if len(self.uuid_by_boot) > MAX_GPUS * 4:  # bounded: forget the oldest boots' maps
            for key in list(self.uuid_by_boot)[: MAX_GPUS * 2]:
                del self.uuid_by_boot[key]

    def _serial(self, line: str, number: int, match: re.Match[str] | None) -> None:
        assert match is not None
        self._recognised("serial", line, number)
        if self.last_gpu_at is not None and number - self.last_gpu_at[0] <= 3:
            known = self.gpus.get(self.last_gpu_at[1])
            if known is not None:
                known.serial = match.group(1)

    def _fob_start(self, line: str, number: int, match: re.Match[str] | None) -> None:
        pci = pci_in(line)
        time, uptime, _ = self._stamp(line, number)
        self.fob_pending = [number, pci, time, uptime, number, [after_nvrm(line)]]

    def _fob_continues(self, number: int) -> bool:
        return self.fob_pending is not None and number - self.fob_pending[4] <= 2

    def _fob_more(self, line: str, number: int, match: re.Match[str] | None) -> None:
        self.fob_pending[4] = number  # type: ignore[index]
        self.fob_pending[5].append(after_nvrm(line))  # type: ignore[index]

    def _fallen_off_bus(self, line: str, number: int, match: re.Match[str] | None) -> None:
        text = after_nvrm(line)
        if self._fob_continues(number):
            first, pci, time, uptime, _, texts = self.fob_pending  # type: ignore[misc]
            self.fob_pending = None
            self._recognised("fallen_off_bus_part", texts[0], first, len(texts))
            self._stamp(line, number)
            message = " ".join([*texts, text])
            self._event("fallen_off_bus", None, pci, time, uptime, first, message, message, line, {})
            return
        self.fob_pending = None
        time, uptime, start = self._stamp(line, number)
        pci = pci_in(line, start)
        self._event("fallen_off_bus", None, pci, time, uptime, number, text, line[start:], line, {})

    def _recovery_without_xid(self, line: str, number: int, match: re.Match[str] | None) -> None:
        time, uptime, start = self._stamp(line, number)
        pci = pci_in(line, start)
        text = after_nvrm(line)
        extra = {"recovery_action": new_recovery_action(text)}
        self._event("recovery_action", None, pci, time, uptime, number, text, line[start:], line, extra)

    def _rate_limit(self, line: str, number: int, match: re.Match[str] | None) -> None:
        self._recognised("rate_limit", line, number)
        device = device_of(pci_in(line))
        if device is not None and len(self.rate_limited) < MAX_GPUS:
            self.rate_limited.add(device)
        self.note(f"line {number}: {' '.join(after_nvrm(line).split())} (counts for this GPU are lower bounds)")

    def _nccl_segfault(self, line: str, number: int, match: re.Match[str] | None) -> None:
        time, uptime, start = self._stamp(line, number)
        body = line[start:]
        message, extra = parse_nccl_segfault(body)
        self._event("nccl_segfault", None, None, time, uptime, number, message, body, line, extra)

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text[:MAX_TEXT])

    # --- aggregation -------------------------------------------------------------------------------------------

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
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.boots.event()
        message = message[:MAX_TEXT]
        severity, action = place(self.classify, kind, code, message, extra.get("recovery_action"))
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
        boot = self.boots.boot
        if row.last_boot != boot:
            row.last_boot = boot
            row.boots += 1
        if rank > row.rank:
            row.rank, row.severity, row.action = rank, severity, action
        if not row.needs_reset and needs_reset(action):
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
            "boot": boot,
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

    def _what_matched(self) -> str | None:
        """A note for a scan that recognised lines but found no event: what those lines were."""
        if self.counts or not self.recognised:
            return None
        parts = []
        for what, (count, number, text) in self.recognised.items():
            label = _RECOGNISED.get(what, what)
            parts.append(f"{count} {label}{'s' if count != 1 else ''} (first, line {number}: {text!r})")
        return (
            f"no GPU fault in this log: the {self.matched} recognised line(s) are "
            + "; ".join(parts)
            + ", none of them an Xid, SXid, NCCL segfault, fallen-off-the-bus or recovery-action event"
        )

    def result(self, max_result_bytes: int = MAX_RESULT_BYTES) -> KernelLogScan:
        what = self._what_matched()
        if what is not None:
            self.note(what)
        events = []
        for event in self.events:
            event["uuid"] = self._uuid(event["boot"], device_of(event["pci_bus_id"]))
            events.append(KernelEvent(**event))
        summary = []
        for row in self.rows.values():
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
                    flood=is_flood(row.kind, row.code, row.count),
                    escalation=escalation(row.needs_reset, row.boots),
                    rate_limited=row.pci in self.rate_limited,
                    units=row.units,
                    example=row.example,
                )
            )
        summary.sort(key=lambda s: (-severity_rank(s.severity), s.first_line))
        gpus = list(self.gpus.values())
        unknown = list(self.unknown.values())
        lines_read = self.reader.lines_read

        def build(scale: float) -> KernelLogScan:  # the event list shrinks first, the summary only much later
            listed = events[: scaled(len(events), scale)] if events else []
            rows = summary[: scaled(MAX_SUMMARY_LISTED, min(1.0, scale * SUMMARY_SHRINKS_LATER))]
            omitted = self.omitted + len(events) - len(listed)
            return KernelLogScan(
                events=listed,
                summary=rows,
                summary_rows=len(summary),
                summary_omitted=len(summary) - len(rows),
                gpus=gpus[: scaled(MAX_GPUS_LISTED, scale)],
                gpus_omitted=max(0, len(gpus) - scaled(MAX_GPUS_LISTED, scale)),
                boots=self.boots.boot + 1 if lines_read else 0,
                lines_read=lines_read,
                bytes_read=self.reader.bytes_read,
                matched_lines=self.matched,
                counts=dict(self.counts),
                unknown_codes=unknown[: scaled(MAX_UNKNOWN_LISTED, scale)],
                unknown_codes_omitted=max(0, len(unknown) - scaled(MAX_UNKNOWN_LISTED, scale)),
                events_truncated=omitted > 0,
                events_omitted=omitted,
                summary_truncated=self.summary_truncated,
                parse_errors=self.parse_errors,
                notes=self.notes[: scaled(MAX_NOTES, scale)],
            )

        return fit(build, max_result_bytes)


# ---------------------------------------------------------------------------------------------------------------
# entry points


def _check(classify: Classifier | None, max_events: int, max_result_bytes: int = MAX_RESULT_BYTES) -> None:
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 0:
        raise InputError(f"max_events must be a whole number >= 0, got {max_events!r}")
    if classify is not None and not callable(classify):
        raise InputError("classify must be a function (kind, code, message) -> (severity, action), or None")
    if isinstance(max_result_bytes, bool) or not isinstance(max_result_bytes, int) or max_result_bytes < 1:
        raise InputError(f"max_result_bytes must be a whole number >= 1, got {max_result_bytes!r}")


def scan_kernel_log(
    lines: Iterable[str],
    *,
    classify: Classifier | None = None,
    max_events: int = 5000,
    max_result_bytes: int = MAX_RESULT_BYTES,
) -> KernelLogScan:
    """Scan a kernel log given as lines (a text file object, ``text.splitlines()``, a generator).

    ``classify(kind, code, message) -> (severity, action)`` places each event; without it, codes come back with
    severity 'unknown' and action 'look the code up with explain_xid' (fallen-off-the-bus, NCCL segfaults and
    recovery-action changes get built-in advice whenever the classifier says 'unknown'). Never raises on the log's
    content; a reader that fails midway ends the scan with a note. The result's JSON is kept within
    ``max_result_bytes`` by listing fewer events (then fewer summary rows); ``counts`` stays exact.
    """
    _check(classify, max_events, max_result_bytes)
    scanner = _Scanner(classify, max_events)
    try:
        scanner.reader.read(lines)
    except Exception as exc:  # the reader failed (I/O error, a generator that raised): keep what was read
        scanner.note(f"reading stopped after line {scanner.reader.lines_read}: {type(exc).__name__}: {exc}")
    scanner.reader.finish()
    return scanner.result(max_result_bytes)


def scan_text(
    text: str, *, classify: Classifier | None = None, max_events: int = 5000, max_result_bytes: int = MAX_RESULT_BYTES
) -> KernelLogScan:
    """Scan a kernel log held in a string."""
    return scan_kernel_log(as_text(text), classify=classify, max_events=max_events, max_result_bytes=max_result_bytes)


def scan_file(
    path: str | Path,
    *,
    classify: Classifier | None = None,
    max_events: int = 5000,
    max_result_bytes: int = MAX_RESULT_BYTES,
) -> KernelLogScan:
    """Scan a kernel log file in 4 MiB blocks (undecodable bytes become U+FFFD); bytes_read is the file's size read."""
    target = Path(path)
    if not target.is_file():
        raise NotFoundError(f"no such log file: {target} (give the path of a dmesg or journalctl -k output file)")
    _check(classify, max_events, max_result_bytes)
    try:
        handle = target.open("rb")
    except OSError as exc:
        raise InputError(f"cannot open {target}: {exc.strerror or exc}") from exc
    with handle:
        return scan_kernel_log(
            handle,  # type: ignore[arg-type]
            classify=classify,
            max_events=max_events,
            max_result_bytes=max_result_bytes,
        )
