"""Collective benchmark (the `collective_benchmark` job kind): an nccl-tests style sweep over message sizes.

Each size runs on `world_size` rank processes (see distributed.run_ranks): warm-up, then `iters` timed calls with a
barrier before each; a row's time is the median over iterations of the slowest rank. Sizes, counts, algbw and busbw
follow nccl-tests: `size` is the bytes of the whole array (the all-reduce/broadcast buffer, the gathered output of
all_gather, the input of reduce_scatter and all_to_all), algbw = size / time, busbw = algbw * factor with factor
2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, and 1 for broadcast. `wrong` counts
output elements that differ from the expected values after a separate checked call: inputs are small integers that
every dtype represents exactly (and sums of them stay exact), so the comparison is exact. fp8 (e4m3, integers up to
16 exact) goes over the wire as raw bytes, for the ops that do not reduce; tf32 is refused (it is a matmul mode, the
data is fp32). See check_collective_dtype.

On CPU the backend is gloo, and the timings check the plumbing only. `prepare_collective` decides what runs here; the
server calls it before submitting and the work function again before starting any rank (the same probe and
messages). torch is imported inside functions.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from servers.core.dtypes import ELEMENT_BYTES, NCCL_TYPE_NAMES, Dtype
from servers.core.errors import InputError
from servers.core.models import Model
from servers.overlap.distributed import (
    BackendChoice,
    RankInfo,
    RankTimeoutS,
    WorldSize,
    describe_device,
    run_ranks,
    slowest_rank_median,
)
from servers.overlap.limits import MachineProbe, backend_decision, check_memory, check_world_size, probe_machine

CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]

BUSBW_FACTOR_TEXT = "2(n-1)/n all_reduce; (n-1)/n all_gather, reduce_scatter, all_to_all; 1 broadcast"
_SPLIT_OPS = ("all_gather", "reduce_scatter", "all_to_all")
_REDUCING_OPS = ("all_reduce", "reduce_scatter")
MAX_SIZES = 64


# The fields of the job's spec, typed and described once: benchmark_collective takes them as flat arguments.
OpArg = CollectiveOp
MinBytes = Annotated[int, Field(ge=1, le=2**36)]
MaxBytes = Annotated[int, Field(ge=1, le=2**36)]
SizeFactor = Annotated[int, Field(ge=2, le=1024, description="Size ratio of rows")]
Sizes = Annotated[
    list[Annotated[int, Field(ge=1, le=2**36)]] | None,
    Field(
        min_length=1,
        max_length=MAX_SIZES,
        description="Bytes; instead of min_bytes/max_bytes/factor",
    ),
]
BufferDtype = Annotated[Dtype, Field(description="fp8: only ops that do not reduce")]
CollectiveWarmup = Annotated[int, Field(ge=0, le=1000)]
CollectiveIters = Annotated[int, Field(ge=1, le=10000)]
Check = Annotated[bool, Field(description="Verify every element")]


def sizes_problem(min_bytes: int, max_bytes: int, sizes: list[int] | None) -> str | None:
    """What is wrong with a size sweep that each field alone allows (the spec and benchmark_collective say it)."""
    if sizes is None and min_bytes > max_bytes:
        return f"min_bytes {min_bytes} is larger than max_bytes {max_bytes}"
    return None


class CollectiveSpec(Model):
    op: OpArg = "all_reduce"
    min_bytes: MinBytes = 1024
    max_bytes: MaxBytes = 16 * 2**20
    factor: SizeFactor = 2
    sizes: Sizes = None
    dtype: BufferDtype = "fp32"
    world_size: WorldSize = 2
    backend: BackendChoice = "auto"
    warmup: CollectiveWarmup = 5
    iters: CollectiveIters = 20
    check: Check = True
    rank_timeout_s: RankTimeoutS = 600

    @model_validator(mode="after")
    def _sizes_valid(self) -> CollectiveSpec:
        problem = sizes_problem(self.min_bytes, self.max_bytes, self.sizes)
        if problem:
            raise ValueError(problem)
        return self

    def byte_sizes(self) -> list[int]:
        """The requested message sizes, before rounding to whole elements per rank."""
        if self.sizes is not None:
            return list(self.sizes)
        sizes = []
        size = self.min_bytes
        while size <= self.max_bytes and len(sizes) < MAX_SIZES:
            sizes.append(size)
            size *= self.factor
        return sizes


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of `op` on n ranks."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in _SPLIT_OPS:
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def plan_size(op: str, size_bytes: int, dtype: str, n: int) -> dict[str, int]:
    """Elements of the buffers for a requested size, as nccl-tests counts them.

    `total` is the elements of the array that `size` measures: the buffer of all_reduce and broadcast, each rank's
    gathered output of all_gather, each rank's whole input of reduce_scatter and all_to_all. For those three split
    ops `block` = total / n is each rank's share (all_gather input, reduce_scatter output, all_to_all message to one
    peer), and `count` (the column nccl-tests prints) is the block; otherwise count = total. `size` is the bytes
    actually used after rounding down to whole elements (and blocks).
    """
    elem = ELEMENT_BYTES[dtype]
    total = max(1, size_bytes // elem)
    if op in _SPLIT_OPS:
        block = max(1, total // n)
        total = block * n
        return {"total": total, "block": block, "count": block, "size": total * elem}
    return {"total": total, "block": total, "count": total, "size": total * elem}


def _pattern(kind: str, rank: int, length: int, peer_block: int = 1, offset: int = 0, device: Any = "cpu") -> Any:
    """Elements offset .. offset+length of what a rank sends: small integers, as float32 (exact; the caller casts).

    Indices are int64, so the values stay exact however long the buffer is.
    """
    import torch

    i = torch.arange(offset, offset + length, dtype=torch.int64, device=device)
    if kind == "sum":  # values 1..4: sums over up to 64 ranks stay at or below 256, exact even in bf16
        values = torch.remainder(i + rank, 4) + 1
    elif kind == "gather":
        values = torch.remainder(i + 3 * rank, 5) + 1
    elif kind == "a2a":  # block p of a rank's input goes to rank p
        peer = torch.div(i, peer_block, rounding_mode="floor")
        values = torch.remainder(7 * rank + 3 * peer + torch.remainder(i, peer_block), 11) + 1
    elif kind == "bcast":
        values = torch.remainder(i, 13) + 1
    else:
        raise ValueError(kind)
    return values.to(torch.float32)


def _expected(op: str, rank: int, n: int, total: int, block: int, device: Any = "cpu") -> Any:
    """What rank `rank` must hold after the collective, as float32 on `device`."""
    import torch

    if op == "all_reduce":
        return sum(_pattern("sum", q, total, device=device) for q in range(n))
    if op == "all_gather":
        return torch.cat([_pattern("gather", q, block, device=device) for q in range(n)])
    if op == "reduce_scatter":  # block `rank` of the sum
        return sum(_pattern("sum", q, block, offset=rank * block, device=device) for q in range(n))
    if op == "all_to_all":  # block `rank` of every rank q's input, in the order of q
        return torch.cat([_pattern("a2a", q, block, block, offset=rank * block, device=device) for q in range(n)])
    if op == "broadcast":
        return _pattern("bcast", 0, total, device=device)
    raise ValueError(f"unknown collective {op!r}")


def collective_rank(info: RankInfo, op: str, dtype: str, plans: list[dict[str, int]], spec: dict[str, Any]) -> Any:
    """Rank side: for each size, time the collective and count the wrong output elements."""
    import torch
    import torch.distributed as dist

    from servers.core.dtypes import torch_dtype as storage_type
    from servers.overlap.distributed import rank_progress, time_iterations

    torch_dtype = storage_type(dtype)
    fp8 = dtype == "fp8"
    device = torch.device(info.device)
    cuda = device.type == "cuda"
    r, n = info.rank, info.world_size
    # torch 2.13 prefers the *_single names (the *_tensor ones warn); older versions only have the latter.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def put(values: Any) -> Any:
        return values.to(dtype=torch_dtype)

    def wire(t: Any) -> Any:
        """What goes over the wire: fp8 travels as raw bytes (only ops that do not reduce take fp8)."""
        return t.view(torch.uint8) if fp8 else t

    rows = []
    for index, plan in enumerate(plans):
        total, block = plan["total"], plan["block"]
        if op == "all_reduce":
            src = out = put(_pattern("sum", r, total, device=device))  # in place
        elif op == "all_gather":
            src, out = (
                put(_pattern("gather", r, block, device=device)),
                torch.zeros(total, dtype=torch_dtype, device=device),
            )
        elif op == "reduce_scatter":
            src, out = (
                put(_pattern("sum", r, total, device=device)),
                torch.zeros(block, dtype=torch_dtype, device=device),
            )
        elif op == "all_to_all":
            src, out = (
                put(_pattern("a2a", r, total, block, device=device)),
                torch.zeros(total, dtype=torch_dtype, device=device),
            )
        elif op == "broadcast":
            src = out = (
                put(_pattern("bcast", 0, total, device=device))
                if r == 0
                else torch.zeros(total, dtype=torch_dtype, device=device)
            )
        else:
            raise ValueError(f"unknown collective {op!r}")

        def call(src: Any = src, out: Any = out) -> None:
            if op == "all_reduce":
                dist.all_reduce(out)
            elif op == "all_gather":
                all_gather(wire(out), wire(src))
            elif op == "reduce_scatter":
                reduce_scatter(out, src)
            elif op == "all_to_all":
                dist.all_to_all_single(wire(out), wire(src))
            else:
                dist.broadcast(wire(out), src=0)

        times = time_iterations(call, warmup=int(spec["warmup"]), iters=int(spec["iters"]), cuda=cuda)
        wrong = -1
        if spec["check"]:
            # The timed calls changed the in-place buffers: set the inputs again, then one checked call.
            if op == "all_reduce":
                out.copy_(put(_pattern("sum", r, total, device=device)))
            elif op == "broadcast":
                out.copy_(put(_pattern("bcast", 0, total, device=device)) if r == 0 else torch.zeros_like(out))
            else:
                out.zero_()
            dist.barrier()
            call()
            if cuda:
                torch.cuda.synchronize()
            wrong = int((out.float() != _expected(op, r, n, total, block, device)).sum().item())
        rows.append({"times_ms": times, "wrong": wrong})
        del src, out
        if r == 0:
            rank_progress(index + 1, len(plans), f"{op} {plan['size']} bytes")
    return rows


def table_rows(op: str, dtype: str, plans: list[dict[str, int]], rank_rows: list[Any]) -> list[dict[str, Any]]:
    """nccl-tests rows from every rank's `collective_rank` answer: the time of a size is the median over
    iterations of the slowest rank; algbw = size / time, busbw = algbw x the op's factor; #wrong summed."""
    n = len(rank_rows)
    factor = busbw_factor(op, n)
    rows = []
    for index, plan in enumerate(plans):
        time_ms = slowest_rank_median([ranks[index]["times_ms"] for ranks in rank_rows])
        seconds = time_ms * 1e-3
        algbw = plan["size"] / seconds / 1e9 if seconds > 0 else 0.0
        wrongs = [ranks[index]["wrong"] for ranks in rank_rows]
        rows.append(
            {
                "size": plan["size"],
                "count": plan["count"],
                "type": NCCL_TYPE_NAMES[dtype],
                "redop": "sum" if op in ("all_reduce", "reduce_scatter") else "none",
                "root": 0 if op == "broadcast" else -1,
                "time_us": time_ms * 1e3,
                "algbw": algbw,
                "busbw": algbw * factor,
                "wrong": -1 if min(wrongs) < 0 else sum(wrongs),
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]], avg_busbw: float, header: str) -> str:
    """The rows in nccl-tests' column layout."""
    lines = [
        header,
        f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>7} {'time':>8} {'algbw':>7} "
        f"{'busbw':>7} {'#wrong':>6}",
        f"#{'(B)':>11} {'(elements)':>13} {'':>9} {'':>7} {'':>7} {'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7}",
    ]
    for row in rows:
        wrong = "N/A" if row["wrong"] < 0 else str(row["wrong"])
        lines.append(
            f"{row['size']:>12} {row['count']:>13} {row['type']:>9} {row['redop']:>7} {row['root']:>7} "
            f"{row['time_us']:>8.1f} {row['algbw']:>7.2f} {row['busbw']:>7.2f} {wrong:>6}"
        )
    lines.append(f"# Avg bus bandwidth    : {avg_busbw:.4g}")
    return "\n".join(lines)


def check_collective_dtype(op: str, dtype: str) -> None:
    """InputError for a dtype the collective cannot honestly take: tf32 is a matmul mode (the data is fp32), and fp8
    is moved as raw bytes, never reduced."""
    if dtype == "tf32":
        raise InputError(
            "dtype: tf32 is fp32 data with TF32 matmul math, and a collective only moves (and adds) the data; "
            "accepted: fp32 (what tf32 training communicates), bf16, fp16, or fp8 for ops that do not reduce"
        )
    if dtype == "fp8" and op in _REDUCING_OPS:
        raise InputError(
            f"dtype: fp8 cannot be reduced ({op}): gloo has no fp8 sum, torch's NCCL backend refuses fp8 reductions "
            "in many versions, and NCCL sums fp8 only on sm_90+ in recent releases; accepted for fp8: all_gather, "
            f"all_to_all, broadcast (moved as bytes); for {op}: fp32, bf16, fp16"
        )


def prepare_collective(
    spec: CollectiveSpec, probe: MachineProbe | None = None
) -> tuple[str, str, list[dict[str, int]]]:
    """(backend, why, the size plans) for a collective benchmark; InputError when it cannot run here (a dtype the op
    cannot take, too many ranks, nccl without usable GPUs, buffers larger than a rank's memory)."""
    check_collective_dtype(spec.op, spec.dtype)
    probe = probe or probe_machine()
    backend, why = backend_decision(spec.backend, probe)
    n = spec.world_size
    check_world_size(n, backend, probe)
    plans = [plan_size(spec.op, s, spec.dtype, n) for s in spec.byte_sizes()]
    largest = max(p["size"] for p in plans)
    # Input and output buffers, plus the check's int64 indices and float32 copies (expected, output, a temporary).
    check_bytes = (8 + 3 * 4) * (largest // ELEMENT_BYTES[spec.dtype]) if spec.check else 0
    check_memory(2 * largest + check_bytes, backend, n, f"{spec.op} of {largest:,} bytes", probe)
    return backend, why, plans


def run_collective_benchmark(spec_data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    spec = CollectiveSpec.model_validate(spec_data)
    backend, why, plans = prepare_collective(spec)
    n = spec.world_size
    ctx.progress(0, len(plans), f"starting {n} ranks ({backend})")
    rank_rows = run_ranks(
        n,
        collective_rank,
        (spec.op, spec.dtype, plans, spec.model_dump()),
        backend=backend,
        timeout_s=spec.rank_timeout_s,
        log_dir=ctx.log_path("rank0").parent,
        on_progress=ctx.progress,
    )
    factor = busbw_factor(spec.op, n)
    rows = table_rows(spec.op, spec.dtype, plans, rank_rows)
    for index, row in enumerate(rows):
        ctx.log_metrics(step=index, **{k: row[k] for k in ("size", "count", "time_us", "algbw", "busbw", "wrong")})
    avg_busbw = sum(r["busbw"] for r in rows) / len(rows)
    where = describe_device(backend)
    header = (
        f"# {spec.op} on {n} ranks, backend {backend}, device {where['device_name']}; "
        f"time = median over {spec.iters} iterations of the slowest rank; "
        f"busbw factor {factor:.4g} ({BUSBW_FACTOR_TEXT})"
    )
    note = (
        "timings on CPU (gloo) check plumbing and correctness, not network or GPU performance"
        if backend == "gloo"
        else None
    )
    table = format_table(rows, avg_busbw, header)
    print(table, flush=True)
    return {
        "op": spec.op,
        "dtype": spec.dtype,
        "backend": backend,
        "backend_decision": why,
        **where,
        "world_size": n,
        "iters": spec.iters,
        "busbw_factor": factor,
        "rows": rows,
        "avg_busbw": avg_busbw,
        "total_wrong": sum(r["wrong"] for r in rows if r["wrong"] > 0),
        "checked": spec.check,
        "table": table,
        "timing": "median over iterations of the slowest rank's time; barrier before each iteration",
        "note": note,
    }
