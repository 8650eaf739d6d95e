"""One machine probe and one validation for the overlap server and its workers (issue 10, defect 6).

The reproduction: on a host whose NVML sees GPUs but whose torch is a CPU-only build, the server resolved backend
auto to nccl (it asked NVML) and the worker to gloo or a failure (it asked torch.cuda). Here NVML is replaced by a
fake pynvml module that reports GPUs, and torch's build by a CPU-only one; the server (through an in-process MCP
client) and the work functions (called in this process, where the same fakes apply) must reach the same decision
with the same message. Refusals happen before any job or rank starts, so no process is needed except in the one
test that runs a real gloo job.
"""

import sys
import types
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from servers.core.errors import InputError
from servers.overlap import limits
from servers.overlap.collectives import run_collective_benchmark
from servers.overlap.gemm import run_gemm_benchmark
from servers.overlap.limits import MachineProbe, TorchBuild, backend_decision, probe_machine, visible_indices
from servers.overlap.overlap_bench import run_overlap_benchmark, run_overlap_tune
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.test_overlap_bench import FakeContext

pytestmark = pytest.mark.timeout(300)

CPU_TORCH = TorchBuild(installed=True, version="2.13.0+cpu", cuda=None)
CUDA_TORCH = TorchBuild(installed=True, version="2.13.0+cu128", cuda="12.8")
GIB = 2**30


def fake_nvml(count: int, capability: tuple[int, int] = (9, 0), free: int = 80 * GIB) -> types.ModuleType:
    """A pynvml module that reports `count` GPUs (what nvidia-ml-py answers on such a host)."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def handle(index: int) -> int:
        if not 0 <= index < count:
            raise NVMLError("Invalid Argument")
        return index

    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: capability  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(free=free, total=free, used=0)  # type: ignore[attr-defined]
    return nvml


@pytest.fixture
def gpus_without_cuda_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML sees two H100-class GPUs; torch is a CPU-only build."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(2))
    monkeypatch.setattr(limits, "torch_build", lambda: CPU_TORCH)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def two_old_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML sees two sm_80 GPUs with 1 GiB free; torch is built with CUDA."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(2, (8, 0), GIB))
    monkeypatch.setattr(limits, "torch_build", lambda: CUDA_TORCH)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


SMALL = {"pattern": "ag_gemm", "m": 64, "n": 32, "k": 32, "world_size": 2, "dtype": "fp32", "iters": 3}


def as_tune(spec: dict[str, Any]) -> dict[str, Any]:
    """An overlap spec (one shape, flat) as tune_overlap's arguments: the shape as its one layer, "up"."""
    shape = {key: spec[key] for key in ("pattern", "m", "n", "k")}
    return {"layers": [{"layer": "up", **shape}], **{k: v for k, v in spec.items() if k not in shape}}


async def refused_alike(client: Client, spec: dict[str, Any], tmp_path: Path) -> str:
    """tune_overlap's refusal of one shape: the same as its job's (run_overlap_tune) and, but for the layer's name,
    as a single measurement's (run_overlap_benchmark)."""
    said = await server_error(client, "tune_overlap", as_tune(spec))
    assert said == worker_error(run_overlap_tune, as_tune(spec), tmp_path)
    assert said.removeprefix("layer up: ") == worker_error(run_overlap_benchmark, spec, tmp_path)
    return said


async def server_error(client: Client, tool: str, args: dict[str, Any]) -> str:
    """The message the server refuses a call with (without the SDK's "Error executing tool ..." prefix)."""
    text = await error(client, tool, args)
    return text.removeprefix(f"Error executing tool {tool}: ")


def worker_error(work: Any, spec: dict[str, Any], tmp_path: Path) -> str:
    """The message a work function refuses `spec` with, before starting any rank."""
    with pytest.raises(InputError) as caught:
        work(spec, FakeContext(tmp_path))
    return str(caught.value)


# ---------------------------------------------------------------------------------------------------------------
# The probe itself


def test_the_probe_sees_the_gpus_and_the_cpu_only_torch(gpus_without_cuda_torch: None) -> None:
    from servers.core.machine import gpus_present

    assert gpus_present() == 2  # NVML (the fake) reports GPUs: the old server decided nccl from this alone
    probe = probe_machine()
    assert probe.nvml_gpus == 2 and probe.visible == (0, 1) and probe.cuda_gpus == 0
    assert probe.capabilities == ((9, 0), (9, 0)) and probe.gpu_free_bytes == (80 * GIB, 80 * GIB)
    reason = probe.why_no_cuda()
    assert reason == (
        "NVML sees 2 GPU(s) but this torch 2.13.0+cpu built without CUDA (torch.version.cuda is None); "
        "install a CUDA build of torch to use them"
    )
    assert backend_decision("auto", probe) == ("gloo", f"auto chose gloo (CPU): {reason}")
    with pytest.raises(InputError, match="backend 'nccl' cannot run here: NVML sees 2 GPU"):
        backend_decision("nccl", probe)
    assert limits.resolve_device("auto", probe) == "cpu"
    assert limits.max_world_size("nccl", probe) == 0


def test_torch_build_is_read_without_importing_torch_and_matches_torch() -> None:
    build = limits.torch_build()
    import torch

    assert build.installed and build.version == str(torch.__version__) and build.cuda == torch.version.cuda


def test_cuda_visible_devices_is_taken_as_cuda_takes_it() -> None:
    assert visible_indices(4, None) == (0, 1, 2, 3)
    assert visible_indices(4, "") == ()
    assert visible_indices(4, "-1") == ()
    assert visible_indices(4, "2,0") == (2, 0)
    assert visible_indices(2, "0,7,1") == (0,)  # CUDA stops at the first entry that names no GPU
    assert visible_indices(2, "GPU-aaaa,GPU-bbbb,GPU-cccc") == (0, 1)
    hidden = MachineProbe(nvml_gpus=2, visible=(), torch=CUDA_TORCH)
    assert hidden.why_no_cuda() == "CUDA_VISIBLE_DEVICES hides all 2 GPU(s) that NVML sees"


# ---------------------------------------------------------------------------------------------------------------
# The server and the worker: the same decision, the same message


@pytest.mark.anyio
async def test_nccl_is_refused_alike_by_the_server_and_the_worker(
    gpus_without_cuda_torch: None, suite_client: Client, tmp_path: Path
) -> None:
    said = await refused_alike(suite_client, {**SMALL, "backend": "nccl"}, tmp_path)
    assert said.startswith("backend 'nccl' cannot run here: NVML sees 2 GPU(s) but this torch 2.13.0+cpu")
    collective = {"op": "all_reduce", "min_bytes": 1024, "max_bytes": 1024, "world_size": 2, "backend": "nccl"}
    assert await server_error(suite_client, "benchmark_collective", collective) == worker_error(
        run_collective_benchmark, collective, tmp_path
    )
    gemm = {"m": 64, "n": 64, "k": 64, "dtype": "fp32", "device": "cuda"}
    said = await server_error(suite_client, "benchmark_gemm", gemm)
    assert said == worker_error(run_gemm_benchmark, gemm, tmp_path)
    assert said.startswith("device 'cuda' cannot run here: NVML sees 2 GPU(s)")
    assert (await ok(suite_client, "list_jobs", {}))["total"] == 0


@pytest.mark.anyio
async def test_auto_resolves_to_gloo_on_both_sides(
    gpus_without_cuda_torch: None, suite_client: Client, tmp_path: Path
) -> None:
    # fp8 shows which backend auto chose: refused as "needs ... the nccl backend", not sent to a worker to fail.
    said = await refused_alike(suite_client, {**SMALL, "dtype": "fp8", "backend": "auto"}, tmp_path)
    assert said.startswith("fp8 needs NVIDIA GPUs with FP8 tensor cores (sm_89 or newer) and the nccl backend")
    # The workers, in this process with the same fakes: auto runs on gloo and says why.
    why = f"auto chose gloo (CPU): {probe_machine().why_no_cuda()}"
    auto = {**SMALL, "backend": "auto", "methods": ["sequential"]}
    for work, spec in ((run_overlap_benchmark, auto), (run_overlap_tune, as_tune(auto))):
        result = work(spec, FakeContext(tmp_path))
        assert result["backend"] == "gloo" and result["device"] == "cpu"
        assert result["backend_decision"] == why
    # The server, with the same fakes: auto chose gloo for the same reason (its job then decides again for itself).
    job = await suite_client.call_tool("tune_overlap", {**as_tune(auto), "wait_s": 45})
    assert not job.is_error and why in job.content[0].text
    assert job.structured_content["state"] == "SUCCEEDED", job.structured_content["reason"]


@pytest.mark.anyio
async def test_limits_of_a_gpu_host_are_refused_alike(two_old_gpus: None, suite_client: Client, tmp_path: Path) -> None:
    """NVML sees two sm_80 GPUs with 1 GiB free and torch has CUDA: auto is nccl, and its limits are the GPUs'."""
    assert backend_decision("auto")[0] == "nccl"
    said = await refused_alike(suite_client, {**SMALL, "world_size": 4, "backend": "auto"}, tmp_path)
    assert said == "world_size 4 is more than this machine runs with nccl: at most 2 (GPUs CUDA can use)"
    fp8 = {**SMALL, "m": 128, "n": 64, "k": 64, "dtype": "fp8", "backend": "auto"}
    said = await refused_alike(suite_client, fp8, tmp_path)
    assert said == "fp8 needs compute capability 8.9 or newer; these GPUs are sm_80"
    big = {**SMALL, "m": 16384, "n": 16384, "k": 16384, "backend": "auto"}
    said = await refused_alike(suite_client, big, tmp_path)
    assert said.startswith("layer up: ")
    assert "per rank but only 1.0 GiB is available (free memory of the smallest of the 2 GPU(s) (NVML))" in said
    assert (await ok(suite_client, "list_jobs", {}))["total"] == 0


def test_dtypes_that_need_tensor_cores_say_which() -> None:
    """tf32 (fp32 data, TF32 math) needs sm_80+, fp8 sm_89+; fp32, bf16 and fp16 run anywhere."""
    turing = MachineProbe(nvml_gpus=2, visible=(0, 1), torch=CUDA_TORCH, capabilities=((7, 5), (7, 5)))
    ampere = MachineProbe(nvml_gpus=2, visible=(0, 1), torch=CUDA_TORCH, capabilities=((8, 0), (8, 0)))
    with pytest.raises(InputError, match=r"^tf32 needs compute capability 8\.0 or newer; these GPUs are sm_75$"):
        limits.check_dtype("tf32", "nccl", 2, turing)
    limits.check_dtype("tf32", "cuda", 1, ampere)
    with pytest.raises(InputError, match=r"^fp8 needs compute capability 8\.9 or newer; these GPUs are sm_80$"):
        limits.check_dtype("fp8", "nccl", 2, ampere)
    with pytest.raises(InputError, match=r"^tf32 needs .* \(sm_80 or newer\); tf32 is fp32 data .* use fp32 on CPU"):
        limits.check_dtype("tf32", "cpu", 1, ampere)
    for dtype in ("fp32", "bf16", "fp16"):
        limits.check_dtype(dtype, "gloo", 2, turing)


def test_one_nvml_session_shuts_down_and_says_why_it_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from servers.core.machine import NvmlUnavailable, gpus_present, nvml_session

    nvml = fake_nvml(1)
    calls: list[str] = []
    nvml.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with pytest.raises(RuntimeError, match="inside"), nvml_session():
        raise RuntimeError("inside")
    assert calls == ["shutdown"]  # shut down even when the block fails

    def no_driver() -> None:
        raise nvml.NVMLError("Driver Not Loaded")  # type: ignore[attr-defined]

    nvml.nvmlInit = no_driver  # type: ignore[attr-defined]
    with pytest.raises(NvmlUnavailable, match=r"NVML could not start \(Driver Not Loaded\)"), nvml_session():
        pass
    assert gpus_present() == 0 and probe_machine().nvml_gpus == 0
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py is not installed"), nvml_session():
        pass
    assert gpus_present() == 0
