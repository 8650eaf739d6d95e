"""What this machine has, asked before work is submitted: the GPUs NVML sees, the host memory available. No torch
here (servers import this module at start-up); NVML is loaded only when asked.

`nvml_session` is the one way into NVML: every reader (this module, the diagnostics' snapshots, the overlap probe and
its ranks) opens it with `with nvml_session() as pynvml:` and gets NvmlUnavailable, with the reason, where NVML
cannot start."""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MEMINFO = Path("/proc/meminfo")


class NvmlUnavailable(Exception):  # noqa: N818 (a reason, not a failure: callers report it or fall back)
    """NVML cannot be used here; the message says why (no nvidia-ml-py, no driver)."""


@contextlib.contextmanager
def nvml_session() -> Iterator[Any]:
    """pynvml, initialised for the block and shut down after it (a failed shutdown is ignored); NvmlUnavailable
    where nvidia-ml-py is missing or NVML does not start. pynvml is imported here, at call time."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailable(f"no usable NVIDIA driver on this host: NVML could not start ({exc})") from exc
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def gpus_present() -> int:
    """NVIDIA GPUs NVML sees (0 where there is no driver)."""
    try:
        with nvml_session() as pynvml:
            return int(pynvml.nvmlDeviceGetCount())
    except NvmlUnavailable:
        return 0


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes, by field name (MemTotal, MemAvailable, ...); {} where it cannot be read."""
    fields: dict[str, int] = {}
    try:
        text = MEMINFO.read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        fields[name.strip()] = value * 1024 if parts[1:2] == ["kB"] else value
    return fields


def host_memory_available() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None where it cannot be read."""
    return meminfo().get("MemAvailable")
