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
from servers.scaling.fitting import (
    Comparison,
    ComputeForTarget,
    FitInComparison,
    LeadRegion,
    NotIdentified,
    PairVerdict,
    PredictedValue,
)

MAX_CROSSINGS = 100  # crossings listed per pair (near-identical noisy curves could cross at many grid steps)
MAX_COMPUTE = laws.MAX_COMPUTE
UNIDENTIFIED_A = 0.5  # as fit_sigmoid.UNIDENTIFIED_A: A's interval over more than this share of its range
SEED_SPREAD_A = 0.02  # ScaleRL's seed-to-seed spread on A (Khatri et al. 2025)


def point_params(fit: StoredFit) -> dict[str, float]:
    return {name: p.value for name, p in fit.outcome.parameters.items()}


def curve(model: str, params: dict[str, float], compute: np.ndarray) -> np.ndarray:
    """The fitted curve at `compute` (numpy arrays broadcast through the law's own form, laws.py)."""
    law = laws.get(model)
    if not law.on_compute:
        raise InputError(f"a {model} fit has no curve in compute; use params and tokens")
    return law.evaluate(compute, **params)


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
    # The prediction interval adds a new observation's noise (z x rmse) to the curve's uncertainty (the bootstrap
    # interval's half on each side), in quadrature: the two are independent. (Adding them linearly made 80%
    # intervals cover 93% of held-out final values in benchmarks/forecast_quality.py; in quadrature, 81%.)
    z = _normal_quantile(1 - (1 - level) / 2)
    noise = z * rmse
    bands = []
    for mid, lo, hi in zip(center, low, high, strict=True):
        below = math.hypot(max(float(mid - lo), 0.0), noise) if np.isfinite(lo) else math.inf
        above = math.hypot(max(float(hi - mid), 0.0), noise) if np.isfinite(hi) else math.inf
        bands.append((_finite(float(lo)), _finite(float(hi)), _finite(float(mid) - below), _finite(float(mid) + above)))
    return bands


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
    bands = _intervals(center, draws, fit.outcome.rmse, level)
    envelope = _envelope(fit, level) if draws is not None else None
    y_max = float(fit.options.get("y_max") or 1.0)
    out = []
    for c, v, (lo, hi, plo, phi) in zip(x, center, bands, strict=True):
        if envelope is not None and c > used_max:  # A not identified: beyond the data, all the model allows
            low_end, high_end = envelope
            lo, hi = _widened(lo, low_end, min), _widened(hi, high_end, max)
            plo, phi = _widened(plo, low_end, min), _widened(phi, high_end, max)
        # An observation of a bounded metric lies in [0, y_max] (the data were refused otherwise), so the
        # prediction interval stops there, though never short of the estimate (a power law can overshoot y_max:
        # its curve interval says so, unclipped).
        plo = None if plo is None else max(plo, min(0.0, float(v)))
        phi = None if phi is None else min(phi, max(y_max, float(v)))
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


def _widened(end: float | None, bound: float | None, pick: Any) -> float | None:
    if end is None or bound is None:
        return None if end is None and bound is None else end if bound is None else bound
    return float(pick(end, bound))


def _envelope(fit: StoredFit, level: float) -> tuple[float | None, float | None] | None:
    """For a scalerl fit whose A is not identified, the values its curve can take beyond the data: it is monotone
    between R0 and A, and A lies in [0, y_max], so a rising curve stays between its value at the data's end (the
    interval's lower end there) and y_max; a falling one between 0 and its value at the data's end (the interval's
    upper end). None when A is identified (or for a power law)."""
    law = laws.get(fit.model)
    if not law.bounded_asymptote or unidentified_reason(fit, law.asymptote) is None:
        return None
    p = point_params(fit)
    end = used_compute_max(fit)
    with np.errstate(all="ignore"):
        center = curve(fit.model, p, np.array([end]))
        draws = _draw_matrix(fit, lambda d: curve(fit.model, d, np.array([end])))
    lo, hi, _, _ = _intervals(center, draws, fit.outcome.rmse, level)[0]
    y_max = float(fit.options.get("y_max") or 1.0)
    start = p[law.start] if law.start is not None else float(center[0])
    return (lo, y_max) if p[law.asymptote] >= start else (0.0, hi)


def prediction_warnings(fit: StoredFit, compute: list[float]) -> list[str]:
    """What a prediction from `fit` at `compute` rests on that the fit's data do not determine."""
    beyond = [c for c in compute if c > used_compute_max(fit)]
    if not beyond:
        return []
    out = []
    for u in not_identified(fit):
        text = f"{u.parameter} is not identified by this fit's data ({u.detail})"
        if text not in out:
            out.append(text)
    if not out:
        return []
    head = f"Beyond the fitted data (compute > {used_compute_max(fit):.3g}) the prediction rests on"
    tail = ""
    if _envelope(fit, 0.95) is not None:
        tail = (
            "; there the intervals are widened to what the model allows (between the curve's value at the data's end "
            "and the bound of A), since the data do not say where the curve saturates: do not quote the point value"
        )
    return [f"{head} parameters the data do not determine: " + "; ".join(out) + tail + "."]


def predict_loss(fit: StoredFit, at: list[tuple[float, float]], level: float) -> list[PredictedValue]:
    n = np.array([a[0] for a in at], dtype=float)
    d = np.array([a[1] for a in at], dtype=float)
    law = laws.get(fit.model)
    with np.errstate(all="ignore"):
        center = law.evaluate(n, d, **point_params(fit))
        draws = _draw_matrix(fit, lambda p: law.evaluate(n, d, **p))
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


def compute_to_reach(model: str, params: dict[str, float], target: float) -> float | None:
    """Compute at which the curve reaches `target` (the law's inverse); None when it never does, 0 when it starts
    there, infinity when it gets there only beyond any representable compute."""
    law = laws.get(model)
    if law.inverse is None:
        raise InputError(f"the {model} law does not give the compute at which it reaches a target; omit target")
    return law.inverse(params, target)


def compute_for_target(fit: StoredFit, target: float, level: float, unit: str) -> ComputeForTarget:
    """The compute at which the fit reaches `target`, and whether it gets there at all, as the fitted curve and its
    bootstrap draws say together: reachable (the curve gets there and at least `level` of the draws do),
    unreachable (it does not and at most 1 - level do), uncertain otherwise, with the share stated."""
    return law_for_target(fit.model, point_params(fit), fit.outcome.bootstrap_draws, target, level, unit)


def law_for_target(
    model: str, params: dict[str, float], draws: list[dict[str, float]], target: float, level: float, unit: str
) -> ComputeForTarget:
    """compute_for_target for a law given by its point estimates and bootstrap draws (none for parameters given:
    then the verdict rests on the point estimate alone, and says so)."""
    law = laws.get(model)
    asymptote = params[law.asymptote]
    if law.undefined is not None and law.undefined(params) is not None:
        return ComputeForTarget(
            target=target,
            verdict="undefined",
            reachable=None,
            compute=None,
            statement="this fit has an exponent or coefficient at 0 (alpha, beta, A or B on its bound), so the "
            "compute-optimal path is not defined; refit with runs that span more of N and D",
        )
    needed = compute_to_reach(model, params, target)
    point_reaches = needed is not None and needed <= MAX_COMPUTE
    beyond = needed is not None and not point_reaches  # only beyond any compute the tools accept
    reached = [compute_to_reach(model, d, target) for d in draws]
    spent = np.array([c if c is not None and c <= MAX_COMPUTE else math.inf for c in reached])
    share = float(np.mean(np.isfinite(spent))) if reached else None
    lo = hi = None
    if share is not None and share > 0:
        tail = (1 - level) / 2 * 100
        with np.errstate(invalid="ignore"):  # between two infinite draws the percentile is NaN: no end there
            low, high = np.percentile(spent, [tail, 100 - tail])  # a draw that never gets there counts as infinite
        lo, hi = _finite(float(low)), _finite(float(high))
    if share is None:
        verdict = "reachable" if point_reaches else "unreachable"
    elif point_reaches and share >= level:
        verdict = "reachable"
    elif not point_reaches and share <= 1 - level:
        verdict = "unreachable"
    else:
        verdict = "uncertain"

    within = f"within {MAX_COMPUTE:g} {unit}"
    if point_reaches and needed == 0:
        fitted = f"the fitted curve already starts at or beyond {target:g}"
    elif point_reaches:
        fitted = f"the fitted curve reaches {target:g} at about {needed:.4g} {unit}"
    elif beyond:
        fitted = f"the fitted curve gets to {target:g} only beyond {MAX_COMPUTE:g} {unit} (out of reach in practice)"
    else:
        fitted = f"the fitted asymptote {asymptote:.4g} does not reach the target {target:g}"
    band = ""
    if lo is not None:
        band = f"{level:.0%} interval over all draws " + (
            f"{lo:.3g} to {hi:.3g} {unit}" if hi is not None else f"from {lo:.3g} {unit}, with no upper end"
        )
    if share is None:
        statement = f"{fitted} (from the point estimate only: no bootstrap draws to say how sure)"
    elif verdict == "reachable":
        statement = f"reachable: {fitted}; {share:.0%} of bootstrap draws reach it {within}"
        statement += f" ({band})" if band else ""
    elif verdict == "unreachable":
        statement = (
            f"unreachable: {fitted}, and only {share:.0%} of bootstrap draws reach it {within}: more compute on this "
            "recipe will not get there"
        )
    else:
        statement = (
            f"uncertain: {fitted}, but {share:.0%} of bootstrap draws reach it {within} and {1 - share:.0%} never "
            f"do; at the {level:.0%} level neither 'it gets there' nor 'it does not' holds"
            + (f" ({band})" if band else "")
            + "; extend the run to higher compute before relying on either"
        )
    return ComputeForTarget(
        target=target,
        verdict=verdict,
        reachable=True if verdict == "reachable" else False if verdict == "unreachable" else None,
        compute=needed if point_reaches else None,
        ci_low=lo,
        ci_high=hi,
        draws_reaching=share,
        statement=statement,
    )


def target_given_identifiability(fit: StoredFit, reach: ComputeForTarget) -> ComputeForTarget:
    """A compute-for-target verdict from a fit whose A is not identified: beyond the data the draws do not say
    where the curve saturates, so neither 'reachable' there nor 'unreachable' holds; within the data it stands."""
    law = laws.get(fit.model)
    why = unidentified_reason(fit, law.asymptote) if law.bounded_asymptote else None
    if why is None or reach.verdict == "undefined":
        return reach
    if reach.verdict == "uncertain":
        return reach.model_copy(
            update={"statement": f"{reach.statement}; this fit's A is not identified by its data ({why})"}
        )
    if reach.verdict == "reachable" and reach.compute is not None and reach.compute <= used_compute_max(fit):
        return reach
    return reach.model_copy(
        update={
            "verdict": "uncertain",
            "reachable": None,
            "statement": f"uncertain: this fit's A is not identified by its data ({why}), so whether the curve gets "
            f"to {reach.target:g} beyond the data is not known; from the fit and its draws alone: {reach.statement}",
        }
    )


# ---- comparing recipes --------------------------------------------------------------------------------------

GRID_POINTS = 600  # compute values per pair at which who leads is decided
CHECK_FACTOR = 8  # the consistency check evaluates the fitted curves this many times more finely


def _name(fit: StoredFit) -> str:
    return fit.label or fit.id


def _used_computes(fit: StoredFit) -> list[float]:
    excluded = excluded_indices(fit)
    return [p.compute for i, p in enumerate(fit.points) if p.compute is not None and i not in excluded]


def compute_range(first: StoredFit, second: StoredFit) -> tuple[float, float, float]:
    """(start, end, data end) of the compute a comparison considers: from the smallest fitted compute of either
    fit to 100 times the largest; beyond `data end` (the smaller of the two fits' largest compute) at least one
    curve is extrapolated."""
    used = [_used_computes(f) for f in (first, second)]
    start = min(min(u) for u in used)
    end = max(max(u) for u in used) * 100
    return start, end, min(max(u) for u in used)


def _gap(first: StoredFit, second: StoredFit, c: np.ndarray) -> np.ndarray:
    """first's fitted curve minus second's at compute c (as predict_scaling evaluates them)."""
    with np.errstate(all="ignore"):
        return curve(first.model, point_params(first), c) - curve(second.model, point_params(second), c)


def _root(first: StoredFit, second: StoredFit, low: float, high: float) -> float:
    from scipy.optimize import brentq

    try:
        with np.errstate(all="ignore"):
            return float(brentq(lambda c: float(_gap(first, second, np.asarray(c))), low, high))
    except (ValueError, RuntimeError):  # not finite in between: the grid point stands for the crossing
        return high


def crossings(first: StoredFit, second: StoredFit) -> list[float]:
    """Compute values where the fitted curves (point estimates) cross, over compute_range: every change of which
    one is above, as predict_scaling shows it; how sure either lead is, is the regions' business."""
    start, end, data_end = compute_range(first, second)
    grid = _grid(start, end, data_end)
    diff = _gap(first, second, grid)
    sign = np.where(np.isfinite(diff), np.sign(diff), 0.0)
    nonzero = np.nonzero(sign)[0]
    found = []
    for before, after in itertools.pairwise(nonzero):
        if sign[before] != sign[after] and len(found) < MAX_CROSSINGS:
            found.append(_root(first, second, float(grid[before]), float(grid[after])))
    return found


def _grid(start: float, end: float, data_end: float, points: int = GRID_POINTS) -> np.ndarray:
    return np.unique(np.concatenate([np.geomspace(start, end, points), [data_end]]))


def _draw_gaps(first: StoredFit, second: StoredFit, c: np.ndarray) -> np.ndarray | None:
    """(pairs, len(c)) first's draw minus second's draw (independent bootstraps, paired by index); NaN where a
    draw's curve is not finite. None without draws."""
    dx, dy = first.outcome.bootstrap_draws, second.outcome.bootstrap_draws
    n = min(len(dx), len(dy))
    if n == 0:
        return None
    with np.errstate(all="ignore"):
        gx = np.array([curve(first.model, d, c) for d in dx[:n]])
        gy = np.array([curve(second.model, d, c) for d in dy[:n]])
        gaps = gx - gy
    return np.where(np.isfinite(gaps), gaps, np.nan)


def share_above_at(first: StoredFit, second: StoredFit, at: float) -> float | None:
    """The share of bootstrap draw pairs (paired as lead_regions pairs them: _draw_gaps, on a one-point grid) in
    which first's curve is above second's at compute `at`, ties counting half (so the two orders add up to 1);
    pairs not finite there are not counted. None without draws, or when no pair is finite there."""
    gaps = _draw_gaps(first, second, np.array([at], dtype=float))
    if gaps is None:
        return None
    column = gaps[:, 0]
    finite = column[np.isfinite(column)]
    if finite.size == 0:
        return None
    return float((np.sum(finite > 0) + 0.5 * np.sum(finite == 0)) / finite.size)


def value_at(fit: StoredFit, at: float) -> float:
    """The fitted curve (point estimate) at compute `at`, as predict_scaling evaluates it."""
    with np.errstate(all="ignore"):
        return float(curve(fit.model, point_params(fit), np.array([at], dtype=float))[0])


def _at_statement(
    x: StoredFit, y: StoredFit, at: float, p: float | None, data_end: float, unit: str, level: float
) -> str:
    """What the pair says at one compute: both fitted values, and how many draw pairs agree which is higher."""
    vx, vy = value_at(x, at), value_at(y, at)
    where = f"At {at:.3g} {unit}" + (" (extrapolated)" if at > data_end else "")
    text = f" {where}: {_name(x)} {vx:.4g}, {_name(y)} {vy:.4g}"
    if p is None:
        return text + " (point estimates only: no bootstrap draws)."
    hi, p_hi = (x, p) if vx >= vy else (y, 1 - p)
    if p_hi >= level:
        return text + f"; {_name(hi)} higher in {p_hi:.0%} of draw pairs (at least {level:.0%})."
    return text + f"; {_name(hi)} higher in only {p_hi:.0%} of draw pairs, below {level:.0%}: no call."


def lead_regions(first: StoredFit, second: StoredFit, level: float) -> list[LeadRegion]:
    """Who leads where over compute_range. At each compute of a fine grid, a fit is ahead when its fitted curve is
    above the other's and at least `level` of the bootstrap draw pairs agree (without draws: when the curves
    differ by more than the larger RMSE); elsewhere the two are indistinguishable. Consecutive grid points with the
    same call (and on the same side of the data's end) form a region. Then the check that keeps the verdict
    consistent with predict_scaling: each region with a leader is evaluated on a grid CHECK_FACTOR times finer,
    ends included, and if the leader's fitted curve is not above the other's everywhere there, the region is
    called indistinguishable instead."""
    start, end, data_end = compute_range(first, second)
    grid = _grid(start, end, data_end)
    diff = _gap(first, second, grid)
    gaps = _draw_gaps(first, second, grid)
    label = np.zeros(grid.size, dtype=int)  # +1 first ahead, -1 second ahead, 0 indistinguishable
    p_first: np.ndarray | None = None
    finite = np.isfinite(diff)
    if gaps is not None:
        counted = np.sum(np.isfinite(gaps), axis=0)
        with np.errstate(all="ignore"):
            p_first = np.where(counted > 0, np.nansum(gaps > 0, axis=0) / np.maximum(counted, 1), np.nan)
            p_second = np.where(counted > 0, np.nansum(gaps < 0, axis=0) / np.maximum(counted, 1), np.nan)
        label[finite & (diff > 0) & (p_first >= level)] = 1
        label[finite & (diff < 0) & (p_second >= level)] = -1
    else:
        tie = max(first.outcome.rmse, second.outcome.rmse)
        label[finite & (diff > tie)] = 1
        label[finite & (diff < -tie)] = -1
    beyond = grid > data_end
    runs: list[tuple[int, int]] = []  # consecutive grid points with the same call and the same side of the data end
    for k in range(grid.size):
        if runs and label[k] == label[runs[-1][0]] and beyond[k] == beyond[runs[-1][0]]:
            runs[-1] = (runs[-1][0], k)
        else:
            runs.append((k, k))
    # Each run owns its grid points; the stretch between two runs goes to a neighbouring tie when one fits, to the
    # next run when both sides have the same leader (the data's end between them), else it is a tie of its own.
    spans: list[tuple[float, float, int, bool]] = []
    for n, (i, j) in enumerate(runs):
        low = float(grid[i])
        if n > 0:
            pj = runs[n - 1][1]
            prev_side, side = int(label[pj]), int(label[i])
            if side == 0 or prev_side == side:
                low = float(grid[pj])
            elif not (prev_side == 0 and beyond[pj] == beyond[i]):
                spans.append((float(grid[pj]), float(grid[i]), 0, bool(beyond[i])))
            else:
                spans[-1] = (*spans[-1][:1], float(grid[i]), *spans[-1][2:])
        spans.append((low, float(grid[j]), int(label[i]), bool(beyond[i])))
    checked = _merged(_checked(first, second, _merged(spans), grid))
    return [_region(first, second, lo, hi, side, ext, p_first, grid, diff) for lo, hi, side, ext in checked]


Span = tuple[float, float, int, bool]  # low, high, side (+1 first ahead, -1 second, 0 neither), extrapolated


def _merged(spans: list[Span]) -> list[Span]:
    """Adjacent spans with the same call and the same side of the data's end, joined; empty ones dropped."""
    out: list[Span] = []
    for low, high, side, ext in spans:
        if high < low or (high == low and out):
            continue
        if out and out[-1][2] == side and out[-1][3] == ext:
            out[-1] = (out[-1][0], high, side, ext)
        else:
            out.append((low, high, side, ext))
    return out


def _checked(first: StoredFit, second: StoredFit, spans: list[Span], grid: np.ndarray) -> list[Span]:
    """The consistency check: in a span where one fit is called ahead, its fitted curve must be above the other's
    everywhere (checked CHECK_FACTOR times finer than the grid that decided, ends included); a span that fails is
    called indistinguishable instead."""
    out: list[Span] = []
    for low, high, side, ext in spans:
        if side != 0:
            steps = int(np.sum((grid >= low) & (grid <= high)))
            c = np.geomspace(low, high, max(16, CHECK_FACTOR * steps)) if high > low else np.array([low])
            gap = _gap(first, second, c) * side
            if not np.all(np.isfinite(gap) & (gap > 0)):
                side = 0
        out.append((low, high, side, ext))
    return out


def _region(
    first: StoredFit,
    second: StoredFit,
    low: float,
    high: float,
    side: int,
    beyond: bool,
    p_first: np.ndarray | None,
    grid: np.ndarray,
    diff: np.ndarray,
) -> LeadRegion:
    inside = (grid >= low) & (grid <= high)
    probs = None
    if p_first is not None and np.any(inside & np.isfinite(p_first)):
        values = p_first[inside & np.isfinite(p_first)]
        probs = (float(np.min(values)), float(np.max(values)))
    gap = diff[inside & np.isfinite(diff)]
    return LeadRegion(
        low=low,
        high=high,
        leader=None if side == 0 else (first.id if side > 0 else second.id),
        p_first_ahead=probs,
        largest_gap=float(np.max(np.abs(gap))) if gap.size else 0.0,
        extrapolated=beyond,
    )


def _share(first: list[float], second: list[float], better: Any) -> float | None:
    if not first or not second:
        return None
    n = min(len(first), len(second))  # independent bootstraps: pair draws by index
    return float(np.mean([better(first[i], second[i]) for i in range(n)]))


def not_identified(fit: StoredFit) -> list[NotIdentified]:
    """What the fit's data do not determine: the fit's own findings (its fitter's), and those its law's checks of
    stored fits find (laws.Law.identifiability: for a scalerl fit stored without findings, sigmoid_identifiability)."""
    found = list(fit.outcome.not_identified)
    check = laws.get(fit.model).identifiability
    return found if check is None else laws.resolve(check)(fit, found)


def sigmoid_identifiability(fit: StoredFit, found: list[NotIdentified]) -> list[NotIdentified]:
    """The two checks a scalerl fit's stored data allow (an older fit was stored without its fitter's): C_mid
    beyond the largest fitted compute, and A's interval over most of the range it can take beyond R0."""
    found = list(found)
    have = {(u.parameter, u.reason) for u in found}
    p = fit.outcome.parameters
    cmid, cmax = p["C_mid"].value, used_compute_max(fit)
    if cmid > cmax and ("A", "beyond_data") not in have:
        detail = (
            f"the fitted C_mid {cmid:.3g} lies beyond the largest compute {cmax:.3g}: no point past the midpoint, so "
            "the curve has not bent"
        )
        found += [NotIdentified(parameter=n, reason="beyond_data", detail=detail) for n in ("A", "C_mid")]
    a, r0, y_max = p["A"], p["R0"].value, float(fit.options.get("y_max") or 1.0)
    room = (y_max - r0) if a.value >= r0 else r0
    if a.ci_low is not None and a.ci_high is not None and room > 0 and ("A", "wide_interval") not in have:
        width = a.ci_high - a.ci_low
        if width > UNIDENTIFIED_A * room:
            found.append(
                NotIdentified(
                    parameter="A",
                    reason="wide_interval",
                    detail=f"A's interval {a.ci_low:.3f} to {a.ci_high:.3f} spans {width / room:.0%} of the range A "
                    "can take beyond R0",
                )
            )
    return found


def unidentified_reason(fit: StoredFit, parameter: str) -> str | None:
    """Why the fit's data do not determine `parameter`, in words; None when they do."""
    found = [u.detail for u in not_identified(fit) if u.parameter == parameter]
    return "; ".join(dict.fromkeys(found)) if found else None


def _interval_text(fit: StoredFit, name: str) -> str:
    p = fit.outcome.parameters[name]
    if p.ci_low is None or p.ci_high is None:
        return f"{_name(fit)} {p.value:.4g} (no interval)"
    return f"{_name(fit)} {p.ci_low:.4g}-{p.ci_high:.4g}"


def _overlap(fits: list[StoredFit], name: str) -> bool:
    ends = [(f.outcome.parameters[name].ci_low, f.outcome.parameters[name].ci_high) for f in fits]
    if any(lo is None or hi is None for lo, hi in ends):
        return True
    return max(lo for lo, _ in ends) <= min(hi for _, hi in ends)  # type: ignore[type-var]


def _winner(
    fits: list[StoredFit], name: str, lower_wins: bool, level: float, what: str, unit: str
) -> tuple[str | None, float | None, str]:
    """The fit that wins on parameter `name` (higher A, or lower C_mid) against every other, called only when each
    fit's `name` is identified and at least `level` of the bootstrap draw pairs agree with every other fit; the
    least share over the others, and the statement (a winner, or why none is named)."""
    value = {f.id: f.outcome.parameters[name].value for f in fits}
    top = min(fits, key=lambda f: value[f.id]) if lower_wins else max(fits, key=lambda f: value[f.id])
    others = [f for f in fits if f is not top]
    better = (lambda u, v: u < v) if lower_wins else (lambda u, v: u > v)
    shares = {
        f.id: _share(
            [d[name] for d in top.outcome.bootstrap_draws], [d[name] for d in f.outcome.bootstrap_draws], better
        )
        for f in others
    }
    known = [v for v in shares.values() if v is not None]
    least = min(known) if len(known) == len(shares) and known else None
    shown = f"{name}={value[top.id]:.4g}" + (f" {unit}" if name == "C_mid" else "")
    unknown = [(f, unidentified_reason(f, name)) for f in fits]
    unknown = [(f, why) for f, why in unknown if why]
    if unknown:
        whose = "; ".join(f"{_name(f)}'s {name} is not identified by this data ({why})" for f, why in unknown)
        return None, least, f"{what}: no call: {whose}."
    if least is None:
        return (
            None,
            None,
            (
                f"{what}: no call: {_name(top)} has the {'lowest' if lower_wins else 'highest'} fitted {shown}, but "
                "without bootstrap draws for every fit nothing says how sure that is."
            ),
        )
    runner_up = min(others, key=lambda f: shares[f.id] or 0.0)
    against = f"{_name(runner_up)}'s {value[runner_up.id]:.4g}"
    if least >= level:
        return (
            top.id,
            least,
            (
                f"{what}: {_name(top)} ({shown}, against {against}): {'below' if lower_wins else 'above'} every other "
                f"fit's in at least {least:.0%} of bootstrap draw pairs (level {level:.0%})."
            ),
        )
    overlap = " their intervals overlap (" if _overlap(fits, name) else " ("
    return (
        None,
        least,
        (
            f"{what}: uncertain: {_name(top)} has the {'lowest' if lower_wins else 'highest'} fitted {shown} (against "
            f"{against}), but only in {least:.0%} of bootstrap draw pairs against {_name(runner_up)}, below the "
            f"{level:.0%} level;{overlap}" + ", ".join(_interval_text(f, name) for f in fits) + ")."
        ),
    )


def _most_efficient(fits: list[StoredFit], level: float, unit: str) -> tuple[str | None, float | None, str]:
    """The efficiency call among the fits whose law declares an efficiency parameter (scalerl's C_mid)."""
    with_eff = [n for n in laws.names(on_compute=True) if laws.get(n).efficiency is not None]
    shared = {laws.get(n).efficiency for n in with_eff}
    eff = shared.pop() if len(shared) == 1 else "efficiency"
    text = f"Most efficient: no call: efficiency ({eff}) is compared between {', '.join(with_eff)} fits only."
    having = [f for f in fits if laws.get(f.model).efficiency == eff]
    if len(having) >= 2:
        return _winner(having, eff, True, level, "Most efficient", unit)
    if len(having) == 1 and len(fits) > 1:
        other = next(laws.get(f.model).title for f in fits if f not in having)
        text = f"Most efficient: no call: only one {having[0].model} fit has a {eff}; a {other} has none to compare."
    return None, None, text


def compare(fits: list[StoredFit], level: float = 0.95, at_compute: float | None = None) -> Comparison:
    """compare_scaling_fits' work. With at_compute, also each fit's fitted value there (value_at) and, per pair,
    the share of draw pairs with the first above (p_first_higher_at) and a sentence in its verdict; without it the
    comparison is as before, those fields absent."""
    comparable = [n for n in laws.names(on_compute=True) if {"A", "B"} <= set(laws.get(n).parameter_names)]
    models = {f.model for f in fits}
    if not models <= set(comparable):
        sizes = ", ".join(laws.names(on_compute=False))
        raise InputError(
            f"compare_scaling_fits compares RL compute curves ({', '.join(comparable)} fits); for {sizes} "
            "fits compare predict_scaling's compute-optimal loss at the same FLOP budget (compute)"
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
                c_mid=p[eff].value if (eff := laws.get(f.model).efficiency) in p else None,
                b=p["B"].value,
                warnings=list(f.outcome.warnings),
                not_identified=not_identified(f),
                value_at=value_at(f, at_compute) if at_compute is not None else None,
            )
        )
    pairs = []
    for i in range(len(fits)):
        for j in range(i + 1, len(fits)):
            x, y = fits[i], fits[j]
            draws_x, draws_y = x.outcome.bootstrap_draws, y.outcome.bootstrap_draws
            p_a = _share([d["A"] for d in draws_x], [d["A"] for d in draws_y], lambda u, v: u > v)
            p_e = None
            eff = laws.get(x.model).efficiency
            if x.model == y.model and eff is not None:
                p_e = _share([d[eff] for d in draws_x], [d[eff] for d in draws_y], lambda u, v: u < v)
            start, end, data_end = compute_range(x, y)
            regions = lead_regions(x, y, level)
            verdict = _pair_verdict(x, y, p_a, regions, (start, end, data_end), unit, level)
            p_at = None
            if at_compute is not None:
                p_at = share_above_at(x, y, at_compute)
                verdict += _at_statement(x, y, at_compute, p_at, data_end, unit, level)
            pairs.append(
                PairVerdict(
                    first=x.id,
                    second=y.id,
                    p_first_higher_asymptote=p_a,
                    p_first_more_efficient=p_e,
                    compute_range=(start, end),
                    regions=regions,
                    crossings=crossings(x, y),
                    p_first_higher_at=p_at,
                    verdict=verdict,
                )
            )
    highest = max(rows, key=lambda r: r.asymptote)
    best, p_best, a_text = _winner(fits, "A", False, level, "Best asymptote", unit)
    efficient, p_eff, e_text = _most_efficient(fits, level, unit)
    warned = [f"{_name(f)}: {len(f.outcome.warnings)}" for f in fits if f.outcome.warnings]
    verdict = f"{a_text} {e_text} " + " ".join(p.verdict for p in pairs)
    if warned:
        verdict += " Fit warnings (fits[].warnings): " + ", ".join(warned) + "."
    return Comparison(
        compute_unit=unit,
        level=level,
        fits=rows,
        pairs=pairs,
        highest_fitted_asymptote=highest.fit_id,
        best_asymptote=best,
        p_best_asymptote=p_best,
        asymptote_statement=a_text,
        most_efficient=efficient,
        p_most_efficient=p_eff,
        efficiency_statement=e_text,
        at_compute=at_compute,
        verdict=verdict,
    )


def _where(low: float, high: float, start: float, end: float) -> str:
    if low <= start and high >= end:
        return "throughout"
    if low <= start:
        return f"below ~{high:.3g}"
    if high >= end:
        return f"beyond ~{low:.3g}"
    return f"from ~{low:.3g} to ~{high:.3g}"


def _shares(group: list[LeadRegion], first: bool) -> str:
    """The least and greatest share of draw pairs with `first` (else the second fit) above, over the regions."""
    ranges = [r.p_first_ahead for r in group if r.p_first_ahead is not None]
    if not ranges:
        return ""
    lo, hi = min(p[0] for p in ranges), max(p[1] for p in ranges)
    if not first:
        lo, hi = 1 - hi, 1 - lo
    return f"{lo:.0%}" if round(lo * 100) == round(hi * 100) else f"{lo:.0%}-{hi:.0%}"


def _pair_verdict(
    x: StoredFit,
    y: StoredFit,
    p_a: float | None,
    regions: list[LeadRegion],
    span: tuple[float, float, float],
    unit: str,
    level: float,
) -> str:
    """The pair's verdict in words, built from the regions alone (so it says no more than they do): consecutive
    regions with the same call are told as one stretch, with the part beyond the data named."""
    start, end, data_end = span
    names = {x.id: _name(x), y.id: _name(y)}
    groups: list[list[LeadRegion]] = []
    for r in regions:
        if groups and groups[-1][0].leader == r.leader:
            groups[-1].append(r)
        else:
            groups.append([r])
    parts = []
    for group in groups:
        low, high, leader = group[0].low, group[-1].high, group[0].leader
        where = _where(low, high, start, end)
        ext = [r for r in group if r.extrapolated]
        details = []
        if leader is None:
            shown = _shares(group, True)
            details += [f"{names[x.id]} above in {shown} of bootstrap draws"] if shown else []
        else:
            shown = _shares(group, leader == x.id)
            details.append(f"in {shown} of bootstrap draws" if shown else "point estimates only: no bootstrap draws")
            details.append(f"by up to {max(r.largest_gap for r in group):.3g}")
        if ext:
            details.append("extrapolated" if len(ext) == len(group) else f"extrapolated beyond {ext[0].low:.3g}")
        call = "indistinguishable" if leader is None else f"{names[leader]} ahead"
        parts.append(f"{call} {where}" + (f" ({'; '.join(details)})" if details else ""))
    text = (
        f"{names[x.id]} vs {names[y.id]} ({unit} from {start:.3g} to {end:.3g}, fitted up to {data_end:.3g}; "
        f"'ahead' where the fitted curves and at least {level:.0%} of bootstrap draws agree): " + "; ".join(parts) + "."
    )
    ax, ay = x.outcome.parameters["A"].value, y.outcome.parameters["A"].value
    hi = x if ax >= ay else y
    p_hi = None if p_a is None else (p_a if hi is x else 1 - p_a)
    fitted = f"{names[hi.id]}'s fitted A is higher ({max(ax, ay):.3f} vs {min(ax, ay):.3f})"
    unknown = [(f, unidentified_reason(f, "A")) for f in (x, y)]
    unknown = [(f, why) for f, why in unknown if why]
    if unknown:
        whose = " and ".join(f"{names[f.id]}'s" for f, _ in unknown)
        verb = "asymptote is" if len(unknown) == 1 else "asymptotes are"
        return text + f" Asymptote: no call ({fitted}): {whose} {verb} not identified by this data (see fits)."
    if p_hi is None:
        return text + f" Asymptote: no call: {fitted}, from the point estimates only (no bootstrap draws)."
    if p_hi < level:
        overlap = "their intervals overlap" if _overlap([x, y], "A") else "the intervals do not overlap"
        return text + (
            f" Asymptote: uncertain: {fitted} in only {p_hi:.0%} of bootstrap draws, below the {level:.0%} level; "
            f"{overlap} ({_interval_text(x, 'A')}, {_interval_text(y, 'A')})."
        )
    text += f" Asymptote: {names[hi.id]} higher ({max(ax, ay):.3f} vs {min(ax, ay):.3f}) in {p_hi:.0%} of draws"
    if abs(ax - ay) < SEED_SPREAD_A:
        text += (
            f" (the gap is within ScaleRL's seed-to-seed spread of about {SEED_SPREAD_A} on A, which one run's "
            "bootstrap does not include: confirm with another seed)"
        )
    return text + "."
