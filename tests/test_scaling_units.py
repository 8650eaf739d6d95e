"""Scaling helpers below the MCP layer: inverting curves, reading data files, the default R0, crossings."""

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.scaling import analysis, laws
from servers.scaling.data import Columns, DataPoint, points_from_rows, read_rows
from servers.scaling.fit_sigmoid import default_r0, start_points
from servers.scaling.fitstore import StoredFit
from servers.scaling.fitting import FitOutcome, ParameterEstimate
from servers.scaling.server import r0_start_points


@given(
    a=st.floats(0.3, 0.95),
    b=st.floats(0.3, 4),
    c_mid=st.floats(10, 1e5),
    r0=st.floats(0.0, 0.25),
    fraction=st.floats(0.02, 0.98),
)
@settings(max_examples=200, deadline=None, derandomize=True)
def test_compute_to_reach_inverts_the_scalerl_curve(
    a: float, b: float, c_mid: float, r0: float, fraction: float
) -> None:
    params = {"A": a, "B": b, "C_mid": c_mid, "R0": r0}
    target = r0 + fraction * (a - r0)
    needed = analysis.compute_to_reach("scalerl", params, target)
    assert needed is not None and needed > 0
    assert laws.scalerl(needed, **params) == pytest.approx(target, abs=1e-9)
    assert analysis.compute_to_reach("scalerl", params, a + 1e-6) is None
    assert analysis.compute_to_reach("scalerl", params, r0 - 1e-6) == 0.0


@given(a=st.floats(0.3, 2.0), b=st.floats(0.05, 2), d=st.floats(0.01, 100), gap=st.floats(1e-3, 0.9))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_compute_to_reach_inverts_the_power_law(a: float, b: float, d: float, gap: float) -> None:
    params = {"A": a, "B": b, "D": d}
    needed = analysis.compute_to_reach("power_law", params, a - gap)
    assert needed is not None
    if math.isfinite(needed) and needed < 1e300:
        assert laws.power_law(needed, **params) == pytest.approx(a - gap, rel=1e-6, abs=1e-9)


def test_chinchilla_target_along_the_compute_optimal_path() -> None:
    params = laws.CHINCHILLA_PUBLISHED
    flops = analysis.compute_to_reach("chinchilla", params, 2.0)
    assert flops is not None and laws.compute_optimal(flops, params).loss == pytest.approx(2.0, rel=1e-6)
    assert analysis.compute_to_reach("chinchilla", params, params["E"]) is None


def test_reading_files(tmp_path: Path) -> None:
    keys = ["compute", "value", "run"]
    good = tmp_path / "a.jsonl"
    good.write_text('{"compute": 1, "value": 0.2, "other": "x"}\n\n{"compute": 2, "value": 0.3, "run": 7}\n')
    rows, present = read_rows(good, keys, "a.jsonl")
    assert rows[0] == {"compute": 1, "value": 0.2} and present == set(keys)  # only the named columns are kept
    points = points_from_rows(rows, present, "scalerl", Columns(), "a.jsonl")
    assert [p.compute for p in points] == [1, 2] and points[1].run == "7"
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"compute": 1}\nnot json\n')
    with pytest.raises(InputError, match="line 2 is not JSON"):
        read_rows(bad, keys, "b.jsonl")
    with pytest.raises(InputError, match=r"unsupported file type '\.parquet'"):
        read_rows(tmp_path / "x.parquet", keys, "x.parquet")
    negative = tmp_path / "c.csv"
    negative.write_text("compute,value\n-3,0.2\n")
    with pytest.raises(InputError, match="row 0: compute: Input should be greater than 0"):
        points_from_rows(*read_rows(negative, keys, "c.csv"), "scalerl", Columns(), "c.csv")
    empty = tmp_path / "d.csv"
    empty.write_text("")
    with pytest.raises(InputError, match="no header row"):
        read_rows(empty, keys, "d.csv")


def test_default_r0_is_where_each_run_starts_one_rule_for_the_fit_and_the_tool() -> None:
    """Issue 10, 5: the tool used its own R0 (every run's first value), the fit another (runs that start more than
    5% later left out). Now there is one rule, in fit_sigmoid, and the tool takes its start points from it."""
    rows = [(10, 0.2, "a"), (100, 0.4, "a"), (20, 0.3, "b"), (5, 0.26, "b"), (5.2, 0.3, "c"), (50, 0.5, "c")]
    points = [DataPoint(compute=c, value=v, run=r) for c, v, r in rows]
    # run a starts at 10, twice the earliest start (5): left out; c starts within 5% of it: kept
    assert start_points(*zip(*rows, strict=True)) == [("b", 5.0, 0.26), ("c", 5.2, 0.3)]
    compute, value, runs = r0_start_points(points)
    assert default_r0(compute, value, runs) == pytest.approx((0.26 + 0.3) / 2)
    assert default_r0(*zip(*rows, strict=True)) == pytest.approx((0.26 + 0.3) / 2)


def _fit(params: dict[str, float], rmse: float = 0.01, fit_id: str = "fit-1") -> StoredFit:
    outcome = FitOutcome(
        model="scalerl",
        method="robust",
        parameters={k: ParameterEstimate(value=v) for k, v in params.items()},
        rmse=rmse,
        objective=0,
        converged=True,
        message="",
        bootstrap=0,
        points_used=10,
        duration_s=0,
    )
    points = [DataPoint(compute=float(c), value=0.3) for c in np.geomspace(100, 10_000, 10)]
    return StoredFit(
        id=fit_id,
        label=None,
        model="scalerl",
        method="robust",
        compute_unit="gpu_hours",
        created_at=0,
        source="inline",
        options={},
        outcome=outcome,
        points=points,
        excluded=[],
    )


def test_crossings_are_every_change_of_order_and_ties_near_the_start_are_regions() -> None:
    early = _fit({"A": 0.6, "B": 2.0, "C_mid": 1000, "R0": 0.25})
    # late starts 0.003 above early (a tie within the RMSE), early overtakes it, then late overtakes early
    late = _fit({"A": 0.7, "B": 2.0, "C_mid": 5000, "R0": 0.256}, fit_id="fit-2")
    crossed = analysis.crossings(early, late)
    assert len(crossed) == 2 and crossed[0] < 1000 < crossed[1] < 100_000  # what the fitted curves do
    for cross in crossed:
        gap = laws.scalerl(cross, **analysis.point_params(early)) - laws.scalerl(cross, **analysis.point_params(late))
        assert abs(gap) < 1e-9
    # without bootstrap draws, a lead must exceed the larger RMSE (0.01): the start is a tie, not late's lead
    regions = analysis.lead_regions(early, late, 0.95)
    assert [r.leader for r in regions] == [None, "fit-1", None, "fit-2", "fit-2"]
    assert [r.extrapolated for r in regions] == [False, False, False, False, True]  # the data end at 10,000
    assert regions[1].low > crossed[0] and regions[3].low > crossed[1] and regions[3].high == regions[4].low == 10_000
    assert regions[0].low == 100 and regions[-1].high == pytest.approx(1e6)
    assert all(a.high == b.low for a, b in itertools.pairwise(regions))  # they cover the range
    assert analysis.crossings(early, _fit({"A": 0.5, "B": 2.0, "C_mid": 1000, "R0": 0.25})) == []
