"""Live GPU inventory from NVML (nvidia-ml-py). Plain module.

Where no NVIDIA driver is loaded (a laptop, a CPU CI machine) the answer says so instead of raising.
Fields NVML cannot report on a given GPU come back as None ("unknown"), never as zero.
"""

from typing import Any

from pydantic import BaseModel, Field


class GpuInfo(BaseModel):
    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    persistence_mode: bool | None = None
    compute_capability: str | None = None


class Inventory(BaseModel):
    available: bool = Field(description="False when NVML could not be used here; reason says why")
    reason: str | None = None
    source: str = Field(description="Where the data came from, e.g. 'nvml'")
    driver_version: str | None = None
    cuda_driver_version: str | None = Field(default=None, description="Highest CUDA version the driver supports")
    nvml_version: str | None = None
    gpu_count: int = 0
    gpus: list[GpuInfo] = Field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _maybe(fn: Any, *args: Any) -> Any:
    """Call an NVML getter; None where this GPU or driver does not support the query."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def read_inventory() -> Inventory:
    try:
        import pynvml
    except ImportError:
        return Inventory(
            available=False, source="nvml", reason="nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Inventory(
            available=False,
            source="nvml",
            reason=f"no usable NVIDIA driver on this host: NVML could not start ({_text(exc)})",
        )
    try:
        cuda = _maybe(pynvml.nvmlSystemGetCudaDriverVersion)
        inventory = Inventory(
            available=True,
            source="nvml",
            driver_version=_maybe(lambda: _text(pynvml.nvmlSystemGetDriverVersion())),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
            nvml_version=_maybe(lambda: _text(pynvml.nvmlSystemGetNVMLVersion())),
        )
        count = pynvml.nvmlDeviceGetCount()
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = _maybe(pynvml.nvmlDeviceGetMemoryInfo, handle)
            capability = _maybe(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
            pci = _maybe(pynvml.nvmlDeviceGetPciInfo, handle)
            persistence = _maybe(pynvml.nvmlDeviceGetPersistenceMode, handle)
            inventory.gpus.append(
                GpuInfo(
                    index=index,
                    name=_maybe(lambda h=handle: _text(pynvml.nvmlDeviceGetName(h))),
                    uuid=_maybe(lambda h=handle: _text(pynvml.nvmlDeviceGetUUID(h))),
                    pci_bus_id=_text(pci.busId) if pci is not None else None,
                    serial=_maybe(lambda h=handle: _text(pynvml.nvmlDeviceGetSerial(h))),
                    memory_total_mib=memory.total / 2**20 if memory is not None else None,
                    memory_used_mib=memory.used / 2**20 if memory is not None else None,
                    persistence_mode=None if persistence is None else persistence == pynvml.NVML_FEATURE_ENABLED,
                    compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
                )
            )
        inventory.gpu_count = count
        return inventory
    finally:
        _maybe(pynvml.nvmlShutdown)
