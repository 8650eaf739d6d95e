"""A fitter for any registered law whose parameters declare their search bounds (laws.Parameter.bounds): bounded
least squares (scipy's trust-region reflective method) from several starts in the box, then a case bootstrap
(points resampled with replacement, each resample refitted from the estimate) for percentile intervals and draws.

What it checks of identifiability: an estimate on its search bound, or an interval that reaches one, is reported
as not identified (at_bound), since there the bound, not the data, set the value. It knows nothing of a law's
shape, so a law with a dedicated fitter (fit_sigmoid.py, fit_chinchilla.py) is better served by it; this one is
for a new law that is one module and one registry line.
"""

import math
import time
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import OptimizeResult, least_squares

from servers.core.errors import InputError
from servers.scaling.fitting import FitOutcome, NotIdentified, ParameterEstimate

if TYPE_CHECKING:
    from servers.scaling.laws import Law
    from servers.scaling.limits import FitTask

Array = NDArray[np.float64]
STARTS = 24  # starts besides the box's centre, drawn in the box (log-uniform where a bound spans > 100x)
BOUND_TOL = 1e-6  # an estimate within this share of its box's width from a bound is "on its bound"


def _box(law: "Law") -> tuple[Array, Array, NDArray[np.bool_]]:
    missing = [p.name for p in law.parameters if p.bounds is None]
    if missing:
        raise InputError(
            f"the {law.name} law's generic fitter needs search bounds for every parameter; none for "
            f"{', '.join(missing)} (declare Parameter(..., bounds=(low, high)))"
        )
    low = np.array([p.bounds[0] for p in law.parameters if p.bounds], dtype=float)
    high = np.array([p.bounds[1] for p in law.parameters if p.bounds], dtype=float)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low < high)):
        raise InputError(f"the {law.name} law's search bounds must be finite with low < high")
    logs = (low > 0) & (high / np.where(low > 0, low, 1.0) > 100)
    return low, high, logs


def _starts(low: Array, high: Array, logs: NDArray[np.bool_], rng: np.random.Generator) -> Array:
    u = rng.uniform(size=(STARTS, len(low)))
    lin = low + u * (high - low)
    geo = np.exp(
        np.log(np.where(logs, low, 1.0)) + u * (np.log(np.where(logs, high, 1.0)) - np.log(np.where(logs, low, 1.0)))
    )
    centre = np.where(logs, np.sqrt(np.where(logs, low * high, 1.0)), (low + high) / 2)
    return np.vstack([centre, np.where(logs, geo, lin)])


class _Problem:
    def __init__(self, law: "Law", inputs: list[Array], y: Array) -> None:
        self.law, self.inputs, self.y = law, inputs, y
        self.names = law.parameter_names

    def residuals(self, theta: Array, rows: NDArray[np.intp] | None = None) -> Array:
        inputs = self.inputs if rows is None else [x[rows] for x in self.inputs]
        y = self.y if rows is None else self.y[rows]
        with np.errstate(all="ignore"):
            r = np.asarray(self.law.evaluate(*inputs, **dict(zip(self.names, theta, strict=True))), dtype=float) - y
        return np.where(np.isfinite(r), r, 1e150)

    def solve(self, start: Array, low: Array, high: Array, rows: NDArray[np.intp] | None = None) -> OptimizeResult:
        return least_squares(self.residuals, np.clip(start, low, high), bounds=(low, high), args=(rows,), method="trf")


def _data(task: "FitTask") -> tuple[list[Array], Array]:
    if task.law.on_compute:
        return [np.asarray(task.compute, dtype=float)], np.asarray(task.value, dtype=float)
    return [np.asarray(task.params, dtype=float), np.asarray(task.tokens, dtype=float)], np.asarray(task.loss, float)


def _bootstrap(
    problem: _Problem, best: Array, low: Array, high: Array, task: "FitTask", rng: np.random.Generator
) -> tuple[list[Array], dict[str, int]]:
    n, draws, failed = len(problem.y), [], {}
    for _ in range(task.bootstrap):
        rows = rng.integers(0, n, size=n)
        if len(np.unique(rows)) < len(best):
            failed["fewer distinct points than parameters"] = failed.get("fewer distinct points than parameters", 0) + 1
            continue
        refit = problem.solve(best, low, high, rows)
        if not (refit.success and np.all(np.isfinite(refit.x))):
            failed["refit did not converge"] = failed.get("refit did not converge", 0) + 1
            continue
        draws.append(refit.x)
    return draws, failed


def fit_least_squares(task: "FitTask") -> FitOutcome:
    """Fit task.law to the task's points; see the module docstring."""
    began = time.perf_counter()
    law = task.law
    low, high, logs = _box(law)
    inputs, y = _data(task)
    problem = _Problem(law, inputs, y)
    rng = np.random.default_rng(task.seed)
    fits = [problem.solve(s, low, high) for s in _starts(low, high, logs, rng)]
    best = min(fits, key=lambda f: f.cost if np.isfinite(f.cost) else math.inf)
    draws, failed = _bootstrap(problem, best.x, low, high, task, rng)
    tail = (1 - task.level) / 2 * 100
    ends = np.percentile(np.array(draws), [tail, 100 - tail], axis=0) if draws else None
    parameters, not_identified = {}, []
    width = high - low
    for i, name in enumerate(problem.names):
        lo, hi = (float(ends[0][i]), float(ends[1][i])) if ends is not None else (None, None)
        value = float(best.x[i])
        parameters[name] = ParameterEstimate(value=value, ci_low=lo, ci_high=hi)
        ends_at = [v for v in (value, lo, hi) if v is not None]
        side = next((b for b in (low[i], high[i]) for v in ends_at if abs(v - b) <= BOUND_TOL * width[i]), None)
        if side is not None:
            not_identified.append(
                NotIdentified(
                    parameter=name,
                    reason="at_bound",
                    detail=f"{name}'s estimate or interval reaches its search bound {side:g}: the bound set it",
                )
            )
    residuals = problem.residuals(best.x)
    return FitOutcome(
        model=law.name,
        method="least_squares",
        parameters=parameters,
        rmse=float(np.sqrt(np.mean(residuals**2))),
        objective=float(best.cost),
        converged=bool(best.success),
        message=str(best.message),
        not_identified=not_identified,
        level=task.level,
        bootstrap=len(draws),
        bootstrap_run=task.bootstrap,
        bootstrap_failed=failed,
        bootstrap_draws=[dict(zip(problem.names, map(float, d), strict=True)) for d in draws],
        points_used=len(y),
        duration_s=time.perf_counter() - began,
    )
