"""Using stored fits: predictions with bootstrap intervals, the compute needed to reach a target, and the
comparison of recipes (which asymptote is higher, which is more efficient, where the curves cross)."""

import itertools
import math
from typing import Any

import numpy as np

from servers.core.errors import InputError
from servers.scaling import laws
from servers.scaling.fitstore import StoredFit
from servers.scaling.fitting import Comparison, ComputeForTarget, FitInComparison, PairVerdict, PredictedValue


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


def _intervals(center: np.ndarray, draws: np.ndarray | None, rmse: float, level: float) -> list[tuple]:
    tail = (1 - level) / 2 * 100
    if draws is None:
        return [(None, None, None, None)] * len(center)
    low, high = np.nanpercentile(draws, [tail, 100 - tail], axis=0)
    z = _normal_quantile(1 - (1 - level) / 2)
    return [
        (float(lo), float(hi), float(lo - z * rmse), float(hi + z * rmse)) for lo, hi in zip(low, high, strict=True)
    ]


def _normal_quantile(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def predict_curve(fit: StoredFit, compute: list[float], level: float) -> list[PredictedValue]:
    x = np.asarray(compute, dtype=float)
    center = curve(fit.model, point_params(fit), x)
    draws = _draw_matrix(fit, lambda d: curve(fit.model, d, x))
    used_max = max(p.compute for i, p in enumerate(fit.points) if p.compute is not None and not _is_excluded(fit, i))
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
    center = laws.chinchilla(n, d, **point_params(fit))
    draws = _draw_matrix(fit, lambda p: laws.chinchilla(n, d, **p))
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


def _is_excluded(fit: StoredFit, index: int) -> bool:
    return any(e.index == index for e in fit.excluded)


def compute_to_reach(model: str, params: dict[str, float], target: float) -> float | None:
    """Compute at which the curve reaches `target`; None when it never does. 0 when it starts there."""
    if model == "scalerl":
        a, b, c_mid, r0 = params["A"], params["B"], params["C_mid"], params["R0"]
        rising = a > r0
        if (target <= r0) if rising else (target >= r0):
            return 0.0
        if (target >= a) if rising else (target <= a):
            return None
        return c_mid * ((target - r0) / (a - target)) ** (1.0 / b)
    if model == "power_law":
        a, b, d = params["A"], params["B"], params["D"]
        if target >= a:
            return None
        return (d / (a - target)) ** (1.0 / b)
    if model == "chinchilla":
        if target <= params["E"]:
            return None
        low, high = 1.0, 1e40  # FLOPs; loss along the compute-optimal path falls monotonically in C
        if laws.compute_optimal(high, params).loss > target:
            return None
        for _ in range(200):
            mid = math.sqrt(low * high)
            if laws.compute_optimal(mid, params).loss > target:
                low = mid
            else:
                high = mid
        return high
    raise InputError(f"unknown model {model!r}")


def compute_for_target(fit: StoredFit, target: float, level: float, unit: str) -> ComputeForTarget:
    params = point_params(fit)
    needed = compute_to_reach(fit.model, params, target)
    draws = [compute_to_reach(fit.model, d, target) for d in fit.outcome.bootstrap_draws]
    reached = [c for c in draws if c is not None]
    share = len(reached) / len(draws) if draws else None
    lo = hi = None
    if reached and share is not None and share >= level:
        tail = (1 - level) / 2 * 100
        lo, hi = (float(v) for v in np.percentile(reached, [tail, 100 - tail]))
    asymptote = params["E"] if fit.model == "chinchilla" else params["A"]
    if needed is None:
        statement = (
            f"the fitted asymptote {asymptote:.4g} does not reach the target {target:g}: more compute on "
            "this recipe will not get there"
        )
    elif needed == 0:
        statement = f"the curve already starts at or beyond {target:g}"
    else:
        statement = f"about {needed:.4g} {unit} to reach {target:g}"
        if lo is not None:
            statement += f" ({level:.0%} interval {lo:.3g}..{hi:.3g})"
    if share is not None and share < 1:
        statement += f"; {share:.0%} of bootstrap draws reach it at all"
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

    diff = gap(grid)
    tie = max(first.outcome.rmse, second.outcome.rmse)
    ahead = np.where(np.abs(diff) > tie, np.sign(diff), 0.0)
    clear = np.nonzero(ahead)[0]
    found = []
    for before, after in itertools.pairwise(clear):
        if ahead[before] != ahead[after]:
            found.append(float(brentq(lambda c: float(gap(c)), grid[before], grid[after])))
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
