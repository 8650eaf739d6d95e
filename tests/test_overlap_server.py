"""The overlap tools through in-process MCP clients in both protocol eras: the cost model, shape presets, and
real multi-process collective and tuning jobs (one shape, one preset layer, several layers) with gloo on CPU; bad
inputs refused before any job."""

import json

import pytest
from mcp import Client
from pydantic import BaseModel

from servers.core.arguments import StrictArguments
from servers.core.mcp_layer import App
from servers.overlap.collectives import CollectiveSpec
from servers.overlap.gemm import GemmBenchmarkSpec
from servers.overlap.server import create_server
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


async def test_predict_overlap_for_the_published_flux_case(suite_client: Client) -> None:
    result = await ok(
        suite_client,
        "predict_overlap",
        {"pattern": "ag_gemm", "m": 4096, "n": 49152, "k": 12288, "world_size": 8, "gpu": "H800-SXM"},
    )
    p = result["prediction"]
    assert abs(p["t_sequential_ms"] / 1.429 - 1) < 0.15 and abs(p["t_overlap_ms"] / 0.957 - 1) < 0.25
    assert p["t_overlap_ms"] == min(c["t_overlap_ms"] for c in p["by_chunks"])
    assert p["efficiency"] == pytest.approx(
        (p["t_gemm_ms"] + p["t_comm_ms"] - p["t_overlap_ms"]) / p["t_comm_ms"], rel=1e-6
    )
    assert result["calibrated"] is None  # nothing measured on an H800 here, and the result says why
    assert result["uncalibrated_reason"].startswith("no calibration: of 0 stored gemm_benchmark result(s)")
    assert "H800-SXM" in result["uncalibrated_reason"] and "benchmark_collective" in result["uncalibrated_reason"]


async def test_predict_overlap_bad_inputs(suite_client: Client) -> None:
    unknown = await error(
        suite_client,
        "predict_overlap",
        {"pattern": "ag_gemm", "m": 64, "n": 64, "k": 64, "world_size": 2, "gpu": "Voodoo5"},
    )
    assert "H100-SXM" in unknown  # the accepted names are listed
    assert "fp8" in await error(
        suite_client,
        "predict_overlap",
        {"pattern": "ag_gemm", "m": 64, "n": 64, "k": 64, "world_size": 2, "gpu": "A100", "dtype": "fp8"},
    )
    assert "divisible" in await error(
        suite_client, "predict_overlap", {"pattern": "gemm_rs", "m": 64, "n": 64, "k": 63, "world_size": 2}
    )


async def test_shape_presets(suite_client: Client) -> None:
    everything = await ok(suite_client, "list_shape_presets", {"seq_len": 2048, "micro_batch": 2})
    names = {p["name"] for p in everything["presets"]}
    assert len(names) >= 6
    one = await ok(suite_client, "list_shape_presets", {"name": "llama3-70b", "world_size": 16})
    [preset] = one["presets"]
    layers = {layer["layer"]: layer for layer in preset["layers"]}
    assert layers["mlp_up_gate"] == {
        **layers["mlp_up_gate"],
        "pattern": "ag_gemm",
        "m": 4096,
        "n": 2 * 28672,
        "k": 8192,
    }
    assert "llama3-70b" in one["not_divisible"]  # 8 KV heads over 16 ranks
    assert "llama3-70b" in await error(suite_client, "list_shape_presets", {"name": "gpt-5"})


async def test_collective_benchmark_with_gloo(suite_client: Client) -> None:
    job = await ok(
        suite_client,
        "benchmark_collective",
        {
            "op": "all_reduce",
            "min_bytes": 1024,
            "max_bytes": 4096,
            "world_size": 2,
            "backend": "gloo",
            "warmup": 1,
            "iters": 2,
            "wait_s": 45,
        },
    )
    assert job["state"] == "SUCCEEDED", job["reason"]
    rows = job["result"]["rows"]
    assert [r["size"] for r in rows] == [1024, 2048, 4096] and all(r["wrong"] == 0 for r in rows)
    assert all(r["busbw"] == pytest.approx(r["algbw"] * 2 * (2 - 1) / 2) for r in rows)


async def test_overlap_measurement_of_one_shape_and_tuning_with_gloo(suite_client: Client) -> None:
    one = {"layer": "down", "pattern": "gemm_rs", "m": 64, "n": 32, "k": 32}
    job = await ok(
        suite_client,
        "tune_overlap",
        {
            "layers": [one],
            "world_size": 2,
            "dtype": "fp32",
            "chunks": [2],
            "warmup": 1,
            "iters": 2,
            "backend": "gloo",
            "wait_s": 45,
        },
    )
    assert job["state"] == "SUCCEEDED", job["reason"]
    text = str(job["result"])
    assert "not available here" in text and "plumbing" in text
    [measured] = job["result"]["layers"]  # one shape: everything a single measurement gives
    for key in ("t_gemm_ms", "t_comm_ms", "t_sequential_ms", "busbw_gbs", "comm_bytes", "per_rank_shapes", "table"):
        assert measured[key] is not None, key
    assert measured["validity"]["checks"] and measured["best_reason"] and "validity_rules" in job["result"]
    rows = {row["name"]: row for row in measured["methods"]}
    assert {"sequential", "chunked(C=2)", "ring", "symm_mem"} <= set(rows)
    sequential = rows["sequential"]
    assert sequential["method"] == "sequential" and sequential["passed"] and "rel_err" in sequential
    assert {"exposed_comm_ms", "efficiency", "speedup", "checks", "invalid_reasons"} <= set(rows["ring"])
    assert len(sequential["raw_times_ms"]) == 2 and all(len(r) == 2 for r in sequential["raw_times_ms"])
    picked = await ok(
        suite_client,
        "tune_overlap",
        {
            "preset": "llama3-8b",
            "layer": "attn_out",
            "seq_len": 16,
            "world_size": 2,
            "dtype": "fp32",
            "methods": ["sequential"],
            "iters": 2,
            "backend": "gloo",
            "wait_s": 45,
        },
    )
    assert picked["state"] == "SUCCEEDED", picked["reason"]
    [layer] = picked["result"]["layers"]
    assert (layer["layer"], layer["pattern"], layer["m"], layer["n"], layer["k"]) == (
        "attn_out",
        "gemm_rs",
        16,
        4096,
        4096,
    )
    tuned = await ok(
        suite_client,
        "tune_overlap",
        {
            "layers": [
                {"layer": "up", "pattern": "ag_gemm", "m": 64, "n": 32, "k": 32},
                {"layer": "down", "pattern": "gemm_rs", "m": 64, "n": 32, "k": 32},
            ],
            "world_size": 2,
            "dtype": "fp32",
            "methods": ["sequential", "chunked"],
            "chunks": [2],
            "iters": 2,
            "backend": "gloo",
            "wait_s": 45,
        },
    )
    assert tuned["state"] == "SUCCEEDED", tuned["reason"]
    if tuned["result_truncated"]:  # over what an answer carries: the small fields here, all of it in the resource
        assert "layers" in tuned["result_omitted"] and "verdict" in tuned["result"]["table"]
        [content] = (await suite_client.read_resource(tuned["result_uri"])).contents
        tuned["result"] = json.loads(content.text)
    assert {row["layer"] for row in tuned["result"]["layers"]} == {"up", "down"}
    for layer in tuned["result"]["layers"]:  # 2 iterations cannot be checked: no best, and it says why
        assert (
            layer["best"] is None
            and layer["verdict"].startswith("no verdict")
            and "enough_iterations" in (layer["verdict"])
        )
        assert layer["predicted"] is None and layer["prediction_note"].startswith("no prediction: this ran on CPU")
        assert layer["busbw_gbs"] is not None and layer["validity"]["checks"]
        assert all("checks" not in row and row.get("raw_times_ms", []) == [] for row in layer["methods"])


async def test_tune_overlap_puts_a_requested_prediction_next_to_the_measurement(suite_client: Client) -> None:
    args = {
        "layers": [{"layer": "up", "pattern": "ag_gemm", "m": 64, "n": 32, "k": 32}],
        "world_size": 2,
        "dtype": "fp32",
        "methods": ["sequential", "chunked"],
        "chunks": [2],
        "iters": 3,
        "backend": "gloo",
        "wait_s": 45,
    }
    assert "H100-SXM" in await error(suite_client, "tune_overlap", {**args, "predict_for_gpu": "Voodoo5"})
    tuned = await ok(suite_client, "tune_overlap", {**args, "predict_for_gpu": "H100-SXM"})
    assert tuned["state"] == "SUCCEEDED", tuned["reason"]
    [layer] = tuned["result"]["layers"]
    assert layer["predicted"]["gpu"] == "H100-SXM" and layer["predicted_gain"] == layer["predicted"]["gain"]
    assert "not comparable" in layer["prediction_note"] and "not comparable" in tuned["result"]["table"]
    assert (
        layer["best"] is None or layer["methods"][[m["name"] for m in layer["methods"]].index(layer["best"])]["valid"]
    )


async def test_overlap_bad_inputs_are_refused_before_any_job(suite_client: Client) -> None:
    shape = {"layer": "up", "pattern": "ag_gemm", "m": 64, "n": 32, "k": 32}
    small = {"layers": [shape], "world_size": 2, "backend": "gloo"}
    assert "layer up: " in await error(suite_client, "tune_overlap", {**small, "layers": [{**shape, "n": 33}]})
    assert "divisible" in await error(suite_client, "tune_overlap", {**small, "layers": [{**shape, "n": 33}]})
    assert "at most" in await error(suite_client, "tune_overlap", {**small, "world_size": 64})
    assert "fp8" in await error(suite_client, "tune_overlap", {**small, "dtype": "fp8"})
    assert "tf32 is fp32 data with TF32 matmul math" in await error(
        suite_client, "tune_overlap", {**small, "dtype": "tf32"}
    )
    huge = {**small, "layers": [{**shape, "m": 131072, "n": 131072, "k": 131072}], "dtype": "fp32"}
    assert "available" in await error(suite_client, "tune_overlap", huge)
    assert "needs" in await error(
        suite_client,
        "benchmark_gemm",
        {"m": 131072, "n": 131072, "k": 131072, "dtype": "fp32", "device": "cpu"},
    )
    shapeless = {"world_size": 2, "backend": "gloo"}
    no_layer = await error(suite_client, "tune_overlap", {**shapeless, "preset": "llama3-8b", "layer": "lm_head"})
    assert "layer: preset llama3-8b has no layer 'lm_head'; accepted: qkv, attn_out, mlp_up_gate, mlp_down" in no_layer
    clash = await error(suite_client, "tune_overlap", {**small, "preset": "llama3-8b"})
    assert clash.endswith("preset, layers: give exactly one of preset or layers")
    stray = await error(suite_client, "tune_overlap", {**small, "layer": "qkv"})
    assert "layer: is for a preset (which layer, how many tokens); accepted with preset only" in stray
    tokens = await error(suite_client, "tune_overlap", {**small, "seq_len": 16, "micro_batch": 2})
    assert "seq_len, micro_batch: are for a preset" in tokens
    assert "tf32 is fp32 data" in await error(suite_client, "benchmark_collective", {"dtype": "tf32"})
    fp8_sum = await error(suite_client, "benchmark_collective", {"dtype": "fp8", "op": "reduce_scatter"})
    assert "dtype: fp8 cannot be reduced (reduce_scatter)" in fp8_sum and "all_gather" in fp8_sum
    sweep = await error(suite_client, "benchmark_collective", {"min_bytes": 4096, "max_bytes": 1024})
    assert sweep.endswith(
        "min_bytes, max_bytes: min_bytes 4096 is larger than max_bytes 1024; accepted: min_bytes <= max_bytes, or "
        "sizes instead"
    )
    assert "m: required argument missing" in await error(suite_client, "benchmark_gemm", {"n": 8, "k": 8})
    assert "exactly one of preset or layers" in await error(suite_client, "tune_overlap", {})
    from servers.overlap.limits import gpus_present

    if gpus_present() == 0:
        assert "no" in await error(suite_client, "benchmark_collective", {"backend": "nccl"})
    jobs = await ok(suite_client, "list_jobs", {})
    assert jobs["total"] == 0  # nothing was started


@pytest.mark.parametrize(
    ("tool", "model"), [("benchmark_gemm", GemmBenchmarkSpec), ("benchmark_collective", CollectiveSpec)]
)
async def test_flat_benchmark_arguments_are_the_job_specs_fields(app: App, tool: str, model: type[BaseModel]) -> None:
    """The job's stored spec stays the model; the tool takes its fields flat: the same names, types, bounds,
    descriptions and defaults."""
    found = create_server(app)._tool_manager.get_tool(tool)
    assert found is not None and isinstance(found.fn_metadata, StrictArguments)
    found.fn_metadata.ensure_built()
    arguments = found.fn_metadata.arg_model.model_fields
    assert [name for name in arguments if name not in ("wait_s", "max_wall_s")] == list(model.model_fields)
    for name, field in model.model_fields.items():
        argument = arguments[name]
        assert (argument.annotation, argument.metadata, argument.description) == (
            field.annotation,
            field.metadata,
            field.description,
        ), name
        assert (argument.is_required(), argument.default) == (field.is_required(), field.default), name
