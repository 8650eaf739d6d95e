"""The Chinchilla loss-law fitter (servers.scaling.fit_chinchilla): recovery, the robust method against a (reduced)
naive grid, the log-space LSE parameterisation, the analytic gradient, the bootstrap, warnings and refusals.
Deterministic (fixed seeds); speed is measured by benchmarks/bench_chinchilla_fit.py, not asserted here."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.scaling import laws
from servers.scaling.fit_chinchilla import (
    fit_chinchilla,
    huber_objective,
    log_loss_lse,
    objective_and_gradient,
    objective_batch,
    params_to_theta,
    predict_loss,
    start_grid,
    theta_to_params,
    varpro_starts,
)
from servers.scaling.fitting import FitOutcome

pytestmark = pytest.mark.timeout(120)

EPOCH = {"E": 1.82, "A": 482.0, "B": 2085.0, "alpha": 0.348, "beta": 0.366}  # Epoch AI replication
# Reduced start grids for tests: 3^5 = 243 starts, and 2^5 = 32 for the naive baseline (4,500 in the real method).
SMALL_GRID = start_grid(a=(0.0, 10.0, 20.0), b=(0.0, 10.0, 20.0), e=(-1.0, 0.0, 1.0), alpha=(0.0, 0.5, 1.0),
                        beta=(0.0, 0.5, 1.0))  # fmt: skip
TINY_GRID = start_grid(a=(5.0, 15.0), b=(5.0, 15.0), e=(0.0, 1.0), alpha=(0.5, 1.0), beta=(0.5, 1.0))


def runs(
    points: int = 120,
    noise: float = 0.0,
    seed: int = 0,
    n_range: tuple[float, float] = (7e7, 1.6e10),
    d_range: tuple[float, float] = (5e9, 5e11),
    params: dict[str, float] = EPOCH,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(math.log(n_range[0]), math.log(n_range[1]), points))
    d = np.exp(rng.uniform(math.log(d_range[0]), math.log(d_range[1]), points))
    loss = predict_loss(params, n, d) * np.exp(rng.normal(0.0, noise, points))
    return n, d, loss


def values(outcome: FitOutcome) -> dict[str, float]:
    return {k: v.value for k, v in outcome.parameters.items()}


def test_start_grid_is_hoffmanns_4500_starts() -> None:
    grid = start_grid()
    assert grid.shape == (4500, 5)
    assert sorted(set(grid[:, 0])) == [0, 5, 10, 15, 20, 25]
    assert sorted(set(grid[:, 2])) == [-1, -0.5, 0, 0.5, 1]
    assert sorted(set(grid[:, 3])) == sorted(set(grid[:, 4])) == [0, 0.5, 1, 1.5, 2]
    assert len({tuple(row) for row in grid}) == 4500


def test_recovers_parameters_from_noiseless_data() -> None:
    n, d, loss = runs(points=80)
    fit = fit_chinchilla(n, d, loss, bootstrap=0)
    assert isinstance(fit, FitOutcome) and fit.model == "chinchilla" and fit.method == "robust"
    got = values(fit)
    for name in ("alpha", "beta", "E"):
        assert got[name] == pytest.approx(EPOCH[name], rel=0.01), name
    for name in ("A", "B"):
        assert got[name] == pytest.approx(EPOCH[name], rel=0.05), name
    assert fit.rmse < 1e-3 and fit.objective < 1e-8
    assert fit.converged and fit.points_used == 80 and fit.duration_s > 0
    assert fit.warnings == []


def test_recovers_exponents_from_lightly_noisy_data() -> None:
    n, d, loss = runs(points=250, noise=0.002, seed=1)
    fit = fit_chinchilla(n, d, loss, bootstrap=0)
    got = values(fit)
    assert got["alpha"] == pytest.approx(EPOCH["alpha"], rel=0.04)
    assert got["beta"] == pytest.approx(EPOCH["beta"], rel=0.04)
    assert got["E"] == pytest.approx(EPOCH["E"], rel=0.02)
    assert 0.001 < fit.rmse < 0.02  # ~0.2% of a loss of ~2-3
    assert fit.bootstrap == 0 and fit.bootstrap_draws == []
    assert all(p.ci_low is None and p.ci_high is None for p in fit.parameters.values())


def test_robust_matches_or_beats_a_naive_grid() -> None:
    n, d, loss = runs(points=40, noise=0.005, seed=2)
    naive = fit_chinchilla(n, d, loss, method="naive-grid", bootstrap=0, starts=TINY_GRID)
    robust = fit_chinchilla(n, d, loss, method="robust", bootstrap=0, starts=TINY_GRID)
    assert naive.method == "naive-grid"
    assert robust.objective <= naive.objective * (1 + 1e-9)
    # The same optimum, hence the same exponents.
    assert values(robust)["alpha"] == pytest.approx(values(naive)["alpha"], rel=1e-3)
    assert values(robust)["beta"] == pytest.approx(values(naive)["beta"], rel=1e-3)
    # The reported objective is Hoffmann's: the summed Huber loss of the log residuals.
    theta = params_to_theta(values(robust))
    assert robust.objective == pytest.approx(huber_objective(theta, np.log(n), np.log(d), np.log(loss)), rel=1e-9)


def test_robust_with_a_tiny_start_grid_still_finds_the_optimum() -> None:
    # One poor grid start: the variable-projection starts carry the robust method.
    n, d, loss = runs(points=60, noise=0.002, seed=3)
    full = fit_chinchilla(n, d, loss, bootstrap=0)
    tiny = fit_chinchilla(n, d, loss, bootstrap=0, starts=np.array([[0.0, 0.0, 0.0, 2.0, 2.0]]), top_k=4)
    assert tiny.objective <= full.objective * (1 + 1e-6)


def test_lse_parameterisation_equals_the_linear_form() -> None:
    rng = np.random.default_rng(4)
    log_n = rng.uniform(15, 26, 50)
    log_d = rng.uniform(18, 30, 50)
    for params in (EPOCH, laws.CHINCHILLA_PUBLISHED, {"E": 0.5, "A": 1e6, "B": 3.0, "alpha": 1.2, "beta": 0.05}):
        theta = params_to_theta(params)
        lse = log_loss_lse(theta, log_n, log_d)
        linear = np.log(predict_loss(params, np.exp(log_n), np.exp(log_d)))
        np.testing.assert_allclose(lse, linear, rtol=1e-12, atol=1e-12)
        assert theta_to_params(theta) == pytest.approx(params, rel=1e-12)
    # Stable where the linear form would overflow: A = e^800.
    big = log_loss_lse(np.array([800.0, 0.0, 0.0, 0.5, 0.5]), np.array([20.0]), np.array([20.0]))
    assert big[0] == pytest.approx(800.0 - 10.0, rel=1e-12)


def test_predict_loss_is_vectorised_and_matches_laws() -> None:
    n = np.array([1e8, 1e9, 7e10])
    d = np.array([2e10, 2e11, 1.4e12])
    got = predict_loss(EPOCH, n, d)
    assert got.shape == (3,)
    for i in range(3):
        assert got[i] == pytest.approx(laws.chinchilla(n[i], d[i], **EPOCH), rel=1e-12)
    grid = predict_loss(EPOCH, n[:, None], d[None, :])
    assert grid.shape == (3, 3)
    with pytest.raises(InputError):
        predict_loss({"E": 1.0, "A": 1.0}, n, d)


def test_analytic_gradient_matches_finite_differences() -> None:
    n, d, loss = runs(points=60, noise=0.01, seed=5)
    data = (np.log(n), np.log(d), np.log(loss))
    rng = np.random.default_rng(6)
    thetas = [params_to_theta(EPOCH), np.array([5.0, 8.0, 0.5, 0.3, 0.4]), np.array([10.0, 12.0, 0.6, 0.6, 0.5])]
    thetas += [params_to_theta(EPOCH) + rng.normal(0, 0.05, 5) for _ in range(3)]

    def f_at(theta: np.ndarray) -> float:
        return objective_and_gradient(theta, *data, 1e-3)[0]

    for theta in thetas:
        f, grad = objective_and_gradient(theta, *data, 1e-3)
        assert f == pytest.approx(huber_objective(theta, *data), rel=1e-12)
        h = 1e-7
        numeric = np.array([(f_at(theta + h * e) - f_at(theta - h * e)) / (2 * h) for e in np.eye(5)])
        np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-7 * max(1.0, float(np.abs(numeric).max())))
        # The scaled version used by the optimiser is the same function times the scale.
        fs, gs = objective_and_gradient(theta, *data, 1e-3, scale=1e3)
        assert fs == pytest.approx(1e3 * f) and np.allclose(gs, 1e3 * grad)


def test_batched_objective_matches_the_scalar_one() -> None:
    n, d, loss = runs(points=30, noise=0.01, seed=7)
    data = (np.log(n), np.log(d), np.log(loss))
    grid = SMALL_GRID[::7]
    batch = objective_batch(grid, *data, 1e-3, max_cells=100)  # several chunks
    scalar = [huber_objective(theta, *data) for theta in grid]
    np.testing.assert_allclose(batch, scalar, rtol=1e-12)


def test_varpro_starts_are_exact_on_noiseless_data() -> None:
    n, d, loss = runs(points=40)
    starts = varpro_starts(n, d, loss, exponents=[EPOCH["alpha"], EPOCH["beta"]])
    assert starts.shape == (4, 5)  # rows (alpha, beta) = (a0, a0), (a0, a1), (a1, a0), (a1, a1)
    # At the true exponents the nonnegative least squares recovers E, A, B exactly.
    np.testing.assert_allclose(starts[1], params_to_theta(EPOCH), rtol=1e-6, atol=1e-6)


def test_bootstrap_is_deterministic_with_a_seed() -> None:
    n, d, loss = runs(points=60, noise=0.005, seed=8)
    first = fit_chinchilla(n, d, loss, bootstrap=25, seed=3)
    again = fit_chinchilla(n, d, loss, bootstrap=25, seed=3)
    other = fit_chinchilla(n, d, loss, bootstrap=25, seed=4)
    assert first.bootstrap == 25 and len(first.bootstrap_draws) == 25
    assert first.bootstrap_draws == again.bootstrap_draws
    assert first.bootstrap_draws != other.bootstrap_draws
    assert set(first.bootstrap_draws[0]) == {"E", "A", "B", "alpha", "beta"}
    for name, est in first.parameters.items():
        assert est.ci_low is not None and est.ci_high is not None
        assert est.ci_low <= est.ci_high
        draws = [draw[name] for draw in first.bootstrap_draws]
        assert est.ci_low == pytest.approx(float(np.percentile(draws, 2.5)))
        assert est.ci_high == pytest.approx(float(np.percentile(draws, 97.5)))
    assert first.parameters["alpha"].ci_low < EPOCH["alpha"] * 1.1
    assert first.parameters["alpha"].ci_high > EPOCH["alpha"] * 0.9


def test_warns_on_few_points() -> None:
    n, d, loss = runs(points=8, noise=0.002, seed=9)
    fit = fit_chinchilla(n, d, loss, bootstrap=0)
    assert any("Only 8 points for 5 parameters" in w for w in fit.warnings), fit.warnings


def test_warns_on_a_narrow_span() -> None:
    n, d, loss = runs(points=40, noise=0.002, seed=10, n_range=(1e9, 3e9))
    fit = fit_chinchilla(n, d, loss, bootstrap=0)
    assert any("decade" in w and "N (params)" in w for w in fit.warnings), fit.warnings
    assert not any("decade" in w and "D (tokens)" in w for w in fit.warnings), fit.warnings


def test_warns_on_wide_a_b_intervals_with_the_allocation_hint() -> None:
    n, d, loss = runs(points=40, noise=0.02, seed=1)
    fit = fit_chinchilla(n, d, loss, bootstrap=20, seed=0)
    wide = [w for w in fit.warnings if "A-B ridge" in w]
    assert wide, fit.warnings
    assert "alpha/beta" in wide[0] and "G = " in wide[0]


def test_warns_when_a_term_is_absent() -> None:
    # The loss does not depend on D at all: the B / D^beta term is fitted away (or its exponent hits a bound).
    rng = np.random.default_rng(11)
    n = np.exp(rng.uniform(18, 23, 40))
    d = np.exp(rng.uniform(22, 26, 40))
    loss = 1.8 + 400.0 * n**-0.34
    fit = fit_chinchilla(n, d, loss, bootstrap=0)
    assert any("B / D^beta" in w or "bound" in w for w in fit.warnings), fit.warnings


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"params": [1e8, 2e8, 4e8, 8e8], "tokens": [1e9, 2e9, 4e9, 8e9], "loss": [3.0, 2.9, 2.8, 2.7]}, "at least 5"),
        ({"params": [1e8] * 6, "tokens": [1e9] * 5, "loss": [3.0] * 6}, "same length"),
        ({"params": [1e8] * 6, "tokens": [1e9] * 6, "loss": [3.0, 2.9, -1.0, 2.7, 2.6, 2.5]}, "loss must be"),
        ({"params": [1e8, float("nan")] * 3, "tokens": [1e9] * 6, "loss": [3.0] * 6}, "params must be"),
        ({"params": [1e8] * 6, "tokens": [1e9] * 6, "loss": [3.0] * 6, "method": "lbfgs"}, "method"),
        ({"params": [1e8] * 6, "tokens": [1e9] * 6, "loss": [3.0] * 6, "bootstrap": -1}, "bootstrap"),
        ({"params": [1e8] * 6, "tokens": [1e9] * 6, "loss": [3.0] * 6, "huber_delta": 0.0}, "huber_delta"),
    ],
)
def test_refuses_bad_input(kwargs: dict, match: str) -> None:
    args = (kwargs.pop("params"), kwargs.pop("tokens"), kwargs.pop("loss"))
    with pytest.raises(InputError, match=match):
        fit_chinchilla(*args, **kwargs)


def test_five_points_are_accepted_with_a_warning() -> None:
    n, d, loss = runs(points=5, seed=12)
    fit = fit_chinchilla(n, d, loss, bootstrap=0, starts=SMALL_GRID)
    assert fit.points_used == 5
    assert any("Only 5 points" in w for w in fit.warnings)


positive = st.floats(min_value=1e-3, max_value=1e4)
exponent = st.floats(min_value=0.01, max_value=2.0)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(e=st.floats(min_value=0.0, max_value=5.0), a=positive, b=positive, alpha=exponent, beta=exponent)
def test_predict_loss_decreases_in_n_and_d(e: float, a: float, b: float, alpha: float, beta: float) -> None:
    params = {"E": e, "A": a, "B": b, "alpha": alpha, "beta": beta}
    sizes = np.geomspace(1e6, 1e12, 13)
    along_n = predict_loss(params, sizes, 1e10)
    along_d = predict_loss(params, 1e9, sizes)
    # Non-increasing everywhere (a term can fall below float resolution at large sizes), strictly over the range
    # where the term is resolvable at all (A / N^alpha = 1e-3 / 1e12 is below the resolution of a loss of 16).
    assert np.all(np.diff(along_n) <= 0) and np.all(np.diff(along_d) <= 0)
    if a * 1e6**-alpha > 1e-9 * along_n[0]:
        assert along_n[-1] < along_n[0]
    if b * 1e6**-beta > 1e-9 * along_d[0]:
        assert along_d[-1] < along_d[0]
    assert np.all(along_n >= e) and np.all(along_d >= e)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    shift=st.lists(st.floats(min_value=-0.3, max_value=0.3), min_size=5, max_size=5),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_huber_objective_is_minimal_at_the_truth_on_noiseless_data(shift: list[float], seed: int) -> None:
    n, d, loss = runs(points=30, seed=seed)
    data = (np.log(n), np.log(d), np.log(loss))
    truth = params_to_theta(EPOCH)
    at_truth = huber_objective(truth, *data)
    assert at_truth < 1e-20
    assert huber_objective(truth + np.array(shift), *data) >= at_truth
