"""Parse captured nvidia-smi output into GpuSnapshot objects. Plain package.

Three formats are recognised from the text itself:

- ``nvidia-smi -q`` (the indented text report), optionally followed by ``nvidia-smi nvlink --status`` output, whose
  per-link state is merged into the GPU with the same UUID (else the same index);
- ``nvidia-smi -q -x`` (XML);
- ``nvidia-smi --query-gpu=... --format=csv`` with or without header and units. Without a header the caller must
  pass ``fields`` (the --query-gpu list, in order).

Cells nvidia-smi cannot fill (``N/A``, ``[N/A]``, ``[Not Supported]``, ``[Requested functionality has been
deprecated]``, ``[Unknown Error]``, ...) become None, never zero. PCI bus ids are normalised to ``dddd:bb:dd.f``
(lowercase; nvidia-smi's 8-digit domain keeps its last 4 digits).

Layout: ``common.py`` (the result, cell values, canonical fields -> GpuSnapshot, temperature margins),
``text_report.py`` (-q and nvlink --status), ``xml_report.py`` (-q -x), ``query_csv.py`` (--query-gpu); this module
tells the formats apart and calls the one that fits.

Lines saying nvidia-smi could not reach a GPU ("Unable to determine the device handle for GPU0000:3B:00.0: Unknown
Error", "... GPU is lost.  Reboot the system to recover this GPU"), wherever they fall in a capture of any format,
become that GPU, unreachable (its other fields unknown), counted with the others; "No devices were found" is a
warning. A capture of such lines alone has format "message".

Every failure is an InputError whose message says what was wrong and which formats are accepted.
"""

from __future__ import annotations

import re

from servers.core.errors import InputError
from servers.diagnostics.smi.common import (
    ACCEPTED,
    CLOCK_EVENT_BITS,
    MAX_TEXT_CHARS,
    SmiFormat,
    SmiParse,
    clean,
    decode_clock_events,
    merge_lost,
    normalise_bus_id,
    take_lost_lines,
    to_bool,
    to_float,
    to_hex,
    to_int,
)
from servers.diagnostics.smi.query_csv import QUERY_GPU, csv_lines, looks_like_header, parse_csv, split_csv
from servers.diagnostics.smi.text_report import parse_q
from servers.diagnostics.smi.xml_report import parse_xml

__all__ = [
    "ACCEPTED",
    "CLOCK_EVENT_BITS",
    "MAX_TEXT_CHARS",
    "SmiFormat",
    "SmiParse",
    "clean",
    "decode_clock_events",
    "normalise_bus_id",
    "parse_nvidia_smi",
    "to_bool",
    "to_float",
    "to_hex",
    "to_int",
]

_Q_MARKERS = re.compile(r"^(?:GPU\s+[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:|=+NVSMI LOG=+|Attached GPUs\s*:)", re.MULTILINE)


def _control_fraction(text: str) -> float:
    sample = text[:65536]
    bad = sum(1 for ch in sample if (ord(ch) < 32 and ch not in "\t\n\r") or ch == "\ufffd")
    return bad / max(1, len(sample))


def parse_nvidia_smi(text: str | bytes, *, fields: list[str] | None = None) -> SmiParse:
    """Parse nvidia-smi -q text, -q -x XML or --query-gpu CSV (detected); raises InputError, and only that."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise InputError(f"nvidia-smi output must be text; {ACCEPTED}")
    if fields is not None and (
        not isinstance(fields, list) or not fields or not all(isinstance(f, str) and f.strip() for f in fields)
    ):
        raise InputError("fields must be a non-empty list of --query-gpu field names")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"the text is {len(text)} characters; at most {MAX_TEXT_CHARS} are accepted")
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped:
        raise InputError(f"the nvidia-smi output is empty; {ACCEPTED}")
    if _control_fraction(stripped) > 0.02:
        raise InputError(f"the input looks like binary data, not nvidia-smi output; {ACCEPTED}")
    text, lost = take_lost_lines(stripped)
    stripped = text.strip()
    if not stripped and (lost.gpus or lost.no_devices):  # nvidia-smi printed only its error lines
        warnings: list[str] = []
        gpus = merge_lost([], lost, positional=False, driver=None, cuda=None, warnings=warnings)
        return SmiParse(format="message", gpus=gpus, warnings=warnings)
    if stripped.startswith("<"):
        return parse_xml(stripped, lost)
    if _Q_MARKERS.search(stripped):
        return parse_q(stripped, lost)
    lines, _ = csv_lines(stripped)
    first = split_csv(lines[0]) if lines else None
    if first is not None and (looks_like_header(first) or fields is not None or any("," in ln for ln in lines)):
        return parse_csv(stripped, fields, lost)
    if lines and any(QUERY_GPU.search(c) for c in csv_lines(stripped)[1]):
        return parse_csv(stripped, fields, lost)
    raise InputError(f"unrecognised nvidia-smi output (no GPU found); {ACCEPTED}")
