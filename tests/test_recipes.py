"""The bundled recipes (run for real with torchrun on CPU) and the metrics helper they write through."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servers.launch import metrics
from servers.launch.recipes import RECIPES, recipe_path
from servers.launch.recipes.arguments import Bounded
from tests.conftest import load_recipe

REPO_ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path, name: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "OMP_NUM_THREADS": "1",
        "LLM_INFRA_MCP_METRICS": str(tmp_path / f"{name}.jsonl"),
        "LLM_INFRA_MCP_CHECKPOINT_DIR": str(tmp_path / f"{name}-ckpt"),
    }
    return env


def _torchrun(recipe: str, nproc: int, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(recipe_path(recipe)),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200, cwd=env["HOME"])
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


# ------------------------------------------------------------------------------------------------ recipes


@pytest.mark.timeout(240)
@pytest.mark.parametrize("recipe", ["tiny-gpt", "tiny-grpo"])
def test_a_rank_slowed_on_purpose_shows_in_the_per_rank_step_times(tmp_path: Path, recipe: str) -> None:
    """Stragglers on demand: rank 1's own work takes 5x as long from step 11; rank 0 logs every rank's work and
    step time. Under DDP the step times stay about equal (the others wait), the work times tell who is slow."""
    env = _env(tmp_path, recipe)
    extra = ["--evals", "2", "--eval-size", "64"] if recipe == "tiny-grpo" else []
    steps = ["--steps", "40", "--log-every", "10", *extra]
    _torchrun(recipe, 2, env, *steps, "--slow-rank", "1", "--slow-factor", "5", "--slow-from-step", "11")
    rows, _ = metrics.read_metrics(env["LLM_INFRA_MCP_METRICS"])
    train = [r for r in rows if r.get("split") == "train"]
    assert [len(r["rank_work_s"]) for r in train] == [2] * len(train)
    first, later = train[0], train[1:]
    assert first["rank_work_s"][1] < 3 * first["rank_work_s"][0] + 0.002  # not slow before step 11
    for row in later:
        work, step = row["rank_work_s"], row["rank_step_s"]
        assert work[1] > 2.5 * work[0], work
        assert abs(step[0] - step[1]) < 0.5 * max(step)  # the fast rank waits for the slow one


@pytest.mark.timeout(240)
def test_tiny_gpt_two_ranks_learns_and_resumes(tmp_path: Path) -> None:
    env = _env(tmp_path, "gpt")
    first = _torchrun("tiny-gpt", 2, env, "--steps", "60", "--log-every", "5", "--ckpt-every", "20")
    assert "n/a on CPU" in first.stdout
    rows, skipped = metrics.read_metrics(env["LLM_INFRA_MCP_METRICS"])
    assert skipped == 0
    train = [r for r in rows if r.get("split") == "train"]
    steps = [r["step"] for r in train]
    assert steps == list(range(5, 61, 5))  # rank 0 only: every step once
    assert all(r["mfu"] is None for r in train)
    assert all(r["tokens"] == r["step"] * 16 * 64 * 2 for r in train)
    assert all(r["tokens_per_s"] > 0 and math.isfinite(r["grad_norm"]) for r in train)
    assert train[-1]["loss"] < train[0]["loss"] - 0.8, [r["loss"] for r in train]
    assert [r for r in rows if r.get("split") == "eval"][-1]["step"] == 60
    assert sorted(p.name for p in Path(env["LLM_INFRA_MCP_CHECKPOINT_DIR"]).glob("step_*.pt")) == [
        "step_00000040.pt",
        "step_00000060.pt",
    ]

    second = _torchrun("tiny-gpt", 2, env, "--steps", "80", "--log-every", "5", "--ckpt-every", "20")
    assert "resumed from step 60" in second.stdout
    rows2, _ = metrics.read_metrics(env["LLM_INFRA_MCP_METRICS"])
    new = [r for r in rows2[len(rows) :] if r.get("split") == "train"]
    assert [r["step"] for r in new] == [65, 70, 75, 80]
    assert new[0]["tokens"] == 65 * 16 * 64 * 2  # the token count carried over
    assert new[-1]["loss"] < train[0]["loss"] - 0.8


@pytest.mark.timeout(240)
def test_tiny_grpo_pass_rate_is_a_sigmoid_in_log_compute(tmp_path: Path) -> None:
    from servers.scaling.fit_sigmoid import fit_sigmoid

    env = _env(tmp_path, "grpo")
    proc = _torchrun("tiny-grpo", 1, env)
    assert "CPU-process hours" in proc.stdout
    rows, skipped = metrics.read_metrics(env["LLM_INFRA_MCP_METRICS"])
    assert skipped == 0
    evals = [r for r in rows if r.get("split") == "eval"]
    assert len(evals) == 30
    compute = [r["compute_flops"] for r in evals]
    hours = [r["compute_gpu_hours"] for r in evals]
    passes = [r["pass_rate"] for r in evals]
    assert all(b > a for a, b in itertools.pairwise(compute)), "compute_flops must increase"
    assert all(b >= a for a, b in itertools.pairwise(hours))
    assert compute[-1] / compute[0] > 1000  # more than three decades
    assert passes[0] < 0.15  # near chance (1/16)
    assert passes[-1] > passes[0] + 0.3
    assert passes[-1] < 0.75  # below the ceiling the difficulty sets (about 0.70)

    fit = fit_sigmoid(compute, passes, bootstrap=0)
    assert fit.converged, fit.message
    assert fit.rmse < 0.05
    a = fit.parameters["A"].value
    assert 0.0 <= a <= 1.0
    assert abs(a - passes[-1]) < 0.1
    assert compute[0] < fit.parameters["C_mid"].value < compute[-1]
    assert fit.parameters["B"].value > 0.5
    assert {"loss", "lr", "grad_norm", "reward"} <= set(next(r for r in rows if r.get("split") == "train"))


def test_grpo_eval_schedule_is_geometric_and_distinct() -> None:
    grpo = load_recipe("tiny-grpo")
    steps = grpo.eval_schedule(3000, 30)
    assert len(steps) == 30 == len(set(steps))
    assert steps[0] == 1 and steps[-1] == 3000
    assert steps == sorted(steps)
    assert grpo.eval_schedule(5, 30) == [1, 2, 3, 4, 5]


# ------------------------------------------------------------------------------------------------ registry


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_registry_matches_each_scripts_parser(name: str) -> None:
    info = RECIPES[name]
    assert info.path.is_file() and info.name == name
    assert info.description and info.expected_time_cpu and info.expected_time_gpu and info.metrics
    parser: argparse.ArgumentParser = load_recipe(name).build_parser()
    actions = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    types = {int: "int", float: "float", str: "str", None: "str"}

    def bounds(kind: object) -> tuple[object, object, object]:
        if isinstance(kind, Bounded) or type(kind).__name__ == "Bounded":  # the script loads arguments.py by path
            return kind.minimum, kind.maximum, kind.exclusive_minimum  # type: ignore[attr-defined]
        return None, None, None

    from_parser = [
        (
            a.option_strings[0],
            types[getattr(a.type, "kind", a.type)],  # type: ignore[index]
            a.default,
            (a.help or "").replace("%%", "%"),
            *bounds(a.type),
        )
        for a in actions
    ]
    from_registry = [
        (r.name, r.type, r.default, r.help, r.minimum, r.maximum, r.exclusive_minimum) for r in info.arguments
    ]
    assert from_parser == from_registry


def test_registry_arguments_are_read_from_the_parsers_written_once() -> None:
    """The arguments list_recipes shows come from the parser the script runs with (arguments.py, no torch)."""
    from servers.launch.recipes import RecipeArg

    gpt, grpo = RECIPES["tiny-gpt"].arguments, RECIPES["tiny-grpo"].arguments
    lr = RecipeArg("--lr", "float", 3e-3, "peak learning rate (AdamW; warmup, then cosine to 10%)", exclusive_minimum=0)
    assert lr in gpt
    assert RecipeArg("--group-size", "int", 16, "answers sampled per prompt (the GRPO group)", minimum=2) in grpo
    stragglers = ["--slow-rank", "--slow-factor", "--slow-from-step"]
    assert [a.name for a in gpt[-3:]] == stragglers == [a.name for a in grpo[-3:]]
    assert len({a.name for a in gpt}) == len(gpt) == 13 and len(grpo) == 19


def test_recipe_path_names_the_recipes_when_unknown() -> None:
    assert recipe_path("tiny-gpt").name == "tiny_gpt.py"
    with pytest.raises(ValueError, match="tiny-gpt, tiny-grpo"):
        recipe_path("huge-gpt")


def test_registry_does_not_import_torch() -> None:
    code = "import sys; import servers.launch.recipes; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_gpu_catalog_lookup_from_a_recipe() -> None:
    common = sys.modules.get("llm_infra_mcp_recipes_common") or load_recipe("tiny-gpt").common
    name, peak = common.gpu_peak_tflops("NVIDIA H100 80GB HBM3")
    assert name == "H100-SXM" and peak > 100
    assert common.gpu_peak_tflops("NVIDIA H100 PCIe")[0] == "H100-PCIe"
    assert common.gpu_peak_tflops("NVIDIA H200")[0] == "H200-SXM"
    assert common.gpu_peak_tflops("NVIDIA H20")[0] == "H20"
    assert common.gpu_peak_tflops("NVIDIA A100-SXM4-80GB")[0] == "A100-SXM-80GB"
    assert common.gpu_peak_tflops("Some Unknown Accelerator") is None


# ------------------------------------------------------------------------------------------------ metrics helper


def test_writer_only_rank_zero_writes_and_non_finite_becomes_null(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "m.jsonl"
    with metrics.MetricsWriter(path, rank=0) as w:
        row = w.log(1, loss=float("nan"), lr=1e-3, grad_norm=float("inf"), split="train")
        w.log(2, loss=2.5, tokens=100)
    assert row["loss"] is None and row["grad_norm"] is None
    with metrics.MetricsWriter(path, rank=1) as w:
        w.log(3, loss=1.0)  # not rank 0: nothing written
    with metrics.MetricsWriter(path, rank=1, all_ranks=True) as w:
        w.log(4, loss=0.5)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    rows, skipped = metrics.read_metrics(path)
    assert skipped == 0
    assert [r["step"] for r in rows] == [1, 2, 4]
    assert rows[0]["loss"] is None and rows[0]["lr"] == 1e-3 and rows[0]["split"] == "train"
    assert all(isinstance(r["time"], float) for r in rows)
    with pytest.raises(ValueError):
        metrics.MetricsWriter(path, rank=0).log(5, time=1.0)


def test_writer_takes_path_and_rank_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "env.jsonl"
    monkeypatch.setenv("LLM_INFRA_MCP_METRICS", str(path))
    monkeypatch.setenv("RANK", "1")
    assert not metrics.MetricsWriter().enabled
    monkeypatch.setenv("RANK", "0")
    w = metrics.MetricsWriter()
    w.log(7, loss=1.25)
    w.close()
    assert metrics.read_metrics(path)[0][0]["loss"] == 1.25
    monkeypatch.delenv("LLM_INFRA_MCP_METRICS")
    disabled = metrics.MetricsWriter()
    assert not disabled.enabled and disabled.log(1, loss=1.0)["loss"] == 1.0


def test_reader_skips_and_counts_malformed_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    good = [json.dumps({"step": 1, "time": 1.0, "loss": 3.0}), json.dumps({"step": 2.0, "time": 2.0, "loss": 2.0})]
    bad = ["not json", json.dumps([1, 2]), json.dumps({"time": 1.0}), json.dumps({"step": "3"}), '{"step": 4, "lo']
    path.write_text("\n".join([good[0], bad[0], "", bad[1], good[1], bad[2], bad[3], bad[4]]))
    rows, skipped = metrics.read_metrics(path)
    assert [r["step"] for r in rows] == [1, 2]
    assert isinstance(rows[1]["step"], int)
    assert skipped == 5
    assert metrics.read_metrics(tmp_path / "missing.jsonl") == ([], 0)
