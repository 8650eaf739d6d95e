"""The command-line arguments of the bundled recipes, written once: each recipe parses its command line with the
parser built here, and the registry (``__init__.py``) lists what a recipe accepts from the same parser, bounds
included.

Plain argparse, no torch, so that the launch server can describe the recipes, and check a job's arguments at plan
time (``check_args``), without importing torch. torchrun runs a recipe as a file outside the ``servers`` package,
so the recipes load this module by path (as they do ``common.py``); the registry imports it as
``servers.launch.recipes.arguments``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

SEED_MAX = 2**31 - 1  # the recipes derive generator seeds from it (times about 4e9): it keeps them within 64 bits


def _fmt(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


class Bounded:
    """An argparse type: an int or a float within bounds (None: unbounded). A value that is not a number fails as
    argparse's own types do ("invalid float value: 'abc'"); one out of bounds says which (argparse prefixes the
    flag: "argument --lr: must be > 0, got -1"). Floats must be finite."""

    def __init__(
        self,
        kind: type[int] | type[float],
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_minimum: float | None = None,
    ) -> None:
        self.kind = kind
        self.minimum = minimum
        self.maximum = maximum
        self.exclusive_minimum = exclusive_minimum
        self.__name__ = kind.__name__  # argparse names the type by it in "invalid int value: ..."

    def __call__(self, text: str) -> int | float:
        value = self.kind(text)  # ValueError: argparse says "invalid <kind> value: '<text>'"
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if not self.accepts(value):
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text}")
        return value

    def accepts(self, value: float) -> bool:
        if self.exclusive_minimum is not None and not value > self.exclusive_minimum:
            return False
        if self.minimum is not None and not value >= self.minimum:
            return False
        return self.maximum is None or value <= self.maximum

    def describe(self) -> str:
        """The accepted range in words: "> 0", ">= 1", "<= 5", "in [0, 1]", "in (0, 1]"."""
        low = self.exclusive_minimum if self.exclusive_minimum is not None else self.minimum
        if low is not None and self.maximum is not None:
            opening = "(" if self.exclusive_minimum is not None else "["
            return f"in {opening}{_fmt(low)}, {_fmt(self.maximum)}]"
        if self.exclusive_minimum is not None:
            return f"> {_fmt(self.exclusive_minimum)}"
        if self.minimum is not None:
            return f">= {_fmt(self.minimum)}"
        if self.maximum is not None:
            return f"<= {_fmt(self.maximum)}"
        return "any finite number" if self.kind is float else "any integer"

    def __repr__(self) -> str:
        return f"{self.kind.__name__} {self.describe()}"


def int_at_least(minimum: int, maximum: int | None = None) -> Bounded:
    return Bounded(int, minimum=minimum, maximum=maximum)


POSITIVE_FLOAT = Bounded(float, exclusive_minimum=0)
NON_NEGATIVE_FLOAT = Bounded(float, minimum=0)
FRACTION = Bounded(float, minimum=0, maximum=1)
SEED = int_at_least(0, SEED_MAX)


class ArgumentsError(ValueError):
    """A recipe's parser refused a job's arguments (the message is argparse's)."""


class _CheckingParser(argparse.ArgumentParser):
    """A parser that raises ArgumentsError where argparse would print and exit: for the server, which must never
    write to stdout (the stdio transport) nor exit."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentsError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ArgumentsError(message or f"the parser exited with status {status}")

    def print_help(self, file: Any = None) -> None:
        raise ArgumentsError("-h/--help prints the usage and exits: not an argument for a job (see list_recipes)")

    def print_usage(self, file: Any = None) -> None:
        pass


def check_args(build: Callable[..., argparse.ArgumentParser], argv: Sequence[str]) -> argparse.Namespace:
    """`argv` parsed by the parser `build` makes (one of the builders below), without printing or exiting:
    ArgumentsError with argparse's message ("argument --lr: must be > 0, got -1", "unrecognized arguments: ...")
    when it refuses them."""
    return build(parser_class=_CheckingParser).parse_args(list(argv))


def add_straggler_arguments(parser: argparse.ArgumentParser) -> None:
    """--slow-rank / --slow-factor / --slow-from-step: make one rank slower on purpose (stragglers for tests and
    demos: the rank's own work per step takes `factor` times as long, from the given step on)."""
    parser.add_argument("--slow-rank", type=int_at_least(-1), default=-1, help="rank to slow down (-1: none)")
    parser.add_argument(
        "--slow-factor",
        type=Bounded(float, minimum=1),
        default=1.0,
        help="how many times slower its work per step is",
    )
    parser.add_argument("--slow-from-step", type=int_at_least(0), default=0, help="the step from which it is slow")


ParserClass = type[argparse.ArgumentParser]


def tiny_gpt(parser_class: ParserClass = argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = parser_class(description="Train a tiny GPT on a generated corpus (torchrun, CPU or GPU).")
    p.add_argument(
        "--steps", type=int_at_least(1), default=200, help="optimizer steps in total (a resumed run continues to it)"
    )
    p.add_argument("--batch-size", type=int_at_least(1), default=16, help="sequences per rank per step")
    p.add_argument(
        "--lr", type=POSITIVE_FLOAT, default=3e-3, help="peak learning rate (AdamW; warmup, then cosine to 10%%)"
    )
    p.add_argument("--seq-len", type=int_at_least(1), default=64, help="context length in characters")
    p.add_argument("--d-model", type=int_at_least(1), default=64, help="model width")
    p.add_argument("--layers", type=int_at_least(1), default=2, help="transformer blocks")
    p.add_argument("--heads", type=int_at_least(1), default=4, help="attention heads (must divide --d-model)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the corpus, the initial weights and the batches")
    p.add_argument("--log-every", type=int_at_least(1), default=10, help="steps between metric rows")
    p.add_argument(
        "--ckpt-every", type=int_at_least(0), default=50, help="steps between checkpoints (0: only at the end)"
    )
    add_straggler_arguments(p)
    return p


def tiny_grpo(parser_class: ParserClass = argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = parser_class(description="GRPO on a verifiable toy task (torchrun, CPU or GPU).")
    p.add_argument(
        "--steps", type=int_at_least(1), default=3000, help="policy updates in total (a resumed run continues to it)"
    )
    p.add_argument("--batch-size", type=int_at_least(1), default=64, help="prompts per rank per step")
    p.add_argument("--group-size", type=int_at_least(2), default=16, help="answers sampled per prompt (the GRPO group)")
    p.add_argument("--lr", type=POSITIVE_FLOAT, default=2e-2, help="initial learning rate (Adam)")
    p.add_argument("--lr-decay-steps", type=POSITIVE_FLOAT, default=50.0, help="lr(step) = lr / (1 + step / this)")
    p.add_argument(
        "--kl-coef", type=NON_NEGATIVE_FLOAT, default=0.2, help="weight of the KL divergence to the initial policy"
    )
    p.add_argument("--base", type=int_at_least(2), default=16, help="numbers lie in [0, base); chance is 1 / base")
    p.add_argument(
        "--difficulty", type=FRACTION, default=0.3, help="fraction of unanswerable prompts; sets the plateau"
    )
    p.add_argument("--hidden", type=int_at_least(1), default=128, help="width of the policy MLP")
    p.add_argument(
        "--evals",
        type=int_at_least(1),
        default=30,
        help="evaluations, spaced geometrically from step 1 to --eval-horizon",
    )
    p.add_argument(
        "--eval-horizon",
        type=int_at_least(0),
        default=0,
        help=(
            "the study's longest --steps (0: --steps): a run evaluates at the steps of this horizon's schedule up "
            "to its --steps, and at --steps, so a run continued to longer --steps evaluates where a straight one does"
        ),
    )
    p.add_argument("--eval-size", type=int_at_least(1), default=1024, help="held-out prompts per evaluation")
    p.add_argument(
        "--eval-seed",
        type=SEED,
        default=0,
        help="seed of the held-out prompts alone: the same set, and ceiling, for every --seed and variant",
    )
    p.add_argument("--seed", type=SEED, default=0, help="seed of the weights, the training prompts and the sampling")
    p.add_argument("--log-every", type=int_at_least(1), default=20, help="steps between training metric rows")
    p.add_argument(
        "--ckpt-every", type=int_at_least(0), default=100, help="steps between checkpoints (0: only at the end)"
    )
    add_straggler_arguments(p)
    return p


def trl_grpo(parser_class: ParserClass = argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = parser_class(
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
