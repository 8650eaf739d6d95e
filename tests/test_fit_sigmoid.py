"""The ScaleRL sigmoid and power-law fitters (servers.scaling.fit_sigmoid): recovery, R0 handling, the power law's
overshoot, warnings, refusals, the block bootstrap, the paper's grid and the naive baseline. Deterministic (fixed
seeds); speed is measured by benchmarks/bench_scalerl_fit.py, not asserted here."""

import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import least_squares, lsq_linear

from servers.core.errors import InputError
from servers.scaling import laws
from servers.scaling.fit_sigmoid import (
    HUBER_K,
    _block_indices,
    _box_ls,
    _fit_paper_grid,
    _grid_b_curve_fit,
    _grid_b_vectorised,
    _prepare,
    fit_sigmoid,
    predict,
)
from servers.scaling.fitting import FitOutcome

SCALERL = {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.25}  # Table 1, ScaleRL
LONG_32K = {"A": 0.645, "B": 1.89, "C_mid": 11272.0, "R0": 0.25}  # Table 1, ScaleRL-32k


def curve(params: dict[str, float], noise: float = 0.0, seed: int = 0, lo: float = 100.0, hi: float = 50_000.0,
          n: int = 75) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    compute = np.geomspace(lo, hi, n)
    value = predict("scalerl", params, compute) + np.random.default_rng(seed).normal(0.0, noise, n)
    return compute, value


def window(compute: np.ndarray, value: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    keep = (compute >= lo) & (compute <= hi)
    return compute[keep], value[keep]


def values(out: FitOutcome) -> dict[str, float]:
    return {name: p.value for name, p in out.parameters.items()}


# --------------------------------------------------------------------------------------------- the model


def test_predict_matches_the_scalar_forms_of_laws() -> None:
    compute = np.array([50.0, 1000.0, 2542.0, 30_000.0])
    assert np.allclose(predict("scalerl", SCALERL, compute), [laws.scalerl(c, **SCALERL) for c in compute])
    power = {"A": 0.9, "B": 0.4, "D": 3.0}
    assert np.allclose(predict("power_law", power, compute), [laws.power_law(c, **power) for c in compute])
    assert predict("scalerl", SCALERL, np.array([2542.0]))[0] == pytest.approx((0.61 + 0.25) / 2)


# --------------------------------------------------------------------------------------------- recovery


def test_recovers_a_clean_curve() -> None:
    compute, value = curve(SCALERL)
    out = fit_sigmoid(compute, value, r0=0.25, bootstrap=0)
    p = values(out)
    assert out.converged, out.message
    assert p["A"] == pytest.approx(0.61, abs=1e-3)
    assert p["B"] == pytest.approx(1.92, rel=0.01)
    assert p["C_mid"] == pytest.approx(2542.0, rel=0.01)
    assert out.rmse < 1e-4
    assert out.points_used == 75
    assert out.model == "scalerl" and out.method == "robust"
    assert out.warnings == []


def test_recovers_a_noisy_curve_in_the_papers_window() -> None:
    compute, value = window(*curve(SCALERL, noise=0.01, seed=3), 1_500.0, 25_000.0)
    out = fit_sigmoid(compute, value, r0=0.25, bootstrap=0)
    assert out.converged
    assert values(out)["A"] == pytest.approx(0.61, abs=0.01)
    assert 0.005 < out.rmse < 0.02


def test_input_order_and_run_labels_do_not_change_a_single_run_fit() -> None:
    compute, value = curve(SCALERL, noise=0.01, seed=1)
    order = np.random.default_rng(0).permutation(compute.size)
    a = fit_sigmoid(compute, value, r0=0.25, bootstrap=20, seed=5)
    b = fit_sigmoid(compute[order], value[order], ["seed0"] * compute.size, r0=0.25, bootstrap=20, seed=5)
    assert values(a) == pytest.approx(values(b), rel=1e-9)
    draws_a = np.array([[d[k] for k in sorted(d)] for d in a.bootstrap_draws])
    draws_b = np.array([[d[k] for k in sorted(d)] for d in b.bootstrap_draws])
    assert np.allclose(draws_a, draws_b, rtol=1e-9)


def test_the_estimate_is_the_huber_optimum_over_all_parameters() -> None:
    """The IRLS / variable-projection answer is a minimum of the Huber objective: scipy's least_squares with the
    same loss, started there, over all parameters jointly, finds nothing lower."""
    compute, value = window(*curve(SCALERL, noise=0.01, seed=4), 1_500.0, 50_000.0)
    out = fit_sigmoid(compute, value, free_r0=True, bootstrap=0)
    p = values(out)
    c = HUBER_K * _prepare(compute, value, None).sigma

    def residual(t: np.ndarray) -> np.ndarray:
        q = {"A": t[0], "B": math.exp(t[1]), "C_mid": math.exp(t[2]), "R0": t[3]}
        return value - predict("scalerl", q, compute)

    start = [p["A"], math.log(p["B"]), math.log(p["C_mid"]), p["R0"]]
    ref = least_squares(residual, start, loss="huber", f_scale=c, bounds=([0, -5, 0, 0], [1, 5, 20, 1]), xtol=1e-14)
    assert out.objective == pytest.approx(ref.cost, rel=1e-6)
    assert p["A"] == pytest.approx(ref.x[0], abs=1e-5)


def test_a_few_outliers_do_not_move_the_robust_fit() -> None:
    compute, value = window(*curve(SCALERL, noise=0.01, seed=6), 1_500.0, 50_000.0)
    spoiled = value.copy()
    spoiled[[5, 17, 30]] -= 0.3  # three broken evaluations
    clean = values(fit_sigmoid(compute, value, r0=0.25, bootstrap=0))
    robust = values(fit_sigmoid(compute, spoiled, r0=0.25, bootstrap=0))
    assert robust["A"] == pytest.approx(clean["A"], abs=0.01)


# --------------------------------------------------------------------------------------------- R0


def test_r0_fixed_given_default_and_free() -> None:
    compute, value = curve(SCALERL, noise=0.005, seed=2)
    given_ = fit_sigmoid(compute, value, r0=0.25, bootstrap=30)
    assert given_.parameters["R0"].fixed and given_.parameters["R0"].value == 0.25
    assert given_.parameters["R0"].ci_low is None
    assert all(d["R0"] == 0.25 for d in given_.bootstrap_draws)

    default = fit_sigmoid(compute, value, bootstrap=0)
    assert default.parameters["R0"].fixed
    assert default.parameters["R0"].value == pytest.approx(value[0])  # the value at the smallest compute

    free = fit_sigmoid(compute, value, free_r0=True, bootstrap=30)
    r0 = free.parameters["R0"]
    assert not r0.fixed
    assert r0.value == pytest.approx(0.25, abs=0.01)
    assert r0.ci_low is not None and r0.ci_high is not None and r0.ci_low < r0.value < r0.ci_high
    assert values(free)["A"] == pytest.approx(0.61, abs=0.01)


def test_default_r0_averages_the_runs_first_values() -> None:
    compute, value = curve(SCALERL, noise=0.01, seed=2, n=30)
    other = value + 0.02
    late = value[5:] + 0.3  # a run that starts later does not count
    c = np.concatenate([compute, compute, compute[5:]])
    v = np.concatenate([value, other, late])
    runs = ["a"] * 30 + ["b"] * 30 + ["c"] * 25
    out = fit_sigmoid(c, v, runs, bootstrap=10)
    assert out.parameters["R0"].value == pytest.approx((value[0] + other[0]) / 2)
    assert out.points_used == 85


def test_r0_and_free_r0_together_are_refused_and_power_law_ignores_them() -> None:
    compute, value = curve(SCALERL, n=20)
    with pytest.raises(InputError, match="one or the other"):
        fit_sigmoid(compute, value, r0=0.2, free_r0=True)
    out = fit_sigmoid(compute, value, model="power_law", r0=0.2, bootstrap=0)
    assert set(out.parameters) == {"A", "B", "D"}


# --------------------------------------------------------------------------------------------- the power law


def test_the_power_law_overshoots_a_saturating_curve() -> None:
    compute, value = window(*curve(SCALERL, noise=0.005, seed=7, hi=100_000.0), 1_500.0, 50_000.0)
    sigmoid = values(fit_sigmoid(compute, value, r0=0.25, bootstrap=0))
    power = fit_sigmoid(compute, value, model="power_law", bootstrap=0)
    assert power.converged
    assert values(power)["A"] > sigmoid["A"] + 0.01
    assert values(power)["D"] > 0 and values(power)["B"] > 0


def test_a_power_law_asymptote_above_the_maximum_is_flagged() -> None:
    compute, value = window(*curve(LONG_32K, noise=0.005, seed=1), 1_500.0, 25_000.0)
    out = fit_sigmoid(compute, value, model="power_law", bootstrap=0)
    assert values(out)["A"] > 1.0
    assert any("power law asymptote above the metric's maximum" in w for w in out.warnings), out.warnings


# --------------------------------------------------------------------------------------------- warnings, refusals


def test_warns_when_c_mid_lies_beyond_the_data() -> None:
    compute, value = window(*curve(LONG_32K, noise=0.003, seed=3), 100.0, 3_000.0)
    out = fit_sigmoid(compute, value, r0=0.25, bootstrap=0)
    assert any("beyond the largest observed compute" in w for w in out.warnings), out.warnings


def test_warns_when_a_sits_on_y_max() -> None:
    compute, value = curve(SCALERL, noise=0.005, seed=3)
    out = fit_sigmoid(compute, value, r0=0.25, y_max=0.5, bootstrap=0)
    assert values(out)["A"] == pytest.approx(0.5, abs=1e-3)
    assert any("upper bound y_max" in w for w in out.warnings), out.warnings


def test_warns_on_a_wide_interval_of_a() -> None:
    compute, value = window(*curve(LONG_32K, noise=0.01, seed=5), 1_500.0, 12_000.0)
    out = fit_sigmoid(compute, value, r0=0.25, bootstrap=100, seed=1)
    pa = out.parameters["A"]
    assert pa.ci_high - pa.ci_low > 0.1
    assert any("interval of A is wide" in w for w in out.warnings), out.warnings


def test_a_flat_curve_is_flagged_and_a_declining_one_is_fitted() -> None:
    compute = np.geomspace(100.0, 50_000.0, 40)
    flat = fit_sigmoid(compute, 0.4 + np.random.default_rng(0).normal(0.0, 0.005, 40), bootstrap=0)
    assert any("nearly flat" in w for w in flat.warnings), flat.warnings
    falling = {"A": 0.1, "B": 1.5, "C_mid": 3000.0, "R0": 0.6}
    out = fit_sigmoid(*curve(falling, noise=0.005, seed=0, n=40), free_r0=True, bootstrap=0)
    assert values(out)["A"] == pytest.approx(0.1, abs=0.01)
    assert values(out)["R0"] == pytest.approx(0.6, abs=0.01)
    assert not any("flat" in w for w in out.warnings)


def test_few_points_warn_and_too_few_are_refused() -> None:
    compute, value = curve(SCALERL, n=6)
    out = fit_sigmoid(compute, value, r0=0.25, bootstrap=0)
    assert any("fewer than 3 per parameter" in w for w in out.warnings), out.warnings
    with pytest.raises(InputError, match="at least 3 points"):
        fit_sigmoid(compute[:2], value[:2], r0=0.25)
    with pytest.raises(InputError, match="at least 4 points"):
        fit_sigmoid(compute[:3], value[:3], free_r0=True)
    with pytest.raises(InputError, match="distinct compute"):
        fit_sigmoid(np.full(10, 500.0), value[:1].repeat(10), r0=0.25)


def test_bad_input_is_refused() -> None:
    compute, value = curve(SCALERL, n=20)
    with pytest.raises(InputError):
        fit_sigmoid(compute, value[:-1])
    with pytest.raises(InputError):
        fit_sigmoid(-compute, value)
    with pytest.raises(InputError):
        fit_sigmoid(compute, value, ["a"] * 3)
    with pytest.raises(InputError, match="scalerl"):
        fit_sigmoid(compute, value, model="power_law", method="scalerl-grid")
    with pytest.raises(InputError, match="fixes R0"):
        fit_sigmoid(compute, value, method="scalerl-grid", free_r0=True)


# --------------------------------------------------------------------------------------------- bootstrap


def test_bootstrap_is_deterministic_and_covers_the_truth() -> None:
    compute, value = window(*curve(SCALERL, noise=0.01, seed=11), 1_500.0, 50_000.0)
    a = fit_sigmoid(compute, value, r0=0.25, bootstrap=200, seed=3)
    b = fit_sigmoid(compute, value, r0=0.25, bootstrap=200, seed=3)
    c = fit_sigmoid(compute, value, r0=0.25, bootstrap=200, seed=4)
    assert a.bootstrap_draws == b.bootstrap_draws
    assert a.parameters == b.parameters
    assert a.bootstrap_draws != c.bootstrap_draws
    assert a.bootstrap == len(a.bootstrap_draws) == 200
    assert all(set(d) == {"A", "B", "C_mid", "R0"} for d in a.bootstrap_draws)
    for name, true in SCALERL.items():
        p = a.parameters[name]
        if name != "R0":
            assert p.ci_low <= true <= p.ci_high, (name, p)
            assert p.ci_low <= p.value <= p.ci_high


def test_no_bootstrap_gives_no_intervals() -> None:
    compute, value = curve(SCALERL, noise=0.01)
    out = fit_sigmoid(compute, value, bootstrap=0)
    assert out.bootstrap == 0 and out.bootstrap_draws == []
    assert all(p.ci_low is None and p.ci_high is None for p in out.parameters.values())


def test_block_indices_keep_each_run_and_use_circular_blocks() -> None:
    rng = np.random.default_rng(0)
    groups = [np.array([0, 2, 4, 6, 8, 10, 12, 14]), np.array([1, 3, 5, 7, 9, 11, 13, 15])]
    idx = _block_indices(rng, groups, 16, 50)
    assert idx.shape == (50, 16)
    for g in groups:
        assert np.isin(idx[:, g], g).all()  # residuals stay within their run
        pos = np.searchsorted(g, idx[:, g])  # positions along the run; blocks of 2 (= round(8^(1/3)))
        assert np.all(pos[:, 1::2] == (pos[:, 0::2] + 1) % g.size)  # contiguous, wrapping past the run's end


def test_circular_blocks_draw_every_point_equally_often() -> None:
    """Plain moving blocks draw a run's first and last points length times less often than the middle ones, so
    the resampled residuals' mean is not the residuals' mean: circular blocks draw each point equally often."""
    rng = np.random.default_rng(1)
    group = np.arange(64)
    idx = _block_indices(rng, [group], 64, 4000)
    counts = np.bincount(idx.ravel(), minlength=64) / idx.size
    assert np.allclose(counts, 1 / 64, rtol=0.05)


def test_several_runs_bootstrap_and_fit_one_curve() -> None:
    parts = [curve(SCALERL, noise=0.01, seed=s, n=40) for s in range(3)]
    compute = np.concatenate([p[0] for p in parts])
    value = np.concatenate([p[1] for p in parts])
    runs = np.repeat(["s0", "s1", "s2"], 40)
    out = fit_sigmoid(compute, value, runs, r0=0.25, bootstrap=100, seed=2)
    assert out.points_used == 120 and out.bootstrap == 100
    assert values(out)["A"] == pytest.approx(0.61, abs=0.01)
    assert out.parameters["A"].ci_low <= 0.61 <= out.parameters["A"].ci_high


# --------------------------------------------------------------------------------------------- the other methods


@pytest.mark.timeout(120)
def test_paper_grid_matches_robust_on_clean_data() -> None:
    compute, value = window(*curve(SCALERL), 1_500.0, 50_000.0)
    grid = fit_sigmoid(compute, value, method="scalerl-grid", r0=0.25, bootstrap=0)
    robust = fit_sigmoid(compute, value, r0=0.25, bootstrap=0)
    assert grid.converged, grid.message
    assert values(grid)["A"] == pytest.approx(values(robust)["A"], abs=0.01)
    at = np.array([100_000.0])
    assert predict("scalerl", values(grid), at)[0] == pytest.approx(predict("scalerl", values(robust), at)[0], abs=0.01)
    assert values(grid)["R0"] == 0.25 and grid.parameters["R0"].fixed


@pytest.mark.timeout(120)
def test_vectorised_grid_agrees_with_curve_fit_cell_by_cell() -> None:
    compute, value = window(*curve(SCALERL, noise=0.01, seed=8), 1_500.0, 25_000.0)
    x = np.log(compute)
    a_grid = np.array([0.5, 0.6, 0.61, 0.7])
    cmid_grid = np.array([1_000.0, 2_500.0, 5_000.0, 20_000.0])
    aa, cc = (g.ravel() for g in np.meshgrid(a_grid, cmid_grid, indexing="ij"))
    b_vec, sse_vec = _grid_b_vectorised(x, value, 0.25, aa - 0.25, np.log(cc))
    for i in range(aa.size):
        b, sse, ok, _ = _grid_b_curve_fit(x, value, 0.25, aa[i] - 0.25, math.log(cc[i]))
        assert ok
        assert sse_vec[i] == pytest.approx(sse, rel=1e-5, abs=1e-10)
        assert b_vec[i] == pytest.approx(b, rel=1e-3, abs=1e-6)
    # and the whole procedure on this small grid picks the cell that an exhaustive curve_fit loop picks
    params, _, ok, _ = _fit_paper_grid(x, value, 0.25, 1.0, a_grid=a_grid, cmid_grid=cmid_grid, verify=aa.size)
    loop = [_grid_b_curve_fit(x, value, 0.25, aa[i] - 0.25, math.log(cc[i]))[1] for i in range(aa.size)]
    best = int(np.argmin(loop))
    assert ok and (params["A"], params["C_mid"]) == (aa[best], cc[best])


def test_curve_fit_baseline_reports_failure_instead_of_raising() -> None:
    compute, value = window(*curve(SCALERL, noise=0.01, seed=0), 1_500.0, 25_000.0)
    out = fit_sigmoid(compute, value, method="curve_fit", r0=0.25, bootstrap=50)
    assert isinstance(out, FitOutcome)
    assert not out.converged
    assert "curve_fit" in out.message
    assert out.bootstrap == 0
    assert any("did not converge" in w for w in out.warnings)
    assert all(math.isfinite(p.value) for p in out.parameters.values())


def test_curve_fit_baseline_can_succeed() -> None:
    compute, value = curve({"A": 0.8, "B": 1.0, "C_mid": 1.5, "R0": 0.2}, lo=0.1, hi=50.0, n=40)
    out = fit_sigmoid(compute, value, method="curve_fit", r0=0.2, bootstrap=10)
    assert out.converged, out.message
    assert values(out)["A"] == pytest.approx(0.8, abs=1e-3)
    assert out.bootstrap == 10


# --------------------------------------------------------------------------------------------- pieces


def test_box_constrained_least_squares_is_exact() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = 12
        X = rng.normal(size=(1, n, 2))  # noqa: N806
        y = rng.normal(size=(1, n))
        w = rng.uniform(0.1, 1.0, size=(1, n))
        lo = np.array([rng.uniform(-1, 0), rng.uniform(-1, 0)])
        hi = lo + rng.uniform(0.05, 1.0, size=2)
        if rng.random() < 0.3:
            lo[0], hi[0] = -np.inf, np.inf  # the power law: A unbounded, D >= 0
            lo[1], hi[1] = 0.0, np.inf
        ours = _box_ls(X, y, w, lo, hi)[0]
        sw = np.sqrt(w[0])
        ref = lsq_linear(X[0] * sw[:, None], y[0] * sw, bounds=(lo, hi), tol=1e-12).x
        cost_ours, cost_ref = (float(np.sum(w[0] * (y[0] - X[0] @ c) ** 2)) for c in (ours, ref))
        assert cost_ours <= cost_ref + 1e-9


# --------------------------------------------------------------------------------------------- properties, timing


@pytest.mark.timeout(120)
@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=st.floats(0.45, 0.9),
    b=st.floats(0.8, 3.0),
    log_cmid=st.floats(math.log(800.0), math.log(12_000.0)),
    r0=st.floats(0.05, 0.3),
    seed=st.integers(0, 10_000),
)
def test_robust_fit_follows_the_data(a: float, b: float, log_cmid: float, r0: float, seed: int) -> None:
    true = {"A": a, "B": b, "C_mid": math.exp(log_cmid), "R0": r0}
    compute, value = curve(true, noise=0.005, seed=seed, n=40)
    out = fit_sigmoid(compute, value, free_r0=True, bootstrap=0)
    assert out.converged, out.message
    fitted = predict("scalerl", values(out), compute)
    assert out.rmse <= 0.01
    assert np.max(np.abs(fitted - predict("scalerl", true, compute))) <= 0.02


def test_duration_is_reported_for_a_bootstrapped_fit() -> None:
    """Not a speed assertion (benchmarks/bench_scalerl_fit.py checks speed): duration_s is the wall time of the
    whole fit, bootstrap included."""
    compute, value = curve(SCALERL, noise=0.01)
    started = time.perf_counter()
    out = fit_sigmoid(compute, value, bootstrap=200)
    elapsed = time.perf_counter() - started
    assert out.bootstrap == 200
    assert 0 < out.duration_s <= elapsed
