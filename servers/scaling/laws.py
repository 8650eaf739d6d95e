"""The scaling-law forms and their evaluation. Plain Python; the fitting lives beside it.

- scalerl (ScaleRL, arXiv 2510.13786): R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)
- power_law: R(C) = A - D * C^(-B)
- chinchilla (Hoffmann et al. 2022): L(N, D) = E + A / N^alpha + B / D^beta, with the compute-optimal
  allocation for C = 6 N D: N_opt = G (C/6)^(beta/(alpha+beta)), D_opt = (C/6)^(alpha/(alpha+beta)) / G,
  G = (alpha A / (beta B))^(1/(alpha+beta)).
"""

import math
from typing import Literal

from pydantic import BaseModel, Field

from servers.core.errors import InputError

ModelName = Literal["scalerl", "power_law", "chinchilla"]

PARAMETERS: dict[str, tuple[str, ...]] = {
    "scalerl": ("A", "B", "C_mid", "R0"),
    "power_law": ("A", "B", "D"),
    "chinchilla": ("E", "A", "B", "alpha", "beta"),
}
# Hoffmann et al. 2022, approach 3 (the published fit); used when no chinchilla parameters are given.
CHINCHILLA_PUBLISHED = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


class EvaluationPoint(BaseModel):
    compute: float | None = Field(
        default=None,
        gt=0,
        description="Compute (scalerl, power_law), in the unit the parameters were fitted in, e.g. GPU-hours",
    )
    params: float | None = Field(default=None, gt=0, description="Model parameters N (chinchilla)")
    tokens: float | None = Field(default=None, gt=0, description="Training tokens D (chinchilla)")


class EvaluatedPoint(BaseModel):
    compute: float | None = None
    params: float | None = None
    tokens: float | None = None
    value: float = Field(description="Predicted metric (scalerl, power_law) or loss (chinchilla)")


def check_parameters(model: ModelName, params: dict[str, float]) -> dict[str, float]:
    required = PARAMETERS[model]
    missing = [p for p in required if p not in params]
    extra = sorted(set(params) - set(required))
    if missing or extra:
        raise InputError(
            f"model {model!r} takes parameters {', '.join(required)}; "
            f"missing: {', '.join(missing) or 'none'}; unknown: {', '.join(extra) or 'none'}"
        )
    for name, value in params.items():
        if not math.isfinite(value):
            raise InputError(f"parameter {name} must be a finite number, got {value}")
    positive = {"scalerl": ("B", "C_mid"), "power_law": ("B",), "chinchilla": ("alpha", "beta", "A", "B")}[model]
    for name in positive:
        if params[name] <= 0:
            raise InputError(f"parameter {name} of {model!r} must be > 0, got {params[name]}")
    return {p: float(params[p]) for p in required}


def scalerl(compute: float, A: float, B: float, C_mid: float, R0: float) -> float:  # noqa: N803 - the paper's names
    return R0 + (A - R0) / (1.0 + (C_mid / compute) ** B)


def power_law(compute: float, A: float, B: float, D: float) -> float:  # noqa: N803
    return A - D * compute ** (-B)


def chinchilla(params: float, tokens: float, E: float, A: float, B: float, alpha: float, beta: float) -> float:  # noqa: N803
    return E + A / params**alpha + B / tokens**beta


def evaluate(model: ModelName, params: dict[str, float], points: list[EvaluationPoint]) -> list[EvaluatedPoint]:
    checked = check_parameters(model, params)
    out: list[EvaluatedPoint] = []
    for i, point in enumerate(points):
        if model == "chinchilla":
            if point.params is None or point.tokens is None:
                raise InputError(f"point {i}: chinchilla needs 'params' (N) and 'tokens' (D) for every point")
            value = chinchilla(point.params, point.tokens, **checked)
            out.append(EvaluatedPoint(params=point.params, tokens=point.tokens, value=value))
        else:
            if point.compute is None:
                raise InputError(f"point {i}: {model} needs 'compute' for every point")
            fn = scalerl if model == "scalerl" else power_law
            out.append(EvaluatedPoint(compute=point.compute, value=fn(point.compute, **checked)))
    return out


class ComputeOptimal(BaseModel):
    compute_flops: float
    params: float = Field(description="Compute-optimal parameter count N_opt")
    tokens: float = Field(description="Compute-optimal training tokens D_opt")
    tokens_per_param: float
    loss: float = Field(description="Predicted loss at (N_opt, D_opt)")


def compute_optimal(compute_flops: float, params: dict[str, float]) -> ComputeOptimal:
    """The Chinchilla compute-optimal N and D for a budget of C = 6 N D FLOPs."""
    p = check_parameters("chinchilla", params)
    alpha, beta = p["alpha"], p["beta"]
    g = (alpha * p["A"] / (beta * p["B"])) ** (1.0 / (alpha + beta))
    n_opt = g * (compute_flops / 6.0) ** (beta / (alpha + beta))
    d_opt = (compute_flops / 6.0) ** (alpha / (alpha + beta)) / g
    return ComputeOptimal(
        compute_flops=compute_flops,
        params=n_opt,
        tokens=d_opt,
        tokens_per_param=d_opt / n_opt,
        loss=chinchilla(n_opt, d_opt, **p),
    )


class Evaluation(BaseModel):
    model: ModelName
    parameters: dict[str, float] = Field(description="The parameters used (the published Chinchilla fit if none given)")
    points: list[EvaluatedPoint]
    asymptote: float = Field(
        description="Value approached with unlimited compute: A (scalerl, power_law) or E "
        "(chinchilla, the irreducible loss)"
    )
