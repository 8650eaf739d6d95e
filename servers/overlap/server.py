"""The overlap server: GEMM benchmarks as jobs (collective and overlap benchmarks and the cost model follow)."""

from typing import Annotated

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from servers.core.assemble import ServerPart, build_server
from servers.core.jobs import JobKind
from servers.core.jobview import JobView
from servers.core.mcp_layer import App, WaitS, agent_tool, run_job, summarize_job, tool_result
from servers.overlap.gemm import GemmBenchmarkSpec

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


PART = ServerPart(name=NAME, instructions=INSTRUCTIONS, register=register, job_kinds=JOB_KINDS, starts_jobs=True)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, [PART], app)
