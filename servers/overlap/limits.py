"""What this machine can run: one probe and one set of decisions, shared by the server and the worker.

The server decides before it submits a job (backend, world size, dtype, memory) and the job's worker decides again
before it starts any rank; both call the functions below with a `MachineProbe`, so they reach the same decision
with the same message. The probe reads:
- NVML (nvidia-ml-py): the NVIDIA GPUs present, their compute capability and free memory;
- CUDA_VISIBLE_DEVICES: which of them a CUDA process of this environment would see;
- torch's build, from torch/version.py read as text (torch.version.cuda is None in a CPU-only build): no
  `import torch`, so no CUDA initialisation and no heavy import in the server;
- /proc/meminfo for host memory (servers/core/machine.py reads both).

A GPU counts for the nccl backend only when NVML sees it AND torch is built with CUDA: on a host with GPUs and a
CPU-only torch, auto resolves to gloo and nccl is refused, on both sides. What only a CUDA initialisation can tell
(a driver too old for the torch build) is checked in the worker by `confirm_cuda_runtime`, which names the probe it
contradicts.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from servers.core.errors import InputError
from servers.core.machine import NvmlUnavailable, gpus_present, host_memory_available, nvml_session

__all__ = [
    "MachineProbe",
    "TorchBuild",
    "available_memory",
    "backend_decision",
    "check_dtype",
    "check_memory",
    "check_world_size",
    "confirm_cuda_runtime",
    "confirm_dtype_runtime",
    "fmt_bytes",
    "gpu_memory_free",
    "gpus_present",
    "host_memory_available",
    "max_world_size",
    "probe_machine",
    "resolve_backend",
    "resolve_device",
    "torch_build",
]

BACKENDS = ("auto", "gloo", "nccl")
FP8_MIN_CAPABILITY = (8, 9)
TF32_MIN_CAPABILITY = (8, 0)
# dtype -> (lowest compute capability, the hardware it needs, what to use on CPU instead)
GPU_DTYPES: dict[str, tuple[tuple[int, int], str, str]] = {
    "fp8": (FP8_MIN_CAPABILITY, "NVIDIA GPUs with FP8 tensor cores (sm_89 or newer)", "use fp32, bf16 or fp16 on CPU"),
    "tf32": (
        TF32_MIN_CAPABILITY,
        "NVIDIA GPUs with TF32 tensor cores (sm_80 or newer)",
        "tf32 is fp32 data with TF32 matmul math: use fp32 on CPU (the same data, full fp32 math)",
    ),
}


@dataclass(frozen=True)
class TorchBuild:
    """torch as installed: its version and the CUDA version it was built with (None: a CPU-only build)."""

    installed: bool
    version: str | None = None
    cuda: str | None = None

    def describe(self) -> str:
        if not self.installed:
            return "torch is not installed"
        return f"torch {self.version} " + (f"built with CUDA {self.cuda}" if self.cuda else "built without CUDA")


@dataclass(frozen=True)
class MachineProbe:
    """A snapshot of what this machine offers to the overlap benchmarks (see the module's docstring)."""

    nvml_gpus: int
    visible: tuple[int, ...]  # NVML indices of the GPUs a CUDA process here sees, in CUDA's order
    torch: TorchBuild
    capabilities: tuple[tuple[int, int] | None, ...] = ()  # of the visible GPUs, in CUDA's order
    gpu_free_bytes: tuple[int | None, ...] = ()  # of the visible GPUs, in CUDA's order
    host_available_bytes: int | None = None
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)

    @property
    def cuda_gpus(self) -> int:
        """GPUs the nccl backend can use here: visible to CUDA, with a torch built for CUDA."""
        return len(self.visible) if self.torch.cuda else 0

    def why_no_cuda(self) -> str | None:
        """None when the nccl backend can run here, else why not (one sentence, the same on every side)."""
        if self.nvml_gpus == 0:
            return "NVML sees no NVIDIA GPU on this machine"
        if not self.visible:
            return f"CUDA_VISIBLE_DEVICES hides all {self.nvml_gpus} GPU(s) that NVML sees"
        if not self.torch.installed:
            return f"NVML sees {self.nvml_gpus} GPU(s) but torch is not installed"
        if not self.torch.cuda:
            return (
                f"NVML sees {self.nvml_gpus} GPU(s) but this {self.torch.describe()} (torch.version.cuda is None); "
                "install a CUDA build of torch to use them"
            )
        return None

    def describe(self) -> str:
        gpus = f"{self.nvml_gpus} NVIDIA GPU(s) (NVML)"
        if len(self.visible) != self.nvml_gpus:
            gpus += f", {len(self.visible)} visible to CUDA"
        return f"{gpus}; {self.torch.describe()}"


# ---------------------------------------------------------------------------------------------------------------
# Reading the machine


def torch_build() -> TorchBuild:
    """torch's version and CUDA version from torch/version.py, parsed as text: torch is not imported."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return TorchBuild(installed=False)
    values: dict[str, object] = {}
    with contextlib.suppress(OSError, SyntaxError, ValueError):
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text())
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            if isinstance(node, ast.AnnAssign):
                target = node.target
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and value is not None:
                with contextlib.suppress(ValueError):
                    values[target.id] = ast.literal_eval(value)
    if "__version__" not in values and "torch" in sys.modules:  # an unusual version.py: ask the loaded module
        torch = sys.modules["torch"]
        values = {"__version__": str(torch.__version__), "cuda": getattr(torch.version, "cuda", None)}
    version, cuda = values.get("__version__"), values.get("cuda")
    return TorchBuild(
        installed=True,
        version=str(version) if version is not None else None,
        cuda=str(cuda) if isinstance(cuda, str) and cuda else None,
    )


def visible_indices(nvml_gpus: int, env: str | None) -> tuple[int, ...]:
    """NVML indices CUDA exposes under CUDA_VISIBLE_DEVICES=`env` (None: all). Like CUDA, the list ends at the first
    entry that names no GPU; UUIDs (GPU-..., MIG-...) are taken in order without mapping them."""
    if env is None:
        return tuple(range(nvml_gpus))
    indices: list[int] = []
    for entry in env.split(","):
        entry = entry.strip()
        if entry.isdigit() and int(entry) < nvml_gpus and int(entry) not in indices:
            indices.append(int(entry))
        elif entry.startswith(("GPU-", "MIG-")) and len(indices) < nvml_gpus:
            indices.append(len(indices))
        else:
            break
    return tuple(indices)


Capabilities = tuple[tuple[int, int] | None, ...]
FreeBytes = tuple[int | None, ...]


def _nvml_snapshot(visible_env: str | None) -> tuple[int, tuple[int, ...], Capabilities, FreeBytes]:
    """(count, visible indices, capability and free bytes of each visible GPU) from one NVML session."""
    try:
        with nvml_session() as pynvml:
            count = int(pynvml.nvmlDeviceGetCount())
            visible = visible_indices(count, visible_env)
            capabilities: list[tuple[int, int] | None] = []
            free: list[int | None] = []
            for index in visible:
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                except Exception:
                    capabilities.append(None)
                    free.append(None)
                    continue
                try:
                    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                    capabilities.append((int(major), int(minor)))
                except Exception:
                    capabilities.append(None)
                try:
                    free.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).free))
                except Exception:
                    free.append(None)
            return count, visible, tuple(capabilities), tuple(free)
    except NvmlUnavailable:
        return 0, (), (), ()


def gpu_memory_free(index: int = 0) -> int | None:
    """Free memory of the index-th GPU a CUDA process here sees (NVML), in bytes; None where unknown."""
    probe = probe_machine()
    return probe.gpu_free_bytes[index] if index < len(probe.gpu_free_bytes) else None


def probe_machine() -> MachineProbe:
    """The probe every decision below takes: NVML, CUDA_VISIBLE_DEVICES, torch's build, host memory."""
    count, visible, capabilities, free = _nvml_snapshot(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return MachineProbe(
        nvml_gpus=count,
        visible=visible,
        torch=torch_build(),
        capabilities=capabilities,
        gpu_free_bytes=free,
        host_available_bytes=host_memory_available(),
    )


# ---------------------------------------------------------------------------------------------------------------
# Decisions (the server and the worker call these, with the same wording)


def backend_decision(requested: str, probe: MachineProbe | None = None) -> tuple[str, str]:
    """(backend, why): 'auto' -> nccl when CUDA can use this machine's GPUs, else gloo; InputError for 'nccl' where
    it cannot run, or an unknown name."""
    probe = probe or probe_machine()
    if requested not in BACKENDS:
        raise InputError(f"backend: unknown {requested!r}; accepted: {', '.join(BACKENDS)}")
    missing = probe.why_no_cuda()
    if requested == "nccl":
        if missing:
            raise InputError(f"backend 'nccl' cannot run here: {missing}; use 'gloo' (CPU) or 'auto'")
        return "nccl", f"nccl as asked ({probe.describe()})"
    if requested == "gloo":
        return "gloo", "gloo as asked"
    if missing:
        return "gloo", f"auto chose gloo (CPU): {missing}"
    return "nccl", f"auto chose nccl: {probe.describe()}"


def resolve_backend(requested: str, probe: MachineProbe | None = None) -> str:
    """The backend `requested` ('auto', 'gloo' or 'nccl') resolves to here (see backend_decision)."""
    return backend_decision(requested, probe)[0]


def resolve_device(requested: str, probe: MachineProbe | None = None) -> str:
    """'cuda' or 'cpu' for a single-process GEMM: auto -> cuda when CUDA can use a GPU here; 'cuda' where it
    cannot is an InputError (the same rule as for the nccl backend)."""
    probe = probe or probe_machine()
    missing = probe.why_no_cuda()
    if requested == "cuda" and missing:
        raise InputError(f"device 'cuda' cannot run here: {missing}; use 'cpu' or 'auto'")
    if requested not in ("auto", "cpu", "cuda"):
        raise InputError(f"device: unknown {requested!r}; accepted: auto, cpu, cuda")
    if requested == "auto":
        return "cpu" if missing else "cuda"
    return requested


def max_world_size(backend: str, probe: MachineProbe | None = None) -> int:
    """nccl: one rank per GPU CUDA can use; gloo: one rank per CPU core (two at least, so a laptop checks plumbing)."""
    probe = probe or probe_machine()
    if backend == "nccl":
        return probe.cuda_gpus
    return max(2, probe.cpu_count)


def check_world_size(world_size: int, backend: str, probe: MachineProbe | None = None) -> None:
    """InputError when this machine cannot host `world_size` ranks with `backend`."""
    if world_size < 1:
        raise InputError(f"world_size {world_size} is not possible: at least 1 rank")
    cap = max_world_size(backend, probe)
    if world_size > cap:
        where = "GPUs CUDA can use" if backend == "nccl" else "CPU cores (gloo; at least 2 allowed)"
        raise InputError(
            f"world_size {world_size} is more than this machine runs with {backend}: at most {cap} ({where})"
        )


def check_dtype(dtype: str, backend: str, world_size: int, probe: MachineProbe | None = None) -> None:
    """The GEMM dtypes that need tensor-core hardware (NVML's compute capability): fp8 needs sm_89+, tf32 (fp32
    storage, TF32 math) sm_80+, and for ranks the nccl backend; `backend` is a backend, or a device for a single
    GEMM. InputError naming what is missing; fp32, bf16 and fp16 run anywhere."""
    need = GPU_DTYPES.get(dtype)
    if need is None:
        return
    floor, hardware, on_cpu = need
    if backend not in ("nccl", "cuda"):
        with_what = " and the nccl backend" if backend == "gloo" else ""
        raise InputError(f"{dtype} needs {hardware}{with_what}; {on_cpu}")
    probe = probe or probe_machine()
    known = [c for c in probe.capabilities[:world_size] if c is not None]
    if known and min(known) < floor:
        low = min(known)
        raise InputError(
            f"{dtype} needs compute capability {floor[0]}.{floor[1]} or newer; these GPUs are sm_{low[0]}{low[1]}"
        )


def confirm_dtype_runtime(dtype: str) -> None:
    """In the worker, after torch is imported: what an fp8 GEMM needs of torch itself (torch._scaled_mm and the e4m3
    type), refused with the reason where this torch lacks it."""
    if dtype != "fp8":
        return
    import torch

    missing = [name for name in ("_scaled_mm", "float8_e4m3fn") if not hasattr(torch, name)]
    if missing:
        raise RuntimeError(
            f"fp8 GEMMs need torch.{' and torch.'.join(missing)}, which this torch ({torch.__version__}) lacks; "
            "use bf16, or a newer torch"
        )


def available_memory(backend: str, world_size: int, probe: MachineProbe | None = None) -> tuple[int | None, str]:
    """Bytes one rank may use and where the figure comes from; None where it cannot be read.

    nccl (or the cuda device): the smallest free memory of the first world_size GPUs CUDA sees (NVML); gloo (or
    cpu): MemAvailable of /proc/meminfo shared by all ranks of this host (so divided by world_size).
    """
    probe = probe or probe_machine()
    if backend in ("nccl", "cuda"):
        free = [f for f in probe.gpu_free_bytes[:world_size] if f is not None]
        if len(free) < min(world_size, len(probe.gpu_free_bytes)) or not free:
            return None, "free GPU memory (NVML could not read it)"
        return min(free), f"free memory of the smallest of the {world_size} GPU(s) (NVML)"
    total = probe.host_available_bytes
    if world_size == 1:
        return total, "MemAvailable of /proc/meminfo"
    return (None if total is None else total // world_size), f"MemAvailable of /proc/meminfo / {world_size} ranks"


def check_memory(
    bytes_per_rank: int, backend: str, world_size: int, what: str, probe: MachineProbe | None = None
) -> None:
    """InputError when `bytes_per_rank` does not fit in what one rank can use (checked before allocating)."""
    available, source = available_memory(backend, world_size, probe)
    if available is not None and bytes_per_rank > available:
        per_rank = " per rank" if world_size > 1 else ""
        raise InputError(
            f"{what} needs about {fmt_bytes(bytes_per_rank)}{per_rank} but only {fmt_bytes(available)} is "
            f"available ({source}); use a smaller shape or size" + (", or more ranks" if world_size > 1 else "")
        )


def confirm_cuda_runtime(backend: str, devices: int) -> None:
    """In the worker, for nccl (or the cuda device) only: CUDA really initialises with enough devices, and torch has
    NCCL. What the probe cannot see (a driver too old for the torch build, say) is refused here, naming the probe
    it contradicts."""
    if backend not in ("nccl", "cuda"):
        return
    import torch

    probe = probe_machine()
    fallback = "backend 'gloo'" if backend == "nccl" else "device 'cpu'"
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"the machine probe allows {backend} ({probe.describe()}) but CUDA does not initialise in this process "
            f"(torch.cuda.is_available() is False): the NVIDIA driver may be too old for this torch build; use "
            f"{fallback}"
        )
    if torch.cuda.device_count() < devices:
        raise RuntimeError(
            f"CUDA sees {torch.cuda.device_count()} GPU(s) but {devices} are needed ({probe.describe()})"
        )
    if backend == "nccl":
        import torch.distributed as dist

        if not dist.is_nccl_available():
            raise RuntimeError(f"this torch ({probe.torch.describe()}) has no NCCL; use {fallback}")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
