"""One GPU's state as the health rules see it, whatever it was read from (NVML live, nvidia-smi -q text or XML,
--query-gpu CSV, dcgm-exporter metrics), and what the rules say about it. Types only.

Every field is optional: None means "unknown" (not reported, [N/A], deprecated, unreadable), never zero. A snapshot
is written without its unknown fields, so that a node's inventory stays small enough for an agent to read.
"""

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from servers.core.models import Model
from servers.diagnostics.bounds import MAX_STR, clip_str
from servers.diagnostics.findings import Severity, Status

MAX_LINKS_LISTED = 64  # NVLink link numbers kept per GPU (GPUs have at most 18)
MAX_CLOCK_EVENTS = 32


class GpuSnapshot(Model):
    """One GPU as read; a field not read (unknown; clock_events: none reported) is left out."""

    @model_serializer(mode="wrap")
    def _known_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None and value != {}}

    # identity
    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = Field(default=None, description="Normalised as DDDD:BB:DD.F, lowercase hex")
    serial: str | None = None
    vbios_version: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    unreachable: bool | None = Field(
        default=None,
        description="True when the driver lists the GPU but cannot "
        "reach it (often fallen off the bus): every other field is then unknown",
    )
    unreachable_reason: str | None = Field(
        default=None, description="What said so: nvidia-smi's 'Unable to determine the device handle' line, NVML"
    )
    # memory and modes
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    persistence_mode: bool | None = None
    ecc_mode_enabled: bool | None = None
    # ECC counters (uncorrectable and correctable; SRAM and DRAM where the driver splits them, else totals)
    ecc_volatile_uncorrectable_sram: int | None = None
    ecc_volatile_uncorrectable_dram: int | None = None
    ecc_volatile_uncorrectable_total: int | None = None
    ecc_aggregate_uncorrectable_sram: int | None = None
    ecc_aggregate_uncorrectable_dram: int | None = None
    ecc_aggregate_uncorrectable_total: int | None = None
    ecc_volatile_correctable_total: int | None = None
    ecc_aggregate_correctable_total: int | None = None
    sram_threshold_exceeded: bool | None = None
    # page retirement (pre-Ampere) and row remapping (Ampere and later)
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # reset and recovery
    reset_required: bool | None = None
    drain_and_reset_recommended: bool | None = None
    recovery_action: str | None = Field(
        default=None, description="None, Reset, Reboot, Drain P2P, Drain and Reset, ... as the driver names it"
    )
    # clock event (throttle) reasons: active now
    clock_events: dict[str, bool] = Field(
        default_factory=dict,
        description="e.g. hw_slowdown, hw_thermal_slowdown, "
        "hw_power_brake_slowdown, sw_thermal_slowdown, sw_power_cap, idle",
    )
    # thermals and power
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    temperature_slowdown_c: float | None = None
    temperature_shutdown_c: float | None = None
    temperature_max_operating_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    # PCIe
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    # NVLink and fabric
    nvlink_links_total: int | None = None
    nvlink_links_down: list[int] | None = Field(default=None, description="Link numbers reported inactive")
    fabric_state: str | None = Field(default=None, description="e.g. Completed, In Progress, Not Started, N/A")
    fabric_status: str | None = None
    # activity
    utilization_gpu_pct: float | None = None
    xid_errors: int | None = Field(default=None, description="Last Xid seen (dcgm-exporter), when known")

    @field_validator(
        "name",
        "uuid",
        "pci_bus_id",
        "serial",
        "vbios_version",
        "driver_version",
        "cuda_version",
        "recovery_action",
        "fabric_state",
        "fabric_status",
        "unreachable_reason",
        mode="after",
    )
    @classmethod
    def _clip_text(cls, value: str | None) -> str | None:
        """Text read from the input is kept to MAX_STR characters (a captured file may hold anything)."""
        return clip_str(value, MAX_STR) if value is not None else None

    @field_validator("nvlink_links_down", mode="after")
    @classmethod
    def _clip_links(cls, value: list[int] | None) -> list[int] | None:
        return value[:MAX_LINKS_LISTED] if value is not None else None

    @field_validator("clock_events", mode="after")
    @classmethod
    def _clip_events(cls, value: dict[str, bool]) -> dict[str, bool]:
        if len(value) <= MAX_CLOCK_EVENTS and all(len(k) <= 64 for k in value):
            return value
        return {clip_str(k, 64): v for k, v in list(value.items())[:MAX_CLOCK_EVENTS]}


def unreachable_gpu(
    *, index: int | None, bus: str | None, driver: str | None, cuda: str | None, reason: str
) -> GpuSnapshot:
    """A GPU the driver lists but cannot reach (nvidia-smi's 'Unable to determine the device handle', NVML's
    GPU_IS_LOST): what is known of it and what said so."""
    return GpuSnapshot(
        index=index,
        pci_bus_id=bus,
        driver_version=driver,
        cuda_version=cuda,
        unreachable=True,
        unreachable_reason=reason,
    )


class Finding(Model):
    check: str = Field(description="Short name of the rule, e.g. ecc_uncorrectable_volatile")
    what: str = Field(description="What was found, in a sentence")
    severity: Severity
    evidence: str = Field(description="The field(s) and value(s) that triggered it")
    action: str = Field(description="What to do about it")


IDENTITY_FIELDS = ("index", "name", "uuid", "pci_bus_id", "serial", "memory_total_mib", "unreachable")


class GpuHealth(Model):
    gpu: GpuSnapshot
    status: Status
    findings: list[Finding]
    identity_only: bool = Field(
        default=False, description="True: a healthy GPU without findings, shown by identity (detail: every reading)"
    )

    def by_identity(self) -> "GpuHealth":
        """This GPU shown by its identity fields only (a healthy GPU in a default answer)."""
        kept = {name: getattr(self.gpu, name) for name in IDENTITY_FIELDS}
        return self.model_copy(update={"gpu": GpuSnapshot(**kept), "identity_only": True})
