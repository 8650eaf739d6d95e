"""What the three nvidia-smi parsers share: the result (SmiParse), the reading of one cell (N/A and its kin become
None, never zero; units; PCI bus ids), and the canonical field names each parser maps its format onto, turned into a
GpuSnapshot in one place (to_snapshot).

Temperatures: drivers from 535 on report thresholds as margins to T.Limit ("GPU T.Limit Temp" is how far the GPU is
below T.Limit; "GPU Slowdown T.Limit Temp: -2 C" means slowdown starts 2 C above T.Limit). They are converted to
absolute temperatures: threshold = current + margin - threshold_delta.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from servers.core.models import Model
from servers.diagnostics.snapshot import GpuSnapshot, unreachable_gpu

SmiFormat = Literal["q", "xml", "csv", "message"]

MAX_TEXT_CHARS = 64 * 2**20
ACCEPTED = (
    "accepted: the text of `nvidia-smi -q` (optionally followed by `nvidia-smi nvlink --status`), "
    "`nvidia-smi -q -x` (XML), or `nvidia-smi --query-gpu=<fields> --format=csv` (with header, or with "
    "noheader and the fields given)"
)


class SmiParse(Model):
    format: SmiFormat = Field(
        description="q (nvidia-smi -q text), xml (nvidia-smi -q -x), csv (--query-gpu), or message (only nvidia-smi's "
        "error lines, no report)"
    )
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: list[GpuSnapshot]
    warnings: list[str] = Field(default_factory=list, description="Truncation, skipped or garbled parts")


# ---------------------------------------------------------------------------------------------------------------------
# cell values

_SENTINELS = {
    "",
    "-",
    "n/a",
    "na",
    "not supported",
    "not available",
    "unknown",
    "unknown error",
    "requested functionality has been deprecated",
    "insufficient permissions",
    "no permission",
    "gpu is lost",
    "gpu requires reset",
    "not found",
    "invalid",
}
_NUMBER = re.compile(r"^([-+]?\d{1,15}(?:\.\d{1,12})?)\s*([A-Za-z%/()µ]*)$")
_HEX = re.compile(r"^0[xX]([0-9A-Fa-f]{1,16})$")
_BUS_ID = re.compile(r"^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$")
_TRUE = {"yes", "enabled", "active", "true", "on", "1"}
_FALSE = {"no", "disabled", "not active", "false", "off", "0", "inactive"}
_UNIT_SCALE = {"kib": 1 / 1024, "mib": 1.0, "gib": 1024.0, "kb": 1 / 1024, "mb": 1.0, "gb": 1024.0}


def clean(value: str | None) -> str | None:
    """The cell's text, or None where nvidia-smi says it does not know (N/A, [Not Supported], deprecated...)."""
    if value is None:
        return None
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        return None
    if text.lower() in _SENTINELS:
        return None
    return text


def to_float(value: str | None, *, memory: bool = False) -> float | None:
    """A number with an optional unit ('71.97 W', '36 C', '0 %', '16x', '81559 MiB'); None if not a number."""
    text = clean(value)
    if text is None:
        return None
    match = _NUMBER.match(text)
    if match is None:
        return None
    number = float(match.group(1))
    if memory:
        number *= _UNIT_SCALE.get(match.group(2).lower(), 1.0)
    return number


def to_int(value: str | None) -> int | None:
    number = to_float(value)
    if number is None or number != int(number):
        return None
    return int(number)


def to_hex(value: str | None) -> int | None:
    text = clean(value)
    if text is None:
        return None
    match = _HEX.match(text)
    return int(match.group(1), 16) if match else None


def to_bool(value: str | None) -> bool | None:
    text = clean(value)
    if text is None:
        return None
    lowered = " ".join(text.lower().split())
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    return None


def normalise_bus_id(value: str | None) -> str | None:
    """'00000000:1B:00.0' -> '0000:1b:00.0'; None when it is not a PCI address."""
    text = clean(value)
    if text is None:
        return None
    match = _BUS_ID.match(text)
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    domain = (domain or "0").rjust(4, "0")[-4:]
    return f"{domain}:{bus.rjust(2, '0')}:{device.rjust(2, '0')}.{function}".lower()


# ---------------------------------------------------------------------------------------------------------------------
# canonical fields -> GpuSnapshot

# Clock event (throttle) reason keys as GpuSnapshot.clock_events names them, with their NVML bit.
CLOCK_EVENT_BITS: dict[str, int] = {
    "idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


def decode_clock_events(mask: int) -> dict[str, bool]:
    """NVML clocks event reasons bitmask -> {reason: active} for every known reason."""
    return {name: bool(mask & bit) for name, bit in CLOCK_EVENT_BITS.items()}


def _sum_parts(*parts: int | None) -> int | None:
    """The sum when every part is known; a known positive part alone when others are unknown (errors were seen)."""
    known = [p for p in parts if p is not None]
    if not known:
        return None
    if len(known) == len(parts):
        return sum(known)
    return sum(known) if sum(known) > 0 else None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _first_int(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def to_snapshot(
    f: dict[str, str], *, index: int | None, driver: str | None, cuda: str | None, clocks: dict[str, bool]
) -> GpuSnapshot:
    """Build a snapshot from canonical field names (see the tables of text_report, xml_report and query_csv)."""
    get = f.get

    def ecc(scope: str, kind: str) -> tuple[int | None, int | None, int | None]:
        prefix = f"ecc_{scope}_{kind}_"
        sram = to_int(get(prefix + "sram"))
        if sram is None and (prefix + "sram_parity" in f or prefix + "sram_secded" in f):
            sram = _sum_parts(to_int(get(prefix + "sram_parity")), to_int(get(prefix + "sram_secded")))
        dram = to_int(get(prefix + "dram"))
        total = to_int(get(prefix + "total"))
        if total is None and (sram is not None or dram is not None):
            total = _sum_parts(sram, dram)
        return sram, dram, total

    vol_unc_sram, vol_unc_dram, vol_unc_total = ecc("vol", "unc")
    agg_unc_sram, agg_unc_dram, agg_unc_total = ecc("agg", "unc")
    _, _, vol_corr_total = ecc("vol", "corr")
    _, _, agg_corr_total = ecc("agg", "corr")

    temp = to_float(get("temp_gpu"))
    margin = to_float(get("temp_tlimit_margin"))

    def threshold(absolute: str, delta: str) -> float | None:
        value = to_float(get(absolute))
        if value is not None:
            return value
        offset = to_float(get(delta))
        if offset is None or margin is None or temp is None:
            return None
        return temp + margin - offset

    lost = says_lost(f)
    recovery = clean(get("recovery_action"))
    mask = to_hex(get("clk_active_mask"))
    events = decode_clock_events(mask) if mask is not None else {}
    events.update(clocks)  # the per-reason cells, where given, have the last word

    return GpuSnapshot(
        index=to_int(get("index")) if get("index") is not None else index,
        name=clean(get("name")),
        uuid=clean(get("uuid")),
        pci_bus_id=normalise_bus_id(get("pci_bus_id")),
        serial=clean(get("serial")),
        vbios_version=clean(get("vbios_version")),
        driver_version=clean(get("driver_version")) or driver,
        cuda_version=cuda,
        memory_total_mib=to_float(get("memory_total"), memory=True),
        memory_used_mib=to_float(get("memory_used"), memory=True),
        persistence_mode=to_bool(get("persistence_mode")),
        ecc_mode_enabled=to_bool(get("ecc_mode")),
        ecc_volatile_uncorrectable_sram=vol_unc_sram,
        ecc_volatile_uncorrectable_dram=vol_unc_dram,
        ecc_volatile_uncorrectable_total=vol_unc_total,
        ecc_aggregate_uncorrectable_sram=agg_unc_sram,
        ecc_aggregate_uncorrectable_dram=agg_unc_dram,
        ecc_aggregate_uncorrectable_total=agg_unc_total,
        ecc_volatile_correctable_total=vol_corr_total,
        ecc_aggregate_correctable_total=agg_corr_total,
        sram_threshold_exceeded=to_bool(get("sram_threshold_exceeded")),
        retired_pages_sbe=to_int(get("retired_sbe")),
        retired_pages_dbe=to_int(get("retired_dbe")),
        retired_pages_pending=to_bool(get("retired_pending")),
        remapped_rows_correctable=to_int(get("remap_corr")),
        remapped_rows_uncorrectable=to_int(get("remap_unc")),
        remapped_rows_pending=to_bool(get("remap_pending")),
        remapped_rows_failure=to_bool(get("remap_failure")),
        reset_required=to_bool(get("reset_required")),
        drain_and_reset_recommended=to_bool(get("drain_and_reset")),
        recovery_action=recovery,
        clock_events=events,
        temperature_c=temp,
        memory_temperature_c=to_float(get("temp_mem")),
        temperature_slowdown_c=threshold("temp_slowdown", "temp_slowdown_tlimit"),
        temperature_shutdown_c=threshold("temp_shutdown", "temp_shutdown_tlimit"),
        temperature_max_operating_c=threshold("temp_max_op", "temp_max_op_tlimit"),
        power_draw_w=_first(
            to_float(get("power_draw")), to_float(get("power_draw_avg")), to_float(get("power_draw_instant"))
        ),
        power_limit_w=_first(
            to_float(get("power_enforced_limit")), to_float(get("power_current_limit")), to_float(get("power_limit"))
        ),
        pcie_gen_current=_first_int(to_int(get("pcie_gen_cur")), to_int(get("pcie_gen_gpucur"))),
        pcie_gen_max=_first_int(to_int(get("pcie_gen_max")), to_int(get("pcie_gen_gpumax"))),
        pcie_width_current=to_int(get("pcie_width_cur")),
        pcie_width_max=to_int(get("pcie_width_max")),
        fabric_state=clean(get("fabric_state")),
        fabric_status=clean(get("fabric_status")),
        utilization_gpu_pct=to_float(get("util_gpu")),
        unreachable=True if lost else None,
        unreachable_reason="nvidia-smi: this GPU's fields read 'GPU is lost'" if lost else None,
    )


# A garbled line (control characters, undecodable bytes): skipped by the text and CSV parsers.
GARBLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


# ---------------------------------------------------------------------------------------------------------------------
# GPUs nvidia-smi cannot reach

# nvidia-smi prints this (to stderr, so it lands anywhere in a 2>&1 capture) for each GPU the driver lists but cannot
# get a handle for, in every output format: "Unable to determine the device handle for GPU0000:3B:00.0: Unknown
# Error", "... for GPU 0000:0B:00.0: Unknown Error", "... for gpu 0000:3b:00.0: GPU is lost.  Reboot the system to
# recover this GPU". The classic symptom of a GPU that has fallen off the bus (Xid 79 in the kernel log).
LOST_MARKERS = re.compile(r"unable to determine the device handle|no devices were found", re.IGNORECASE)
_LOST_LINE = re.compile(
    r"^\s*Unable to determine the device handle for\s+(?:GPU|device)?\s*"
    r"(?P<bus>(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-7])\s*:?\s*(?P<reason>.*?)\s*$",
    re.IGNORECASE,
)
_NO_DEVICES = re.compile(r"^\s*No devices were found\.?\s*$", re.IGNORECASE)
MAX_LOST = 1024  # distinct unreachable GPUs kept from one capture (a node has a few dozen at most)
_LOST_CELL = {"gpu is lost", "[gpu is lost]"}


class LostGpus:
    """What nvidia-smi said about GPUs it could not reach: their bus ids and its words, and 'No devices were found'."""

    def __init__(self) -> None:
        self.gpus: dict[str, str] = {}  # normalised bus id -> nvidia-smi's line
        self.no_devices = False
        self.dropped = 0

    def snapshot(self, bus: str, *, index: int | None, driver: str | None, cuda: str | None) -> GpuSnapshot:
        return unreachable_gpu(index=index, bus=bus, driver=driver, cuda=cuda, reason=f"nvidia-smi: {self.gpus[bus]}")

    def warnings(self) -> list[str]:
        out = []
        if self.no_devices:
            out.append(
                "nvidia-smi says 'No devices were found': the driver is loaded but reaches no GPU. On a GPU node "
                "every GPU is lost (fallen off the bus) or unbound: count them with `lspci -d 10de:`, look for Xid "
                "79 in the kernel log (scan_kernel_log) and reboot the node"
            )
        if self.dropped:
            out.append(f"{self.dropped} more 'Unable to determine the device handle' line(s) beyond {MAX_LOST} GPUs")
        return out


def take_lost_lines(text: str) -> tuple[str, LostGpus]:
    """The text with nvidia-smi's lost-GPU lines blanked (line numbers kept), and what they said."""
    lost = LostGpus()
    if not LOST_MARKERS.search(text):
        return text, lost
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if len(line) > 512:
            continue
        match = _LOST_LINE.match(line)
        if match is not None:
            bus = normalise_bus_id(match.group("bus"))
            if bus is None:
                continue
            if bus not in lost.gpus and len(lost.gpus) >= MAX_LOST:
                lost.dropped += 1
            else:
                lost.gpus.setdefault(bus, " ".join(line.split()))
            lines[number] = ""
        elif _NO_DEVICES.match(line):
            lost.no_devices = True
            lines[number] = ""
    return "\n".join(lines), lost


def says_lost(fields: dict[str, str]) -> bool:
    """Whether nvidia-smi filled this GPU's cells with 'GPU is lost' (a handle that went bad after enumeration)."""
    return any(" ".join(v.strip().lower().split()) in _LOST_CELL for v in fields.values())


def merge_lost(
    gpus: list[GpuSnapshot],
    lost: LostGpus,
    *,
    positional: bool,
    driver: str | None,
    cuda: str | None,
    warnings: list[str],
) -> list[GpuSnapshot]:
    """The GPUs read, with the unreachable ones counted in.

    A bus id that also has a report is marked unreachable there. Where indexes are positions in the output
    (positional) and the reports are in PCI bus order, as nvidia-smi enumerates, the unreachable GPUs take their place
    in that order and every index is its position; otherwise they come last, index unknown, and a warning says the
    positions may not be nvidia-smi's indexes."""
    warnings.extend(lost.warnings())
    if not lost.gpus:
        return gpus
    by_bus = {g.pci_bus_id: g for g in gpus if g.pci_bus_id}
    out = list(gpus)
    missing = []
    for bus, line in lost.gpus.items():
        known = by_bus.get(bus)
        if known is not None:
            position = out.index(known)
            out[position] = known.model_copy(
                update={"unreachable": True, "unreachable_reason": f"nvidia-smi: {line} (it also printed a report)"}
            )
        else:
            missing.append(bus)
    if not missing:
        return out
    buses = [g.pci_bus_id for g in out]
    ordered = all(b is not None for b in buses) and buses == sorted(buses)  # type: ignore[type-var]
    if positional and ordered:
        merged = sorted(
            [(g.pci_bus_id or "", g) for g in out]
            + [(bus, lost.snapshot(bus, index=None, driver=driver, cuda=cuda)) for bus in missing],
            key=lambda pair: pair[0],
        )
        return [g.model_copy(update={"index": i}) for i, (_, g) in enumerate(merged)]
    if positional:
        warnings.append(
            f"{len(missing)} GPU(s) nvidia-smi could not reach are listed last with no index; the other GPUs' "
            "indexes are positions in this output and may not be nvidia-smi's"
        )
    return out + [lost.snapshot(bus, index=None, driver=driver, cuda=cuda) for bus in missing]
