"""The overlap server: GEMM benchmarks as jobs (collective and overlap benchmarks and the cost model follow)."""

import functools
from typing import Annotated, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from servers.core.assemble import ServerPart, build_server
from servers.core.dtypes import DtypeArg
from servers.core.errors import InputError
from servers.core.jobfiles import JobFiles, read_json
from servers.core.jobs import JobKind
from servers.core.jobstore import JobState
from servers.core.jobview import JobView
from servers.core.mcp_layer import App, WaitS, agent_tool, in_thread, run_job, summarize_job, tool_result
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
    OverlapSpec,
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
    ),
]


# Arguments that several tools take, typed and described once (the run options come from overlap_bench, where the
# job specs use them: benchmark_overlap and tune_overlap take the same).
PatternArg = Annotated[
    Pattern, Field(description="ag_gemm (AllGather+GEMM), gemm_rs (GEMM+ReduceScatter), gemm_ar (GEMM+AllReduce)")
]
SeqLen = Annotated[int, Field(ge=1, le=1 << 20, description="Preset sequence length")]
MicroBatch = Annotated[int, Field(ge=1, le=4096, description="Preset micro-batch")]


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
        max_wall_s: Annotated[float, Field(gt=0, le=3600, description="Wall-time limit of the job, s")] = 600,
    ) -> Annotated[CallToolResult, JobView]:
        """Time one GEMM (A m x k @ B k x n) with torch: median/min/max/p10/p90 ms, TFLOP/s and, on a GPU, the
        fraction of the catalog's dense peak. Use to measure a layer's GEMM or to calibrate predict_overlap. A job;
        seconds for moderate shapes. On CPU the timings check plumbing, not GPU speed."""
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
        m: Annotated[int, Field(ge=1, le=1 << 24, description="Global rows (tokens)")],
        n: Annotated[int, Field(ge=1, le=1 << 24, description="Global output columns")],
        k: Annotated[int, Field(ge=1, le=1 << 24, description="Global inner dimension")],
        world_size: Annotated[int, Field(ge=1, le=1024, description="Tensor-parallel degree")],
        gpu: Annotated[str, Field(max_length=64, description="Catalog GPU name, e.g. H100-SXM")] = "H100-SXM",
        dtype: DtypeArg = "bf16",
        interconnect: Annotated[
            Literal["nvlink", "pcie", "infiniband"] | None,
            Field(description="Default: the GPU's own; infiniband beyond one NVLink domain"),
        ] = None,
        max_chunks: Annotated[int, Field(ge=1, le=256, description="Largest chunk count to consider")] = 16,
    ) -> Annotated[CallToolResult, PredictionResult]:
        """Predict one TP GEMM with its collective, no GPU needed: T_gemm (roofline), T_comm (alpha-beta, NCCL
        ring), sequential vs the best chunked overlap, efficiency E, speedup, worth_it; calibrated too when GEMM or
        collective benchmarks of this GPU are stored (else uncalibrated_reason). Use before measuring. Instant."""
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
        name: Annotated[
            str | None, Field(max_length=64, description="One preset, e.g. llama3-8b; default: all of them")
        ] = None,
        seq_len: Annotated[int, Field(ge=1, le=1 << 20, description="Sequence length")] = 4096,
        micro_batch: Annotated[int, Field(ge=1, le=4096, description="Micro-batch size")] = 1,
        world_size: Annotated[
            int | None, Field(ge=1, le=1024, description="List the layers that do not split across this TP degree")
        ] = None,
    ) -> Annotated[CallToolResult, PresetList]:
        """TP GEMM shapes (QKV, attention out, MLP up/gate and down; MoE expert MLPs) of common models (Llama 3
        8B/70B, 3.1 405B, Qwen2.5 72B, Mixtral 8x7B, DeepSeek-V3) at seq_len x micro_batch tokens, each layer with
        its pattern, each preset with its source. Use to get shapes for predict_overlap, benchmark_overlap or
        tune_overlap. Instant."""
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
        max_wall_s: Annotated[float, Field(gt=0, le=4 * 3600, description="Wall-time limit of the job, s")] = 1800,
    ) -> Annotated[CallToolResult, JobView]:
        """Time a collective (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast) over a size sweep on
        world_size ranks (nccl on GPUs, gloo on CPU): an nccl-tests table (size, count, type, time, algbw, busbw,
        #wrong from checking every element). Use to measure bus bandwidth or to calibrate predict_overlap. A job;
        seconds to minutes."""
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

    @agent_tool(
        server, title="Benchmark overlap", read_only=False, destructive=False, idempotent=False, open_world=False
    )
    async def benchmark_overlap(
        ctx: Context,
        pattern: Annotated[
            Pattern | None, Field(description="ag_gemm (AllGather+GEMM), gemm_rs, gemm_ar; default ag_gemm")
        ] = None,
        m: Annotated[int | None, Field(ge=1, le=131072, description="Global M (Flux convention); default 4096")] = None,
        n: Annotated[int | None, Field(ge=1, le=131072, description="Global N; default 4096")] = None,
        k: Annotated[int | None, Field(ge=1, le=131072, description="Global K; default 4096")] = None,
        preset: Annotated[
            str | None, Field(max_length=64, description="Or the shape of a preset's layer (list_shape_presets)")
        ] = None,
        layer: Annotated[
            str | None, Field(max_length=64, description="The preset's layer, e.g. mlp_up_gate; default its first")
        ] = None,
        seq_len: SeqLen = 4096,
        micro_batch: MicroBatch = 1,
        world_size: WorldSize = 2,
        dtype: DtypeArg = "bf16",
        methods: Methods = ALL_METHODS,  # a tuple: no shared mutable default
        chunks: Chunks = (2, 4),
        warmup: Warmup = 3,
        iters: Iters = 10,
        seed: Seed = 0,
        backend: BackendChoice = "auto",
        rank_timeout_s: RankTimeoutS = 900,
        wait_s: WaitS = 20,
        max_wall_s: Annotated[float, Field(gt=0, le=4 * 3600, description="Wall-time limit of the job, s")] = 1800,
    ) -> Annotated[CallToolResult, JobView]:
        """Measure one TP GEMM with its collective: sequential vs chunked, ring and symm_mem (NVLink only)
        overlap. Returns T_gemm, T_comm, T_overlap, exposed comm, E, speedup, busbw, each method's error vs
        sequential, validity checks and the best valid row. Shape: pattern/m/n/k or a preset's layer. A job; on CPU
        it checks correctness, not speed."""
        shape = {"pattern": pattern, "m": m, "n": n, "k": k}
        if preset is None:
            preset_only = {"layer": (layer, None), "seq_len": (seq_len, 4096), "micro_batch": (micro_batch, 1)}
            given = [name for name, (value, default) in preset_only.items() if value != default]
            if given:
                raise InputError(
                    f"{', '.join(given)}: {'is' if len(given) == 1 else 'are'} for a preset's layer (which one, how "
                    "many tokens); accepted with preset only"
                )
            shape = {name: value for name, value in shape.items() if value is not None}  # OverlapSpec's defaults
        else:
            from servers.overlap.presets import get_preset

            clash = sorted(name for name, value in shape.items() if value is not None)
            if clash:
                raise InputError(
                    f"{', '.join(clash)}: preset {preset!r} gives the pattern and m/n/k; accepted: a preset (and its "
                    "layer) or the shape, not both"
                )
            chosen = get_preset(preset, seq_len, micro_batch)
            names = [s.layer for s in chosen.layers]
            match = [s for s in chosen.layers if s.layer == (layer or names[0])]
            if not match:
                raise InputError(f"layer: preset {chosen.name} has no layer {layer!r}; accepted: {', '.join(names)}")
            shape = {"pattern": match[0].pattern, "m": match[0].m, "n": match[0].n, "k": match[0].k}
        from servers.overlap.overlap_bench import prepare_overlap

        spec = OverlapSpec(
            **shape,
            world_size=world_size,
            dtype=dtype,
            methods=list(methods),
            chunks=list(chunks),
            warmup=warmup,
            iters=iters,
            seed=seed,
            backend=backend,
            rank_timeout_s=rank_timeout_s,
        )
        # The job decides again with the same probe (servers/overlap/limits.py): the same backend, the same refusals.
        _, why = await in_thread(prepare_overlap, spec)
        data = spec.model_dump(mode="json")
        view = await run_job(app, "overlap_benchmark", data, wait_s=wait_s, ctx=ctx, timeout_s=max_wall_s)
        summary = _with_decision(summarize_job(view), spec.backend, why)
        if view.result and view.result.get("table"):
            summary += "\n" + str(view.result["table"])
        return tool_result(view, summary)

    @agent_tool(server, title="Tune overlap", read_only=False, destructive=False, idempotent=False, open_world=False)
    async def tune_overlap(
        ctx: Context,
        preset: Annotated[str | None, Field(max_length=64, description="Tune every TP layer of this preset")] = None,
        layers: Annotated[
            list[OverlapLayer] | None, Field(max_length=32, description="Or these layers (1 to 32)")
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
            str | None,
            Field(max_length=64, description="Catalog GPU to predict for; default: the measured one, if catalogued"),
        ] = None,
        wait_s: WaitS = 20,
        max_wall_s: Annotated[float, Field(gt=0, le=12 * 3600, description="Wall-time limit of the job, s")] = 3 * 3600,
    ) -> Annotated[CallToolResult, JobView]:
        """Sweep methods x chunk counts for each layer (a preset's TP layers, or given ones): per layer the best
        valid, correct configuration, its gain over sequential next to predict_overlap's (or why none), a verdict,
        and a table. Use to decide overlap layer by layer. A job; minutes to hours (one benchmark_overlap run per
        layer)."""
        from servers.overlap.overlap_bench import OverlapTuneSpec

        if (preset is None) == (layers is None):
            raise InputError("preset, layers: give exactly one of preset or layers")
        if layers is not None and not layers:
            raise InputError(
                "layers: the list is empty; accepted: 1 to 32 layers, each {layer, pattern, m, n, k}, or a preset "
                f"instead ({', '.join(PRESET_NAMES)})"
            )
        if preset is not None:
            from servers.overlap.presets import get_preset

            chosen = get_preset(preset, seq_len, micro_batch)
            layers = [OverlapLayer(layer=s.layer, pattern=s.pattern, m=s.m, n=s.n, k=s.k) for s in chosen.layers]
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
