"""The scaling-law registry (servers/scaling/laws.py): a toy law declared here (one object, one registry line) fits
through fit_scaling_law and predicts through predict_scaling in an in-process MCP client, with the generic fitter
(fit_generic.py); the bundled laws are declared through the same registry, and bad declarations are refused."""

from collections.abc import Iterator

import numpy as np
import pytest
from mcp import Client

from servers.core.errors import InputError
from servers.core.mcp_layer import App
from servers.scaling import laws
from servers.scaling.server import create_server
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok

TRUE = {"A": 0.8, "b": 0.5}


def toy_power(compute: np.ndarray, A: float, b: float) -> np.ndarray:  # noqa: N803 - the asymptote's usual name
    return A - compute ** (-b)


def toy_inverse(params: dict[str, float], target: float) -> float | None:
    return (params["A"] - target) ** (-1 / params["b"]) if target < params["A"] else None


TOY = laws.Law(
    name="toy_power",
    title="toy power law",
    formula="A-C^-b",
    parameters=(
        laws.Parameter("A", "asymptote", bounds=(0.0, 2.0)),
        laws.Parameter("b", "exponent", positive=True, bounds=(0.01, 3.0)),
    ),
    evaluate=toy_power,
    inverse=toy_inverse,
)


@pytest.fixture
def toy() -> Iterator[laws.Law]:
    with laws.registered(TOY) as law:  # the one registry line, undone after the test
        yield law


def toy_points(noise: float = 0.0, seed: int = 0) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    c = np.geomspace(10, 10_000, 30)
    v = toy_power(c, **TRUE) * (1 + rng.normal(0, noise, c.size))
    return [{"compute": float(x), "value": float(y)} for x, y in zip(c, v, strict=True)]


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_toy_law_registered_here_fits_and_predicts_through_the_tools(toy: laws.Law, app: App) -> None:
    async with Client(create_server(app), mode="auto") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "toy_power" in tools["fit_scaling_law"].input_schema["properties"]["model"]["enum"]
        report = await ok(
            client,
            "fit_scaling_law",
            {"model": "toy_power", "data": {"points": toy_points(noise=0.002)}, "bootstrap": 60, "seed": 1},
        )
        assert report["model"] == "toy_power" and report["converged"] and report["bootstrap"] == 60
        for name, truth in TRUE.items():
            p = report["parameters"][name]
            assert abs(p["value"] - truth) < 0.02 * abs(truth), (name, p)
            assert p["ci_low"] <= p["value"] <= p["ci_high"], (name, p)
        assert not report["not_identified"]

        predicted = await ok(
            client, "predict_scaling", {"fit_id": report["fit_id"], "compute": [5000.0, 50_000.0], "target": 0.75}
        )
        inside, beyond = predicted["values"]
        assert abs(inside["value"] - toy_power(np.float64(5000.0), **TRUE)) < 0.01
        assert inside["ci_low"] <= inside["value"] <= inside["ci_high"] and not inside["extrapolated"]
        assert beyond["extrapolated"] and predicted["intervals"]
        assert predicted["asymptote"] == report["parameters"]["A"]["value"]
        needed = predicted["target"]["compute"]  # the truth: (0.8 - 0.75)^(-1/0.5) = 400
        assert predicted["target"]["verdict"] == "reachable" and abs(needed - 400) < 0.2 * 400

        given = await ok(client, "predict_scaling", {"model": "toy_power", "parameters": TRUE, "compute": [100.0]})
        assert abs(given["values"][0]["value"] - toy_power(np.float64(100.0), **TRUE)) < 1e-12

        text = await error(
            client, "predict_scaling", {"model": "toy_power", "parameters": {"A": 1.0}, "compute": [1.0]}
        )
        assert "takes parameters A, b" in text and "missing: b" in text
        text = await error(
            client,
            "fit_scaling_law",
            {"model": "toy_power", "data": {"points": toy_points()}, "method": "scalerl-grid"},
        )
        assert "scalerl-grid" in text and "'robust'" in text


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_law_registered_later_is_published_past_the_tool_cache(app: App) -> None:
    """A first start writes its tool definitions to the state directory's cache; a later start with one more law
    (same sources) must publish that law, not the cached enumeration."""

    async def enum() -> list[str]:
        async with Client(create_server(app), mode="auto") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            return tools["fit_scaling_law"].input_schema["properties"]["model"]["enum"]

    assert await enum() == ["scalerl", "power_law", "chinchilla"]
    assert list((app.settings.home / "cache").glob("tools-*.json"))  # the first start's definitions were kept
    with laws.registered(TOY):
        assert await enum() == ["scalerl", "power_law", "chinchilla", "toy_power"]
    assert await enum() == ["scalerl", "power_law", "chinchilla"]


def test_noiseless_data_recover_the_toy_law_exactly() -> None:
    from servers.scaling.fit_generic import fit_least_squares
    from servers.scaling.limits import FitTask

    points = toy_points()
    task = FitTask(
        law=TOY,
        method="robust",
        bootstrap=20,
        seed=0,
        compute=[p["compute"] for p in points],
        value=[p["value"] for p in points],
    )
    outcome = fit_least_squares(task)
    assert all(abs(outcome.parameters[n].value - v) < 1e-6 * v for n, v in TRUE.items())
    assert outcome.rmse < 1e-9 and outcome.bootstrap == 20 and not outcome.warnings


def test_the_generic_fitter_says_when_a_bound_set_a_parameter() -> None:
    from servers.scaling.fit_generic import fit_least_squares
    from servers.scaling.limits import FitTask

    law = laws.Law(
        name="capped",
        title="capped",
        formula="A-C^-b",
        parameters=(
            laws.Parameter("A", "asymptote", bounds=(0.0, 0.5)),  # the truth (0.8) lies outside the box
            laws.Parameter("b", "exponent", bounds=(0.01, 3.0)),
        ),
        evaluate=toy_power,
    )
    points = toy_points()
    task = FitTask(
        law=law,
        method="robust",
        bootstrap=0,
        seed=0,
        compute=[p["compute"] for p in points],
        value=[p["value"] for p in points],
    )
    outcome = fit_least_squares(task)
    assert [(u.parameter, u.reason) for u in outcome.not_identified][:1] == [("A", "at_bound")]


def test_the_bundled_laws_are_declared_in_the_registry() -> None:
    assert laws.names() == ("scalerl", "power_law", "chinchilla")
    assert laws.names(on_compute=True) == ("scalerl", "power_law") and laws.names(on_compute=False) == ("chinchilla",)
    assert laws.methods() == ("robust", "scalerl-grid")
    assert laws.get("chinchilla").columns == laws.SIZES and laws.get("scalerl").columns == laws.CURVE
    assert laws.get("scalerl").efficiency == "C_mid" and laws.get("power_law").efficiency is None
    assert laws.get("chinchilla").published == laws.CHINCHILLA_PUBLISHED


def test_bad_declarations_and_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="'scalerl' is registered already"):
        laws.register(laws.SCALERL)
    with pytest.raises(ValueError, match="efficiency 'c' is not one of its parameters"):
        laws.Law(
            name="x",
            title="x",
            formula="x",
            parameters=TOY.parameters,
            evaluate=toy_power,
            efficiency="c",
        )
    with pytest.raises(ValueError, match="columns must be"):
        laws.Law(
            name="x",
            title="x",
            formula="x",
            parameters=TOY.parameters,
            evaluate=toy_power,
            columns=("x",),
        )
    with pytest.raises(InputError, match="unknown scaling law 'nope'; accepted: scalerl, power_law, chinchilla"):
        laws.get("nope")
    with laws.registered(TOY):
        assert "toy_power" in laws.names()
    assert "toy_power" not in laws.names()
