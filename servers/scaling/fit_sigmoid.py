"""Fitting RL compute curves: ScaleRL's sigmoid and the power law it is compared with (plain numpy + scipy).

Models (x = log C throughout):

- scalerl: R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) = R0 (1 - s) + A s, with s = expit(B (log C - log C_mid)).
  R0 is held fixed by default: at ``r0`` when given, else at the mean over runs of each run's first value (the
  value at its smallest compute; runs that start more than 5% later than the earliest are left out of the mean:
  ``start_points`` and ``default_r0``, the one definition, which the server uses too, over ``r0_from`` when given:
  the points left out by min_compute still say where the curve starts). ``free_r0=True`` fits it, within
  [0, y_max]. A lies in [0, y_max] (a declining curve, A < R0, is allowed).
- power_law: R(C) = A - D C^(-B), D >= 0, B > 0, A unbounded (it overshoots the metric's maximum on a
  saturating curve, which is the point of comparing it; a warning says so).

Methods:

- "robust" (default): variable projection plus a Huber M-estimate. For fixed nonlinear parameters
  theta = (log C_mid, log B) (power law: log B) the model is linear in (A - R0) or (R0, A) or (A, D); those are
  solved exactly in closed form (weighted least squares on a box: clipped 1-D solve, or the best of the interior
  and edge solutions in 2-D). A coarse grid over theta (C_mid from 100x below to 100x above the observed compute,
  B from 0.3 to 5; the power law's B from 0.01 to 5) scored on the projected residuals gives up to three starts
  (the best grid local minima), so nothing depends on a lucky initial guess. From each, iteratively reweighted
  least squares (IRLS) with Huber weights min(1, c/|r|), where each weighted problem is solved over theta by a
  batched Levenberg-Marquardt on the projected residuals, converges to the Huber M-estimate (a stationary point of
  sum rho_c(r) over all parameters). c = 1.5 sigma, sigma a model-free noise estimate from the second differences
  of the values along each run (MAD-based); ``objective`` is the Huber sum.
- "scalerl-grid": the ScaleRL paper's procedure: A on a 0.005 grid from 0.450 to 0.800 (capped at y_max), C_mid on
  100 linearly spaced values in [100, 40000] (the paper's GPU-hours; when that range does not meet the data's
  compute, as for FLOPs, the 100 values span the data's smallest compute to 4x its largest instead), R0 fixed;
  for each cell B is fitted by least squares from B = 1 (the default start of curve_fit), the lowest squared error
  wins. The 7,100 one-parameter fits run vectorised (a damped Gauss-Newton over all cells at once); the best five
  cells are then refitted with scipy's curve_fit itself and the lowest squared error among those is returned, so
  the answer is curve_fit's.
- "curve_fit": scipy.optimize.curve_fit of the model from its default start (all parameters 1), the naive
  baseline. A failure is reported (converged=False, with curve_fit's message), not raised.

A grid or curve_fit fit whose residuals' robust size (1.4826 x median |r|) exceeds NOISE_FACTOR (4) times the
model-free noise estimate (and the grid's A step) is not a fit of the data: converged=False, with the reason.
``not_identified`` lists what the data do not determine (see _not_identified).

Bootstrap (``bootstrap`` resamples, seeded): a circular-block residual bootstrap that keeps what the estimate
used. The compute points are kept; the residuals of the full-data fit, scaled by sqrt(n / (n - p)) (fitted
residuals understate the noise), are centred within each run (a run's mean residual is its offset from the common
curve) and resampled separately within each run (points sorted by compute) as contiguous blocks of length
round(n_run^(1/3)) starting at uniformly drawn positions and wrapping past the run's end (so every residual is
drawn equally often at every position), concatenated, cut to the run's length and added to the fitted curve; with
two runs or more, each run then gets an offset drawn from the runs' centred offsets (run-to-run variation; runs are
not resampled as wholes, which gives degenerate draws with the two or three seeds usual here). R0 taken from the
data is taken again in each resample by the same rule (each start value plus the noise the resample put there),
so the intervals include its uncertainty; a given R0 stays fixed. Each resample is refitted by the same method; the
robust refits run batched (all resamples at once, each with its own R0 and bounds), warm-started from the
full-data estimate. Intervals are the percentiles ((1 - level)/2 and (1 + level)/2) of the kept draws; a refit that
fails is left out and counted by reason (``bootstrap_failed``; ``bootstrap`` is the number kept, ``bootstrap_run``
the number refitted), and FitOutcome itself warns about any interval that does not contain its estimate.

Why the resampling is built so (issue 10): the earlier version added each run's uncentred residuals, drawn in
moving blocks that under-draw a run's ends, to every resample, and held R0 at its full-data value. Residuals that
are not centred (a fixed R0 that the curve cannot pass through leaves a systematic misfit at the start; a run's
offset) shift every resample the same way, so every refit moved the same way: on 4 runs of 1,250 points, A's 95%
interval [0.6068, 0.6083] missed its estimate 0.6089, and over 540 intervals of random curves only 52% covered
the truth. Now: A [0.6062, 0.6114], and 77% cover the truth (the rest is the bias of R0 = first value, and few
points), none missing its estimate.
"""

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import OptimizeWarning, curve_fit
from scipy.special import expit

from servers.core.errors import InputError
from servers.scaling.fitting import FitOutcome, NotIdentified, ParameterEstimate

if TYPE_CHECKING:
    from servers.scaling.limits import FitTask

Model = Literal["scalerl", "power_law"]
Method = Literal["robust", "scalerl-grid", "curve_fit"]
Array = NDArray[np.float64]

NAMES: dict[str, tuple[str, ...]] = {"scalerl": ("A", "B", "C_mid", "R0"), "power_law": ("A", "B", "D")}
HUBER_K = 1.5  # Huber threshold in units of the noise estimate
BOUND_TOL = 1e-3  # "A at its bound" when within this of 0 or y_max
WIDE_A = 0.1  # an interval on A wider than this times y_max: warn
UNIDENTIFIED_A = 0.5  # an interval on A wider than this share of the range A can take beyond R0: A not identified
RUN_START_FACTOR = 1.05  # runs whose first compute is within this factor of the earliest count for the R0 default

# The robust method's start grid and search box (theta = log C_mid, log B).
GRID_CMID_SPAN = 100.0  # the grid spans C_mid from min(C) / span to max(C) * span
GRID_CMID_CELLS = 48
GRID_B = np.geomspace(0.3, 5.0, 16)
GRID_B_POWER = np.geomspace(0.01, 5.0, 60)
SEARCH_CMID_SPAN = 1e4
SEARCH_B = (0.05, 20.0)
SEARCH_B_POWER = (0.005, 20.0)
STARTS = 3
IRLS_ROUNDS = 1000  # Huber reweighting rounds at most (IRLS converges linearly: slowly when many residuals lie
# beyond c and B and C_mid are strongly correlated; tiny-grpo resamples have needed up to ~600)
CHUNK_CELLS = 1_000_000  # rows x points per batch of the vectorised solvers (about 8 MB per array)

# The ScaleRL paper's grid.
PAPER_A = np.round(np.arange(0.450, 0.8 + 1e-9, 0.005), 3)
PAPER_CMID = np.linspace(100.0, 40000.0, 100)
PAPER_VERIFY = 5
GRID_DATA_SPAN = 4.0  # off the paper's range, the C_mid grid spans the data's compute up to this times its largest
NOISE_FACTOR = 4.0  # a fit whose robust residual SD exceeds this times the data's noise does not describe them


# --------------------------------------------------------------------------------------------- model evaluation


def predict(model: Model, params: dict[str, float], compute: ArrayLike) -> Array:
    """The curve of `model` with `params` (names as in laws.py) at `compute` (any shape), vectorised."""
    c = np.asarray(compute, dtype=float)
    if model == "scalerl":
        s = expit(params["B"] * (np.log(c) - math.log(params["C_mid"])))
        return params["R0"] + (params["A"] - params["R0"]) * s
    if model == "power_law":
        return params["A"] - params["D"] * c ** (-params["B"])
    raise InputError(f"unknown model {model!r}; use 'scalerl' or 'power_law'")


# --------------------------------------------------------------------------------------------- data


@dataclass
class _Data:
    compute: Array
    x: Array  # log compute
    y: Array
    runs: list[NDArray[np.intp]]  # indices of each run, sorted by compute
    sigma: float  # model-free noise estimate
    names: list[str]  # each run's label ("" when the points carry none)


def _prepare(compute: ArrayLike, value: ArrayLike, runs: ArrayLike | None) -> _Data:
    c = np.asarray(compute, dtype=float).ravel()
    y = np.asarray(value, dtype=float).ravel()
    if c.shape != y.shape:
        raise InputError(f"compute and value must have the same length (got {c.size} and {y.size})")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(y))):
        raise InputError("compute and value must be finite numbers")
    if np.any(c <= 0):
        raise InputError("compute must be > 0 at every point")
    names, labels = _run_labels(runs, c.size)
    groups = []
    for label in range(len(names)):
        idx = np.nonzero(labels == label)[0]
        groups.append(idx[np.argsort(c[idx], kind="stable")])
    return _Data(compute=c, x=np.log(c), y=y, runs=groups, sigma=_noise_sigma(y, groups), names=names)


def _run_labels(runs: ArrayLike | None, n: int) -> tuple[list[str], NDArray[np.intp]]:
    """The distinct run labels (as text, sorted) and each point's index into them."""
    if runs is None:
        return [""], np.zeros(n, dtype=np.intp)
    r = np.asarray(runs).ravel()
    if r.size != n:
        raise InputError(f"runs must label every point (got {r.size} labels for {n} points)")
    names, labels = np.unique(r.astype(str), return_inverse=True)
    return [str(v) for v in names], labels.astype(np.intp).ravel()


def _noise_sigma(y: Array, groups: list[NDArray[np.intp]]) -> float:
    """Noise SD from second differences along each run (robust: MAD); the smooth curve contributes little."""
    d2 = [np.diff(y[g], 2) for g in groups if g.size >= 3]
    if d2 and sum(d.size for d in d2) >= 2:
        d = np.concatenate(d2)
        sigma = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(6.0)
    else:
        d1 = [np.diff(y[g]) for g in groups if g.size >= 2]
        d = np.concatenate(d1) if d1 else np.zeros(1)
        sigma = 1.4826 * float(np.median(np.abs(d))) / math.sqrt(2.0)
    floor = 1e-6 * max(1.0, float(np.max(np.abs(y))))
    return max(sigma, floor)


def start_points(compute: ArrayLike, value: ArrayLike, runs: ArrayLike | None = None) -> list[tuple[str, float, float]]:
    """The points the default R0 is taken from: (run, compute, value) of each run's first point (its smallest
    compute), for the runs that start within RUN_START_FACTOR (5%) of the earliest start; a run that starts later
    does not say where the curve starts. Sorted by run label. The one definition of the default R0: the fit and the
    scaling server both use it (the server passes every point of the runs, those left out by min_compute too)."""
    c = np.asarray(compute, dtype=float).ravel()
    y = np.asarray(value, dtype=float).ravel()
    if c.size == 0 or c.size != y.size:
        raise InputError(f"R0 needs points: compute and value of the same length (got {c.size} and {y.size})")
    names, labels = _run_labels(runs, c.size)
    firsts = []
    for label, name in enumerate(names):
        idx = np.nonzero(labels == label)[0]
        i = int(idx[np.argmin(c[idx])])  # the first of equal smallest computes
        firsts.append((name, float(c[i]), float(y[i])))
    earliest = min(f[1] for f in firsts)
    return [f for f in firsts if f[1] <= earliest * RUN_START_FACTOR]


def default_r0(compute: ArrayLike, value: ArrayLike, runs: ArrayLike | None = None) -> float:
    """R0 by default: the mean of the start_points' values (each early-starting run's first value)."""
    starts = start_points(compute, value, runs)
    return float(np.mean([v for _, _, v in starts]))


# --------------------------------------------------------------------------------------------- variable projection


@dataclass
class _Spec:
    """One model with its fixed parameters: the linear columns as functions of theta, and their bounds."""

    model: Model
    names: tuple[str, ...]
    k: int  # nonlinear parameters
    lin_lo: Array
    lin_hi: Array
    theta_lo: Array
    theta_hi: Array
    offset: float  # subtracted from the values (the fixed R0)
    r0: float | None  # the fixed R0 (None when fitted or not in the model)
    xref: float  # log reference compute of the power law's column
    grid: Array  # start grid over theta, shape (cells, k)
    grid_shape: tuple[int, ...]

    @property
    def free(self) -> int:
        return self.k + self.lin_lo.size

    def columns(self, theta: Array, x: Array) -> Array:
        """Linear columns, shape (m, n, p), for theta of shape (m, k)."""
        b = np.exp(theta[:, -1])[:, None]
        if self.model == "power_law":
            col = -np.exp(-b * (x[None, :] - self.xref))
            return np.stack([np.ones_like(col), col], axis=2)
        s = expit(b * (x[None, :] - theta[:, 0][:, None]))
        if self.r0 is not None:
            return s[:, :, None]
        return np.stack([1.0 - s, s], axis=2)

    def params(self, theta: Array, lin: Array, r0: float | None = None) -> dict[str, float]:
        """The named parameters; r0 replaces the spec's fixed R0 (a bootstrap resample's own)."""
        b = float(np.exp(theta[-1]))
        if self.model == "power_law":
            scale = b * self.xref  # D = lin1 e^(B xref); infinite when that overflows (the caller refuses it)
            d = float(lin[1]) * math.exp(scale) if scale < 700.0 or lin[1] == 0 else math.inf
            return {"A": float(lin[0]), "B": b, "D": d}
        cmid = float(np.exp(theta[0]))
        if self.r0 is not None:
            base = self.r0 if r0 is None else r0
            return {"A": float(base + lin[0]), "B": b, "C_mid": cmid, "R0": float(base)}
        return {"A": float(lin[1]), "B": b, "C_mid": cmid, "R0": float(lin[0])}

    def theta_of(self, params: dict[str, float]) -> Array:
        if self.model == "power_law":
            return np.array([math.log(params["B"])])
        return np.array([math.log(params["C_mid"]), math.log(params["B"])])


def _spec(model: Model, data: _Data, r0: float | None, y_max: float) -> _Spec:
    xmin, xmax = float(data.x.min()), float(data.x.max())
    if model == "power_law":
        grid = np.log(GRID_B_POWER)[:, None]
        return _Spec(
            model=model,
            names=NAMES[model],
            k=1,
            lin_lo=np.array([-np.inf, 0.0]),
            lin_hi=np.array([np.inf, np.inf]),
            theta_lo=np.log([SEARCH_B_POWER[0]]),
            theta_hi=np.log([SEARCH_B_POWER[1]]),
            offset=0.0,
            r0=None,
            xref=0.5 * (xmin + xmax),
            grid=grid,
            grid_shape=(grid.shape[0],),
        )
    lc = np.linspace(xmin - math.log(GRID_CMID_SPAN), xmax + math.log(GRID_CMID_SPAN), GRID_CMID_CELLS)
    lb = np.log(GRID_B)
    grid = np.stack(np.meshgrid(lc, lb, indexing="ij"), axis=-1).reshape(-1, 2)
    span = math.log(SEARCH_CMID_SPAN)
    if r0 is None:
        lin_lo, lin_hi, offset = np.array([0.0, 0.0]), np.array([y_max, y_max]), 0.0
    else:
        lin_lo, lin_hi, offset = np.array([-r0]), np.array([y_max - r0]), r0
    return _Spec(
        model=model,
        names=NAMES[model],
        k=2,
        lin_lo=lin_lo,
        lin_hi=lin_hi,
        theta_lo=np.array([xmin - span, math.log(SEARCH_B[0])]),
        theta_hi=np.array([xmax + span, math.log(SEARCH_B[1])]),
        offset=offset,
        r0=r0,
        xref=0.0,
        grid=grid,
        grid_shape=(lc.size, lb.size),
    )


def _box_ls(X: Array, Y: Array, W: Array, lo: Array, hi: Array) -> Array:  # noqa: N803 - matrix names
    """Weighted least squares min sum W (Y - X c)^2 subject to lo <= c <= hi, for p = 1 or 2 columns, batched.

    X (m, n, p), Y and W (m, n), lo and hi (p,) or (m, p) (bounds per row); returns c (m, p). Exact: the minimum
    of a convex quadratic on a box is the interior solution if feasible, else the best of the (clipped) optima on
    the box's edges."""
    m = X.shape[0]
    lo = np.broadcast_to(lo, (m, X.shape[2]))
    hi = np.broadcast_to(hi, (m, X.shape[2]))
    XW = X * W[:, :, None]  # noqa: N806
    G = np.einsum("mnp,mnq->mpq", XW, X)  # noqa: N806
    b = np.einsum("mnp,mn->mp", XW, Y)
    tiny = 1e-300
    if X.shape[2] == 1:
        g = G[:, 0, 0]
        c = np.where(g > tiny, b[:, 0] / np.where(g > tiny, g, 1.0), 0.0)
        return np.clip(c, lo[:, 0], hi[:, 0])[:, None]
    g00, g01, g11 = G[:, 0, 0], G[:, 0, 1], G[:, 1, 1]
    b0, b1 = b[:, 0], b[:, 1]
    det = g00 * g11 - g01 * g01
    ok = det > 1e-13 * g00 * g11 + tiny
    safe = np.where(ok, det, 1.0)
    u0 = (g11 * b0 - g01 * b1) / safe
    u1 = (g00 * b1 - g01 * b0) / safe

    def quad(c0: Array, c1: Array) -> Array:
        return g00 * c0 * c0 + 2.0 * g01 * c0 * c1 + g11 * c1 * c1 - 2.0 * (b0 * c0 + b1 * c1)

    feasible = ok & (u0 >= lo[:, 0]) & (u0 <= hi[:, 0]) & (u1 >= lo[:, 1]) & (u1 <= hi[:, 1])
    cands0, cands1 = [np.where(feasible, u0, 0.0)], [np.where(feasible, u1, 0.0)]
    scores = [np.where(feasible, quad(cands0[0], cands1[0]), np.inf)]
    for v in (lo[:, 0], hi[:, 0]):
        edge = np.isfinite(v)
        if np.any(edge):
            v = np.where(edge, v, 0.0)
            c1 = np.clip(np.where(g11 > tiny, (b1 - g01 * v) / np.where(g11 > tiny, g11, 1.0), 0.0), lo[:, 1], hi[:, 1])
            cands0.append(v), cands1.append(c1), scores.append(np.where(edge, quad(v, c1), np.inf))
    for v in (lo[:, 1], hi[:, 1]):
        edge = np.isfinite(v)
        if np.any(edge):
            v = np.where(edge, v, 0.0)
            c0 = np.clip(np.where(g00 > tiny, (b0 - g01 * v) / np.where(g00 > tiny, g00, 1.0), 0.0), lo[:, 0], hi[:, 0])
            cands0.append(c0), cands1.append(v), scores.append(np.where(edge, quad(c0, v), np.inf))
    best = np.argmin(np.stack(scores), axis=0)
    rows = np.arange(m)
    return np.stack([np.stack(cands0)[best, rows], np.stack(cands1)[best, rows]], axis=1)


Bounds = tuple[Array, Array] | None  # per-row bounds (lo, hi) of the linear parameters, each (m, p); None: spec's


def _rows(bounds: Bounds, rows: NDArray[np.intp] | slice) -> Bounds:
    return None if bounds is None else (bounds[0][rows], bounds[1][rows])


def _project(spec: _Spec, theta: Array, x: Array, Y: Array, W: Array, bounds: Bounds = None) -> tuple[Array, Array]:  # noqa: N803
    """Linear parameters (m, p) and residuals (m, n) at theta (m, k), for targets Y (values minus the offset)."""
    X = spec.columns(theta, x)  # noqa: N806
    lo, hi = (spec.lin_lo, spec.lin_hi) if bounds is None else bounds
    lin = _box_ls(X, Y, W, lo, hi)
    return lin, Y - np.einsum("mnp,mp->mn", X, lin)


def _huber(r: Array, c: float) -> Array:
    a = np.abs(r)
    return np.where(a <= c, 0.5 * r * r, c * a - 0.5 * c * c)


def _huber_weights(r: Array, c: float) -> Array:
    a = np.abs(r)
    return np.where(a <= c, 1.0, c / np.maximum(a, 1e-300))


@dataclass
class _Solved:
    theta: Array  # (m, k)
    lin: Array  # (m, p)
    resid: Array  # (m, n)
    objective: Array  # (m,) Huber sum
    converged: Array  # (m,) bool
    iterations: Array  # (m,) IRLS rounds
    status: Array  # (m,) int: one of STATUS (0 converged)


# Why a solve did not converge (the index is _Solved.status).
STATUS = (
    "converged",
    "the Huber reweighting did not settle within the round limit",
    "the Levenberg-Marquardt step did not converge",
    "non-finite parameters",
)


def _lm(
    spec: _Spec,
    theta: Array,
    x: Array,
    Y: Array,  # noqa: N803
    W: Array,  # noqa: N803
    max_iter: int = 200,
    bounds: Bounds = None,
) -> tuple[Array, Array]:
    """Batched Levenberg-Marquardt on the projected, weighted residuals (W fixed). Returns theta and converged."""
    theta = np.clip(theta.copy(), spec.theta_lo, spec.theta_hi)
    m, k = theta.shape
    lam = np.full(m, 1e-3)
    _, r = _project(spec, theta, x, Y, W, bounds)
    cost = np.sum(W * r * r, axis=1)
    scale = np.sum(W * Y * Y, axis=1) + 1e-300  # an exact fit: cost below 1e-24 of this
    done = np.zeros(m, dtype=bool)
    h = 1e-7
    eye = np.eye(k)
    for _ in range(max_iter):
        act = np.nonzero(~done)[0]
        if act.size == 0:
            break
        th, ya, wa, ra, ba = theta[act], Y[act], W[act], r[act], _rows(bounds, act)
        J = np.empty((act.size, x.size, k))  # noqa: N806 - d residual / d theta
        for j in range(k):
            step = np.zeros(k)
            step[j] = h
            _, rj = _project(spec, th + step, x, ya, wa, ba)
            J[:, :, j] = (rj - ra) / h
        JW = J * wa[:, :, None]  # noqa: N806
        H = np.einsum("mnk,mnl->mkl", JW, J)  # noqa: N806
        g = np.einsum("mnk,mn->mk", JW, ra)  # half the gradient of the cost
        # MINPACK's gtol test: the cosine between the residual and every Jacobian column is ~0
        norms = np.sqrt(np.maximum(np.diagonal(H, axis1=1, axis2=2), 0.0) * cost[act][:, None])
        flat = np.all(np.abs(g) <= 1e-10 * norms + 1e-300, axis=1)
        frozen = ((th <= spec.theta_lo + 1e-12) & (g > 0)) | ((th >= spec.theta_hi - 1e-12) & (g < 0))
        diag = np.diagonal(H, axis1=1, axis2=2)
        dfloor = np.maximum(diag, 1e-12 * np.max(diag, axis=1, keepdims=True) + 1e-300)
        M = H + lam[act, None, None] * dfloor[:, :, None] * eye  # noqa: N806
        free = ~frozen
        M = M * free[:, :, None] * free[:, None, :] + frozen[:, :, None] * eye  # noqa: N806
        g = np.where(frozen, 0.0, g)
        try:
            delta = -np.linalg.solve(M, g[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            delta = -g / np.maximum(np.diagonal(M, axis1=1, axis2=2), 1e-300)
        trial = np.clip(th + delta, spec.theta_lo, spec.theta_hi)
        _, rt = _project(spec, trial, x, ya, wa, ba)
        cost_t = np.sum(wa * rt * rt, axis=1)
        c0 = cost[act]
        better = cost_t < c0
        moved = np.max(np.abs(trial - th), axis=1)
        small_gain = better & (c0 - cost_t <= 1e-12 * c0 + 1e-30)
        small_step = moved <= 1e-10 * (1.0 + np.max(np.abs(th), axis=1))
        exact = c0 <= 1e-24 * scale[act]
        theta[act] = np.where(better[:, None], trial, th)
        r[act] = np.where(better[:, None], rt, ra)
        cost[act] = np.where(better, cost_t, c0)
        lam[act] = np.where(better, lam[act] / 3.0, lam[act] * 4.0)
        done[act] = small_gain | small_step | exact | flat | (lam[act] > 1e12) | np.all(frozen, axis=1)
    return theta, done


def _chunks(rows: int, n: int) -> list[slice]:
    """Row slices of at most CHUNK_CELLS cells (rows x n) each: batched work in bounded memory. Every batched
    routine here treats its rows independently, so the results are the same as in one batch."""
    size = max(1, CHUNK_CELLS // max(n, 1))
    return [slice(lo, min(lo + size, rows)) for lo in range(0, rows, size)]


def _irls(
    spec: _Spec,
    theta0: Array,
    x: Array,
    Y: Array,  # noqa: N803
    c: float,
    max_rounds: int = IRLS_ROUNDS,
    bounds: Bounds = None,
) -> _Solved:
    """_irls_batch over chunks of rows (memory bounded by CHUNK_CELLS)."""
    parts = [
        _irls_batch(spec, theta0[sl], x, Y[sl], c, max_rounds, _rows(bounds, sl))
        for sl in _chunks(theta0.shape[0], x.size)
    ]
    if len(parts) == 1:
        return parts[0]
    return _Solved(*(np.concatenate([getattr(p, f) for p in parts]) for f in _Solved.__dataclass_fields__))


def _irls_batch(
    spec: _Spec,
    theta0: Array,
    x: Array,
    Y: Array,  # noqa: N803
    c: float,
    max_rounds: int = IRLS_ROUNDS,
    bounds: Bounds = None,
) -> _Solved:
    """Huber M-estimate by IRLS: weights from the residuals, weighted VarPro-LM, until the weights settle (or the
    objective and the parameters stop moving: IRLS is slow, linear, when many residuals lie beyond c)."""
    m = theta0.shape[0]
    theta = np.clip(theta0.copy(), spec.theta_lo, spec.theta_hi)
    lin, r = _project(spec, theta, x, Y, np.ones_like(Y), bounds)
    W = _huber_weights(r, c)  # noqa: N806
    objective = np.sum(_huber(r, c), axis=1)
    lm_ok = np.zeros(m, dtype=bool)
    settled = np.zeros(m, dtype=bool)
    rounds = np.zeros(m, dtype=int)
    for _ in range(max_rounds):
        act = np.nonzero(~settled)[0]
        if act.size == 0:
            break
        ba = _rows(bounds, act)
        th, ok = _lm(spec, theta[act], x, Y[act], W[act], bounds=ba)
        la, ra = _project(spec, th, x, Y[act], W[act], ba)
        obj = np.sum(_huber(ra, c), axis=1)
        w_new = _huber_weights(ra, c)
        still = (
            (np.abs(objective[act] - obj) <= 1e-10 * np.abs(obj) + 1e-300)
            & (np.max(np.abs(th - theta[act]), axis=1) <= 1e-8)
            & (np.max(np.abs(la - lin[act]), axis=1) <= 1e-8 * (1.0 + np.max(np.abs(la), axis=1)))
        )
        settled[act] = ok & ((np.max(np.abs(w_new - W[act]), axis=1) < 1e-6) | still)
        theta[act], lin[act], lm_ok[act], objective[act] = th, la, ok, obj
        W[act] = w_new
        rounds[act] += 1
    lin, r = _project(spec, theta, x, Y, W, bounds)
    objective = np.sum(_huber(r, c), axis=1)
    finite = np.all(np.isfinite(theta), axis=1) & np.all(np.isfinite(lin), axis=1)
    good = lm_ok & settled & finite
    status = np.where(good, 0, np.where(~finite, 3, np.where(~lm_ok, 2, 1)))
    return _Solved(theta, lin, r, objective, good, rounds, status)


def _grid_starts(spec: _Spec, data: _Data, c: float) -> Array:
    """The best grid local minima (up to STARTS) of the Huber objective of the projected residuals."""
    obj = np.empty(spec.grid.shape[0])
    for sl in _chunks(spec.grid.shape[0], data.y.size):
        cells = spec.grid[sl]
        Y = np.broadcast_to(data.y - spec.offset, (cells.shape[0], data.y.size))  # noqa: N806
        _, r = _project(spec, cells, data.x, Y, np.ones_like(Y))
        obj[sl] = np.sum(_huber(r, c), axis=1)
    obj = np.where(np.isfinite(obj), obj, np.inf)
    grid = obj.reshape(spec.grid_shape)
    padded = np.pad(grid, 1, constant_values=np.inf)
    is_min = np.ones(grid.shape, dtype=bool)
    for shift in np.ndindex(*(3,) * grid.ndim):
        if all(s == 1 for s in shift):
            continue
        sl = tuple(slice(s, s + n) for s, n in zip(shift, grid.shape, strict=True))
        is_min &= grid <= padded[sl]
    candidates = np.nonzero(is_min.ravel())[0]
    order = candidates[np.argsort(obj[candidates], kind="stable")]
    if order.size == 0:
        order = np.array([int(np.argmin(obj))])
    return spec.grid[order[:STARTS]]


def _fit_robust(spec: _Spec, data: _Data) -> tuple[dict[str, float], float, bool, str, _Solved]:
    c = HUBER_K * data.sigma
    starts = _grid_starts(spec, data, c)
    Y = np.broadcast_to(data.y - spec.offset, (starts.shape[0], data.y.size)).copy()  # noqa: N806
    solved = _irls(spec, starts, data.x, Y, c)
    score = np.where(solved.converged, solved.objective, solved.objective + 1e300)
    i = int(np.argmin(score))
    best = _Solved(
        solved.theta[i : i + 1],
        solved.lin[i : i + 1],
        solved.resid[i : i + 1],
        solved.objective[i : i + 1],
        solved.converged[i : i + 1],
        solved.iterations[i : i + 1],
        solved.status[i : i + 1],
    )
    ok = bool(best.converged[0])
    message = (
        f"Huber IRLS (c = {c:.3g}, {HUBER_K} x noise SD {data.sigma:.3g}) with variable projection, "
        f"{starts.shape[0]} grid start(s): "
        + (f"converged in {int(best.iterations[0])} reweighting rounds" if ok else "did not converge")
    )
    return spec.params(best.theta[0], best.lin[0]), float(best.objective[0]), ok, message, best


# --------------------------------------------------------------------------------------------- the paper's grid


def _sse(r: Array) -> Array:
    return np.sum(r * r, axis=-1)


def _grid_b_vectorised(x: Array, y: Array, r0: float, a: Array, lc: Array, max_iter: int = 100) -> tuple[Array, Array]:
    """For every cell (A - R0 = a, log C_mid = lc), the least-squares B > 0 from B = 1 (damped Gauss-Newton), in
    chunks of cells of bounded memory."""
    b, cost = np.empty(a.size), np.empty(a.size)
    for sl in _chunks(a.size, x.size):
        b[sl], cost[sl] = _grid_b_batch(x, y, r0, a[sl], lc[sl], max_iter)
    return b, cost


def _grid_b_batch(x: Array, y: Array, r0: float, a: Array, lc: Array, max_iter: int) -> tuple[Array, Array]:
    m = a.size
    b = np.ones(m)
    lam = np.full(m, 1e-3)
    yt = (y - r0)[None, :]
    u = x[None, :] - lc[:, None]

    def resid(bb: Array) -> Array:
        return yt - a[:, None] * expit(bb[:, None] * u)

    r = resid(b)
    cost = _sse(r)
    done = np.zeros(m, dtype=bool)
    for _ in range(max_iter):
        act = np.nonzero(~done)[0]
        if act.size == 0:
            break
        s = expit(b[act, None] * u[act])
        d = a[act, None] * s * (1.0 - s) * u[act]  # d model / d B
        hess = np.sum(d * d, axis=1)
        grad = np.sum(d * r[act], axis=1)
        step = grad / np.maximum(hess * (1.0 + lam[act]), 1e-300)
        trial = np.maximum(b[act] + step, 1e-9)
        rt = yt - a[act, None] * expit(trial[:, None] * u[act])
        ct = _sse(rt)
        better = ct < cost[act]
        gain = cost[act] - ct
        b[act] = np.where(better, trial, b[act])
        r[act] = np.where(better[:, None], rt, r[act])
        cost[act] = np.where(better, ct, cost[act])
        lam[act] = np.where(better, lam[act] / 3.0, lam[act] * 4.0)
        done[act] = (better & (gain <= 1e-12 * cost[act] + 1e-30)) | (lam[act] > 1e10) | (hess <= 1e-300)
    return b, cost


def _grid_b_curve_fit(x: Array, y: Array, r0: float, a: float, lc: float) -> tuple[float, float, bool, str]:
    """One cell's B by scipy's curve_fit from its default start (B = 1), B kept > 0."""
    compute = np.exp(x)
    cmid = math.exp(lc)

    def f(cc: Array, bb: float) -> Array:
        return r0 + a / (1.0 + (cmid / cc) ** bb)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            popt, *_ = curve_fit(f, compute, y, p0=[1.0], bounds=(0.0, np.inf))
        b = float(popt[0])
        return b, float(_sse(y - f(compute, b))), True, "curve_fit converged"
    except (RuntimeError, ValueError, OptimizeWarning) as err:
        return 1.0, float(_sse(y - f(compute, 1.0))), False, f"curve_fit failed: {err}"


def _paper_cmid_grid(x: Array) -> Array:
    """The C_mid values of the ScaleRL grid for data at log compute x: the paper's 100 linearly spaced values in
    [100, 40000] (GPU-hours) when that range meets the data's compute range; otherwise (FLOPs, or another unit) the
    paper's grid would lie wholly outside the data, so the same 100 linearly spaced values span the data's range
    instead, from its smallest compute to 4 times its largest."""
    cmin, cmax = math.exp(float(x.min())), math.exp(float(x.max()))
    if cmax >= PAPER_CMID[0] and cmin <= PAPER_CMID[-1]:
        return PAPER_CMID
    return np.linspace(cmin, GRID_DATA_SPAN * cmax, PAPER_CMID.size)


def _fit_paper_grid(
    x: Array,
    y: Array,
    r0: float,
    y_max: float,
    a_grid: Array = PAPER_A,
    cmid_grid: Array | None = None,
    verify: int = PAPER_VERIFY,
) -> tuple[dict[str, float], float, bool, str]:
    cmid_grid = _paper_cmid_grid(x) if cmid_grid is None else cmid_grid
    a_values = a_grid[a_grid <= y_max + 1e-12]
    if a_values.size == 0:
        raise InputError(f"the ScaleRL grid's A values ({a_grid[0]:g}..{a_grid[-1]:g}) all exceed y_max={y_max:g}")
    aa, cc = np.meshgrid(a_values, cmid_grid, indexing="ij")
    aa, cc = aa.ravel(), cc.ravel()
    lc = np.log(cc)
    _, cost = _grid_b_vectorised(x, y, r0, aa - r0, lc)
    order = np.argsort(cost, kind="stable")[: max(1, verify)]
    best: tuple[float, float, float, float, bool, str] | None = None
    for i in order:
        b, sse, ok, msg = _grid_b_curve_fit(x, y, r0, float(aa[i] - r0), float(lc[i]))
        if best is None or sse < best[0]:
            best = (sse, float(aa[i]), float(cc[i]), b, ok, msg)
    assert best is not None
    sse, a, cmid, b, ok, msg = best
    where = (
        "the paper's C_mid values 100..40000"
        if cmid_grid is PAPER_CMID
        else f"C_mid {cmid_grid[0]:.3g}..{cmid_grid[-1]:.3g} (the paper's 100..40000 GPU-hours lies outside the data's "
        "compute, so the grid follows the data)"
    )
    message = (
        f"ScaleRL grid: {a_values.size} A x {cmid_grid.size} C_mid cells ({where}), B per cell by least squares "
        f"from B = 1 (vectorised), the best {len(order)} refitted with scipy curve_fit; {msg}"
    )
    return {"A": a, "B": b, "C_mid": cmid, "R0": r0}, sse, ok, message


# --------------------------------------------------------------------------------------------- plain curve_fit


def _model_function(model: Model, r0: float | None) -> tuple[Callable[..., Array], tuple[str, ...]]:
    if model == "power_law":

        def power(cc: Array, a: float, b: float, d: float) -> Array:
            return a - d * cc ** (-b)

        return power, ("A", "B", "D")
    if r0 is None:

        def free(cc: Array, a: float, b: float, cmid: float, rr: float) -> Array:
            return rr + (a - rr) / (1.0 + (cmid / cc) ** b)

        return free, ("A", "B", "C_mid", "R0")

    def fixed(cc: Array, a: float, b: float, cmid: float) -> Array:
        return r0 + (a - r0) / (1.0 + (cmid / cc) ** b)

    return fixed, ("A", "B", "C_mid")


def _fit_curve_fit(
    model: Model, r0: float | None, compute: Array, y: Array, p0: dict[str, float] | None = None
) -> tuple[dict[str, float], float, bool, str]:
    f, names = _model_function(model, r0)
    start = [1.0] * len(names) if p0 is None else [p0[n] for n in names]

    def assemble(values: list[float]) -> dict[str, float]:
        out = dict(zip(names, (float(v) for v in values), strict=True))
        if model == "scalerl" and r0 is not None:
            out["R0"] = float(r0)
        return out

    def sse_at(values: list[float]) -> float:
        with np.errstate(all="ignore"):
            sse = float(_sse(y - f(compute, *values)))
        return sse if math.isfinite(sse) else math.inf

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            popt, _, _, mesg, ier = curve_fit(f, compute, y, p0=start, full_output=True)
    except (RuntimeError, ValueError, OptimizeWarning, FloatingPointError) as err:
        note = "the parameters shown are its starting point, not an estimate"
        return assemble(start), sse_at(start), False, f"curve_fit failed: {err} ({note})"
    params = assemble(list(popt))
    if not all(math.isfinite(v) for v in params.values()):
        note = "the parameters shown are its starting point, not an estimate"
        return assemble(start), sse_at(start), False, f"curve_fit ended at non-finite parameters: {mesg} ({note})"
    sse = sse_at(list(popt))
    valid = params["B"] > 0 and (model != "scalerl" or params["C_mid"] > 0) and math.isfinite(sse)
    if not valid:
        return params, sse, False, f"curve_fit ended outside the model's domain ({_describe(params)}): {mesg}"
    return params, sse, ier in (1, 2, 3, 4), f"curve_fit (ier={ier}): {mesg}"


def _describe(params: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in params.items())


# --------------------------------------------------------------------------------------------- bootstrap


def _block_indices(rng: np.random.Generator, groups: list[NDArray[np.intp]], n: int, draws: int) -> NDArray[np.intp]:
    """(draws, n) source indices: within each run, circular blocks of length ~ n_run^(1/3) of its sorted points,
    starting at uniformly drawn positions and wrapping past the run's last point to its first, so that every point
    is drawn equally often at every position (plain moving blocks under-draw a run's two ends)."""
    out = np.empty((draws, n), dtype=np.intp)
    for g in groups:
        size = g.size
        length = max(1, round(size ** (1.0 / 3.0)))
        blocks = math.ceil(size / length)
        starts = rng.integers(0, size, size=(draws, blocks))
        pos = ((starts[:, :, None] + np.arange(length)[None, None, :]) % size).reshape(draws, -1)[:, :size]
        out[:, g] = g[pos]
    return out


@dataclass
class _Resamples:
    y: Array  # (draws, n) resampled values
    r0: Array | None  # (draws,) the default R0 of each resample (None when R0 is given, fitted, or absent)


def _resample(
    rng: np.random.Generator,
    model: Model,
    data: _Data,
    params: dict[str, float],
    free: int,
    draws: int,
    starts: list[tuple[str, float, float]] | None,
) -> _Resamples:
    """Resampled data sets from the full-data fit (see the module docstring): the fitted curve, plus each run's
    centred residuals in circular blocks, plus a run offset drawn from the runs' centred offsets (two runs or more);
    and, when R0 came from the data (`starts`), the same rule applied to each resample's start values."""
    fitted = predict(model, params, data.compute)
    n = data.y.size
    # Fitted residuals are smaller than the noise by about sqrt((n - p) / n); scale them back up.
    resid = (data.y - fitted) * math.sqrt(n / max(n - free, 1))
    offsets = np.array([float(np.mean(resid[g])) for g in data.runs])
    noise = resid.copy()
    for g, o in zip(data.runs, offsets, strict=True):
        noise[g] -= o  # centred within each run: the resampled noise has mean zero wherever it lands
    ystar = fitted[None, :] + noise[_block_indices(rng, data.runs, n, draws)]
    shift = np.zeros((draws, len(data.runs)))
    if len(data.runs) >= 2:  # run-to-run variation: each run's offset drawn from the runs' centred offsets
        centred = offsets - offsets.mean()
        shift = centred[rng.integers(0, len(data.runs), size=(draws, len(data.runs)))]
        for j, g in enumerate(data.runs):
            ystar[:, g] += shift[:, j : j + 1]
    if starts is None:
        return _Resamples(ystar, None)
    # Each start value as observed plus the noise the resample put there: R0 varies as the noisy first values do,
    # centred on the estimate's R0 (the fitted curve at a start point is not R0, so taking the resampled value
    # itself would shift every resample's R0 the same way, and every refit with it).
    where = {(data.names[j], float(data.compute[i])): int(i) for j, g in enumerate(data.runs) for i in g}
    run_of = {name: j for j, name in enumerate(data.names)}
    values = np.empty((draws, len(starts)))
    for s, (name, c, v) in enumerate(starts):
        i = where.get((name, c))
        if i is not None:  # a fitted point: the noise the resample put there
            values[:, s] = v + ystar[:, i] - fitted[i]
            continue
        # a start point the fit left out (below min_compute): its run's resampled offset and a draw of its noise
        j = run_of.get(name)
        pool = noise if j is None else noise[data.runs[j]]
        values[:, s] = v + (0.0 if j is None else shift[:, j]) + pool[rng.integers(0, pool.size, size=draws)]
    return _Resamples(ystar, values.mean(axis=1))


def _bootstrap(
    method: Method,
    model: Model,
    spec: _Spec,
    data: _Data,
    params: dict[str, float],
    r0_fixed: float | None,
    starts: list[tuple[str, float, float]] | None,
    y_max: float,
    draws: int,
    seed: int,
) -> tuple[list[dict[str, float]], dict[str, int]]:
    """The refitted parameters of `draws` resamples, and the refits left out, counted by reason."""
    rng = np.random.default_rng(seed)
    rs = _resample(rng, model, data, params, spec.free, draws, starts)
    r0s = rs.r0 if rs.r0 is not None else None if r0_fixed is None else np.full(draws, r0_fixed)
    out: list[dict[str, float] | None] = []
    failed: dict[str, int] = {}

    def fail(reason: str) -> None:
        failed[reason] = failed.get(reason, 0) + 1
        out.append(None)

    if method == "robust":
        theta0 = np.broadcast_to(spec.theta_of(params), (draws, spec.k))
        Y, bounds = rs.y - spec.offset, None  # noqa: N806
        if rs.r0 is not None:  # each resample's own R0: its offset and the bounds of A - R0
            Y, bounds = rs.y - rs.r0[:, None], ((-rs.r0)[:, None], (y_max - rs.r0)[:, None])  # noqa: N806
        solved = _irls(spec, theta0, data.x, Y, HUBER_K * data.sigma, bounds=bounds)
        for i in range(draws):
            if solved.converged[i]:
                out.append(spec.params(solved.theta[i], solved.lin[i], None if r0s is None else float(r0s[i])))
            else:
                fail(STATUS[int(solved.status[i])])
    elif method == "scalerl-grid":
        assert r0s is not None
        for i in range(draws):
            p, _, ok, _ = _fit_paper_grid(data.x, rs.y[i], float(r0s[i]), y_max)
            out.append(p) if ok else fail("curve_fit did not converge in the grid's best cells")
    else:
        for i in range(draws):
            r0_i = None if r0s is None else float(r0s[i])
            p, _, ok, _ = _fit_curve_fit(model, r0_i, data.compute, rs.y[i], p0=params)
            out.append(p) if ok else fail("curve_fit did not converge")
    kept: list[dict[str, float]] = []
    for d in out:
        if d is None:
            continue
        if all(math.isfinite(v) for v in d.values()):
            kept.append(d)
        else:
            failed[STATUS[3]] = failed.get(STATUS[3], 0) + 1
    return kept, failed


def _interval(values: Array, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


# --------------------------------------------------------------------------------------------- entry point


def fit_sigmoid(
    compute: ArrayLike,
    value: ArrayLike,
    runs: ArrayLike | None = None,
    *,
    model: Model = "scalerl",
    method: Method = "robust",
    r0: float | None = None,
    r0_from: tuple[ArrayLike, ArrayLike, ArrayLike | None] | None = None,
    free_r0: bool = False,
    y_max: float = 1.0,
    bootstrap: int = 200,
    seed: int = 0,
    level: float = 0.95,
) -> FitOutcome:
    """Fit the ScaleRL sigmoid (or the power law) of a metric against compute; see the module docstring.

    compute, value: 1-D, finite, compute > 0, any order; runs: optional run label per point (seeds of one recipe,
    fitted as one curve). r0_from: (compute, value, runs) of the points the default R0 is taken from (start_points),
    when they are not the fitted points (the server passes the points below min_compute too). level: coverage of
    the parameters' intervals. For model "power_law", r0, r0_from and free_r0 do not apply and are ignored."""
    started = time.perf_counter()
    if model not in NAMES:
        raise InputError(f"unknown model {model!r}; use 'scalerl' or 'power_law'")
    if method not in ("robust", "scalerl-grid", "curve_fit"):
        raise InputError(f"unknown method {method!r}; use 'robust', 'scalerl-grid' or 'curve_fit'")
    if not (math.isfinite(y_max) and y_max > 0):
        raise InputError(f"y_max must be a finite number > 0, got {y_max}")
    if bootstrap < 0:
        raise InputError(f"bootstrap must be >= 0, got {bootstrap}")
    if not (math.isfinite(level) and 0.0 < level < 1.0):
        raise InputError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {level}")
    if method == "scalerl-grid" and model != "scalerl":
        raise InputError("method 'scalerl-grid' is the ScaleRL paper's procedure for model 'scalerl'; use 'robust'")
    data = _prepare(compute, value, runs)

    r0_fixed: float | None = None
    starts: list[tuple[str, float, float]] | None = None  # where R0 came from, when from the data
    r0_note: str | None = None
    if model == "scalerl":
        if free_r0 and r0 is not None:
            raise InputError("r0 fixes R0 and free_r0=True fits it: give one or the other")
        if r0_from is not None and (r0 is not None or free_r0):
            raise InputError("r0_from says where the default R0 comes from: it does not combine with r0 or free_r0")
        if free_r0 and method == "scalerl-grid":
            raise InputError("method 'scalerl-grid' fixes R0 as the paper does; use method 'robust' to fit R0")
        if r0 is not None and not math.isfinite(r0):
            raise InputError(f"r0 must be a finite number, got {r0}")
        if r0 is not None:
            r0_fixed, r0_note = float(r0), "held at the value given"
        elif not free_r0:
            starts = start_points(*r0_from) if r0_from is not None else start_points(data.compute, data.y, runs)
            r0_fixed = float(np.mean([v for _, _, v in starts]))
            r0_note = (
                f"held at the mean of {len(starts)} run(s)' first value(s); each bootstrap resample takes its own "
                "R0 by the same rule, so the intervals include R0's uncertainty"
            )
    spec = _spec(model, data, r0_fixed, y_max)

    n = data.y.size
    distinct = np.unique(data.compute).size
    if n < spec.free or distinct < spec.free:
        raise InputError(
            f"{model} with {spec.free} free parameters needs at least {spec.free} points at distinct compute values "
            f"(got {n} points at {distinct} distinct compute values)"
        )

    if method == "robust":
        params, objective, converged, message, _ = _fit_robust(spec, data)
    elif method == "scalerl-grid":
        assert r0_fixed is not None
        params, objective, converged, message = _fit_paper_grid(data.x, data.y, r0_fixed, y_max)
    else:
        params, objective, converged, message = _fit_curve_fit(model, r0_fixed, data.compute, data.y)

    f, names = _model_function(model, r0_fixed)
    with np.errstate(all="ignore"):
        residual = data.y - f(data.compute, *[params[k] for k in names])
    rmse = float(np.sqrt(np.mean(residual * residual)))
    spread = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))  # robust residual SD
    if not math.isfinite(rmse):
        rmse = math.inf
    floor = max(NOISE_FACTOR * data.sigma, BOUND_TOL * y_max, 0.005 if method == "scalerl-grid" else 0.0)
    size = 1.4826 * float(np.median(np.abs(residual)))  # robust residual size about zero: an offset counts
    misfit = size > floor  # the grid's A step (0.005) bounds how close it can get
    if converged and misfit and method != "robust":
        converged = False
        message += (
            f"; but the fit leaves residuals of robust size {size:.3g}, {size / data.sigma:.0f} times the data's noise "
            f"({data.sigma:.3g}): it is not a fit of these data, so it is not reported as converged"
        )

    draws: list[dict[str, float]] = []
    failed: dict[str, int] = {}
    run = bootstrap if converged else 0  # the estimates of a fit that did not converge are not bootstrapped
    if run > 0:
        draws, failed = _bootstrap(method, model, spec, data, params, r0_fixed, starts, y_max, run, seed)

    fixed = {"R0"} if (model == "scalerl" and r0_fixed is not None) else set()
    parameters: dict[str, ParameterEstimate] = {}
    for name in NAMES[model]:
        low = high = None
        if draws and name not in fixed:
            low, high = _interval(np.array([d[name] for d in draws]), level)
        parameters[name] = ParameterEstimate(
            value=params[name], ci_low=low, ci_high=high, fixed=name in fixed, note=r0_note if name in fixed else None
        )

    notes = _warnings(model, method, spec, data, params, parameters, converged, message, y_max, bootstrap, spread)
    unknown = _not_identified(model, method, spec, data, params, parameters, y_max, spread) if converged else []
    if bootstrap > 0 and not converged:
        notes.append(f"No bootstrap was run ({bootstrap} resamples asked): the fit itself did not converge.")
    return FitOutcome(
        model=model,
        method=method,
        parameters=parameters,
        rmse=rmse,
        objective=float(objective) if math.isfinite(objective) else 1e308,
        converged=converged,
        message=message,
        warnings=notes,
        not_identified=unknown,
        level=level,
        bootstrap=len(draws),
        bootstrap_run=run,
        bootstrap_failed=failed,
        bootstrap_draws=draws,
        points_used=n,
        duration_s=time.perf_counter() - started,
    )


def fit_task(task: "FitTask") -> FitOutcome:
    """The fitter the registry names for scalerl and power_law (laws.py): a fit task's curve, fitted here."""
    return fit_sigmoid(
        task.compute,
        task.value,
        task.run,
        model=task.model,  # type: ignore[arg-type]
        method=task.method,  # type: ignore[arg-type]
        r0=task.r0,
        r0_from=task.r0_from,
        free_r0=task.free_r0,
        y_max=task.y_max,
        bootstrap=task.bootstrap,
        seed=task.seed,
        level=task.level,
    )


def _warnings(
    model: Model,
    method: Method,
    spec: _Spec,
    data: _Data,
    params: dict[str, float],
    parameters: dict[str, ParameterEstimate],
    converged: bool,
    message: str,
    y_max: float,
    bootstrap: int,
    spread: float,
) -> list[str]:
    out: list[str] = []
    n, free = data.y.size, spec.free
    cmax = float(data.compute.max())
    a = params["A"]
    if not converged:
        out.append(
            f"The optimiser did not converge ({message}); do not use these estimates"
            + ("; try method='robust'." if method != "robust" else "; check the data for a curve of this shape.")
        )
    if n < 3 * free:
        out.append(
            f"Only {n} points for {free} free parameters (fewer than 3 per parameter): the estimates are fragile; "
            "add evaluation points" + (" or fix R0." if model == "scalerl" and spec.r0 is None else ".")
        )
    if not converged:
        return out  # the parameters are not an estimate: warnings about their values would mislead
    if model == "scalerl":
        if a <= BOUND_TOL:
            out.append(
                f"A = {a:.4g} sits at its lower bound 0: the curve falls towards zero; check the metric's sign and "
                "that the runs are healthy."
            )
        if a >= y_max - BOUND_TOL:
            out.append(
                f"A = {a:.4g} sits at its upper bound y_max = {y_max:g}: the data ask for a higher asymptote; "
                "check y_max (the metric's maximum) or extend the run to see where it saturates."
            )
        flat, gain, values_sd = _flat(data, params, spread, y_max)
        if flat:
            out.append(
                f"The curve is nearly flat (A - R0 = {gain:.3g}; residual SD {spread:.3g} against the values' SD "
                f"{values_sd:.3g}): B and C_mid are not determined; check that the metric moves with compute before "
                "reading them."
            )
        if params["C_mid"] > cmax:
            out.append(
                f"C_mid = {params['C_mid']:.4g} lies beyond the largest observed compute ({cmax:.4g}): the curve has "
                "not bent yet, so A is weakly identified; extend the run past C_mid before trusting A."
            )
        if method == "scalerl-grid":
            if a in (float(PAPER_A[0]), float(min(PAPER_A[-1], PAPER_A[PAPER_A <= y_max + 1e-12].max()))):
                out.append(
                    f"A = {a:.3f} is at the edge of the ScaleRL grid (0.450..0.800): the true asymptote may lie "
                    "outside it; use method='robust'."
                )
            grid = _paper_cmid_grid(data.x)
            if params["C_mid"] in (float(grid[0]), float(grid[-1])):
                out.append(
                    f"C_mid = {params['C_mid']:.4g} is at the edge of the ScaleRL grid "
                    f"({grid[0]:.4g}..{grid[-1]:.4g}): use method='robust'."
                )
    elif a > y_max:
        out.append(
            f"The power law asymptote above the metric's maximum (A = {a:.4g} > y_max = {y_max:g}): a power law does "
            "not saturate, so its A is not a ceiling; use the scalerl sigmoid for the asymptote."
        )
    size = 1.4826 * float(np.median(np.abs(data.y - predict(model, params, data.compute))))
    if method == "robust" and size > max(NOISE_FACTOR * data.sigma, BOUND_TOL * y_max):
        out.append(
            f"The residuals' robust size {size:.3g} is {size / data.sigma:.0f} times the data's noise "
            f"({data.sigma:.3g}, from the values' second differences): the {model} form does not describe these "
            "points closely; read its parameters with care."
        )
    if method == "robust":
        b = params["B"]
        lo, hi = math.exp(spec.theta_lo[-1]), math.exp(spec.theta_hi[-1])
        if b <= lo * 1.001 or b >= hi * 0.999:
            out.append(
                f"B = {b:.4g} ended at the edge of its search range [{lo:g}, {hi:g}]: the points do not determine how "
                "sharply the curve bends; treat B"
                + (" and C_mid" if model == "scalerl" else " and D")
                + " as unreliable and add points around the bend."
            )
    if bootstrap > 0:  # failed refits and intervals that miss their estimate: FitOutcome's own check says so
        pa = parameters["A"]
        if pa.ci_low is not None and pa.ci_high is not None and pa.ci_high - pa.ci_low > WIDE_A * y_max:
            out.append(
                f"The interval of A is wide ({pa.ci_low:.3f} to {pa.ci_high:.3f}): these points do not pin down "
                "the asymptote; extend the run to higher compute before comparing asymptotes."
            )
    return out


def _flat(data: _Data, params: dict[str, float], spread: float, y_max: float) -> tuple[bool, float, float]:
    """Whether a scalerl curve is nearly flat: its gain within two residual SDs of zero, or the fit leaves most of
    the values' spread (robust SDs: a residual SD above 0.7 of the values' SD is an R^2 below 0.5); with the gain
    and the values' SD."""
    gain = params["A"] - params["R0"]
    values_sd = 1.4826 * float(np.median(np.abs(data.y - np.median(data.y))))
    flat = abs(gain) < max(2.0 * spread, BOUND_TOL * y_max) or spread > 0.7 * values_sd
    return flat, gain, values_sd


def _not_identified(
    model: Model,
    method: Method,
    spec: _Spec,
    data: _Data,
    params: dict[str, float],
    parameters: dict[str, ParameterEstimate],
    y_max: float,
    spread: float,
) -> list[NotIdentified]:
    """The parameters these data do not determine, and why (a converged fit): the fitted C_mid beyond the largest
    compute (no point past the midpoint: the curve has not bent, so A and C_mid trade off), an estimate or its
    interval at a search bound, A's interval over most of the range it can take beyond R0, a flat curve."""
    out: list[NotIdentified] = []

    def add(name: str, reason: str, detail: str) -> None:
        out.append(NotIdentified(parameter=name, reason=reason, detail=detail))  # type: ignore[arg-type]

    def edge(name: str, lo: float, hi: float) -> str | None:
        """How `name` (estimate or interval) touches the search range [lo, hi], in words; None when it does not."""
        p = parameters[name]
        near = [v for v in (p.value, p.ci_low, p.ci_high) if v is not None and (v <= lo * 1.001 or v >= hi * 0.999)]
        if not near:
            return None
        what = "its estimate" if near[0] == p.value else "its interval"
        return f"{what} reaches the edge of its search range [{lo:.3g}, {hi:.3g}]"

    a = params["A"]
    if model == "power_law":
        if method == "robust":
            lo, hi = math.exp(spec.theta_lo[-1]), math.exp(spec.theta_hi[-1])
            where = edge("B", lo, hi)
            if where:
                for name in ("B", "D"):
                    add(name, "at_bound", f"B: {where}; the points do not determine how fast the curve approaches A")
        return out
    cmax, r0, cmid = float(data.compute.max()), params["R0"], params["C_mid"]
    if cmid > cmax:
        detail = (
            f"the fitted C_mid {cmid:.3g} lies beyond the largest compute {cmax:.3g}: no point past the midpoint, so "
            "the curve has not bent"
        )
        add("A", "beyond_data", detail)
        add("C_mid", "beyond_data", detail)
    if a <= BOUND_TOL or a >= y_max - BOUND_TOL:
        add("A", "at_bound", f"A = {a:.4g} ended at its bound ({'0' if a <= BOUND_TOL else f'y_max = {y_max:g}'})")
    pa = parameters["A"]
    room = (y_max - r0) if a >= r0 else r0  # what A can be beyond R0: up to y_max, or down to 0
    if pa.ci_low is not None and pa.ci_high is not None and room > 0:
        width = pa.ci_high - pa.ci_low
        if width > UNIDENTIFIED_A * room:
            add(
                "A",
                "wide_interval",
                f"A's interval {pa.ci_low:.3f} to {pa.ci_high:.3f} spans {width / room:.0%} of the range A can take "
                f"({'R0 to y_max' if a >= r0 else '0 to R0'}: {min(r0, y_max if a >= r0 else 0.0):.3g} to "
                f"{max(r0, y_max if a >= r0 else 0.0):.3g})",
            )
    if method == "robust":
        searched = {
            "B": (math.exp(spec.theta_lo[-1]), math.exp(spec.theta_hi[-1])),
            "C_mid": (math.exp(spec.theta_lo[0]), math.exp(spec.theta_hi[0])),
        }
        for name, (lo, hi) in searched.items():
            where = edge(name, lo, hi)
            if where:
                add(
                    name,
                    "at_bound",
                    f"{name}: {where}; the points do not determine how sharply or where the curve bends",
                )
                if name == "B":
                    add("C_mid", "at_bound", f"B: {where}, and C_mid moves with it")
    elif method == "scalerl-grid":
        grid = _paper_cmid_grid(data.x)
        searched = {
            "A": (float(PAPER_A[0]), float(PAPER_A[PAPER_A <= y_max + 1e-12].max())),
            "C_mid": (grid[0], grid[-1]),
        }
        for name, (lo, hi) in searched.items():
            where = edge(name, lo, hi)
            if where:
                add(name, "at_bound", f"{name}: {where} (the ScaleRL grid); the true value may lie outside it")
    flat, gain, values_sd = _flat(data, params, spread, y_max)
    if flat:
        detail = f"the curve is nearly flat (A - R0 = {gain:.3g}; residual SD {spread:.3g}, values' SD {values_sd:.3g})"
        add("B", "flat", detail)
        add("C_mid", "flat", detail)
    return out
