"""GEMM benchmark: the work function of the `gemm_benchmark` job kind, run in a worker process.

torch is imported inside the function (never by the server). On a GPU: warm-up, CUDA events around each
GEMM, optional L2 flush between iterations (outside the timed region), median and spread, TFLOP/s and the
fraction of the catalog's dense peak. On CPU the same code runs with a wall clock, and the result says that
such timings check the plumbing, not GPU performance.
"""

import statistics
import time
from typing import Annotated, Any, Literal

from pydantic import Field

from servers.core.dtypes import ELEMENT_BYTES, GEMM_OUTPUT_BYTES, Dtype, DtypeArg
from servers.core.models import Model
from servers.overlap.limits import MachineProbe, check_dtype, check_memory, probe_machine, resolve_device

# The fields of the job's spec, typed and described once: benchmark_gemm takes them as flat arguments.
GemmM = Annotated[int, Field(ge=1, le=131072)]
GemmN = Annotated[int, Field(ge=1, le=131072)]
GemmK = Annotated[int, Field(ge=1, le=131072)]
GemmDevice = Annotated[Literal["auto", "cpu", "cuda"], Field(description="auto: cuda if present")]
GemmWarmup = Annotated[int, Field(ge=0, le=1000)]
GemmIters = Annotated[int, Field(ge=1, le=10000)]
FlushL2 = Annotated[bool, Field(description="GPU: inputs from HBM, not L2")]


class GemmBenchmarkSpec(Model):
    m: GemmM
    n: GemmN
    k: GemmK
    dtype: DtypeArg = "bf16"
    device: GemmDevice = "auto"
    warmup: GemmWarmup = 5
    iters: GemmIters = 20
    flush_l2: FlushL2 = False


class GemmBenchmarkResult(Model):
    m: int
    n: int
    k: int
    dtype: Dtype
    device: str
    device_name: str
    iters: int
    median_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    tflops: float = Field(description="2*m*n*k / median time")
    gpu_catalog_name: str | None = Field(description="Catalog entry matched to the device, if any")
    peak_tflops: float | None = Field(description="The catalog's dense peak for this dtype")
    fraction_of_peak: float | None
    timing: str = Field(description="How the time was measured")
    note: str | None = None


def _percentile(sorted_values: list[float], q: float) -> float:
    position = q * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def prepare_gemm(spec: GemmBenchmarkSpec, probe: MachineProbe | None = None) -> str:
    """The device ('cuda' or 'cpu') the GEMM runs on here; InputError when it cannot run (cuda without a usable GPU,
    fp8 without sm_89, tf32 without sm_80, A, B and C larger than the memory there). The server calls it before
    submitting the job, the work function again before allocating (the same probe and messages)."""
    probe = probe or probe_machine()
    device = resolve_device(spec.device, probe)
    check_dtype(spec.dtype, device, 1, probe)
    elem, out = ELEMENT_BYTES[spec.dtype], GEMM_OUTPUT_BYTES[spec.dtype]
    need = (spec.m * spec.k + spec.k * spec.n) * elem + spec.m * spec.n * out
    where = "GPU 0" if device == "cuda" else "host memory"
    check_memory(need, device, 1, f"a {spec.m}x{spec.n}x{spec.k} {spec.dtype} GEMM (A, B and C, on {where})", probe)
    return device


def run_gemm_benchmark(spec_data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    import torch

    from servers.core.dtypes import set_matmul_math, torch_dtype
    from servers.overlap.limits import confirm_cuda_runtime, confirm_dtype_runtime

    spec = GemmBenchmarkSpec.model_validate(spec_data)
    chosen = prepare_gemm(spec)
    confirm_cuda_runtime(chosen, 1)
    confirm_dtype_runtime(spec.dtype)
    set_matmul_math(spec.dtype)
    use_cuda = chosen == "cuda"
    device = torch.device(chosen)
    device_name = torch.cuda.get_device_name(device) if use_cuda else "cpu"
    torch.manual_seed(0)

    if spec.dtype == "fp8":
        a = torch.randn(spec.m, spec.k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(spec.n, spec.k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
        one = torch.ones((), device=device)

        def gemm() -> Any:
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        a = torch.randn(spec.m, spec.k, device=device, dtype=torch_dtype(spec.dtype))
        b = torch.randn(spec.k, spec.n, device=device, dtype=torch_dtype(spec.dtype))

        def gemm() -> Any:
            return torch.matmul(a, b)

    flush = None
    if spec.flush_l2 and use_cuda:
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
        flush = torch.empty(2 * l2_bytes // 4, dtype=torch.float32, device=device)

    total = spec.warmup + spec.iters
    for i in range(spec.warmup):
        gemm()
        ctx.progress(i + 1, total, "warm-up")
    if use_cuda:
        torch.cuda.synchronize(device)

    times_ms: list[float] = []
    for i in range(spec.iters):
        if flush is not None:
            flush.zero_()
        if use_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            gemm()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            gemm()
            elapsed = (time.perf_counter() - t0) * 1e3
        times_ms.append(elapsed)
        flops = 2.0 * spec.m * spec.n * spec.k
        step_tflops = flops / (elapsed * 1e-3) / 1e12 if elapsed > 0 else 0.0  # a timer may read 0 for tiny GEMMs
        ctx.log_metrics(step=i, time_ms=round(elapsed, 6), tflops=round(step_tflops, 6))
        ctx.progress(spec.warmup + i + 1, total, f"iteration {i + 1}/{spec.iters}")

    ordered = sorted(times_ms)
    median = statistics.median(ordered)
    tflops = 2.0 * spec.m * spec.n * spec.k / (median * 1e-3) / 1e12 if median > 0 else 0.0
    catalog_name = peak = fraction = None
    note = None
    if use_cuda:
        from servers.core.errors import InputError
        from servers.core.gpus import find_gpu, peak_tflops

        try:
            gpu = find_gpu(device_name)
            catalog_name = gpu.name
            peak = peak_tflops(gpu, spec.dtype)
            fraction = tflops / peak
        except InputError as exc:
            note = f"no catalog peak for {device_name} ({exc})"
    else:
        note = "measured on CPU: these timings check the plumbing, not GPU performance"
    result = GemmBenchmarkResult(
        m=spec.m,
        n=spec.n,
        k=spec.k,
        dtype=spec.dtype,
        device=str(device),
        device_name=device_name,
        iters=spec.iters,
        median_ms=median,
        min_ms=ordered[0],
        max_ms=ordered[-1],
        p10_ms=_percentile(ordered, 0.1),
        p90_ms=_percentile(ordered, 0.9),
        tflops=tflops,
        gpu_catalog_name=catalog_name,
        peak_tflops=peak,
        fraction_of_peak=fraction,
        timing="CUDA events per iteration" if use_cuda else "time.perf_counter per iteration",
        note=note,
    )
    print(
        f"gemm {spec.m}x{spec.n}x{spec.k} {spec.dtype} on {device_name}: median {median:.4f} ms, {tflops:.3f} TFLOP/s",
        flush=True,
    )
    return result.model_dump(mode="json")
