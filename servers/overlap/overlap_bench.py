"""Overlapped tensor-parallel GEMMs (the `overlap_tune` job kind, which tune_overlap starts, and `overlap_benchmark`,
one measurement, which no tool starts: benchmarks/ and the tests call its work function).

Shapes follow Flux: M, N, K are the global GEMM dimensions and TP = world_size.
- ag_gemm (column parallel): rank r holds rows [M/TP, K] of A and the weight slice W [K, N/TP]; it all-gathers A
  and computes C = A @ W, [M, N/TP].
- gemm_rs (row parallel): rank r holds A [M, K/TP] and B [K/TP, N]; the partial product [M, N] is reduce-scattered
  over rows, so rank r ends with rows r*M/TP .. (r+1)*M/TP of the sum, [M/TP, N].
- gemm_ar: the same partial product, all-reduced: every rank ends with the whole [M, N].

Methods: sequential (collective then GEMM, or GEMM then collective); chunked (C chunks of the communicated rows;
chunk c+1's collective is in flight while chunk c's GEMM runs; on CUDA the collectives go on their own stream,
ordered with events); ring (point-to-point exchange with batch_isend_irecv: each step sends the block in hand to
rank r+1 and receives the next from r-1 while the GEMM on the block in hand runs; for gemm_rs the block is a partial
sum that accumulates along the ring; gemm_ar = that ring reduce-scatter followed by an all-gather); symm_mem (torch's
fused_all_gather_matmul / fused_matmul_reduce_scatter, only on CUDA GPUs joined by NVLink when the ops exist).

Every method's output is compared with the sequential result on every rank (see TOLERANCE_RULE). Times are medians
over iterations of the slowest rank, with a barrier before each iteration. Every result carries validity checks
(validity.py): rows whose numbers cannot be true are flagged with the reason, lose their scores, and are never chosen
as best. What can run here is decided by `prepare_overlap` / `prepare_tune`, which the server calls before it
submits the job and the work functions call again before any rank starts (one probe, one validation, one message).
torch is imported inside functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from servers.core.dtypes import ELEMENT_BYTES, GEMM_OUTPUT_BYTES, DtypeArg
from servers.core.errors import InputError
from servers.core.models import Model
from servers.overlap import validity
from servers.overlap.distributed import (
    BackendChoice,
    RankInfo,
    RankTimeoutS,
    WorldSize,
    describe_device,
    rank_progress,
    run_ranks,
    slowest_rank_series,
    time_iterations,
)
from servers.overlap.limits import (
    MachineProbe,
    backend_decision,
    check_dtype,
    check_memory,
    check_world_size,
    confirm_dtype_runtime,
    fmt_bytes,
    probe_machine,
)

Pattern = Literal["ag_gemm", "gemm_rs", "gemm_ar"]
Method = Literal["sequential", "chunked", "ring", "symm_mem"]
ALL_METHODS: tuple[Method, ...] = ("sequential", "chunked", "ring", "symm_mem")

# Relative tolerance of a method's output against the sequential result, by input dtype (fp8 GEMMs output bf16).
# tf32 rounds the inputs to a 10-bit mantissa (2^-11), and a method's smaller GEMMs may run another cuBLAS kernel
# than the reference's: its bound scales the bf16 one (2^-8 -> 2e-2) by the mantissa, 2.5e-3.
RTOL = {"fp32": 1e-4, "tf32": 2.5e-3, "bf16": 2e-2, "fp16": 2e-2, "fp8": 2e-2}
TOLERANCE_RULE = (
    "passed when max|out - ref| <= rtol * max|ref| on every rank, where ref is the sequential result on that rank; "
    "rtol = 1e-4 for fp32, 2.5e-3 for tf32, 2e-2 for bf16, fp16 and fp8 (bf16 output)"
)
CPU_NOTE = "timings on CPU (gloo) check plumbing and correctness, not performance"
_RUNTIME_OVERHEAD = {"gloo": 256 * 2**20, "nccl": 2**30}  # torch, its allocator and NCCL buffers, per rank
# Raw timings a result keeps per method (a result must stay small enough for a client to read: 64 ranks x 10000
# iterations x 11 methods would be tens of MiB): the first RAW_RANKS ranks, the first RAW_ITERS iterations each.
# A tune result of several layers keeps none (one entry per layer and method, up to 32 layers); of one layer, these.
RAW_RANKS = 8
RAW_ITERS = 32

Dim = Annotated[int, Field(ge=1, le=131072)]
ChunkCount = Annotated[int, Field(ge=2, le=64)]

# The run options, typed and described once: the job specs below and the tune_overlap tool (servers/overlap/server.py)
# take them alike.
Methods = Annotated[list[Method], Field(min_length=1, max_length=4, description="sequential always runs")]
Chunks = Annotated[list[ChunkCount], Field(min_length=1, max_length=8, description="For chunked")]
Warmup = Annotated[int, Field(ge=0, le=1000)]
Iters = Annotated[int, Field(ge=1, le=10000)]
Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]


class _RunOptions(Model):
    world_size: WorldSize = 2
    dtype: DtypeArg = "bf16"
    methods: Methods = list(ALL_METHODS)  # noqa: RUF012 (a pydantic field: each instance gets a copy)
    chunks: Chunks = [2, 4]  # noqa: RUF012
    backend: BackendChoice = "auto"
    warmup: Warmup = 3
    iters: Iters = 10
    seed: Seed = 0
    rank_timeout_s: RankTimeoutS = 900


class OverlapSpec(_RunOptions):
    pattern: Pattern = Field(default="ag_gemm", description="ag_gemm, gemm_rs or gemm_ar (Flux shape convention)")
    m: Dim = Field(default=4096, description="Global M (rows of A and of the output)")
    n: Dim = Field(default=4096, description="Global N (columns of the weight and of the output)")
    k: Dim = Field(default=4096, description="Global K (the inner dimension)")


class OverlapLayer(Model):  # tune_overlap's layers publish it: described there (m, n, k global), not per field
    layer: str = Field(min_length=1, max_length=64)
    pattern: Pattern
    m: Dim
    n: Dim
    k: Dim


class OverlapTuneSpec(_RunOptions):
    layers: list[OverlapLayer] = Field(min_length=1, max_length=32, description="The layers to tune, one run each")
    predict_for_gpu: str | None = Field(
        default=None,
        max_length=64,
        description="Catalog GPU to put predict_overlap's figures next to the measurement for. Default: the measured "
        "GPU when the catalog has it; otherwise no prediction (and the result says why)",
    )


# ----------------------------------------------------------------------------------------------------------------
# Checks done in the calling process, before any rank starts


def shape_problems(
    pattern: str, m: int, n: int, k: int, world_size: int, methods: list[str], chunks: list[int]
) -> list[str]:
    """Why the shape cannot be split as the pattern and methods need (an empty list when it can)."""
    p = world_size
    problems = []
    needs = {"ag_gemm": {"M": m, "N": n}, "gemm_rs": {"K": k, "M": m}, "gemm_ar": {"K": k}}[pattern]
    if pattern == "gemm_ar" and "ring" in methods:
        needs["M"] = m
    for name, value in needs.items():
        if value % p:
            problems.append(f"{name}={value} is not divisible by world_size {p}")
    if "chunked" in methods:
        for c in chunks:
            unit = c if pattern == "gemm_ar" else p * c
            if m % unit:
                what = f"chunks {c}" if pattern == "gemm_ar" else f"world_size*chunks = {p}*{c}"
                problems.append(f"M={m} is not divisible by {what} (chunked method)")
    return problems


def estimate_bytes_per_rank(pattern: str, m: int, n: int, k: int, world_size: int, dtype: str) -> int:
    """Bytes one rank allocates at most: inputs, the reference, the largest method's buffers, the check's copies."""
    p, e, o = world_size, ELEMENT_BYTES[dtype], GEMM_OUTPUT_BYTES[dtype]
    if pattern == "ag_gemm":
        out = m * n // p
        inputs = (m // p) * k * e + k * (n // p) * e
        reference = m * k * e + 2 * out * o  # gathered A, sequential output and its copy
        method = max(m * k * e + out * o + out * o // 2, 2 * (m // p) * k * e + out * o)
    else:
        out = m * n // p if pattern == "gemm_rs" else m * n
        inputs = m * (k // p) * e + (k // p) * n * e
        reference = m * n * o + 2 * out * o
        method = m * n * o + out * o + 4 * (m // p) * n * o
    check = 3 * out * 4  # float32 copies for the comparison
    return inputs + reference + method + check


def validate_overlap_spec(spec: OverlapSpec, backend: str, probe: MachineProbe | None = None) -> None:
    """InputError for what cannot run here: too many ranks, fp8 without sm_89 GPUs (tf32 without sm_80), shapes that
    do not split, more memory than a rank has. The server calls it before submitting, the work function before
    starting any rank."""
    probe = probe or probe_machine()
    p = spec.world_size
    check_world_size(p, backend, probe)
    check_dtype(spec.dtype, backend, p, probe)
    pattern, m, n, k = spec.pattern, spec.m, spec.n, spec.k
    problems = shape_problems(pattern, m, n, k, p, list(spec.methods), list(spec.chunks))
    if spec.dtype == "fp8":
        dims = {"ag_gemm": (m // p, n // p, k), "gemm_rs": (m // p, n, k // p), "gemm_ar": (m // p, n, k // p)}
        if any(d % 16 for d in dims[pattern]):
            problems.append("fp8 GEMMs (torch._scaled_mm) need every per-rank dimension to be a multiple of 16")
    if problems:
        raise InputError(f"{pattern} M={m} N={n} K={k} on {p} ranks: " + "; ".join(problems))
    overhead = _RUNTIME_OVERHEAD[backend]
    need = estimate_bytes_per_rank(pattern, m, n, k, p, spec.dtype) + overhead
    what = f"{pattern} M={m} N={n} K={k} {spec.dtype} (buffers plus {fmt_bytes(overhead)} for the runtime)"
    check_memory(need, backend, p, what, probe)


def prepare_overlap(spec: OverlapSpec, probe: MachineProbe | None = None) -> tuple[str, str]:
    """(backend, why) for an overlap benchmark, after validate_overlap_spec; InputError when it cannot run here."""
    probe = probe or probe_machine()
    backend, why = backend_decision(spec.backend, probe)
    validate_overlap_spec(spec, backend, probe)
    return backend, why


def plan_tune(spec: OverlapTuneSpec) -> tuple[list[OverlapSpec], dict[str, list[int]]]:
    """One OverlapSpec per layer, and per layer the chunk counts left out because they do not divide its M (left out
    and reported, not an error; a layer none of them divides is tuned without the chunked method)."""
    options = spec.model_dump(exclude={"layers", "predict_for_gpu"})
    layer_specs = []
    skipped: dict[str, list[int]] = {}
    for layer in spec.layers:
        unit = 1 if layer.pattern == "gemm_ar" else spec.world_size
        usable = [c for c in spec.chunks if layer.m % (unit * c) == 0]
        if len(usable) < len(spec.chunks):
            skipped[layer.layer] = [c for c in spec.chunks if c not in usable]
        methods = [mth for mth in spec.methods if mth != "chunked" or usable]
        layer_specs.append(
            OverlapSpec.model_validate(
                {
                    **options,
                    "pattern": layer.pattern,
                    "m": layer.m,
                    "n": layer.n,
                    "k": layer.k,
                    "methods": methods or ["sequential"],
                    "chunks": usable or [2],
                }
            )
        )
    return layer_specs, skipped


def prepare_tune(
    spec: OverlapTuneSpec, probe: MachineProbe | None = None
) -> tuple[str, str, list[OverlapSpec], dict[str, list[int]]]:
    """(backend, why, per-layer specs, skipped chunk counts) for a tune sweep; InputError naming the first layer
    that cannot run here, or an unknown predict_for_gpu."""
    probe = probe or probe_machine()
    backend, why = backend_decision(spec.backend, probe)
    if spec.predict_for_gpu is not None:
        from servers.core.gpus import find_gpu

        find_gpu(spec.predict_for_gpu)  # InputError listing the catalog's names
    check_world_size(spec.world_size, backend, probe)
    check_dtype(spec.dtype, backend, spec.world_size, probe)
    layer_specs, skipped = plan_tune(spec)
    for layer, layer_spec in zip(spec.layers, layer_specs, strict=True):
        try:
            validate_overlap_spec(layer_spec, backend, probe)
        except InputError as exc:
            raise InputError(f"layer {layer.layer}: {exc}") from exc
    return backend, why, layer_specs, skipped


# ----------------------------------------------------------------------------------------------------------------
# Rank side


class _Unavailable(Exception):  # noqa: N818 (a reason, not an error: the method's entry says it)
    pass


class _Comm:
    """Issue collectives asynchronously. CPU (gloo): the backend's own threads, wait() on the work. CUDA: on a
    stream of their own; the compute stream waits on an event recorded after them."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda = cuda
        self.stream = torch.cuda.Stream() if cuda else None

    def begin(self) -> None:
        """At the start of a method call: communication may read what the compute stream wrote before."""
        import torch

        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())

    def start(self, issue: Any, *, after_compute: bool = False) -> Any:
        """Run issue() (which returns a list of async works); `after_compute`: wait for the GEMMs queued so far."""
        import torch

        if self.stream is None:
            return issue()
        if after_compute:
            self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            works = issue()
            for work in works:
                work.wait()  # the communication stream waits for the backend's internal stream
            event = torch.cuda.Event()
            event.record(self.stream)
        return event

    def finish(self, handle: Any) -> None:
        import torch

        if self.stream is None:
            for work in handle:
                work.wait()
        else:
            torch.cuda.current_stream().wait_event(handle)


def _symm_mem_reason(info: RankInfo, pattern: str, dtype: str) -> str | None:
    """None when torch's symmetric-memory fused ops can run here, else why not (decided alike on every rank)."""
    import torch

    if info.device == "cpu":
        return "needs CUDA GPUs joined by NVLink and the nccl backend; this run uses gloo on CPU"
    if pattern == "gemm_ar":
        return "torch symmetric memory has no fused matmul + all-reduce op"
    if dtype == "fp8":
        return "the fp8 (scaled) symmetric-memory ops are not wired into this benchmark"
    name = "fused_all_gather_matmul" if pattern == "ag_gemm" else "fused_matmul_reduce_scatter"
    try:
        namespace = torch.ops.symm_mem
        getattr(namespace, name)
    except (AttributeError, RuntimeError):
        return f"this torch ({torch.__version__}) has no torch.ops.symm_mem.{name}"
    return _nvlink_reason(info)


def _nvlink_reason(info: RankInfo) -> str | None:
    """None when this rank's GPU has an active NVLink (NVML) or, without NVML, peer access to every other GPU."""
    import os

    import torch

    from servers.core.machine import nvml_session

    try:
        with nvml_session() as pynvml:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            index = info.rank
            if visible:
                ids = [v.strip() for v in visible.split(",")]
                if not ids[info.rank].isdigit():
                    raise ValueError("CUDA_VISIBLE_DEVICES uses UUIDs")
                index = int(ids[info.rank])
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                        return None
                except pynvml.NVMLError:
                    break
            return "no active NVLink on this GPU (NVML); symmetric memory needs NVLink peers"
    except Exception:  # no NVML, or UUIDs in CUDA_VISIBLE_DEVICES: ask CUDA instead
        pass
    for other in range(info.world_size):
        if other != info.rank and not torch.cuda.can_device_access_peer(info.rank, other):
            return f"cuda:{info.rank} has no peer access to cuda:{other}"
    return None


class _Rank:
    """What every pattern shares on one rank: torch, the dtypes, the communication stream, the seeded generator, and
    the GEMM / buffer / point-to-point helpers."""

    def __init__(self, info: RankInfo, cfg: dict[str, Any]) -> None:
        import torch
        import torch.distributed as dist

        from servers.core.dtypes import gemm_output_torch_dtype, set_matmul_math, torch_dtype

        self.torch, self.dist = torch, dist
        self.r, self.p = info.rank, info.world_size
        self.dtype: str = cfg["dtype"]
        self.device = torch.device(info.device)
        self.cuda = self.device.type == "cuda"
        self.fp8 = self.dtype == "fp8"
        self.in_dtype = torch_dtype(self.dtype)
        self.out_dtype = gemm_output_torch_dtype(self.dtype)
        set_matmul_math(self.dtype)  # tf32: TF32 tensor-core math on fp32 data
        self.all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self.comm = _Comm(self.cuda)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(int(cfg["seed"]) * 65537 + self.r)
        self.one = torch.ones((), device=self.device)

    def randn(self, *shape: int, scale: float = 1.0) -> Any:
        torch = self.torch
        return (torch.randn(*shape, generator=self.gen, device=self.device) * scale).to(self.in_dtype)

    def weight(self, rows: int, cols: int, scale: float) -> Any:
        """A [rows, cols] weight; for fp8 stored column-major, as _scaled_mm needs its second operand."""
        return self.randn(cols, rows, scale=scale).t() if self.fp8 else self.randn(rows, cols, scale=scale)

    def wire(self, t: Any) -> Any:
        """What goes over the wire: fp8 travels as raw bytes (no backend reduces or even knows fp8)."""
        return t.view(self.torch.uint8) if self.fp8 else t

    def gemm(self, a: Any, b: Any, out: Any) -> None:
        torch = self.torch
        if not self.fp8:
            torch.matmul(a, b, out=out)
            return
        a2 = a.reshape(-1, a.shape[-1])  # _scaled_mm takes 2-D row-major A and column-major B
        out.copy_(torch._scaled_mm(a2, b, scale_a=self.one, scale_b=self.one, out_dtype=self.out_dtype).view(out.shape))

    def empty(self, *shape: int, dt: Any = None) -> Any:
        return self.torch.empty(*shape, dtype=dt or self.out_dtype, device=self.device)

    def exchange(self, send: Any, recv: Any) -> list[Any]:
        """Send to rank r+1 and receive from rank r-1, asynchronously."""
        dist, r, p = self.dist, self.r, self.p
        ops = [
            dist.P2POp(dist.isend, self.wire(send), (r + 1) % p),
            dist.P2POp(dist.irecv, self.wire(recv), (r - 1) % p),
        ]
        return dist.batch_isend_irecv(ops)


Run = Callable[[], None]


@dataclass
class _Case:
    """One pattern on one rank: its inputs, the sequential schedule (and its GEMM and collective alone), the bytes the
    collective moves, and `build(method, chunks)` -> (function, output) for the chunked and ring methods."""

    a_local: Any
    weight: Any
    out: Any  # the sequential schedule's output
    gemm_alone: Run
    comm_alone: Run
    sequential: Run
    comm_bytes: int
    build: Callable[[str, int], tuple[Run, Any]]


def _ag_gemm(rk: _Rank, m: int, n: int, k: int) -> _Case:
    """AllGather + GEMM: rank r holds rows [M/TP, K] of A and W [K, N/TP]; it gathers A and computes [M, N/TP]."""
    p, r, comm = rk.p, rk.r, rk.comm
    a_local = rk.randn(m // p, k)
    w = rk.weight(k, n // p, k**-0.5)
    a_full = rk.empty(m, k, dt=rk.in_dtype)
    seq_out = rk.empty(m, n // p)

    def gemm_alone() -> None:
        rk.gemm(a_full, w, seq_out)

    def comm_alone() -> None:
        rk.all_gather(rk.wire(a_full), rk.wire(a_local))

    def sequential() -> None:
        comm_alone()
        rk.gemm(a_full, w, seq_out)

    def build(method: str, chunks: int) -> tuple[Run, Any]:
        out = rk.empty(m, n // p)
        rows = m // p
        if method == "chunked":
            mc = rows // chunks
            gathered = [rk.empty(p * mc, k, dt=rk.in_dtype) for _ in range(chunks)]
            results = [rk.empty(p, mc, n // p) for _ in range(chunks)]
            out4 = out.view(p, chunks, mc, n // p)  # rank q's rows, split in chunks

            def run() -> None:
                comm.begin()
                handles: list[Any] = [None] * chunks

                def issue(c: int) -> Any:
                    return comm.start(
                        lambda: [
                            rk.all_gather(rk.wire(gathered[c]), rk.wire(a_local[c * mc : (c + 1) * mc]), async_op=True)
                        ]
                    )

                handles[0] = issue(0)
                for c in range(chunks):
                    comm.finish(handles[c])
                    if c + 1 < chunks:
                        handles[c + 1] = issue(c + 1)
                    rk.gemm(gathered[c].view(p, mc, k), w, results[c])
                    out4[:, c].copy_(results[c])

            return run, out
        # ring: the block in hand goes to r+1 while its GEMM runs; the next comes from r-1
        buffers = [rk.empty(rows, k, dt=rk.in_dtype) for _ in range(2)]

        def run_ring() -> None:
            comm.begin()
            current = a_local
            for step in range(p):
                source = (r - step) % p
                handle = None
                if step < p - 1:
                    incoming = buffers[step % 2]
                    handle = comm.start(lambda cur=current, inc=incoming: rk.exchange(cur, inc), after_compute=True)
                rk.gemm(current, w, out[source * rows : (source + 1) * rows])
                if handle is not None:
                    comm.finish(handle)
                    current = incoming

        return run_ring, out

    comm_bytes = m * k * ELEMENT_BYTES[rk.dtype]
    return _Case(a_local, w, seq_out, gemm_alone, comm_alone, sequential, comm_bytes, build)


def _partial_inputs(rk: _Rank, m: int, n: int, k: int) -> tuple[Any, Any, Any]:
    """gemm_rs and gemm_ar: A [M, K/TP], B [K/TP, N] and the buffer of the partial product [M, N]."""
    p = rk.p
    a_local = rk.randn(m, k // p)
    b_local = rk.weight(k // p, n, k**-0.5)
    return a_local, b_local, rk.empty(m, n)


def _ring_reduce_scatter(rk: _Rank, a_local: Any, b_local: Any, m: int, n: int, then_gather: bool) -> tuple[Run, Any]:
    """The ring method of gemm_rs (and, with then_gather, of gemm_ar: followed by an all-gather): block d's partial
    sum starts at rank d+1, gains each rank's term and ends, complete, at rank d."""
    p, r, comm = rk.p, rk.r, rk.comm
    rows = m // p
    parts = [rk.empty(rows, n) for _ in range(2)]
    incoming = rk.empty(rows, n)
    gathered = rk.empty(m, n) if then_gather else None

    def run() -> None:
        comm.begin()
        handle = None
        for step in range(p):
            d = (r - 1 - step) % p
            part = parts[step % 2]
            rk.gemm(a_local[d * rows : (d + 1) * rows], b_local, part)  # overlaps the exchange in flight
            if handle is not None:
                comm.finish(handle)
                part += incoming
            if step < p - 1:
                handle = comm.start(lambda s=part: rk.exchange(s, incoming), after_compute=True)
        if gathered is not None:
            comm.finish(
                comm.start(lambda: [rk.all_gather(gathered, parts[(p - 1) % 2], async_op=True)], after_compute=True)
            )

    return run, (gathered if gathered is not None else parts[(p - 1) % 2])


def _gemm_rs(rk: _Rank, m: int, n: int, k: int) -> _Case:
    """GEMM + ReduceScatter: the partial product [M, N] is reduce-scattered over rows; rank r keeps [M/TP, N]."""
    p, comm = rk.p, rk.comm
    a_local, b_local, partial = _partial_inputs(rk, m, n, k)
    seq_out = rk.empty(m // p, n)

    def gemm_alone() -> None:
        rk.gemm(a_local, b_local, partial)

    def comm_alone() -> None:
        rk.reduce_scatter(seq_out, partial)

    def sequential() -> None:
        rk.gemm(a_local, b_local, partial)
        comm_alone()

    def build(method: str, chunks: int) -> tuple[Run, Any]:
        if method != "chunked":
            return _ring_reduce_scatter(rk, a_local, b_local, m, n, then_gather=False)
        rows = m // p
        full = rk.empty(m, n)  # the partial products, chunk by chunk
        out = rk.empty(rows, n)
        mc = rows // chunks
        a4 = a_local.view(p, chunks, mc, k // p)
        parts = full.view(chunks, p, mc, n)
        out3 = out.view(chunks, mc, n)

        def run() -> None:
            comm.begin()
            handles = []
            for c in range(chunks):
                rk.gemm(a4[:, c], b_local, parts[c])
                handles.append(
                    comm.start(
                        lambda c=c: [rk.reduce_scatter(out3[c], parts[c].view(p * mc, n), async_op=True)],
                        after_compute=True,
                    )
                )
            for handle in handles:
                comm.finish(handle)

        return run, out

    comm_bytes = m * n * GEMM_OUTPUT_BYTES[rk.dtype]
    return _Case(a_local, b_local, seq_out, gemm_alone, comm_alone, sequential, comm_bytes, build)


def _gemm_ar(rk: _Rank, m: int, n: int, k: int) -> _Case:
    """GEMM + AllReduce: the partial product [M, N], all-reduced in place; every rank ends with the whole of it."""
    comm = rk.comm
    a_local, b_local, partial = _partial_inputs(rk, m, n, k)

    def gemm_alone() -> None:
        rk.gemm(a_local, b_local, partial)

    def comm_alone() -> None:
        rk.dist.all_reduce(partial)

    def sequential() -> None:
        rk.gemm(a_local, b_local, partial)
        comm_alone()

    def build(method: str, chunks: int) -> tuple[Run, Any]:
        if method != "chunked":
            return _ring_reduce_scatter(rk, a_local, b_local, m, n, then_gather=True)
        full = rk.empty(m, n)  # reduced in place, chunk by chunk
        mc = m // chunks

        def run() -> None:
            comm.begin()
            handles = []
            for c in range(chunks):
                block = full[c * mc : (c + 1) * mc]
                rk.gemm(a_local[c * mc : (c + 1) * mc], b_local, block)
                handles.append(comm.start(lambda b=block: [rk.dist.all_reduce(b, async_op=True)], after_compute=True))
            for handle in handles:
                comm.finish(handle)

        return run, full

    comm_bytes = m * n * GEMM_OUTPUT_BYTES[rk.dtype]
    return _Case(a_local, b_local, partial, gemm_alone, comm_alone, sequential, comm_bytes, build)


_PATTERN_CASES: dict[str, Callable[[_Rank, int, int, int], _Case]] = {
    "ag_gemm": _ag_gemm,
    "gemm_rs": _gemm_rs,
    "gemm_ar": _gemm_ar,
}


def _method_plan(cfg: dict[str, Any]) -> list[tuple[str, int]]:
    """(method, chunks) in the order they run: sequential first, then one chunked row per chunk count."""
    plan: list[tuple[str, int]] = [("sequential", 0)]
    for method in cfg["methods"]:
        if method == "chunked":
            plan += [("chunked", c) for c in cfg["chunks"]]
        elif method != "sequential":
            plan.append((method, 0))
    return plan


def _symm_mem_agreed(info: RankInfo, rk: _Rank, pattern: str) -> str | None:
    """_symm_mem_reason, agreed by every rank (or some would wait in a collective the others skip)."""
    torch, dist = rk.torch, rk.dist
    reason = _symm_mem_reason(info, pattern, rk.dtype)
    flag = torch.tensor([0 if reason else 1], dtype=torch.int32, device=rk.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if reason is None and int(flag.item()) == 0:
        reason = "another rank cannot use symmetric memory"
    return reason


def _overlap_rank(info: RankInfo, cfg: dict[str, Any]) -> dict[str, Any]:
    """Rank side of one measurement: the pattern's inputs and sequential reference, the GEMM and the collective
    alone, then every planned method, timed and compared with the reference."""
    rk = _Rank(info, cfg)
    torch, cuda = rk.torch, rk.cuda
    pattern = cfg["pattern"]
    case = _PATTERN_CASES[pattern](rk, cfg["m"], cfg["n"], cfg["k"])

    case.sequential()
    if cuda:
        torch.cuda.synchronize()
    reference = case.out.clone()
    warmup, iters = int(cfg["warmup"]), int(cfg["iters"])
    t_gemm = time_iterations(case.gemm_alone, warmup=warmup, iters=iters, cuda=cuda)
    t_comm = time_iterations(case.comm_alone, warmup=warmup, iters=iters, cuda=cuda)

    def build(method: str, chunks: int) -> tuple[Run, Any]:
        """(function, output tensor) of one method; raises _Unavailable with the reason."""
        if method == "sequential":
            return case.sequential, case.out
        if method == "symm_mem":
            return _build_symm_mem(pattern, case.a_local, case.weight)
        return case.build(method, chunks)

    entries = []
    plan = _method_plan(cfg)
    for index, (method, chunks) in enumerate(plan):
        entry: dict[str, Any] = {"method": method, "chunks": chunks or None}
        reason = _symm_mem_agreed(info, rk, pattern) if method == "symm_mem" else None
        fn = out = None
        if reason is None:
            try:
                fn, out = build(method, chunks)
            except _Unavailable as exc:
                reason = str(exc)
        if reason is not None:
            entry.update(available=False, reason=f"not available here: {reason}")
            entries.append(entry)
            continue
        times = time_iterations(fn, warmup=warmup, iters=iters, cuda=cuda)
        if cuda:
            torch.cuda.synchronize()
        got = out.float()
        ref = reference.float()
        entry.update(
            available=True,
            times_ms=times,
            max_abs_diff=float((got - ref).abs().max().item()),
            max_abs_ref=float(ref.abs().max().item()),
        )
        del got, ref
        entries.append(entry)
        if rk.r == 0:
            rank_progress(index + 1, len(plan), f"{pattern}: {method}{f' C={chunks}' if chunks else ''} done")
    result = {"t_gemm_ms": t_gemm, "t_comm_ms": t_comm, "entries": entries, "comm_bytes": case.comm_bytes}
    if cfg.get("return_tensors"):  # for tests: the inputs and the reference, to check them independently
        result["tensors"] = {
            "a": case.a_local.float().cpu(),
            "weight": case.weight.float().cpu(),
            "reference": reference.float().cpu(),
        }
    return result


def _build_symm_mem(pattern: str, a_local: Any, weight: Any) -> tuple[Any, Any]:
    import torch
    import torch.distributed as dist

    try:
        import torch.distributed._symmetric_memory as symm_mem

        group_name = dist.group.WORLD.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:
            enable(group_name)
    except Exception as exc:
        raise _Unavailable(f"cannot set up symmetric memory: {exc}") from exc
    holder: dict[str, Any] = {}
    if pattern == "ag_gemm":

        def run() -> None:
            _, outs = torch.ops.symm_mem.fused_all_gather_matmul(a_local, [weight], gather_dim=0, group_name=group_name)
            holder["out"] = outs[0]
    else:

        def run() -> None:
            holder["out"] = torch.ops.symm_mem.fused_matmul_reduce_scatter(
                a_local, weight, "sum", scatter_dim=0, group_name=group_name
            )

    try:
        run()
    except Exception as exc:
        raise _Unavailable(f"the fused op failed: {type(exc).__name__}: {exc}") from exc

    class _Out:
        """The output of the latest call (the fused ops allocate a new tensor each time)."""

        def float(self) -> Any:
            return holder["out"].float()

    return run, _Out()


# ----------------------------------------------------------------------------------------------------------------
# Calling side


def _summarize(spec: OverlapSpec, backend: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The result of one measurement: times, correctness, the validity checks (validity.py) and scores for the rows
    that pass them, and the best row among the valid, correct ones (None, with the reason, when there is none)."""
    import statistics

    p = spec.world_size
    gemm_series = slowest_rank_series([x["t_gemm_ms"] for x in ranks])
    comm_series = slowest_rank_series([x["t_comm_ms"] for x in ranks])
    t_gemm = float(statistics.median(gemm_series))
    t_comm = float(statistics.median(comm_series))
    flops = 2.0 * spec.m * spec.n * spec.k / p
    comm_bytes = ranks[0]["comm_bytes"]
    factor = {"ag_gemm": (p - 1) / p, "gemm_rs": (p - 1) / p, "gemm_ar": 2 * (p - 1) / p}[spec.pattern]
    algbw = comm_bytes / (t_comm * 1e-3) / 1e9 if t_comm > 0 else 0.0
    rtol = RTOL[spec.dtype]
    methods: list[dict[str, Any]] = []
    series_of: dict[int, list[float]] = {}
    t_seq: float | None = None
    seq_series: list[float] = []
    for i, entry in enumerate(ranks[0]["entries"]):
        name = entry["method"] + (f"(C={entry['chunks']})" if entry["chunks"] else "")
        row: dict[str, Any] = {"name": name, "method": entry["method"], "chunks": entry["chunks"]}
        if not entry["available"]:
            row.update(available=False, reason=entry["reason"], passed=None)
            methods.append(row)
            continue
        per_rank = [x["entries"][i] for x in ranks]
        series = slowest_rank_series([e["times_ms"] for e in per_rank])
        t = float(statistics.median(series))
        if entry["method"] == "sequential":
            t_seq, seq_series = t, series
        series_of[len(methods)] = series
        row.update(
            available=True,
            passed=all(e["max_abs_diff"] <= rtol * max(e["max_abs_ref"], 1e-30) for e in per_rank),
            max_abs_diff=max(e["max_abs_diff"] for e in per_rank),
            rel_err=max(e["max_abs_diff"] / max(e["max_abs_ref"], 1e-30) for e in per_rank),
            t_overlap_ms=t,
            tflops=flops / (t * 1e-3) / 1e12 if t > 0 else None,
            # per rank, per iteration: the raw timings, kept up to RAW_RANKS x RAW_ITERS
            raw_times_ms=[e["times_ms"][:RAW_ITERS] for e in per_rank[:RAW_RANKS]],
            raw_times_omitted=sum(len(e["times_ms"]) for e in per_rank)
            - sum(min(len(e["times_ms"]), RAW_ITERS) for e in per_rank[:RAW_RANKS]),
        )
        methods.append(row)

    baseline = validity.measurement_checks(
        t_gemm, t_comm, t_seq, {"gemm": gemm_series, "comm": comm_series, "sequential": seq_series}
    )
    baseline_failures = validity.failed(baseline)
    for index, series in series_of.items():
        _score(methods[index], t_gemm, t_comm, t_seq, series, baseline_failures)
    best, best_reason = choose_best(methods, baseline_failures)
    result = {
        "pattern": spec.pattern,
        "m": spec.m,
        "n": spec.n,
        "k": spec.k,
        "world_size": p,
        "dtype": spec.dtype,
        "backend": backend,
        **describe_device(backend),
        "iters": spec.iters,
        "per_rank_shapes": _shapes_text(spec.pattern, spec.m, spec.n, spec.k, p),
        "t_gemm_ms": t_gemm,
        "t_comm_ms": t_comm,
        "t_sequential_ms": t_seq,
        "gemm_tflops": flops / (t_gemm * 1e-3) / 1e12 if t_gemm > 0 else None,
        "comm_bytes": comm_bytes,
        "busbw_gbs": algbw * factor,
        "busbw_factor": factor,
        "validity": {"valid": not baseline_failures, "checks": baseline, "rules": validity.RULES},
        "methods": methods,
        "all_passed": all(row["passed"] for row in methods if row.get("available")),
        "all_valid": all(row["valid"] for row in methods if row.get("available")),
        "best": best["name"] if best else None,
        "best_reason": best_reason,
        "tolerance": {"rule": TOLERANCE_RULE, "rtol": rtol},
        "timing": timing(backend),
        "note": CPU_NOTE if backend == "gloo" else None,
    }
    result["table"] = format_table(result)
    return result


def timing(backend: str) -> str:
    clock = "CUDA events" if backend == "nccl" else "time.perf_counter"
    return f"median over iterations of the slowest rank; barrier before each iteration; {clock}"


_SCORES = ("efficiency", "speedup", "speedup_vs_sequential", "exposed_comm_ms")


def _score(
    row: dict[str, Any],
    t_gemm: float,
    t_comm: float,
    t_seq: float | None,
    series: list[float],
    baseline_failures: list[str],
) -> None:
    """Check a measured row and score it only when it passes: the sequential row is the baseline (E = 0, exposed
    communication = T_comm, speedup 1 by definition); an overlapped row gets E, speedup and exposed communication
    from the formulas. A row that fails keeps its times, gets None scores and the reasons."""
    t = row["t_overlap_ms"]
    own = [] if row["method"] == "sequential" else validity.row_checks(t_gemm, t_comm, t, series)
    reasons = [f"baseline {reason}" for reason in baseline_failures] + validity.failed(own)
    row.update(valid=not reasons, invalid_reasons=reasons, checks=own, warnings=[])
    if reasons:
        row.update(dict.fromkeys(_SCORES))
        return
    if row["method"] == "sequential":
        row.update(efficiency=0.0, speedup=1.0, speedup_vs_sequential=1.0, exposed_comm_ms=t_comm)
        return
    efficiency = (t_gemm + t_comm - t) / t_comm
    row.update(
        efficiency=efficiency,
        speedup=(t_gemm + t_comm) / t,
        speedup_vs_sequential=t_seq / t if t_seq else None,
        exposed_comm_ms=t - t_gemm,
    )
    if efficiency < validity.E_MIN:
        row["warnings"].append(
            f"E = {efficiency:.3g} < {validity.E_MIN:g}: slower than the sequential schedule (a real result when the "
            "method costs more than it hides)"
        )


def choose_best(methods: list[dict[str, Any]], baseline_failures: list[str]) -> tuple[dict[str, Any] | None, str]:
    """The fastest row that is both correct and valid, and a sentence saying why it (or nothing) was chosen."""
    measured = [row for row in methods if row.get("available")]
    candidates = [row for row in measured if row["passed"] and row["valid"]]
    invalid = [row["name"] for row in measured if not row["valid"]]
    wrong = [row["name"] for row in measured if not row["passed"]]
    if candidates:
        best = min(candidates, key=lambda row: row["t_overlap_ms"])
        reason = f"the fastest of {len(candidates)} valid row(s) whose output matches the sequential result"
        if invalid:
            reason += f"; not considered, failing the validity checks: {', '.join(invalid)}"
        if wrong:
            reason += f"; not considered, output differs from sequential: {', '.join(wrong)}"
        return best, reason
    if not measured:
        return None, "no best: no method could be measured here"
    if baseline_failures:
        names = ", ".join(reason.split(":", 1)[0] for reason in baseline_failures)
        return None, (
            f"no best: the measurement failed its validity checks ({names}; details in validity.checks), so no row "
            "can be scored. More iterations, a larger shape or a quieter machine may help; on CPU (gloo) timings "
            "rarely pass"
        )
    reasons = [f"{row['name']}: {row['invalid_reasons'][0]}" for row in measured if not row["valid"]]
    if reasons:
        return None, "no best: no row is both valid and correct (" + "; ".join(reasons) + ")"
    return None, "no best: no method's output matches the sequential result"


def finite(value: Any) -> Any:
    """value with every NaN or infinite float replaced by None (an overflowing fp16/fp8 output gives NaN or inf
    differences; JSON has no such numbers, and a result must stay valid JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _without_raw_times(row: dict[str, Any]) -> dict[str, Any]:
    """A method row of a tune result: its raw timings and the detail of its checks left out (the raw timings are
    counted in raw_times_omitted; the failed checks stay in invalid_reasons)."""
    row = {key: value for key, value in row.items() if key != "checks"}
    if "raw_times_ms" not in row:
        return row
    kept = sum(len(r) for r in row["raw_times_ms"])
    return {**row, "raw_times_ms": [], "raw_times_omitted": row.get("raw_times_omitted", 0) + kept}


def _shapes_text(pattern: str, m: int, n: int, k: int, p: int) -> str:
    if pattern == "ag_gemm":
        return f"A shard [{m // p}, {k}] gathered to [{m}, {k}]; W [{k}, {n // p}]; output [{m}, {n // p}]"
    out = f"[{m // p}, {n}] (reduce-scattered)" if pattern == "gemm_rs" else f"[{m}, {n}] (all-reduced)"
    return f"A [{m}, {k // p}]; B [{k // p}, {n}]; partial [{m}, {n}]; output {out}"


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def format_table(result: dict[str, Any]) -> str:
    head = (
        f"{result['pattern']} M={result['m']} N={result['n']} K={result['k']} TP={result['world_size']} "
        f"{result['dtype']} on {result['device_name']} ({result['backend']}): T_gemm {result['t_gemm_ms']:.3f} ms, "
        f"T_comm {result['t_comm_ms']:.3f} ms, busbw {result['busbw_gbs']:.3f} GB/s"
    )
    lines = [head]
    if result.get("note"):
        lines.append(f"NOTE: {result['note']}")
    baseline = result["validity"]
    if not baseline["valid"]:
        failures = [c for c in baseline["checks"] if not c["passed"]]
        lines.append(
            "MEASUREMENT INVALID, no row is scored: " + "; ".join(f"{c['name']}: {c['detail']}" for c in failures)
        )
    lines.append(
        f"{'method':<14} {'ok':>4} {'valid':>5} {'max|diff|':>10} {'T_overlap':>10} {'exposed':>9} {'E':>7} "
        f"{'speedup':>8} {'vs seq':>7} {'TFLOP/s':>8}"
    )
    notes = []
    for row in result["methods"]:
        if not row.get("available"):
            lines.append(f"{row['name']:<14} {'-':>4} {'-':>5} {row['reason']}")
            continue
        lines.append(
            f"{row['name']:<14} {'yes' if row['passed'] else 'NO':>4} {'yes' if row['valid'] else 'NO':>5} "
            f"{_fmt(row['max_abs_diff'], '.2e'):>10} {row['t_overlap_ms']:>10.3f} "
            f"{_fmt(row['exposed_comm_ms']):>9} {_fmt(row['efficiency'], '.2f'):>7} {_fmt(row['speedup'], '.2f'):>8} "
            f"{_fmt(row.get('speedup_vs_sequential'), '.2f'):>7} {_fmt(row['tflops'], '.4f'):>8}"
        )
        own = [reason for reason in row["invalid_reasons"] if not reason.startswith("baseline ")]
        notes += [f"INVALID {row['name']}: {reason}" for reason in own]
        notes += [f"WARNING {row['name']}: {warning}" for warning in row["warnings"]]
    lines += notes
    lines.append(f"best: {result['best']} ({result['best_reason']})" if result["best"] else result["best_reason"])
    return "\n".join(lines)


def _measure(spec: OverlapSpec, backend: str, log_dir: Any, on_progress: Any) -> dict[str, Any]:
    cfg = spec.model_dump()
    cfg["methods"] = list(dict.fromkeys(spec.methods))
    cfg["chunks"] = list(dict.fromkeys(spec.chunks))
    ranks = run_ranks(
        spec.world_size,
        _overlap_rank,
        (cfg,),
        backend=backend,
        timeout_s=spec.rank_timeout_s,
        log_dir=log_dir,
        on_progress=on_progress,
    )
    return _summarize(spec, backend, ranks)


def run_overlap_benchmark(spec_data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    spec = OverlapSpec.model_validate(spec_data)
    backend, why = prepare_overlap(spec)
    confirm_dtype_runtime(spec.dtype)
    ctx.progress(0, None, f"starting {spec.world_size} ranks ({backend})")
    result = finite(_measure(spec, backend, ctx.log_path("rank0").parent, ctx.progress))
    result["backend_decision"] = why
    for step, row in enumerate(result["methods"]):
        if row.get("available"):
            ctx.log_metrics(
                step=step,
                method=row["name"],
                t_overlap_ms=row["t_overlap_ms"],
                exposed_comm_ms=row["exposed_comm_ms"],
                efficiency=row["efficiency"],
                speedup=row["speedup"],
                max_abs_diff=row["max_abs_diff"],
                passed=row["passed"],
                valid=row["valid"],
            )
    print(result["table"], flush=True)
    return result


# ----------------------------------------------------------------------------------------------------------------
# Tuning: the measurement of each layer next to predict_overlap's figures


def prediction_target(spec: OverlapTuneSpec, device: dict[str, str | None]) -> tuple[str | None, str | None]:
    """(catalog GPU to predict for, note): the one asked for (predict_for_gpu), else the measured GPU when the
    catalog has it; None with the reason otherwise (a prediction for another GPU only when asked)."""
    measured = device.get("gpu_catalog_name")
    if spec.predict_for_gpu is not None:
        from servers.core.gpus import find_gpu

        asked = find_gpu(spec.predict_for_gpu).name
        if asked == measured:
            return asked, None
        return asked, (
            f"predicted for {asked} as asked, but measured on {device.get('device_name')}: the two are not comparable"
        )
    if measured:
        return measured, None
    if device.get("device") == "cpu":
        where = "this ran on CPU (gloo), and the cost model predicts catalog GPUs only"
    else:
        where = f"the measured GPU ({device.get('device_name')}) is not in the GPU catalog"
    return None, f"no prediction: {where}; pass predict_for_gpu (e.g. H100-SXM) for predict_overlap's figures"


def predict_layer(
    layer: OverlapLayer, world_size: int, dtype: str, gpu: str, chunks: list[int]
) -> tuple[dict[str, Any] | None, str | None]:
    """predict_overlap's figures for one layer (chunk counts up to the largest tried), or None and why not."""
    from servers.overlap.cost_model import predict_overlap

    try:
        p = predict_overlap(
            layer.pattern, layer.m, layer.n, layer.k, world_size, dtype=dtype, gpu=gpu, max_chunks=max(chunks)
        )
    except InputError as exc:
        return None, f"no prediction: {exc}"
    return {
        "gpu": p.gpu,
        "interconnect": p.interconnect,
        "t_gemm_ms": p.t_gemm_ms,
        "t_comm_ms": p.t_comm_ms,
        "t_sequential_ms": p.t_sequential_ms,
        "t_overlap_ms": p.t_overlap_ms,
        "best_chunks": p.best_chunks,
        "efficiency": p.efficiency,
        "gain": p.speedup - 1.0,
        "worth_it": p.worth_it,
    }, None


def tune_entry(
    layer: OverlapLayer,
    measured: dict[str, Any],
    skipped: list[int],
    prediction: dict[str, Any] | None,
    prediction_note: str | None,
    full: bool = False,
) -> dict[str, Any]:
    """One layer of a tune result: the best valid, correct configuration, its gain over sequential (only from valid
    rows), predict_overlap's gain next to it (or why there is none), a verdict in words, and the measurement's
    figures (T_gemm, T_comm, busbw, its validity checks, each method's row and the table). full: the method rows as
    measured, with their checks and raw timings (a tune of one layer: what a single measurement returns); else
    without them (up to 32 layers must stay readable; failed checks stay in invalid_reasons)."""
    best = next((row for row in measured["methods"] if row["name"] == measured["best"]), None)
    t_seq = measured["t_sequential_ms"]
    gain = (t_seq / best["t_overlap_ms"] - 1.0) if best and t_seq and best["t_overlap_ms"] > 0 else None
    if best is None:
        failures = validity.failed(measured["validity"]["checks"])
        if failures:
            names = ", ".join(reason.split(":", 1)[0] for reason in failures)
            verdict = f"no verdict: the measurement failed its validity checks ({names})"
        else:
            verdict = "no verdict: no row is both valid and correct"
    elif gain is not None and gain > validity.REL_NOISE:
        verdict = f"{best['name']} is {100 * gain:.1f}% faster than sequential"
    elif best["method"] == "sequential":
        verdict = "keep sequential: no valid overlapped row is faster"
    else:
        verdict = (
            f"no significant gain: {best['name']} is within noise ({100 * validity.REL_NOISE:g}%) of sequential; "
            "keep sequential"
        )
    invalid = [row["name"] for row in measured["methods"] if row.get("available") and not row["valid"]]
    return {
        "layer": layer.layer,
        "pattern": layer.pattern,
        "m": layer.m,
        "n": layer.n,
        "k": layer.k,
        "best": measured["best"],
        "best_reason": measured["best_reason"],
        "best_t_ms": best["t_overlap_ms"] if best else None,
        "t_sequential_ms": t_seq,
        "gain": gain,
        "significant": gain is not None and gain > validity.REL_NOISE,
        "verdict": verdict,
        "predicted": prediction,
        "predicted_gain": prediction["gain"] if prediction else None,
        "prediction_note": prediction_note,
        "per_rank_shapes": measured["per_rank_shapes"],
        "t_gemm_ms": measured["t_gemm_ms"],
        "t_comm_ms": measured["t_comm_ms"],
        "gemm_tflops": measured["gemm_tflops"],
        "comm_bytes": measured["comm_bytes"],
        "busbw_gbs": measured["busbw_gbs"],
        "busbw_factor": measured["busbw_factor"],
        "measurement_valid": measured["validity"]["valid"],
        "measurement_invalid_reasons": validity.failed(measured["validity"]["checks"]),
        "validity": {"valid": measured["validity"]["valid"], "checks": measured["validity"]["checks"]},
        "invalid_rows": invalid,
        "all_passed": measured["all_passed"],
        "all_valid": measured["all_valid"],
        "skipped_chunks": skipped,
        "methods": measured["methods"] if full else [_without_raw_times(row) for row in measured["methods"]],
        "table": measured["table"],
    }


def format_tune_table(results: list[dict[str, Any]], backend: str, prediction_note: str | None) -> str:
    lines = [
        f"{'layer':<20} {'pattern':<8} {'MxNxK':<20} {'best':<14} {'T_best':>9} {'T_seq':>9} {'gain':>7} "
        f"{'predicted':>9}  verdict"
    ]
    for e in results:
        shape = f"{e['m']}x{e['n']}x{e['k']}"
        gain = "-" if e["gain"] is None else f"{100 * e['gain']:+.1f}%"
        predicted = "-" if e["predicted_gain"] is None else f"{100 * e['predicted_gain']:+.1f}%"
        lines.append(
            f"{e['layer']:<20} {e['pattern']:<8} {shape:<20} {e['best'] or '-':<14} "
            f"{_fmt(e['best_t_ms']):>9} {_fmt(e['t_sequential_ms']):>9} {gain:>7} {predicted:>9}  {e['verdict']}"
        )
    if prediction_note:
        lines.append(f"NOTE: {prediction_note}")
    else:
        gpus = sorted({e["predicted"]["gpu"] for e in results if e["predicted"]})
        if gpus:
            lines.append(f"predicted: predict_overlap's gain for {', '.join(gpus)} (best chunk count, uncalibrated)")
    notes = sorted(
        {e["prediction_note"] for e in results if e["prediction_note"] and e["prediction_note"] != prediction_note}
    )
    lines += [f"NOTE: {note}" for note in notes]
    if backend == "gloo":
        lines.append(f"NOTE: {CPU_NOTE}")
    return "\n".join(lines)


def run_overlap_tune(spec_data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    spec = OverlapTuneSpec.model_validate(spec_data)
    backend, why, layer_specs, skipped = prepare_tune(spec)
    confirm_dtype_runtime(spec.dtype)
    device = describe_device(backend)
    gpu, prediction_note = prediction_target(spec, device)
    results = []
    log_dir = ctx.log_path("rank0").parent
    for index, (layer, layer_spec) in enumerate(zip(spec.layers, layer_specs, strict=True)):
        ctx.progress(index, len(spec.layers), f"layer {layer.layer} ({layer.pattern} {layer.m}x{layer.n}x{layer.k})")
        measured = finite(_measure(layer_spec, backend, log_dir, None))
        prediction, layer_note = (None, prediction_note)
        if gpu is not None:
            prediction, layer_note = predict_layer(layer, spec.world_size, spec.dtype, gpu, list(spec.chunks))
            layer_note = layer_note or prediction_note
        full = len(spec.layers) == 1
        entry = tune_entry(layer, measured, skipped.get(layer.layer, []), prediction, layer_note, full)
        results.append(entry)
        ctx.log_metrics(
            step=index,
            layer=layer.layer,
            best=entry["best"],
            best_t_ms=entry["best_t_ms"],
            gain=entry["gain"],
            predicted_gain=entry["predicted_gain"],
        )
        ctx.progress(index + 1, len(spec.layers), f"layer {layer.layer}: best {entry['best']}")
    table = format_tune_table(results, backend, prediction_note)
    print(table, flush=True)
    return {
        "world_size": spec.world_size,
        "dtype": spec.dtype,
        "iters": spec.iters,
        "backend": backend,
        "backend_decision": why,
        **device,
        "prediction_gpu": gpu,
        "prediction_note": prediction_note,
        "layers": finite(results),
        "table": table,
        "tolerance": {"rule": TOLERANCE_RULE, "rtol": RTOL[spec.dtype]},
        "validity_rules": validity.RULES,
        "timing": timing(backend),
        "note": CPU_NOTE if backend == "gloo" else None,
    }
