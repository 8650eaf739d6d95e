"""The scaling-law forms and their evaluation. Plain Python; the fitting lives beside it.

- scalerl (ScaleRL, arXiv 2510.13786): R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)
- power_law: R(C) = A - D * C^(-B)
- chinchilla (Hoffmann et al. 2022): L(N, D) = E + A / N^alpha + B / D^beta, with the compute-optimal
  allocation for C = 6 N D: N_opt = G (C/6)^(beta/(alpha+beta)), D_opt = (C/6)^(alpha/(alpha+beta)) / G,
  G = (alpha A / (beta B))^(1/(alpha+beta)).
"""

import math
from typing import Literal

from pydantic import Field

from servers.core.errors import InputError
from servers.core.models import Model

ModelName = Literal["scalerl", "power_law", "chinchilla"]

PARAMETERS: dict[str, tuple[str, ...]] = {
    "scalerl": ("A", "B", "C_mid", "R0"),
    "power_law": ("A", "B", "D"),
    "chinchilla": ("E", "A", "B", "alpha", "beta"),
}
# Hoffmann et al. 2022, approach 3 (the published fit); used when no chinchilla parameters are given.
CHINCHILLA_PUBLISHED = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


class EvaluationPoint(Model):
    compute: float | None = Field(
        default=None, gt=0, le=1e40, allow_inf_nan=False, description="In the parameters' unit, e.g. GPU-hours"
    )
    params: float | None = Field(default=None, gt=0, le=1e20, allow_inf_nan=False)
    tokens: float | None = Field(default=None, gt=0, le=1e20, allow_inf_nan=False)


class SizePoint(Model):
    params: float = Field(gt=0, le=1e20, allow_inf_nan=False)
    tokens: float = Field(gt=0, le=1e20, allow_inf_nan=False)


class EvaluatedPoint(Model):
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
    ratio = C_mid / compute
    if isinstance(ratio, float) and ratio > 1.0 and B * math.log(ratio) > 700.0:
        return R0  # (C_mid / C)^B beyond any float: the curve is at its start (Python floats raise, numpy gives inf)
    return R0 + (A - R0) / (1.0 + ratio**B)


def power_law(compute: float, A: float, B: float, D: float) -> float:  # noqa: N803
    return A - D * compute ** (-B)


def chinchilla(params: float, tokens: float, E: float, A: float, B: float, alpha: float, beta: float) -> float:  # noqa: N803
    return E + A / params**alpha + B / tokens**beta


def _finite(value: float, where: str, model: str, params: dict[str, float]) -> float:
    if not math.isfinite(value):
        shown = ", ".join(f"{k}={v:g}" for k, v in params.items())
        raise InputError(
            f"{where}: {model} with {shown} gives a number too large or too small to represent (overflow); use "
            "parameters and inputs of a moderate size (e.g. exponents B, alpha, beta of order 0.1..10)"
        )
    return value


def evaluate(model: ModelName, params: dict[str, float], points: list[EvaluationPoint]) -> list[EvaluatedPoint]:
    checked = check_parameters(model, params)
    out: list[EvaluatedPoint] = []
    for i, point in enumerate(points):
        if model == "chinchilla":
            if point.params is None or point.tokens is None:
                raise InputError(f"point {i}: chinchilla needs 'params' (N) and 'tokens' (D) for every point")
            try:
                value = chinchilla(point.params, point.tokens, **checked)
            except (OverflowError, ZeroDivisionError):
                value = math.inf
            value = _finite(value, f"point {i}", model, checked)
            out.append(EvaluatedPoint(params=point.params, tokens=point.tokens, value=value))
        else:
            if point.compute is None:
                raise InputError(f"point {i}: {model} needs 'compute' for every point")
            fn = scalerl if model == "scalerl" else power_law
            try:
                value = fn(point.compute, **checked)
            except (OverflowError, ZeroDivisionError):
                value = math.inf
            out.append(EvaluatedPoint(compute=point.compute, value=_finite(value, f"point {i}", model, checked)))
    return out


class ComputeOptimal(Model):
    compute_flops: float
    params: float = Field(description="Compute-optimal parameter count N_opt")
    tokens: float = Field(description="Compute-optimal training tokens D_opt")
    tokens_per_param: float
    loss: float = Field(description="Predicted loss at (N_opt, D_opt)")


def _allocation(compute_flops: float, p: dict[str, float]) -> tuple[float, float]:
    """(N_opt, D_opt) for C = 6 N D, in logs so that no intermediate overflows; may be 0 or infinite, and NaN
    where the law has no compute-optimal path (a parameter A, B, alpha, beta that is not > 0, as a fit on its
    bound may have)."""
    alpha, beta = p["alpha"], p["beta"]
    if not min(alpha, beta, p["A"], p["B"]) > 0:
        return math.nan, math.nan
    log_g = (math.log(alpha) + math.log(p["A"]) - math.log(beta) - math.log(p["B"])) / (alpha + beta)
    log_c = math.log(compute_flops) - math.log(6.0)
    log_n = log_g + log_c * beta / (alpha + beta)
    log_d = log_c * alpha / (alpha + beta) - log_g
    return _exp(log_n), _exp(log_d)


def _exp(x: float) -> float:
    return math.inf if x > 709.0 else math.exp(x)


def optimal_loss(compute_flops: float, params: dict[str, float]) -> float:
    """The predicted loss at the compute-optimal (N, D) for C FLOPs (plain floats; no validation: params checked)."""
    n_opt, d_opt = _allocation(compute_flops, params)
    if not (0 < n_opt < math.inf and 0 < d_opt < math.inf):
        return math.inf
    try:
        return chinchilla(n_opt, d_opt, **params)
    except (OverflowError, ZeroDivisionError):
        return math.inf


def compute_optimal(compute_flops: float, params: dict[str, float]) -> ComputeOptimal:
    """The Chinchilla compute-optimal N and D for a budget of C = 6 N D FLOPs."""
    p = check_parameters("chinchilla", params)
    if not (math.isfinite(compute_flops) and compute_flops > 0):
        raise InputError(f"compute_flops must be a finite number > 0, got {compute_flops}")
    n_opt, d_opt = _allocation(compute_flops, p)
    loss = optimal_loss(compute_flops, p)
    ratio = d_opt / n_opt if 0 < n_opt < math.inf else math.inf
    if not (all(math.isfinite(v) and v > 0 for v in (n_opt, d_opt, ratio)) and math.isfinite(loss)):
        shown = ", ".join(f"{k}={v:.4g}" for k, v in p.items())
        raise InputError(
            f"compute_flops {compute_flops:g}: the chinchilla law with {shown} gives no finite, positive "
            "allocation there (N_opt, D_opt or the loss overflow or vanish); accepted: budgets where "
            "G = (alpha A / (beta B))^(1/(alpha+beta)) and (C/6)^(beta/(alpha+beta)) stay representable, i.e. "
            "exponents alpha, beta of order 0.1..1 and budgets of 1 to 1e40 FLOPs"
        )
    return ComputeOptimal(
        compute_flops=compute_flops,
        params=n_opt,
        tokens=d_opt,
        tokens_per_param=ratio,
        loss=loss,
    )
