"""Issue 9 (adversarial review) for the scaling server: every attack performed, and the new behaviour asserted.

- 10: bounded work. File inputs are refused by size before they are read (64 MiB); lines and rows are capped; more
  than 5,000 curve points (2,000 chinchilla points) are thinned evenly along compute within each run, and the
  result says how; the bootstrap work (points x resamples) is bounded; heavy fits run in a worker process that a
  client's cancel (notifications/cancelled) kills, in process and over stdio.
- 14: extreme but schema-valid inputs give finite results that validate against the tool's own output schema
  (the SDK client checks structured content against outputSchema and raises otherwise), or a readable input
  error; never an internal error.
- 16: errors about a file's content do not echo it (header rows, cells).
"""

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from servers.core.mcp_layer import App
from servers.scaling import limits
from servers.scaling.data import Columns, points_from_rows, read_rows
from servers.scaling.server import create_server
from tests.conftest import PYTHON, REPO_ROOT, server_env
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

TRUE = {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.25}
SECRET = "AKIA-SECRET-TOKEN-0123456789"


def curve(n: int, runs: int = 1, seed: int = 0, noise: float = 0.01) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    c = np.tile(np.geomspace(100, 50_000, n // runs), runs)
    label = np.repeat([f"seed{i}" for i in range(runs)], n // runs)
    p = TRUE
    v = np.clip(p["R0"] + (p["A"] - p["R0"]) / (1 + (p["C_mid"] / c) ** p["B"]) + rng.normal(0, noise, c.size), 0, 1)
    return [
        {"compute": float(a), "value": float(b), **({"run": str(r)} if runs > 1 else {})}
        for a, b, r in zip(c, v, label, strict=True)
    ]


def chinchilla(n: int, seed: int = 0) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    params = 10 ** rng.uniform(math.log10(7e7), math.log10(1.6e10), n)
    tokens = 10 ** rng.uniform(math.log10(5e9), math.log10(5e11), n)
    loss = (1.82 + 482 / params**0.348 + 2085 / tokens**0.366) * np.exp(rng.normal(0, 0.005, n))
    return [
        {"params": float(a), "tokens": float(b), "loss": float(c)} for a, b, c in zip(params, tokens, loss, strict=True)
    ]


async def stored(client: Client) -> int:
    return (await ok(client, "list_scaling_fits", {}))["total"]


# ---- 10: files are refused by size, before they are read ------------------------------------------------------


async def test_a_sparse_two_gib_csv_is_refused_by_its_size_before_reading(
    suite_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "huge.csv"
    with big.open("wb") as handle:  # sparse: 2 GiB of size, almost nothing on disk
        handle.write(b"compute,value\n")
        handle.truncate(2 * 2**30)
    opened: list[Path] = []
    real_open = Path.open

    def spy(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name == "huge.csv":
            opened.append(self)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", spy)
    text = await error(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": str(big)}})
    assert "2,147,483,648 bytes" in text and "64 MiB" in text
    assert opened == []  # refused by stat alone: not a byte was read
    assert await stored(suite_client) == 0


def test_file_caps_on_lines_and_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ["compute", "value"]
    long_line = tmp_path / "long.jsonl"
    long_line.write_text('{"compute": 1, "value": 0.5, "pad": "' + "x" * (limits.MAX_LINE_BYTES + 10) + '"}\n')
    with pytest.raises(ValueError, match="line 1 is longer than 64 KiB"):
        read_rows(long_line, keys, "long.jsonl")
    monkeypatch.setattr("servers.scaling.data.MAX_ROWS", 50)
    many = tmp_path / "many.csv"
    many.write_text("compute,value\n" + "".join(f"{i + 1},0.5\n" for i in range(51)))
    with pytest.raises(ValueError, match="more than 50 rows"):
        read_rows(many, keys, "many.csv")
    # only the named columns are kept while reading (a wide file costs no more memory than a narrow one)
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(["compute", "value", *[f"c{i}" for i in range(500)]]) + "\n" + "1,0.5" + ",9" * 500 + "\n")
    rows, present = read_rows(wide, keys, "wide.csv")
    assert rows == [{"compute": "1", "value": "0.5"}] and present == {"compute", "value"}


def test_malformed_files_give_readable_errors(tmp_path: Path) -> None:
    keys = ["compute", "value"]
    cases = {
        "nul.csv": b"compute,value\n1,\x000.5\n",
        "deep.jsonl": b"[" * 5000 + b"]" * 5000 + b"\n",
        "huge_int.jsonl": b'{"compute": 1' + b"0" * 400 + b', "value": 0.5}\n',
        "latin1.csv": b"compute,value\n1,0.5\xe9\n",
        "ragged.csv": b"compute,value\n1,0.5,extra,cells\n2\n",
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
    for name in ("deep.jsonl", "latin1.csv"):
        with pytest.raises(ValueError, match="line"):
            read_rows(tmp_path / name, keys, name)
    rows, present = read_rows(tmp_path / "nul.csv", keys, "nul.csv")
    with pytest.raises(ValueError, match="row 0: column 'value' holds a text of 4 character"):
        points_from_rows(rows, present, "scalerl", Columns(), "nul.csv")
    rows, present = read_rows(tmp_path / "huge_int.jsonl", keys, "huge_int.jsonl")
    with pytest.raises(ValueError, match="row 0: column 'compute' holds a number out of range, not a number"):
        points_from_rows(rows, present, "scalerl", Columns(), "huge_int.jsonl")
    rows, _ = read_rows(tmp_path / "ragged.csv", keys, "ragged.csv")
    assert rows == [{"compute": "1", "value": "0.5"}, {"compute": "2", "value": None}]


# ---- 16: errors about a file's content do not echo it ---------------------------------------------------------


async def test_errors_about_a_file_never_echo_its_content(suite_client: Client, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(f"{SECRET}\nline two {SECRET}\n")
    link = tmp_path / "data.csv"
    link.symlink_to(secret)  # a file inside the roots that is a symlink to something else
    header = await error(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": str(link)}})
    assert SECRET not in header and "no column(s) 'compute', 'value'" in header and "`columns`" in header
    assert len(header) < 600
    cell = tmp_path / "cell.csv"
    cell.write_text(f"compute,value\n1,0.5\n2,{SECRET}\n")
    text = await error(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": str(cell)}})
    assert SECRET not in text and "row 1: column 'value' holds a text of 28 character(s), not a number" in text
    jsonl = tmp_path / "cell.jsonl"
    jsonl.write_text(json.dumps({"compute": {"key": SECRET}, "value": 0.5}) + "\n")
    text = await error(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": str(jsonl)}})
    assert SECRET not in text and "holds a JSON object" in text
    broken = tmp_path / "broken.jsonl"
    broken.write_text(SECRET + "\n")
    text = await error(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"path": str(broken)}})
    assert SECRET not in text and "line 1 is not JSON" in text
    chin = await error(suite_client, "fit_scaling_law", {"model": "chinchilla", "data": {"path": str(link)}})
    assert SECRET not in chin and "'params', 'tokens', 'loss'" in chin
    assert await stored(suite_client) == 0


# ---- 10: thinning and the bootstrap budget -----------------------------------------------------------------------


def test_thinning_keeps_each_runs_share_and_ends_evenly_by_rank() -> None:
    compute = [float(c) for c in range(1, 1001)] + [float(c) for c in range(1, 201)]
    run = ["a"] * 1000 + ["b"] * 200
    kept, thinning = limits.thin_curve(compute, run, cap=120)
    assert thinning is not None and thinning.before == 1200 and thinning.after == 120 == len(kept)
    a = [compute[i] for i in kept if run[i] == "a"]
    b = [compute[i] for i in kept if run[i] == "b"]
    assert len(a) == 100 and len(b) == 20  # each run its share
    assert a[0] == 1 and a[-1] == 1000 and b[0] == 1 and b[-1] == 200  # first and last of each run
    steps = np.diff(a)
    assert steps.max() - steps.min() <= 1  # evenly by rank
    assert limits.thin_curve(compute[:50], run[:50], cap=120) == (list(range(50)), None)
    kept, thinning = limits.thin_loss([float(i % 7 + 1) for i in range(3000)], [float(i) for i in range(3000)])
    assert len(kept) == limits.MAX_LOSS_POINTS and thinning is not None


def test_bootstrap_budget_and_where_fits_run() -> None:
    assert limits.bootstrap_allowed("robust", 75, 2000) == 2000
    assert limits.bootstrap_allowed("robust", 5000, 2000) == 200 == limits.bootstrap_allowed("robust", 5000, 200)
    assert limits.bootstrap_allowed("chinchilla", 2000, 2000) == 100
    assert limits.bootstrap_allowed("scalerl-grid", 75, 2000) == 212
    assert limits.bootstrap_allowed("scalerl-grid", 5000, 200) == 2
    for proc in ("robust", "power_law", "chinchilla", "scalerl-grid"):
        for points in (5, 75, 1000, 2000, 5000):
            allowed = limits.bootstrap_allowed(proc, points, 2000)
            extra = 1 if proc == "scalerl-grid" else 0
            assert points * (allowed + extra) <= limits.BOOTSTRAP_WORK[proc]
    assert not limits.runs_in_process("robust", 75, 200)  # the common case: a thread, no process start
    assert not limits.runs_in_process("chinchilla", 60, 200) and not limits.runs_in_process("power_law", 75, 200)
    assert limits.procedure("power_law", "robust") == "power_law" and limits.procedure("scalerl", "robust") == "robust"
    assert not limits.runs_in_process("scalerl-grid", 75, 0)
    assert limits.runs_in_process("robust", 5000, 200) and limits.runs_in_process("scalerl-grid", 75, 10)


async def test_a_100k_point_fit_is_thinned_and_says_so(suite_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio.to_process

    calls: list[str] = []
    real = anyio.to_process.run_sync

    async def spy(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        calls.append(fn.__name__)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(anyio.to_process, "run_sync", spy)
    points = curve(100_000, runs=4)
    report = await ok(
        suite_client,
        "fit_scaling_law",
        {"model": "scalerl", "data": {"points": points}, "min_compute": 150, "bootstrap": 100},
    )
    excluded = sum(1 for p in points if p["compute"] < 150)
    assert report["points_used"] == limits.MAX_CURVE_POINTS
    assert report["points_used"] + report["points_thinned"] + report["points_excluded"] == 100_000
    assert report["points_excluded"] == excluded and "evenly spaced by rank" in report["thinning"]
    assert any(w.startswith("Thinned: 5,000 of") for w in report["warnings"])
    assert report["bootstrap"] == report["bootstrap_requested"] == 100
    assert abs(report["parameters"]["A"]["value"] - TRUE["A"]) < 0.01
    assert calls == ["compute_fit"]  # a fit this size ran in a worker process
    # the common case stays in a thread
    small = await ok(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"points": curve(75, runs=3)}})
    assert calls == ["compute_fit"] and small["points_thinned"] == 0 and small["thinning"] is None
    assert small["bootstrap"] == small["bootstrap_requested"] == 200
    # predictions, plots and comparisons of the big fit stay cheap (no per-point scans of the excluded list)
    pred = await ok(suite_client, "predict_scaling", {"fit_id": report["fit_id"], "compute": [1e3, 1e6]})
    assert [v["extrapolated"] for v in pred["values"]] == [False, True]
    await ok(suite_client, "plot_scaling_fit", {"fit_ids": [report["fit_id"], small["fit_id"]]})


async def test_the_bootstrap_is_cut_to_its_budget_and_the_result_says_so(suite_client: Client) -> None:
    report = await ok(
        suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"points": curve(3000)}, "bootstrap": 2000}
    )
    assert report["bootstrap_requested"] == 2000 and report["bootstrap"] <= 333
    assert any("Bootstrap cut to 333 of the 2000" in w for w in report["warnings"])
    chin = await ok(
        suite_client, "fit_scaling_law", {"model": "chinchilla", "data": {"points": chinchilla(3000)}, "bootstrap": 50}
    )
    assert chin["points_used"] == 2000 and chin["points_thinned"] == 1000 and chin["bootstrap_requested"] == 50
    assert chin["bootstrap"] <= 50 and abs(chin["parameters"]["alpha"]["value"] - 0.348) < 0.05


# ---- 10: a client's cancel stops a heavy fit ---------------------------------------------------------------------


def _processes() -> dict[int, tuple[int, bytes, int]]:
    """pid -> (parent pid, command line, CPU ticks) of every live process we can read."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # fields[0] is the state, field 3 of proc(5)
        if fields[0] != "Z":
            out[int(entry)] = (int(fields[1]), cmdline, int(fields[11]) + int(fields[12]))
    return out


def fit_workers(root: int) -> dict[int, int]:
    """Live anyio worker processes among the descendants of `root`, with their CPU ticks so far."""
    procs = _processes()
    found: dict[int, int] = {}
    frontier = {root}
    while frontier:
        children = {pid for pid, (ppid, _, _) in procs.items() if ppid in frontier}
        found.update({pid: procs[pid][2] for pid in children if b"anyio.to_process" in procs[pid][1]})
        frontier = children
    return found


async def _cancel_a_long_fit(client: Client, args: dict[str, Any]) -> set[int]:
    """Start a long fit, wait until a worker process is busy with it, cancel the call, and wait until that worker
    is gone (generous bounds, no timing asserted). Returns the worker's pid."""
    busy: set[int] = set()
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await client.call_tool("fit_scaling_law", args)
                raise AssertionError("the long fit ended before it was cancelled")

            tg.start_soon(call)
            while not busy:  # a worker that burns CPU (an idle pool worker from elsewhere does not)
                before = fit_workers(os.getpid())
                await anyio.sleep(0.3)
                after = fit_workers(os.getpid())
                busy = {pid for pid, ticks in after.items() if ticks > before.get(pid, ticks)}
            tg.cancel_scope.cancel()  # the client gives up: it sends notifications/cancelled
    with anyio.fail_after(30):  # a killed worker is gone within milliseconds; a running fit would take far longer
        while set(fit_workers(os.getpid())) & busy:
            await anyio.sleep(0.05)
    return busy


# The paper's grid with 200 resamples of a 75-point curve is within the budget and takes tens of seconds here.
LONG_FIT = {"model": "scalerl", "method": "scalerl-grid", "data": {"points": curve(75)}, "bootstrap": 200}


async def test_cancelling_a_long_fit_kills_its_worker_process(suite_client: Client) -> None:
    workers = await _cancel_a_long_fit(suite_client, LONG_FIT)
    assert workers and not any(Path(f"/proc/{pid}").exists() for pid in workers)
    assert await stored(suite_client) == 0  # the fit was not finished (and nothing stored) after the cancel
    quick = await ok(suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"points": curve(40)}})
    assert quick["converged"]  # the server keeps serving


async def test_cancelling_over_stdio_kills_the_servers_worker(home: Path, tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=PYTHON,
        args=["-m", "servers.scaling"],
        env=server_env(home, LLM_INFRA_MCP_ALLOWED_ROOTS=str(tmp_path)),
        cwd=str(REPO_ROOT),
    )
    async with Client(params, mode="legacy") as client:
        workers = await _cancel_a_long_fit(client, LONG_FIT)
        assert workers
        assert (await ok(client, "list_scaling_fits", {}))["total"] == 0


# ---- 14: extreme, schema-valid inputs: finite results or readable errors -----------------------------------------


async def finite_or_readable(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """The tool either succeeds (its structured content then passed the SDK's outputSchema check) or answers a
    readable input error; an internal error, a traceback or a schema violation fails the test."""
    result = await client.call_tool(tool, args)  # raises on structured content that breaks the output schema
    text = result.content[0].text if result.content else ""
    if result.is_error:
        assert "internal error" not in text and "Traceback" not in text, (tool, args, text)
        assert len(text) < 2000
        return None
    return result.structured_content


async def test_the_reported_overflow_attacks(suite_client: Client) -> None:
    text = await error(
        suite_client,
        "convert_compute_units",
        {"value": 1e40, "unit": "flops", "gpu": "B200", "dtype": "fp32", "mfu": 5e-324},
    )
    assert "mfu" in text and "0.001" in text
    text = await error(suite_client, "predict_scaling", {"model": "chinchilla", "compute": [0.5, 5e-324]})
    assert "compute[0]" in text and "1 to 1e+40" in text and "internal error" not in text
    # the extremes that are accepted give finite numbers
    weakest = await ok(
        suite_client,
        "convert_compute_units",
        {"value": 1e40, "unit": "flops", "gpu": "B200", "dtype": "fp32", "mfu": 0.001},
    )
    assert math.isfinite(weakest["gpu_hours"]) and weakest["gpu_hours"] > 0
    most = await ok(
        suite_client, "convert_compute_units", {"value": 1e40, "unit": "gpu_hours", "gpu": "B200", "dtype": "fp8"}
    )
    assert math.isfinite(most["flops"])
    alloc = await ok(suite_client, "predict_scaling", {"model": "chinchilla", "compute": [1, 1e40]})
    assert all(math.isfinite(r["params"]) and r["params"] > 0 for r in alloc["allocations"] + alloc["table"])


@pytest.mark.parametrize("mode", ["auto"])  # one protocol era: the era does not change a fit
async def test_a_fit_that_overflows_is_refused_and_not_stored(suite_client: Client) -> None:
    # compute near 1e40 and a steep power law: D = lin * e^(B * mean log C) is beyond any float. The overflow is in
    # the point estimate itself, so no resample is needed to show it (the default 200 resamples, none of which
    # converge on such data, took 35 s here).
    points = [{"compute": float(c), "value": float(1 - (c / 1e39) ** -15)} for c in np.geomspace(1e39, 1e40, 40)]
    args = {"model": "power_law", "data": {"points": points}, "bootstrap": 0}
    text = await error(suite_client, "fit_scaling_law", args)
    assert "power_law fit overflowed: D" in text and "moderate size for compute" in text
    assert await stored(suite_client) == 0


async def test_extreme_inputs_to_every_scaling_tool(suite_client: Client) -> None:
    tiny, huge = 5e-324, 1e40
    extreme_curve = [{"compute": tiny, "value": 0.2}, *curve(30), {"compute": huge, "value": 0.6}]
    flops_curve = [{"compute": p["compute"] * 1e18, "value": p["value"]} for p in curve(40)]
    steep = [{"compute": 10.0 ** (20 + i / 10), "value": 0.0 if i < 20 else 1.0} for i in range(40)]
    fits: dict[str, str] = {}
    for name, args in {
        "extreme": {"model": "scalerl", "data": {"points": extreme_curve}, "bootstrap": 20},
        "extreme_power": {"model": "power_law", "data": {"points": extreme_curve}, "bootstrap": 20},
        "flops_power": {"model": "power_law", "data": {"points": flops_curve}, "bootstrap": 20},
        "steep_power": {"model": "power_law", "data": {"points": steep}, "bootstrap": 20},
        "steep": {"model": "scalerl", "data": {"points": steep}, "bootstrap": 20, "r0": "free"},
        "big_y": {
            "model": "scalerl",
            "y_max": 1e6,
            "data": {"points": [{"compute": p["compute"], "value": p["value"] * 1e6} for p in curve(30)]},
        },
        "plain": {"model": "power_law", "data": {"points": curve(40)}, "bootstrap": 20},
        "chinchilla": {"model": "chinchilla", "data": {"points": chinchilla(30)}, "bootstrap": 10},
        "chin_extreme": {
            "model": "chinchilla",
            "data": {
                "points": [
                    {"params": 10.0 ** (i % 20), "tokens": 10.0 ** (20 - i % 17), "loss": 10.0 ** (-(i % 9))}
                    for i in range(30)
                ]
            },
            "bootstrap": 5,
        },
    }.items():
        report = await finite_or_readable(suite_client, "fit_scaling_law", args)
        if report is not None:
            fits[name] = report["fit_id"]
    assert {"plain", "chinchilla", "big_y", "flops_power"} <= set(fits)
    curves = [f for n, f in fits.items() if not n.startswith("chin")]
    for fit_id in curves:
        for args in (
            {"compute": [tiny, 1e-300, 1.0, 1e20, huge], "target": 1e6},
            {"compute": [tiny], "target": -1e6},
            {"target": 0.3},
            {"target": 0.999999},
        ):
            await finite_or_readable(suite_client, "predict_scaling", {"fit_id": fit_id, **args})
        await finite_or_readable(suite_client, "plot_scaling_fit", {"fit_ids": [fit_id], "extrapolate_to": huge})
    for fit_id in (fits["chinchilla"], fits.get("chin_extreme")):
        if fit_id is None:
            continue
        for args in (
            {"at": [{"params": tiny, "tokens": tiny}, {"params": 1e20, "tokens": 1e20}]},
            {"target": 1e-6},
            {"target": 1e6},
            {"target": 1.9},
        ):
            await finite_or_readable(suite_client, "predict_scaling", {"fit_id": fit_id, **args})
        await finite_or_readable(suite_client, "plot_scaling_fit", {"fit_ids": [fit_id]})
        await finite_or_readable(suite_client, "predict_scaling", {"compute": [1, huge], "fit_id": fit_id})
    await finite_or_readable(suite_client, "compare_scaling_fits", {"fit_ids": curves[:8]})
    listed = await ok(suite_client, "list_scaling_fits", {"limit": 100})
    assert listed["total"] == len(fits)  # nothing stored by the refused fits
    for args in (
        {"data": {"points": extreme_curve}, "split": 1e-300},
        {"data": {"points": extreme_curve}, "split": 1e30},
        {"data": {"points": steep}},
        {"data": {"points": flops_curve}},
    ):
        await finite_or_readable(suite_client, "check_extrapolation", {**args, "bootstrap": 5})
    for model, parameters, points in (
        ("scalerl", {"A": 1e40, "B": 1e40, "C_mid": 1e40, "R0": -1e40}, [{"compute": tiny}, {"compute": huge}]),
        ("power_law", {"A": 1, "B": 1e40, "D": 1e40}, [{"compute": tiny}, {"compute": huge}]),
        ("power_law", {"A": 1, "B": 0.5, "D": 1}, [{"compute": tiny}]),
        (
            "chinchilla",
            {"E": 1, "A": 1e40, "B": 1e40, "alpha": 1e40, "beta": 1e-40},
            [{"params": tiny, "tokens": 1e20}],
        ),
        ("chinchilla", None, [{"params": tiny, "tokens": tiny}, {"params": 1e20, "tokens": 1e20}]),
    ):
        asked = {"compute": [p["compute"] for p in points]} if model != "chinchilla" else {"at": points}
        args = {"model": model, **asked, "target": 0.5, **({"parameters": parameters} if parameters else {})}
        await finite_or_readable(suite_client, "predict_scaling", args)
    for args in (
        {"compute": [1, 1e40]},
        {"compute": [1.0] * 1000, "target": 1.0},
    ):
        await finite_or_readable(suite_client, "predict_scaling", {"model": "chinchilla", **args})


async def test_inf_and_nan_arguments_are_refused(app: App) -> None:
    # JSON text carries no infinity, but Python's json accepts the tokens Infinity and NaN: refuse them everywhere
    async with Client(create_server(app), mode="legacy") as client:
        for tool, args in (
            (
                "predict_scaling",
                {"model": "power_law", "parameters": {"A": 1, "B": 1, "D": 1}, "compute": [math.inf]},
            ),
            ("predict_scaling", {"model": "chinchilla", "at": [{"params": math.nan, "tokens": 1e9}]}),
            ("predict_scaling", {"model": "chinchilla", "compute": [math.inf]}),
            ("predict_scaling", {"model": "power_law", "parameters": {"A": math.inf, "B": 1, "D": 1}, "target": 1}),
            ("convert_compute_units", {"value": 1.0, "unit": "flops", "gpu": "B200", "mfu": math.nan}),
        ):
            result = await client.call_tool(tool, args)
            assert result.is_error and "internal error" not in result.content[0].text, (tool, args)


# ---- huge lists: bounded total work ------------------------------------------------------------------------------


async def test_the_largest_lists_the_schemas_allow_stay_bounded(suite_client: Client) -> None:
    fit = await ok(
        suite_client, "fit_scaling_law", {"model": "chinchilla", "data": {"points": chinchilla(40)}, "bootstrap": 2000}
    )
    assert fit["bootstrap"] <= 2000
    at = [{"params": 1e8 * (1 + i), "tokens": 1e10 * (1 + i)} for i in range(1000)]
    pred = await ok(suite_client, "predict_scaling", {"fit_id": fit["fit_id"], "at": at, "target": 1.9})
    assert len(pred["values"]) == 1000 and pred["target"] is not None
    curve_fit = await ok(
        suite_client, "fit_scaling_law", {"model": "scalerl", "data": {"points": curve(75)}, "bootstrap": 2000}
    )
    compute = [float(c) for c in np.geomspace(1, 1e30, 1000)]
    pred = await ok(suite_client, "predict_scaling", {"fit_id": curve_fit["fit_id"], "compute": compute, "target": 0.5})
    assert len(pred["values"]) == 1000
    values = await ok(
        suite_client,
        "predict_scaling",
        {"model": "scalerl", "parameters": TRUE, "compute": compute, "target": 0.5},
    )
    assert len(values["values"]) == 1000
    budgets = [float(c) for c in np.geomspace(1, 1e40, 1000)]
    alloc = await ok(suite_client, "predict_scaling", {"compute": budgets, "fit_id": fit["fit_id"], "target": 1.9})
    assert len(alloc["allocations"]) == 1000 and alloc["target"] is not None
