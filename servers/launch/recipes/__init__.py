"""Bundled training recipes: small scripts the launch server can run with torchrun, on CPU or GPUs.

This module is a plain registry (it imports no torch): where each script is, what it trains, its arguments
(kept equal to the script's argparse parser; a test checks), how long it takes and which metrics it logs. The
scripts themselves run as files under torchrun, so they do not import the ``servers`` package; code they share is
in ``common.py`` next to them, loaded by path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RecipeArg:
    name: str  # the flag, e.g. "--steps"
    type: str  # "int", "float" or "str"
    default: int | float | str | None
    help: str


@dataclass(frozen=True)
class RecipeInfo:
    name: str
    path: Path
    description: str
    arguments: tuple[RecipeArg, ...]
    expected_time_cpu: str
    expected_time_gpu: str
    metrics: tuple[str, ...]
    checkpoints: bool = True
    metric_notes: tuple[tuple[str, str], ...] = ()


def _arg(name: str, type_: str, default: int | float | str | None, help_: str) -> RecipeArg:
    return RecipeArg(name, type_, default, help_)


STRAGGLER_ARGS = (
    _arg("--slow-rank", "int", -1, "rank to slow down (-1: none)"),
    _arg("--slow-factor", "float", 1.0, "how many times slower its work per step is"),
    _arg("--slow-from-step", "int", 0, "the step from which it is slow"),
)
RANK_TIME_NOTES = (
    ("rank_work_s", "per rank (list index = rank): seconds of its own work per step, before it waits for the others"),
    ("rank_step_s", "per rank: seconds per step, waiting included (about equal across ranks under DDP)"),
)

TINY_GPT = RecipeInfo(
    name="tiny-gpt",
    path=HERE / "tiny_gpt.py",
    description=(
        "A small decoder-only transformer (2 layers, width 64, 4 heads, context 64; about 108k parameters) trained "
        "with AdamW on a seeded, generated character-level corpus (sentences of a small grammar). The loss falls "
        "from about 3.3 to about 1.1 (2 ranks) or 1.2 (1 rank) at the defaults. DDP when WORLD_SIZE > 1; gloo on "
        "CPU, nccl on GPUs."
    ),
    arguments=(
        _arg("--steps", "int", 200, "optimizer steps in total (a resumed run continues to it)"),
        _arg("--batch-size", "int", 16, "sequences per rank per step"),
        _arg("--lr", "float", 3e-3, "peak learning rate (AdamW; warmup, then cosine to 10%)"),
        _arg("--seq-len", "int", 64, "context length in characters"),
        _arg("--d-model", "int", 64, "model width"),
        _arg("--layers", "int", 2, "transformer blocks"),
        _arg("--heads", "int", 4, "attention heads (must divide --d-model)"),
        _arg("--seed", "int", 0, "seed of the corpus, the initial weights and the batches"),
        _arg("--log-every", "int", 10, "steps between metric rows"),
        _arg("--ckpt-every", "int", 50, "steps between checkpoints (0: only at the end)"),
        *STRAGGLER_ARGS,
    ),
    expected_time_cpu="about 10 s with 2 ranks (gloo) or 1 rank at the defaults, including start-up",
    expected_time_gpu="a few seconds at the defaults; start-up dominates",
    metrics=("loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu", "split", "rank_work_s", "rank_step_s"),
    metric_notes=RANK_TIME_NOTES,
)

TINY_GRPO = RecipeInfo(
    name="tiny-grpo",
    path=HERE / "tiny_grpo.py",
    description=(
        "GRPO with a verifiable reward on a toy task: answer (a + b) mod base, where a --difficulty share of the "
        "prompts is unanswerable (random reference), so the pass rate saturates below 1. A small MLP policy "
        "samples a group of answers per prompt; group-normalised advantages, a KL term to the initial policy. The "
        "held-out greedy pass rate, evaluated at geometrically spaced steps, traces a sigmoid in log compute "
        "(the ScaleRL curve): from chance (1/base) to about 0.68 over 3.5 decades at the defaults. On CPU, "
        "compute_gpu_hours is process wall time (it varies with the machine's load): fit CPU runs on compute_flops."
    ),
    arguments=(
        _arg("--steps", "int", 3000, "policy updates in total (a resumed run continues to it)"),
        _arg("--batch-size", "int", 64, "prompts per rank per step"),
        _arg("--group-size", "int", 16, "answers sampled per prompt (the GRPO group)"),
        _arg("--lr", "float", 2e-2, "initial learning rate (Adam)"),
        _arg("--lr-decay-steps", "float", 50.0, "lr(step) = lr / (1 + step / this)"),
        _arg("--kl-coef", "float", 0.2, "weight of the KL divergence to the initial policy"),
        _arg("--base", "int", 16, "numbers lie in [0, base); chance is 1 / base"),
        _arg("--difficulty", "float", 0.3, "fraction of unanswerable prompts; sets the plateau"),
        _arg("--hidden", "int", 128, "width of the policy MLP"),
        _arg("--evals", "int", 30, "evaluations, spaced geometrically from step 1 to --steps"),
        _arg("--eval-size", "int", 1024, "held-out prompts per evaluation"),
        _arg("--seed", "int", 0, "seed of the weights, the prompts and the sampling"),
        _arg("--log-every", "int", 20, "steps between training metric rows"),
        _arg("--ckpt-every", "int", 100, "steps between checkpoints (0: only at the end)"),
        *STRAGGLER_ARGS,
    ),
    expected_time_cpu="about 12 s with 1 rank, about 25 s with 2 ranks (gloo) at the defaults, including start-up",
    expected_time_gpu="about 10-20 s at the defaults (the model is tiny; kernel launches dominate)",
    metrics=(
        "loss",
        "lr",
        "grad_norm",
        "reward",
        "pass_rate",
        "compute_flops",
        "compute_gpu_hours",
        "split",
        "device",
        "rank_work_s",
        "rank_step_s",
    ),
    metric_notes=(
        *RANK_TIME_NOTES,
        ("pass_rate", "held-out greedy pass rate (eval rows, split 'eval')"),
        ("compute_flops", "training FLOPs so far: 6 x parameters per prompt; deterministic, the one to fit on CPU"),
        (
            "compute_gpu_hours",
            "training wall time x ranks / 3600; on a GPU, GPU-hours; on CPU, CPU-process hours that vary with load",
        ),
        ("device", "cpu or cuda: where the run's compute was spent"),
    ),
)

RECIPES: dict[str, RecipeInfo] = {r.name: r for r in (TINY_GPT, TINY_GRPO)}


def recipe_path(name: str) -> Path:
    """The script of recipe `name`; ValueError naming the bundled recipes when there is none."""
    info = RECIPES.get(name)
    if info is None:
        raise ValueError(f"unknown recipe {name!r}; bundled recipes: {', '.join(sorted(RECIPES))}")
    return info.path
