"""benchmarks/forecast_quality.py: its scoring (Wilson intervals, coverage, the widening factor, the target) and
one real tiny-grpo run produced, cached, read through servers/runs and forecast by the scaling tools in-process."""

from __future__ import annotations

import math
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from benchmarks import forecast_quality as fq


@pytest.mark.parametrize(("k", "n"), [(8, 10), (0, 4), (20, 20), (16, 25), (1, 1)])
def test_wilson_matches_scipy(k: int, n: int) -> None:
    ci = binomtest(k, n).proportion_ci(0.95, method="wilson")
    low, high = fq.wilson(k, n)
    assert low == pytest.approx(ci.low, abs=1e-7)
    assert high == pytest.approx(ci.high, abs=1e-7)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 500), data=st.data())
def test_wilson_holds_the_rate(n: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, n))
    low, high = fq.wilson(k, n)
    assert 0.0 <= low <= k / n <= high <= 1.0


def test_scaled_miss_and_covered() -> None:
    interval = (0.4, 0.7)  # asymmetric around 0.5: the half on each side is used
    assert fq.scaled_miss(0.5, interval, 0.6) == pytest.approx(0.5)
    assert fq.scaled_miss(0.5, interval, 0.3) == pytest.approx(2.0)
    assert fq.scaled_miss(0.5, (0.5, 0.5), 0.6) == math.inf
    assert fq.scaled_miss(0.5, (None, 0.7), 0.6) is None
    assert fq.covered(interval, 0.7) is True
    assert fq.covered(interval, 0.71) is False
    assert fq.covered((None, None), 0.5) is None


def row(run: str, predicted: float, pi: tuple[float, float], observed: float, law: str = "scalerl") -> fq.Row:
    return fq.Row(
        run=run,
        recipe="tiny-grpo",
        law=law,
        reader="suite",
        points_total=10,
        points_fitted=8,
        final_compute=1e10,
        observed=observed,
        observed_tail_mean=observed,
        predicted=predicted,
        pi=pi,
        ci=pi,
        abs_error=abs(predicted - observed),
        pi_covered=fq.covered(pi, observed),
        ci_covered_tail=fq.covered(pi, observed),
        pi_scaled_miss=fq.scaled_miss(predicted, pi, observed),
        error=None,
        warnings=[],
        notes=[],
    )


def test_summary_target_and_widening() -> None:
    # 10 forecasts at 0.5 with interval [0.4, 0.6]; truths at 0.5 + 0.02 * i: 6 inside (i <= 5), 4 outside.
    rows = [row(f"r{i}", 0.5, (0.4, 0.6), 0.5 + 0.02 * i) for i in range(10)]
    failed = row("bad", 0.5, (0.4, 0.6), 0.5)
    failed.predicted = failed.abs_error = failed.pi_covered = failed.pi_scaled_miss = None
    failed.error = "fit_scaling_law: refused"
    s = fq.summarize([*rows, failed, row("other", 0.5, (0.4, 0.6), 0.9, law="power_law")], "scalerl")
    assert s["runs"] == 11 and s["failed"] == 1
    assert s["pi_coverage"]["covered"] == 6 and s["pi_coverage"]["n"] == 10
    assert not s["target_met"]  # 60% is more than 10 points from 80%
    assert s["median_abs_error"] == pytest.approx(0.09)
    # misses in half-widths: 0, 0.2, ..., 1.8; their 80th percentile (interpolated) is 1.44: too narrow by that
    assert s["pi_scale_for_level"] == pytest.approx(1.44)
    assert "too narrow" in fq.verdict(s) and "1.44" in fq.verdict(s)
    met = fq.summarize([row(f"r{i}", 0.5, (0.4, 0.6), 0.5 + 0.011 * i) for i in range(10)], "scalerl")
    assert met["pi_coverage"]["covered"] == 10 and not met["target_met"]  # 100% is too wide: also a failure
    assert "too wide" in fq.verdict(met)
    near = fq.summarize([row(f"r{i}", 0.5, (0.4, 0.6), 0.5 + 0.0125 * i) for i in range(10)], "scalerl")
    assert near["pi_coverage"]["covered"] == 9 and near["target_met"]  # 90%: within 10 points


def test_variants_are_distinct_and_cached_by_arguments() -> None:
    full = fq.variants(quick=False, trl=True)
    assert len({v.name for v in full}) == len(full) >= 12
    assert len({fq.cache_key(v) for v in full}) == len(full)
    assert {v.recipe for v in full} == {"tiny-grpo", "trl-grpo"}
    assert all(v.recipe == "tiny-grpo" for v in fq.variants(quick=True, trl=False))
    # the key is what the recipe runs with: a default given explicitly is the same run, another value is not
    assert fq.cache_key(fq.tiny("a")) == fq.cache_key(fq.tiny("b", "--seed", "0"))
    assert fq.cache_key(fq.tiny("a")) != fq.cache_key(fq.tiny("a", "--seed", "1"))


@pytest.mark.timeout(180)
def test_one_real_run_produced_cached_read_and_forecast(tmp_path: Path) -> None:
    variant = fq.tiny(
        "tiny-test", "--steps", "80", "--evals", "14", "--eval-size", "64", "--batch-size", "8", "--log-every", "10"
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    log = open(tmp_path / "log.txt", "w")  # noqa: SIM115 (closed below)
    try:
        run_dir, reused = fq.produce(variant, cache, log)
        assert not reused and (run_dir / "DONE").exists()
        again, reused = fq.produce(variant, cache, log)
        assert reused and again == run_dir
        curve = fq.read_curve(variant, run_dir)
        assert curve.reader == "suite" and len(curve.value) == 14
        assert curve.compute == sorted(curve.compute) and all(0 <= v <= 1 for v in curve.value)
        rows = anyio.run(fq.forecast_all, [(variant, curve)], 3, tmp_path / "home", log)
    finally:
        log.close()
    assert [r.law for r in rows] == list(fq.LAWS)
    for r in rows:
        assert r.points_fitted == sum(c <= curve.compute[-1] / 2 for c in curve.compute)
        assert r.observed == curve.value[-1]
        if r.error is None:  # a law may refuse these few points; it says why, and the row counts as failed
            assert r.predicted is not None and r.pi[0] is not None and r.pi[1] is not None
            assert r.pi[0] <= r.predicted <= r.pi[1]
            assert r.pi_covered == (r.pi[0] <= r.observed <= r.pi[1])
        else:
            assert r.predicted is None and r.error
