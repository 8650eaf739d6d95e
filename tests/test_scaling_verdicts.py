"""Issue 10: verdicts an agent can trust. An agent repeats what a tool says, so each verdict is checked against
what the same fits say elsewhere, and each kind of error is ruled out by a check inside the result:

- 1: compare_scaling_fits says who leads where (regions with bootstrap probabilities), and never contradicts
  predict_scaling on the same fits (synthetic crossing curves of known truth, the tiny-grpo reproduction, random
  pairs of curves, two real tiny-grpo runs through the tools).
- 2: predict_scaling's compute-for-target verdict follows its own draws: reachable, unreachable or uncertain.
- 3: a bootstrap interval contains its estimate or the fit says it does not; the resample counts add up, with
  the reasons of the failed refits; the level is honoured.
- 5: one default R0 (in the domain module), used by the tool.
- 8: fits of CPU runs from a job default to compute_flops, and say plainly that GPU-hours on CPU are wall time.
- list_scaling_fits shows the store's notices and counts damaged rows apart.

Deterministic: fixed seeds, hypothesis derandomized with bounded examples; nothing is timed.
"""

import contextlib
import itertools
import json
import math
import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from servers.core.db import forget_prepared
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from servers.scaling import analysis, limits
from servers.scaling.data import DataPoint
from servers.scaling.fit_sigmoid import _prepare, _resample, _spec, fit_sigmoid, predict, start_points
from servers.scaling.fitstore import FitStore, StoredFit
from servers.scaling.fitting import FitOutcome, ParameterEstimate, interval_warning
from servers.scaling.server import GPU_HOURS_COLUMN, job_device
from tests.conftest import CHILD_ENV
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

anyio = pytest.mark.anyio


# ---- helpers ------------------------------------------------------------------------------------------------------


def stored(outcome: FitOutcome, compute: np.ndarray, value: np.ndarray, fit_id: str, label: str) -> StoredFit:
    return StoredFit(
        id=fit_id,
        label=label,
        model=outcome.model,
        method=outcome.method,
        compute_unit="gpu_hours",
        created_at=0,
        source="inline",
        options={},
        outcome=outcome,
        points=[DataPoint(compute=float(c), value=float(v)) for c, v in zip(compute, value, strict=True)],
        excluded=[],
    )


def noisy(params: dict[str, float], lo: float, hi: float, n: int, noise: float, seed: int) -> tuple[Any, Any]:
    compute = np.geomspace(lo, hi, n)
    value = np.clip(predict("scalerl", params, compute) + np.random.default_rng(seed).normal(0, noise, n), 0, 1)
    return compute, value


def fitted(params: dict[str, float], fit_id: str, label: str, *, lo: float, hi: float, n: int = 30,
           noise: float = 0.01, seed: int = 0, bootstrap: int = 200) -> StoredFit:  # fmt: skip
    compute, value = noisy(params, lo, hi, n, noise, seed)
    return stored(fit_sigmoid(compute, value, bootstrap=bootstrap, seed=seed), compute, value, fit_id, label)


def synthetic(params: dict[str, float], draws: list[dict[str, float]], fit_id: str, model: str = "scalerl",
              rmse: float = 0.01) -> StoredFit:  # fmt: skip
    """A stored fit with the given point estimate and bootstrap draws (no fitting): any draws at all, including
    draws centred away from the estimate, so that the comparison's own check is exercised."""
    outcome = FitOutcome(
        model=model,  # type: ignore[arg-type]
        method="robust",
        parameters={k: ParameterEstimate(value=v) for k, v in params.items()},
        rmse=rmse,
        objective=0,
        converged=True,
        message="",
        bootstrap=len(draws),
        bootstrap_run=len(draws),
        bootstrap_draws=draws,
        points_used=20,
        duration_s=0,
    )
    compute = np.geomspace(100, 20_000, 20)
    return stored(outcome, compute, np.full(20, 0.3), fit_id, fit_id)


def value_at(fit: StoredFit, c: np.ndarray) -> np.ndarray:
    """What predict_scaling returns as `value` at compute c."""
    return np.array([p.value for p in analysis.predict_curve(fit, [float(x) for x in c], 0.95)])


def assert_consistent_with_predict(x: StoredFit, y: StoredFit, regions: list[Any], level: float) -> None:
    """The verdict's claims checked against predict_scaling and the draws: every region with a leader has the
    leader's predicted value above the other's at every compute tried in it, ends included, and at least `level`
    of the draw pairs agree at each of them; the regions cover the compute range without gaps."""
    start, end, _ = analysis.compute_range(x, y)
    assert regions[0].low == pytest.approx(start) and regions[-1].high == pytest.approx(end)
    assert all(a.high == b.low for a, b in itertools.pairwise(regions))
    for r in regions:
        if r.leader is None:
            continue
        c = np.geomspace(r.low, r.high, 41) if r.high > r.low else np.array([r.low])
        gap = value_at(x, c) - value_at(y, c)
        sign = 1 if r.leader == x.id else -1
        assert np.all(sign * gap > 0), (r, c[sign * gap <= 0])
        if r.p_first_ahead is not None:
            agree = r.p_first_ahead[0] if sign > 0 else 1 - r.p_first_ahead[1]
            assert agree >= level - 1e-12, r


# ---- 1: who leads where --------------------------------------------------------------------------------------------

EARLY = {"A": 0.60, "B": 2.0, "C_mid": 1_000.0, "R0": 0.2}
LATE = {"A": 0.72, "B": 2.0, "C_mid": 6_000.0, "R0": 0.2}  # the higher asymptote, the later midpoint


def true_crossing(p: dict[str, float], q: dict[str, float], lo: float, hi: float) -> float:
    from scipy.optimize import brentq

    return float(brentq(lambda c: float(predict("scalerl", p, c) - predict("scalerl", q, c)), lo, hi))


def test_crossing_curves_of_known_truth() -> None:
    early = fitted(EARLY, "fit-early", "early", lo=100, hi=200_000, n=40, seed=1)
    late = fitted(LATE, "fit-late", "late", lo=100, hi=200_000, n=40, seed=2)
    truth = true_crossing(EARLY, LATE, 2_000, 100_000)
    cmp = analysis.compare([early, late])
    [pair] = cmp.pairs
    lead = {r.leader for r in pair.regions}
    assert lead == {None, "fit-early", "fit-late"}
    where = {c: next(r for r in pair.regions if r.low <= c <= r.high) for c in (2_000.0, truth, 100_000.0)}
    assert where[2_000.0].leader == "fit-early" and where[100_000.0].leader == "fit-late"
    assert where[truth].leader is None  # around the true crossing neither is clearly ahead
    assert where[2_000.0].p_first_ahead[0] >= 0.95 and where[100_000.0].p_first_ahead[1] <= 0.05
    assert truth / 1.5 < pair.crossings[-1] < truth * 1.5
    assert "early ahead from" in pair.verdict and "late ahead beyond" in pair.verdict
    assert_consistent_with_predict(early, late, pair.regions, 0.95)


# The two tiny-grpo fits of the report (compute in GPU-hours): A 0.7041, C_mid 9.25e-5 (lr 0.02) and A 0.6888,
# C_mid 6.02e-5 (lr 0.005); B and R0 follow from the predictions it quoted (0.281 and 0.366 at 6e-5; 0.400 and
# 0.483 at 1e-4): B 1.5 for both, R0 0.06 and 0.043. Evaluations on 1024 prompts: noise ~0.012.
LR02 = {"A": 0.7041, "B": 1.5, "C_mid": 9.25e-5, "R0": 0.06}
LR005 = {"A": 0.6888, "B": 1.5, "C_mid": 6.02e-5, "R0": 0.043}


def test_the_tiny_grpo_reproduction_names_the_leader_where_it_leads() -> None:
    assert predict("scalerl", LR02, 6e-5) == pytest.approx(0.281, abs=0.002)
    assert predict("scalerl", LR005, 1e-4) == pytest.approx(0.483, abs=0.002)
    fast = fitted(LR02, "fit-lr02", "tiny-grpo lr0.02", lo=2.1e-5, hi=8.8e-3, noise=0.012, seed=3)
    slow = fitted(LR005, "fit-lr005", "tiny-grpo lr0.005", lo=2.1e-5, hi=8.8e-3, noise=0.012, seed=4)
    [pair] = analysis.compare([fast, slow]).pairs
    assert "leads throughout" not in pair.verdict and "do not cross" not in pair.verdict
    for c in (6e-5, 1e-4):
        [region] = [r for r in pair.regions if r.low <= c <= r.high]
        assert region.leader == "fit-lr005", (c, region)
        assert value_at(slow, np.array([c]))[0] > value_at(fast, np.array([c]))[0]
    assert "tiny-grpo lr0.005 ahead" in pair.verdict
    # lr0.02's lead, if any, is only claimed beyond the true crossing
    truth = true_crossing(LR02, LR005, 2e-4, 1.0)
    assert all(r.low >= truth / 2 for r in pair.regions if r.leader == "fit-lr02")
    assert_consistent_with_predict(fast, slow, pair.regions, 0.95)


curve_params = st.fixed_dictionaries(
    {
        "A": st.floats(0.3, 0.9),
        "B": st.floats(0.5, 3.0),
        "C_mid": st.floats(math.log(200.0), math.log(50_000.0)).map(math.exp),
        "R0": st.floats(0.0, 0.25),
    }
)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=curve_params,
    second=curve_params,
    spread=st.floats(0.0, 0.3),
    bias=st.floats(-0.2, 0.2),
    seed=st.integers(0, 2**16),
    level=st.sampled_from([0.8, 0.95]),
    power=st.booleans(),
)
def test_the_verdict_agrees_with_predict_scaling_for_any_pair_and_any_draws(
    first: dict[str, float],
    second: dict[str, float],
    spread: float,
    bias: float,
    seed: int,
    level: float,
    power: bool,
) -> None:
    """Random pairs of curves with random bootstrap draws, centred on the estimate or away from it (bias): the
    regions never claim a lead that predict_scaling's values or the draws do not show."""
    rng = np.random.default_rng(seed)

    def draws(p: dict[str, float]) -> list[dict[str, float]]:
        out = []
        for _ in range(40):
            d = {k: v * math.exp(bias + spread * rng.normal()) if k in ("B", "C_mid", "D") else v for k, v in p.items()}
            d["A"] = p["A"] + 0.1 * (bias + spread * rng.normal())
            out.append(d)
        return out

    x = synthetic(first, draws(first), "fit-x")
    if power:  # a power law against a sigmoid
        law = {"A": second["A"], "B": 0.5 * second["B"], "D": (second["A"] - second["R0"]) * 100 ** (0.5 * second["B"])}
        y = synthetic(law, draws(law), "fit-y", model="power_law")
    else:
        y = synthetic(second, draws(second), "fit-y")
    regions = analysis.lead_regions(x, y, level)
    assert_consistent_with_predict(x, y, regions, level)
    words = analysis.compare([x, y], level).pairs[0].verdict
    assert ("fit-x ahead" in words) == any(r.leader == "fit-x" for r in regions)
    assert ("fit-y ahead" in words) == any(r.leader == "fit-y" for r in regions)


@pytest.mark.timeout(300)
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(first=curve_params, second=curve_params, seed=st.integers(0, 1000))
def test_the_verdict_agrees_with_predict_scaling_on_fitted_pairs(
    first: dict[str, float], second: dict[str, float], seed: int
) -> None:
    x = fitted(first, "fit-x", "x", lo=100, hi=100_000, n=30, seed=seed, bootstrap=60)
    y = fitted(second, "fit-y", "y", lo=100, hi=100_000, n=30, seed=seed + 1, bootstrap=60)
    [pair] = analysis.compare([x, y]).pairs
    assert_consistent_with_predict(x, y, pair.regions, 0.95)


def test_a_lead_the_fitted_curves_do_not_show_is_not_claimed() -> None:
    """Draws that all put x ahead cannot make x the leader where its fitted curve is not above y's (what
    predict_scaling would show); and the final check demotes any span whose leader is not above everywhere."""
    p = {"A": 0.6, "B": 2.0, "C_mid": 1000.0, "R0": 0.2}
    x = synthetic(p, [{**p, "A": 0.65}] * 50, "fit-x")  # every draw above, the estimate equal
    y = synthetic(p, [p] * 50, "fit-y")
    regions = analysis.lead_regions(x, y, 0.95)
    assert [r.leader for r in regions] == [None, None] and analysis.crossings(x, y) == []
    assert regions[-1].p_first_ahead == (1.0, 1.0)  # the draws' view is reported, not turned into a claim
    spans = [(100.0, 2e6, 1, False)]
    assert analysis._checked(x, y, spans, np.geomspace(100, 2e6, 50)) == [(100.0, 2e6, 0, False)]


@pytest.fixture
async def auto_client(app: App) -> Any:
    async with Client(create_test_suite(app), mode="auto") as client:
        yield client


def points_of(params: dict[str, float], seed: int) -> list[dict[str, float]]:
    compute, value = noisy(params, 100, 200_000, 40, 0.01, seed)
    return [{"compute": float(c), "value": float(v)} for c, v in zip(compute, value, strict=True)]


@anyio
async def test_compare_and_predict_through_the_tools_agree(suite_client: Client) -> None:
    early = await ok(
        suite_client,
        "fit_scaling_law",
        {"model": "scalerl", "data": {"points": points_of(EARLY, 1)}, "label": "early", "bootstrap": 100},
    )
    late = await ok(
        suite_client,
        "fit_scaling_law",
        {"model": "scalerl", "data": {"points": points_of(LATE, 2)}, "label": "late", "bootstrap": 100},
    )
    cmp = await ok(suite_client, "compare_scaling_fits", {"fit_ids": [early["fit_id"], late["fit_id"]]})
    [pair] = cmp["pairs"]
    assert cmp["level"] == 0.95 and {r["leader"] for r in pair["regions"]} >= {early["fit_id"], late["fit_id"]}
    for r in pair["regions"]:
        if r["leader"] is None:
            continue
        at = [float(c) for c in np.geomspace(r["low"], r["high"], 7)]
        a = await ok(suite_client, "predict_scaling", {"fit_id": early["fit_id"], "compute": at})
        b = await ok(suite_client, "predict_scaling", {"fit_id": late["fit_id"], "compute": at})
        for u, v in zip(a["values"], b["values"], strict=True):
            assert (u["value"] > v["value"]) == (r["leader"] == early["fit_id"]), (r, u, v)
    loose = await ok(suite_client, "compare_scaling_fits", {"fit_ids": [early["fit_id"], late["fit_id"]], "level": 0.6})
    ties = sum(r["high"] / r["low"] for r in loose["pairs"][0]["regions"] if r["leader"] is None)
    assert ties < sum(r["high"] / r["low"] for r in pair["regions"] if r["leader"] is None)  # a lower bar: fewer ties


# ---- 2: compute for a target follows the draws ------------------------------------------------------------------


def with_asymptotes(point: float, asymptotes: list[float]) -> StoredFit:
    base = {"A": point, "B": 2.0, "C_mid": 1000.0, "R0": 0.2}
    return synthetic(base, [{**base, "A": a} for a in asymptotes], "fit-t")


def test_reaching_a_target_is_reachable_unreachable_or_uncertain_as_the_draws_say() -> None:
    # the report: the fitted asymptote is below the target, yet 55% of the draws get there
    split = analysis.compute_for_target(with_asymptotes(0.60, [0.65] * 55 + [0.58] * 45), 0.62, 0.95, "gpu_hours")
    assert split.verdict == "uncertain" and split.reachable is None and split.draws_reaching == pytest.approx(0.55)
    assert "55%" in split.statement and "will not get there" not in split.statement and split.compute is None
    sure = analysis.compute_for_target(with_asymptotes(0.65, [0.66] * 97 + [0.58] * 3), 0.62, 0.95, "gpu_hours")
    assert sure.verdict == "reachable" and sure.reachable and sure.compute is not None
    assert sure.ci_low is not None and sure.ci_high is None  # 3% never get there: no upper end at 95%
    never = analysis.compute_for_target(with_asymptotes(0.58, [0.59] * 98 + [0.65] * 2), 0.62, 0.95, "gpu_hours")
    assert never.verdict == "unreachable" and never.reachable is False and "will not get there" in never.statement
    # the fitted curve reaches it but only 70% of draws do: uncertain, not "reachable"
    most = analysis.compute_for_target(with_asymptotes(0.65, [0.66] * 70 + [0.58] * 30), 0.62, 0.95, "gpu_hours")
    assert most.verdict == "uncertain" and "70%" in most.statement and most.compute is not None
    assert analysis.compute_for_target(with_asymptotes(0.65, [0.66] * 70 + [0.58] * 30), 0.62, 0.6, "u").reachable
    bare = analysis.compute_for_target(with_asymptotes(0.65, []), 0.62, 0.95, "gpu_hours")
    assert bare.verdict == "reachable" and "point estimate only" in bare.statement


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    point=st.floats(0.3, 0.9),
    asymptotes=st.lists(st.floats(0.3, 0.9), min_size=0, max_size=60),
    target=st.floats(0.25, 0.95),
    level=st.sampled_from([0.5, 0.8, 0.95, 0.99]),
)
def test_the_target_statement_never_says_more_than_the_draws(
    point: float, asymptotes: list[float], target: float, level: float
) -> None:
    out = analysis.compute_for_target(with_asymptotes(point, asymptotes), target, level, "gpu_hours")
    share = out.draws_reaching
    if out.verdict == "reachable":
        assert out.compute is not None and (share is None or share >= level)
    elif out.verdict == "unreachable":
        assert out.compute is None and (share is None or share <= 1 - level)
    else:
        assert out.verdict == "uncertain" and out.reachable is None and share is not None
        assert f"{share:.0%}" in out.statement
    assert ("will not get there" in out.statement) == (out.verdict == "unreachable" and share is not None)


# ---- 3: intervals contain their estimates, counts add up ----------------------------------------------------------

TRUE = {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.25}


def runs_curve(n: int, runs: int, noise: float = 0.01, seed: int = 0) -> tuple[Any, Any, Any]:
    """The 100,000-point reproduction's data (tests/test_scaling_bounds.py): `runs` seeds on one compute grid."""
    rng = np.random.default_rng(seed)
    c = np.tile(np.geomspace(100, 50_000, n // runs), runs)
    labels = np.repeat([f"seed{i}" for i in range(runs)], n // runs)
    v = np.clip(predict("scalerl", TRUE, c) + rng.normal(0, noise, c.size), 0, 1)
    return c, v, labels


def assert_intervals_contain_estimates(out: FitOutcome) -> None:
    for name, p in out.parameters.items():
        if p.ci_low is not None:
            assert p.ci_low <= p.value <= p.ci_high, (name, p)
    assert out.intervals_missing_their_estimate() == []
    assert not any("does not contain its estimate" in w for w in out.warnings)


@pytest.mark.timeout(120)
def test_the_reported_intervals_now_contain_their_estimates() -> None:
    # 100,000 points in 4 runs, thinned to 5,000 as the server does: A's interval missed its estimate before
    c, v, labels = runs_curve(100_000, 4)
    kept, _ = limits.thin_curve(list(c), list(labels))
    big = fit_sigmoid(c[kept], v[kept], labels[kept], bootstrap=100)
    assert_intervals_contain_estimates(big)
    assert big.bootstrap == big.bootstrap_run == 100
    # 300 points, R0 from the first value
    c, v, _ = runs_curve(300, 1, noise=0.02, seed=5)
    assert_intervals_contain_estimates(fit_sigmoid(c, v, bootstrap=200))
    # a tiny-grpo-like run: 30 evaluations, noisy start
    compute, value = noisy(LR02, 2.1e-5, 8.8e-3, 30, 0.012, 3)
    out = fit_sigmoid(compute, value, bootstrap=200)
    assert_intervals_contain_estimates(out)
    assert out.bootstrap + sum(out.bootstrap_failed.values()) == out.bootstrap_run == 200


def test_the_resamples_keep_what_the_estimate_used() -> None:
    """The cause of intervals that missed their estimate: the residuals were resampled as they were, not centred
    (a run's mean residual, and the fixed R0's misfit at the start, were added to every resample, so every refit
    moved the same way), in moving blocks that under-draw a run's ends; and R0 was held at the full data's value
    though the estimate takes it from the noisy first values. Now each run's residuals are centred, the blocks
    circular, the run offsets resampled, and each resample takes its own R0 by the same rule."""
    c, v, labels = runs_curve(400, 4, seed=7)
    data = _prepare(c, v, labels)
    starts = start_points(c, v, labels)
    r0 = float(np.mean([s[2] for s in starts]))
    spec = _spec("scalerl", data, r0, 1.0)
    params = {**TRUE, "R0": r0}
    fitted_curve = predict("scalerl", params, c)
    rs = _resample(np.random.default_rng(0), "scalerl", data, params, spec.free, 2000, starts)
    noise = rs.y - fitted_curve[None, :]
    assert abs(float(np.mean(noise))) < 1e-3  # centred: no shift common to every resample
    for g in data.runs:  # and each run's noise is centred up to its resampled offset
        assert abs(float(np.mean(noise[:, g]))) < 2e-3
    assert rs.r0 is not None and np.std(rs.r0) > 0.002  # R0 varies as the noisy first values do
    assert abs(float(np.mean(rs.r0)) - r0) < 0.003
    given_r0 = _resample(np.random.default_rng(0), "scalerl", data, params, spec.free, 10, None)
    assert given_r0.r0 is None  # a given R0 stays fixed


@pytest.mark.timeout(300)
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    params=curve_params,
    noise=st.floats(0.002, 0.04),
    runs=st.integers(1, 3),
    n=st.integers(12, 60),
    r0=st.sampled_from(["first", "free", "given"]),
    level=st.sampled_from([0.8, 0.95]),
    seed=st.integers(0, 1000),
)
def test_every_interval_contains_its_estimate_or_the_fit_says_so(
    params: dict[str, float], noise: float, runs: int, n: int, r0: str, level: float, seed: int
) -> None:
    c = np.geomspace(100, 100_000, n)
    compute = np.tile(c, runs)
    value = np.clip(
        np.tile(predict("scalerl", params, c), runs) + np.random.default_rng(seed).normal(0, noise, n * runs), 0, 1
    )
    labels = np.repeat([f"s{i}" for i in range(runs)], n)
    kwargs: dict[str, Any] = {"free_r0": True} if r0 == "free" else {"r0": params["R0"]} if r0 == "given" else {}
    out = fit_sigmoid(compute, value, labels, bootstrap=30, seed=seed, level=level, **kwargs)
    assert out.level == level
    for name in out.intervals_missing_their_estimate():
        assert any(w.startswith(f"The {level:.0%} interval of {name} ") for w in out.warnings), out.warnings
    assert out.bootstrap + sum(out.bootstrap_failed.values()) == out.bootstrap_run
    if out.bootstrap < out.bootstrap_run:
        assert any("bootstrap refits were left out" in w for w in out.warnings)


def test_the_outcome_checks_itself_whoever_made_it() -> None:
    """The check lives in FitOutcome: an interval that misses its estimate, or counts that do not add up, are
    flagged however the outcome was made (a fitter, or a stored row read back), once."""
    p = ParameterEstimate(value=0.6631, ci_low=0.7085, ci_high=0.7262)
    out = FitOutcome(
        model="scalerl",
        method="robust",
        parameters={"A": p, "B": ParameterEstimate(value=1.2, ci_low=1.0, ci_high=1.4)},
        rmse=0.01,
        objective=0,
        converged=True,
        message="",
        bootstrap=196,
        bootstrap_run=200,
        bootstrap_failed={"the Huber reweighting did not settle within the round limit": 3},
        bootstrap_draws=[{"A": 0.71 + 0.0001 * i} for i in range(196)],
        points_used=100,
        duration_s=0,
    )
    assert interval_warning("A", p, 0.95, 0.0) in out.warnings and out.intervals_missing_their_estimate() == ["A"]
    assert out.bootstrap_failed["left out without a recorded reason"] == 1
    [counts] = [w for w in out.warnings if "refits were left out" in w]
    assert "4 of 200" in counts and "3: the Huber reweighting" in counts and "1: left out without" in counts
    again = FitOutcome.model_validate(out.model_dump())
    assert again.warnings == out.warnings  # read back: checked again, nothing doubled


def test_chinchilla_intervals_honour_the_level_and_count_the_resamples() -> None:
    from servers.scaling.fit_chinchilla import fit_chinchilla

    rng = np.random.default_rng(0)
    n = 10 ** rng.uniform(8, 10, 40)
    d = 10 ** rng.uniform(9.7, 11.7, 40)
    loss = (1.82 + 482 / n**0.348 + 2085 / d**0.366) * np.exp(rng.normal(0, 0.005, 40))
    wide = fit_chinchilla(n, d, loss, bootstrap=20, seed=1)
    narrow = fit_chinchilla(n, d, loss, bootstrap=20, seed=1, level=0.5)
    assert wide.level == 0.95 and narrow.level == 0.5 and narrow.bootstrap_run == 20
    a, b = wide.parameters["alpha"], narrow.parameters["alpha"]
    assert a.ci_low <= b.ci_low <= b.ci_high <= a.ci_high


@anyio
async def test_the_fit_report_counts_the_bootstrap_and_honours_the_level(suite_client: Client) -> None:
    points = points_of(EARLY, 3)
    result = await suite_client.call_tool(
        "fit_scaling_law", {"model": "scalerl", "data": {"points": points}, "bootstrap": 100, "level": 0.8}
    )
    report = result.structured_content
    assert report["level"] == 0.8 and report["bootstrap_requested"] == report["bootstrap_run"] == 100
    assert report["bootstrap"] + sum(report["bootstrap_failed"].values()) == 100
    assert f"bootstrap: {report['bootstrap']} of 100 resamples used" in result.content[0].text
    assert "intervals at 80%" in result.content[0].text
    wide = await ok(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"points": points}, "bootstrap": 100})
    a80, a95 = report["parameters"]["A"], wide["parameters"]["A"]
    assert a95["ci_low"] <= a80["ci_low"] <= a80["value"] <= a80["ci_high"] <= a95["ci_high"]
    r0 = report["parameters"]["R0"]
    assert r0["fixed"] and "first value" in r0["note"]


# ---- 5: one default R0 -------------------------------------------------------------------------------------------


@anyio
async def test_the_tool_takes_r0_by_the_domain_rule_excluded_start_points_included(suite_client: Client) -> None:
    c, v = noisy(TRUE, 100, 50_000, 30, 0.01, 9)
    late_c, late_v = noisy({**TRUE, "R0": 0.35}, 400, 50_000, 20, 0.01, 10)  # starts 4x later: not in R0
    points = [{"compute": float(a), "value": float(b), "run": "s0"} for a, b in zip(c, v, strict=True)]
    points += [{"compute": float(a), "value": float(b), "run": "s1"} for a, b in zip(late_c, late_v, strict=True)]
    report = await ok(
        suite_client,
        "fit_scaling_law",
        {"model": "scalerl", "data": {"points": points}, "bootstrap": 0, "min_compute": 300},
    )
    assert report["parameters"]["R0"]["value"] == pytest.approx(float(v[0]))  # s0's first value, though excluded
    direct = fit_sigmoid(
        [p["compute"] for p in points], [p["value"] for p in points], [p["run"] for p in points], bootstrap=0
    )
    assert direct.parameters["R0"].value == pytest.approx(float(v[0]))  # the fit's own default: the same rule


# ---- 8: compute on CPU, and 1 with two real tiny-grpo runs ------------------------------------------------------


def test_where_a_jobs_compute_was_spent() -> None:
    assert job_device({}, [{"device": "cpu"}, {"device": "cpu"}]) == "cpu"
    assert job_device({"gpus_wanted": 2, "gpus": [0, 1]}, [{"device": "cuda"}]) == "cuda"
    assert job_device({"gpus_wanted": 0, "gpus": []}, []) == "cpu"  # an older run without a device column
    assert job_device({"gpus_wanted": 1, "gpus": [0]}, []) == "cuda"
    assert job_device({}, [{"pass_rate": 0.3}]) is None  # not a training job, no device logged: nothing said


@anyio
async def test_gpu_hours_of_a_cpu_run_from_a_file_are_fitted_with_a_plain_warning(
    suite_client: Client, tmp_path: Path
) -> None:
    compute, value = noisy(TRUE, 1e-4, 1e-1, 30, 0.01, 11)
    rows = [
        {"pass_rate": float(v), "compute_gpu_hours": float(c), "compute_flops": float(c) * 1e12, "device": "cpu"}
        for c, v in zip(compute, value, strict=True)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {"path": str(tmp_path / "metrics.jsonl"), "columns": {"compute": GPU_HOURS_COLUMN, "value": "pass_rate"}}
    wall = await ok(suite_client, "fit_scaling_law", {"model": "scalerl", "bootstrap": 0, "data": data})
    assert any("CPU-process wall hours" in w and "these metrics have it" in w for w in wall["warnings"])
    flops = {**data, "columns": {"compute": "compute_flops", "value": "pass_rate"}}
    clean = await ok(suite_client, "fit_scaling_law", {"model": "scalerl", "bootstrap": 0, "data": flops})
    assert clean["compute_unit"] == "flops" and not any("wall" in w for w in clean["warnings"])


@anyio
@pytest.mark.timeout(300)
async def test_two_real_tiny_grpo_runs_compared_on_deterministic_compute(auto_client: Client) -> None:
    """Two real runs (lr 0.02 and 0.005), small enough for CI (800 steps each, ~10 s each on 2 cores): fitted from
    the jobs without naming the compute column (compute_flops by default on CPU, in FLOPs), compared, and the
    comparison checked against predict_scaling; GPU-hours on CPU are fitted only with a plain warning."""
    args = ["--steps", "800", "--evals", "24", "--eval-size", "512", "--ckpt-every", "0"]
    jobs = {}
    for lr in ("0.02", "0.005"):
        spec = {"recipe": "tiny-grpo", "args": [*args, "--lr", lr], "name": f"lr{lr}"}
        jobs[lr] = await ok(auto_client, "submit_training_job", {"spec": spec, "wait_s": 0})
    fits = {}
    for lr, job in jobs.items():
        done = await finish_job(auto_client, job["job_id"], 240)
        assert done["state"] == "SUCCEEDED", done["reason"]
        fits[lr] = await ok(
            auto_client,
            "fit_scaling_law",
            {
                "model": "scalerl",
                "label": f"lr{lr}",
                "data": {"job_id": job["job_id"], "columns": {"value": "pass_rate"}},
            },
        )
        assert fits[lr]["compute_unit"] == "flops" and fits[lr]["converged"]
        assert any("compute_flops was used (the job ran on CPU" in w for w in fits[lr]["warnings"])
    wall = await ok(
        auto_client,
        "fit_scaling_law",
        {
            "model": "scalerl",
            "bootstrap": 0,
            "data": {"job_id": jobs["0.02"]["job_id"], "columns": {"compute": GPU_HOURS_COLUMN, "value": "pass_rate"}},
        },
    )
    assert wall["compute_unit"] == "gpu_hours"
    assert any("CPU-process wall hours" in w and "compute_flops" in w for w in wall["warnings"])
    ids = [fits["0.02"]["fit_id"], fits["0.005"]["fit_id"]]
    cmp = await ok(auto_client, "compare_scaling_fits", {"fit_ids": ids})
    [pair] = cmp["pairs"]
    checked = 0
    for r in pair["regions"]:
        if r["leader"] is None:
            continue
        at = [float(c) for c in np.geomspace(r["low"], r["high"], 5)]
        a = await ok(auto_client, "predict_scaling", {"fit_id": ids[0], "compute": at})
        b = await ok(auto_client, "predict_scaling", {"fit_id": ids[1], "compute": at})
        for u, v in zip(a["values"], b["values"], strict=True):
            assert (u["value"] > v["value"]) == (r["leader"] == ids[0]), (r, u, v)
            checked += 1
    assert "ahead" in pair["verdict"] or "indistinguishable" in pair["verdict"]
    assert checked or all(r["leader"] is None for r in pair["regions"])


# ---- list_scaling_fits: notices and damaged rows -------------------------------------------------------------------


@anyio
async def test_list_scaling_fits_counts_damaged_rows_apart(suite_client: Client, app: App) -> None:
    made = []
    for seed in range(3):
        made.append(
            await ok(
                suite_client,
                "fit_scaling_law",
                {"model": "scalerl", "data": {"points": points_of(EARLY, seed)}, "bootstrap": 0},
            )
        )
    with contextlib.closing(sqlite3.connect(app.settings.db_path)) as conn, conn:
        conn.execute("UPDATE fits SET outcome = '{broken' WHERE id = ?", (made[0]["fit_id"],))  # not JSON
        conn.execute("UPDATE fits SET points = '[{\"compute\": -1}]' WHERE id = ?", (made[1]["fit_id"],))  # invalid
    result = await suite_client.call_tool("list_scaling_fits", {})
    listed = result.structured_content
    assert [f["fit_id"] for f in listed["fits"]] == [made[2]["fit_id"]]
    assert listed["total"] == 1 and listed["damaged"] == 2 and listed["next_offset"] is None
    assert any(made[1]["fit_id"] in n and "damaged" in n for n in listed["notices"])
    assert "1 fit(s), 2 damaged (not listed)" in result.content[0].text
    # a row whose JSON is intact but does not validate is found when a page reaches it (counting it up front
    # would mean reading every stored fit): a page that does not reach it counts it as a fit still
    paged = await ok(suite_client, "list_scaling_fits", {"limit": 1})
    assert paged["next_offset"] == 1 and (paged["total"], paged["damaged"]) == (2, 1)
    rest = await ok(suite_client, "list_scaling_fits", {"limit": 1, "offset": 1})
    assert rest["fits"] == [] and rest["next_offset"] is None and (rest["total"], rest["damaged"]) == (1, 2)


@anyio
async def test_list_scaling_fits_says_when_the_database_was_moved_aside(tmp_path: Path) -> None:
    settings_ = Settings(home=tmp_path / "state", cancel_grace_s=1.0, allowed_roots=[tmp_path])
    async with Client(create_test_suite(App(settings_, owner="test", child_env=CHILD_ENV)), mode="auto") as client:
        await ok(
            client, "fit_scaling_law", {"model": "scalerl", "data": {"points": points_of(EARLY, 0)}, "bootstrap": 0}
        )
    db = settings_.db_path
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    (tmp_path / "replacement").write_bytes(b"this is not an SQLite file" * 100)
    os.replace(tmp_path / "replacement", db)
    forget_prepared(db)
    assert FitStore(settings_).notices()  # the store itself knows
    async with Client(create_test_suite(App(settings_, owner="test", child_env=CHILD_ENV)), mode="auto") as client:
        result = await client.call_tool("list_scaling_fits", {})
    listed = result.structured_content
    assert listed["total"] == 0 and any("moved aside" in n for n in listed["notices"])
    assert "moved aside" in result.content[0].text
