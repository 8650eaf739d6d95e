"""Fitting the Chinchilla loss law L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022, approach 3).

The objective is Hoffmann et al.'s: in log space, log L_hat = LSE(a - alpha log N, b - beta log D, e) with
A = e^a, B = e^b, E = e^e, and the Huber loss (delta 1e-3) of the residuals log L_hat - log L, summed over the
points. Their procedure runs L-BFGS from a grid of 4,500 starts (a, b in {0, 5, ..., 25}; e in {-1, -0.5, ..., 1};
alpha, beta in {0, 0.5, ..., 2}) and keeps the lowest final objective.

Two methods minimise that objective:

- "naive-grid": exactly the procedure above, 4,500 independent L-BFGS-B runs (analytic gradient), the baseline.
- "robust" (default): the same objective and the same local optimiser, from far fewer, better starts.
  1. Candidate pool: the 4,500 grid starts plus variable-projection starts (for each alpha, beta on a grid the
     model is linear in E, A, B: a nonnegative least-squares solve on the relative residuals gives E, A, B).
  2. Pruning: the objective is evaluated at every candidate at once (numpy, vectorised over starts and points);
     L-BFGS-B (analytic gradient) runs only from ``top_k`` of them (20 by default): the best distinct
     variable-projection candidates (half) and the best grid starts (the other half, for other basins).
  3. Polish: the best result is restarted until the objective stops falling (a restart resets L-BFGS's curvature
     memory, which helps on this nearly L1 objective where most residuals lie outside delta).
  Bootstrap refits start from the full-data optimum and the next two distinct local optima, not the grid.

BLAS is held to one thread during a fit when threadpoolctl is installed (see ``_one_blas_thread``).

Both methods minimise the objective divided by delta (the same minimiser; it brings the values and gradients to
order one, so that L-BFGS-B's tolerances mean something when the raw objective is ~1e-3); ``objective`` in the
result is the raw Huber sum.
"""

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize, nnls

from servers.core.errors import InputError
from servers.scaling.fitting import FitOutcome, ParameterEstimate
from servers.scaling.laws import check_parameters

if TYPE_CHECKING:
    from servers.scaling.limits import FitTask

try:  # optional: pins BLAS to one thread during a fit (see _one_blas_thread)
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - depends on the environment
    threadpool_limits = None

Method = Literal["robust", "naive-grid"]
NAMES = ("E", "A", "B", "alpha", "beta")
# Internal parameter vector: theta = (a, b, e, alpha, beta), with A = e^a, B = e^b, E = e^e.
THETA_NAMES = ("a", "b", "e", "alpha", "beta")
# Box for L-BFGS-B: wide enough never to bind on sensible data, it keeps the exponents non-negative and the
# logs finite. A fit that ends on a face of it gets a warning.
BOUNDS: tuple[tuple[float, float], ...] = ((-30.0, 80.0), (-30.0, 80.0), (-10.0, 10.0), (0.0, 4.0), (0.0, 4.0))
LBFGS_OPTIONS = {"maxiter": 2000, "ftol": 1e-13, "gtol": 1e-9, "maxls": 50}
BOOTSTRAP_MAXITER = 500  # warm-started refits; bounds the cost on flat (ill-determined) problems
GRID_A = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
GRID_E = (-1.0, -0.5, 0.0, 0.5, 1.0)
GRID_EXPONENT = (0.0, 0.5, 1.0, 1.5, 2.0)
MIN_POINTS = 5
FEW_POINTS = 15  # fewer than ~3 points per parameter: warn
WIDE_FACTOR = 10.0  # an interval on A or B wider than this factor: warn


def start_grid(
    a: Sequence[float] = GRID_A,
    b: Sequence[float] = GRID_A,
    e: Sequence[float] = GRID_E,
    alpha: Sequence[float] = GRID_EXPONENT,
    beta: Sequence[float] = GRID_EXPONENT,
) -> NDArray[np.float64]:
    """Hoffmann et al.'s grid of starts as rows (a, b, e, alpha, beta): 6 * 6 * 5 * 5 * 5 = 4,500 by default."""
    mesh = np.meshgrid(a, b, e, alpha, beta, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1).astype(np.float64)


def predict_loss(params: dict[str, float], N: ArrayLike, D: ArrayLike) -> NDArray[np.float64]:  # noqa: N803
    """L(N, D) = E + A / N^alpha + B / D^beta, vectorised over (broadcastable) arrays of N and D."""
    p = check_parameters("chinchilla", params)
    n = np.asarray(N, dtype=np.float64)
    d = np.asarray(D, dtype=np.float64)
    return p["E"] + p["A"] * np.power(n, -p["alpha"]) + p["B"] * np.power(d, -p["beta"])


def theta_to_params(theta: ArrayLike) -> dict[str, float]:
    a, b, e, alpha, beta = (float(v) for v in np.asarray(theta, dtype=np.float64))
    return {"E": math.exp(e), "A": math.exp(a), "B": math.exp(b), "alpha": alpha, "beta": beta}


def params_to_theta(params: dict[str, float]) -> NDArray[np.float64]:
    p = check_parameters("chinchilla", params)
    if p["E"] <= 0:
        raise InputError(f"E must be > 0 for the log-space parameterisation, got {p['E']}")
    return np.array([math.log(p["A"]), math.log(p["B"]), math.log(p["E"]), p["alpha"], p["beta"]])


def log_loss_lse(theta: ArrayLike, log_n: ArrayLike, log_d: ArrayLike) -> NDArray[np.float64]:
    """log L_hat = LSE(a - alpha log N, b - beta log D, e), computed stably (it equals log of the linear form)."""
    a, b, e, alpha, beta = np.asarray(theta, dtype=np.float64)
    t1 = a - alpha * np.asarray(log_n, dtype=np.float64)
    t2 = b - beta * np.asarray(log_d, dtype=np.float64)
    t3 = np.full_like(t1, e)
    m = np.maximum(np.maximum(t1, t2), t3)
    return m + np.log(np.exp(t1 - m) + np.exp(t2 - m) + np.exp(t3 - m))


def _huber(r: NDArray[np.float64], delta: float) -> NDArray[np.float64]:
    ar = np.abs(r)
    return np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))


def huber_objective(
    theta: ArrayLike, log_n: ArrayLike, log_d: ArrayLike, log_l: ArrayLike, delta: float = 1e-3
) -> float:
    """Hoffmann et al.'s objective: the summed Huber loss of log L_hat - log L."""
    r = log_loss_lse(theta, log_n, log_d) - np.asarray(log_l, dtype=np.float64)
    return float(_huber(r, delta).sum())


def objective_and_gradient(
    theta: NDArray[np.float64],
    log_n: NDArray[np.float64],
    log_d: NDArray[np.float64],
    log_l: NDArray[np.float64],
    delta: float,
    scale: float = 1.0,
) -> tuple[float, NDArray[np.float64]]:
    """The Huber objective times ``scale`` and its analytic gradient in (a, b, e, alpha, beta).

    With w_k the softmax weights of the three LSE terms and psi = clip(r, -delta, delta) the Huber derivative:
    d/da = sum psi w1, d/db = sum psi w2, d/de = sum psi w3, d/dalpha = -sum psi w1 log N,
    d/dbeta = -sum psi w2 log D.
    """
    a, b, e, alpha, beta = theta
    t1 = a - alpha * log_n
    t2 = b - beta * log_d
    m = np.maximum(np.maximum(t1, t2), e)
    e1 = np.exp(t1 - m)
    e2 = np.exp(t2 - m)
    e3 = np.exp(e - m)
    s = e1 + e2 + e3
    r = m + np.log(s) - log_l
    ar = np.abs(r)
    inside = ar <= delta
    f = float(np.where(inside, 0.5 * r * r, delta * (ar - 0.5 * delta)).sum())
    q = np.clip(r, -delta, delta) / s
    w1 = q * e1
    w2 = q * e2
    grad = np.array([w1.sum(), w2.sum(), (q * e3).sum(), -(w1 @ log_n), -(w2 @ log_d)])
    return f * scale, grad * scale


def objective_batch(
    thetas: NDArray[np.float64],
    log_n: NDArray[np.float64],
    log_d: NDArray[np.float64],
    log_l: NDArray[np.float64],
    delta: float,
    max_cells: int = 2_000_000,
) -> NDArray[np.float64]:
    """The Huber objective at many parameter vectors (rows of ``thetas``) at once, in chunks of bounded memory."""
    thetas = np.atleast_2d(np.asarray(thetas, dtype=np.float64))
    out = np.empty(len(thetas))
    chunk = max(1, max_cells // max(1, len(log_n)))
    for lo in range(0, len(thetas), chunk):
        th = thetas[lo : lo + chunk]
        t1 = th[:, 0:1] - th[:, 3:4] * log_n[None, :]
        t2 = th[:, 1:2] - th[:, 4:5] * log_d[None, :]
        t3 = th[:, 2:3]
        m = np.maximum(np.maximum(t1, t2), t3)
        lse = m + np.log(np.exp(t1 - m) + np.exp(t2 - m) + np.exp(t3 - m))
        out[lo : lo + chunk] = _huber(lse - log_l[None, :], delta).sum(axis=1)
    return out


def varpro_starts(
    n: NDArray[np.float64],
    d: NDArray[np.float64],
    loss: NDArray[np.float64],
    exponents: Sequence[float] | None = None,
) -> NDArray[np.float64]:
    """Variable-projection starts: for each (alpha, beta) on a grid, the nonnegative least-squares E, A, B.

    For fixed exponents the model is linear in (E, A, B); the rows are divided by L so the least squares is on
    relative residuals, which approximate the log residuals the objective uses. Zero coefficients are clamped to
    a tiny positive value so that their logs exist.
    """
    grid = np.linspace(0.05, 1.5, 30) if exponents is None else np.asarray(exponents, dtype=np.float64)
    log_n, log_d = np.log(n), np.log(d)
    inv = 1.0 / loss
    rows = []
    for alpha in grid:
        col_a = np.exp(-alpha * log_n) * inv
        for beta in grid:
            col_b = np.exp(-beta * log_d) * inv
            x = np.stack([inv, col_a, col_b], axis=1)
            norms = np.linalg.norm(x, axis=0)
            coef, _ = nnls(x / norms, np.ones_like(loss))
            coef = coef / norms
            floor = 1e-12 * max(float(coef.max()), 1e-300)
            e_, a_, b_ = np.log(np.maximum(coef, floor))
            rows.append((a_, b_, e_, alpha, beta))
    out = np.array(rows)
    lows = np.array([lo for lo, _ in BOUNDS])
    highs = np.array([hi for _, hi in BOUNDS])
    return np.clip(out, lows, highs)


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    """One BLAS thread while fitting, when threadpoolctl is installed. L-BFGS-B on 5 parameters makes only tiny
    BLAS/LAPACK calls, and OpenBLAS's worker threads make each of them wait for a free core: on a machine whose
    cores are busy, a fit ran ~20x slower (0.02 s -> 0.4 s for one L-BFGS-B run) without this limit."""
    if threadpool_limits is None:
        yield
    else:
        with threadpool_limits(limits=1, user_api="blas"):
            yield


def _lbfgs(
    start: NDArray[np.float64], data: tuple[NDArray[np.float64], ...], delta: float, maxiter: int | None = None
) -> tuple[NDArray[np.float64], float, bool, str, int]:
    """One L-BFGS-B run on the objective / delta; returns (theta, raw objective, success, message, evaluations)."""
    options = LBFGS_OPTIONS if maxiter is None else {**LBFGS_OPTIONS, "maxiter": maxiter}
    res = minimize(
        objective_and_gradient,
        start,
        args=(*data, delta, 1.0 / delta),
        jac=True,
        method="L-BFGS-B",
        bounds=BOUNDS,
        options=options,
    )
    return np.asarray(res.x, dtype=np.float64), float(res.fun) * delta, bool(res.success), str(res.message), res.nfev


def _distinct(thetas: NDArray[np.float64], order: NDArray[np.int64], k: int, tol: float) -> list[int]:
    """The first ``k`` indices in ``order`` whose rows differ from every row already picked by more than tol."""
    picked: list[int] = []
    if k <= 0:
        return picked
    for i in order:
        if all(np.max(np.abs(thetas[i] - thetas[j])) > tol for j in picked):
            picked.append(int(i))
            if len(picked) == k:
                break
    return picked


class _LocalFit:
    def __init__(self, theta: NDArray[np.float64], objective: float, success: bool, message: str) -> None:
        self.theta = theta
        self.objective = objective
        self.success = success
        self.message = message


def _fit_naive(data: tuple[NDArray[np.float64], ...], delta: float, starts: NDArray[np.float64]) -> list[_LocalFit]:
    fits = []
    for start in starts:
        theta, f, ok, msg, _ = _lbfgs(start, data, delta)
        fits.append(_LocalFit(theta, f, ok, msg))
    return fits


def _fit_robust(
    data: tuple[NDArray[np.float64], ...],
    raw: tuple[NDArray[np.float64], ...],
    delta: float,
    starts: NDArray[np.float64],
    top_k: int,
) -> tuple[list[_LocalFit], str]:
    varpro = varpro_starts(*raw)
    pool = np.vstack([starts, varpro])
    values = objective_batch(pool, *data, delta)
    values = np.where(np.isfinite(values), values, np.inf)
    # Half the runs from the best variable-projection starts (usually next to the optimum), half from the best
    # grid starts (other basins, and at least as much as a pruned Hoffmann grid would find).
    n_varpro = (top_k + 1) // 2
    grid_idx = np.arange(len(starts))
    varpro_idx = np.arange(len(starts), len(pool))
    picked = _distinct(pool, varpro_idx[np.argsort(values[varpro_idx], kind="stable")], n_varpro, tol=1e-6)
    n_chosen = len(picked)
    picked += _distinct(pool, grid_idx[np.argsort(values[grid_idx], kind="stable")], top_k - len(picked), tol=1e-6)
    fits = []
    for i in picked:
        theta, f, ok, msg, _ = _lbfgs(pool[i], data, delta)
        fits.append(_LocalFit(theta, f, ok, msg))
    best = min(fits, key=lambda fit: fit.objective)
    restarts = 0
    for _ in range(5):  # polish: restart from the best until it stops improving
        theta, f, ok, msg, _ = _lbfgs(best.theta, data, delta)
        restarts += 1
        if not f < best.objective:
            break
        improved = f < best.objective * (1 - 1e-12)
        best = _LocalFit(theta, f, ok, msg)
        fits.append(best)
        if not improved:
            break
    info = (
        f"L-BFGS-B from the best {n_chosen} of {len(varpro)} variable-projection starts and the best "
        f"{len(picked) - n_chosen} of {len(starts)} grid starts, then {restarts} polishing restart(s)"
    )
    return fits, info


def _bootstrap(
    data: tuple[NDArray[np.float64], ...], delta: float, fits: list[_LocalFit], resamples: int, seed: int
) -> tuple[list[dict[str, float]], dict[str, int]]:
    """Refits on ``resamples`` resamples of the points (with replacement; numpy default_rng(seed)), each from the
    full-data optimum and the next two distinct local optima (``fits`` sorted best first), keeping the best; and
    the refits left out, counted by reason."""
    warm = [fits[0].theta]
    for fit in fits[1:]:
        if len(warm) == 3:
            break
        if all(np.max(np.abs(fit.theta - w)) > 1e-3 for w in warm):
            warm.append(fit.theta)
    draws: list[dict[str, float]] = []
    failed: dict[str, int] = {}
    if resamples <= 0:
        return draws, failed
    rng = np.random.default_rng(seed)
    count = len(data[0])
    for _ in range(resamples):
        idx = rng.integers(0, count, size=count)
        sample = (data[0][idx], data[1][idx], data[2][idx])
        results = [_lbfgs(w, sample, delta, maxiter=BOOTSTRAP_MAXITER) for w in warm]
        theta = min(results, key=lambda res: res[1])[0]
        params = theta_to_params(theta) if np.all(np.isfinite(theta)) else None
        if params is not None and all(math.isfinite(v) for v in params.values()):
            draws.append(params)
        else:
            failed["non-finite parameters"] = failed.get("non-finite parameters", 0) + 1
    return draws, failed


def _validate(
    params: ArrayLike, tokens: ArrayLike, loss: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    arrays = []
    for name, values in (("params", params), ("tokens", tokens), ("loss", loss)):
        try:
            arr = np.asarray(values, dtype=np.float64).ravel()
        except (TypeError, ValueError) as exc:
            raise InputError(f"{name} must be a list of numbers: {exc}") from None
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise InputError(f"{name} must be finite numbers > 0 (the fit works on their logarithms)")
        arrays.append(arr)
    n, d, loss_ = arrays
    if not len(n) == len(d) == len(loss_):
        raise InputError(f"params, tokens and loss must have the same length, got {len(n)}, {len(d)} and {len(loss_)}")
    if len(n) < MIN_POINTS:
        raise InputError(
            f"the Chinchilla law has 5 parameters (E, A, B, alpha, beta); {len(n)} point(s) cannot determine "
            f"them: give at least {MIN_POINTS} (params, tokens, loss) runs, preferably 15 or more"
        )
    return n, d, loss_


def fit_task(task: "FitTask") -> FitOutcome:
    """The fitter the registry names for chinchilla (laws.py): a fit task's (N, D, loss) points, fitted here."""
    return fit_chinchilla(
        task.params, task.tokens, task.loss, bootstrap=task.bootstrap, seed=task.seed, level=task.level
    )


def fit_chinchilla(
    params: ArrayLike,
    tokens: ArrayLike,
    loss: ArrayLike,
    *,
    method: Method = "robust",
    huber_delta: float = 1e-3,
    bootstrap: int = 200,
    seed: int = 0,
    starts: NDArray[np.float64] | None = None,
    top_k: int = 20,
    level: float = 0.95,
) -> FitOutcome:
    """Fit L(N, D) = E + A / N^alpha + B / D^beta to (params N, tokens D, loss) runs by Hoffmann et al.'s method.

    ``starts`` replaces the 4,500-start grid (rows a, b, e, alpha, beta; see ``start_grid``); ``top_k`` is how
    many of the best candidates the robust method refines with L-BFGS-B. ``bootstrap`` resamples of the points
    (with replacement, numpy default_rng(seed)) give percentile intervals of coverage ``level`` and the draws.
    """
    t0 = time.perf_counter()
    if method not in ("robust", "naive-grid"):
        raise InputError(f"method must be 'robust' or 'naive-grid', got {method!r}")
    if isinstance(huber_delta, bool) or not (
        isinstance(huber_delta, (int, float, np.floating)) and math.isfinite(huber_delta) and huber_delta > 0
    ):
        raise InputError(f"huber_delta must be a finite number > 0, got {huber_delta!r}")
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, (int, np.integer)) or bootstrap < 0:
        raise InputError(f"bootstrap must be an integer >= 0 (0 for no intervals), got {bootstrap!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise InputError(f"top_k must be an integer >= 1, got {top_k!r}")
    bootstrap, top_k = int(bootstrap), int(top_k)
    if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
        raise InputError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {level!r}")
    tail = (1.0 - float(level)) / 2.0 * 100.0
    n, d, loss_ = _validate(params, tokens, loss)
    grid = start_grid() if starts is None else np.atleast_2d(np.asarray(starts, dtype=np.float64))
    if grid.ndim != 2 or grid.shape[1] != 5 or len(grid) == 0 or not np.all(np.isfinite(grid)):
        raise InputError("starts must be a non-empty array of finite rows (a, b, e, alpha, beta)")
    data = (np.log(n), np.log(d), np.log(loss_))
    delta = float(huber_delta)

    with _one_blas_thread():
        if method == "naive-grid":
            fits = _fit_naive(data, delta, grid)
            info = f"{len(grid)} independent L-BFGS-B runs, one from each grid start"
        else:
            fits, info = _fit_robust(data, (n, d, loss_), delta, grid, top_k)
        fits.sort(key=lambda fit: fit.objective)
        best = fits[0]
        draws, failed = _bootstrap(data, delta, fits, bootstrap, seed)
    theta = best.theta
    point = theta_to_params(theta)

    estimates: dict[str, ParameterEstimate] = {}
    for name in NAMES:
        lo = hi = None
        if draws:
            values = np.array([draw[name] for draw in draws])
            lo, hi = (float(v) for v in np.percentile(values, [tail, 100.0 - tail]))
        estimates[name] = ParameterEstimate(value=point[name], ci_low=lo, ci_high=hi)

    l_hat = np.exp(log_loss_lse(theta, data[0], data[1]))  # the fit's own loss (an exponent may sit on 0)
    rmse = float(np.sqrt(np.mean((l_hat - loss_) ** 2)))
    warnings = _warnings(n, d, best, theta, estimates, draws, tail)
    reached = sum(fit.objective <= best.objective * (1 + 1e-9) + 1e-300 for fit in fits)
    message = f"{best.message} ({info}; {reached} of {len(fits)} run(s) reached the best objective)"
    return FitOutcome(
        model="chinchilla",
        method=method,
        parameters=estimates,
        rmse=rmse,
        objective=huber_objective(theta, *data, delta=delta),
        converged=best.success,
        message=message,
        warnings=warnings,
        level=float(level),
        bootstrap=len(draws),
        bootstrap_run=bootstrap,
        bootstrap_failed=failed,
        bootstrap_draws=draws,
        points_used=len(n),
        duration_s=time.perf_counter() - t0,
    )


def _warnings(
    n: NDArray[np.float64],
    d: NDArray[np.float64],
    best: _LocalFit,
    theta: NDArray[np.float64],
    estimates: dict[str, ParameterEstimate],
    draws: list[dict[str, float]],
    tail: float = 2.5,
) -> list[str]:
    out: list[str] = []
    if len(n) < FEW_POINTS:
        out.append(
            f"Only {len(n)} points for 5 parameters (fewer than ~3 per parameter): the fit is nearly "
            "interpolating and its parameters and extrapolations are unreliable; add runs at more (N, D) pairs."
        )
    if not best.success:
        out.append(
            f"The optimiser did not report convergence ({best.message}); treat the parameters as approximate, "
            "or refit with more points or a different method."
        )
    for i, name in enumerate(THETA_NAMES):
        lo, hi = BOUNDS[i]
        if theta[i] <= lo + 1e-6 or theta[i] >= hi - 1e-6:
            shown = {"a": "A = e^a", "b": "B = e^b", "e": "E = e^e"}.get(name, name)
            out.append(
                f"{shown} ended at a bound of its search box ({name} = {theta[i]:.4g}, box [{lo:g}, {hi:g}]): "
                "the data do not constrain it; the law may not describe these runs, or the range of N or D "
                "is too narrow to separate the terms. Do not extrapolate with this fit."
            )
    for name, values in (("N (params)", n), ("D (tokens)", d)):
        decades = math.log10(float(values.max()) / float(values.min()))
        if decades < 1.0:
            out.append(
                f"The data span only {decades:.2f} decade(s) in {name} ({values.min():.3g} to {values.max():.3g}): "
                f"the exponent of that term is poorly determined and extrapolation is risky; add runs over at "
                f"least a decade (ideally two or more) of {name.split()[0]}."
            )
    point = theta_to_params(theta)
    total = np.exp(log_loss_lse(theta, np.log(n), np.log(d)))
    terms = (
        ("E", "E", np.full_like(n, point["E"]), "an irreducible loss"),
        ("A / N^alpha", "A and alpha", point["A"] * np.power(n, -point["alpha"]), "a dependence on N (params)"),
        ("B / D^beta", "B and beta", point["B"] * np.power(d, -point["beta"]), "a dependence on D (tokens)"),
    )
    for label, which, term, meaning in terms:
        share = float(np.max(term / total))
        if share < 1e-3:
            out.append(
                f"The {label} term is below 0.1% of the fitted loss at every point (at most {share:.2g}): the "
                f"data show no {meaning} over this range, so {which} are not determined; check the runs, or "
                "widen the range of N and D."
            )
    wide = []
    for name in ("A", "B"):
        est = estimates[name]
        if est.ci_low is not None and est.ci_high is not None and est.ci_low > 0:
            factor = est.ci_high / est.ci_low
            if factor > WIDE_FACTOR:
                wide.append(f"{name} in [{est.ci_low:.3g}, {est.ci_high:.3g}] (a factor of {factor:.3g})")
    if wide and draws:
        al = np.array([dr["alpha"] for dr in draws])
        be = np.array([dr["beta"] for dr in draws])
        g = (al * np.array([dr["A"] for dr in draws]) / (be * np.array([dr["B"] for dr in draws]))) ** (1.0 / (al + be))
        share = be / (al + be)
        ends = [tail, 100.0 - tail]
        g_lo, g_hi = np.percentile(g[np.isfinite(g)], ends) if np.any(np.isfinite(g)) else (math.nan,) * 2
        s_lo, s_hi = np.percentile(share, ends)
        out.append(
            f"Very wide {100 - 2 * tail:.0f}% bootstrap intervals: "
            + "; ".join(wide)
            + ". The loss surface is flat along the A-B ridge (as the Epoch AI replication of Chinchilla found), "
            "so do not interpret A or B on their own. Compute-optimal allocations depend on alpha/beta and "
            "G = (alpha A / (beta B))^(1/(alpha+beta)), which may still be well determined: here the exponent "
            f"of N_opt in C, beta/(alpha+beta), is in [{s_lo:.3g}, {s_hi:.3g}] and G in [{g_lo:.3g}, {g_hi:.3g}]."
        )
    return out
