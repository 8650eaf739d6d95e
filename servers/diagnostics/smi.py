"""Parse captured nvidia-smi output into GpuSnapshot objects. Plain module.

Three formats are recognised from the text itself:

- ``nvidia-smi -q`` (the indented text report), optionally followed by ``nvidia-smi nvlink --status`` output, whose
  per-link state is merged into the GPU with the same UUID (else the same index);
- ``nvidia-smi -q -x`` (XML);
- ``nvidia-smi --query-gpu=... --format=csv`` with or without header and units. Without a header the caller must
  pass ``fields`` (the --query-gpu list, in order).

Cells nvidia-smi cannot fill (``N/A``, ``[N/A]``, ``[Not Supported]``, ``[Requested functionality has been
deprecated]``, ``[Unknown Error]``, ...) become None, never zero. PCI bus ids are normalised to ``dddd:bb:dd.f``
(lowercase; nvidia-smi's 8-digit domain keeps its last 4 digits).

Temperatures: drivers from 535 on report thresholds as margins to T.Limit ("GPU T.Limit Temp" is how far the GPU is
below T.Limit; "GPU Slowdown T.Limit Temp: -2 C" means slowdown starts 2 C above T.Limit). They are converted to
absolute temperatures: threshold = current + margin - threshold_delta.

Every failure is an InputError whose message says what was wrong and which formats are accepted.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from typing import Literal

from pydantic import BaseModel, Field

from servers.core.errors import InputError
from servers.diagnostics.snapshot import GpuSnapshot

SmiFormat = Literal["q", "xml", "csv"]

MAX_TEXT_CHARS = 64 * 2**20
ACCEPTED = (
    "accepted: the text of `nvidia-smi -q` (optionally followed by `nvidia-smi nvlink --status`), "
    "`nvidia-smi -q -x` (XML), or `nvidia-smi --query-gpu=<fields> --format=csv` (with header, or with "
    "noheader and the fields given)"
)


class SmiParse(BaseModel):
    format: SmiFormat = Field(description="q (nvidia-smi -q text), xml (nvidia-smi -q -x) or csv (--query-gpu)")
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


def _snapshot(
    f: dict[str, str], *, index: int | None, driver: str | None, cuda: str | None, clocks: dict[str, bool]
) -> GpuSnapshot:
    """Build a snapshot from canonical field names (see the _Q_PATHS, _XML_PATHS and _CSV_FIELDS tables)."""
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
    )


def _norm_key(key: str) -> str:
    return " ".join(key.lower().split())


# ---------------------------------------------------------------------------------------------------------------------
# nvidia-smi -q (text)

_Q_PATHS: dict[tuple[str, ...], str] = {
    ("product name",): "name",
    ("gpu uuid",): "uuid",
    ("serial number",): "serial",
    ("vbios version",): "vbios_version",
    ("persistence mode",): "persistence_mode",
    ("pci", "bus id"): "pci_bus_id",
    ("fb memory usage", "total"): "memory_total",
    ("fb memory usage", "used"): "memory_used",
    ("ecc mode", "current"): "ecc_mode",
    ("ecc errors", "aggregate", "sram threshold exceeded"): "sram_threshold_exceeded",
    ("retired pages", "single bit ecc"): "retired_sbe",
    ("retired pages", "double bit ecc"): "retired_dbe",
    ("retired pages", "pending page blacklist"): "retired_pending",
    ("retired pages", "pending page retirement"): "retired_pending",
    ("retired pages", "pending"): "retired_pending",
    ("remapped rows", "correctable error"): "remap_corr",
    ("remapped rows", "uncorrectable error"): "remap_unc",
    ("remapped rows", "pending"): "remap_pending",
    ("remapped rows", "remapping failure occurred"): "remap_failure",
    ("gpu reset status", "reset required"): "reset_required",
    ("gpu reset status", "drain and reset recommended"): "drain_and_reset",
    ("gpu recovery action",): "recovery_action",
    ("gpu reset status", "gpu recovery action"): "recovery_action",
    ("temperature", "gpu current temp"): "temp_gpu",
    ("temperature", "memory current temp"): "temp_mem",
    ("temperature", "gpu shutdown temp"): "temp_shutdown",
    ("temperature", "gpu slowdown temp"): "temp_slowdown",
    ("temperature", "gpu max operating temp"): "temp_max_op",
    ("temperature", "gpu t.limit temp"): "temp_tlimit_margin",
    ("temperature", "gpu shutdown t.limit temp"): "temp_shutdown_tlimit",
    ("temperature", "gpu slowdown t.limit temp"): "temp_slowdown_tlimit",
    ("temperature", "gpu max operating t.limit temp"): "temp_max_op_tlimit",
    ("pci", "gpu link info", "pcie generation", "max"): "pcie_gen_max",
    ("pci", "gpu link info", "pcie generation", "current"): "pcie_gen_cur",
    ("pci", "gpu link info", "pcie generation", "device max"): "pcie_gen_gpumax",
    ("pci", "gpu link info", "pcie generation", "device current"): "pcie_gen_gpucur",
    ("pci", "gpu link info", "link width", "max"): "pcie_width_max",
    ("pci", "gpu link info", "link width", "current"): "pcie_width_cur",
    ("fabric", "state"): "fabric_state",
    ("fabric", "status"): "fabric_status",
    ("utilization", "gpu"): "util_gpu",
}
for _scope, _short in (("volatile", "vol"), ("aggregate", "agg")):
    _Q_PATHS.update(
        {
            ("ecc errors", _scope, "sram correctable"): f"ecc_{_short}_corr_sram",
            ("ecc errors", _scope, "sram uncorrectable"): f"ecc_{_short}_unc_sram",
            ("ecc errors", _scope, "sram uncorrectable parity"): f"ecc_{_short}_unc_sram_parity",
            ("ecc errors", _scope, "sram uncorrectable sec-ded"): f"ecc_{_short}_unc_sram_secded",
            ("ecc errors", _scope, "dram correctable"): f"ecc_{_short}_corr_dram",
            ("ecc errors", _scope, "dram uncorrectable"): f"ecc_{_short}_unc_dram",
            # pre-Ampere layout: Single Bit / Double Bit with per-location counts and a total
            ("ecc errors", _scope, "single bit", "device memory"): f"ecc_{_short}_corr_dram",
            ("ecc errors", _scope, "single bit", "total"): f"ecc_{_short}_corr_total",
            ("ecc errors", _scope, "double bit", "device memory"): f"ecc_{_short}_unc_dram",
            ("ecc errors", _scope, "double bit", "total"): f"ecc_{_short}_unc_total",
        }
    )
for _section in ("gpu power readings", "power readings"):
    _Q_PATHS.update(
        {
            (_section, "power draw"): "power_draw",
            (_section, "average power draw"): "power_draw_avg",
            (_section, "instantaneous power draw"): "power_draw_instant",
            (_section, "instant power draw"): "power_draw_instant",
            (_section, "enforced power limit"): "power_enforced_limit",
            (_section, "current power limit"): "power_current_limit",
            (_section, "power limit"): "power_limit",
        }
    )

_CLOCK_SECTIONS = ("clocks event reasons", "clocks throttle reasons")
_CLOCK_KEYS = {
    "idle": "idle",
    "gpu idle": "idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clock_setting",
    "display clocks setting": "display_clock_setting",
}

_Q_GPU_HEADER = re.compile(r"^GPU\s+((?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-7])\s*$")
_Q_KV = re.compile(r"^(?P<indent> *)(?P<key>[^:\s][^:]*?)\s*:(?:\s+(?P<value>.*?))?\s*$")
_Q_SECTION = re.compile(r"^(?P<indent> *)(?P<key>[^:\s][^:]*?)\s*$")
_NVLINK_GPU = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*(GPU-[0-9A-Fa-f-]+)\)\s*$")
_NVLINK_LINK = re.compile(r"^\s*Link\s+(\d+):\s*(.*?)\s*$")
_GARBLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


class _QBlock:
    def __init__(self, header_bus_id: str) -> None:
        self.header_bus_id = header_bus_id
        self.entries: list[tuple[tuple[str, ...], str | None]] = []
        self.last_was_section = False
        self.last_key: str | None = None

    def top_sections(self) -> set[str]:
        return {path[0] for path, _ in self.entries}


class _NvlinkBlock:
    def __init__(self, index: int, uuid: str) -> None:
        self.index = index
        self.uuid = uuid
        self.links: dict[int, str] = {}


def _parse_q(text: str) -> SmiParse:
    warnings: list[str] = []
    header: dict[str, str | None] = {}
    blocks: list[_QBlock] = []
    nvlinks: list[_NvlinkBlock] = []
    stack: list[tuple[int, str]] = []
    block: _QBlock | None = None
    nvlink: _NvlinkBlock | None = None
    garbled = 0
    for raw in text.splitlines():
        line = raw.expandtabs(8).rstrip()
        if not line.strip() or line.lstrip().startswith("==="):
            continue
        if _GARBLE.search(line):
            garbled += 1
            continue
        gpu = _Q_GPU_HEADER.match(line)
        if gpu:
            block = _QBlock(gpu.group(1))
            blocks.append(block)
            nvlink = None
            stack = []
            continue
        link_header = _NVLINK_GPU.match(line)
        if link_header:
            nvlink = _NvlinkBlock(int(link_header.group(1)), link_header.group(3))
            nvlinks.append(nvlink)
            block = None
            continue
        if nvlink is not None:
            link = _NVLINK_LINK.match(line)
            if link:
                nvlink.links[int(link.group(1))] = link.group(2)
            # other nvlink --status lines ("Link 0, P2P is supported", NVML messages) carry no state
            continue
        kv = _Q_KV.match(line)
        section = None if kv else _Q_SECTION.match(line)
        if kv is None and section is None:
            garbled += 1
            continue
        match = kv or section
        assert match is not None
        indent = len(match.group("indent"))
        key = _norm_key(match.group("key"))
        value = kv.group("value") if kv else None
        if block is None:
            if indent == 0 and kv is not None:
                header[key] = value
            continue
        if indent == 0:
            garbled += 1  # a stray line between GPU blocks
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(k for _, k in stack), key)
        stack.append((indent, key))
        block.entries.append((path, value))
        block.last_was_section = kv is None
        block.last_key = key

    if not blocks:
        raise InputError(
            f"this looks like `nvidia-smi -q` output but no 'GPU dddd:bb:dd.f' block was found; {ACCEPTED}"
        )
    if garbled:
        warnings.append(f"{garbled} garbled or unrecognised line(s) skipped")
    driver = clean(header.get("driver version"))
    cuda = clean(header.get("cuda version"))
    attached = to_int(header.get("attached gpus"))
    if attached is not None and attached > len(blocks):
        warnings.append(
            f"'Attached GPUs' says {attached} but only {len(blocks)} GPU block(s) are present: the output was cut "
            "short or filtered with -i; indexes are positions in this output"
        )
    if len(blocks) > 1:
        expected = blocks[0].top_sections()
        missing = sorted(expected - blocks[-1].top_sections())
        if missing:
            warnings.append(
                f"the last GPU block ({blocks[-1].header_bus_id}) looks cut short: it lacks "
                f"{len(missing)} section(s) the first block has ({', '.join(missing[:5])}"
                f"{', ...' if len(missing) > 5 else ''})"
            )
    if blocks[-1].last_was_section:
        warnings.append(
            f"the output ends inside GPU block {blocks[-1].header_bus_id} (section '{blocks[-1].last_key}' "
            "has no lines): it was probably cut short"
        )

    gpus = []
    for position, qb in enumerate(blocks):
        fields: dict[str, str] = {}
        clocks: dict[str, bool] = {}
        for path, value in qb.entries:
            if value is None:
                continue
            canonical = _Q_PATHS.get(path)
            if canonical is not None:
                fields.setdefault(canonical, value)
            elif path[0] in _CLOCK_SECTIONS and path[-1] in _CLOCK_KEYS:
                state = to_bool(value)
                if state is not None:
                    clocks[_CLOCK_KEYS[path[-1]]] = state
        fields.setdefault("pci_bus_id", qb.header_bus_id)
        gpus.append(_snapshot(fields, index=position, driver=driver, cuda=cuda, clocks=clocks))
    if nvlinks:
        _merge_nvlink(gpus, nvlinks, warnings)
    return SmiParse(format="q", driver_version=driver, cuda_version=cuda, gpus=gpus, warnings=warnings)


def _merge_nvlink(gpus: list[GpuSnapshot], nvlinks: list[_NvlinkBlock], warnings: list[str]) -> None:
    by_uuid = {g.uuid.lower(): g for g in gpus if g.uuid}
    by_index = {g.index: g for g in gpus if g.index is not None}
    for nb in nvlinks:
        target = by_uuid.get(nb.uuid.lower()) or (by_index.get(nb.index) if not by_uuid else None)
        if target is None:
            warnings.append(f"nvlink --status block for GPU {nb.index} ({nb.uuid}) matches no GPU block; skipped")
            continue
        if not nb.links:
            continue  # "Unable to retrieve NVLink information": unknown, not down
        if nb is nvlinks[-1] and len(nvlinks) > 1 and len(nb.links) < max(len(b.links) for b in nvlinks):
            warnings.append(
                f"the nvlink --status block of GPU {nb.index} lists fewer links than the others: the output was "
                "probably cut short"
            )
        down = sorted(n for n, state in nb.links.items() if "inactive" in state.lower())
        target.nvlink_links_total = len(nb.links)
        target.nvlink_links_down = down


# ---------------------------------------------------------------------------------------------------------------------
# nvidia-smi -q -x (XML)

_XML_PATHS: dict[str, tuple[str, ...]] = {
    "name": ("product_name",),
    "uuid": ("uuid",),
    "serial": ("serial",),
    "vbios_version": ("vbios_version",),
    "persistence_mode": ("persistence_mode",),
    "pci_bus_id": ("pci/pci_bus_id",),
    "memory_total": ("fb_memory_usage/total",),
    "memory_used": ("fb_memory_usage/used",),
    "ecc_mode": ("ecc_mode/current_ecc",),
    "sram_threshold_exceeded": ("ecc_errors/aggregate/sram_threshold_exceeded",),
    "retired_sbe": ("retired_pages/multiple_single_bit_retirement/retired_count",),
    "retired_dbe": ("retired_pages/double_bit_retirement/retired_count",),
    "retired_pending": ("retired_pages/pending_retirement", "retired_pages/pending_blacklist"),
    "remap_corr": ("remapped_rows/remapped_row_corr",),
    "remap_unc": ("remapped_rows/remapped_row_unc",),
    "remap_pending": ("remapped_rows/remapped_row_pending",),
    "remap_failure": ("remapped_rows/remapped_row_failure",),
    "reset_required": ("gpu_reset_status/reset_required",),
    "drain_and_reset": ("gpu_reset_status/drain_and_reset_recommended",),
    "recovery_action": ("gpu_recovery_action",),
    "temp_gpu": ("temperature/gpu_temp",),
    "temp_mem": ("temperature/memory_temp",),
    "temp_shutdown": ("temperature/gpu_temp_max_threshold",),
    "temp_slowdown": ("temperature/gpu_temp_slow_threshold",),
    "temp_max_op": ("temperature/gpu_temp_max_gpu_threshold",),
    "temp_tlimit_margin": ("temperature/gpu_temp_tlimit",),
    "temp_shutdown_tlimit": ("temperature/gpu_temp_max_tlimit_threshold",),
    "temp_slowdown_tlimit": ("temperature/gpu_temp_slow_tlimit_threshold",),
    "temp_max_op_tlimit": ("temperature/gpu_temp_max_gpu_tlimit_threshold",),
    "power_draw": ("gpu_power_readings/power_draw", "power_readings/power_draw"),
    "power_draw_avg": ("gpu_power_readings/average_power_draw", "power_readings/average_power_draw"),
    "power_draw_instant": ("gpu_power_readings/instant_power_draw", "power_readings/instant_power_draw"),
    "power_enforced_limit": ("gpu_power_readings/enforced_power_limit", "power_readings/enforced_power_limit"),
    "power_current_limit": ("gpu_power_readings/current_power_limit", "power_readings/current_power_limit"),
    "power_limit": ("gpu_power_readings/power_limit", "power_readings/power_limit"),
    "pcie_gen_max": ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",),
    "pcie_gen_cur": ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",),
    "pcie_gen_gpumax": ("pci/pci_gpu_link_info/pcie_gen/max_device_link_gen",),
    "pcie_gen_gpucur": ("pci/pci_gpu_link_info/pcie_gen/device_current_link_gen",),
    "pcie_width_max": ("pci/pci_gpu_link_info/link_widths/max_link_width",),
    "pcie_width_cur": ("pci/pci_gpu_link_info/link_widths/current_link_width",),
    "fabric_state": ("fabric/state",),
    "fabric_status": ("fabric/status",),
    "util_gpu": ("utilization/gpu_util",),
}
for _scope, _short in (("volatile", "vol"), ("aggregate", "agg")):
    _XML_PATHS.update(
        {
            f"ecc_{_short}_corr_sram": (f"ecc_errors/{_scope}/sram_correctable",),
            f"ecc_{_short}_unc_sram": (f"ecc_errors/{_scope}/sram_uncorrectable",),
            f"ecc_{_short}_unc_sram_parity": (f"ecc_errors/{_scope}/sram_uncorrectable_parity",),
            f"ecc_{_short}_unc_sram_secded": (f"ecc_errors/{_scope}/sram_uncorrectable_secded",),
            f"ecc_{_short}_corr_dram": (
                f"ecc_errors/{_scope}/dram_correctable",
                f"ecc_errors/{_scope}/single_bit/device_memory",
            ),
            f"ecc_{_short}_unc_dram": (
                f"ecc_errors/{_scope}/dram_uncorrectable",
                f"ecc_errors/{_scope}/double_bit/device_memory",
            ),
            f"ecc_{_short}_corr_total": (f"ecc_errors/{_scope}/single_bit/total",),
            f"ecc_{_short}_unc_total": (f"ecc_errors/{_scope}/double_bit/total",),
        }
    )

_DOCTYPE = re.compile(r"<!DOCTYPE\b", re.IGNORECASE)
_ENTITY = re.compile(r"<!ENTITY\b", re.IGNORECASE)
_DOCTYPE_SUBSET = re.compile(r"<!DOCTYPE[^>\[]*\[", re.IGNORECASE)


def _xml_text(gpu: ET.Element, path: str) -> str | None:
    child = gpu.find(path)
    if child is None or child.text is None:
        return None
    return child.text


def _xml_gpu(gpu: ET.Element, position: int, driver: str | None, cuda: str | None) -> GpuSnapshot:
    fields: dict[str, str] = {}
    for canonical, paths in _XML_PATHS.items():
        for path in paths:
            value = _xml_text(gpu, path)
            if value is not None and clean(value) is not None:
                fields[canonical] = value
                break
    if "pci_bus_id" not in fields and gpu.get("id"):
        fields["pci_bus_id"] = gpu.get("id", "")
    clocks: dict[str, bool] = {}
    for section, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        element = gpu.find(section)
        if element is None:
            continue
        for child in element:
            tag = child.tag
            if not isinstance(tag, str) or not tag.startswith(prefix):
                continue
            name = tag[len(prefix) :]
            name = {"gpu_idle": "idle", "display_clocks_setting": "display_clock_setting"}.get(name, name)
            state = to_bool(child.text)
            if name in CLOCK_EVENT_BITS and state is not None:
                clocks[name] = state
        if clocks:
            break
    return _snapshot(fields, index=position, driver=driver, cuda=cuda, clocks=clocks)


def _parse_xml(text: str) -> SmiParse:
    if _ENTITY.search(text) or _DOCTYPE_SUBSET.search(text):
        raise InputError(
            f"XML with ENTITY declarations or an inline DTD is refused (nvidia-smi -q -x never writes one); {ACCEPTED}"
        )
    if len(_DOCTYPE.findall(text)) > 1:
        raise InputError(f"XML with more than one DOCTYPE is refused; {ACCEPTED}")
    warnings: list[str] = []
    parser = ET.XMLPullParser(events=("start", "end"))
    depth = 0
    root_tag: str | None = None
    top: dict[str, str | None] = {}
    gpu_elements: list[ET.Element] = []
    error: str | None = None
    try:
        parser.feed(text)
        parser.close()
    except ET.ParseError as exc:
        error = str(exc)
    except (UnicodeError, ValueError) as exc:
        error = f"undecodable text ({exc})"
    # Events queued before the error are still readable: salvage every GPU element that was complete.
    try:
        for event, element in parser.read_events():
            if event == "start":
                depth += 1
                if depth == 1:
                    root_tag = element.tag if isinstance(element.tag, str) else None
                continue
            depth -= 1
            if depth == 1 and root_tag == "nvidia_smi_log":
                if element.tag == "gpu":
                    gpu_elements.append(element)
                elif isinstance(element.tag, str):
                    top[element.tag] = element.text
    except ET.ParseError as exc:  # raised here when feed() stored an error after the events before it
        error = error or str(exc)
    if root_tag is None:
        raise InputError(f"the XML could not be read ({error or 'no root element'}); {ACCEPTED}")
    if root_tag != "nvidia_smi_log":
        raise InputError(f"the XML root is <{root_tag}>, not <nvidia_smi_log> as nvidia-smi -q -x writes; {ACCEPTED}")
    if error is not None:
        if not gpu_elements:
            raise InputError(f"the XML is malformed or cut short before the first complete <gpu> ({error}); {ACCEPTED}")
        warnings.append(
            f"the XML is malformed or cut short ({error}); kept the {len(gpu_elements)} complete <gpu> element(s)"
        )
    if not gpu_elements:
        raise InputError(f"the nvidia-smi XML has no <gpu> element; {ACCEPTED}")
    driver = clean(top.get("driver_version"))
    cuda = clean(top.get("cuda_version"))
    attached = to_int(top.get("attached_gpus"))
    if attached is not None and attached > len(gpu_elements):
        warnings.append(
            f"attached_gpus says {attached} but only {len(gpu_elements)} <gpu> element(s) were read; indexes are "
            "positions in this output"
        )
    gpus = [_xml_gpu(el, i, driver, cuda) for i, el in enumerate(gpu_elements)]
    return SmiParse(format="xml", driver_version=driver, cuda_version=cuda, gpus=gpus, warnings=warnings)


# ---------------------------------------------------------------------------------------------------------------------
# --query-gpu CSV

_CSV_FIELDS: dict[str, str] = {
    "index": "index",
    "name": "name",
    "gpu_name": "name",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "serial": "serial",
    "gpu_serial": "serial",
    "pci.bus_id": "pci_bus_id",
    "gpu_bus_id": "pci_bus_id",
    "driver_version": "driver_version",
    "vbios_version": "vbios_version",
    "persistence_mode": "persistence_mode",
    "memory.total": "memory_total",
    "memory.used": "memory_used",
    "ecc.mode.current": "ecc_mode",
    "ecc.errors.uncorrected.aggregate.sram.thresholdexceeded": "sram_threshold_exceeded",
    "retired_pages.sbe": "retired_sbe",
    "retired_pages.single_bit_ecc.count": "retired_sbe",
    "retired_pages.dbe": "retired_dbe",
    "retired_pages.double_bit.count": "retired_dbe",
    "retired_pages.pending": "retired_pending",
    "remapped_rows.correctable": "remap_corr",
    "remapped_rows.uncorrectable": "remap_unc",
    "remapped_rows.pending": "remap_pending",
    "remapped_rows.failure": "remap_failure",
    "reset_status.reset_required": "reset_required",
    "reset_status.drain_and_reset_recommended": "drain_and_reset",
    "gpu_recovery_action": "recovery_action",
    "temperature.gpu": "temp_gpu",
    "temperature.memory": "temp_mem",
    "temperature.gpu.tlimit": "temp_tlimit_margin",
    "power.draw": "power_draw",
    "power.draw.average": "power_draw_avg",
    "power.draw.instant": "power_draw_instant",
    "enforced.power.limit": "power_enforced_limit",
    "power.limit": "power_limit",
    "pcie.link.gen.current": "pcie_gen_cur",
    "pcie.link.gen.gpucurrent": "pcie_gen_gpucur",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.gen.gpumax": "pcie_gen_gpumax",
    "pcie.link.width.current": "pcie_width_cur",
    "pcie.link.width.max": "pcie_width_max",
    "fabric.state": "fabric_state",
    "fabric.status": "fabric_status",
    "utilization.gpu": "util_gpu",
    "clocks_event_reasons.active": "clk_active_mask",
    "clocks_throttle_reasons.active": "clk_active_mask",
}
for _scope, _short in (("volatile", "vol"), ("aggregate", "agg")):
    for _kind, _k in (("uncorrected", "unc"), ("corrected", "corr")):
        _CSV_FIELDS.update(
            {
                f"ecc.errors.{_kind}.{_scope}.total": f"ecc_{_short}_{_k}_total",
                f"ecc.errors.{_kind}.{_scope}.dram": f"ecc_{_short}_{_k}_dram",
                f"ecc.errors.{_kind}.{_scope}.device_memory": f"ecc_{_short}_{_k}_dram",
                f"ecc.errors.{_kind}.{_scope}.sram": f"ecc_{_short}_{_k}_sram",
            }
        )
_CSV_CLOCK_FIELDS = {
    f"{prefix}.{name}": key
    for prefix in ("clocks_event_reasons", "clocks_throttle_reasons")
    for name, key in {
        "gpu_idle": "idle",
        "applications_clocks_setting": "applications_clocks_setting",
        "sw_power_cap": "sw_power_cap",
        "hw_slowdown": "hw_slowdown",
        "hw_thermal_slowdown": "hw_thermal_slowdown",
        "hw_power_brake_slowdown": "hw_power_brake_slowdown",
        "sw_thermal_slowdown": "sw_thermal_slowdown",
        "sync_boost": "sync_boost",
        "display_clocks_setting": "display_clock_setting",
    }.items()
}
_CSV_HEADER_CELL = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(?:\s*\[[^\]]*\])?$")
_CSV_HEADER_CUT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*\s*\[[^\]]*$")
_QUERY_GPU = re.compile(r"--query-gpu[= ]([A-Za-z0-9_.,]+)")


def _field_name(cell: str) -> str:
    """'memory.used [MiB]' -> 'memory.used' (lowercase)."""
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", cell.strip()).lower()


def _known_field(name: str) -> bool:
    return name in _CSV_FIELDS or name in _CSV_CLOCK_FIELDS


def _split_csv(line: str) -> list[str] | None:
    try:
        rows = list(csv.reader([line], skipinitialspace=True))
    except csv.Error:
        return None
    return [cell.strip() for cell in rows[0]] if rows else None


def _looks_like_header(cells: list[str]) -> bool:
    """Every cell a field name (the last may be cut short, e.g. 'memory.used [Mi') and at least one known."""
    return (
        bool(cells)
        and all(_CSV_HEADER_CELL.match(c) for c in cells[:-1])
        and bool(not cells[-1] or _CSV_HEADER_CELL.match(cells[-1]) or _CSV_HEADER_CUT.match(cells[-1]))
        and any(_known_field(_field_name(c)) for c in cells)
    )


def _csv_lines(text: str) -> tuple[list[str], list[str]]:
    """(data lines, comment lines): comments are lines starting with '#' (as in pasted captures)."""
    data, comments = [], []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        (comments if line.startswith("#") else data).append(line)
    return data, comments


def _parse_csv(text: str, fields: list[str] | None) -> SmiParse:
    warnings: list[str] = []
    lines, comments = _csv_lines(text)
    if not lines:
        raise InputError(f"no CSV rows found; {ACCEPTED}")
    header: list[str] | None = None
    rows: list[tuple[list[str], list[str]]] = []  # (the header in force, cells)
    skipped = 0
    for number, line in enumerate(lines, start=1):
        if _GARBLE.search(line):
            skipped += 1
            continue
        cells = _split_csv(line)
        if cells is None:
            skipped += 1
            continue
        if _looks_like_header(cells):
            header = [_field_name(c) for c in cells]
            continue
        if header is None:
            if fields is None:
                from_comment = next((m.group(1) for c in comments if (m := _QUERY_GPU.search(c))), None)
                if from_comment is None:
                    raise InputError(
                        "this CSV has no header row: pass `fields`, the --query-gpu field names in the order they "
                        "were queried (e.g. ['index', 'uuid', 'temperature.gpu']), or capture it again with "
                        "--format=csv (with header)"
                    )
                fields = [f for f in from_comment.split(",") if f]
                warnings.append("no header row: took the field names from the --query-gpu command line in the text")
            header = [_field_name(f) for f in fields]
        if len(cells) != len(header):
            warnings.append(
                f"CSV line {number} has {len(cells)} cell(s) but the header has {len(header)}: skipped "
                "(cut short or garbled?)"
            )
            continue
        rows.append((header, cells))
    if skipped:
        warnings.append(f"{skipped} garbled line(s) skipped")
    if header is None and fields is not None:
        header = [_field_name(f) for f in fields]
    if not rows:
        raise InputError(f"the CSV has no GPU rows (only a header or nothing readable); {ACCEPTED}")
    assert header is not None
    if not any(_known_field(h) for h in header):
        raise InputError(
            f"none of the CSV fields ({', '.join(header[:8])}) is a --query-gpu field this parser knows; {ACCEPTED}"
        )
    gpus = []
    driver: str | None = None
    for position, (names, cells) in enumerate(rows):
        values: dict[str, str] = {}
        clocks: dict[str, bool] = {}
        for name, cell in zip(names, cells, strict=True):
            canonical = _CSV_FIELDS.get(name)
            if canonical is not None:
                values.setdefault(canonical, cell)
            elif name in _CSV_CLOCK_FIELDS:
                state = to_bool(cell)
                if state is not None:
                    clocks[_CSV_CLOCK_FIELDS[name]] = state
        snapshot = _snapshot(values, index=position, driver=None, cuda=None, clocks=clocks)
        driver = driver or snapshot.driver_version
        gpus.append(snapshot)
    return SmiParse(format="csv", driver_version=driver, cuda_version=None, gpus=gpus, warnings=warnings)


# ---------------------------------------------------------------------------------------------------------------------
# entry point

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
    if stripped.startswith("<"):
        return _parse_xml(stripped)
    if _Q_MARKERS.search(stripped):
        return _parse_q(stripped)
    lines, _ = _csv_lines(stripped)
    first = _split_csv(lines[0]) if lines else None
    if first is not None and (_looks_like_header(first) or fields is not None or any("," in ln for ln in lines)):
        return _parse_csv(stripped, fields)
    if lines and any(_QUERY_GPU.search(c) for c in _csv_lines(stripped)[1]):
        return _parse_csv(stripped, fields)
    raise InputError(f"unrecognised nvidia-smi output (no GPU found); {ACCEPTED}")
