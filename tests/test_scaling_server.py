"""The scaling tools through in-process MCP clients in both protocol eras: fits from inline points, files and
job metrics; predictions (from fits and from parameters given), extrapolation checks, comparisons, plots,
allocations; and every kind of bad input answered with a readable error and nothing stored."""

import base64
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from mcp import Client
from mcp.types import ImageContent

from tests.helpers import call_error as error
from tests.helpers import call_ok as ok

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

TRUE = {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.25}


def scalerl(c: np.ndarray, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:  # noqa: N803
    return R0 + (A - R0) / (1 + (C_mid / c) ** B)


def curve_points(seed: int = 0, n: int = 40, high: float = 50_000, **params: float) -> list[dict]:
    p = {**TRUE, **params}
    rng = np.random.default_rng(seed)
    c = np.geomspace(100, high, n)
    v = np.clip(scalerl(c, **p) + rng.normal(0, 0.005, n), 0, 1)
    return [{"compute": float(x), "value": float(y)} for x, y in zip(c, v, strict=True)]


def chinchilla_points(n: int = 60, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    params = 10 ** rng.uniform(math.log10(7e7), math.log10(1.6e10), n)
    tokens = 10 ** rng.uniform(math.log10(5e9), math.log10(5e11), n)
    loss = (1.82 + 482 / params**0.348 + 2085 / tokens**0.366) * np.exp(rng.normal(0, 0.005, n))
    return [
        {"params": float(a), "tokens": float(b), "loss": float(c)} for a, b, c in zip(params, tokens, loss, strict=True)
    ]


async def fit(client: Client, points: list[dict], **kwargs: object) -> dict:
    args = {"model": "scalerl", "data": {"points": points}, "bootstrap": 40, **kwargs}
    return await ok(client, "fit_scaling_law", args)


async def test_fit_recovers_a_scalerl_curve_and_is_stored(suite_client: Client) -> None:
    report = await fit(suite_client, curve_points(), min_compute=1500, label="ScaleRL")
    a = report["parameters"]["A"]
    assert abs(a["value"] - TRUE["A"]) < 0.02 and a["ci_low"] < a["value"] < a["ci_high"]
    assert report["parameters"]["R0"]["fixed"] and report["bootstrap"] == 40 and report["converged"]
    assert report["points_excluded"] == sum(1 for p in curve_points() if p["compute"] < 1500)
    assert all("min_compute" in e["reason"] for e in report["excluded"])
    [stored] = (await suite_client.read_resource(report["resource_uri"])).contents
    data = json.loads(stored.text)
    assert data["outcome"]["parameters"]["A"]["value"] == a["value"] and len(data["outcome"]["bootstrap_draws"]) == 40
    listed = await ok(suite_client, "list_scaling_fits", {})
    assert listed["total"] == 1 and listed["fits"][0]["fit_id"] == report["fit_id"]


async def test_fit_from_csv_and_jsonl_files_inside_the_roots(suite_client: Client, tmp_path: Path) -> None:
    points = curve_points(seed=1)
    csv = tmp_path / "run.csv"
    csv.write_text("gpu_hours,pass_rate,seed\n" + "".join(f"{p['compute']},{p['value']},s0\n" for p in points))
    report = await ok(
        suite_client,
        "fit_scaling_law",
        {
            "model": "scalerl",
            "bootstrap": 0,
            "data": {"path": str(csv), "columns": {"compute": "gpu_hours", "value": "pass_rate", "run": "seed"}},
        },
    )
    assert abs(report["parameters"]["A"]["value"] - TRUE["A"]) < 0.03
    jsonl = tmp_path / "run.jsonl"
    jsonl.write_text("".join(json.dumps(p) + "\n" for p in points))
    report = await ok(
        suite_client, "fit_scaling_law", {"model": "power_law", "bootstrap": 0, "data": {"path": "run.jsonl"}}
    )  # relative to the root
    assert report["model"] == "power_law"


async def test_fit_from_a_jobs_metrics(suite_client: Client) -> None:
    job = await ok(suite_client, "start_test_job", {"kind": "test_curve", "spec": {"points": 30}, "wait_s": 30})
    assert job["state"] == "SUCCEEDED"
    report = await ok(
        suite_client,
        "fit_scaling_law",
        {
            "model": "scalerl",
            "bootstrap": 0,
            "data": {"job_id": job["job_id"], "columns": {"compute": "gpu_hours", "value": "pass_rate"}},
        },
    )
    assert abs(report["parameters"]["A"]["value"] - 0.61) < 0.03 and report["points_used"] == 30


async def test_several_runs_of_one_recipe(suite_client: Client) -> None:
    points = [{**p, "run": f"seed{s}"} for s in range(3) for p in curve_points(seed=s, n=25)]
    report = await fit(suite_client, points)
    assert report["points_used"] == 75 and abs(report["parameters"]["A"]["value"] - TRUE["A"]) < 0.02


async def test_paper_grid_method_agrees_on_clean_data(suite_client: Client) -> None:
    robust = await fit(suite_client, curve_points(), bootstrap=0)
    grid = await fit(suite_client, curve_points(), bootstrap=0, method="scalerl-grid")
    assert grid["method"] == "scalerl-grid"
    assert abs(grid["parameters"]["A"]["value"] - robust["parameters"]["A"]["value"]) < 0.015


async def test_predict_values_and_compute_for_a_target(suite_client: Client) -> None:
    report = await fit(suite_client, curve_points(high=20_000), max_compute=10_000)
    pred = await ok(
        suite_client, "predict_scaling", {"fit_id": report["fit_id"], "compute": [5_000, 100_000], "target": 0.5}
    )
    near, far = pred["values"]
    assert not near["extrapolated"] and far["extrapolated"]
    assert near["ci_low"] <= near["value"] <= near["ci_high"] and near["pi_low"] < near["ci_low"]
    assert abs(far["value"] - float(scalerl(np.array(100_000.0), **TRUE))) < 0.03
    target = pred["target"]
    assert target["reachable"] and 2_000 < target["compute"] < 10_000
    never = await ok(suite_client, "predict_scaling", {"fit_id": report["fit_id"], "target": 0.9})
    assert not never["target"]["reachable"] and "does not reach the target" in never["target"]["statement"]


async def test_prediction_intervals_of_a_bounded_metric_stay_within_its_range(suite_client: Client) -> None:
    """A metric near 0 (and one near y_max) with noise: the prediction interval for an observation stops at 0 and
    at y_max, where every observation must lie, and still contains its estimate."""
    low = await fit(suite_client, curve_points(seed=1, R0=0.0, A=0.05), label="near zero")
    high = await fit(suite_client, curve_points(seed=2, R0=0.9, A=0.995), label="near one")
    for report in (low, high):
        pred = await ok(suite_client, "predict_scaling", {"fit_id": report["fit_id"], "compute": [100, 50_000]})
        for v in pred["values"]:
            assert 0.0 <= v["pi_low"] <= v["value"] <= v["pi_high"] <= 1.0, v
    [start, _] = (await ok(suite_client, "predict_scaling", {"fit_id": low["fit_id"], "compute": [100, 50_000]}))[
        "values"
    ]
    assert start["pi_low"] == 0.0  # the noise alone reaches below zero there: the interval stops at 0


async def test_predict_from_parameters_you_give(suite_client: Client) -> None:
    """A law from a paper, no fit: values without intervals (and said so), a target from the point estimate, and
    Chinchilla's loss from Hoffmann et al.'s published fit when no parameters are given."""
    paper = {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.1}
    pred = await ok(
        suite_client, "predict_scaling", {"model": "scalerl", "parameters": paper, "compute": [2542.0, 1e12]}
    )
    mid, far = pred["values"]
    assert mid["value"] == pytest.approx((0.61 + 0.1) / 2) and far["value"] == pytest.approx(0.61, abs=1e-9)
    assert mid["ci_low"] is None and mid["pi_high"] is None and mid["extrapolated"] is None
    assert not pred["intervals"] and "no intervals" in pred["note"] and pred["fit_id"] is None
    assert pred["compute_unit"] is None and pred["asymptote"] == 0.61 and pred["parameters"] == paper
    reach = (await ok(suite_client, "predict_scaling", {"model": "scalerl", "parameters": paper, "target": 0.5}))[
        "target"
    ]
    assert reach["reachable"] and "point estimate only" in reach["statement"]
    assert float(scalerl(np.array(reach["compute"]), **paper)) == pytest.approx(0.5)
    chin = await ok(
        suite_client, "predict_scaling", {"model": "chinchilla", "at": [{"params": 7e10, "tokens": 1.4e12}]}
    )
    [loss] = chin["values"]
    assert loss["value"] == pytest.approx(1.69 + 406.4 / 7e10**0.34 + 410.7 / 1.4e12**0.28)
    assert chin["parameters"]["E"] == 1.69 and "Hoffmann" in chin["note"] and chin["asymptote"] == 1.69
    assert "missing: D" in await error(
        suite_client, "predict_scaling", {"model": "power_law", "parameters": {"A": 1, "B": 1}, "compute": [1.0]}
    )
    assert "at[0].tokens: required" in await error(
        suite_client, "predict_scaling", {"model": "chinchilla", "at": [{"params": 7e10}]}
    )


async def test_check_extrapolation_prefers_the_sigmoid_and_shows_the_power_law_overshoot(suite_client: Client) -> None:
    check = await ok(
        suite_client,
        "check_extrapolation",
        {"data": {"points": curve_points(n=60, high=100_000)}, "min_compute": 1500, "bootstrap": 0},
    )
    assert check["split"] == pytest.approx(50_000, rel=1e-6) and check["held_out_points"] > 0
    by_model = {m["model"]: m for m in check["models"]}
    assert check["better_model"] == "scalerl"
    assert by_model["scalerl"]["mean_abs_error"] < 0.02
    assert by_model["power_law"]["asymptote"] > by_model["scalerl"]["asymptote"]
    assert all(len(m["per_point"]) == check["held_out_points"] for m in check["models"])


async def test_compare_two_recipes(suite_client: Client) -> None:
    early = await fit(suite_client, curve_points(seed=2), label="fast")  # A 0.61, C_mid 2542
    late = await fit(suite_client, curve_points(seed=3, A=0.7, C_mid=9000), label="strong")
    cmp = await ok(suite_client, "compare_scaling_fits", {"fit_ids": [early["fit_id"], late["fit_id"]]})
    assert cmp["best_asymptote"] == late["fit_id"] and cmp["most_efficient"] == early["fit_id"]
    [pair] = cmp["pairs"]
    assert pair["p_first_higher_asymptote"] < 0.05 and pair["p_first_more_efficient"] > 0.95
    assert [c for c in pair["crossings"] if c > 1_000] == [pytest.approx(pair["crossings"][-1])]
    assert 1_000 < pair["crossings"][-1] < 20_000  # below 1,000 both still sit at their R0: a crossing in noise
    leaders = [(r["leader"], r["extrapolated"]) for r in pair["regions"]]
    assert (early["fit_id"], False) in leaders and leaders[-1] == (late["fit_id"], True)
    assert "strong ahead beyond" in cmp["verdict"] and "fast ahead from" in cmp["verdict"]


async def test_plot_is_a_png_of_the_requested_size(suite_client: Client) -> None:
    a = await fit(suite_client, curve_points(seed=4), min_compute=1500, max_compute=25_000, label="a")
    b = await fit(suite_client, curve_points(seed=5, A=0.66), label="b")
    result = await suite_client.call_tool(
        "plot_scaling_fit",
        {"fit_ids": [a["fit_id"], b["fit_id"]], "extrapolate_to": 200_000, "width": 800, "height": 500},
    )
    assert not result.is_error, result.content[0].text
    [image] = [c for c in result.content if isinstance(c, ImageContent)]
    png = base64.b64decode(image.data)
    assert image.mime_type == "image/png" and png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (800, 500) and 10_000 < len(png) < 2_000_000
    assert result.structured_content["png_bytes"] == len(png)


async def test_chinchilla_fit_predict_allocate_and_plot(suite_client: Client) -> None:
    report = await ok(
        suite_client,
        "fit_scaling_law",
        {"model": "chinchilla", "bootstrap": 20, "data": {"points": chinchilla_points()}},
    )
    params = report["parameters"]
    assert abs(params["alpha"]["value"] - 0.348) / 0.348 < 0.1 and abs(params["beta"]["value"] - 0.366) / 0.366 < 0.1
    pred = await ok(
        suite_client,
        "predict_scaling",
        {"fit_id": report["fit_id"], "at": [{"params": 7e10, "tokens": 1.4e12}], "target": 2.0},
    )
    assert 1.8 < pred["values"][0]["value"] < 2.3 and pred["target"]["reachable"]
    assert pred["intervals"] and pred["allocations"] is None and pred["asymptote"] == params["E"]["value"]
    alloc = await ok(suite_client, "predict_scaling", {"compute": [1e21, 1e23], "fit_id": report["fit_id"]})
    small, big = alloc["allocations"]
    assert big["params"] > small["params"] and 6 * big["params"] * big["tokens"] == pytest.approx(1e23)
    assert alloc["values"] == [] and alloc["target"] is None and len(alloc["table"]) == 9
    result = await suite_client.call_tool("plot_scaling_fit", {"fit_ids": [report["fit_id"]]})
    assert not result.is_error and any(isinstance(c, ImageContent) for c in result.content)
    assert "FLOP budget" in await error(suite_client, "predict_scaling", {"fit_id": report["fit_id"], "compute": [0.5]})


async def test_published_allocation_and_unit_conversion(suite_client: Client) -> None:
    alloc = await ok(suite_client, "predict_scaling", {"model": "chinchilla", "compute": [5.76e23]})
    assert alloc["fit_id"] is None and alloc["parameters"]["alpha"] == 0.34 and "Hoffmann" in alloc["note"]
    table = alloc["table"]
    assert len(table) == 9 and table[0]["compute_flops"] == pytest.approx(5.76e22)
    assert table[-1]["compute_flops"] == pytest.approx(5.76e24)
    assert [r["params"] for r in table] == sorted(r["params"] for r in table)
    conv = await ok(
        suite_client,
        "convert_compute_units",
        {"value": 1, "unit": "gpu_hours", "gpu": "NVIDIA H100 80GB HBM3", "mfu": 0.4},
    )
    assert conv["flops"] == pytest.approx(3600 * 989e12 * 0.4) and conv["gpu"] == "H100-SXM"
    back = await ok(
        suite_client, "convert_compute_units", {"value": conv["flops"], "unit": "flops", "gpu": "H100-SXM", "mfu": 0.4}
    )
    assert back["gpu_hours"] == pytest.approx(1.0)
    assert "fp8" in await error(
        suite_client, "convert_compute_units", {"value": 1, "unit": "gpu_hours", "gpu": "A100", "dtype": "fp8"}
    )


BAD_POINTS = [
    ([{"compute": -1.0, "value": 0.3}, *curve_points(n=10)], "greater than 0"),
    ([{"compute": 0.0, "value": 0.3}, *curve_points(n=10)], "greater than 0"),
    ([{"compute": 50.0, "value": 1.5}, *curve_points(n=10)], "outside [0, y_max=1]"),
    (curve_points(n=3), "needs at least 4"),
    ([*curve_points(n=10), curve_points(n=10)[4]], "same compute"),
    ([{"compute": 5.0}, *curve_points(n=10)], "needs 'compute' and 'value'"),
]


@pytest.mark.parametrize(("points", "message"), BAD_POINTS)
async def test_bad_points_are_refused_and_nothing_is_stored(
    suite_client: Client, points: list[dict], message: str
) -> None:
    text = await error(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"points": points}})
    assert message in text
    assert (await ok(suite_client, "list_scaling_fits", {}))["total"] == 0


async def test_other_bad_inputs(suite_client: Client, tmp_path: Path) -> None:
    # JSON has no NaN: a client's NaN arrives as null (or is refused by the schema); either way, point 0 is named
    nan = await error(
        suite_client,
        "fit_scaling_law",
        {"model": "scalerl", "data": {"points": [{"compute": float("nan"), "value": 0.3}, *curve_points(n=10)]}},
    )
    assert "point 0" in nan or "finite" in nan
    for bad in ("nan", "inf", "-inf"):
        table = tmp_path / f"{bad}.csv"
        table.write_text(
            "compute,value\n" + "".join(f"{p['compute']},{p['value']}\n" for p in curve_points(n=10)) + f"60000,{bad}\n"
        )
        assert "only finite numbers" in await error(
            suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": str(table)}}
        )
    assert "scalerl" in await error(suite_client, "fit_scaling_law", {"model": "gompertz", "data": {"points": []}})
    assert "exactly one of points, path, job_id or run" in await error(
        suite_client, "fit_scaling_law", {"model": "scalerl", "data": {}}
    )
    outside = await error(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": "/etc/passwd"}})
    assert "outside the allowed roots" in outside
    assert "does not exist" in await error(
        suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": "missing.csv"}}
    )
    binary = tmp_path / "blob.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert "cannot read" in await error(
        suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": str(binary)}}
    )
    wrong_cols = tmp_path / "cols.csv"
    wrong_cols.write_text("x,y\n1,0.2\n")
    cols = await error(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": str(wrong_cols)}})
    assert "no column(s) 'compute', 'value'" in cols and "`columns`" in cols
    assert "'x'" not in cols and "'y'" not in cols  # the file's own header is not echoed (issue 9, 16)
    assert "no fit with id" in await error(
        suite_client, "predict_scaling", {"fit_id": "fit-20200101-000000-abcdef", "compute": [1.0]}
    )
    assert "should match pattern" in await error(suite_client, "predict_scaling", {"fit_id": "nope", "compute": [1]})
    curve_fit = (await fit(suite_client, curve_points(), bootstrap=0))["fit_id"]
    assert "use `compute`, not `at`" in await error(
        suite_client, "predict_scaling", {"at": [{"params": 1e9, "tokens": 2e10}], "fit_id": curve_fit}
    )
    assert "not both" in await error(
        suite_client, "predict_scaling", {"fit_id": curve_fit, "model": "scalerl", "compute": [1.0]}
    )
    assert "give fit_id" in await error(suite_client, "predict_scaling", {"compute": [1.0]})
    assert "needs parameters: A, B, C_mid, R0" in await error(
        suite_client, "predict_scaling", {"model": "scalerl", "compute": [1.0]}
    )
    few = await error(
        suite_client, "fit_scaling_law", {"model": "chinchilla", "data": {"points": chinchilla_points(n=4)}}
    )
    assert "needs at least 5 points" in few
    twice = chinchilla_points(n=8)
    assert "same params and tokens" in await error(
        suite_client, "fit_scaling_law", {"model": "chinchilla", "data": {"points": [*twice, twice[0]]}}
    )
    assert "scalerl-grid" in await error(
        suite_client,
        "fit_scaling_law",
        {"model": "chinchilla", "method": "scalerl-grid", "data": {"points": chinchilla_points(n=8)}},
    )
    assert (await ok(suite_client, "list_scaling_fits", {}))["total"] == 1  # only the good fit above


async def test_guide_resources_and_the_study_prompt(suite_client: Client) -> None:
    uris = {str(r.uri) for r in (await suite_client.list_resources()).resources}
    assert {"infra://scaling-guide.md", "infra://scaling-published-fits.json"} <= uris
    [published] = (await suite_client.read_resource("infra://scaling-published-fits.json")).contents
    rows = json.loads(published.text)["scalerl"]["fits"]
    assert rows[0] == {"run": "ScaleRL", "C_mid": 2542, "B": 1.92, "A": 0.61}
    prompt = await suite_client.get_prompt(
        "plan-rl-scaling-study", {"budget": "4000 GPU-hours", "recipes": "CISPO vs DAPO"}
    )
    text = prompt.messages[0].content.text
    assert "4000 GPU-hours" in text and "CISPO vs DAPO" in text and "fit_scaling_law" in text
