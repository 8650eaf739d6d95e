"""What every fitting procedure returns, whatever the model or method. Types only (no numpy), so that the
server can import it at start-up; the numerics live in fit_sigmoid.py and fit_chinchilla.py."""

from typing import Literal

from pydantic import Field, model_validator

from servers.core.models import Model

SigmoidMethod = Literal["robust", "scalerl-grid", "curve_fit"]
ChinchillaMethod = Literal["robust", "naive-grid"]


class ParameterEstimate(Model):
    value: float
    ci_low: float | None = Field(
        default=None, description="Lower end of the bootstrap interval, at the fit's level (FitOutcome.level)"
    )
    ci_high: float | None = Field(
        default=None, description="Upper end of the bootstrap interval, at the fit's level (FitOutcome.level)"
    )
    fixed: bool = Field(default=False, description="True if the parameter was held fixed, not fitted")
    note: str | None = Field(default=None, description="How a fixed parameter was set")


def interval_warning(name: str, p: ParameterEstimate, level: float, below: float | None) -> str:
    """The warning a fit carries when the interval of `name` does not contain its estimate."""
    share = "" if below is None else f"; {below:.0%} of the bootstrap refits lie below the estimate"
    return (
        f"The {level:.0%} interval of {name} [{p.ci_low:.4g}, {p.ci_high:.4g}] does not contain its estimate "
        f"{p.value:.4g}{share}: the refits are centred away from the fit, so this interval is biased and does not "
        f"describe the estimate's uncertainty; do not quote it (refit with more points, or another method)."
    )


def failure_warning(run: int, used: int, failed: dict[str, int]) -> str:
    """The warning a fit carries when some bootstrap refits were left out."""
    reasons = "; ".join(f"{count}: {reason}" for reason, count in sorted(failed.items(), key=lambda kv: -kv[1]))
    text = f"{run - used} of {run} bootstrap refits were left out ({reasons}); the intervals rest on the other {used}"
    if used < 0.9 * run:
        text += ", and may be too narrow if the failures are not at random: treat them with caution"
    return text + "."


NotIdentifiedReason = Literal["beyond_data", "at_bound", "wide_interval", "flat"]


class NotIdentified(Model):
    """A parameter the fitted data do not determine, and why. A prediction or comparison that rests on it says so."""

    parameter: str
    reason: NotIdentifiedReason = Field(
        description="beyond_data: the fitted C_mid lies beyond the largest compute (no point past the midpoint); "
        "at_bound: the estimate or its interval ended at its search bound; wide_interval: A's interval spans most "
        "of what A can be; flat: the curve barely moves"
    )
    detail: str


class FitOutcome(Model):
    """One fit: point estimates, bootstrap intervals and draws, quality, and what to be careful about.

    Its own checks (run whenever one is made or read back): every interval that does not contain its estimate
    carries a warning (interval_warning), and the bootstrap's counts add up (bootstrap + failed = bootstrap_run,
    with a warning naming the reasons whenever refits were left out)."""

    model: str = Field(max_length=64, description="The law's name in the registry (laws.py)")
    method: str
    parameters: dict[str, ParameterEstimate]
    rmse: float = Field(
        description="Root-mean-square residual of the fitted points, in the metric's units (loss units for chinchilla)"
    )
    objective: float = Field(description="Final value of the objective the method minimised")
    converged: bool
    message: str = Field(description="What the optimiser said")
    warnings: list[str] = Field(default_factory=list)
    not_identified: list[NotIdentified] = Field(
        default_factory=list, description="Parameters these data do not determine, and why"
    )
    level: float = Field(default=0.95, description="Coverage of the parameters' bootstrap intervals")
    bootstrap: int = Field(description="Bootstrap resamples whose refit is used (the intervals rest on these)")
    bootstrap_run: int | None = Field(
        default=None, description="Bootstrap resamples refitted: bootstrap (used) + the failed ones"
    )
    bootstrap_failed: dict[str, int] = Field(
        default_factory=dict, description="Bootstrap refits left out, counted by reason"
    )
    bootstrap_draws: list[dict[str, float]] = Field(
        default_factory=list, description="Parameter values of each bootstrap refit, for prediction intervals"
    )
    points_used: int
    duration_s: float

    @model_validator(mode="after")
    def _own_checks(self) -> "FitOutcome":
        if self.bootstrap_run is not None:
            failed = sum(self.bootstrap_failed.values())
            gap = self.bootstrap_run - self.bootstrap - failed
            if gap > 0:
                self.bootstrap_failed["left out without a recorded reason"] = gap
            elif gap < 0:
                self.bootstrap_run = self.bootstrap + failed
            if self.bootstrap_run > self.bootstrap:
                self._warn(failure_warning(self.bootstrap_run, self.bootstrap, self.bootstrap_failed))
        for name, p in self.parameters.items():
            if p.ci_low is None or p.ci_high is None or p.ci_low <= p.value <= p.ci_high:
                continue
            values = [d[name] for d in self.bootstrap_draws if name in d]
            below = sum(v < p.value for v in values) / len(values) if values else None
            self._warn(interval_warning(name, p, self.level, below))
        return self

    def _warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def intervals_missing_their_estimate(self) -> list[str]:
        """Names of the parameters whose interval does not contain the estimate."""
        return [
            n
            for n, p in self.parameters.items()
            if p.ci_low is not None and p.ci_high is not None and not p.ci_low <= p.value <= p.ci_high
        ]


# ---- what predictions and comparisons return ------------------------------------------------------------


class PredictedValue(Model):
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
    extrapolated: bool | None = Field(
        description="True beyond the largest compute (or N, D) the fit used; null for parameters given (no data)"
    )


class ComputeForTarget(Model):
    target: float
    verdict: Literal["reachable", "unreachable", "uncertain", "undefined"] = Field(
        description="reachable: the fitted curve gets there and at least `level` of the bootstrap draws do; "
        "unreachable: it does not and at most 1 - level of the draws do; uncertain: anything between (see "
        "draws_reaching); undefined: the fit has no compute-optimal path (chinchilla with a term on its bound)"
    )
    reachable: bool | None = Field(
        description="True when the verdict is reachable, False when unreachable, null when uncertain or undefined"
    )
    compute: float | None = Field(
        description="Compute at which the fitted curve reaches the target (FLOPs along the compute-optimal path for "
        "chinchilla); null when the fitted curve does not reach it"
    )
    ci_low: float | None = Field(
        default=None,
        description="Lower end of the compute's interval over all draws (a draw that never gets there "
        "counts as infinite compute)",
    )
    ci_high: float | None = Field(
        default=None, description="Upper end of that interval; null when more than its tail of draws never get there"
    )
    draws_reaching: float | None = Field(
        default=None, description="Share of bootstrap draws whose curve reaches the target (within 1e40 compute)"
    )
    statement: str


class FitInComparison(Model):
    fit_id: str
    label: str | None
    model: str
    asymptote: float
    asymptote_ci: tuple[float, float] | None
    c_mid: float | None = Field(description="Compute at half the gain (scalerl): lower is more efficient")
    b: float
    warnings: list[str] = Field(default_factory=list, description="The fit's own warnings")
    not_identified: list[NotIdentified] = Field(
        default_factory=list, description="Parameters the fit's data do not determine; no call rests on them"
    )
    value_at: float | None = Field(
        default=None, exclude_if=lambda v: v is None, description="Fitted curve at at_compute (with at_compute)"
    )


class LeadRegion(Model):
    """A stretch of compute over which one fit is clearly ahead of the other, or neither is."""

    low: float = Field(description="Where the stretch begins (compute)")
    high: float = Field(description="Where it ends (compute)")
    leader: str | None = Field(
        description="The fit ahead throughout the stretch: its fitted curve is above the other's at every compute "
        "in it (as predict_scaling gives) and so are at least `level` of the bootstrap draw pairs at every compute "
        "checked; null where the two are indistinguishable"
    )
    p_first_ahead: tuple[float, float] | None = Field(
        description="Least and greatest share of bootstrap draw pairs in which the first fit is above the second, "
        "over the stretch; null without bootstrap draws"
    )
    largest_gap: float = Field(description="Largest difference between the fitted curves over the stretch")
    extrapolated: bool = Field(description="True beyond the compute either fit was fitted on")


class PairVerdict(Model):
    first: str
    second: str
    p_first_higher_asymptote: float | None = Field(
        description="Share of bootstrap draw pairs in which the first fit's asymptote is higher"
    )
    p_first_more_efficient: float | None = Field(
        description="Share of draw pairs in which the first fit reaches half its gain with less compute (scalerl)"
    )
    compute_range: tuple[float, float] = Field(
        description="The compute considered: from the smallest fitted compute to 100 times the largest"
    )
    regions: list[LeadRegion] = Field(description="Who leads where, in order of compute, covering compute_range")
    crossings: list[float] = Field(
        description="Compute values where the two fitted curves (point estimates) cross; whether either is clearly "
        "ahead on each side is in regions"
    )
    p_first_higher_at: float | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="Share of draw pairs with the first's curve above the second's at at_compute (ties count half); "
        "absent without at_compute or draws",
    )
    verdict: str


class Comparison(Model):
    compute_unit: str
    level: float = Field(description="Share of bootstrap draw pairs that must agree before a fit is called ahead")
    fits: list[FitInComparison]
    pairs: list[PairVerdict]
    highest_fitted_asymptote: str = Field(description="The fit with the highest point estimate of A (no claim)")
    best_asymptote: str | None = Field(
        description="The fit whose A is higher than every other's in at least `level` of the bootstrap draw pairs, "
        "every A identified; null when that does not hold (asymptote_statement says why)"
    )
    p_best_asymptote: float | None = Field(
        description="Least share of draw pairs in which the highest fitted A is above another's"
    )
    asymptote_statement: str
    most_efficient: str | None = Field(
        description="The scalerl fit whose C_mid is lower than every other's in at least `level` of the draw "
        "pairs, every C_mid identified; null otherwise (efficiency_statement says why)"
    )
    p_most_efficient: float | None = Field(
        description="Least share of draw pairs in which the lowest fitted C_mid is below another's"
    )
    efficiency_statement: str
    at_compute: float | None = Field(
        default=None, exclude_if=lambda v: v is None, description="Where value_at and p_first_higher_at are taken"
    )
    verdict: str
