"""nvidia-smi -q (the indented text report), optionally followed by nvidia-smi nvlink --status output, whose per-link
state is merged into the GPU with the same UUID (else the same index)."""

from __future__ import annotations

import re

from servers.core.errors import InputError
from servers.diagnostics.smi.common import (
    ACCEPTED,
    GARBLE,
    LostGpus,
    SmiParse,
    clean,
    merge_lost,
    normalise_bus_id,
    to_bool,
    to_int,
    to_snapshot,
)
from servers.diagnostics.snapshot import GpuSnapshot

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


def parse_q(text: str, lost: LostGpus | None = None) -> SmiParse:
    lost = lost or LostGpus()
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
        if GARBLE.search(line):
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

    if not blocks and (lost.gpus or lost.no_devices):  # a report of no GPU block: only nvidia-smi's error lines
        driver, cuda = clean(header.get("driver version")), clean(header.get("cuda version"))
        gpus = merge_lost([], lost, positional=False, driver=driver, cuda=cuda, warnings=warnings)
        return SmiParse(format="q", driver_version=driver, cuda_version=cuda, gpus=gpus, warnings=warnings)
    if not blocks:
        raise InputError(
            f"this looks like `nvidia-smi -q` output but no 'GPU dddd:bb:dd.f' block was found; {ACCEPTED}"
        )
    if garbled:
        warnings.append(f"{garbled} garbled or unrecognised line(s) skipped")
    driver = clean(header.get("driver version"))
    cuda = clean(header.get("cuda version"))
    attached = to_int(header.get("attached gpus"))
    unreached = sum(1 for bus in lost.gpus if bus not in {normalise_bus_id(b.header_bus_id) for b in blocks})
    if attached is not None and attached > len(blocks) + unreached:
        warnings.append(
            f"'Attached GPUs' says {attached} but only {len(blocks)} GPU block(s) are present"
            + (f" and {unreached} GPU(s) nvidia-smi could not reach" if unreached else "")
            + ": the output was cut short or filtered with -i; indexes are positions in this output"
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
        gpus.append(to_snapshot(fields, index=position, driver=driver, cuda=cuda, clocks=clocks))
    if nvlinks:
        _merge_nvlink(gpus, nvlinks, warnings)
    gpus = merge_lost(gpus, lost, positional=True, driver=driver, cuda=cuda, warnings=warnings)
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


def _norm_key(key: str) -> str:
    return " ".join(key.lower().split())
