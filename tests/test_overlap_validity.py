"""Overlap measurements check themselves: impossible numbers are flagged with the reason, never scored, never "best".

Built from the reproduction of issue 10 (CPU, gloo, world size 2, llama mlp_up_gate): T_gemm 223 ms, T_comm 4.9 ms,
T_sequential 121 ms (less than the GEMM alone), a chunked row at E = 21.7 with -101.67 ms of exposed communication
picked as best, and the sequential row scored against itself as E = 1.03, speedup 1.22. The summaries are computed
from per-rank timings shaped exactly as the rank processes return them, so no process is needed; the property test
feeds generated timings through the same code. `assert_self_consistent` is also applied to real gloo runs in
test_overlap_bench.py.
"""

import math
import statistics
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servers.overlap.overlap_bench import (
    OverlapLayer,
    OverlapSpec,
    OverlapTuneSpec,
    _summarize,
    finite,
    predict_layer,
    prediction_target,
    tune_entry,
)
from servers.overlap.validity import ABS_NOISE_MS, E_MAX, MAX_SPREAD, MIN_ITERS, REL_NOISE

pytestmark = pytest.mark.timeout(120)

SPEC = OverlapSpec(pattern="ag_gemm", m=4096, n=57344, k=8192, world_size=2, iters=10, backend="gloo")
LAYER = OverlapLayer(layer="mlp_up_gate", pattern="ag_gemm", m=4096, n=57344, k=8192)


def jitter(value: float, n: int = 10, amount: float = 0.01) -> list[float]:
    """n iteration times around `value`, deterministic, within +-amount."""
    return [value * (1 + amount * ((i * 7) % 5 - 2) / 2) for i in range(n)]


def ranks_for(
    t_gemm: float, t_comm: float, rows: dict[tuple[str, int | None], list[float]], world_size: int = 2
) -> list[dict[str, Any]]:
    """Per-rank results as _overlap_rank returns them: every rank the same timings, every output correct."""
    entries = [
        {
            "method": method,
            "chunks": chunks,
            "available": True,
            "times_ms": times,
            "max_abs_diff": 0.0,
            "max_abs_ref": 1.0,
        }
        for (method, chunks), times in rows.items()
    ]
    return [
        {"t_gemm_ms": jitter(t_gemm), "t_comm_ms": jitter(t_comm), "comm_bytes": 1 << 20, "entries": entries}
        for _ in range(world_size)
    ]


def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in result["methods"]}


def _spread(series: list[float]) -> float:
    """(p90 - p10) / median by linear interpolation: written here independently of validity.spread."""
    cuts = statistics.quantiles(series, n=10, method="inclusive")
    return (cuts[8] - cuts[0]) / statistics.median(series)


def _noise(x: float) -> float:
    return max(REL_NOISE * x, ABS_NOISE_MS)


def assert_self_consistent(result: dict[str, Any]) -> None:
    """Every measured row satisfies its validity checks or is flagged; only valid rows carry scores; the best is
    the fastest valid, correct row, or there is none and the result says why."""
    t_gemm, t_comm, t_seq = result["t_gemm_ms"], result["t_comm_ms"], result["t_sequential_ms"]
    baseline_ok = result["validity"]["valid"]
    assert baseline_ok == all(check["passed"] for check in result["validity"]["checks"])
    if baseline_ok:
        assert t_gemm > 0 and t_comm > 0 and t_seq is not None
        assert abs(t_seq - (t_gemm + t_comm)) <= _noise(t_gemm + t_comm) * (1 + 1e-9)
    measured = [row for row in result["methods"] if row.get("available")]
    for row in measured:
        if not row["valid"]:
            assert row["invalid_reasons"], row
            assert all(row[key] is None for key in ("efficiency", "speedup", "exposed_comm_ms")), row
            continue
        assert baseline_ok and row["invalid_reasons"] == []
        per_iteration = [max(values) for values in zip(*row["raw_times_ms"], strict=True)]
        assert len(per_iteration) >= MIN_ITERS
        assert _spread(per_iteration) <= MAX_SPREAD * (1 + 1e-9)
        t = row["t_overlap_ms"]
        if row["method"] == "sequential":
            assert (row["efficiency"], row["speedup"], row["exposed_comm_ms"]) == (0.0, 1.0, t_comm)
            continue
        assert t >= max(t_gemm, t_comm) - _noise(max(t_gemm, t_comm)) * (1 + 1e-9)
        assert row["efficiency"] == pytest.approx((t_gemm + t_comm - t) / t_comm)
        assert row["efficiency"] <= E_MAX
        assert row["speedup"] == pytest.approx((t_gemm + t_comm) / t)
        assert row["exposed_comm_ms"] == pytest.approx(t - t_gemm)
    eligible = [row for row in measured if row["valid"] and row["passed"]]
    if eligible:
        best = by_name(result)[result["best"]]
        assert best["valid"] and best["passed"]
        assert best["t_overlap_ms"] == min(row["t_overlap_ms"] for row in eligible)
    else:
        assert result["best"] is None and result["best_reason"].startswith("no best")
    assert result["all_valid"] == all(row["valid"] for row in measured)


# ---------------------------------------------------------------------------------------------------------------
# The reproduction


def reported_cpu_run() -> dict[str, Any]:
    """The numbers of the report: the sequential schedule faster than its own GEMM."""
    rows = {
        ("sequential", None): jitter(121.0),
        ("chunked", 2): jitter(121.33),
        ("chunked", 4): jitter(140.0),
        ("ring", None): jitter(150.0),
    }
    return finite(_summarize(SPEC, "gloo", ranks_for(223.0, 4.91, rows)))


def test_the_reported_impossible_numbers_are_flagged_and_not_scored() -> None:
    result = reported_cpu_run()
    assert_self_consistent(result)
    checks = {check["name"]: check for check in result["validity"]["checks"]}
    assert not checks["sequential_is_gemm_plus_comm"]["passed"]
    assert "121" in checks["sequential_is_gemm_plus_comm"]["detail"]
    assert result["validity"]["valid"] is False and result["all_valid"] is False
    rows = by_name(result)
    # Before: chunked(C=2) at E=21.70, exposed -101.67 ms, chosen as best; sequential at E=1.03, speedup 1.22.
    for row in rows.values():
        assert row["valid"] is False
        assert row["efficiency"] is None and row["speedup"] is None and row["exposed_comm_ms"] is None
        assert any("sequential_is_gemm_plus_comm" in reason for reason in row["invalid_reasons"])
    assert any("overlap_not_faster_than_longest_part" in r for r in rows["chunked(C=2)"]["invalid_reasons"])
    assert result["best"] is None
    assert "no best: the measurement failed its validity checks" in result["best_reason"]
    assert "MEASUREMENT INVALID" in result["table"]
    line = next(line for line in result["table"].splitlines() if line.startswith("chunked(C=2) "))
    assert line.split()[1:3] == ["yes", "NO"] and "21.7" not in line  # correct output, invalid timing, no score
    assert "E = (T_gemm + T_comm - T_overlap) / T_comm = 21.7" in result["table"]  # said as the reason only


def test_tune_reports_no_gain_and_no_best_from_the_reported_numbers() -> None:
    entry = tune_entry(LAYER, reported_cpu_run(), [], None, "no prediction: this ran on CPU")
    assert entry["best"] is None and entry["gain"] is None and entry["best_t_ms"] is None
    assert entry["verdict"].startswith("no verdict: the measurement failed its validity checks")
    assert "sequential_is_gemm_plus_comm" in entry["verdict"]
    assert entry["measurement_valid"] is False and entry["measurement_invalid_reasons"]
    assert set(entry["invalid_rows"]) == {"sequential", "chunked(C=2)", "chunked(C=4)", "ring"}
    assert entry["prediction_note"].startswith("no prediction") and entry["predicted_gain"] is None
    assert all("checks" not in row and row["raw_times_ms"] == [] for row in entry["methods"])
    assert entry["validity"] == {k: reported_cpu_run()["validity"][k] for k in ("valid", "checks")}
    full = tune_entry(LAYER, reported_cpu_run(), [], None, None, full=True)  # one layer: the rows as measured
    assert full["methods"] == reported_cpu_run()["methods"] and all("checks" in row for row in full["methods"])


# ---------------------------------------------------------------------------------------------------------------
# Each check, one at a time, against a consistent baseline (T_gemm 10, T_comm 5, T_sequential 15.2 ms)


def consistent(**rows: list[float]) -> dict[str, Any]:
    table = {("sequential", None): jitter(15.2)}
    for name, times in rows.items():
        method, _, chunks = name.partition("_")
        table[(method, int(chunks) if chunks else None)] = times
    return finite(_summarize(SPEC, "gloo", ranks_for(10.0, 5.0, table)))


def test_the_sequential_row_is_the_baseline_by_definition() -> None:
    result = consistent(chunked_2=jitter(11.0))
    assert_self_consistent(result)
    assert result["validity"]["valid"] and result["all_valid"]
    rows = by_name(result)
    seq = rows["sequential"]
    assert (seq["efficiency"], seq["speedup"], seq["speedup_vs_sequential"]) == (0.0, 1.0, 1.0)
    assert seq["exposed_comm_ms"] == result["t_comm_ms"]
    chunked = rows["chunked(C=2)"]
    assert chunked["efficiency"] == pytest.approx((result["t_gemm_ms"] + result["t_comm_ms"] - 11.0) / 5.0, rel=1e-6)
    assert result["best"] == "chunked(C=2)" and "fastest of 2 valid row(s)" in result["best_reason"]
    entry = tune_entry(LAYER, result, [], None, None)
    assert entry["gain"] == pytest.approx(15.2 / 11.0 - 1, rel=1e-6) and entry["significant"]
    assert entry["verdict"].startswith("chunked(C=2) is 38.2% faster than sequential")


def test_an_overlap_faster_than_its_gemm_is_flagged_and_the_best_comes_from_the_valid_rows() -> None:
    result = consistent(chunked_2=jitter(8.0), ring=jitter(13.0))
    assert_self_consistent(result)
    rows = by_name(result)
    assert rows["chunked(C=2)"]["valid"] is False and rows["chunked(C=2)"]["efficiency"] is None
    reasons = rows["chunked(C=2)"]["invalid_reasons"]
    assert [reason.split(":")[0] for reason in reasons] == [
        "overlap_not_faster_than_longest_part",
        "efficiency_at_most_one",
    ]
    assert reasons[0].startswith("overlap_not_faster_than_longest_part: T_overlap 8 ms against T_gemm")
    assert result["best"] == "ring"
    assert "not considered, failing the validity checks: chunked(C=2)" in result["best_reason"]
    assert "INVALID chunked(C=2)" in result["table"]


def test_more_than_all_of_the_communication_hidden_is_flagged() -> None:
    """T_comm much shorter than T_gemm: T_overlap within noise of T_gemm can still mean E > 1.05."""
    ranks = ranks_for(10.0, 0.2, {("sequential", None): jitter(10.2), ("chunked", 2): jitter(9.7)})
    result = finite(_summarize(SPEC, "gloo", ranks))
    assert_self_consistent(result)
    row = by_name(result)["chunked(C=2)"]
    assert row["valid"] is False
    assert [reason.split(":")[0] for reason in row["invalid_reasons"]] == ["efficiency_at_most_one"]
    assert result["best"] == "sequential"


def test_a_method_slower_than_sequential_is_valid_with_a_warning() -> None:
    result = consistent(ring=jitter(20.0))
    assert_self_consistent(result)
    ring = by_name(result)["ring"]
    assert ring["valid"] and ring["efficiency"] == pytest.approx(-1.0, abs=0.01)
    assert ring["warnings"] and "slower than the sequential schedule" in ring["warnings"][0]
    assert result["best"] == "sequential"
    entry = tune_entry(LAYER, result, [], None, None)
    assert entry["gain"] == 0.0 and entry["verdict"] == "keep sequential: no valid overlapped row is faster"


def test_a_gain_within_noise_is_not_a_verdict_for_overlap() -> None:
    entry = tune_entry(LAYER, consistent(chunked_2=jitter(14.8)), [], None, None)
    assert entry["best"] == "chunked(C=2)" and 0 < entry["gain"] < REL_NOISE and not entry["significant"]
    assert entry["verdict"].startswith("no significant gain")


def test_a_noisy_row_is_flagged_by_its_spread() -> None:
    noisy = [11.0, 30.0, 11.0, 5.0, 11.0, 40.0, 11.0, 12.0, 11.0, 50.0]
    result = consistent(chunked_2=noisy)
    assert_self_consistent(result)
    row = by_name(result)["chunked(C=2)"]
    assert row["valid"] is False and row["invalid_reasons"][0].startswith("spread: spread of T_overlap")
    assert result["best"] == "sequential"


def test_too_few_iterations_cannot_be_checked() -> None:
    ranks = ranks_for(10.0, 5.0, {("sequential", None): [15.0, 15.1], ("chunked", 2): [11.0, 11.0]})
    for rank in ranks:
        rank["t_gemm_ms"], rank["t_comm_ms"] = [10.0, 10.0], [5.0, 5.0]
    result = finite(_summarize(SPEC, "gloo", ranks))
    assert_self_consistent(result)
    assert [c["name"] for c in result["validity"]["checks"] if not c["passed"]] == ["enough_iterations"]
    assert result["best"] is None and "enough_iterations" in result["best_reason"]


def test_a_wrong_output_is_never_best_even_when_fastest() -> None:
    ranks = ranks_for(10.0, 5.0, {("sequential", None): jitter(15.2), ("chunked", 2): jitter(11.0)})
    ranks[1]["entries"][1] = {**ranks[1]["entries"][1], "max_abs_diff": 0.5}
    result = finite(_summarize(SPEC, "gloo", ranks))
    assert_self_consistent(result)
    assert result["best"] == "sequential" and "output differs from sequential: chunked(C=2)" in result["best_reason"]


# ---------------------------------------------------------------------------------------------------------------
# Property: whatever the timings, every row satisfies its checks or is flagged


@st.composite
def measurements(draw: st.DrawFn) -> tuple[OverlapSpec, list[dict[str, Any]]]:
    world_size = draw(st.integers(1, 3))
    iters = draw(st.integers(1, 12))
    t_gemm = draw(st.floats(1e-4, 300.0))
    t_comm = draw(st.floats(1e-4, 300.0))
    # Mostly near the sum (so that valid rows are common), sometimes far from it, as in the report.
    seq_factor = draw(st.one_of(st.floats(0.97, 1.03), st.floats(0.2, 3.0)))
    noise = draw(st.sampled_from([0.0, 0.01, 0.05, 0.5, 2.0]))

    def series(center: float) -> list[list[float]]:
        return [
            [max(0.0, center * (1 + noise * draw(st.floats(-0.5, 0.5)))) for _ in range(iters)]
            for _ in range(world_size)
        ]

    rows: list[tuple[str, int | None, float]] = [("sequential", None, (t_gemm + t_comm) * seq_factor)]
    for chunks in draw(st.lists(st.sampled_from([None, 2, 4]), max_size=3, unique=True)):
        fraction = draw(st.floats(0.0, 1.6))  # 0: no faster than sequential... 1.6: impossibly fast
        rows.append(("chunked" if chunks else "ring", chunks, max(1e-6, t_gemm + t_comm - fraction * t_comm)))
    gemm, comm = series(t_gemm), series(t_comm)
    per_row = [(method, chunks, series(center)) for method, chunks, center in rows]
    wrong = draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    ranks = []
    for r in range(world_size):
        entries = [
            {
                "method": method,
                "chunks": chunks,
                "available": True,
                "times_ms": times[r],
                "max_abs_diff": 1.0 if bad and method != "sequential" else 0.0,
                "max_abs_ref": 1.0,
            }
            for (method, chunks, times), bad in zip(per_row, wrong, strict=True)
        ]
        entries.append({"method": "symm_mem", "chunks": None, "available": False, "reason": "not available here"})
        ranks.append({"t_gemm_ms": gemm[r], "t_comm_ms": comm[r], "comm_bytes": 4096, "entries": entries})
    spec = OverlapSpec(pattern="gemm_rs", m=64, n=64, k=64, world_size=world_size, iters=iters, backend="gloo")
    return spec, ranks


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(measurements())
def test_every_row_satisfies_its_validity_checks_or_is_flagged(case: tuple[OverlapSpec, list[dict[str, Any]]]) -> None:
    spec, ranks = case
    result = finite(_summarize(spec, "gloo", ranks))
    assert_self_consistent(result)
    entry = tune_entry(OverlapLayer(layer="x", pattern="gemm_rs", m=64, n=64, k=64), result, [], None, None)
    if entry["gain"] is not None:
        assert entry["best"] == result["best"] and entry["measurement_valid"]
        assert not math.isnan(entry["gain"])
    else:
        assert entry["verdict"].startswith("no verdict")


# ---------------------------------------------------------------------------------------------------------------
# The prediction next to the measurement


def test_no_prediction_on_cpu_unless_asked_and_then_labelled() -> None:
    cpu = {"device": "cpu", "device_name": "cpu", "gpu_catalog_name": None}
    spec = OverlapTuneSpec(layers=[LAYER], backend="gloo")
    gpu, note = prediction_target(spec, cpu)
    assert gpu is None and note.startswith("no prediction: this ran on CPU (gloo)") and "predict_for_gpu" in note
    asked = spec.model_copy(update={"predict_for_gpu": "h100"})
    gpu, note = prediction_target(asked, cpu)
    assert gpu == "H100-SXM" and "not comparable" in note
    uncatalogued = {"device": "cuda", "device_name": "NVIDIA Voodoo5", "gpu_catalog_name": None}
    assert "not in the GPU catalog" in prediction_target(spec, uncatalogued)[1]
    h100 = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "gpu_catalog_name": "H100-SXM"}
    assert prediction_target(spec, h100) == ("H100-SXM", None)


def test_the_predicted_gain_is_predict_overlaps() -> None:
    from servers.overlap.cost_model import predict_overlap

    predicted, note = predict_layer(LAYER, 8, "bf16", "H800-SXM", [2, 4, 8])
    assert note is None and predicted is not None
    direct = predict_overlap("ag_gemm", 4096, 57344, 8192, 8, dtype="bf16", gpu="H800-SXM", max_chunks=8)
    assert predicted["gain"] == pytest.approx(direct.speedup - 1) and predicted["best_chunks"] == direct.best_chunks
    missing, why = predict_layer(LAYER, 8, "fp8", "A100-SXM-80GB", [2])
    assert missing is None and why.startswith("no prediction:") and "fp8" in why
