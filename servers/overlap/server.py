"""The overlap server: GEMM, collective and overlap benchmarks as jobs, shape presets and the cost model."""

import functools
from typing import Annotated, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from servers.core.assemble import ServerPart, build_server
from servers.core.dtypes import DtypeArg
from servers.core.errors import InputError
from servers.core.job_tools import WaitS, run_job, summarize_job
from servers.core.jobfiles import JobFiles, read_json
from servers.core.jobs import JobKind
from servers.core.jobstore import JobState
from servers.core.jobview import JobView
from servers.core.mcp_layer import App, agent_tool, in_thread, tool_result
from servers.core.models import Model
from servers.overlap.collectives import (
    BufferDtype,
    Check,
    CollectiveIters,
    CollectiveSpec,
    CollectiveWarmup,
    MaxBytes,
    MinBytes,
    OpArg,
    SizeFactor,
    Sizes,
    sizes_problem,
)
from servers.overlap.cost_model import OverlapPrediction
from servers.overlap.distributed import BackendChoice, RankTimeoutS, WorldSize
from servers.overlap.gemm import FlushL2, GemmBenchmarkSpec, GemmDevice, GemmIters, GemmK, GemmM, GemmN, GemmWarmup
from servers.overlap.overlap_bench import (
    ALL_METHODS,
    Chunks,
    Iters,
    Methods,
    OverlapLayer,
    Pattern,
    Seed,
    Warmup,
)
from servers.overlap.presets import PRESET_NAMES, ShapePreset

NAME = "overlap"
INSTRUCTIONS = (
    "Compute-communication overlap for tensor parallelism: measure GEMMs, collectives and overlapped "
    "AllGather+GEMM / GEMM+ReduceScatter on real GPUs, and predict them with a cost model. Benchmarks run as "
    "jobs: follow them with wait_for_job."
)
JOB_KINDS = [
    JobKind(
        "gemm_benchmark",
        "servers.overlap.gemm:run_gemm_benchmark",
        "time one GEMM shape with torch (CUDA events on GPU)",
        default_timeout_s=600,
    ),
    JobKind(
        "collective_benchmark",
        "servers.overlap.collectives:run_collective_benchmark",
        "nccl-tests-style sweep of one collective over world_size ranks",
        default_timeout_s=1800,
        isolated_network=True,
    ),
    JobKind(
        "overlap_benchmark",
        "servers.overlap.overlap_bench:run_overlap_benchmark",
        "one TP GEMM + collective: sequential against the overlapped methods",
        default_timeout_s=1800,
        isolated_network=True,
    ),
    JobKind(
        "overlap_tune",
        "servers.overlap.overlap_bench:run_overlap_tune",
        "methods x chunk counts for each layer of a model",
        default_timeout_s=3 * 3600,
        isolated_network=True,
        poll_s=5.0,
    ),
]


# Arguments typed once (tune_overlap's run options come from overlap_bench, where its job spec uses them).
PatternArg = Annotated[
    Pattern, Field(description="ag_gemm: AllGather+GEMM; gemm_rs, gemm_ar: GEMM+ReduceScatter, +AllReduce")
]
SeqLen = Annotated[int, Field(ge=1, le=1 << 20)]
MicroBatch = Annotated[int, Field(ge=1, le=4096)]


def register(server: MCPServer, app: App) -> None:
    @agent_tool(
        server, title="Benchmark a GEMM", read_only=False, destructive=False, idempotent=False, open_world=False
    )
    async def benchmark_gemm(
        ctx: Context,
        m: GemmM,
        n: GemmN,
        k: GemmK,
        dtype: DtypeArg = "bf16",
        device: GemmDevice = "auto",
        warmup: GemmWarmup = 5,
        iters: GemmIters = 20,
        flush_l2: FlushL2 = False,
        wait_s: WaitS = 20,
        max_wall_s: Annotated[float, Field(gt=0, le=3600)] = 600,
    ) -> Annotated[CallToolResult, JobView]:
        """Time one GEMM (m x k @ k x n) with torch: ms percentiles, TFLOP/s, fraction of the catalog GPU's peak.
        Calibrates predict_overlap. A job; seconds. CPU timings check plumbing only."""
        from servers.overlap.gemm import prepare_gemm

        spec = GemmBenchmarkSpec(
            m=m, n=n, k=k, dtype=dtype, device=device, warmup=warmup, iters=iters, flush_l2=flush_l2
        )  # the job's spec: the same fields, stored as today
        await in_thread(prepare_gemm, spec)  # the same decision and messages as the job's own
        view = await run_job(
            app, "gemm_benchmark", spec.model_dump(mode="json"), wait_s=wait_s, ctx=ctx, timeout_s=max_wall_s
        )
        summary = summarize_job(view)
        if view.result:
            r = view.result
            summary = (
                f"GEMM {r['m']}x{r['n']}x{r['k']} {r['dtype']} on {r['device_name']}: median "
                f"{r['median_ms']:.4g} ms, {r['tflops']:.4g} TFLOP/s"
                + (f", {100 * r['fraction_of_peak']:.1f}% of peak" if r.get("fraction_of_peak") else "")
                + (f". {r['note']}" if r.get("note") else "")
                + f" (job {view.job_id})"
            )
        return tool_result(view, summary)


class PredictionResult(Model):
    prediction: OverlapPrediction = Field(description="From the catalog's figures and the model's constants")
    calibrated: OverlapPrediction | None = Field(
        default=None,
        description="The same with the GEMM efficiency and bus bandwidth measured on this GPU, when "
        "benchmark results for it are stored",
    )
    calibration_source: str | None = Field(default=None, description="Which stored results calibrated it")
    uncalibrated_reason: str | None = Field(
        default=None, description="When calibrated is null: why (what is stored, and what would calibrate it)"
    )


class PresetList(Model):
    presets: list[ShapePreset]
    not_divisible: dict[str, list[str]] = Field(
        default_factory=dict, description="Per preset, layers that do not split evenly across world_size"
    )


def stored_results(app: App, kind: str, limit: int = 200) -> list[dict]:
    """Results of the last successful jobs of a kind, as the engine stored them."""
    if kind not in app.job_kinds:
        return []
    page = app.engine.store.list_jobs(kind=kind, states=[JobState.SUCCEEDED], limit=limit)
    results = [read_json(JobFiles(r.job_dir).result) for r in page.jobs]
    return [r for r in results if isinstance(r, dict)]


def register_model_tools(server: MCPServer, app: App) -> None:
    @agent_tool(server, title="Predict overlap", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def predict_overlap(
        pattern: PatternArg,
        m: Annotated[int, Field(ge=1, le=1 << 24, description="Tokens")],
        n: Annotated[int, Field(ge=1, le=1 << 24)],
        k: Annotated[int, Field(ge=1, le=1 << 24)],
        world_size: Annotated[int, Field(ge=1, le=1024)],
        gpu: Annotated[str, Field(max_length=64, description="Catalog name")] = "H100-SXM",
        dtype: DtypeArg = "bf16",
        interconnect: Annotated[
            Literal["nvlink", "pcie", "infiniband"] | None,
            Field(description="Default: the GPU's; infiniband past its NVLink domain"),
        ] = None,
        max_chunks: Annotated[int, Field(ge=1, le=256)] = 16,
    ) -> Annotated[CallToolResult, PredictionResult]:
        """Predict a TP GEMM (global m, n, k) with its collective by a cost model, no GPU: T_gemm, T_comm,
        sequential vs best chunked overlap, E, speedup, worth_it; also calibrated by stored benchmarks of this GPU.
        Use before measuring. Instant."""
        from servers.overlap.cost_model import calibration_from_measurements, why_uncalibrated
        from servers.overlap.cost_model import predict_overlap as predict

        same_question = functools.partial(
            predict,
            pattern,
            m,
            n,
            k,
            world_size,
            dtype=dtype,
            gpu=gpu,
            interconnect=interconnect,
            max_chunks=max_chunks,
        )
        base = await in_thread(same_question)
        gemms = await in_thread(stored_results, app, "gemm_benchmark")
        collectives = await in_thread(stored_results, app, "collective_benchmark")
        calibration = await in_thread(calibration_from_measurements, gemms, collectives, gpu, dtype)
        calibrated = None
        uncalibrated_reason = None
        if calibration is not None:
            calibrated = await in_thread(same_question, calibration=calibration)
        else:
            uncalibrated_reason = await in_thread(why_uncalibrated, gemms, collectives, gpu, dtype)
        result = PredictionResult(
            prediction=base,
            calibrated=calibrated,
            calibration_source=calibration.source if calibration else None,
            uncalibrated_reason=uncalibrated_reason,
        )
        p = base
        efficiency = "n/a, nothing to hide" if p.efficiency is None else f"{p.efficiency:.2f}"
        text = (
            f"{pattern} {m}x{n}x{k} TP={world_size} {dtype} on {p.gpu} ({p.interconnect}): gemm "
            f"{p.t_gemm_ms:.4g} ms, comm {p.t_comm_ms:.4g} ms, sequential {p.t_sequential_ms:.4g} ms, overlapped "
            f"{p.t_overlap_ms:.4g} ms at {p.best_chunks} chunks (E={efficiency}, speedup "
            f"{p.speedup:.2f}x). {p.advice}"
        )
        if calibrated is not None:
            text += (
                f"\ncalibrated ({result.calibration_source}): sequential {calibrated.t_sequential_ms:.4g} ms, "
                f"overlapped {calibrated.t_overlap_ms:.4g} ms"
            )
        else:
            text += f"\n{uncalibrated_reason}"
        return tool_result(result, text)

    @agent_tool(
        server, title="List TP shape presets", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def list_shape_presets(
        name: Annotated[str | None, Field(max_length=64, description="e.g. llama3-8b; default all")] = None,
        seq_len: SeqLen = 4096,
        micro_batch: MicroBatch = 1,
        world_size: Annotated[
            int | None, Field(ge=1, le=1024, description="Flag layers this TP degree does not divide")
        ] = None,
    ) -> Annotated[CallToolResult, PresetList]:
        """Per-layer TP GEMM shapes and patterns of common models (Llama 3, Qwen2.5, Mixtral, DeepSeek-V3) at
        seq_len x micro_batch tokens, for predict_overlap and tune_overlap. Instant."""
        from servers.overlap.presets import get_preset, list_presets

        presets = [get_preset(name, seq_len, micro_batch)] if name else list_presets(seq_len, micro_batch)
        uneven = {p.name: p.divisible_by(world_size) for p in presets} if world_size else {}
        result = PresetList(presets=presets, not_divisible={k: v for k, v in uneven.items() if v})
        lines = []
        for p in presets:
            lines.append(f"{p.name} ({p.model}, {p.tokens} tokens):")
            lines += [f"  {layer.layer}: {layer.pattern} m={layer.m} n={layer.n} k={layer.k}" for layer in p.layers]
        return tool_result(result, "\n".join(lines))


def register_distributed_tools(server: MCPServer, app: App) -> None:
    @agent_tool(
        server, title="Benchmark a collective", read_only=False, destructive=False, idempotent=False, open_world=False
    )
    async def benchmark_collective(
        ctx: Context,
        op: OpArg = "all_reduce",
        min_bytes: MinBytes = 1024,
        max_bytes: MaxBytes = 16 * 2**20,
        factor: SizeFactor = 2,
        sizes: Sizes = None,
        dtype: BufferDtype = "fp32",
        world_size: WorldSize = 2,
        backend: BackendChoice = "auto",
        warmup: CollectiveWarmup = 5,
        iters: CollectiveIters = 20,
        check: Check = True,
        rank_timeout_s: RankTimeoutS = 600,
        wait_s: WaitS = 20,
        max_wall_s: Annotated[float, Field(gt=0, le=4 * 3600)] = 1800,
    ) -> Annotated[CallToolResult, JobView]:
        """Time a collective over a sweep of message sizes on world_size ranks (nccl on GPUs, else gloo): an
        nccl-tests table with busbw and wrong elements. Calibrates predict_overlap. A job; seconds to minutes."""
        from servers.overlap.collectives import prepare_collective

        problem = sizes_problem(min_bytes, max_bytes, sizes)
        if problem:
            raise InputError(f"min_bytes, max_bytes: {problem}; accepted: min_bytes <= max_bytes, or sizes instead")
        spec = CollectiveSpec(
            op=op,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            factor=factor,
            sizes=sizes,
            dtype=dtype,
            world_size=world_size,
            backend=backend,
            warmup=warmup,
            iters=iters,
            check=check,
            rank_timeout_s=rank_timeout_s,
        )  # the job's spec: the same fields, stored as today
        # The job decides again with the same probe (servers/overlap/limits.py): the same backend, the same refusals.
        backend, why, _ = await in_thread(prepare_collective, spec)
        data = spec.model_dump(mode="json")
        view = await run_job(app, "collective_benchmark", data, wait_s=wait_s, ctx=ctx, timeout_s=max_wall_s)
        summary = _with_decision(summarize_job(view), spec.backend, why)
        if view.result and "avg_busbw" in view.result:
            summary = (
                f"{spec.op} on {spec.world_size} ranks ({backend}): avg busbw {view.result['avg_busbw']:.4g} "
                f"GB/s over {len(view.result.get('rows', []))} sizes (job {view.job_id})\n"
                + str(view.result.get("table", ""))
            )
        return tool_result(view, summary)

    @agent_tool(server, title="Tune overlap", read_only=False, destructive=False, idempotent=False, open_world=False)
    async def tune_overlap(
        ctx: Context,
        preset: Annotated[str | None, Field(max_length=64, description="From list_shape_presets")] = None,
        layer: Annotated[str | None, Field(max_length=64, description="Only this layer of preset")] = None,
        layers: Annotated[
            list[OverlapLayer] | None, Field(max_length=32, description="Instead of preset; m, n, k global")
        ] = None,
        seq_len: SeqLen = 4096,
        micro_batch: MicroBatch = 1,
        world_size: WorldSize = 2,
        dtype: DtypeArg = "bf16",
        methods: Methods = ALL_METHODS,  # a tuple: no shared mutable default
        chunks: Chunks = (2, 4, 8),
        warmup: Warmup = 3,
        iters: Iters = 10,
        seed: Seed = 0,
        backend: BackendChoice = "auto",
        rank_timeout_s: RankTimeoutS = 900,
        predict_for_gpu: Annotated[
            str | None, Field(max_length=64, description="Default: the measured GPU if catalogued")
        ] = None,
        wait_s: WaitS = 20,
        max_wall_s: Annotated[float, Field(gt=0, le=12 * 3600)] = 3 * 3600,
    ) -> Annotated[CallToolResult, JobView]:
        """Measure TP GEMM + collective overlap per layer (a preset's, or given ones, even one): sequential vs
        chunked, ring, symm_mem per chunk count, validity-checked; per layer T_gemm, T_comm, busbw, E, speedup, the
        best valid row, its gain next to predict_overlap's. A job; minutes per layer; on CPU only correctness."""
        from servers.overlap.overlap_bench import OverlapTuneSpec

        if (preset is None) == (layers is None):
            raise InputError("preset, layers: give exactly one of preset or layers")
        if layers is not None and not layers:
            raise InputError(
                "layers: the list is empty; accepted: 1 to 32 layers, each {layer, pattern, m, n, k}, or a preset "
                f"instead ({', '.join(PRESET_NAMES)})"
            )
        if preset is None:
            preset_only = {"layer": (layer, None), "seq_len": (seq_len, 4096), "micro_batch": (micro_batch, 1)}
            given = [name for name, (value, default) in preset_only.items() if value != default]
            if given:
                raise InputError(
                    f"{', '.join(given)}: {'is' if len(given) == 1 else 'are'} for a preset (which layer, how many "
                    "tokens); accepted with preset only (layers give their own m, n, k)"
                )
        if preset is not None:
            from servers.overlap.presets import get_preset

            chosen = get_preset(preset, seq_len, micro_batch)
            names = [s.layer for s in chosen.layers]
            if layer is not None and layer not in names:
                raise InputError(f"layer: preset {chosen.name} has no layer {layer!r}; accepted: {', '.join(names)}")
            picked = [s for s in chosen.layers if layer in (None, s.layer)]
            layers = [OverlapLayer(layer=s.layer, pattern=s.pattern, m=s.m, n=s.n, k=s.k) for s in picked]
        assert layers is not None
        from servers.overlap.overlap_bench import prepare_tune

        spec = OverlapTuneSpec(
            layers=layers,
            world_size=world_size,
            dtype=dtype,
            methods=list(methods),
            chunks=list(chunks),
            warmup=warmup,
            iters=iters,
            seed=seed,
            backend=backend,
            rank_timeout_s=rank_timeout_s,
            predict_for_gpu=predict_for_gpu,
        )
        # The job decides again with the same probe (servers/overlap/limits.py): the same backend, the same refusals.
        _, why, _, _ = await in_thread(prepare_tune, spec)
        view = await run_job(
            app, "overlap_tune", spec.model_dump(mode="json"), wait_s=wait_s, ctx=ctx, timeout_s=max_wall_s
        )
        summary = _with_decision(summarize_job(view), backend, why)
        if view.result and view.result.get("table"):
            summary += "\n" + str(view.result["table"])
            if len(view.result.get("layers") or []) == 1:  # one layer: its methods table too
                summary += "\n" + str(view.result["layers"][0].get("table", ""))
        return tool_result(view, summary)


def _with_decision(summary: str, requested: str, why: str) -> str:
    """The summary, with the backend decision when 'auto' made one (the job records it too)."""
    return f"{summary}\n{why}" if requested == "auto" else summary


def register_all(server: MCPServer, app: App) -> None:
    register(server, app)
    register_model_tools(server, app)
    register_distributed_tools(server, app)


PART = ServerPart(name=NAME, instructions=INSTRUCTIONS, register=register_all, job_kinds=JOB_KINDS, starts_jobs=True)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, [PART], app)
