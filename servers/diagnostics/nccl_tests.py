"""Parse the text output of any nccl-tests binary (all_reduce_perf, all_gather_perf, reduce_scatter_perf,
alltoall_perf, broadcast_perf, reduce_perf, sendrecv_perf, ...) and judge it. Plain module (no MCP imports).

Read from the output: the result rows (size, count, type, redop, root, then out-of-place and in-place time, algbw,
busbw and #wrong), the "# Avg bus bandwidth" and "# Out of bounds values" footer lines, the devices
("#  Rank  0 Group  0 Pid ... on HOST device  0 [0x07] NVIDIA A100-SXM4-80GB"), the nccl-tests and NCCL versions
and the collective. Column layouts differ across binaries and versions (older builds print no redop/root for some
collectives and an "error" column instead of "#wrong"; newer ones print every column, with "none" and -1 where a
collective has no reduction or root, "N/A" for #wrong when validation is off, and optional per-iteration and
timestamp columns), so the layout is read from the column header when there is one and guessed from the row shape
otherwise.

The verdict compares the highest bus bandwidth over the large-message rows (256 MiB and up) with floors, and every
floor states the assumption it rests on. Single-node all-reduce, 8 GPUs:
- H100: 460 GB/s assumes NVLink SHARP (NVLS) ran (Azure HPC health checks, NCCL's default algorithm, which picks
  NVLS on an NVSwitch node with NCCL >= 2.17; ring cannot reach it); ~370 GB/s assumes it did not (the ring peak
  NCCL's maintainers report, nccl-tests issue 212, and the GPU catalog's note).
- H200: 431 GB/s assumes NVLS (Azure); ~370 GB/s without it (the same NVLink 4 / NVSwitch fabric as H100).
- A100: 228 GB/s for any algorithm (Azure; A100 has no NVLS).
The output tells whether NVLS ran when it shows NCCL_ALGO / NCCL_NVLS_ENABLE (environment lines, NCCL INFO "set by
environment"), NCCL INFO lines ("NVLS multicast support is [not] available", tuner lines naming the algorithm,
"via NVLS"), or an NCCL version before 2.17; then the matching floor applies. When it cannot tell, the result says
so and judges against the floor that does not assume NVLS, stating what the NVLS floor would say: a healthy
ring-only node is never failed. Status: PASS (at or above the floor that applies), DEGRADED (below it but at or
above another floor of the same GPU, e.g. NVLS on yet ring-level bandwidth), FAIL (below every floor), UNKNOWN.
NcclVerdict checks itself: a verdict whose status does not follow from its floors cannot be built. Any #wrong > 0
(or out-of-bounds count > 0) is data corruption and critical.

Empty or unrecognisable text raises InputError; truncated output is parsed as far as it goes, with warnings;
nothing else is raised.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, model_validator

from servers.core.dtypes import NCCL_TYPE_BYTES
from servers.core.errors import InputError
from servers.core.models import Model
from servers.diagnostics.bounds import MAX_LINE_TEXT, MAX_NOTES, cap_notes, clip, clip_str, fit, pick, safe_int, scaled
from servers.diagnostics.findings import (
    VERDICT_WORD,
    CheckReport,
    Finding,
    GpuRef,
    Severity,
    Status,
    VerdictWord,
    bus_number,
    normalise_bus_id,
)

NvlsState = Literal["on", "off", "unknown"]
FloorAssumes = Literal["nvls", "no_nvls", "any", "caller"]
Holds = Literal["yes", "no", "unknown"]


@dataclass(frozen=True)
class FloorSpec:
    gbps: float
    assumes: FloorAssumes
    assumption: str
    source: str
    approximate: bool = False  # a typical peak used as a floor ("~")


AZURE_NHC = "Azure HPC health checks, azurehpc-health-checks"
FLOOR_SOURCE = f"{AZURE_NHC} conf nd96isr_h100_v5: check_nccl_allreduce 460.0 at 16G messages"
H200_SOURCE = f"{AZURE_NHC} conf nd96isr_h200_v5: check_nccl_allreduce 431.0 at 16G messages"
A100_SOURCE = f"{AZURE_NHC} conf nd96amsr_a100_v4: check_nccl_allreduce 228.0 at 4G messages"
RING_SOURCE = "NCCL maintainers, nccl-tests issue 212: 8x H100 ~370 GB/s with ring, ~480 with NVLS (GPU catalog note)"
_NVLS_ASSUMPTION = (
    "NVLink SHARP (NVLS) ran: Azure runs all_reduce_perf with NCCL's default algorithm, which on an NVSwitch node "
    "with fabric manager and NCCL >= 2.17 is NVLS for large messages; ring cannot reach this"
)
# (collective, GPU catalog name, ranks on one node) -> the bus bandwidth floors, each with its assumption
BUSBW_FLOORS: dict[tuple[str, str, int], tuple[FloorSpec, ...]] = {
    ("all_reduce", "H100-SXM", 8): (
        FloorSpec(460.0, "nvls", _NVLS_ASSUMPTION, FLOOR_SOURCE),
        FloorSpec(
            370.0,
            "no_nvls",
            "no NVLS (ring/tree over NVLink 4): the typical ring peak, used as the floor",
            RING_SOURCE,
            approximate=True,
        ),
    ),
    ("all_reduce", "H200-SXM", 8): (
        FloorSpec(431.0, "nvls", _NVLS_ASSUMPTION + " (above the ~370 GB/s ring peak of NVLink 4)", H200_SOURCE),
        FloorSpec(
            370.0,
            "no_nvls",
            "no NVLS (ring/tree): H200 has H100's NVLink 4 / NVSwitch fabric (900 GB/s per GPU in the GPU catalog), "
            "so H100's ring peak applies; carried over from H100, not measured on H200",
            RING_SOURCE,
            approximate=True,
        ),
    ),
    ("all_reduce", "A100-SXM-80GB", 8): (
        FloorSpec(
            228.0,
            "any",
            "any algorithm: A100 has no NVLS, which needs Hopper and third-generation NVSwitch, so NCCL runs "
            "ring/tree over NVLink 3 whatever the settings",
            A100_SOURCE,
        ),
    ),
}
# First NCCL release with NVLink SHARP (NVLS) support.
NVLS_MIN_NCCL = (2, 17)
LARGE_MESSAGE_BYTES = 256 * 1024 * 1024  # peak bus bandwidth needs messages above ~256 MB
MAX_TEXT_CHARS = 20_000_000
# Most items a report lists (every count and the verdict still cover them all): result rows (the rows with wrong
# elements and the verdict's best row are always among them), devices, hosts.
MAX_ROWS = 256
MAX_DEVICES = 256
MAX_HOSTS = 64

KNOWN_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "alltoall",
    "alltoallv",
    "broadcast",
    "reduce",
    "sendrecv",
    "gather",
    "scatter",
    "hypercube",
)

VERDICT_STATUS: dict[VerdictWord, Status] = {word: status for status, word in VERDICT_WORD.items()}
JudgedOn = Literal["bandwidth", "small_messages", "data_corruption", "run_errors", "no_result_rows", "no_known_floor"]


class NcclTiming(Model):
    """One half (out-of-place or in-place) of a result row; None where the output printed N/A or nothing."""

    time_us: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    wrong: int | None = Field(default=None, description="#wrong elements; None when validation was off (N/A)")
    max_error: float | None = Field(default=None, description="old builds' 'error' column (max deviation)")


class NcclRow(Model):
    size_bytes: int
    count: int
    type: str | None = None
    redop: str | None = Field(default=None, description="reduction op; None where the collective has none")
    root: int | None = Field(default=None, description="root rank; None where the collective has none (-1)")
    out_of_place: NcclTiming | None = None
    in_place: NcclTiming | None = None


class NcclDevice(Model):
    rank: int
    group: int | None = None
    pid: int | None = None
    host: str | None = None
    device: int | None = None
    bus_id: str | None = None
    name: str


class BandwidthFloor(Model):
    """One bus bandwidth floor, the assumption it rests on, and whether this output shows that assumption holds."""

    gbps: float
    approximate: bool = Field(default=False, description="True for a typical peak used as a floor (written ~)")
    assumes: FloorAssumes = Field(
        description="nvls: NVLink SHARP ran; no_nvls: it did not; any: holds whatever the algorithm; caller: given"
    )
    assumption: str
    source: str
    holds: Holds = Field(description="whether the output shows the assumption holds: yes, no or unknown")
    met: bool | None = Field(default=None, description="measured bus bandwidth >= gbps; None when none was measured")
    applied: bool = Field(default=False, description="True for the one floor the status is judged against")

    @property
    def label(self) -> str:
        what = {"nvls": "NVLS floor", "no_nvls": "no-NVLS floor", "any": "floor", "caller": "floor you gave"}
        return f"{'~' if self.approximate else ''}{self.gbps:g} GB/s {what[self.assumes]}"


class NcclVerdict(Model):
    status: VerdictWord = Field(
        description="PASS: at or above the floor that applies; DEGRADED: below it but at or above another floor of "
        "the same GPU (e.g. NVLS on, ring-level bandwidth); FAIL: below every floor, or corruption / run failures"
    )
    severity: Severity
    text: str
    judged_on: JudgedOn = Field(description="what decided the status")
    gpu_model: str | None = Field(default=None, description="GPU catalog name of the devices, when all match")
    device_name: str | None = None
    nvls: NvlsState = Field(
        default="unknown", description="whether NVLink SHARP (NVLS) ran, as far as the output shows"
    )
    nvls_evidence: list[str] = Field(default_factory=list, description="what in the output says so")
    floors: list[BandwidthFloor] = Field(
        default_factory=list, description="every floor known for this run, each with its assumption"
    )
    expected_busbw_gbps: float | None = Field(default=None, description="the floor judged against (the applied one)")
    floor_source: str | None = None
    floor_assumption: str | None = Field(default=None, description="the assumption of the floor judged against")
    measured_busbw_gbps: float | None = Field(default=None, description="max busbw over the large-message rows")
    measured_at_bytes: int | None = None
    avg_busbw_gbps: float | None = None
    data_corruption: bool = False
    wrong_elements: int = 0

    @model_validator(mode="after")
    def _status_follows_from_the_floors(self) -> NcclVerdict:
        """A bandwidth verdict must be judged against a floor whose assumption may hold, the lowest such floor when
        the output cannot tell, and its status must follow from the measurement; every floor is named in the text."""
        if self.judged_on not in ("bandwidth", "small_messages"):
            return self
        measured = self.measured_busbw_gbps
        applied = [f for f in self.floors if f.applied]
        problems = []
        if measured is None or len(applied) != 1:
            raise ValueError("a bandwidth verdict needs a measurement and exactly one applied floor")
        floor = applied[0]
        if floor.holds == "no":
            problems.append("the applied floor's assumption does not hold")
        if any(f.holds == "yes" for f in self.floors):
            if floor.holds != "yes":
                problems.append("a floor whose assumption holds was not the one applied")
        elif floor.gbps != min(f.gbps for f in self.floors if f.holds == "unknown"):
            problems.append("when the output cannot tell which assumption holds, the lowest floor applies")
        if self.expected_busbw_gbps != floor.gbps:
            problems.append("expected_busbw_gbps is not the applied floor")
        for f in self.floors:
            if f.met != (measured >= f.gbps):
                problems.append(f"met is wrong for the {f.label}")
            if f"{f.gbps:g} GB/s" not in self.text:
                problems.append(f"the text does not name the {f.label}")
        if self.judged_on == "small_messages":
            expected: Status = "unknown"
        elif measured >= floor.gbps:
            expected = "healthy"
        elif any(f.met for f in self.floors):
            expected = "degraded"
        else:
            expected = "unhealthy"
        if self.status != VERDICT_WORD[expected]:
            problems.append(f"status {self.status} does not follow from the floors ({VERDICT_WORD[expected]})")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class NcclTestsReport(Model):
    collective: str | None = Field(default=None, description="e.g. all_reduce; None when it cannot be told")
    collective_source: str = Field(description="where the collective name came from")
    nccl_tests_version: str | None = None
    nccl_version: str | None = None
    nthreads: int | None = None
    ngpus_per_thread: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    devices: list[NcclDevice] = Field(default_factory=list, description=f"at most {MAX_DEVICES}; see devices_omitted")
    devices_omitted: int = Field(default=0, description="device lines read but not listed")
    nranks: int | None = Field(default=None, description="distinct ranks over every device line")
    hosts: list[str] = Field(default_factory=list, description=f"at most {MAX_HOSTS}; see hosts_omitted")
    hosts_omitted: int = 0
    rows: list[NcclRow] = Field(
        default_factory=list,
        description=f"result rows in output order, at most {MAX_ROWS} (rows with #wrong > 0 and the verdict's best "
        "row first); the verdict uses every row",
    )
    rows_total: int = Field(default=0, description="result rows read")
    rows_omitted: int = Field(default=0, description="result rows read but not listed")
    avg_busbw_gbps: float | None = None
    out_of_bounds: int | None = None
    errors: list[str] = Field(
        default_factory=list, description=f"failure lines the run printed (at most {MAX_NOTES}, each clipped)"
    )
    errors_omitted: int = 0
    warnings: list[str] = Field(default_factory=list)
    verdict: NcclVerdict

    def listing_note(self) -> str:
        """What the report leaves out, for the text summary ('' when it lists everything)."""
        parts = [
            f"{omitted} of {omitted + len(listed)} {what}"
            for what, listed, omitted in (
                ("result rows", self.rows, self.rows_omitted),
                ("devices", self.devices, self.devices_omitted),
                ("hosts", self.hosts, self.hosts_omitted),
                ("failure lines", self.errors, self.errors_omitted),
            )
            if omitted
        ]
        return f" Not listed (counted and judged all the same): {', '.join(parts)}." if parts else ""


_DEVICE = re.compile(
    r"^#\s*Rank\s+(\d{1,18})\s+Group\s+(\d{1,18})\s+Pid\s+(\d{1,18})\s+on\s+(\S+)\s+device\s+(\d{1,18})\s+\[([^\]]*)\]\s+"
    r"(.+?)\s*$"
)
_DEVICE_LOOSE = re.compile(r"^#\s*Rank\s+(\d{1,18})\b.*?\bdevice\s+(\d{1,18})\s+(?:\[([^\]]*)\]\s+)?(.+?)\s*$")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d{1,18})(?!\d)")
_TESTS_VERSION = re.compile(r"nccl-tests version\s+(\S+)")
_NCCL_VERSION = re.compile(r"\bNCCL version\s+(\S+)")
_LIBRARY_CODE = re.compile(r"nccl-library=(\d{1,9})(?!\d)")
_STARTING = re.compile(r"Collective test (?:starting|concluded):\s*(\S+)")
_PROGRAM = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")
_PARAMS = re.compile(
    r"#\s*nThread\s+(\d{1,18})\s+nGpus\s+(\d{1,18})\s+minBytes\s+(\d{1,18})\s+maxBytes\s+(\d{1,18})(?!\d)",
)
_ERROR_LINE = re.compile(r"(Test (?:NCCL|CUDA) failure|NCCL WARN|^#\s*error:|Test failure|segmentation fault)", re.I)
_INT = re.compile(r"^[+-]?\d+$")

_TIME_NAMES = ("time", "cputime")
_LEAD_NAMES = ("size", "count", "type", "redop", "op", "root")


def _float(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(token: str) -> int | None:
    if _INT.match(token):
        return safe_int(token)
    value = _float(token)
    if value is not None and value == int(value) and abs(value) < 1e18:
        return int(value)
    return None


class _Layout:
    """Where each value sits in a row: the leading column names, then one list of field names per timing group."""

    def __init__(self, lead: list[str], groups: list[list[str]]) -> None:
        self.lead = lead
        self.groups = groups

    @property
    def width(self) -> int:
        return len(self.lead) + sum(len(g) for g in self.groups)


def _layout_from_header(tokens: list[str]) -> _Layout | None:
    names = [t.lower() for t in tokens]
    starts = [i for i, n in enumerate(names) if n in _TIME_NAMES]
    if not starts or "size" not in names[: starts[0]]:
        return None
    lead = [("redop" if n == "op" else n) for n in names[: starts[0]] if n in _LEAD_NAMES]
    if len(lead) != starts[0]:
        return None
    groups: list[list[str]] = []
    for k, start in enumerate(starts[:2]):
        end = starts[k + 1] if k + 1 < len(starts) else len(names)
        group = []
        for n in names[start:end]:
            if n == "timestamp":
                break
            group.append("time" if n in _TIME_NAMES else n)
        groups.append(group)
    return _Layout(lead, groups)


def _guess_layout(tokens: list[str]) -> _Layout:
    """A layout for a row seen without a column header, from how many values it has."""
    group = ["time", "algbw", "busbw", "#wrong"]
    n = len(tokens)
    if n == 11:
        return _Layout(["size", "count", "type"], [group, group])
    if n == 12:
        lead = ["size", "count", "type", "root" if _INT.match(tokens[3]) else "redop"]
        return _Layout(lead, [group, group])
    return _Layout(["size", "count", "type", "redop", "root"], [group, group])


def _timing(values: list[str], names: list[str]) -> NcclTiming | None:
    if not values:
        return None
    timing = NcclTiming()
    for name, token in zip(names, values, strict=False):
        if name == "time":
            timing.time_us = _float(token)
        elif name == "algbw":
            timing.algbw_gbps = _float(token)
        elif name == "busbw":
            timing.busbw_gbps = _float(token)
        elif name == "#wrong":
            timing.wrong = _int(token)
        elif name == "error":
            timing.max_error = _float(token)
    if timing.time_us is None and timing.algbw_gbps is None and timing.busbw_gbps is None:
        return None
    return timing


def _parse_row(tokens: list[str], layout: _Layout) -> tuple[NcclRow | None, bool]:
    """(row, complete). None when the tokens are not a result row."""
    lead = layout.lead
    if len(tokens) < len(lead) + 1:
        return None, False
    size = _int(tokens[0])
    count = _int(tokens[1]) if len(lead) > 1 else None
    if size is None or size < 0 or count is None or count < 0:
        return None, False
    row = NcclRow(size_bytes=size, count=count)
    for name, token in zip(lead[2:], tokens[2 : len(lead)], strict=False):
        if name == "type":
            if _float(token) is not None:
                return None, False
            row.type = clip_str(token, 64)
        elif name == "redop":
            row.redop = None if token.lower() in ("none", "n/a", "-") else clip_str(token, 64)
        elif name == "root":
            root = _int(token)
            row.root = root if root is not None and root >= 0 else None
    rest = tokens[len(lead) :]
    first = layout.groups[0] if layout.groups else []
    second = layout.groups[1] if len(layout.groups) > 1 else []
    row.out_of_place = _timing(rest[: len(first)], first)
    row.in_place = _timing(rest[len(first) : len(first) + len(second)], second)
    if row.out_of_place is None:
        return None, False
    complete = len(rest) >= len(first) + len(second)
    return row, complete


def _row_busbw(row: NcclRow) -> float | None:
    values = [t.busbw_gbps for t in (row.out_of_place, row.in_place) if t is not None and t.busbw_gbps is not None]
    return max(values) if values else None


def _wrong(row: NcclRow) -> int:
    return sum(t.wrong for t in (row.out_of_place, row.in_place) if t is not None and t.wrong and t.wrong > 0)


def _guess_collective(rows: list[NcclRow], nranks: int | None) -> tuple[str | None, str]:
    """Tell the collective from the numbers: size/count per element and busbw/algbw follow each collective's rule."""
    size_ratios = []
    bw_ratios = []
    for row in rows:
        width = NCCL_TYPE_BYTES.get((row.type or "").lower())
        if width and row.count > 0:
            size_ratios.append(row.size_bytes / (row.count * width))
        t = row.out_of_place
        if t and t.algbw_gbps and t.busbw_gbps is not None and t.algbw_gbps > 0.05:
            bw_ratios.append(t.busbw_gbps / t.algbw_gbps)
    if not bw_ratios:
        return None, "unknown: no header line names it and the rows carry too little bandwidth to tell"
    per_elem = statistics.median(size_ratios) if size_ratios else None
    bw = statistics.median(bw_ratios)
    n = nranks or (round(per_elem) if per_elem and per_elem > 1.5 else None)
    redop = next((r.redop for r in rows if r.redop), None)
    root = next((r.root for r in rows if r.root is not None), None)
    how = "inferred from the columns (size per element and busbw/algbw)"
    if n and n > 1:
        gathers = per_elem is not None and abs(per_elem - n) < 0.5 and abs(bw - (n - 1) / n) < 0.03
        if gathers:
            if redop:
                return "reduce_scatter", how
            return None, how + ": all_gather or alltoall (they print the same columns)"
        if abs(bw - 2 * (n - 1) / n) < 0.03 and n > 2:
            return "all_reduce", how
    if abs(bw - 1.0) < 0.03:
        if root is not None:
            return ("reduce" if redop else "broadcast"), how
        if n is None or n > 2:
            return "sendrecv", how
    if n is None and 1.0 < bw < 2.0 and redop:
        return "all_reduce", how + " (rank count unknown)"
    return None, "unknown: the columns match no single collective"


def _version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE to text: 2.9 and later use major*10000 + minor*100 + patch, earlier major*1000 + ..."""
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _collective_from_name(name: str) -> str | None:
    key = name.strip().lower()
    key = key.rsplit("/", 1)[-1]
    key = re.sub(r"(_perf)?(_mpi)?$", "", key)
    return key if key in KNOWN_COLLECTIVES else None


def _floor_specs(
    collective: str | None, gpu_model: str | None, nranks: int | None, one_host: bool
) -> tuple[FloorSpec, ...]:
    if collective is None or gpu_model is None or nranks is None or not one_host:
        return ()
    return BUSBW_FLOORS.get((collective, gpu_model, nranks), ())


# --- did NVLink SHARP (NVLS) run? ---------------------------------------------------------------------------------

_ENV_VALUE = r"(?:\s*[=:]\s*|\s+set by environment to\s+)['\"]?([^\s'\"]+)"
_ALGO_ENV = re.compile(r"\bNCCL_ALGO\b" + _ENV_VALUE)
_NVLS_ENABLE_ENV = re.compile(r"\bNCCL_NVLS_ENABLE\b" + _ENV_VALUE)
_MULTICAST = re.compile(r"NVLS multicast support is (not )?available", re.IGNORECASE)
_NVLS_SETUP = re.compile(r"\bvia NVLS\b|\bConnected NVLS\b|\bNVLS comm\b", re.IGNORECASE)
_TUNING_SIZED = re.compile(r"(\d{1,20})\s+Bytes\s*->\s*Algo\s+([A-Za-z_]{1,32}|\d{1,3})\b", re.IGNORECASE)
_TUNING_NAMED = re.compile(r"\balgo(?:rithm)?\b[\s,:=]+([A-Za-z][A-Za-z_]*|\d)\b", re.IGNORECASE)
_VERSION_NUMBERS = re.compile(r"^(\d{1,4})\.(\d{1,4})")
# NCCL's algorithm numbers (NCCL_ALGO_TREE 0 ... NCCL_ALGO_PAT 6) and names, folded (upper case, no '_').
_ALGO_NUMBERS = dict(enumerate(("TREE", "RING", "COLLNETDIRECT", "COLLNETCHAIN", "NVLS", "NVLSTREE", "PAT")))
_ALGO_NAMES = {"TREE", "RING", "COLLNET", "COLLNETDIRECT", "COLLNETCHAIN", "NVLS", "NVLSTREE", "PAT"}
_NVLS_ALGOS = {"NVLS", "NVLSTREE"}
MAX_EVIDENCE = 8


def _fold(name: str) -> str:
    return name.upper().replace("_", "").replace("-", "")


def _algo_name(token: str) -> str:
    return _ALGO_NUMBERS.get(int(token), "") if token.isdigit() else _fold(token)


def _algo_env_says(value: str) -> tuple[NvlsState | None, str]:
    """What an NCCL_ALGO value says about NVLS for all-reduce: on (only NVLS allowed), off (NVLS not allowed), or
    None (NVLS allowed among others, so NCCL chooses)."""
    text = value.strip()
    if ":" in text:  # per-collective form, e.g. "allreduce:nvls,ring;broadcast:ring"
        parts = {k.strip().lower(): v for k, _, v in (p.partition(":") for p in text.split(";"))}
        if "allreduce" not in parts:
            return None, "NCCL_ALGO does not restrict all-reduce"
        text = parts["allreduce"]
    exclude = text.startswith("^")
    names = {_fold(n) for n in text.lstrip("^").split(",") if n.strip()}
    if not names:
        return None, f"NCCL_ALGO={value} names no algorithm"
    if exclude:
        if "NVLS" in names:  # NVLSTree needs more than one node, so one node without NVLS runs no NVLS at all
            return "off", f"NCCL_ALGO={value} excludes NVLS"
        return None, f"NCCL_ALGO={value} leaves NVLS allowed"
    if not names & _NVLS_ALGOS:
        return "off", f"NCCL_ALGO={value} allows no NVLS algorithm"
    if names <= _NVLS_ALGOS:
        return "on", f"NCCL_ALGO={value} forces NVLS"
    return None, f"NCCL_ALGO={value} allows NVLS among others (NCCL chooses)"


class _NvlsScan:
    """Collects what the output says about NVLS, line by line; `result` weighs it."""

    def __init__(self) -> None:
        self.algo_env: tuple[NvlsState | None, str] | None = None
        self.disabled: str | None = None
        self.multicast_on = 0
        self.multicast_off = 0
        self.setup: str | None = None
        self.large_algos: set[str] = set()
        self.any_algos: set[str] = set()
        self.sized = False
        self.sized_large = False

    def feed(self, line: str) -> None:
        if not ("NVLS" in line or "ALGO" in line or "lgo" in line or "nvls" in line.lower()):
            return
        if match := _ALGO_ENV.search(line):  # NCCL ends some "set by environment to X." lines with a period
            self.algo_env = _algo_env_says(match.group(1).rstrip(".,;"))
        if (match := _NVLS_ENABLE_ENV.search(line)) and match.group(1).rstrip(".,;") == "0":
            self.disabled = "NCCL_NVLS_ENABLE=0"
        if match := _MULTICAST.search(line):
            if match.group(1):
                self.multicast_off += 1
            else:
                self.multicast_on += 1
        if self.setup is None and (match := _NVLS_SETUP.search(line)):
            self.setup = match.group(0)
        if "NCCL" not in line:
            return
        if match := _TUNING_SIZED.search(line):
            algo = _algo_name(match.group(2))
            if algo in _ALGO_NAMES:
                self.any_algos.add(algo)
                self.sized = True
                size = safe_int(match.group(1), 20) or 0
                if size >= LARGE_MESSAGE_BYTES:
                    self.sized_large = True
                    self.large_algos.add(algo)
            return
        for match in _TUNING_NAMED.finditer(line):
            algo = _algo_name(match.group(1))
            if algo in _ALGO_NAMES:
                self.any_algos.add(algo)

    def result(self, nccl_version: str | None) -> tuple[NvlsState, list[str]]:
        """(state, evidence), the deciding evidence first: what makes NVLS impossible or disables it, then an
        explicit NCCL_ALGO, then the tuner's choices, then NVLS being set up; unknown when the output says nothing."""
        found: list[tuple[NvlsState | None, str]] = []
        version = _VERSION_NUMBERS.match(nccl_version or "")
        if version and (int(version.group(1)), int(version.group(2))) < NVLS_MIN_NCCL:
            found.append(("off", f"NCCL {nccl_version} predates NVLS (first in NCCL 2.17)"))
        if self.multicast_off:
            found.append(("off", f"'NVLS multicast support is not available' on {self.multicast_off} device line(s)"))
        if self.disabled:
            found.append(("off", f"{self.disabled} disables NVLS"))
        if self.algo_env is not None:
            found.append(self.algo_env)
        if self.any_algos:
            algos = self.large_algos if self.sized_large else self.any_algos
            names = ", ".join(sorted(algos))
            if self.sized_large:
                where = "for messages of 256 MiB and up"
            elif self.sized:
                where = "for the sizes it logged, all below 256 MiB"
            else:
                where = "(the lines do not say for which sizes)"
            if algos & _NVLS_ALGOS:
                found.append(("on", f"NCCL's tuner chose {names} {where}"))
            else:
                found.append(("off", f"NCCL's tuner chose only {names} {where}"))
        if self.multicast_on:
            found.append(("on", f"'NVLS multicast support is available' on {self.multicast_on} device line(s)"))
        if self.setup:
            found.append(("on", f"an NCCL line shows {self.setup!r}"))
        decided = next((i for i, (said, _) in enumerate(found) if said is not None), None)
        if decided is None:
            return "unknown", [clip_str(why, MAX_LINE_TEXT) for _, why in found[:MAX_EVIDENCE]]
        state, why = found[decided]
        if state == "on" and why.startswith("'NVLS multicast support is available'"):
            why += ", and nothing disables NVLS (NCCL then uses it for large all-reduce by default)"
        rest = [w for i, (_, w) in enumerate(found) if i != decided]
        return state or "unknown", [clip_str(w, MAX_LINE_TEXT) for w in [why, *rest][:MAX_EVIDENCE]]


def _gpu_model(devices: list[NcclDevice], warnings: list[str]) -> tuple[str | None, str | None]:
    names = sorted({d.name for d in devices})
    if not names:
        return None, None
    if len(names) > 1:
        warnings.append(f"the ranks run on different GPU models ({', '.join(names)}); no single floor applies")
        return None, names[0]
    try:
        from servers.core.gpus import find_gpu

        return find_gpu(names[0]).name, names[0]
    except InputError:
        warnings.append(f"GPU {names[0]!r} is not in the GPU catalog, so no floor is known for it")
    except Exception as exc:  # a broken catalog must not break the parse
        warnings.append(f"the GPU catalog could not be read ({type(exc).__name__}); no floor looked up")
    return None, names[0]


def _holds(assumes: FloorAssumes, nvls: NvlsState) -> Holds:
    if assumes in ("any", "caller"):
        return "yes"
    if nvls == "unknown":
        return "unknown"
    return "yes" if (assumes == "nvls") == (nvls == "on") else "no"


def _floors(
    specs: tuple[FloorSpec, ...], nvls: NvlsState, measured: float | None
) -> tuple[list[BandwidthFloor], BandwidthFloor | None]:
    """The floors with whether their assumptions hold, and the one to judge against: one whose assumption holds,
    else (the output cannot tell) the lowest whose assumption may hold."""
    floors = [
        BandwidthFloor(
            gbps=spec.gbps,
            approximate=spec.approximate,
            assumes=spec.assumes,
            assumption=spec.assumption,
            source=spec.source,
            holds=_holds(spec.assumes, nvls),
            met=None if measured is None else measured >= spec.gbps,
        )
        for spec in specs
    ]
    holding = [f for f in floors if f.holds == "yes"] or [f for f in floors if f.holds == "unknown"]
    if not holding:
        return floors, None
    applied = min(holding, key=lambda f: f.gbps)
    applied.applied = True
    return floors, applied


def _nvls_phrase(nvls: NvlsState, evidence: list[str]) -> str:
    if nvls == "unknown":
        return "the output does not show whether NVLink SHARP (NVLS) ran"
    return f"NVLS was {nvls}: {evidence[0]}" if evidence else f"NVLS was {nvls}"


def _assumptions(floors: list[BandwidthFloor]) -> str:
    """' Floors: 460 GB/s assumes NVLS ran (source); ...' for the text."""
    if not floors or all(f.assumes == "caller" for f in floors):
        return ""
    said = {
        "nvls": "assumes NVLS ran",
        "no_nvls": "assumes no NVLS",
        "any": "holds for any algorithm",
        "caller": "is yours",
    }
    parts = [f"{'~' if f.approximate else ''}{f.gbps:g} GB/s {said[f.assumes]} [{f.source}]" for f in floors]
    return " Floors: " + "; ".join(parts) + "."


_LOW_ADVICE = (
    "check NVLink/NVSwitch health (nvidia-smi nvlink -s, fabric manager), GPU clocks and other processes on the GPUs, "
    "then rerun; drain the node if it stays low."
)


def _pass_text(
    what: str, at: str, applied: BandwidthFloor, others: list[BandwidthFloor], nvls: NvlsState, nvls_note: str
) -> str:
    """The text of a PASS: which floors it meets, and what it would be if NVLS ran when the output cannot tell."""
    if not others:
        text = f"PASS: {what} reached {at}, at or above the {applied.label}."
    elif nvls == "unknown" and all(f.met for f in others):
        text = (
            f"PASS: {what} reached {at}, at or above the {applied.label} and the "
            + " and the ".join(f.label for f in others)
            + ", so it passes whether or not NVLS ran."
        )
    elif nvls == "unknown":
        unmet = " and ".join(f.label for f in others if not f.met)
        text = (
            f"PASS without NVLS (>= {applied.label.split(' GB/s')[0]} GB/s): {what} reached {at}; below the "
            f"{unmet} — if NVLS was on, DEGRADED. The output does not show whether NVLink SHARP (NVLS) ran, so "
            "it is judged against the floor that does not assume NVLS; to settle it, rerun with NCCL_DEBUG=INFO "
            "(NCCL logs 'NVLS multicast support is available' or 'not available') or with NCCL_ALGO=NVLS."
        )
    else:
        text = (
            f"PASS: {what} reached {at}, at or above the {applied.label} ({nvls_note}); the "
            + " and the ".join(f.label for f in others)
            + " does not apply to this run."
        )
    return text


def _verdict(
    report: NcclTestsReport,
    expected: float | None,
    gpu_model: str | None,
    device_name: str | None,
    nvls: NvlsState,
    nvls_evidence: list[str],
) -> NcclVerdict:
    rows = report.rows
    wrong = sum(_wrong(r) for r in rows)
    oob = report.out_of_bounds or 0
    corruption = wrong > 0 or oob > 0
    large = [r for r in rows if r.size_bytes >= LARGE_MESSAGE_BYTES and _row_busbw(r) is not None]
    reached_large = bool(large)
    pool = large or [r for r in rows if _row_busbw(r) is not None]
    best = max(pool, key=lambda r: _row_busbw(r) or 0.0) if pool else None
    measured = _row_busbw(best) if best else None
    one_host = len(report.hosts) <= 1
    if expected is not None:
        specs: tuple[FloorSpec, ...] = (FloorSpec(expected, "caller", "your own baseline", "given by the caller"),)
    else:
        specs = _floor_specs(report.collective, gpu_model, report.nranks, one_host)
    floors, applied = _floors(specs, nvls, measured)
    what = f"{report.nranks or '?'}x {gpu_model or device_name or 'unknown GPU'} {report.collective or 'collective'}"
    avg = report.avg_busbw_gbps
    common = {
        "gpu_model": gpu_model,
        "device_name": device_name,
        "nvls": nvls,
        "nvls_evidence": nvls_evidence,
        "floors": floors,
        "expected_busbw_gbps": applied.gbps if applied else None,
        "floor_source": applied.source if applied else None,
        "floor_assumption": applied.assumption if applied else None,
        "measured_busbw_gbps": measured,
        "measured_at_bytes": best.size_bytes if best else None,
        "avg_busbw_gbps": avg,
        "data_corruption": corruption,
        "wrong_elements": wrong,
    }
    if corruption:
        count = f"{wrong} wrong elements" if wrong else f"{oob} out-of-bounds values"
        return NcclVerdict(
            status=VERDICT_WORD["unhealthy"],
            severity="critical",
            judged_on="data_corruption",
            text=f"FAIL: data corruption, {count} in {what}: the collective returned wrong results; drain the node, "
            "check the GPUs' Xids and ECC counters and run dcgmi diag -r 3 before it takes more work.",
            **common,
        )
    if report.errors:
        return NcclVerdict(
            status=VERDICT_WORD["unhealthy"],
            severity="warning",
            judged_on="run_errors",
            text=f"FAIL: the run reported {len(report.errors)} failure line(s), first: {report.errors[0][:200]!r}; "
            "read the job's log and the GPUs' Xids, fix the cause and rerun before judging bandwidth.",
            **common,
        )
    if measured is None or best is None:
        return NcclVerdict(
            status=VERDICT_WORD["unknown"],
            severity="warning" if report.warnings else "info",
            judged_on="no_result_rows",
            text="UNKNOWN: no result rows with a bus bandwidth were found; the run may have failed or been cut off.",
            **common,
        )
    if applied is None:
        return NcclVerdict(
            status=VERDICT_WORD["unknown"],
            severity="info",
            judged_on="no_known_floor",
            text=f"UNKNOWN: no floor is known for {what}; peak bus bandwidth {measured:g} GB/s at "
            f"{best.size_bytes} bytes. Pass expected_busbw_gbps to compare against your own baseline.",
            **common,
        )
    floor = applied.gbps
    at = f"{measured:g} GB/s bus bandwidth at {best.size_bytes} bytes"
    avg_note = ""
    if avg is not None:
        relation = "meets" if avg >= floor else "is below"
        avg_note = (
            f" The average over all sizes ({avg:g} GB/s) {relation} the {applied.label}; it includes small messages, "
            "so it is only comparable when the run used one large size."
        )
    cut = (
        " The output looks truncated (no Avg bus bandwidth footer), so later sizes were not seen."
        if avg is None
        else ""
    )
    tail = f"{avg_note}{cut}{_assumptions(floors)}"
    others = [f for f in floors if f is not applied]
    nvls_note = _nvls_phrase(nvls, nvls_evidence)
    if measured < floor and not reached_large:
        return NcclVerdict(
            status=VERDICT_WORD["unknown"],
            severity="warning",
            judged_on="small_messages",
            text=f"UNKNOWN: peak {measured:g} GB/s is below the {applied.label}, but the run never reached "
            f"{LARGE_MESSAGE_BYTES // (1024 * 1024)} MiB messages, which peak bandwidth needs; rerun with larger "
            f"sizes (e.g. -b 1G -e 16G -f 2) before judging.{tail}",
            **common,
        )
    if measured >= floor:
        text = _pass_text(what, at, applied, others, nvls, nvls_note)
        return NcclVerdict(
            status=VERDICT_WORD["healthy"], severity="info", judged_on="bandwidth", text=text + tail, **common
        )
    shortfall = 100.0 * (floor - measured) / floor
    met = [f for f in others if f.met]
    if met:
        text = (
            f"DEGRADED: {what} reached {at}, {shortfall:.1f}% below the {applied.label} although {nvls_note}; it "
            f"is at or above the {' and the '.join(f.label for f in met)}, i.e. bandwidth of a node without NVLS. "
            "Check that NCCL chose NVLS for the large sizes (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING, or rerun with "
            "NCCL_ALGO=NVLS), the fabric manager and the Fabric state in nvidia-smi -q, then rerun; drain the node "
            "if it stays low."
        )
        return NcclVerdict(
            status=VERDICT_WORD["degraded"], severity="warning", judged_on="bandwidth", text=text + tail, **common
        )
    if others:
        below = " and the ".join(f.label for f in others)
        why = f" ({nvls_note}; it is also below the {below}, so no algorithm assumption makes it healthy)"
    else:
        why = "" if applied.assumes == "caller" else f" ({applied.assumption})"
    text = f"FAIL: {what} reached only {at}, {shortfall:.1f}% below the {applied.label}{why}: {_LOW_ADVICE}"
    return NcclVerdict(
        status=VERDICT_WORD["unhealthy"], severity="warning", judged_on="bandwidth", text=text + tail, **common
    )


def _check_input(text: str, expected_busbw_gbps: float | None) -> None:
    if not isinstance(text, str):
        raise InputError("nccl-tests output must be text")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"the nccl-tests output is {len(text)} characters; at most {MAX_TEXT_CHARS} are read")
    if expected_busbw_gbps is not None:
        if isinstance(expected_busbw_gbps, bool) or not isinstance(expected_busbw_gbps, (int, float)):
            raise InputError("expected_busbw_gbps must be a number of GB/s")
        if not math.isfinite(expected_busbw_gbps) or expected_busbw_gbps <= 0:
            raise InputError(f"expected_busbw_gbps must be a positive number of GB/s, not {expected_busbw_gbps}")
    if not text.strip():
        raise InputError("the nccl-tests output is empty; paste the whole output of e.g. all_reduce_perf")


@dataclass
class _Reading:
    """What the lines of one run say, read line by line (comment lines, then result rows and the rest)."""

    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    devices: list[NcclDevice] = field(default_factory=list)
    rows: list[NcclRow] = field(default_factory=list)
    layout: _Layout | None = None
    header_seen: bool = False
    avg: float | None = None
    oob: int | None = None
    tests_version: str | None = None
    nccl_version: str | None = None
    library_code: int | None = None
    named_collective: str | None = None
    program_collective: str | None = None
    params: tuple[int, int, int, int] | None = None
    markers: int = 0
    incomplete_rows: int = 0
    nvls_scan: _NvlsScan = field(default_factory=lambda: _NvlsScan())

    def feed(self, line: str) -> None:
        """One stripped, non-empty line."""
        self.nvls_scan.feed(line)
        if line.startswith("#"):
            self._comment(line)
        else:
            self._body(line)

    def _comment(self, line: str) -> None:
        if match := _DEVICE.match(line):
            rank, group, pid, host, dev, bus, name = match.groups()
            self.devices.append(
                NcclDevice(
                    rank=int(rank),
                    group=int(group),
                    pid=int(pid),
                    host=clip_str(host),
                    device=int(dev),
                    bus_id=clip(bus, 64),
                    name=clip_str(name),
                )
            )
            self.markers += 1
            return
        if match := _DEVICE_LOOSE.match(line):
            self.devices.append(
                NcclDevice(
                    rank=int(match.group(1)),
                    device=int(match.group(2)),
                    bus_id=clip(match.group(3), 64),
                    name=clip_str(match.group(4)),
                )
            )
            self.markers += 1
            return
        if match := _AVG.match(line):
            self.avg = _float(match.group(1))
            self.markers += 1
            return
        if match := _OOB.match(line):
            self.oob = int(match.group(1))
            self.markers += 1
            return
        if match := _PARAMS.match(line):
            self.params = (int(match.group(1)), int(match.group(2)), int(match.group(3)), int(match.group(4)))
            self.markers += 1
        if match := _TESTS_VERSION.search(line):
            self.tests_version = clip_str(match.group(1), 64)
            library = _LIBRARY_CODE.search(line)
            self.library_code = int(library.group(1)) if library else self.library_code
            self.markers += 1
        elif (match := _NCCL_VERSION.search(line)) and self.nccl_version is None:
            self.nccl_version = clip_str(match.group(1), 64)
            self.markers += 1
        if match := _STARTING.search(line):
            self.named_collective = self.named_collective or _collective_from_name(match.group(1))
            self.markers += 1
        if _ERROR_LINE.search(line):
            self.errors.append(clip_str(line, MAX_LINE_TEXT))
        tokens = line.lstrip("#").split()
        lowered = [t.lower() for t in tokens]
        if "size" in lowered and "busbw" in lowered:
            parsed = _layout_from_header(tokens)
            if parsed is not None:
                self.layout = parsed
                self.header_seen = True
                self.markers += 1
            else:
                self.warnings.append(f"a column header was not understood: {line[:160]!r}")

    def _body(self, line: str) -> None:
        if (match := _NCCL_VERSION.search(line)) and "nccl-tests" not in line:
            self.nccl_version = self.nccl_version or clip_str(match.group(1), 64)
            self.markers += 1
            return
        if _ERROR_LINE.search(line):
            self.errors.append(clip_str(line, MAX_LINE_TEXT))
            return
        if self.program_collective is None and (match := _PROGRAM.search(line)):
            self.program_collective = _collective_from_name(match.group(1))
        tokens = line.split()
        if not tokens or not _INT.match(tokens[0]):
            return
        row, complete = _parse_row(tokens, self.layout or _guess_layout(tokens))
        if row is None:
            return
        self.rows.append(row)
        if not complete:
            self.incomplete_rows += 1

    def finish_warnings(self) -> None:
        """Refuse what is not nccl-tests output; warn about what the run's output lacks."""
        if not self.rows and self.markers == 0:
            raise InputError(
                "this does not look like nccl-tests output: no result rows, no '# Using devices' ranks and no "
                "'# Avg bus bandwidth' line were found; paste the full output of e.g. all_reduce_perf"
            )
        if not self.header_seen and self.rows:
            self.warnings.append("no column header was found; the column layout was guessed from the row shape")
        if self.incomplete_rows:
            self.warnings.append(f"{self.incomplete_rows} result row(s) are incomplete; the output looks truncated")
        if self.avg is None:
            self.warnings.append("no '# Avg bus bandwidth' line: the output looks truncated or the run did not finish")
        if not self.rows:
            self.warnings.append("no result rows were found")
        if self.errors:
            self.warnings.append(f"the run printed {len(self.errors)} failure line(s); see errors")


def _report(reading: _Reading, expected_busbw_gbps: float | None) -> NcclTestsReport:
    """The report of what was read, judged."""
    warnings, devices = reading.warnings, reading.devices
    unique_ranks = sorted({d.rank for d in devices})
    nranks = len(unique_ranks) if unique_ranks else None
    hosts = sorted({d.host for d in devices if d.host})
    if reading.named_collective:
        collective, source = reading.named_collective, "the '# Collective test starting' line"
    elif reading.program_collective:
        collective, source = reading.program_collective, "the program name in the output"
    else:
        collective, source = _guess_collective(reading.rows, nranks)

    gpu_model, device_name = _gpu_model(devices, warnings)
    if len(hosts) > 1 and expected_busbw_gbps is None:
        warnings.append(f"the ranks span {len(hosts)} hosts; the known floors are for a single node")
    nccl_version = reading.nccl_version
    if nccl_version is None and reading.library_code:
        nccl_version = _version_from_code(reading.library_code)
    params = reading.params
    report = NcclTestsReport(
        collective=collective,
        collective_source=source,
        nccl_tests_version=reading.tests_version,
        nccl_version=nccl_version,
        nthreads=params[0] if params else None,
        ngpus_per_thread=params[1] if params else None,
        min_bytes=params[2] if params else None,
        max_bytes=params[3] if params else None,
        devices=devices,
        nranks=nranks,
        hosts=hosts,
        rows=reading.rows,
        avg_busbw_gbps=reading.avg,
        out_of_bounds=reading.oob,
        errors=reading.errors,
        warnings=warnings,
        verdict=NcclVerdict(
            status=VERDICT_WORD["unknown"], severity="info", judged_on="no_result_rows", text="not judged yet"
        ),
    )
    nvls, nvls_evidence = reading.nvls_scan.result(nccl_version)
    report.verdict = _verdict(report, expected_busbw_gbps, gpu_model, device_name, nvls, nvls_evidence)
    return report


def parse_nccl_tests(text: str, *, expected_busbw_gbps: float | None = None) -> NcclTestsReport:
    """Parse one nccl-tests run's output and judge its bus bandwidth; see the module docstring."""
    _check_input(text, expected_busbw_gbps)
    reading = _Reading()
    for raw in text.splitlines():
        line = raw.strip()
        if line:
            reading.feed(line)
    reading.finish_warnings()
    return _bounded(_report(reading, expected_busbw_gbps))


def _bounded(report: NcclTestsReport) -> NcclTestsReport:
    """The report with its lists capped (counts of the rest in *_omitted); the verdict was made on all of it."""
    verdict = report.verdict

    best = next(
        (
            i
            for i, row in enumerate(report.rows)
            if row.size_bytes == verdict.measured_at_bytes and _row_busbw(row) == verdict.measured_busbw_gbps
        ),
        None,
    )
    ranks = {id(row): 2 if _wrong(row) > 0 else 1 if i == best else 0 for i, row in enumerate(report.rows)}

    def keep(row: NcclRow) -> int:  # rows with wrong elements first, then the verdict's best row
        return ranks[id(row)]

    def build(scale: float) -> NcclTestsReport:
        rows, rows_omitted = pick(report.rows, scaled(MAX_ROWS, scale), keep)
        devices, devices_omitted = pick(report.devices, scaled(MAX_DEVICES, scale))
        hosts, hosts_omitted = pick(report.hosts, scaled(MAX_HOSTS, scale))
        errors, errors_omitted = pick(report.errors, scaled(MAX_NOTES, scale))
        return report.model_copy(
            update={
                "rows": rows,
                "rows_total": len(report.rows),
                "rows_omitted": rows_omitted,
                "devices": devices,
                "devices_omitted": devices_omitted,
                "hosts": hosts,
                "hosts_omitted": hosts_omitted,
                "errors": errors,
                "errors_omitted": errors_omitted,
                "warnings": cap_notes(report.warnings, scaled(MAX_NOTES, scale)),
            }
        )

    return fit(build)


def nccl_report(report: NcclTestsReport) -> CheckReport:
    """The run as findings for triage: each rank's GPU (evidence, no verdict: nccl-tests judges the node), and the
    node's bandwidth verdict."""
    findings = []
    for device in report.devices:
        full = normalise_bus_id(device.bus_id)
        where = f" on {device.host}" if device.host else ""
        gpu = GpuRef(
            bus_id=full,
            only_bus_number=full is None,
            bus_number=bus_number(device.bus_id) if full is None else None,
            name=device.name,
            nccl_rank=device.rank,
            label=f"rank {device.rank} [{device.bus_id}]",
        )
        findings.append(
            Finding(
                check="nccl_tests",
                rule="rank_device",
                status=None,
                severity="info",
                what=f"nccl-tests rank {device.rank}{where}, CUDA device {device.device}: the node-level bandwidth "
                "verdict is in node_evidence",
                gpu=gpu,
            )
        )
    verdict = report.verdict
    passed = verdict.status == VERDICT_WORD["healthy"]
    findings.append(
        Finding(
            check="nccl_tests",
            rule=verdict.judged_on,
            status=VERDICT_STATUS[verdict.status],
            severity="info" if passed else verdict.severity,
            what=f"nccl-tests {report.collective or ''} {verdict.status}: {verdict.text}",
            action=None if passed else "see the verdict text; run gpu_health and check NVLink",
            detail={"measured_busbw_gbps": verdict.measured_busbw_gbps, "floor_gbps": verdict.expected_busbw_gbps},
        )
    )
    warnings = []
    if len(report.hosts) > 1:
        warnings.append(
            f"the nccl-tests run spans {len(report.hosts)} hosts ({', '.join(report.hosts[:4])}); triage judges one "
            "node"
        )
    return CheckReport(
        check="nccl_tests",
        findings=findings,
        summary=f"{report.collective or 'collective'} on {report.nranks or len(report.devices)} rank(s): "
        f"{verdict.status}",
        warnings=warnings,
        node=report.hosts[0] if len(report.hosts) == 1 else None,
        unmatched_warning="nccl-tests device(s) whose bus id names no single GPU of the other sources (old "
        "nccl-tests print only the bus number): {devices}",
    )
