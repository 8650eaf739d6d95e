"""Live GPU inventory and health snapshots from NVML (nvidia-ml-py). Plain module.

Where no NVIDIA driver is loaded (a laptop, a CPU CI machine) the answer says so instead of raising: `live_gpus`
is what every tool that reads NVML live calls, so each degrades the same way, in the same words
(``NVML not available here: <reason>``).
Fields NVML cannot report on a given GPU come back as None ("unknown"), never as zero: every query is guarded, so
an unsupported one (NVML_ERROR_NOT_SUPPORTED, a function missing from older bindings or drivers) leaves its field
unset. A GPU whose handle fails, or whose queries answer NVML_ERROR_GPU_IS_LOST, is unreachable, with NVML's words.
"""

import ctypes
from dataclasses import dataclass, field
from typing import Any

from servers.core.machine import NvmlUnavailable, nvml_session
from servers.diagnostics.smi import decode_clock_events, normalise_bus_id
from servers.diagnostics.snapshot import GpuSnapshot, unreachable_gpu


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuLost(Exception):  # noqa: N818 (a state of the GPU, reported, not a failure of the reader)
    """NVML answered NVML_ERROR_GPU_IS_LOST: the GPU is gone from the bus; the message is what was asked."""


def _lost(pynvml: Any, exc: Exception) -> bool:
    return getattr(exc, "value", None) == getattr(pynvml, "NVML_ERROR_GPU_IS_LOST", 15)


def _maybe(fn: Any, *args: Any) -> Any:
    """Call an NVML getter; None where this GPU or driver does not support the query; GpuLost where the GPU is."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if _lost(pynvml, exc):
            name = getattr(fn, "__name__", "<lambda>")
            raise GpuLost(f"{'a query' if name == '<lambda>' else name}: {_text(exc)}") from exc
        return None


RECOVERY_ACTIONS = {
    0: "None",
    1: "Reset",
    2: "Reboot",
    3: "Drain P2P",
    4: "Drain and Reset",
    5: "Recover IMEX Domain",
    6: "Bus Reset",
    7: "System Reboot",
}
FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}  # 0: not supported -> None
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _call(pynvml: Any, name: str, *args: Any) -> Any:
    """pynvml.<name>(*args), or None where the binding lacks it or the GPU/driver does not support the query."""
    fn = getattr(pynvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if _lost(pynvml, exc):
            raise GpuLost(f"{name}: {_text(exc)}") from exc
        return None


def _field_values(pynvml: Any, handle: Any, field_ids: list[int]) -> dict[int, float | int]:
    """NVML field values that read successfully, by field id."""
    values = _call(pynvml, "nvmlDeviceGetFieldValues", handle, field_ids)
    out: dict[int, float | int] = {}
    if values is None:
        return out
    for field_id, value in zip(field_ids, values, strict=False):
        try:
            if value.nvmlReturn != pynvml.NVML_SUCCESS:
                continue
            attr = _VALUE_FIELDS.get(int(value.valueType))
            if attr is not None:
                out[field_id] = getattr(value.value, attr)
        except (AttributeError, TypeError, ValueError):
            continue
    return out


def _nvlink(pynvml: Any, handle: Any, link_count: int | None) -> tuple[int | None, list[int] | None]:
    """(links, down links); (None, None) where the GPU has no NVLink or NVML cannot say."""
    limit = link_count if link_count is not None else getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
    fn = getattr(pynvml, "nvmlDeviceGetNvLinkState", None)
    if fn is None or limit <= 0:
        return None, None
    total, down = 0, []
    for link in range(limit):
        try:
            active = fn(handle, link)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == getattr(pynvml, "NVML_ERROR_INVALID_ARGUMENT", 2) and link_count is None:
                break  # past the last link
            if code == getattr(pynvml, "NVML_ERROR_NOT_SUPPORTED", 3) and total == 0 and link_count is None:
                return None, None  # no NVLink on this GPU
            continue
        total += 1
        if not active:
            down.append(link)
    return (total, down) if total else (None, None)


def _fabric(pynvml: Any, handle: Any) -> tuple[str | None, str | None]:
    struct = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
    if struct is None:
        return None, None
    info = struct()
    if _call(pynvml, "nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info)) is None:
        return None, None
    state = FABRIC_STATES.get(int(info.state))
    if state is None:
        return None, None
    status = "Success" if int(info.status) == pynvml.NVML_SUCCESS else str(pynvml.NVMLError(int(info.status)))
    return state, status


def _mib(value: Any, attr: str) -> float | None:
    raw = getattr(value, attr, None) if value is not None else None
    return raw / 2**20 if isinstance(raw, int) else None


def _watts(milliwatts: Any) -> float | None:
    return milliwatts / 1000 if isinstance(milliwatts, int | float) else None


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _snapshot(pynvml: Any, index: int, handle: Any, driver: str | None, cuda: str | None) -> GpuSnapshot:

    def call(name: str, *args: Any) -> Any:
        return _call(pynvml, name, handle, *args)

    def threshold(kind: str) -> float | None:
        value = call("nvmlDeviceGetTemperatureThreshold", getattr(pynvml, f"NVML_TEMPERATURE_THRESHOLD_{kind}"))
        return float(value) if value is not None else None

    unc, corr = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    vol, agg = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
    sram = getattr(pynvml, "NVML_MEMORY_LOCATION_SRAM", None)
    dram = getattr(pynvml, "NVML_MEMORY_LOCATION_DRAM", pynvml.NVML_MEMORY_LOCATION_DEVICE_MEMORY)

    def location(kind: int, counter: int, where: int | None) -> int | None:
        return None if where is None else call("nvmlDeviceGetMemoryErrorCounter", kind, counter, where)

    pci = call("nvmlDeviceGetPciInfo")
    memory = call("nvmlDeviceGetMemoryInfo")
    ecc_mode = call("nvmlDeviceGetEccMode")
    persistence = call("nvmlDeviceGetPersistenceMode")
    remapped = call("nvmlDeviceGetRemappedRows")
    sbe = call("nvmlDeviceGetRetiredPages", pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    dbe = call("nvmlDeviceGetRetiredPages", pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    reasons = call("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:
        reasons = call("nvmlDeviceGetCurrentClocksThrottleReasons")
    utilization = call("nvmlDeviceGetUtilizationRates")
    fields = _field_values(
        pynvml,
        handle,
        [
            getattr(pynvml, "NVML_FI_DEV_MEMORY_TEMP", 82),
            getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230),
            getattr(pynvml, "NVML_FI_DEV_RESET_STATUS", 226),
            getattr(pynvml, "NVML_FI_DEV_DRAIN_AND_RESET_STATUS", 227),
            getattr(pynvml, "NVML_FI_DEV_NVLINK_LINK_COUNT", 91),
        ],
    )
    recovery = fields.get(getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230))
    reset = fields.get(getattr(pynvml, "NVML_FI_DEV_RESET_STATUS", 226))
    drain = fields.get(getattr(pynvml, "NVML_FI_DEV_DRAIN_AND_RESET_STATUS", 227))
    link_count = fields.get(getattr(pynvml, "NVML_FI_DEV_NVLINK_LINK_COUNT", 91))
    links_total, links_down = _nvlink(pynvml, handle, int(link_count) if link_count is not None else None)
    fabric_state, fabric_status = _fabric(pynvml, handle)
    memory_temp = fields.get(getattr(pynvml, "NVML_FI_DEV_MEMORY_TEMP", 82))
    temperature = call("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)
    return GpuSnapshot(
        index=index,
        name=_maybe(lambda: _text(pynvml.nvmlDeviceGetName(handle))),
        uuid=_maybe(lambda: _text(pynvml.nvmlDeviceGetUUID(handle))),
        pci_bus_id=normalise_bus_id(_text(pci.busId)) if pci is not None else None,
        serial=_maybe(lambda: _text(pynvml.nvmlDeviceGetSerial(handle))),
        vbios_version=_maybe(lambda: _text(pynvml.nvmlDeviceGetVbiosVersion(handle))),
        driver_version=driver,
        cuda_version=cuda,
        memory_total_mib=_mib(memory, "total"),
        memory_used_mib=_mib(memory, "used"),
        persistence_mode=None if persistence is None else persistence == pynvml.NVML_FEATURE_ENABLED,
        ecc_mode_enabled=None if not ecc_mode else ecc_mode[0] == pynvml.NVML_FEATURE_ENABLED,
        ecc_volatile_uncorrectable_sram=location(unc, vol, sram),
        ecc_volatile_uncorrectable_dram=location(unc, vol, dram),
        ecc_volatile_uncorrectable_total=call("nvmlDeviceGetTotalEccErrors", unc, vol),
        ecc_aggregate_uncorrectable_sram=location(unc, agg, sram),
        ecc_aggregate_uncorrectable_dram=location(unc, agg, dram),
        ecc_aggregate_uncorrectable_total=call("nvmlDeviceGetTotalEccErrors", unc, agg),
        ecc_volatile_correctable_total=call("nvmlDeviceGetTotalEccErrors", corr, vol),
        ecc_aggregate_correctable_total=call("nvmlDeviceGetTotalEccErrors", corr, agg),
        retired_pages_sbe=len(sbe) if sbe is not None else None,
        retired_pages_dbe=len(dbe) if dbe is not None else None,
        retired_pages_pending=_flag(call("nvmlDeviceGetRetiredPagesPendingStatus")),
        remapped_rows_correctable=remapped[0] if remapped else None,
        remapped_rows_uncorrectable=remapped[1] if remapped else None,
        remapped_rows_pending=bool(remapped[2]) if remapped else None,
        remapped_rows_failure=bool(remapped[3]) if remapped else None,
        reset_required=_flag(reset),
        drain_and_reset_recommended=_flag(drain),
        recovery_action=RECOVERY_ACTIONS.get(int(recovery), f"0x{int(recovery):x}") if recovery is not None else None,
        clock_events=decode_clock_events(int(reasons)) if reasons is not None else {},
        temperature_c=float(temperature) if temperature is not None else None,
        memory_temperature_c=float(memory_temp) if memory_temp is not None else None,
        temperature_slowdown_c=threshold("SLOWDOWN"),
        temperature_shutdown_c=threshold("SHUTDOWN"),
        temperature_max_operating_c=threshold("GPU_MAX"),
        power_draw_w=_watts(call("nvmlDeviceGetPowerUsage")),
        power_limit_w=_watts(call("nvmlDeviceGetEnforcedPowerLimit")),
        pcie_gen_current=call("nvmlDeviceGetCurrPcieLinkGeneration"),
        pcie_gen_max=call("nvmlDeviceGetMaxPcieLinkGeneration"),
        pcie_width_current=call("nvmlDeviceGetCurrPcieLinkWidth"),
        pcie_width_max=call("nvmlDeviceGetMaxPcieLinkWidth"),
        nvlink_links_total=links_total,
        nvlink_links_down=links_down,
        fabric_state=fabric_state,
        fabric_status=fabric_status,
        utilization_gpu_pct=float(utilization.gpu) if utilization is not None else None,
    )


def _system(pynvml: Any, fn: Any) -> Any:
    """A system-wide NVML query (driver, CUDA version); None on any NVML error, lost GPUs included."""
    try:
        return fn()
    except pynvml.NVMLError:
        return None


def _unreachable(pynvml: Any, index: int, handle: Any, why: str, driver: str | None, cuda: str | None) -> GpuSnapshot:
    """The snapshot of a GPU NVML lists but cannot reach: its PCI address where NVML still gives it."""
    bus = None
    if handle is not None:
        try:
            bus = normalise_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
        except Exception:  # the GPU is gone: any failure leaves its address unknown
            bus = None
    return unreachable_gpu(index=index, bus=bus, driver=driver, cuda=cuda, reason=f"NVML, GPU index {index}: {why}")


def read_snapshots() -> tuple[list[GpuSnapshot], str | None]:
    """Live snapshots of every GPU, and None; or ([], reason) where NVML cannot be used here."""
    try:
        with nvml_session() as pynvml:
            cuda = _system(pynvml, pynvml.nvmlSystemGetCudaDriverVersion)
            driver = _system(pynvml, lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
            cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
            try:
                count = pynvml.nvmlDeviceGetCount()
            except pynvml.NVMLError as exc:
                return [], f"NVML started but could not count the GPUs ({_text(exc)})"
            snapshots = []
            for index in range(count):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                except pynvml.NVMLError as exc:  # the handle itself failed (GPU lost, fallen off the bus)
                    why = f"nvmlDeviceGetHandleByIndex: {_text(exc)}"
                    snapshots.append(_unreachable(pynvml, index, None, why, driver, cuda_text))
                    continue
                try:
                    snapshots.append(_snapshot(pynvml, index, handle, driver, cuda_text))
                except GpuLost as exc:  # a handle, but the GPU answers GPU_IS_LOST
                    snapshots.append(_unreachable(pynvml, index, handle, str(exc), driver, cuda_text))
            return snapshots, None
    except NvmlUnavailable as exc:
        return [], str(exc)


def not_available(reason: str) -> str:
    """The one phrase for 'no live GPU source on this host', in every tool that reads NVML live."""
    return f"NVML not available here: {reason}"


@dataclass
class LiveGpus:
    """What NVML on this host gives: the snapshots, or why there are none (reason, None when NVML works)."""

    snapshots: list[GpuSnapshot] = field(default_factory=list)
    reason: str | None = None

    @property
    def available(self) -> bool:
        return self.reason is None

    @property
    def missing(self) -> str | None:
        """'NVML not available here: <reason>', or None when NVML works."""
        return None if self.reason is None else not_available(self.reason)

    @property
    def driver_version(self) -> str | None:
        return next((g.driver_version for g in self.snapshots if g.driver_version), None)

    @property
    def cuda_version(self) -> str | None:
        return next((g.cuda_version for g in self.snapshots if g.cuda_version), None)


def live_gpus() -> LiveGpus:
    """NVML on this host, read once: every GPU's snapshot, or the reason there is none. Never raises."""
    snapshots, reason = read_snapshots()
    return LiveGpus(snapshots=snapshots, reason=reason)
