"""nvidia-smi --query-gpu=... --format=csv, with or without header and units. Without a header the field names come
from the caller (`fields`, the --query-gpu list in order) or from a --query-gpu command line pasted with the rows."""

from __future__ import annotations

import csv
import re

from servers.core.errors import InputError
from servers.diagnostics.smi.common import ACCEPTED, GARBLE, LostGpus, SmiParse, merge_lost, to_bool, to_snapshot

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
QUERY_GPU = re.compile(r"--query-gpu[= ]([A-Za-z0-9_.,]+)")


def _field_name(cell: str) -> str:
    """'memory.used [MiB]' -> 'memory.used' (lowercase)."""
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", cell.strip()).lower()


def _known_field(name: str) -> bool:
    return name in _CSV_FIELDS or name in _CSV_CLOCK_FIELDS


def split_csv(line: str) -> list[str] | None:
    try:
        rows = list(csv.reader([line], skipinitialspace=True))
    except csv.Error:
        return None
    return [cell.strip() for cell in rows[0]] if rows else None


def looks_like_header(cells: list[str]) -> bool:
    """Every cell a field name (the last may be cut short, e.g. 'memory.used [Mi') and at least one known."""
    return (
        bool(cells)
        and all(_CSV_HEADER_CELL.match(c) for c in cells[:-1])
        and bool(not cells[-1] or _CSV_HEADER_CELL.match(cells[-1]) or _CSV_HEADER_CUT.match(cells[-1]))
        and any(_known_field(_field_name(c)) for c in cells)
    )


def csv_lines(text: str) -> tuple[list[str], list[str]]:
    """(data lines, comment lines): comments are lines starting with '#' (as in pasted captures)."""
    data, comments = [], []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        (comments if line.startswith("#") else data).append(line)
    return data, comments


def parse_csv(text: str, fields: list[str] | None, lost: LostGpus | None = None) -> SmiParse:
    lost = lost or LostGpus()
    warnings: list[str] = []
    lines, comments = csv_lines(text)
    if not lines and not (lost.gpus or lost.no_devices):
        raise InputError(f"no CSV rows found; {ACCEPTED}")
    header: list[str] | None = None
    rows: list[tuple[list[str], list[str]]] = []  # (the header in force, cells)
    skipped = 0
    for number, line in enumerate(lines, start=1):
        if GARBLE.search(line):
            skipped += 1
            continue
        cells = split_csv(line)
        if cells is None:
            skipped += 1
            continue
        if looks_like_header(cells):
            header = [_field_name(c) for c in cells]
            continue
        if header is None:
            if fields is None:
                from_comment = next((m.group(1) for c in comments if (m := QUERY_GPU.search(c))), None)
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
    if not rows and (lost.gpus or lost.no_devices):  # only a header (if any) and nvidia-smi's lines: none reached
        gpus = merge_lost([], lost, positional=False, driver=None, cuda=None, warnings=warnings)
        return SmiParse(format="csv", driver_version=None, cuda_version=None, gpus=gpus, warnings=warnings)
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
        snapshot = to_snapshot(values, index=position, driver=None, cuda=None, clocks=clocks)
        driver = driver or snapshot.driver_version
        gpus.append(snapshot)
    positional = not any("index" in names for names, _ in rows)
    gpus = merge_lost(gpus, lost, positional=positional, driver=driver, cuda=None, warnings=warnings)
    return SmiParse(format="csv", driver_version=driver, cuda_version=None, gpus=gpus, warnings=warnings)
