"""The command-line arguments of the bundled recipes, written once: each recipe parses its command line with the
parser built here, and the registry (``__init__.py``) lists what a recipe accepts from the same parser.

Plain argparse, no torch, so that the launch server can describe the recipes without importing torch. torchrun runs
a recipe as a file outside the ``servers`` package, so the recipes load this module by path (as they do
``common.py``); the registry imports it as ``servers.launch.recipes.arguments``.
"""

from __future__ import annotations

import argparse


def add_straggler_arguments(parser: argparse.ArgumentParser) -> None:
    """--slow-rank / --slow-factor / --slow-from-step: make one rank slower on purpose (stragglers for tests and
    demos: the rank's own work per step takes `factor` times as long, from the given step on)."""
    parser.add_argument("--slow-rank", type=int, default=-1, help="rank to slow down (-1: none)")
    parser.add_argument("--slow-factor", type=float, default=1.0, help="how many times slower its work per step is")
    parser.add_argument("--slow-from-step", type=int, default=0, help="the step from which it is slow")


def tiny_gpt() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train a tiny GPT on a generated corpus (torchrun, CPU or GPU).")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in total (a resumed run continues to it)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW; warmup, then cosine to 10%%)")
    p.add_argument("--seq-len", type=int, default=64, help="context length in characters")
    p.add_argument("--d-model", type=int, default=64, help="model width")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads (must divide --d-model)")
    p.add_argument("--seed", type=int, default=0, help="seed of the corpus, the initial weights and the batches")
    p.add_argument("--log-every", type=int, default=10, help="steps between metric rows")
    p.add_argument("--ckpt-every", type=int, default=50, help="steps between checkpoints (0: only at the end)")
    add_straggler_arguments(p)
    return p


def tiny_grpo() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="GRPO on a verifiable toy task (torchrun, CPU or GPU).")
    p.add_argument("--steps", type=int, default=3000, help="policy updates in total (a resumed run continues to it)")
    p.add_argument("--batch-size", type=int, default=64, help="prompts per rank per step")
    p.add_argument("--group-size", type=int, default=16, help="answers sampled per prompt (the GRPO group)")
    p.add_argument("--lr", type=float, default=2e-2, help="initial learning rate (Adam)")
    p.add_argument("--lr-decay-steps", type=float, default=50.0, help="lr(step) = lr / (1 + step / this)")
    p.add_argument("--kl-coef", type=float, default=0.2, help="weight of the KL divergence to the initial policy")
    p.add_argument("--base", type=int, default=16, help="numbers lie in [0, base); chance is 1 / base")
    p.add_argument("--difficulty", type=float, default=0.3, help="fraction of unanswerable prompts; sets the plateau")
    p.add_argument("--hidden", type=int, default=128, help="width of the policy MLP")
    p.add_argument("--evals", type=int, default=30, help="evaluations, spaced geometrically from step 1 to --steps")
    p.add_argument("--eval-size", type=int, default=1024, help="held-out prompts per evaluation")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, the prompts and the sampling")
    p.add_argument("--log-every", type=int, default=20, help="steps between training metric rows")
    p.add_argument("--ckpt-every", type=int, default=100, help="steps between checkpoints (0: only at the end)")
    add_straggler_arguments(p)
    return p


def trl_grpo() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="TRL's GRPOTrainer on a tiny random-weight causal LM (CPU or GPU).", allow_abbrev=False
    )
    p.add_argument("--steps", type=int, default=8, help="GRPO steps (GRPOConfig.max_steps)")
    p.add_argument("--prompts-per-step", type=int, default=2, help="prompts per device per step")
    p.add_argument("--num-generations", type=int, default=4, help="completions per prompt (the GRPO group)")
    p.add_argument("--max-completion-length", type=int, default=6, help="tokens generated per completion")
    p.add_argument("--lr", type=float, default=1e-2, help="GRPOConfig.learning_rate")
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (GRPOConfig.beta; 0: no reference)")
    p.add_argument("--letters", type=int, default=4, help="letters in the task's vocabulary (2-26)")
    p.add_argument("--prompts", type=int, default=64, help="prompts in the seeded prompt set")
    p.add_argument("--hidden-size", type=int, default=32, help="model width (LlamaConfig.hidden_size)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    p.add_argument("--heads", type=int, default=2, help="attention heads (must divide --hidden-size)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, the prompts and the sampling")
    p.add_argument("--save-every", type=int, default=0, help="steps between checkpoint-N/ folders (0: at the end)")
    p.add_argument("--output-dir", default=None, help="TRL's output_dir (default: trl/ in the job's folder)")
    p.add_argument(
        "--grpo-arg",
        action="append",
        default=None,
        metavar="FIELD=VALUE",
        help="any other GRPOConfig field (repeatable; VALUE as JSON, else text)",
    )
    p.add_argument("--check", action="store_true", help="build and validate the GRPOConfig, then stop")
    return p
