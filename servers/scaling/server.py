"""The scaling server: evaluate scaling-law forms (fitting and extrapolation come with the fitting module)."""

from typing import Annotated

from mcp.server import MCPServer
from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from servers.core.assemble import ServerPart, build_server
from servers.core.mcp_layer import App, agent_tool, tool_result
from servers.scaling import laws

NAME = "scaling"
INSTRUCTIONS = (
    "Scaling laws for LLM training: the ScaleRL sigmoid of RL reward against compute, the power law it is "
    "compared with, and Chinchilla pretraining loss with compute-optimal allocation."
)


class ScalingEvaluation(BaseModel):
    model: laws.ModelName
    parameters: dict[str, float] = Field(description="The parameters used (the published Chinchilla fit if none given)")
    points: list[laws.EvaluatedPoint]
    asymptote: float = Field(
        description="Value approached with unlimited compute: A (scalerl, power_law) or E "
        "(chinchilla, the irreducible loss)"
    )


def register(server: MCPServer, app: App) -> None:
    @agent_tool(
        server, title="Evaluate a scaling law", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def evaluate_scaling_law(
        model: Annotated[
            laws.ModelName,
            Field(
                description="scalerl: R0 + (A-R0)/(1+(C_mid/C)^B); power_law: "
                "A - D*C^-B; chinchilla: E + A/N^alpha + B/D^beta"
            ),
        ],
        points: Annotated[
            list[laws.EvaluationPoint],
            Field(
                min_length=1,
                max_length=10_000,
                description="Where to evaluate: {compute} for scalerl/power_law, {params, tokens} for chinchilla",
            ),
        ],
        parameters: Annotated[
            dict[str, float] | None,
            Field(
                description="The law's parameters by name (scalerl: A, "
                "B, C_mid, R0; power_law: A, B, D; chinchilla: E, A, B, alpha, beta). Chinchilla "
                "defaults to Hoffmann et al.'s published fit"
            ),
        ] = None,
    ) -> Annotated[CallToolResult, ScalingEvaluation]:
        """Evaluate a scaling law with given parameters at given compute (or model size and tokens): e.g. what
        pass rate a ScaleRL curve with A=0.61, B=1.92, C_mid=2542 GPU-hours predicts at 10k GPU-hours, or what
        loss Chinchilla predicts for 70B parameters on 1.4T tokens. Instant; no fitting."""
        if parameters is None:
            if model != "chinchilla":
                raise laws.InputError(f"model {model!r} needs parameters: {', '.join(laws.PARAMETERS[model])}")
            parameters = dict(laws.CHINCHILLA_PUBLISHED)
        values = laws.evaluate(model, parameters, points)
        asymptote = parameters["E"] if model == "chinchilla" else parameters["A"]
        result = ScalingEvaluation(
            model=model, parameters=laws.check_parameters(model, parameters), points=values, asymptote=asymptote
        )
        shown = ", ".join(f"{v.value:.4g}" for v in values[:8]) + (" ..." if len(values) > 8 else "")
        return tool_result(result, f"{model} at {len(values)} point(s): {shown}; asymptote {asymptote:.4g}")

    @agent_tool(
        server,
        title="Chinchilla compute-optimal allocation",
        read_only=True,
        destructive=False,
        idempotent=True,
        open_world=False,
    )
    async def compute_optimal_allocation(
        compute_flops: Annotated[
            list[Annotated[float, Field(gt=0, le=1e35)]],
            Field(min_length=1, max_length=1000, description="Training budgets in FLOPs (C = 6 N D)"),
        ],
        parameters: Annotated[
            dict[str, float] | None,
            Field(description="Chinchilla parameters E, A, B, alpha, beta; default: Hoffmann et al.'s published fit"),
        ] = None,
    ) -> Annotated[CallToolResult, laws.ComputeOptimalTable]:
        """For each FLOP budget, the Chinchilla compute-optimal model size and token count and the loss predicted
        there, from a pretraining law's parameters (default: the published Chinchilla fit). Instant."""
        params = parameters or dict(laws.CHINCHILLA_PUBLISHED)
        rows = [laws.compute_optimal(c, params) for c in compute_flops]
        table = laws.ComputeOptimalTable(parameters=laws.check_parameters("chinchilla", params), allocations=rows)
        lines = [
            f"C={r.compute_flops:.3g} FLOPs: N={r.params:.3g}, D={r.tokens:.3g} ({r.tokens_per_param:.1f} tokens "
            f"per parameter), loss {r.loss:.4f}"
            for r in rows[:10]
        ]
        return tool_result(table, "\n".join(lines))


PART = ServerPart(name=NAME, instructions=INSTRUCTIONS, register=register)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, [PART], app)
