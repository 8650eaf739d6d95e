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

The verdict compares the highest bus bandwidth over the large-message rows (256 MiB and up) with a floor: the
production floors known here are for single-node all-reduce (Azure HPC health checks, 16 GB messages): 8x H100
460 GB/s, 8x H200 431, 8x A100 228. Any #wrong > 0 (or out-of-bounds count > 0) is data corruption and critical.

Empty or unrecognisable text raises InputError; truncated output is parsed as far as it goes, with warnings;
nothing else is raised.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Literal

from pydantic import BaseModel, Field

from servers.core.errors import InputError
from servers.diagnostics.bounds import MAX_LINE_TEXT, MAX_NOTES, cap_notes, clip, clip_str, fit, pick, safe_int, scaled

FLOOR_SOURCE = "Azure HPC health checks, single node, 16 GB messages"
# (collective, GPU catalog name, ranks on one node) -> all-reduce bus bandwidth floor in GB/s
BUSBW_FLOORS_GBPS: dict[tuple[str, str, int], float] = {
    ("all_reduce", "H100-SXM", 8): 460.0,
    ("all_reduce", "H200-SXM", 8): 431.0,
    ("all_reduce", "A100-SXM-80GB", 8): 228.0,
}
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
TYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "fp8": 1,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp16": 2,
    "int32": 4,
    "int": 4,
    "uint32": 4,
    "float": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "double": 8,
    "float64": 8,
}

Status = Literal["PASS", "FAIL", "UNKNOWN"]
Severity = Literal["info", "warning", "critical"]


class NcclTiming(BaseModel):
    """One half (out-of-place or in-place) of a result row; None where the output printed N/A or nothing."""

    time_us: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    wrong: int | None = Field(default=None, description="#wrong elements; None when validation was off (N/A)")
    max_error: float | None = Field(default=None, description="old builds' 'error' column (max deviation)")


class NcclRow(BaseModel):
    size_bytes: int
    count: int
    type: str | None = None
    redop: str | None = Field(default=None, description="reduction op; None where the collective has none")
    root: int | None = Field(default=None, description="root rank; None where the collective has none (-1)")
    out_of_place: NcclTiming | None = None
    in_place: NcclTiming | None = None


class NcclDevice(BaseModel):
    rank: int
    group: int | None = None
    pid: int | None = None
    host: str | None = None
    device: int | None = None
    bus_id: str | None = None
    name: str


class NcclVerdict(BaseModel):
    status: Status
    severity: Severity
    text: str
    gpu_model: str | None = Field(default=None, description="GPU catalog name of the devices, when all match")
    device_name: str | None = None
    expected_busbw_gbps: float | None = None
    floor_source: str | None = None
    measured_busbw_gbps: float | None = Field(default=None, description="max busbw over the large-message rows")
    measured_at_bytes: int | None = None
    avg_busbw_gbps: float | None = None
    data_corruption: bool = False
    wrong_elements: int = 0


class NcclTestsReport(BaseModel):
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
        width = TYPE_BYTES.get((row.type or "").lower())
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


def _floor(collective: str | None, gpu_model: str | None, nranks: int | None, one_host: bool) -> float | None:
    if collective is None or gpu_model is None or nranks is None or not one_host:
        return None
    return BUSBW_FLOORS_GBPS.get((collective, gpu_model, nranks))


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


def _verdict(
    report: NcclTestsReport, expected: float | None, gpu_model: str | None, device_name: str | None
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
    floor = expected
    source = "given by the caller" if expected is not None else None
    if floor is None:
        floor = _floor(report.collective, gpu_model, report.nranks, one_host)
        source = FLOOR_SOURCE if floor is not None else None
    what = f"{report.nranks or '?'}x {gpu_model or device_name or 'unknown GPU'} {report.collective or 'collective'}"
    avg = report.avg_busbw_gbps
    common = {
        "gpu_model": gpu_model,
        "device_name": device_name,
        "expected_busbw_gbps": floor,
        "floor_source": source,
        "measured_busbw_gbps": measured,
        "measured_at_bytes": best.size_bytes if best else None,
        "avg_busbw_gbps": avg,
        "data_corruption": corruption,
        "wrong_elements": wrong,
    }
    if corruption:
        count = f"{wrong} wrong elements" if wrong else f"{oob} out-of-bounds values"
        return NcclVerdict(
            status="FAIL",
            severity="critical",
            text=f"FAIL: data corruption, {count} in {what}: the collective returned wrong results; drain the node, "
            "check the GPUs' Xids and ECC counters and run dcgmi diag -r 3 before it takes more work.",
            **common,
        )
    if report.errors:
        return NcclVerdict(
            status="FAIL",
            severity="warning",
            text=f"FAIL: the run reported {len(report.errors)} failure line(s), first: {report.errors[0][:200]!r}; "
            "read the job's log and the GPUs' Xids, fix the cause and rerun before judging bandwidth.",
            **common,
        )
    if measured is None:
        return NcclVerdict(
            status="UNKNOWN",
            severity="warning" if report.warnings else "info",
            text="UNKNOWN: no result rows with a bus bandwidth were found; the run may have failed or been cut off.",
            **common,
        )
    avg_note = ""
    if avg is not None and floor is not None:
        relation = "meets" if avg >= floor else "is below"
        avg_note = (
            f" The average over all sizes ({avg:g} GB/s) {relation} the floor; it includes small messages, so it "
            "is only comparable when the run used one large size."
        )
    if floor is None:
        return NcclVerdict(
            status="UNKNOWN",
            severity="info",
            text=f"UNKNOWN: no floor is known for {what}; peak bus bandwidth {measured:g} GB/s at "
            f"{best.size_bytes if best else 0} bytes. Pass expected_busbw_gbps to compare against your own baseline.",
            **common,
        )
    cut = (
        " The output looks truncated (no Avg bus bandwidth footer), so later sizes were not seen."
        if avg is None
        else ""
    )
    if measured >= floor:
        return NcclVerdict(
            status="PASS",
            severity="info",
            text=f"PASS: {what} reached {measured:g} GB/s bus bandwidth at {best.size_bytes if best else 0} bytes, "
            f"at or above the {floor:g} GB/s floor ({source}).{avg_note}{cut}",
            **common,
        )
    if not reached_large:
        return NcclVerdict(
            status="UNKNOWN",
            severity="warning",
            text=f"UNKNOWN: peak {measured:g} GB/s is below the {floor:g} GB/s floor, but the run never reached "
            f"{LARGE_MESSAGE_BYTES // (1024 * 1024)} MiB messages, which peak bandwidth needs; rerun with larger "
            "sizes (e.g. -b 1G -e 16G -f 2) before judging.",
            **common,
        )
    shortfall = 100.0 * (floor - measured) / floor
    return NcclVerdict(
        status="FAIL",
        severity="warning",
        text=f"FAIL: {what} reached only {measured:g} GB/s bus bandwidth, {shortfall:.1f}% below the {floor:g} GB/s "
        f"floor ({source}): check NVLink/NVSwitch health (nvidia-smi nvlink -s, fabric manager), GPU clocks and "
        f"other processes on the GPUs, then rerun; drain the node if it stays low.{avg_note}{cut}",
        **common,
    )


def parse_nccl_tests(text: str, *, expected_busbw_gbps: float | None = None) -> NcclTestsReport:
    """Parse one nccl-tests run's output and judge its bus bandwidth; see the module docstring."""
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

    warnings: list[str] = []
    errors: list[str] = []
    devices: list[NcclDevice] = []
    rows: list[NcclRow] = []
    layout: _Layout | None = None
    header_seen = False
    avg: float | None = None
    oob: int | None = None
    tests_version = nccl_version = None
    library_code: int | None = None
    named_collective: str | None = None
    program_collective: str | None = None
    params: tuple[int, int, int, int] | None = None
    markers = 0
    incomplete_rows = 0

    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if match := _DEVICE.match(line):
                rank, group, pid, host, dev, bus, name = match.groups()
                devices.append(
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
                markers += 1
                continue
            if match := _DEVICE_LOOSE.match(line):
                devices.append(
                    NcclDevice(
                        rank=int(match.group(1)),
                        device=int(match.group(2)),
                        bus_id=clip(match.group(3), 64),
                        name=clip_str(match.group(4)),
                    )
                )
                markers += 1
                continue
            if match := _AVG.match(line):
                avg = _float(match.group(1))
                markers += 1
                continue
            if match := _OOB.match(line):
                oob = int(match.group(1))
                markers += 1
                continue
            if match := _PARAMS.match(line):
                params = (int(match.group(1)), int(match.group(2)), int(match.group(3)), int(match.group(4)))
                markers += 1
            if match := _TESTS_VERSION.search(line):
                tests_version = clip_str(match.group(1), 64)
                library = _LIBRARY_CODE.search(line)
                library_code = int(library.group(1)) if library else library_code
                markers += 1
            elif (match := _NCCL_VERSION.search(line)) and nccl_version is None:
                nccl_version = clip_str(match.group(1), 64)
                markers += 1
            if match := _STARTING.search(line):
                named_collective = named_collective or _collective_from_name(match.group(1))
                markers += 1
            if _ERROR_LINE.search(line):
                errors.append(clip_str(line, MAX_LINE_TEXT))
            tokens = line.lstrip("#").split()
            lowered = [t.lower() for t in tokens]
            if "size" in lowered and "busbw" in lowered:
                parsed = _layout_from_header(tokens)
                if parsed is not None:
                    layout = parsed
                    header_seen = True
                    markers += 1
                else:
                    warnings.append(f"a column header was not understood: {line[:160]!r}")
            continue
        if (match := _NCCL_VERSION.search(line)) and "nccl-tests" not in line:
            nccl_version = nccl_version or clip_str(match.group(1), 64)
            markers += 1
            continue
        if _ERROR_LINE.search(line):
            errors.append(clip_str(line, MAX_LINE_TEXT))
            continue
        if program_collective is None and (match := _PROGRAM.search(line)):
            program_collective = _collective_from_name(match.group(1))
        tokens = line.split()
        if not tokens or not _INT.match(tokens[0]):
            continue
        row, complete = _parse_row(tokens, layout or _guess_layout(tokens))
        if row is None:
            continue
        rows.append(row)
        if not complete:
            incomplete_rows += 1

    if not rows and markers == 0:
        raise InputError(
            "this does not look like nccl-tests output: no result rows, no '# Using devices' ranks and no "
            "'# Avg bus bandwidth' line were found; paste the full output of e.g. all_reduce_perf"
        )
    if not header_seen and rows:
        warnings.append("no column header was found; the column layout was guessed from the row shape")
    if incomplete_rows:
        warnings.append(f"{incomplete_rows} result row(s) are incomplete; the output looks truncated")
    if avg is None:
        warnings.append("no '# Avg bus bandwidth' line: the output looks truncated or the run did not finish")
    if not rows:
        warnings.append("no result rows were found")
    if errors:
        warnings.append(f"the run printed {len(errors)} failure line(s); see errors")

    unique_ranks = sorted({d.rank for d in devices})
    nranks = len(unique_ranks) if unique_ranks else None
    hosts = sorted({d.host for d in devices if d.host})
    if named_collective:
        collective, source = named_collective, "the '# Collective test starting' line"
    elif program_collective:
        collective, source = program_collective, "the program name in the output"
    else:
        collective, source = _guess_collective(rows, nranks)

    gpu_model, device_name = _gpu_model(devices, warnings)
    if len(hosts) > 1 and expected_busbw_gbps is None:
        warnings.append(f"the ranks span {len(hosts)} hosts; the known floors are for a single node")
    if nccl_version is None and library_code:
        nccl_version = _version_from_code(library_code)

    report = NcclTestsReport(
        collective=collective,
        collective_source=source,
        nccl_tests_version=tests_version,
        nccl_version=nccl_version,
        nthreads=params[0] if params else None,
        ngpus_per_thread=params[1] if params else None,
        min_bytes=params[2] if params else None,
        max_bytes=params[3] if params else None,
        devices=devices,
        nranks=nranks,
        hosts=hosts,
        rows=rows,
        avg_busbw_gbps=avg,
        out_of_bounds=oob,
        errors=errors,
        warnings=warnings,
        verdict=NcclVerdict(status="UNKNOWN", severity="info", text="not judged yet"),
    )
    report.verdict = _verdict(report, expected_busbw_gbps, gpu_model, device_name)
    return _bounded(report)


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
