"""Collective and overlap benchmarks on real rank processes (gloo on CPU, world size 2).

Each test that needs ranks starts them through the work functions (or run_ranks), so the spawning, the rendezvous,
the per-rank logs and the error paths are the real ones. Spawning costs ~2 s per run: the pattern checks run every
method of one pattern in a single run.
"""

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from servers.core.errors import InputError
from servers.overlap.collectives import _expected, busbw_factor, plan_size, run_collective_benchmark
from servers.overlap.distributed import RankInfo, max_world_size, run_ranks
from servers.overlap.overlap_bench import (
    TOLERANCE_RULE,
    _overlap_rank,
    run_overlap_benchmark,
    run_overlap_tune,
)
from tests.test_overlap_validity import assert_self_consistent

pytestmark = pytest.mark.timeout(300)


class FakeContext:
    """The part of JobContext a work function uses, writing into a temporary folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.progress_calls: list[tuple[Any, Any, Any]] = []
        self.metrics: list[dict[str, Any]] = []

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self.progress_calls.append((done, total, message))

    def log_metrics(self, step: int | None = None, **values: Any) -> None:
        self.metrics.append({"step": step, **values})

    def log_path(self, process: str) -> Path:
        path = self.root / "logs" / f"{process}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


@pytest.fixture
def ctx(tmp_path: Path) -> FakeContext:
    return FakeContext(tmp_path)


SMALL = {"m": 64, "n": 64, "k": 32, "world_size": 2, "backend": "gloo", "warmup": 1, "iters": 3, "seed": 3}


# ---------------------------------------------------------------------------------------------------------------
# Overlap benchmark: every pattern x method against the sequential result


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs", "gemm_ar"])
def test_every_method_matches_sequential_fp32(pattern: str, ctx: FakeContext) -> None:
    spec = {**SMALL, "pattern": pattern, "dtype": "fp32", "chunks": [2], "methods": ["chunked", "ring", "symm_mem"]}
    result = run_overlap_benchmark(spec, ctx)
    by_name = {row["name"]: row for row in result["methods"]}
    assert set(by_name) == {"sequential", "chunked(C=2)", "ring", "symm_mem"}
    for name in ("sequential", "chunked(C=2)", "ring"):
        row = by_name[name]
        assert row["available"] and row["passed"], row
        assert row["rel_err"] <= 1e-4 and row["max_abs_diff"] >= 0
        assert row["t_overlap_ms"] > 0
    # Real CPU timings are whatever they are: each row is scored only if its checks pass, else flagged with why.
    assert_self_consistent(result)
    assert result["validity"]["rules"] and all("passed" in c for c in result["validity"]["checks"])
    symm = by_name["symm_mem"]
    assert symm["available"] is False and symm["reason"].startswith("not available here:")
    assert result["all_passed"] and result["backend"] == "gloo" and result["device"] == "cpu"
    assert "not performance" in result["note"] and result["tolerance"]["rtol"] == 1e-4
    assert result["busbw_factor"] == (1.0 if pattern == "gemm_ar" else 0.5)
    assert "ring" in result["table"] and "NOTE" in result["table"]
    assert [m["method"] for m in ctx.metrics] == ["sequential", "chunked(C=2)", "ring"]
    assert (ctx.root / "logs" / "rank0.log").exists() and (ctx.root / "logs" / "rank1.log").exists()


def test_bf16_methods_match_within_tolerance(ctx: FakeContext) -> None:
    spec = {**SMALL, "pattern": "gemm_rs", "dtype": "bf16", "chunks": [2, 4], "methods": ["chunked", "ring"]}
    result = run_overlap_benchmark(spec, ctx)
    assert result["tolerance"]["rtol"] == 2e-2
    names = [row["name"] for row in result["methods"]]
    assert names == ["sequential", "chunked(C=2)", "chunked(C=4)", "ring"]
    assert all(row["passed"] and row["rel_err"] <= 2e-2 for row in result["methods"])


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs", "gemm_ar"])
def test_sequential_reference_equals_the_global_product(pattern: str) -> None:
    """The reference every method is checked against is itself right: rebuild the global GEMM from the shards."""
    import torch

    cfg = {
        **SMALL,
        "pattern": pattern,
        "dtype": "fp32",
        "methods": ["sequential"],
        "chunks": [2],
        "return_tensors": True,
    }
    ranks = run_ranks(2, _overlap_rank, (cfg,), backend="gloo", timeout_s=120)
    t = [x["tensors"] for x in ranks]
    m = SMALL["m"]
    if pattern == "ag_gemm":
        a_global = torch.cat([t[0]["a"], t[1]["a"]])
        expected = [a_global @ t[r]["weight"] for r in range(2)]
    else:
        total = t[0]["a"] @ t[0]["weight"] + t[1]["a"] @ t[1]["weight"]
        expected = [total[r * m // 2 : (r + 1) * m // 2] for r in range(2)] if pattern == "gemm_rs" else [total] * 2
    for r in range(2):
        assert t[r]["reference"].shape == expected[r].shape
        torch.testing.assert_close(t[r]["reference"], expected[r], rtol=1e-5, atol=1e-5)
    assert not torch.equal(t[0]["a"], t[1]["a"]), "each rank must get its own inputs"


def test_overlap_tune_picks_a_correct_best_per_layer(ctx: FakeContext) -> None:
    spec = {
        **{key: SMALL[key] for key in ("world_size", "backend", "warmup", "iters", "seed")},
        "dtype": "fp32",
        "methods": ["sequential", "chunked", "ring"],
        "chunks": [2, 3],
        "layers": [
            {"layer": "qkv", "pattern": "ag_gemm", "m": 64, "n": 64, "k": 32},
            {"layer": "proj", "pattern": "gemm_rs", "m": 64, "n": 32, "k": 64},
        ],
    }
    result = run_overlap_tune(spec, ctx)
    assert [layer["layer"] for layer in result["layers"]] == ["qkv", "proj"]
    for layer in result["layers"]:
        assert layer["skipped_chunks"] == [3]  # 64 rows do not split into 2 ranks x 3 chunks
        rows = {row["name"]: row for row in layer["methods"]}
        assert set(rows) == {"sequential", "chunked(C=2)", "ring"}
        eligible = [row for row in rows.values() if row["passed"] and row["valid"]]
        if eligible:  # the best comes only from valid, correct rows
            best = rows[layer["best"]]
            assert best["passed"] and best["valid"]
            assert layer["best_t_ms"] == min(row["t_overlap_ms"] for row in eligible)
            assert layer["gain"] == pytest.approx(layer["t_sequential_ms"] / layer["best_t_ms"] - 1)
        else:
            assert layer["best"] is None and layer["gain"] is None and layer["verdict"].startswith("no verdict")
        for row in rows.values():
            assert row["valid"] or (row["invalid_reasons"] and row["efficiency"] is None)
        # On CPU there is no catalog GPU to predict for, and the result says so instead of leaving a blank.
        assert layer["predicted"] is None and layer["prediction_note"].startswith("no prediction: this ran on CPU")
    assert result["prediction_gpu"] is None and "predict_for_gpu" in result["prediction_note"]
    assert "qkv" in result["table"] and "proj" in result["table"] and "no prediction" in result["table"]
    assert [call[0] for call in ctx.progress_calls] == [0, 1, 1, 2]


def test_input_errors_are_reported_before_any_rank_starts(ctx: FakeContext) -> None:
    with pytest.raises(ValueError, match="N=31 is not divisible by world_size 2"):
        run_overlap_benchmark({**SMALL, "pattern": "ag_gemm", "n": 31}, ctx)
    with pytest.raises(ValueError, match="not divisible by world_size"):
        run_overlap_benchmark({**SMALL, "pattern": "gemm_rs", "k": 33, "dtype": "fp32"}, ctx)
    with pytest.raises(ValueError, match=r"world_size\*chunks = 2\*3"):
        run_overlap_benchmark({**SMALL, "pattern": "ag_gemm", "dtype": "fp32", "chunks": [3]}, ctx)
    with pytest.raises(ValueError, match=r"needs about [\d.]+ \w+ per rank but only [\d.]+ \w+ is available"):
        big = {"m": 131072, "n": 131072, "k": 131072}
        run_overlap_benchmark({**SMALL, **big, "pattern": "ag_gemm", "dtype": "fp32"}, ctx)
    with pytest.raises(ValueError, match="fp8 needs"):
        run_overlap_benchmark({**SMALL, "pattern": "ag_gemm", "dtype": "fp8"}, ctx)
    with pytest.raises(ValueError, match=r"tf32 needs NVIDIA GPUs with TF32 tensor cores .* use fp32 on CPU"):
        run_overlap_benchmark({**SMALL, "pattern": "ag_gemm", "dtype": "tf32"}, ctx)
    limit = max_world_size("gloo")
    if limit < 64:  # the specs themselves allow up to 64 ranks
        with pytest.raises(
            ValueError, match=f"world_size {limit + 1} is more than this machine runs with gloo: at most {limit}"
        ):
            run_overlap_benchmark({**SMALL, "pattern": "gemm_ar", "dtype": "fp32", "world_size": limit + 1}, ctx)
        with pytest.raises(ValueError, match=f"at most {limit}"):
            run_collective_benchmark({"op": "all_reduce", "world_size": limit + 1, "backend": "gloo"}, ctx)
    with pytest.raises(ValueError, match=r"all_gather of 68,719,476,736 bytes needs about .* per rank"):
        run_collective_benchmark({"op": "all_gather", "sizes": [2**36], "backend": "gloo"}, ctx)
    assert "max|ref|" in TOLERANCE_RULE and "2.5e-3 for tf32" in TOLERANCE_RULE


# ---------------------------------------------------------------------------------------------------------------
# Collective benchmark


def test_size_planning_follows_nccl_tests() -> None:
    assert plan_size("all_reduce", 1024, "fp32", 2) == {"total": 256, "block": 256, "count": 256, "size": 1024}
    assert plan_size("all_gather", 1024, "fp32", 4) == {"total": 256, "block": 64, "count": 64, "size": 1024}
    assert plan_size("reduce_scatter", 1030, "bf16", 2) == {"total": 514, "block": 257, "count": 257, "size": 1028}
    assert plan_size("all_to_all", 4, "fp32", 2)["size"] == 8  # at least one element per peer
    assert [busbw_factor(op, 4) for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")] == [
        1.5,
        0.75,
        0.75,
        0.75,
    ]
    assert busbw_factor("broadcast", 4) == 1.0


def test_expected_values_are_the_collective_semantics() -> None:
    """The checker's expectations, against the definitions written out by hand for two ranks."""
    import torch

    from servers.overlap.collectives import _pattern

    x0, x1 = _pattern("sum", 0, 8), _pattern("sum", 1, 8)
    assert torch.equal(_expected("all_reduce", 1, 2, 8, 8), x0 + x1)
    assert torch.equal(_expected("reduce_scatter", 1, 2, 8, 4), (x0 + x1)[4:])
    g0, g1 = _pattern("gather", 0, 4), _pattern("gather", 1, 4)
    assert torch.equal(_expected("all_gather", 0, 2, 8, 4), torch.cat([g0, g1]))
    a0, a1 = _pattern("a2a", 0, 8, 4), _pattern("a2a", 1, 8, 4)
    assert torch.equal(_expected("all_to_all", 0, 2, 8, 4), torch.cat([a0[:4], a1[:4]]))
    assert torch.equal(_expected("all_to_all", 1, 2, 8, 4), torch.cat([a0[4:], a1[4:]]))
    assert not torch.equal(a0[:4], a1[:4])  # blocks differ, so a swapped block would count as wrong


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"])
def test_collective_table(op: str, ctx: FakeContext) -> None:
    spec = {"op": op, "sizes": [64, 4096, 65536], "dtype": "fp32", "world_size": 2, "backend": "gloo"}
    result = run_collective_benchmark({**spec, "warmup": 1, "iters": 3}, ctx)
    factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(op, 0.5)
    assert result["busbw_factor"] == factor and result["world_size"] == 2 and result["backend"] == "gloo"
    assert [row["size"] for row in result["rows"]] == [64, 4096, 65536]
    for row in result["rows"]:
        assert row["wrong"] == 0
        elements = row["size"] // 4
        assert row["count"] == (elements // 2 if op in ("all_gather", "reduce_scatter", "all_to_all") else elements)
        assert row["type"] == "float"
        assert row["redop"] == ("sum" if op in ("all_reduce", "reduce_scatter") else "none")
        assert row["root"] == (0 if op == "broadcast" else -1)
        assert row["algbw"] == pytest.approx(row["size"] / (row["time_us"] * 1e-6) / 1e9)
        assert row["busbw"] == pytest.approx(row["algbw"] * factor)
    assert result["avg_busbw"] == pytest.approx(sum(r["busbw"] for r in result["rows"]) / 3)
    lines = result["table"].splitlines()
    assert "#wrong" in lines[1] and lines[-1].startswith("# Avg bus bandwidth")
    assert len(lines) == 3 + 3 + 1 and lines[3].split()[0] == "64"
    assert len(ctx.metrics) == 3 and "not network or GPU performance" in result["note"]


def test_collective_bf16_is_checked_exactly(ctx: FakeContext) -> None:
    spec = {"op": "reduce_scatter", "min_bytes": 8, "max_bytes": 8192, "factor": 32, "dtype": "bf16"}
    result = run_collective_benchmark({**spec, "world_size": 2, "backend": "gloo", "warmup": 0, "iters": 1}, ctx)
    assert [row["size"] for row in result["rows"]] == [8, 256, 8192]
    assert all(row["wrong"] == 0 and row["type"] == "bfloat16" for row in result["rows"])


@pytest.mark.parametrize("op", ["all_gather", "all_to_all", "broadcast"])
def test_collective_fp8_moves_bytes_and_is_checked_exactly(op: str, ctx: FakeContext) -> None:
    """fp8 (e4m3) goes over the wire as raw bytes for the ops that do not reduce; its small integers are exact."""
    spec = {"op": op, "sizes": [64, 4096], "dtype": "fp8", "world_size": 2, "backend": "gloo", "iters": 1}
    result = run_collective_benchmark(spec, ctx)
    assert [row["size"] for row in result["rows"]] == [64, 4096]
    assert all(row["wrong"] == 0 and row["type"] == "f8e4m3" for row in result["rows"])
    assert result["rows"][0]["count"] == (64 if op == "broadcast" else 32)  # one byte per element


@pytest.mark.parametrize(
    ("op", "dtype", "says"),
    [
        ("all_reduce", "fp8", "dtype: fp8 cannot be reduced (all_reduce)"),
        ("reduce_scatter", "fp8", "torch's NCCL backend refuses fp8 reductions"),
        ("all_gather", "tf32", "dtype: tf32 is fp32 data with TF32 matmul math"),
    ],
)
def test_collective_dtypes_it_cannot_take_say_why(op: str, dtype: str, says: str, ctx: FakeContext) -> None:
    with pytest.raises(InputError, match=re.escape(says)):
        run_collective_benchmark({"op": op, "dtype": dtype, "world_size": 2, "backend": "gloo"}, ctx)
    assert not (ctx.root / "logs").exists()  # refused before any rank started


# ---------------------------------------------------------------------------------------------------------------
# run_ranks: failures, hangs, limits


def rank_returns(info: RankInfo, offset: int) -> tuple[int, int, str]:
    import torch
    import torch.distributed as dist

    value = torch.tensor([info.rank + offset])
    dist.all_reduce(value)
    print(f"rank {info.rank} says hello", flush=True)
    return info.rank, int(value.item()), info.device


def rank_raises_on_one(info: RankInfo) -> None:
    import torch
    import torch.distributed as dist

    if info.rank == 1:
        raise ValueError("boom from the test")
    dist.all_reduce(torch.ones(1))  # waits for rank 1, which never comes


def rank_hangs_on_one(info: RankInfo, sleep_s: float) -> None:
    import torch
    import torch.distributed as dist

    if info.rank == 1:
        time.sleep(sleep_s)  # never joins the collective
    dist.all_reduce(torch.ones(1))


def rank_exits_hard(info: RankInfo) -> None:
    if info.rank == 0:
        os._exit(7)
    time.sleep(60)


def test_run_ranks_returns_values_in_rank_order_and_writes_logs(tmp_path: Path) -> None:
    values = run_ranks(2, rank_returns, (10,), backend="gloo", timeout_s=120, log_dir=tmp_path)
    assert values == [(0, 21, "cpu"), (1, 21, "cpu")]
    assert "rank 1 says hello" in (tmp_path / "rank1.log").read_text()


def test_a_rank_that_raises_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="rank 1 failed: ValueError: boom from the test"):
        run_ranks(2, rank_raises_on_one, backend="gloo", timeout_s=120, log_dir=tmp_path)
    assert "boom from the test" in (tmp_path / "rank1.log").read_text()  # the traceback is in the rank's log


def test_a_rank_that_exits_without_an_exception_is_named() -> None:
    with pytest.raises(RuntimeError, match="rank 0 failed: exited with code 7"):
        run_ranks(2, rank_exits_hard, backend="gloo", timeout_s=120)


def test_a_hard_exit_is_named_before_the_peer_that_lost_its_connection(tmp_path: Path) -> None:
    """The peer's error may be recorded before the supervisor sees the hard exit: the exit is still the cause."""
    from types import SimpleNamespace

    from servers.overlap.distributed import _failure

    (tmp_path / "rank1.err").write_text(
        json.dumps({"type": "DistNetworkError", "message": "Connection reset by peer", "time": 1000.0})
    )
    procs = [SimpleNamespace(returncode=7), SimpleNamespace(returncode=1)]
    error = _failure(tmp_path, tmp_path, procs, set(), {0: 1000.02, 1: 1000.03})  # type: ignore[arg-type]
    assert str(error).startswith("rank 0 failed: exited with code 7 (then rank 1: DistNetworkError")
    # Alone, a lost connection is still what is reported.
    alone = _failure(tmp_path, tmp_path, procs[1:] * 2, {0}, {})  # type: ignore[arg-type]
    assert str(alone).startswith("rank 1 failed: DistNetworkError: Connection reset by peer")


def test_a_hung_collective_times_out_and_the_ranks_are_ended(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"a collective hung: ranks 0, 1 did not finish within 8 s"):
        run_ranks(2, rank_hangs_on_one, (120.0,), backend="gloo", timeout_s=8, log_dir=tmp_path)
    assert time.monotonic() - start < 25


def test_run_ranks_limits() -> None:
    with pytest.raises(ValueError, match="world_size 0 is not possible"):
        run_ranks(0, rank_returns, (0,), backend="gloo", timeout_s=10)
    with pytest.raises(ValueError, match=f"at most {max(2, os.cpu_count() or 1)} "):
        run_ranks(max_world_size("gloo") + 1, rank_returns, (0,), backend="gloo", timeout_s=10)
    with pytest.raises(ValueError, match="module-level function"):
        run_ranks(2, lambda info: None, backend="gloo", timeout_s=10)
