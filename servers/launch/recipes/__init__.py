"""Bundled training recipes: small scripts the launch server can run with torchrun, on CPU or GPUs.

This module is a plain registry (it imports no torch): where each script is, what it trains, its arguments (read
from the script's own argparse parser, which ``arguments.py`` builds without torch: types and bounds included), how
long it takes and which metrics it logs. ``check_recipe_args`` parses a job's args with that parser at plan time, so
that a bad value is refused before any job starts. The scripts themselves run as files under torchrun, so they do
not import the ``servers`` package; code they share is in ``common.py`` and ``arguments.py`` next to them, loaded
by path.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servers.launch.recipes.arguments import Bounded, check_args, tiny_gpt, tiny_grpo, trl_grpo

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RecipeArg:
    name: str  # the flag, e.g. "--steps"
    type: str  # "int", "float" or "str"
    default: int | float | str | None
    help: str
    # Bounds of a number (None: unbounded): value >= minimum, value <= maximum, value > exclusive_minimum.
    minimum: int | float | None = None
    maximum: int | float | None = None
    exclusive_minimum: int | float | None = None


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
    # The run the framework writes, for a job's spec (servers/runs/jobs.py): reader name, path in the job folder.
    run_reader: str | None = None
    run_path: str | None = None
    # "module:attr" of a plan-time check of the job's args: returns the plan's note, raises ValueError to refuse.
    plan_check: str | None = None
    # The builder of the recipe's own parser (arguments.py): every plan parses the job's args with it.
    parser: Callable[..., argparse.ArgumentParser] | None = None


_TYPE_NAMES: dict[Any, str] = {int: "int", float: "float", str: "str", None: "str"}


def _type_name(kind: Any) -> str:
    if isinstance(kind, Bounded):
        return _TYPE_NAMES[kind.kind]
    return _TYPE_NAMES.get(kind, "str")


def arguments_of(parser: argparse.ArgumentParser) -> tuple[RecipeArg, ...]:
    """The options a recipe's parser accepts, in order: each one's first flag, type ("int", "float" or "str"),
    default, help (as --help prints it: '%%' is '%') and bounds (a Bounded type's; None when unbounded)."""
    out = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        kind = action.type
        bounded = kind if isinstance(kind, Bounded) else None
        out.append(
            RecipeArg(
                action.option_strings[0],
                _type_name(kind),
                action.default,
                (action.help or "").replace("%%", "%"),
                minimum=bounded.minimum if bounded else None,
                maximum=bounded.maximum if bounded else None,
                exclusive_minimum=bounded.exclusive_minimum if bounded else None,
            )
        )
    return tuple(out)


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
    arguments=arguments_of(tiny_gpt()),
    parser=tiny_gpt,
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
    arguments=arguments_of(tiny_grpo()),
    parser=tiny_grpo,
    expected_time_cpu="about 12 s with 1 rank, about 25 s with 2 ranks (gloo) at the defaults, including start-up",
    expected_time_gpu="about 10-20 s at the defaults (the model is tiny; kernel launches dominate)",
    metrics=(
        "loss",
        "lr",
        "grad_norm",
        "reward",
        "pass_rate",
        "ceiling",
        "chance",
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
        (
            "compute_flops",
            "training FLOPs so far: each step adds 6 x parameters x --batch-size (prompts per rank) x world size, "
            "the training forward and backward only (sampling the group's answers and evaluation are not counted); "
            "deterministic, the one to fit on CPU",
        ),
        (
            "ceiling",
            "eval rows: the best pass rate reachable on the held-out set (the share of its prompts whose reference is "
            "the true sum); the same for every run of one --eval-seed",
        ),
        ("chance", "eval rows: 1 / base, the pass rate of a random answer"),
        (
            "compute_gpu_hours",
            "training wall time x ranks / 3600; on a GPU, GPU-hours; on CPU, CPU-process hours that vary with load",
        ),
        ("device", "cpu or cuda: where the run's compute was spent"),
    ),
)

TRL_GRPO = RecipeInfo(
    name="trl-grpo",
    path=HERE / "trl_grpo.py",
    description=(
        "TRL's own GRPOTrainer on a tiny Llama with random weights (2 layers, width 32; nothing downloaded) and a "
        "word-level tokenizer built in the script: prompts 'repeat X :', reward the share of completion tokens that "
        "are X. report_to tensorboard, logging_steps 1. Any other GRPOConfig field via --grpo-arg FIELD=VALUE. The "
        "plan validates the args: the recipe's parser, then TRL's GRPOConfig built from them (unknown or invalid "
        "fields fail with TRL's error). The job's run (trainer_state.json, event files) is checkpoints/trl, read "
        "by the trl reader."
    ),
    arguments=arguments_of(trl_grpo()),
    parser=trl_grpo,
    expected_time_cpu=(
        "about 10-20 s with 1 rank at the defaults, most of it importing torch, transformers and TRL; the plan's "
        "check of the args takes about 5-10 s more"
    ),
    expected_time_gpu="about the same: start-up dominates",
    metrics=(
        "reward",
        "reward_std",
        "kl",
        "entropy",
        "completions/mean_length",
        "num_tokens",
        "step_time",
        "loss",
        "grad_norm",
        "learning_rate",
        "split",
    ),
    metric_notes=(("step_time", "TRL's seconds per step"), ("num_tokens", "TRL's cumulative tokens seen")),
    run_reader="trl",
    run_path="checkpoints/trl",
    plan_check="servers.launch.recipes.trl_grpo:plan_check",
)

RECIPES: dict[str, RecipeInfo] = {r.name: r for r in (TINY_GPT, TINY_GRPO, TRL_GRPO)}


def recipe_path(name: str) -> Path:
    """The script of recipe `name`; ValueError naming the bundled recipes when there is none."""
    info = RECIPES.get(name)
    if info is None:
        raise ValueError(f"unknown recipe {name!r}; bundled recipes: {', '.join(sorted(RECIPES))}")
    return info.path


def check_recipe_args(name: str, argv: Sequence[str]) -> None:
    """Parse a job's args with bundled recipe `name`'s own parser (torch-free, arguments.py), printing nothing:
    ValueError with argparse's message ("argument --lr: must be > 0, got -1", "unrecognized arguments: --x") when
    it refuses them, or when there is no such recipe."""
    info = RECIPES.get(name)
    if info is None:
        raise ValueError(f"unknown recipe {name!r}; bundled recipes: {', '.join(sorted(RECIPES))}")
    if info.parser is not None:
        check_args(info.parser, argv)
