"""Health rules: what a GpuSnapshot says about a GPU, as findings with evidence and an action. Plain module.

Unknown fields (None) never trigger a rule; they only make the status "unknown" when the key fields (ECC or
row-remap counters, and temperature) are missing. Status: unhealthy if any critical finding, degraded if any
warning, healthy if neither and the key fields are known, else unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from servers.core.errors import InputError
from servers.diagnostics import findings
from servers.diagnostics.bounds import MAX_LINE_TEXT, clip_str
from servers.diagnostics.findings import SEVERITY_RANK, CheckReport, GpuRef, Severity, Status, normalise_bus_id
from servers.diagnostics.snapshot import Finding, GpuHealth, GpuSnapshot

TEMPERATURE_MARGIN_C = 5.0
RETIRED_PAGES_LIMIT = 60  # NVIDIA: a board with 60 or more retired pages qualifies for RMA

_INTERCONNECTS = {"nvlink": "nvlink", "nvswitch": "nvlink", "pcie": "pcie", "pci": "pcie", "none": "pcie"}

# GPU recovery action as the driver names it (nvidia-smi text, or NVML enum names with "_" read as spaces) -> advice.
_RESET = "Stop the jobs on this GPU and reset it (nvidia-smi -r -i <index>, or let the scheduler's epilog do it)."
_REBOOT = "Drain the node and reboot it."
_RECOVERY_ADVICE = {
    "reset": _RESET,
    "gpu reset": _RESET,
    "reboot": _REBOOT,
    "node reboot": _REBOOT,
    "drain p2p": "Stop peer-to-peer (NVLink/P2P) traffic: drain the jobs using this GPU so the driver can clear the "
    "state.",
    "drain and reset": "Drain the jobs on this GPU, then reset it.",
    "recover imex domain": "Recover the IMEX domain (restart the IMEX daemons of the NVLink domain).",
    "bus reset": "Drain the GPU and perform a PCIe bus reset (or reboot the node).",
    "system reboot": "Drain the node and power-cycle or reboot the whole system.",
}


def _finding(check: str, what: str, severity: Severity, evidence: str, action: str) -> Finding:
    return Finding(check=check, what=what, severity=severity, evidence=evidence, action=action)


def _positive(value: int | float | None) -> bool:
    return value is not None and value > 0


def _nvlink_applies(gpu: GpuSnapshot, expected: str | None) -> bool:
    """Whether NVLink links that read 'down' mean something: on PCIe cards without NVLink every link reads inactive."""
    if expected is not None:
        return expected == "nvlink"
    total, down = gpu.nvlink_links_total, gpu.nvlink_links_down or []
    if total is not None and total > len(down):
        return True  # some links are up, so this GPU does use NVLink: the down ones are real
    if gpu.name:
        from servers.core.gpus import find_gpu

        try:
            return find_gpu(gpu.name).interconnect == "nvlink"
        except InputError:
            return False
    return False


def _ecc(gpu: GpuSnapshot, findings: list[Finding]) -> None:
    volatile = {
        "ecc_volatile_uncorrectable_total": gpu.ecc_volatile_uncorrectable_total,
        "ecc_volatile_uncorrectable_dram": gpu.ecc_volatile_uncorrectable_dram,
        "ecc_volatile_uncorrectable_sram": gpu.ecc_volatile_uncorrectable_sram,
    }
    hits = {k: v for k, v in volatile.items() if _positive(v)}
    if hits:
        findings.append(
            _finding(
                "ecc_uncorrectable_volatile",
                "Uncorrectable ECC errors since the last driver load or reset: data on this GPU may be corrupt.",
                "critical",
                ", ".join(f"{k}={v}" for k, v in hits.items()),
                "Stop the jobs on this GPU (their results are suspect), then reset the GPU (nvidia-smi -r) or drain "
                "and reboot the node; if errors return after the reset, check remapped rows and contact NVIDIA "
                "support.",
            )
        )
    aggregate = {
        "ecc_aggregate_uncorrectable_total": gpu.ecc_aggregate_uncorrectable_total,
        "ecc_aggregate_uncorrectable_dram": gpu.ecc_aggregate_uncorrectable_dram,
    }
    hits = {k: v for k, v in aggregate.items() if _positive(v)}
    if hits:
        with_failure = gpu.remapped_rows_failure is True
        evidence = ", ".join(f"{k}={v}" for k, v in hits.items())
        findings.append(
            _finding(
                "ecc_uncorrectable_aggregate",
                "Uncorrectable ECC errors over the GPU's lifetime"
                + (", and row remapping has failed." if with_failure else "."),
                "critical" if with_failure else "warning",
                evidence + (", remapped_rows_failure=True" if with_failure else ""),
                "Replace the GPU (RMA): its memory can no longer be repaired by row remapping."
                if with_failure
                else "Watch the trend; confirm the rows were remapped (remapped_rows_pending=False) and run "
                "`dcgmi diag -r 3` when the GPU is free.",
            )
        )
    sram = {
        "ecc_volatile_uncorrectable_sram": gpu.ecc_volatile_uncorrectable_sram,
        "ecc_aggregate_uncorrectable_sram": gpu.ecc_aggregate_uncorrectable_sram,
    }
    hits = {k: v for k, v in sram.items() if _positive(v)}
    if hits:
        findings.append(
            _finding(
                "ecc_sram_uncorrectable",
                "Uncorrectable ECC errors in on-chip SRAM (caches, register files): SRAM cannot be remapped.",
                "critical",
                ", ".join(f"{k}={v}" for k, v in hits.items()),
                "Reset the GPU and rerun the job; NVIDIA's guidance is to contact support / RMA the GPU when the "
                "SRAM error threshold is exceeded (sram_threshold_exceeded).",
            )
        )
    if gpu.sram_threshold_exceeded is True:
        findings.append(
            _finding(
                "ecc_sram_threshold_exceeded",
                "The GPU's SRAM uncorrectable-error threshold is exceeded.",
                "critical",
                "sram_threshold_exceeded=True",
                "Drain the GPU and contact NVIDIA support for an RMA.",
            )
        )


def _memory_repair(gpu: GpuSnapshot, findings: list[Finding]) -> None:
    if gpu.remapped_rows_failure is True:
        findings.append(
            _finding(
                "row_remap_failure",
                "Row remapping failed: the GPU ran out of spare rows or could not remap a faulty one.",
                "critical",
                f"remapped_rows_failure=True, remapped_rows_uncorrectable={gpu.remapped_rows_uncorrectable}",
                "Drain the GPU and replace it (RMA).",
            )
        )
    if gpu.remapped_rows_pending is True:
        findings.append(
            _finding(
                "row_remap_pending",
                "A row remap is pending: the faulty memory row stays in service until the GPU is reset.",
                "warning",
                f"remapped_rows_pending=True, remapped_rows_uncorrectable={gpu.remapped_rows_uncorrectable}",
                "Reset the GPU (nvidia-smi -r, or reboot) when it is idle to apply the remap.",
            )
        )
    retired = None
    if gpu.retired_pages_sbe is not None or gpu.retired_pages_dbe is not None:
        retired = (gpu.retired_pages_sbe or 0) + (gpu.retired_pages_dbe or 0)
    evidence = (
        f"retired_pages_sbe={gpu.retired_pages_sbe}, retired_pages_dbe={gpu.retired_pages_dbe}, "
        f"retired_pages_pending={gpu.retired_pages_pending}"
    )
    if retired is not None and retired >= RETIRED_PAGES_LIMIT:
        findings.append(
            _finding(
                "retired_pages_high",
                f"{retired} memory pages are retired (NVIDIA's RMA threshold is {RETIRED_PAGES_LIMIT}).",
                "critical",
                evidence,
                "Drain the GPU and request an RMA.",
            )
        )
    if gpu.retired_pages_pending is True:
        findings.append(
            _finding(
                "retired_pages_pending",
                "Pages are waiting to be retired: they stay in use until the driver is reloaded.",
                "warning",
                evidence,
                "Reset the GPU or reboot the node when it is idle so the pages are retired.",
            )
        )


def _reset_and_recovery(gpu: GpuSnapshot, findings: list[Finding]) -> None:
    if gpu.reset_required is True:
        findings.append(
            _finding(
                "reset_required",
                "The driver says this GPU needs a reset before it can be used reliably.",
                "critical",
                "reset_required=True",
                "Stop the jobs on this GPU and reset it (nvidia-smi -r -i <index>) or reboot the node.",
            )
        )
    if gpu.drain_and_reset_recommended is True:
        findings.append(
            _finding(
                "drain_and_reset_recommended",
                "The driver recommends draining this GPU's work and resetting it.",
                "critical",
                "drain_and_reset_recommended=True",
                "Drain the jobs on this GPU, then reset it.",
            )
        )
    action = (gpu.recovery_action or "").strip()
    if action and action.lower() not in {"none", "0", "0x0", "n/a"}:
        advice = _RECOVERY_ADVICE.get(
            " ".join(action.lower().replace("_", " ").split()),
            "Follow the driver's recovery action (see NVIDIA's GPU recovery documentation).",
        )
        findings.append(
            _finding(
                "recovery_action",
                f"The driver asks for a recovery action: {action}.",
                "critical",
                f"recovery_action={action}",
                advice,
            )
        )


def _clocks_and_thermals(gpu: GpuSnapshot, findings: list[Finding]) -> None:
    events = gpu.clock_events
    thermal = events.get("hw_thermal_slowdown") is True
    brake = events.get("hw_power_brake_slowdown") is True
    if thermal:
        findings.append(
            _finding(
                "hw_thermal_slowdown",
                "Hardware thermal slowdown is active: the GPU is cutting its clocks because it is too hot.",
                "warning",
                f"clock_events.hw_thermal_slowdown=True, temperature_c={gpu.temperature_c}",
                "Check the cooling: fans, airflow, inlet temperature, heatsink contact and the liquid loop.",
            )
        )
    if brake:
        findings.append(
            _finding(
                "hw_power_brake_slowdown",
                "Hardware power-brake slowdown is active: the system asserted the power brake signal.",
                "warning",
                "clock_events.hw_power_brake_slowdown=True",
                "Check the power supplies (a failed or missing PSU, PSU redundancy lost) and the chassis power "
                "capping with the server vendor's BMC.",
            )
        )
    if events.get("hw_slowdown") is True and not (thermal or brake):
        findings.append(
            _finding(
                "hw_slowdown",
                "Hardware slowdown is active: clocks are cut by a hardware signal (thermal or power).",
                "warning",
                "clock_events.hw_slowdown=True",
                "Check the cooling and the power supplies; the BMC's event log usually names the cause.",
            )
        )
    if events.get("sw_thermal_slowdown") is True:
        hot = (
            gpu.temperature_c is not None
            and gpu.temperature_max_operating_c is not None
            and gpu.temperature_c >= gpu.temperature_max_operating_c
        )
        findings.append(
            _finding(
                "sw_thermal_slowdown",
                "Software thermal slowdown is active: the driver lowers clocks to stay under the maximum "
                "operating temperature.",
                "warning" if hot else "info",
                f"clock_events.sw_thermal_slowdown=True, temperature_c={gpu.temperature_c}, "
                f"temperature_max_operating_c={gpu.temperature_max_operating_c}",
                "Check the cooling if it persists under load; brief activations are normal.",
            )
        )
    temp, slowdown = gpu.temperature_c, gpu.temperature_slowdown_c
    if temp is not None and slowdown is not None:
        if temp >= slowdown:
            findings.append(
                _finding(
                    "temperature_at_slowdown",
                    f"The GPU is at {temp:g} C, at or above its slowdown temperature ({slowdown:g} C).",
                    "critical",
                    f"temperature_c={temp:g}, temperature_slowdown_c={slowdown:g}",
                    f"Reduce the load and fix the cooling now; the GPU shuts down at {gpu.temperature_shutdown_c:g} C."
                    if gpu.temperature_shutdown_c is not None
                    else "Reduce the load and fix the cooling now.",
                )
            )
        elif temp >= slowdown - TEMPERATURE_MARGIN_C:
            findings.append(
                _finding(
                    "temperature_near_slowdown",
                    f"The GPU is at {temp:g} C, within {TEMPERATURE_MARGIN_C:g} C of its slowdown temperature "
                    f"({slowdown:g} C).",
                    "warning",
                    f"temperature_c={temp:g}, temperature_slowdown_c={slowdown:g}",
                    "Check the cooling (fans, airflow, inlet temperature) before it starts to throttle.",
                )
            )
    elif temp is not None and gpu.temperature_max_operating_c is not None and temp >= gpu.temperature_max_operating_c:
        findings.append(
            _finding(
                "temperature_above_max_operating",
                f"The GPU is at {temp:g} C, above its maximum operating temperature "
                f"({gpu.temperature_max_operating_c:g} C).",
                "warning",
                f"temperature_c={temp:g}, temperature_max_operating_c={gpu.temperature_max_operating_c:g}",
                "Check the cooling.",
            )
        )
    draw, limit = gpu.power_draw_w, gpu.power_limit_w
    if draw is not None and limit is not None and limit > 0 and draw > limit:
        findings.append(
            _finding(
                "power_above_limit",
                f"Power draw {draw:g} W is above the power limit {limit:g} W.",
                "warning",
                f"power_draw_w={draw:g}, power_limit_w={limit:g}",
                "Brief excursions happen under load; if it persists, check the power sensor and the limit "
                "(nvidia-smi -q -d POWER) and the PSUs.",
            )
        )


def _links(gpu: GpuSnapshot, expected: str | None, findings: list[Finding]) -> None:
    width, width_max = gpu.pcie_width_current, gpu.pcie_width_max
    if width is not None and width_max is not None and width < width_max:
        findings.append(
            _finding(
                "pcie_width_degraded",
                f"The PCIe link runs at x{width}, below its maximum x{width_max}.",
                "warning",
                f"pcie_width_current={width}, pcie_width_max={width_max}",
                "Reseat the GPU or riser and check the slot and cable; a link trained narrow stays narrow until "
                "the next reset.",
            )
        )
    gen, gen_max = gpu.pcie_gen_current, gpu.pcie_gen_max
    if gen is not None and gen_max is not None and gen < gen_max:
        busy = _positive(gpu.utilization_gpu_pct) or gpu.clock_events.get("idle") is False
        if busy:
            findings.append(
                _finding(
                    "pcie_gen_degraded",
                    f"The PCIe link runs at Gen{gen} while the GPU is busy, below its maximum Gen{gen_max}.",
                    "warning",
                    f"pcie_gen_current={gen}, pcie_gen_max={gen_max}, utilization_gpu_pct={gpu.utilization_gpu_pct}, "
                    f"clock_events.idle={gpu.clock_events.get('idle')}",
                    "Check the slot, riser and BIOS PCIe settings; idle GPUs downshift to save power, a busy one "
                    "should not.",
                )
            )
    down = gpu.nvlink_links_down or []
    if down and _nvlink_applies(gpu, expected):
        findings.append(
            _finding(
                "nvlink_down",
                f"{len(down)} of {gpu.nvlink_links_total} NVLink link(s) are down.",
                "critical",
                f"nvlink_links_down={down}, nvlink_links_total={gpu.nvlink_links_total}",
                "Drain the GPU; check `nvidia-smi nvlink -e` error counters and the fabric manager log, reset the "
                "GPU, and if links stay down have the baseboard / NVSwitch tray inspected.",
            )
        )
    state = gpu.fabric_state
    if state is not None and state.strip().lower() not in {"completed", "n/a", "not supported"}:
        findings.append(
            _finding(
                "fabric_not_ready",
                f"NVSwitch fabric registration is not complete (state {state}): CUDA cannot use this GPU yet.",
                "critical",
                f"fabric_state={state}, fabric_status={gpu.fabric_status}",
                "Check that nvidia-fabricmanager (and nvlsm on NVLink5 systems) runs and its log; restart it, "
                "then reset the GPUs if the state does not reach Completed.",
            )
        )
    elif state is not None and state.strip().lower() == "completed":
        status = (gpu.fabric_status or "").strip()
        if status and status.lower() not in {"success", "n/a"}:
            findings.append(
                _finding(
                    "fabric_error",
                    f"NVSwitch fabric registration completed with an error status ({status}).",
                    "critical",
                    f"fabric_state={state}, fabric_status={status}",
                    "Check the fabric manager log, restart it and reset the GPUs.",
                )
            )


def _settings(gpu: GpuSnapshot, findings: list[Finding]) -> None:
    if gpu.persistence_mode is False:
        findings.append(
            _finding(
                "persistence_mode_off",
                "Persistence mode is off: the driver unloads when no process uses the GPU, so each job pays "
                "initialisation time and state is lost.",
                "info",
                "persistence_mode=False",
                "Enable it on servers: run nvidia-persistenced (or nvidia-smi -pm 1).",
            )
        )
    if gpu.xid_errors is not None and gpu.xid_errors > 0:
        findings.append(
            _finding(
                "xid_reported",
                f"The GPU reported Xid {gpu.xid_errors} (the last Xid seen).",
                "warning",
                f"xid_errors={gpu.xid_errors}",
                f"Look it up with explain_xid({gpu.xid_errors}) for its meaning and the action; scan the kernel log "
                "(scan_kernel_log) for the full history.",
            )
        )


def _unreachable(gpu: GpuSnapshot) -> Finding:
    """The driver lists the GPU but cannot reach it: nvidia-smi's 'Unable to determine the device handle' line, NVML's
    GPU_IS_LOST, or 'GPU is lost' in its fields. The classic symptom of a GPU that has fallen off the bus (Xid 79)."""
    said = gpu.unreachable_reason or "unreachable=True (NVML could not get a handle)"
    reboot = "reboot" in said.lower()
    return _finding(
        "gpu_unreachable",
        "The driver lists this GPU but cannot reach it: the symptom of a GPU that has fallen off the bus"
        + (" (the driver itself asks for a reboot)." if reboot else "."),
        "critical",
        said
        + (f", pci_bus_id={gpu.pci_bus_id}" if gpu.pci_bus_id and gpu.pci_bus_id.lower() not in said.lower() else ""),
        "Drain the node and look for Xid 79 ('GPU has fallen off the bus') at this PCI address in the kernel log "
        "(scan_kernel_log); reboot the node (a GPU without a handle cannot be reset on its own); if it is missing "
        "after the reboot (lspci -d 10de:) or falls off again, reseat it and check its power and cooling, then send it "
        "for hardware inspection.",
    )


def _key_fields_known(gpu: GpuSnapshot) -> bool:
    memory = (
        gpu.ecc_volatile_uncorrectable_total,
        gpu.ecc_volatile_uncorrectable_dram,
        gpu.ecc_volatile_uncorrectable_sram,
        gpu.ecc_aggregate_uncorrectable_total,
        gpu.remapped_rows_pending,
        gpu.remapped_rows_failure,
        gpu.remapped_rows_uncorrectable,
    )
    return any(v is not None for v in memory) and gpu.temperature_c is not None


def evaluate(gpu: GpuSnapshot, *, interconnect_expected: str | None = None) -> GpuHealth:
    """Findings and status for one GPU.

    interconnect_expected: "nvlink" (or "nvswitch") when the node's GPUs are NVLink-connected, "pcie" when they are
    not; None infers it (some links up, or the GPU catalog says the model uses NVLink). NVLink links reported down
    count only where NVLink applies: PCIe cards report all their links inactive.
    """
    expected: str | None = None
    if interconnect_expected is not None:
        key = str(interconnect_expected).strip().lower()
        if key not in _INTERCONNECTS:
            raise InputError(
                f"interconnect_expected must be one of nvlink, nvswitch, pcie or none, not {interconnect_expected!r}"
            )
        expected = _INTERCONNECTS[key]
    findings: list[Finding] = []
    if gpu.unreachable:
        findings.append(_unreachable(gpu))
    _ecc(gpu, findings)
    _memory_repair(gpu, findings)
    _reset_and_recovery(gpu, findings)
    _clocks_and_thermals(gpu, findings)
    _links(gpu, expected, findings)
    _settings(gpu, findings)
    severities = {f.severity for f in findings}
    status: Status
    if "critical" in severities:
        status = "unhealthy"
    elif "warning" in severities:
        status = "degraded"
    elif _key_fields_known(gpu):
        status = "healthy"
    else:
        status = "unknown"
    return GpuHealth(gpu=gpu, status=status, findings=findings)


def evaluate_all(snapshots: Iterable[GpuSnapshot], *, interconnect_expected: str | None = None) -> list[GpuHealth]:
    """evaluate() for each snapshot, in order."""
    return [evaluate(s, interconnect_expected=interconnect_expected) for s in snapshots]


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPUs as nvidia-smi or NVML read them, for triage: the snapshots, or why they could not be read."""

    gpus: Sequence[GpuSnapshot] | None
    missing: str | None = None
    warnings: Sequence[str] = ()
    interconnect_expected: str | None = None


_NO_FINDING = (
    "no finding (ECC, row remapping, reset and recovery, clocks, temperature, power, PCIe, NVLink, fabric checked "
    "where reported)"
)
_NOT_JUDGED = "no finding, but the key fields (ECC or row-remap counters, temperature) are not reported"


def smi_report(node: NodeGpus) -> CheckReport:
    """Each GPU judged by the rules above, as findings for triage: an info finding implies healthy only when the
    key fields are known (else unknown); a GPU without findings has one saying so, with its status."""
    if node.gpus is None:
        missing = node.missing or "not read"
        return CheckReport(
            check="nvidia_smi",
            findings=[],
            summary=clip_str(f"unknown: {missing}", MAX_LINE_TEXT),
            warnings=[clip_str(f"the GPU part is unknown: {missing}", MAX_LINE_TEXT)],
            read=False,
        )
    out: list[findings.Finding] = []
    counts: dict[str, int] = {}
    for position, snapshot in enumerate(node.gpus):
        health = evaluate(snapshot, interconnect_expected=node.interconnect_expected)
        counts[health.status] = counts.get(health.status, 0) + 1
        gpu = GpuRef(
            bus_id=normalise_bus_id(snapshot.pci_bus_id),
            uuid=snapshot.uuid,
            serial=snapshot.serial,
            # an unreachable GPU without an index keeps none: its position in the list is not its nvidia-smi index
            index=snapshot.index if snapshot.index is not None or snapshot.unreachable else position,
            name=snapshot.name,
            lost=bool(snapshot.unreachable),
        )
        worst = max(health.findings, key=lambda f: SEVERITY_RANK[f.severity], default=None)
        info_status: Status = "unknown" if health.status == "unknown" else "healthy"
        for finding in health.findings:
            out.append(
                findings.Finding(
                    check="nvidia_smi",
                    rule=finding.check,
                    status=info_status if finding.severity == "info" else findings.severity_status(finding.severity),
                    severity=finding.severity,
                    what=finding.what,
                    evidence=finding.evidence,
                    action=finding.action,
                    gpu=gpu,
                    headline=f"{finding.check} ({finding.evidence})"
                    if finding is worst and finding.severity != "info"
                    else None,
                )
            )
        if not health.findings:
            out.append(
                findings.Finding(
                    check="nvidia_smi",
                    rule="no_finding",
                    status=health.status,
                    severity="info",
                    what=_NO_FINDING if health.status == "healthy" else _NOT_JUDGED,
                    gpu=gpu,
                )
            )
    lost = sum(1 for s in node.gpus if s.unreachable)
    return CheckReport(
        check="nvidia_smi",
        findings=out,
        summary=f"{len(node.gpus)} GPU(s): "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + (f"; {lost} listed but unreachable (fallen off the bus?)" if lost else ""),
        warnings=[f"nvidia-smi: {w}" for w in node.warnings],
        lists_every_gpu=True,
        missing_means="nvidia-smi cannot see {it}: {they} may have fallen off the bus or hung, or the sources come "
        "from different nodes or boots (count the GPUs with lspci -d 10de:; reboot the node if one is gone)",
    )
