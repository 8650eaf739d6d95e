"""The overlap server: GEMM benchmarks as jobs (collective and overlap benchmarks and the cost model follow)."""

from typing import Annotated, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from servers.core.assemble import ServerPart, build_server
from servers.core.jobfiles import JobFiles, read_json
from servers.core.jobs import JobKind
from servers.core.jobstore import JobState
from servers.core.jobview import JobView
from servers.core.mcp_layer import App, WaitS, agent_tool, in_thread, run_job, summarize_job, tool_result
from servers.overlap.cost_model import OverlapPrediction
from servers.overlap.gemm import GemmBenchmarkSpec
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
]


def register(server: MCPServer, app: App) -> None:
    @agent_tool(
        server, title="Benchmark a GEMM", read_only=False, destructive=False, idempotent=False, open_world=False
    )
    async def benchmark_gemm(
        ctx: Context,
        spec: Annotated[GemmBenchmarkSpec, Field(description="The GEMM shape, dtype, device and iteration counts")],
        wait_s: WaitS = 20,
        timeout_s: Annotated[float, Field(gt=0, le=3600, description="Wall-time limit of the job")] = 600,
    ) -> Annotated[CallToolResult, JobView]:
        """Time one GEMM (C = A @ B with A m x k, B k x n) with torch in a separate process: median, min, max and
        percentiles over iters iterations after warm-up, TFLOP/s, and on a GPU the fraction of the catalog's
        dense peak (CUDA events; optional L2 flush). Runs as a job: the result comes back if it ends within
        wait_s, else the job handle (follow with wait_for_job). A few seconds for moderate shapes; on CPU the
        timings check plumbing, not GPU performance."""
        view = await run_job(
            app, "gemm_benchmark", spec.model_dump(mode="json"), wait_s=wait_s, ctx=ctx, timeout_s=timeout_s
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


class PredictionResult(BaseModel):
    prediction: OverlapPrediction = Field(description="From the catalog's figures and the model's constants")
    calibrated: OverlapPrediction | None = Field(
        default=None,
        description="The same with the GEMM efficiency and bus bandwidth measured on this GPU, when "
        "benchmark results for it are stored",
    )
    calibration_source: str | None = None


class PresetList(BaseModel):
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
        pattern: Annotated[
            Literal["ag_gemm", "gemm_rs", "gemm_ar"],
            Field(
                description="ag_gemm: AllGather then "
                "GEMM (QKV, MLP up); gemm_rs: GEMM then ReduceScatter (attention out, MLP down); "
                "gemm_ar: GEMM then AllReduce"
            ),
        ],
        m: Annotated[int, Field(ge=1, le=1 << 24, description="Global rows (tokens)")],
        n: Annotated[int, Field(ge=1, le=1 << 24, description="Global output columns")],
        k: Annotated[int, Field(ge=1, le=1 << 24, description="Global inner dimension")],
        world_size: Annotated[int, Field(ge=1, le=1024, description="Tensor-parallel degree")],
        gpu: Annotated[str, Field(max_length=64, description="GPU name from the catalog, e.g. H100-SXM")] = "H100-SXM",
        dtype: Annotated[Literal["fp32", "tf32", "bf16", "fp16", "fp8"], Field(description="GEMM input type")] = "bf16",
        interconnect: Annotated[
            Literal["nvlink", "pcie", "infiniband"] | None,
            Field(description="Default: the GPU's own (NVLink or PCIe), InfiniBand beyond one NVLink domain"),
        ] = None,
        max_chunks: Annotated[int, Field(ge=1, le=256, description="Largest chunk count to consider")] = 16,
    ) -> Annotated[CallToolResult, PredictionResult]:
        """Predict, without a GPU, one tensor-parallel GEMM with its collective: T_gemm (roofline from the GPU
        catalog), T_comm (alpha-beta model with NCCL's ring constants), the sequential time, the best pipelined
        overlap over chunk counts (by_chunks lists each), overlap efficiency E and speedup, and whether overlap is
        worth it. When GEMM or collective benchmarks for the same GPU are stored, also a calibrated prediction."""
        from servers.overlap.cost_model import calibration_from_measurements
        from servers.overlap.cost_model import predict_overlap as predict

        base = await in_thread(
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
        gemms = await in_thread(stored_results, app, "gemm_benchmark")
        collectives = await in_thread(stored_results, app, "collective_benchmark")
        calibration = await in_thread(calibration_from_measurements, gemms, collectives, gpu, dtype)
        calibrated = None
        if calibration is not None:
            calibrated = await in_thread(
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
                calibration=calibration,
            )
        result = PredictionResult(
            prediction=base, calibrated=calibrated, calibration_source=calibration.source if calibration else None
        )
        p = base
        text = (
            f"{pattern} {m}x{n}x{k} TP={world_size} {dtype} on {p.gpu} ({p.interconnect}): gemm "
            f"{p.t_gemm_ms:.3f} ms, comm {p.t_comm_ms:.3f} ms, sequential {p.t_sequential_ms:.3f} ms, overlapped "
            f"{p.t_overlap_ms:.3f} ms at {p.best_chunks} chunks (E={p.efficiency:.2f}, speedup "
            f"{p.speedup:.2f}x). {p.advice}"
        )
        if calibrated is not None:
            text += (
                f"\ncalibrated ({result.calibration_source}): sequential {calibrated.t_sequential_ms:.3f} ms, "
                f"overlapped {calibrated.t_overlap_ms:.3f} ms"
            )
        return tool_result(result, text)

    @agent_tool(
        server, title="List TP shape presets", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def list_shape_presets(
        name: Annotated[
            str | None, Field(max_length=64, description=f"One preset ({', '.join(PRESET_NAMES)}); default: all")
        ] = None,
        seq_len: Annotated[int, Field(ge=1, le=1 << 20, description="Sequence length")] = 4096,
        micro_batch: Annotated[int, Field(ge=1, le=4096, description="Micro-batch size")] = 1,
        world_size: Annotated[
            int | None,
            Field(ge=1, le=1024, description="If given, list layers that do not split evenly across this TP degree"),
        ] = None,
    ) -> Annotated[CallToolResult, PresetList]:
        """Tensor-parallel GEMM shapes (QKV, attention output, MLP up/gate, MLP down; expert MLPs for MoE models) of
        common models (Llama 3 8B/70B, Llama 3.1 405B, Qwen2.5 72B, Mixtral 8x7B, DeepSeek-V3) at seq_len x
        micro_batch tokens, derived from their published configurations (each preset names its source), in the
        Flux convention with the pattern of each layer. Instant."""
        from servers.overlap.presets import get_preset, list_presets

        presets = [get_preset(name, seq_len, micro_batch)] if name else list_presets(seq_len, micro_batch)
        uneven = {p.name: p.divisible_by(world_size) for p in presets} if world_size else {}
        result = PresetList(presets=presets, not_divisible={k: v for k, v in uneven.items() if v})
        lines = []
        for p in presets:
            lines.append(f"{p.name} ({p.model}, {p.tokens} tokens):")
            lines += [f"  {layer.layer}: {layer.pattern} m={layer.m} n={layer.n} k={layer.k}" for layer in p.layers]
        return tool_result(result, "\n".join(lines))


def register_all(server: MCPServer, app: App) -> None:
    register(server, app)
    register_model_tools(server, app)


PART = ServerPart(name=NAME, instructions=INSTRUCTIONS, register=register_all, job_kinds=JOB_KINDS, starts_jobs=True)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, [PART], app)
