"""Issue 25, the scaling tools an adaptive study leans on:
- compare_scaling_fits at a compute (at_compute): each fit's fitted value there and, per pair, the share of
  bootstrap draw pairs with the first curve above the second there; without at_compute nothing changes;
- a fit is stored once: the same law, points, settings and label return the stored fit (stored_before), so a rerun
  of a study does not grow the store, and any changed setting is a new fit;
- plot_scaling_fit's y axis names the metric, and its legend names what is drawn (held out points as held out).

Deterministic: fixed seeds; nothing is timed."""

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from servers.core.settings import Settings
from servers.scaling.data import DataPoint
from servers.scaling.fitstore import FitStore, StoredFit, fit_digest
from servers.scaling.plot import curves_figure, plot_curves
from tests.helpers import call_ok as ok

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

TRUE = {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.25}


def scalerl(c: np.ndarray, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:  # noqa: N803
    return R0 + (A - R0) / (1 + (C_mid / c) ** B)


def curve_points(seed: int = 0, n: int = 30, high: float = 50_000, **params: float) -> list[dict[str, float]]:
    p = {**TRUE, **params}
    rng = np.random.default_rng(seed)
    c = np.geomspace(100, high, n)
    v = np.clip(scalerl(c, **p) + rng.normal(0, 0.01, n), 0, 1)
    return [{"compute": float(x), "value": float(y)} for x, y in zip(c, v, strict=True)]


async def fit(client: Client, points: list[dict[str, float]], **kwargs: Any) -> dict[str, Any]:
    args = {"model": "scalerl", "data": {"points": points}, "bootstrap": 60, **kwargs}
    return await ok(client, "fit_scaling_law", args)


async def compare(client: Client, *ids: str, **kwargs: Any) -> dict[str, Any]:
    return await ok(client, "compare_scaling_fits", {"fit_ids": list(ids), **kwargs})


def without_at(comparison: dict[str, Any]) -> dict[str, Any]:
    """The comparison less what at_compute adds (its fields, and the sentence it appends to each verdict)."""
    out = json.loads(json.dumps(comparison))
    out.pop("at_compute", None)
    for row in out["fits"]:
        row.pop("value_at", None)
    for pair in out["pairs"]:
        pair.pop("p_first_higher_at", None)
        before = pair["verdict"].split(" At ")[0]
        out["verdict"] = out["verdict"].replace(pair["verdict"], before)
        pair["verdict"] = before
    return out


# ---- compare at a compute -------------------------------------------------------------------------------------


async def test_at_compute_a_clearly_higher_curve_leads_in_nearly_every_draw_pair(suite_client: Client) -> None:
    low = await fit(suite_client, curve_points(seed=1), label="low")
    high = await fit(suite_client, curve_points(seed=2, A=0.75), label="high")
    target = 40_000.0
    cmp = await compare(suite_client, high["fit_id"], low["fit_id"], at_compute=target)
    [pair] = cmp["pairs"]
    assert cmp["at_compute"] == target
    assert pair["p_first_higher_at"] > 0.97
    assert "high higher in" in pair["verdict"] and "(at least 95%)" in pair["verdict"]
    # value_at is the fitted curve there, as predict_scaling gives it
    for row in cmp["fits"]:
        predicted = await ok(suite_client, "predict_scaling", {"fit_id": row["fit_id"], "compute": [target]})
        assert row["value_at"] == pytest.approx(predicted["values"][0]["value"], rel=1e-9)
    assert cmp["fits"][0]["value_at"] > cmp["fits"][1]["value_at"] + 0.1
    # the other order: the complement (ties count half, so the two orders add up to 1)
    back = await compare(suite_client, low["fit_id"], high["fit_id"], at_compute=target)
    assert back["pairs"][0]["p_first_higher_at"] == pytest.approx(1 - pair["p_first_higher_at"])
    # beyond the data it says so
    far = await compare(suite_client, high["fit_id"], low["fit_id"], at_compute=5e6)
    assert "At 5e+06 gpu_hours (extrapolated)" in far["pairs"][0]["verdict"]


async def test_at_compute_identical_data_is_a_coin_flip(suite_client: Client) -> None:
    points = curve_points(seed=3)
    a = await fit(suite_client, points, label="a", seed=0, bootstrap=200)
    b = await fit(suite_client, points, label="b", seed=1, bootstrap=200)  # independent resamples of the same data
    cmp = await compare(suite_client, a["fit_id"], b["fit_id"], at_compute=20_000)
    [pair] = cmp["pairs"]
    assert 0.35 < pair["p_first_higher_at"] < 0.65
    assert cmp["fits"][0]["value_at"] == pytest.approx(cmp["fits"][1]["value_at"], abs=1e-9)
    assert "no call" in pair["verdict"]
    # the same resamples (same seed): every draw pair ties, which counts half, not as the second being higher
    twin = await fit(suite_client, points, label="a twin", seed=0, bootstrap=200)
    [tied] = (await compare(suite_client, a["fit_id"], twin["fit_id"], at_compute=20_000))["pairs"]
    assert tied["p_first_higher_at"] == 0.5


async def test_without_at_compute_nothing_is_added(suite_client: Client) -> None:
    x = await fit(suite_client, curve_points(seed=4), label="x")
    y = await fit(suite_client, curve_points(seed=5, A=0.66, C_mid=6000), label="y")
    plain = await compare(suite_client, x["fit_id"], y["fit_id"])
    text = json.dumps(plain)
    assert "at_compute" not in plain and "value_at" not in text and "p_first_higher_at" not in text
    assert " At " not in plain["verdict"]
    at = await compare(suite_client, x["fit_id"], y["fit_id"], at_compute=30_000)
    assert without_at(at) == plain  # the same output, plus the new fields and the sentence
    assert at["pairs"][0]["verdict"].startswith(plain["pairs"][0]["verdict"] + " At 3e+04 gpu_hours: x ")


async def test_at_compute_without_draws_has_values_and_no_probability(suite_client: Client) -> None:
    x = await fit(suite_client, curve_points(seed=6), label="x", bootstrap=0)
    y = await fit(suite_client, curve_points(seed=7, A=0.7), label="y", bootstrap=0)
    cmp = await compare(suite_client, x["fit_id"], y["fit_id"], at_compute=30_000)
    [pair] = cmp["pairs"]
    assert "p_first_higher_at" not in pair and all(isinstance(r["value_at"], float) for r in cmp["fits"])
    assert "point estimates only: no bootstrap draws" in pair["verdict"].split(" At ")[1]


# ---- fits stored once ------------------------------------------------------------------------------------------


async def test_the_same_fit_is_stored_once_and_a_changed_setting_is_a_new_fit(suite_client: Client) -> None:
    points = curve_points(seed=8)
    settings = {"label": "v1", "max_compute": 20_000.0, "min_compute": 150.0, "y_max": 1.0, "seed": 3, "bootstrap": 10}
    first = await fit(suite_client, points, **settings)
    assert "stored_before" not in first
    result = await suite_client.call_tool(
        "fit_scaling_law", {"model": "scalerl", "data": {"points": points}, **settings}
    )
    again = result.structured_content
    assert again["fit_id"] == first["fit_id"] and again["stored_before"] is True
    assert "stored before" in result.content[0].text
    assert {k: v for k, v in again.items() if k != "stored_before"} == first
    listed = await ok(suite_client, "list_scaling_fits", {})
    assert listed["total"] == 1 and "stored_before" not in listed["fits"][0]
    changes: list[dict[str, Any]] = [
        {"label": "v2"},
        {"max_compute": 30_000.0},
        {"min_compute": 200.0},
        {"y_max": 0.9},
        {"seed": 4},
        {"bootstrap": 11},
        {"level": 0.9},
        {"method": "scalerl-grid", "bootstrap": 0},
        {"compute_unit": "gpu-hours"},
        {"r0": "free"},
    ]
    ids = {first["fit_id"]}
    for change in changes:
        other = await fit(suite_client, points, **{**settings, **change})
        assert "stored_before" not in other and other["fit_id"] not in ids, change
        ids.add(other["fit_id"])
    moved = [dict(p, value=p["value"] + (1e-9 if i == 5 else 0)) for i, p in enumerate(points)]  # one point moved
    ids.add((await fit(suite_client, moved, **settings))["fit_id"])
    assert len(ids) == len(changes) + 2
    assert (await ok(suite_client, "list_scaling_fits", {"limit": 100}))["total"] == len(ids)


async def test_a_rerun_of_an_extrapolation_check_does_not_grow_the_store(suite_client: Client) -> None:
    args = {"data": {"points": curve_points(seed=9)}, "bootstrap": 20}
    first = await ok(suite_client, "check_extrapolation", args)
    again = await ok(suite_client, "check_extrapolation", args)
    assert [m["fit_id"] for m in again["models"]] == [m["fit_id"] for m in first["models"]]
    assert (await ok(suite_client, "list_scaling_fits", {}))["total"] == 2


def _outcome_of(stored: StoredFit) -> dict[str, Any]:
    return {
        "label": stored.label,
        "compute_unit": stored.compute_unit,
        "source": stored.source,
        "options": stored.options,
        "outcome": stored.outcome,
        "points": stored.points,
        "excluded": stored.excluded,
    }


async def test_the_store_adds_once_per_digest_and_migrates_an_old_table(
    suite_client: Client, settings: Settings
) -> None:
    report = await fit(suite_client, curve_points(seed=10), label="old", bootstrap=0)
    store = FitStore(settings)
    stored = store.get(report["fit_id"])
    parts = _outcome_of(stored)
    digest = fit_digest(
        model=stored.model,
        label=stored.label,
        compute_unit=stored.compute_unit,
        options=stored.options,
        points=stored.points,
    )
    found = store.find(digest)
    assert found is not None and found.id == stored.id
    same, before = store.add(**parts, digest=digest)
    assert before and same.id == stored.id
    plain, before = store.add(**parts)  # no digest: always added
    assert not before and plain.id != stored.id
    assert store.list_fits(limit=100, offset=0).total == 2
    # a table made before the digest column: opening the store adds it, the old rows stay readable, unmatched
    with sqlite3.connect(settings.db_path) as conn:
        conn.execute("ALTER TABLE fits RENAME TO fits_now")
        conn.execute(
            "CREATE TABLE fits (id TEXT PRIMARY KEY, label TEXT, model TEXT NOT NULL, method TEXT NOT NULL, "
            "compute_unit TEXT NOT NULL, created_at REAL NOT NULL, source TEXT NOT NULL, options TEXT NOT NULL, "
            "outcome TEXT NOT NULL, points TEXT NOT NULL, excluded TEXT NOT NULL)"
        )
        conn.execute(
            "INSERT INTO fits SELECT id, label, model, method, compute_unit, created_at, source, options, outcome, "
            "points, excluded FROM fits_now"
        )
        conn.execute("DROP TABLE fits_now")
    reopened = FitStore(settings)
    with sqlite3.connect(settings.db_path) as conn:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(fits)")}
        indexes = {r[1] for r in conn.execute("PRAGMA index_list(fits)")}
    assert "digest" in columns and "fits_digest" in indexes
    assert reopened.get(stored.id).outcome == stored.outcome and reopened.find(digest) is None
    _, before = reopened.add(**parts, digest=digest)
    _, again = reopened.add(**parts, digest=digest)
    assert not before and again and reopened.list_fits(limit=100, offset=0).total == 3


# ---- the plot ------------------------------------------------------------------------------------------------------


def _legend(fig: Any) -> list[str]:
    [ax] = fig.axes
    return [t.get_text() for t in ax.get_legend().get_texts()]


async def test_plot_names_the_metric_and_its_legend_what_is_drawn(
    suite_client: Client, settings: Settings, tmp_path: Path
) -> None:
    points = curve_points(seed=11)
    csv = tmp_path / "run.csv"
    csv.write_text("gpu_hours,val_accuracy\n" + "".join(f"{p['compute']},{p['value']}\n" for p in points))
    data = {"path": str(csv), "columns": {"compute": "gpu_hours", "value": "val_accuracy"}}
    split = await ok(
        suite_client,
        "fit_scaling_law",
        {"model": "scalerl", "data": data, "bootstrap": 30, "label": "half", "min_compute": 150, "max_compute": 8000},
    )
    plain = await fit(suite_client, points, label="inline", bootstrap=0)
    store = FitStore(settings)
    half, inline = store.get(split["fit_id"]), store.get(plain["fit_id"])
    import matplotlib.pyplot as plt

    fig = curves_figure([half], None, 0.95, 900, 560)
    try:
        [ax] = fig.axes
        assert ax.get_ylabel() == "val_accuracy"
        legend = _legend(fig)
        assert legend == [
            "half: fitted points",
            "half: held out (compute > 8000)",
            "half: below min_compute, not fitted",
            f"half: scalerl A={half.outcome.parameters['A'].value:.3f}",
            "95% bootstrap band (curve's colour)",
            "asymptote (dotted, curve's colour)",
            "extrapolated",
        ]
        held = [c for c in ax.collections if "held out" in str(c.get_label())]
        [marks] = held
        assert len(marks.get_offsets()) == sum(1 for p in points if p["compute"] > 8000)
        assert np.all(marks.get_facecolors()[:, 3] == 0)  # hollow, as the loop's report describes them
    finally:
        plt.close(fig)
    fig = curves_figure([inline], None, 0.95, 900, 560)  # no draws, nothing excluded: no band, no hollow marks
    try:
        [ax] = fig.axes
        assert ax.get_ylabel() == "value"
        assert _legend(fig) == [
            "inline: fitted points",
            f"inline: scalerl A={inline.outcome.parameters['A'].value:.3f}",
            "asymptote (dotted, curve's colour)",
            "extrapolated",  # the margin right of the last point is shaded (drawn), so it is named
        ]
        assert len(ax.collections) == 1  # the fitted points only: no band, no other marks
    finally:
        plt.close(fig)
    fig = curves_figure([half, inline], 1e6, 0.9, 900, 560)  # two metrics: both named
    try:
        assert fig.axes[0].get_ylabel() == "val_accuracy / value"
        assert "90% bootstrap band (curve's colour)" in _legend(fig) and "extrapolated" in _legend(fig)
    finally:
        plt.close(fig)
    assert plot_curves([half], None, 0.95, 640, 400)[:8] == b"\x89PNG\r\n\x1a\n"


async def test_inline_points_named_by_columns_and_a_run_metric_label_the_axis(
    suite_client: Client, settings: Settings
) -> None:
    data = {"points": curve_points(seed=12), "columns": {"value": "reward"}}
    named = await ok(suite_client, "fit_scaling_law", {"model": "scalerl", "data": data, "bootstrap": 0})
    stored = FitStore(settings).get(named["fit_id"])
    assert stored.options["metric"] == "reward"
    run = stored.model_copy(update={"options": {**stored.options, "run": {"metric_key": "eval/pass@1"}}})
    import matplotlib.pyplot as plt

    for which, expected in ((stored, "reward"), (run, "eval/pass@1")):
        fig = curves_figure([which], None, 0.95, 640, 400)
        try:
            assert fig.axes[0].get_ylabel() == expected
        finally:
            plt.close(fig)


def test_digest_is_of_the_points_not_their_order_of_keys() -> None:
    base: dict[str, Any] = {"model": "scalerl", "label": None, "compute_unit": "flops", "options": {"a": 1, "b": 2}}
    pts = [DataPoint(compute=1.0, value=0.5)]
    d = fit_digest(**base, points=pts)
    assert d == fit_digest(**{**base, "options": {"b": 2, "a": 1}}, points=pts)
    assert d != fit_digest(**base, points=[DataPoint(compute=1.0, value=0.5000000000000001)])
    assert d != fit_digest(**{**base, "label": "x"}, points=pts)
