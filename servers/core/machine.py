"""What this machine has, asked before work is submitted: the GPUs NVML sees. No torch here (servers import
this module at start-up); NVML is loaded only when asked."""

import contextlib


def gpus_present() -> int:
    """NVIDIA GPUs NVML sees (0 where there is no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
