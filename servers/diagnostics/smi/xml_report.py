"""nvidia-smi -q -x (XML): read with a pull parser, refusing entity declarations and inline DTDs; every complete <gpu>
element before a cut or a syntax error is kept, with a warning."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from servers.core.errors import InputError
from servers.diagnostics.smi.common import (
    ACCEPTED,
    CLOCK_EVENT_BITS,
    LostGpus,
    SmiParse,
    clean,
    merge_lost,
    normalise_bus_id,
    says_lost,
    to_bool,
    to_int,
    to_snapshot,
)
from servers.diagnostics.snapshot import GpuSnapshot

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
    lost = False
    for canonical, paths in _XML_PATHS.items():
        for path in paths:
            value = _xml_text(gpu, path)
            if value is not None and clean(value) is not None:
                fields[canonical] = value
                break
            lost = lost or (value is not None and says_lost({canonical: value}))
    if lost:
        fields["gpu_is_lost"] = "GPU is lost"  # read by to_snapshot (says_lost), mapped to nothing else
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
    return to_snapshot(fields, index=position, driver=driver, cuda=cuda, clocks=clocks)


def parse_xml(text: str, lost: LostGpus | None = None) -> SmiParse:
    lost = lost or LostGpus()
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
    read_buses = {normalise_bus_id(_xml_text(el, "pci/pci_bus_id") or el.get("id")) for el in gpu_elements}
    unreached = sum(1 for bus in lost.gpus if bus not in read_buses)
    if attached is not None and attached > len(gpu_elements) + unreached:
        warnings.append(
            f"attached_gpus says {attached} but only {len(gpu_elements)} <gpu> element(s) were read; indexes are "
            "positions in this output"
        )
    gpus = [_xml_gpu(el, i, driver, cuda) for i, el in enumerate(gpu_elements)]
    gpus = merge_lost(gpus, lost, positional=True, driver=driver, cuda=cuda, warnings=warnings)
    return SmiParse(format="xml", driver_version=driver, cuda_version=cuda, gpus=gpus, warnings=warnings)
