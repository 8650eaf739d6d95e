"""Unit tests of the overlap cost model and the TP shape presets: deterministic, no GPU, no MCP."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.overlap.cost_model import (
    Calibration,
    calibration_from_measurements,
    pipeline_time,
    predict_overlap,
    split_problems,
)
from servers.overlap.presets import PRESET_NAMES, get_preset, list_presets

FLUX_AG = dict(pattern="ag_gemm", m=4096, n=49152, k=12288, world_size=8, gpu="H800")
FLUX_RS = dict(pattern="gemm_rs", m=4096, n=12288, k=49152, world_size=8, gpu="H800")


# ---------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "m", "n", "k", "dim"),
    [
        ("ag_gemm", 4096, 1001, 4096, "n=1001"),
        ("ag_gemm", 4095, 4096, 4096, "m=4095"),
        ("gemm_rs", 4096, 4096, 1001, "k=1001"),
        ("gemm_rs", 4095, 4096, 4096, "m=4095"),
        ("gemm_ar", 4096, 4096, 1001, "k=1001"),
    ],
)
def test_shapes_that_do_not_split_are_rejected_with_the_rule(pattern: str, m: int, n: int, k: int, dim: str) -> None:
    with pytest.raises(InputError) as info:
        predict_overlap(pattern, m, n, k, 8)  # type: ignore[arg-type]
    message = str(info.value)
    assert dim in message and "divisible" in message


def test_gemm_ar_does_not_need_m_divisible() -> None:
    p = predict_overlap("gemm_ar", 4095, 4096, 4096, 8)
    assert p.collective == "all_reduce" and p.t_comm_ms > 0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(m=0),
        dict(n=-4),
        dict(k=True),
        dict(world_size=0),
        dict(world_size=2048),
        dict(max_chunks=0),
        dict(pattern="gemm_a2a"),
        dict(interconnect="carrier-pigeon"),
        dict(dtype="int4"),
    ],
)
def test_bad_arguments_raise_input_error(kwargs: dict) -> None:
    args = {**FLUX_AG, **kwargs}
    with pytest.raises(InputError):
        predict_overlap(**args)


def test_unknown_gpu_lists_the_catalog_names() -> None:
    with pytest.raises(InputError) as info:
        predict_overlap("ag_gemm", 4096, 4096, 4096, 8, gpu="Z9000")
    assert "H100-SXM" in str(info.value) and "A100-SXM-80GB" in str(info.value)


def test_fp8_on_a100_is_rejected_naming_its_dtypes() -> None:
    with pytest.raises(InputError) as info:
        predict_overlap("ag_gemm", 4096, 4096, 4096, 8, dtype="fp8", gpu="A100")
    assert "fp8" in str(info.value) and "bf16" in str(info.value)


def test_nvlink_on_a_pcie_gpu_is_rejected() -> None:
    with pytest.raises(InputError):
        predict_overlap("ag_gemm", 4096, 4096, 4096, 8, gpu="L40S", interconnect="nvlink")


def test_world_size_one_has_no_communication() -> None:
    p = predict_overlap("ag_gemm", 4096, 4096, 4096, 1)
    assert p.t_comm_ms == 0 and p.bytes_communicated == 0 and p.collective is None
    assert p.t_overlap_ms == pytest.approx(p.t_gemm_ms) == pytest.approx(p.t_sequential_ms)
    assert p.best_chunks == 1 and [c.chunks for c in p.by_chunks] == [1]
    assert p.efficiency is None and not p.worth_it
    assert "no communication" in p.advice
    assert any("world_size 1" in a for a in p.assumptions)


# ---------------------------------------------------------------------------------------------------------------
# Internal consistency
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [FLUX_AG, FLUX_RS, dict(FLUX_RS, pattern="gemm_ar")])
def test_metrics_follow_their_definitions(case: dict) -> None:
    p = predict_overlap(**case)
    assert p.t_sequential_ms == pytest.approx(p.t_gemm_ms + p.t_comm_ms)
    for c in p.by_chunks:
        assert c.efficiency == pytest.approx((p.t_gemm_ms + p.t_comm_ms - c.t_overlap_ms) / p.t_comm_ms)
        assert c.speedup == pytest.approx((p.t_gemm_ms + p.t_comm_ms) / c.t_overlap_ms)
        assert c.exposed_comm_ms == pytest.approx(c.t_overlap_ms - p.t_gemm_ms)
        assert c.t_overlap_ms == pytest.approx(pipeline_time(c.t_chunk_gemm_ms, c.t_chunk_comm_ms, c.chunks))
    best = min(p.by_chunks, key=lambda c: c.t_overlap_ms)
    assert p.best_chunks == best.chunks and p.t_overlap_ms == pytest.approx(best.t_overlap_ms)
    assert p.speedup == pytest.approx(best.speedup) and p.efficiency == pytest.approx(best.efficiency)
    assert [c.chunks for c in p.by_chunks] == [1, 2, 4, 8, 16]
    assert p.gemm_tflops == pytest.approx(2 * math.prod(p.gemm_shape) / (p.t_gemm_ms * 1e-3) / 1e12)


def test_one_chunk_is_the_sequential_schedule() -> None:
    p = predict_overlap(**FLUX_AG)
    one = p.by_chunks[0]
    assert one.chunks == 1 and one.t_overlap_ms == pytest.approx(p.t_sequential_ms)
    assert one.efficiency == pytest.approx(0) and one.speedup == pytest.approx(1)


def test_flux_shapes_give_the_expected_collective_sizes() -> None:
    ag = predict_overlap(**FLUX_AG)
    assert ag.gemm_shape == (4096, 49152 // 8, 12288) and ag.bytes_communicated == 4096 * 12288 * 2
    rs = predict_overlap(**FLUX_RS)
    assert rs.gemm_shape == (4096, 12288, 49152 // 8) and rs.bytes_communicated == 4096 * 12288 * 2
    assert rs.collective == "reduce_scatter" and rs.gpu == "H800-SXM" and rs.interconnect == "nvlink"


def test_fp8_gathers_one_byte_inputs_but_communicates_bf16_partials() -> None:
    ag = predict_overlap("ag_gemm", 4096, 4096, 4096, 8, dtype="fp8")
    rs = predict_overlap("gemm_rs", 4096, 4096, 4096, 8, dtype="fp8")
    assert ag.bytes_communicated == 4096 * 4096 and rs.bytes_communicated == 4096 * 4096 * 2
    assert any("bf16" in a for a in rs.assumptions)


def test_all_reduce_moves_twice_the_bus_traffic_of_reduce_scatter() -> None:
    rs = predict_overlap(**FLUX_RS)
    ar = predict_overlap(**dict(FLUX_RS, pattern="gemm_ar"))
    assert ar.t_comm_ms == pytest.approx(2 * rs.t_comm_ms, rel=0.1)


@pytest.mark.parametrize(
    "case",
    [
        FLUX_AG,
        FLUX_RS,
        dict(pattern="ag_gemm", m=128, n=4096, k=4096, world_size=8, gpu="H100"),
        dict(pattern="gemm_rs", m=65536, n=8192, k=8192, world_size=4, gpu="A100"),
        dict(pattern="gemm_ar", m=16, n=8192, k=8192, world_size=2, gpu="L40S"),
        dict(pattern="ag_gemm", m=8192, n=8192, k=8192, world_size=64, gpu="H100"),
    ],
)
def test_no_free_lunch(case: dict) -> None:
    p = predict_overlap(**case)
    for c in p.by_chunks:
        assert c.t_overlap_ms >= max(p.t_gemm_ms, p.t_comm_ms) * (1 - 1e-9)
    assert p.t_overlap_ms <= p.t_sequential_ms * (1 + 1e-9)
    assert p.by_chunks[0].t_overlap_ms == pytest.approx(p.t_sequential_ms)


def test_overlap_pays_on_the_flux_case_and_not_when_communication_is_tiny() -> None:
    assert predict_overlap(**FLUX_AG).worth_it
    # A huge N per rank next to a small gathered A: the collective is a rounding error beside the GEMM.
    tiny_comm = predict_overlap("ag_gemm", 1024, 8 * 131072, 4096, 8, gpu="H100")
    assert tiny_comm.t_comm_ms < 0.05 * tiny_comm.t_gemm_ms
    assert not tiny_comm.worth_it and "only" in tiny_comm.advice and "Not worth it" in tiny_comm.advice
    # A decode-sized all-reduce: latency-bound, chunking only adds latency.
    decode = predict_overlap("gemm_ar", 8, 8192, 8192, 8, gpu="H100")
    assert not decode.worth_it and decode.best_chunks == 1


def test_beyond_one_nvlink_domain_defaults_to_infiniband() -> None:
    p = predict_overlap("ag_gemm", 8192, 8192, 8192, 16, gpu="H100")
    assert p.interconnect == "infiniband" and p.bus_bandwidth_gbps < 100
    assert predict_overlap("ag_gemm", 8192, 8192, 8192, 8, gpu="H100").interconnect == "nvlink"
    assert predict_overlap("ag_gemm", 8192, 8192, 8192, 8, gpu="L40S").interconnect == "pcie"


def test_bus_bandwidth_follows_the_catalog_links() -> None:
    h100 = predict_overlap("ag_gemm", 8192, 8192, 8192, 8, gpu="H100")
    h800 = predict_overlap("ag_gemm", 8192, 8192, 8192, 8, gpu="H800")
    pcie = predict_overlap("ag_gemm", 8192, 8192, 8192, 8, gpu="H100", interconnect="pcie")
    assert h100.bus_bandwidth_gbps == pytest.approx(360)
    assert h800.bus_bandwidth_gbps == pytest.approx(160)
    assert 35 <= pcie.bus_bandwidth_gbps <= 45
    assert pcie.t_comm_ms > h800.t_comm_ms > h100.t_comm_ms


def test_small_messages_use_the_low_latency_protocol() -> None:
    small = predict_overlap("gemm_ar", 8, 1024, 1024, 8, gpu="H100")
    large = predict_overlap(**FLUX_AG)
    assert small.protocol == "LL" and large.protocol == "Simple"


def test_decode_sized_gemm_is_memory_bound_and_large_is_compute_bound() -> None:
    assert predict_overlap("ag_gemm", 8, 8192, 8192, 8).gemm_bound == "memory"
    assert predict_overlap(**FLUX_AG).gemm_bound == "compute"


@settings(max_examples=50, deadline=None)
@given(
    pattern=st.sampled_from(["ag_gemm", "gemm_rs", "gemm_ar"]),
    m_blocks=st.integers(1, 512),
    n_blocks=st.integers(1, 512),
    k_blocks=st.integers(1, 512),
    world_size=st.sampled_from([2, 4, 8]),
    low=st.floats(1, 1000),
    factor=st.floats(1, 10),
)
def test_more_bandwidth_is_never_slower(
    pattern: str, m_blocks: int, n_blocks: int, k_blocks: int, world_size: int, low: float, factor: float
) -> None:
    shape = dict(pattern=pattern, m=16 * m_blocks, n=16 * n_blocks, k=16 * k_blocks, world_size=world_size)
    slow = predict_overlap(**shape, calibration=Calibration(bus_bandwidth_gbps=low))
    fast = predict_overlap(**shape, calibration=Calibration(bus_bandwidth_gbps=low * factor))
    assert fast.t_comm_ms <= slow.t_comm_ms * (1 + 1e-12)
    assert fast.t_overlap_ms <= slow.t_overlap_ms * (1 + 1e-12)
    assert fast.t_gemm_ms == pytest.approx(slow.t_gemm_ms)


# ---------------------------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------------------------


def test_calibration_moves_the_prediction_the_expected_way() -> None:
    base = predict_overlap(**FLUX_AG)
    assert not base.calibrated
    slower_gemm = predict_overlap(**FLUX_AG, calibration=Calibration(gemm_efficiency=0.5, source="test"))
    faster_gemm = predict_overlap(**FLUX_AG, calibration=Calibration(gemm_efficiency=0.95, source="test"))
    assert slower_gemm.calibrated and slower_gemm.t_gemm_ms > base.t_gemm_ms > faster_gemm.t_gemm_ms
    assert slower_gemm.t_comm_ms == pytest.approx(base.t_comm_ms)
    slow_link = predict_overlap(**FLUX_AG, calibration=Calibration(bus_bandwidth_gbps=80))
    assert slow_link.t_comm_ms > base.t_comm_ms and slow_link.bus_bandwidth_gbps == 80
    assert slow_link.t_gemm_ms == pytest.approx(base.t_gemm_ms)
    assert predict_overlap(**FLUX_AG, calibration=Calibration()).calibrated is False


def test_calibrating_with_the_models_own_efficiency_changes_little() -> None:
    base = predict_overlap(**FLUX_AG)
    same = predict_overlap(**FLUX_AG, calibration=Calibration(gemm_efficiency=base.gemm_tflops / 989))
    assert same.t_gemm_ms == pytest.approx(base.t_gemm_ms, rel=0.03)


GEMMS = [
    dict(device_name="NVIDIA H100 80GB HBM3", dtype="bf16", m=8192, n=8192, k=8192, tflops=700.0),
    dict(device_name="NVIDIA H100 80GB HBM3", dtype="bf16", m=8192, n=8192, k=8192, fraction_of_peak=0.70),
    dict(device_name="NVIDIA H100 80GB HBM3", dtype="bf16", m=16384, n=8192, k=4096, fraction_of_peak=0.72),
    dict(device_name="NVIDIA H100 80GB HBM3", dtype="bf16", m=64, n=64, k=64, fraction_of_peak=0.01),  # small
    dict(device_name="NVIDIA H100 80GB HBM3", dtype="fp8", m=8192, n=8192, k=8192, fraction_of_peak=0.5),  # dtype
    dict(device_name="NVIDIA A100-SXM4-80GB", dtype="bf16", m=8192, n=8192, k=8192, fraction_of_peak=0.9),  # gpu
    dict(device_name="cpu", dtype="bf16", m=8192, n=8192, k=8192, tflops=1.0),
]
COLLECTIVES = [
    dict(op="all_reduce", size=2**30, busbw=350.0),
    dict(op="all_gather", size=2**28, busbw=330.0),
    dict(op="all_reduce", size=2**30, busbw=340.0),
    dict(op="all_reduce", size=4096, busbw=1.0),  # small: ignored
    dict(op="broadcast", size=2**30, busbw=999.0),  # other op: ignored
    dict(op="all_reduce", size=2**30, busbw=5.0, backend="gloo"),  # CPU: ignored
    dict(op="all_reduce", rows=[dict(size=2**27, busbw=345.0), dict(size=1024, busbw=0.5)]),
]


def test_calibration_from_measurements_takes_medians_of_large_matching_results() -> None:
    cal = calibration_from_measurements(GEMMS, COLLECTIVES, "H100")
    assert cal is not None
    assert cal.gemm_efficiency == pytest.approx(700 / 989)  # median of 0.708, 0.70, 0.72
    assert cal.bus_bandwidth_gbps == pytest.approx(342.5)
    assert "H100-SXM" in cal.source
    p = predict_overlap("ag_gemm", 8192, 8192, 8192, 8, gpu="H100", calibration=cal)
    assert p.calibrated and p.bus_bandwidth_gbps == pytest.approx(342.5)


def test_calibration_with_nothing_applicable_is_none() -> None:
    assert calibration_from_measurements([], [], "H100") is None
    assert calibration_from_measurements(GEMMS[3:4], COLLECTIVES[3:6], "H100") is None
    only_link = calibration_from_measurements([], COLLECTIVES[:1], "H100")
    assert only_link is not None and only_link.gemm_efficiency is None and only_link.bus_bandwidth_gbps == 350


def test_calibration_rejects_an_unknown_gpu() -> None:
    with pytest.raises(InputError):
        calibration_from_measurements(GEMMS, COLLECTIVES, "Z9000")


# ---------------------------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------------------------


def test_every_preset_matches_its_configuration() -> None:
    presets = list_presets(seq_len=2048, micro_batch=2)
    assert [p.name for p in presets] == list(PRESET_NAMES) and len(presets) == 6
    for preset in presets:
        cfg, layers = preset.config, {layer.layer: layer for layer in preset.layers}
        assert preset.tokens == 4096 and preset.source
        if "num_attention_heads" in cfg:
            hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
            heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
            assert (layers["qkv"].pattern, layers["qkv"].n, layers["qkv"].k) == (
                "ag_gemm",
                (heads + 2 * kv) * hd,
                hidden,
            )
            assert (layers["attn_out"].pattern, layers["attn_out"].n, layers["attn_out"].k) == (
                "gemm_rs",
                hidden,
                heads * hd,
            )
            assert (layers["mlp_up_gate"].n, layers["mlp_up_gate"].k) == (2 * inter, hidden)
            assert (layers["mlp_down"].pattern, layers["mlp_down"].n, layers["mlp_down"].k) == (
                "gemm_rs",
                hidden,
                inter,
            )
            assert all(layer.m == 4096 for layer in preset.layers)


def test_published_configuration_values() -> None:
    expect = {
        "llama3-8b": (4096, 14336, 32, 8),
        "llama3-70b": (8192, 28672, 64, 8),
        "llama3.1-405b": (16384, 53248, 128, 8),
        "qwen2.5-72b": (8192, 29568, 64, 8),
    }
    for name, (hidden, inter, heads, kv) in expect.items():
        cfg = get_preset(name).config
        assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]) == (hidden, inter, heads)
        assert cfg["num_key_value_heads"] == kv and cfg["head_dim"] == 128
    assert get_preset("llama3-70b").layers[0].n == 10240


def test_moe_presets_use_average_tokens_per_expert() -> None:
    mixtral = get_preset("mixtral-8x7b-experts", seq_len=4096)
    assert {layer.m for layer in mixtral.layers} == {4096 * 2 // 8}
    up = next(layer for layer in mixtral.layers if layer.layer == "expert_up_gate")
    assert (up.n, up.k) == (2 * 14336, 4096)
    ds = {layer.layer: layer for layer in get_preset("deepseek-v3-experts", seq_len=4096).layers}
    assert ds["expert_up_gate"].m == 4096 * 8 // 256 and (ds["expert_up_gate"].n, ds["expert_up_gate"].k) == (
        4096,
        7168,
    )
    assert (ds["expert_down"].n, ds["expert_down"].k) == (7168, 2048)
    assert ds["shared_up_gate"].m == 4096 and "qkv" not in ds
    assert get_preset("mixtral-8x7b-experts", seq_len=5).layers[0].m == 2  # ceil(5 * 2 / 8)


def test_divisible_by_lists_layers_that_do_not_split() -> None:
    llama = get_preset("llama3-8b")
    assert llama.divisible_by(1) == [] and llama.divisible_by(8) == []
    sixteen = llama.divisible_by(16)
    assert len(sixteen) == 1 and sixteen[0].startswith("qkv") and "replicate" in sixteen[0]
    three = llama.divisible_by(3)
    assert {entry.split(":")[0] for entry in three} == {"qkv", "attn_out", "mlp_up_gate", "mlp_down"}
    odd_tokens = get_preset("llama3-8b", seq_len=4097)
    assert any(entry.startswith("mlp_down") and "m=4097" in entry for entry in odd_tokens.divisible_by(8))
    with pytest.raises(InputError):
        llama.divisible_by(0)


def test_every_preset_layer_runs_through_the_model_at_tp8() -> None:
    for preset in list_presets():
        for layer in preset.layers:
            assert split_problems(layer.pattern, layer.m, layer.n, layer.k, 8) == []
            p = predict_overlap(layer.pattern, layer.m, layer.n, layer.k, 8, gpu="H100")
            assert p.t_overlap_ms > 0 and p.advice


def test_get_preset_errors_list_the_names() -> None:
    with pytest.raises(InputError) as info:
        get_preset("gpt-5")
    assert all(name in str(info.value) for name in PRESET_NAMES)
    with pytest.raises(InputError):
        get_preset("llama3-8b", seq_len=0)
    assert get_preset("LLAMA3_8B").name == "llama3-8b"
