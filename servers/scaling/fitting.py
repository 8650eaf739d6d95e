"""What every fitting procedure returns, whatever the model or method. Types only (no numpy), so that the
server can import it at start-up; the numerics live in fit_sigmoid.py and fit_chinchilla.py."""

from typing import Literal

from pydantic import BaseModel, Field

SigmoidMethod = Literal["robust", "scalerl-grid", "curve_fit"]
ChinchillaMethod = Literal["robust", "naive-grid"]


class ParameterEstimate(BaseModel):
    value: float
    ci_low: float | None = Field(default=None, description="Lower end of the 95% bootstrap interval")
    ci_high: float | None = Field(default=None, description="Upper end of the 95% bootstrap interval")
    fixed: bool = Field(default=False, description="True if the parameter was held fixed, not fitted")


class FitOutcome(BaseModel):
    """One fit: point estimates, bootstrap intervals and draws, quality, and what to be careful about."""

    model: Literal["scalerl", "power_law", "chinchilla"]
    method: str
    parameters: dict[str, ParameterEstimate]
    rmse: float = Field(
        description="Root-mean-square residual of the fitted points, in the metric's units (loss units for chinchilla)"
    )
    objective: float = Field(description="Final value of the objective the method minimised")
    converged: bool
    message: str = Field(description="What the optimiser said")
    warnings: list[str] = Field(default_factory=list)
    bootstrap: int = Field(description="Bootstrap resamples that produced a fit")
    bootstrap_draws: list[dict[str, float]] = Field(
        default_factory=list, description="Parameter values of each bootstrap refit, for prediction intervals"
    )
    points_used: int
    duration_s: float


# ---- what predictions and comparisons return ------------------------------------------------------------


class PredictedValue(BaseModel):
    compute: float | None = None
    params: float | None = None
    tokens: float | None = None
    value: float = Field(description="Prediction from the fitted parameters")
    ci_low: float | None = Field(default=None, description="Interval of the fitted curve from the bootstrap")
    ci_high: float | None = None
    pi_low: float | None = Field(
        default=None,
        description="Prediction interval: the curve's interval widened by the residual scatter of the data (RMSE)",
    )
    pi_high: float | None = None
    extrapolated: bool = Field(description="True beyond the largest compute (or N, D) the fit used")


class ComputeForTarget(BaseModel):
    target: float
    reachable: bool
    compute: float | None = Field(description="Compute needed (FLOPs along the compute-optimal path for chinchilla)")
    ci_low: float | None = None
    ci_high: float | None = None
    draws_reaching: float | None = Field(
        default=None, description="Share of bootstrap draws whose curve reaches the target at all"
    )
    statement: str


class FitInComparison(BaseModel):
    fit_id: str
    label: str | None
    model: str
    asymptote: float
    asymptote_ci: tuple[float, float] | None
    c_mid: float | None = Field(description="Compute at half the gain (scalerl): lower is more efficient")
    b: float


class PairVerdict(BaseModel):
    first: str
    second: str
    p_first_higher_asymptote: float | None = Field(
        description="Share of bootstrap draw pairs in which the first fit's asymptote is higher"
    )
    p_first_more_efficient: float | None = Field(
        description="Share of draw pairs in which the first fit reaches half its gain with less compute (scalerl)"
    )
    crossings: list[float] = Field(description="Compute values where the two fitted curves cross")
    verdict: str


class Comparison(BaseModel):
    compute_unit: str
    fits: list[FitInComparison]
    pairs: list[PairVerdict]
    best_asymptote: str
    most_efficient: str | None
    verdict: str
