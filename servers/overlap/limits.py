"""What this machine can run, asked before any work is submitted: memory available and devices present.
No torch here (the server imports this module): /proc/meminfo for host memory, NVML for GPUs."""

import contextlib
import os
from pathlib import Path

from servers.core.machine import gpus_present

__all__ = ["fmt_bytes", "gpu_memory_free", "gpus_present", "host_memory_available", "max_world_size"]


def host_memory_available() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_memory_free(index: int = 0) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).free)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def max_world_size(backend: str) -> int:
    """nccl: one rank per GPU; gloo: one rank per CPU core (two at least, so that a laptop can check plumbing)."""
    if backend == "nccl":
        return gpus_present()
    return max(2, os.cpu_count() or 1)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
