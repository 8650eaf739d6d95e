"""Using stored fits: predictions with bootstrap intervals, the compute needed to reach a target, and the
comparison of recipes (which asymptote is higher, which is more efficient, where the curves cross)."""

import itertools
import math
import warnings
from typing import Any

import numpy as np

from servers.core.errors import InputError
from servers.scaling import laws
from servers.scaling.fitstore import StoredFit
from servers.scaling.fitting import Comparison, ComputeForTarget, FitInComparison, PairVerdict, PredictedValue

MAX_CROSSINGS = 100  # crossings listed per pair (near-identical noisy curves could cross at many grid steps)
MAX_COMPUTE = 1e40  # the largest compute the tools accept anywhere; targets beyond it count as out of reach


def point_params(fit: StoredFit) -> dict[str, float]:
    return {name: p.value for name, p in fit.outcome.parameters.items()}


def curve(model: str, params: dict[str, float], compute: np.ndarray) -> np.ndarray:
    """The fitted curve at `compute` (numpy arrays broadcast through the scalar forms of laws.py)."""
    if model == "scalerl":
        return laws.scalerl(compute, **params)
    if model == "power_law":
        return laws.power_law(compute, **params)
    raise InputError(f"a {model} fit has no curve in compute; use params and tokens")


def _draw_matrix(fit: StoredFit, evaluate: Any) -> np.ndarray | None:
    draws = fit.outcome.bootstrap_draws
    if not draws:
        return None
    return np.array([evaluate(d) for d in draws])


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _intervals(center: np.ndarray, draws: np.ndarray | None, rmse: float, level: float) -> list[tuple]:
    """(ci_low, ci_high, pi_low, pi_high) per point; an end that is not a finite number (a draw's curve overflowed
    there) is None rather than infinity."""
    tail = (1 - level) / 2 * 100
    if draws is None:
        return [(None, None, None, None)] * len(center)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        draws = np.where(np.isfinite(draws), draws, np.nan)
        low, high = np.nanpercentile(draws, [tail, 100 - tail], axis=0)
    z = _normal_quantile(1 - (1 - level) / 2)
    return [
        (_finite(float(lo)), _finite(float(hi)), _finite(float(lo - z * rmse)), _finite(float(hi + z * rmse)))
        for lo, hi in zip(low, high, strict=True)
    ]


def _check_center(center: np.ndarray, where: list[str], model: str) -> None:
    bad = np.nonzero(~np.isfinite(center))[0]
    if bad.size:
        raise InputError(
            f"{where[int(bad[0])]}: the {model} fit's prediction there is not a finite number (overflow); predict at "
            "values within a few decades of the fitted data"
        )


def _normal_quantile(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def predict_curve(fit: StoredFit, compute: list[float], level: float) -> list[PredictedValue]:
    x = np.asarray(compute, dtype=float)
    with np.errstate(all="ignore"):
        center = curve(fit.model, point_params(fit), x)
        draws = _draw_matrix(fit, lambda d: curve(fit.model, d, x))
    _check_center(center, [f"compute[{i}] = {c:g}" for i, c in enumerate(compute)], fit.model)
    used_max = used_compute_max(fit)
    out = []
    for c, v, (lo, hi, plo, phi) in zip(x, center, _intervals(center, draws, fit.outcome.rmse, level), strict=True):
        out.append(
            PredictedValue(
                compute=float(c),
                value=float(v),
                ci_low=lo,
                ci_high=hi,
                pi_low=plo,
                pi_high=phi,
                extrapolated=bool(c > used_max),
            )
        )
    return out


def predict_loss(fit: StoredFit, at: list[tuple[float, float]], level: float) -> list[PredictedValue]:
    n = np.array([a[0] for a in at], dtype=float)
    d = np.array([a[1] for a in at], dtype=float)
    with np.errstate(all="ignore"):
        center = laws.chinchilla(n, d, **point_params(fit))
        draws = _draw_matrix(fit, lambda p: laws.chinchilla(n, d, **p))
    _check_center(center, [f"at[{i}] (params {a[0]:g}, tokens {a[1]:g})" for i, a in enumerate(at)], fit.model)
    n_max = max(p.params or 0 for p in fit.points)
    d_max = max(p.tokens or 0 for p in fit.points)
    return [
        PredictedValue(
            params=float(ni),
            tokens=float(di),
            value=float(v),
            ci_low=lo,
            ci_high=hi,
            pi_low=plo,
            pi_high=phi,
            extrapolated=bool(ni > n_max or di > d_max),
        )
        for ni, di, v, (lo, hi, plo, phi) in zip(
            n, d, center, _intervals(center, draws, fit.outcome.rmse, level), strict=True
        )
    ]


def excluded_indices(fit: StoredFit) -> set[int]:
    return {e.index for e in fit.excluded}


def used_compute_max(fit: StoredFit) -> float:
    """The largest compute among the points the fit did not exclude (beyond it, predictions extrapolate)."""
    excluded = excluded_indices(fit)
    return max(p.compute for i, p in enumerate(fit.points) if p.compute is not None and i not in excluded)


def _power(base: float, exponent: float) -> float:
    """base ** exponent for base >= 0, infinity where it overflows."""
    try:
        return base**exponent
    except OverflowError:
        return math.inf


def compute_to_reach(model: str, params: dict[str, float], target: float) -> float | None:
    """Compute at which the curve reaches `target`; None when it never does, 0 when it starts there, infinity
    when it gets there only beyond any representable compute."""
    if model == "scalerl":
        a, b, c_mid, r0 = params["A"], params["B"], params["C_mid"], params["R0"]
        rising = a > r0
        if (target <= r0) if rising else (target >= r0):
            return 0.0
        if (target >= a) if rising else (target <= a):
            return None
        return c_mid * _power((target - r0) / (a - target), 1.0 / b)
    if model == "power_law":
        a, b, d = params["A"], params["B"], params["D"]
        if target >= a:
            return None
        return _power(d / (a - target), 1.0 / b)
    if model == "chinchilla":
        if target <= params["E"] or not has_optimal_path(params):
            return None
        low, high = 1.0, MAX_COMPUTE  # FLOPs; loss along the compute-optimal path falls monotonically in C
        if laws.optimal_loss(high, params) > target:
            return math.inf
        for _ in range(200):
            mid = math.sqrt(low * high)
            if laws.optimal_loss(mid, params) > target:
                low = mid
            else:
                high = mid
            if high <= low * (1 + 1e-12):
                break
        return high
    raise InputError(f"unknown model {model!r}")


def has_optimal_path(params: dict[str, float]) -> bool:
    """Whether a chinchilla law has a compute-optimal path: A, B, alpha and beta all > 0."""
    return min(params["A"], params["B"], params["alpha"], params["beta"]) > 0


def compute_for_target(fit: StoredFit, target: float, level: float, unit: str) -> ComputeForTarget:
    params = point_params(fit)
    needed = compute_to_reach(fit.model, params, target)
    draws = [compute_to_reach(fit.model, d, target) for d in fit.outcome.bootstrap_draws]
    reached = [c for c in draws if c is not None and c <= MAX_COMPUTE]
    share = len(reached) / len(draws) if draws else None
    lo = hi = None
    if reached and share is not None and share >= level:
        tail = (1 - level) / 2 * 100
        lo, hi = (float(v) for v in np.percentile(reached, [tail, 100 - tail]))
    asymptote = params["E"] if fit.model == "chinchilla" else params["A"]
    if fit.model == "chinchilla" and not has_optimal_path(params):
        statement = (
            "this fit has an exponent or coefficient at 0 (alpha, beta, A or B on its bound), so the compute-optimal "
            "path is not defined; refit with runs that span more of N and D"
        )
    elif needed is None:
        statement = (
            f"the fitted asymptote {asymptote:.4g} does not reach the target {target:g}: more compute on "
            "this recipe will not get there"
        )
    elif not needed <= MAX_COMPUTE:
        statement = f"the curve gets to {target:g} only beyond {MAX_COMPUTE:g} {unit}: out of reach in practice"
        needed = None
    elif needed == 0:
        statement = f"the curve already starts at or beyond {target:g}"
    else:
        statement = f"about {needed:.4g} {unit} to reach {target:g}"
        if lo is not None:
            statement += f" ({level:.0%} interval {lo:.3g}..{hi:.3g})"
    if share is not None and share < 1:
        statement += f"; {share:.0%} of bootstrap draws reach it within {MAX_COMPUTE:g} {unit}"
    return ComputeForTarget(
        target=target,
        reachable=needed is not None,
        compute=needed,
        ci_low=lo,
        ci_high=hi,
        draws_reaching=share,
        statement=statement,
    )


# ---- comparing recipes --------------------------------------------------------------------------------------


def _name(fit: StoredFit) -> str:
    return fit.label or fit.id


def crossings(first: StoredFit, second: StoredFit) -> list[float]:
    """Compute values where one curve overtakes the other, from the data's smallest compute to 100x its largest.

    Stretches where the curves lie within the data's scatter of each other (e.g. both still near R0) are ties,
    not crossings: only a change of which curve is ahead by more than that scatter counts.
    """
    from scipy.optimize import brentq

    used = [p.compute for f in (first, second) for p in f.points if p.compute]
    grid = np.geomspace(min(used), max(used) * 100, 4000)
    p1, p2 = point_params(first), point_params(second)

    def gap(c: float | np.ndarray) -> np.ndarray:
        return curve(first.model, p1, np.asarray(c)) - curve(second.model, p2, np.asarray(c))

    with np.errstate(all="ignore"):
        diff = gap(grid)
    tie = max(first.outcome.rmse, second.outcome.rmse)
    ahead = np.where(np.isfinite(diff) & (np.abs(diff) > tie), np.sign(diff), 0.0)
    clear = np.nonzero(ahead)[0]
    found = []
    for before, after in itertools.pairwise(clear):
        if ahead[before] != ahead[after] and len(found) < MAX_CROSSINGS:
            try:
                with np.errstate(all="ignore"):
                    root = float(brentq(lambda c: float(gap(c)), grid[before], grid[after]))
            except (ValueError, RuntimeError):  # not finite in between: the grid point stands for the crossing
                root = float(grid[after])
            found.append(root)
    return found


def _share(first: list[float], second: list[float], better: Any) -> float | None:
    if not first or not second:
        return None
    n = min(len(first), len(second))  # independent bootstraps: pair draws by index
    return float(np.mean([better(first[i], second[i]) for i in range(n)]))


def compare(fits: list[StoredFit]) -> Comparison:
    models = {f.model for f in fits}
    if not models <= {"scalerl", "power_law"}:
        raise InputError(
            "compare_scaling_fits compares RL compute curves (scalerl, power_law fits); for chinchilla "
            "fits compare compute_optimal_allocation at the same budget"
        )
    units = {f.compute_unit for f in fits}
    if len(units) > 1:
        raise InputError(f"the fits use different compute units {sorted(units)}; refit them in one unit")
    if len({f.id for f in fits}) < len(fits):
        raise InputError("the same fit is named twice; give distinct fit ids")
    unit = units.pop()
    rows = []
    for f in fits:
        p = f.outcome.parameters
        a = p["A"]
        ci = (a.ci_low, a.ci_high) if a.ci_low is not None and a.ci_high is not None else None
        rows.append(
            FitInComparison(
                fit_id=f.id,
                label=f.label,
                model=f.model,
                asymptote=a.value,
                asymptote_ci=ci,
                c_mid=p["C_mid"].value if "C_mid" in p else None,
                b=p["B"].value,
            )
        )
    pairs = []
    for i in range(len(fits)):
        for j in range(i + 1, len(fits)):
            x, y = fits[i], fits[j]
            draws_x, draws_y = x.outcome.bootstrap_draws, y.outcome.bootstrap_draws
            p_a = _share([d["A"] for d in draws_x], [d["A"] for d in draws_y], lambda u, v: u > v)
            p_e = None
            if x.model == y.model == "scalerl":
                p_e = _share([d["C_mid"] for d in draws_x], [d["C_mid"] for d in draws_y], lambda u, v: u < v)
            cross = crossings(x, y)
            pairs.append(
                PairVerdict(
                    first=x.id,
                    second=y.id,
                    p_first_higher_asymptote=p_a,
                    p_first_more_efficient=p_e,
                    crossings=cross,
                    verdict=_pair_verdict(x, y, p_a, cross, unit),
                )
            )
    best = max(rows, key=lambda r: r.asymptote)
    with_mid = [r for r in rows if r.c_mid is not None]
    efficient = min(with_mid, key=lambda r: r.c_mid or math.inf) if with_mid else None
    label = {f.id: _name(f) for f in fits}
    verdict = f"{label[best.fit_id]} has the highest asymptote (A={best.asymptote:.3f})"
    if efficient is not None and efficient.fit_id != best.fit_id:
        verdict += f"; {label[efficient.fit_id]} is the most efficient (half its gain at {efficient.c_mid:.3g} {unit})"
    verdict += ". " + " ".join(p.verdict for p in pairs)
    return Comparison(
        compute_unit=unit,
        fits=rows,
        pairs=pairs,
        best_asymptote=best.fit_id,
        most_efficient=efficient.fit_id if efficient else None,
        verdict=verdict,
    )


def _pair_verdict(x: StoredFit, y: StoredFit, p_a: float | None, cross: list[float], unit: str) -> str:
    ax, ay = x.outcome.parameters["A"].value, y.outcome.parameters["A"].value
    hi, lo = (x, y) if ax >= ay else (y, x)
    p_hi = None if p_a is None else (p_a if hi is x else 1 - p_a)
    sure = "" if p_hi is None else f" (in {p_hi:.0%} of bootstrap draws)"
    text = f"{_name(hi)} has the higher asymptote than {_name(lo)}{sure}"
    if abs(ax - ay) < 0.02:
        text += "; the difference is within ScaleRL's seed-to-seed spread of about 0.02 on A, so treat it as a tie"
    if cross:
        beyond = cross[-1]
        text += f"; {_name(hi)} wins beyond ~{beyond:.3g} {unit}, {_name(lo)} is ahead below it"
    else:
        text += f"; the curves do not cross in the range considered, so {_name(hi)} leads throughout"
    return text + "."
