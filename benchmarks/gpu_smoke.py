"""A short smoke test for one NVIDIA GPU: GEMM timing, the project's timing loop, fp8, GEMM/copy overlap, NVML.

Self-contained on purpose: it needs torch and nvidia-ml-py only (numpy and scipy are not used; mcp and pydantic are
not needed), so it runs from the checkout on a bare GPU machine without installing this project. Of the project it
imports only servers/core/machine.py (standard library only), for NVML through nvml_session as every reader of NVML
does; it does not import the project's gemm benchmark (that module needs pydantic): section (b) copies its timing
loop instead.

Sections, each reported in the JSON printed at the end:
  a) bare bf16 GEMM, 8192^3 by default: CUDA events around a batch of back-to-back torch.matmul calls, plus a
     correctness check of a slice against a float32 product;
  b) the same GEMM through a copy of the timing loop of servers/overlap/gemm.py (events and a synchronize per
     iteration, metrics and progress files written between iterations), and the overhead ratio (b) / (a);
  c) fp8 (e4m3 in, bf16 out) through torch._scaled_mm when the GPU is sm_89 or newer, with a correctness check;
  d) single-GPU overlap: the GEMM on one stream and a device-to-device copy on another: T_gemm, T_copy, T_both and
     E = (T_gemm + T_copy - T_both) / T_copy (1: the copy is fully hidden), scored only when the timings pass the
     validity checks of servers/overlap/validity.py (copied here; otherwise the section fails and says why);
  e) NVML: name, memory, temperature, power, clocks and clocks-event (throttle) reasons, idle and under load.

Exit status: 0 when every section ran and every check passed, 1 otherwise; 0 with "no CUDA device: nothing to
check" when there is no CUDA device. The whole run stops itself after --time-limit seconds (default 270).

    python benchmarks/gpu_smoke.py
    python benchmarks/gpu_smoke.py --size 4096 --iters 20
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # servers.core.machine from the checkout, not an installed copy

RTOL_BF16 = 2e-2  # max|out - ref| <= RTOL * max|ref| for bf16/fp8 GEMMs against a float32 product


class SmokeTimeoutError(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise SmokeTimeoutError("the smoke test ran past its time limit")


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def rel_err(out: Any, ref: Any) -> float:
    return float((out.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30))


# ---------------------------------------------------------------------------------------------------------------
# a) bare timing


def bare_gemm(torch: Any, size: int, iters: int) -> dict[str, Any]:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        c = torch.matmul(a, b)
    end.record()
    end.synchronize()
    per_gemm = start.elapsed_time(end) / iters
    rows = min(size, 256)
    ref = a[:rows].float() @ b.float()
    err = rel_err(c[:rows], ref)
    return {
        "shape": [size, size, size],
        "dtype": "bf16",
        "iters": iters,
        "mean_ms": per_gemm,
        "tflops": tflops(size, size, size, per_gemm),
        "timing": "CUDA events around the whole batch of back-to-back GEMMs, divided by iters",
        "rel_err": err,
        "passed": err <= RTOL_BF16,
    }


# ---------------------------------------------------------------------------------------------------------------
# b) the project's loop


class FileContext:
    """Stands in for servers.core.jobfiles.JobContext: the same file writes (a JSON line appended per metrics row,
    an atomic fsync'ed rewrite of progress.json), so that the loop below costs what the job's loop costs."""

    def __init__(self, root: Path) -> None:
        self.metrics = root / "metrics.jsonl"
        self.progress_file = root / "progress.json"

    def log_metrics(self, step: int | None = None, **values: Any) -> None:
        row = {"step": step, "time": round(time.time(), 3), **values}
        with open(self.metrics, "a") as f:
            f.write(json.dumps(row, default=float) + "\n")

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.progress_file.parent, prefix=".progress.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"done": done, "total": total, "message": message, "time": round(time.time(), 3)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.progress_file)


def project_loop(torch: Any, size: int, warmup: int, iters: int) -> dict[str, Any]:
    device = torch.device("cuda")
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)

    def gemm() -> Any:
        return torch.matmul(a, b)

    flush = None
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        ctx = FileContext(Path(tmp))
        # This loop mirrors run_gemm_benchmark in servers/overlap/gemm.py (flush_l2 off): keep the two in step.
        total = warmup + iters
        for i in range(warmup):
            gemm()
            ctx.progress(i + 1, total, "warm-up")
        torch.cuda.synchronize(device)
        times_ms: list[float] = []
        for i in range(iters):
            if flush is not None:
                flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            gemm()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end)
            times_ms.append(elapsed)
            ctx.log_metrics(step=i, time_ms=round(elapsed, 6), tflops=round(tflops(size, size, size, elapsed), 6))
            ctx.progress(warmup + i + 1, total, f"iteration {i + 1}/{iters}")
    median = statistics.median(times_ms)
    return {
        "iters": iters,
        "median_ms": median,
        "min_ms": min(times_ms),
        "max_ms": max(times_ms),
        "tflops": tflops(size, size, size, median),
        "timing": "copy of gemm.py's loop: events and a synchronize per iteration, median",
    }


# ---------------------------------------------------------------------------------------------------------------
# c) fp8


def fp8_gemm(torch: Any, size: int, iters: int) -> dict[str, Any]:
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9) or not hasattr(torch, "_scaled_mm"):
        return {"skipped": f"fp8 needs sm_89 or newer and torch._scaled_mm; this GPU is sm_{cap[0]}{cap[1]}"}
    a = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
    one = torch.ones((), device="cuda")

    def gemm() -> Any:
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    for _ in range(5):
        gemm()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        c = gemm()
    end.record()
    end.synchronize()
    per_gemm = start.elapsed_time(end) / iters
    rows = min(size, 256)
    ref = a[:rows].float() @ b.float()
    err = rel_err(c[:rows], ref)
    return {
        "dtype": "fp8 e4m3 -> bf16",
        "mean_ms": per_gemm,
        "tflops": tflops(size, size, size, per_gemm),
        "rel_err": err,
        "passed": err <= RTOL_BF16,
    }


# ---------------------------------------------------------------------------------------------------------------
# d) GEMM and copy on two streams


def gemm_copy_overlap(torch: Any, size: int, copy_mib: int, reps: int) -> dict[str, Any]:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(copy_mib * 2**20, dtype=torch.uint8, device="cuda").fill_(7)
    dst = torch.empty_like(src)
    compute = torch.cuda.current_stream()
    side = torch.cuda.Stream()

    def timed(run_gemm: bool, copies: int) -> float:
        torch.cuda.synchronize()
        start, end, side_done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record(compute)
        side.wait_event(start)
        with torch.cuda.stream(side):
            for _ in range(copies):
                dst.copy_(src, non_blocking=True)
            side_done.record(side)
        if run_gemm:
            for _ in range(reps):
                torch.matmul(a, b)
        compute.wait_event(side_done)
        end.record(compute)
        end.synchronize()
        return float(start.elapsed_time(end))

    timed(True, 1)  # warm-up of both paths
    t_one_copy = statistics.median(timed(False, 1) for _ in range(3))
    gemm_samples = [timed(True, 0) for _ in range(SAMPLES)]
    t_gemm = statistics.median(gemm_samples)
    copies = max(1, round(t_gemm / max(t_one_copy, 1e-6)))  # about as long as the GEMMs, so both can hide
    copy_samples = [timed(False, copies) for _ in range(SAMPLES)]
    both_samples = [timed(True, copies) for _ in range(SAMPLES)]
    t_copy, t_both = statistics.median(copy_samples), statistics.median(both_samples)
    torch.cuda.synchronize()
    copied_ok = bool(torch.equal(dst[:4096], src[:4096]))
    samples = {"T_gemm": gemm_samples, "T_copy": copy_samples, "T_both": both_samples}
    invalid = overlap_invalid_reasons(t_gemm, t_copy, t_both, samples)
    valid = not invalid
    return {
        "gemm": f"{reps} x bf16 {size}^3 on the current stream",
        "copy": f"{copies} x {copy_mib} MiB device-to-device copy_ on a second stream",
        "t_gemm_ms": t_gemm,
        "t_copy_ms": t_copy,
        "t_both_ms": t_both,
        "samples_ms": samples,
        # Scored only when the timings pass the validity checks (as the overlap benchmarks do): else None and why.
        "valid": valid,
        "invalid_reasons": invalid,
        "efficiency": (t_gemm + t_copy - t_both) / t_copy if valid else None,
        "speedup_vs_serial": (t_gemm + t_copy) / t_both if valid else None,
        "copy_bandwidth_gbs": 2 * copies * copy_mib * 2**20 / (t_copy * 1e-3) / 1e9 if t_copy > 0 else None,
        "copied_ok": copied_ok,
        "passed": copied_ok and t_both > 0 and valid,
    }


# The validity rules of servers/overlap/validity.py, copied (of the project this script imports machine.py only):
# keep them in step. Overlap hides the shorter part inside the longer one, never more; E above 1.05 is impossible; a
# spread (p90 - p10) / median above 0.25 over the samples makes the median meaningless.
REL_NOISE = 0.05
ABS_NOISE_MS = 0.005
E_MAX = 1.05
MAX_SPREAD = 0.25
SAMPLES = 5


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def overlap_invalid_reasons(t_gemm: float, t_copy: float, t_both: float, samples: dict[str, list[float]]) -> list[str]:
    """Why these timings cannot be scored (empty when they can)."""
    reasons = []
    if t_gemm <= 0 or t_copy <= 0:
        return [f"T_gemm {t_gemm:.4g} ms and T_copy {t_copy:.4g} ms must both be > 0"]
    longest = max(t_gemm, t_copy)
    margin = max(REL_NOISE * longest, ABS_NOISE_MS)
    if t_both < longest - margin:
        reasons.append(
            f"T_both {t_both:.4g} ms is less than its longest part {longest:.4g} ms minus noise {margin:.3g}"
        )
    efficiency = (t_gemm + t_copy - t_both) / t_copy
    if efficiency > E_MAX:
        reasons.append(f"E = {efficiency:.3g} > {E_MAX:g}: more than all of the copy hidden")
    for name, values in samples.items():
        median = statistics.median(values)
        spread = (_percentile(values, 0.9) - _percentile(values, 0.1)) / median if median > 0 else float("inf")
        if spread > MAX_SPREAD:
            reasons.append(f"spread of {name} (p90 - p10) / median = {spread:.3g} > {MAX_SPREAD:g}")
    return reasons


# ---------------------------------------------------------------------------------------------------------------
# e) NVML


def nvml_handle(pynvml: Any, torch: Any) -> Any:
    """The NVML handle of torch's cuda:0, by UUID or PCI address (CUDA_VISIBLE_DEVICES may renumber GPUs)."""
    props = torch.cuda.get_device_properties(0)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        try:
            text = str(uuid)
            return pynvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
        except Exception:
            pass
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        try:
            address = f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
            return pynvml.nvmlDeviceGetHandleByPciBusId(address)
        except Exception:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def event_reason_names(pynvml: Any, mask: int) -> list[str]:
    names = []
    for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
        for attr in dir(pynvml):
            if not attr.startswith(prefix) or attr.endswith(("All", "None", "Unknown")):
                continue
            bit = getattr(pynvml, attr)
            label = attr[len(prefix) :]
            if isinstance(bit, int) and bit and mask & bit and label not in names:
                names.append(label)
        if names:
            break
    return names


def nvml_read(pynvml: Any, handle: Any) -> dict[str, Any]:
    def get(fn: str, *args: Any) -> Any:
        try:
            return getattr(pynvml, fn)(handle, *args)
        except Exception as exc:  # a field this GPU or driver does not report
            return f"unavailable: {type(exc).__name__}"

    mem = get("nvmlDeviceGetMemoryInfo")
    power = get("nvmlDeviceGetPowerUsage")
    limit = get("nvmlDeviceGetEnforcedPowerLimit")
    reasons_fn = (
        "nvmlDeviceGetCurrentClocksEventReasons"
        if hasattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
        else "nvmlDeviceGetCurrentClocksThrottleReasons"
    )
    mask = get(reasons_fn)
    name = get("nvmlDeviceGetName")
    return {
        "name": name.decode() if isinstance(name, bytes) else name,
        "memory_total_mib": mem.total / 2**20 if hasattr(mem, "total") else mem,
        "memory_used_mib": mem.used / 2**20 if hasattr(mem, "used") else mem,
        "temperature_c": get("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU),
        "power_w": power / 1000 if isinstance(power, int) else power,
        "power_limit_w": limit / 1000 if isinstance(limit, int) else limit,
        "sm_clock_mhz": get("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM),
        "mem_clock_mhz": get("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_MEM),
        "max_sm_clock_mhz": get("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM),
        "clocks_event_reasons_mask": mask,
        "clocks_event_reasons": event_reason_names(pynvml, mask) if isinstance(mask, int) else mask,
    }


def nvml_section(torch: Any, size: int) -> dict[str, Any]:
    # Standard library only (tests/test_startup_imports.py checks it imports without pydantic and mcp). Where NVML
    # cannot start, NvmlUnavailable says why and the section reports it as its error.
    from servers.core.machine import nvml_session

    with nvml_session() as pynvml:
        handle = nvml_handle(pynvml, torch)
        idle = nvml_read(pynvml, handle)
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # keep the GPU busy, then read while the queue still runs
            for _ in range(10):
                torch.matmul(a, b)
            torch.cuda.synchronize()
        for _ in range(20):
            torch.matmul(a, b)
        load = nvml_read(pynvml, handle)
        torch.cuda.synchronize()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "idle": idle,
            "under_load": load,
            "passed": isinstance(idle["name"], str) and not idle["name"].startswith("unavailable"),
        }


# ---------------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=8192, help="M = N = K of the GEMMs")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--copy-mib", type=int, default=512, help="bytes of one device-to-device copy, in MiB")
    parser.add_argument("--time-limit", type=int, default=270, help="seconds before the run stops itself")
    args = parser.parse_args()

    try:
        import torch
    except ImportError as exc:
        print(json.dumps({"error": f"torch is not importable: {exc}"}))
        return 1
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("no CUDA device: nothing to check")
        return 0

    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(args.time_limit)
    started = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "memory_gib": props.total_memory / 2**30,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "size": args.size,
    }
    free = torch.cuda.mem_get_info()[0]
    need = 3 * args.size**2 * 2 * 2 + 2 * args.copy_mib * 2**20
    if need > free:
        report["error"] = f"needs about {need:,} bytes of GPU memory, {free:,} free: use a smaller --size"
        print(json.dumps(report, indent=2))
        return 1

    sections = {
        "a_bare_gemm": lambda: bare_gemm(torch, args.size, args.iters),
        "b_project_loop": lambda: project_loop(torch, args.size, 5, args.iters),
        "c_fp8": lambda: fp8_gemm(torch, args.size, args.iters),
        "d_gemm_copy_overlap": lambda: gemm_copy_overlap(torch, args.size, args.copy_mib, 5),
        "e_nvml": lambda: nvml_section(torch, args.size),
    }
    failed: list[str] = []
    try:
        for name, run in sections.items():
            try:
                report[name] = run()
            except SmokeTimeoutError:
                raise
            except Exception as exc:
                report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            if report[name].get("passed") is False or "error" in report[name]:
                failed.append(name)
            torch.cuda.empty_cache()
    except SmokeTimeoutError as exc:
        report["error"] = f"{exc} ({args.time_limit} s)"
        failed.append("time limit")
    finally:
        signal.alarm(0)
    bare, loop = report.get("a_bare_gemm", {}), report.get("b_project_loop", {})
    if "mean_ms" in bare and "median_ms" in loop:
        report["loop_overhead_ratio"] = loop["median_ms"] / bare["mean_ms"]
    report["wall_s"] = time.perf_counter() - started
    report["failed"] = failed
    report["ok"] = not failed
    print(json.dumps(report, indent=2, default=str))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
