"""One metric vocabulary across frameworks: the names an agent asks for (reward, val_accuracy, response_length,
kl, entropy, step_time, tokens, loss), each mapped to the keys frameworks log it under, in order of preference.

Sources of the names: verl (verl/trainer/ppo/metric_utils.py, verl/utils/tracking.py), TRL
(trl/trainer/grpo_trainer.py), OpenRLHF (openrlhf/utils/logging_utils.py: train/ and eval/ prefixes), ROLL
(docs/trackers_and_metrics.md), NeMo-RL (nemo_rl/utils/logger.py), and this suite's recipes
(servers/launch/recipes). Any source key is accepted as it is: `resolve` takes an exact key first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from servers.core.errors import InputError


@dataclass(frozen=True)
class Metric:
    """A vocabulary name, what it means, and the source keys (exact, or a regular expression when written as
    re:PATTERN) that hold it, most preferred first."""

    name: str
    meaning: str
    keys: tuple[str, ...]


VOCABULARY: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "reward",
            "mean training reward (score) per step",
            (
                "critic/score/mean",  # verl, ROLL
                "critic/rewards/mean",  # verl (with KL penalty in the reward)
                "reward",  # TRL, OpenRLHF, this suite's tiny-grpo
                "train/reward",  # OpenRLHF (tensorboard), NeMo-RL
                "rewards/mean",
            ),
        ),
        Metric(
            "val_accuracy",
            "held-out accuracy or pass@k (validation/eval)",
            (
                r"re:val-core/[^/]+/acc/mean@\d+",  # verl
                r"re:val-core/[^/]+/acc/mean_at_\d+",  # verl through its MLflow logger (which writes @ as _at_)
                r"re:val-core/[^/]+/reward/mean@\d+",  # verl (reward-scored validation)
                "val/score/mean",  # ROLL
                "validation/accuracy",  # NeMo-RL
                r"re:eval/eval_[^/]+_pass1",  # OpenRLHF (tensorboard)
                r"re:eval_[^/]+_pass1",  # OpenRLHF (wandb)
                "eval_accuracy",  # transformers Trainer evaluation
                "pass_rate",  # this suite's tiny-grpo
            ),
        ),
        Metric(
            "response_length",
            "mean generated response length in tokens",
            (
                "response_length/mean",  # verl
                "completions/mean_length",  # TRL
                "tokens/response_length/mean",  # ROLL
                "response_length",  # OpenRLHF
                "train/response_length",
                "train/mean_gen_tokens_per_sample",  # NeMo-RL
            ),
        ),
        Metric("kl", "KL divergence to the reference policy", ("actor/kl_loss", "kl", "train/kl", "actor/approxkl")),
        Metric("entropy", "policy entropy", ("actor/entropy", "entropy", "train/entropy")),
        Metric(
            "step_time",
            "seconds per training step",
            ("timing_s/step", "timing/train/total_step_time", "perf/time_per_step", "rank_step_s"),
        ),
        Metric(
            "tokens",
            "tokens processed (per step or cumulative, as the source logs it)",
            ("perf/total_num_tokens", "num_tokens", "tokens", "train/num_tokens"),
        ),
        Metric("loss", "training loss", ("loss", "actor/pg_loss", "train/loss", "train/policy_loss", "policy_loss")),
    )
}


@dataclass(frozen=True)
class Resolved:
    """What a requested metric resolved to: the source key read, and how (exact key, or vocabulary name)."""

    requested: str
    key: str
    how: str  # "source key" or "vocabulary: <meaning>"


def _matches(pattern: str, keys: Iterable[str]) -> list[str]:
    if pattern.startswith("re:"):
        rx = re.compile(pattern[3:] + r"\Z")
        return [k for k in keys if rx.match(k)]
    return [k for k in keys if k == pattern]


def resolve(requested: str, keys: Iterable[str]) -> Resolved:
    """The source key for `requested` among a run's `keys`: the key itself when the run has it, else the first
    vocabulary key present. Several keys matching one pattern (validation on two datasets) is an error that
    lists them, as is a name that is neither a key nor a vocabulary name found in the run."""
    present = list(keys)
    if requested in present:
        return Resolved(requested, requested, "source key")
    metric = VOCABULARY.get(requested)
    if metric is None:
        close = [k for k in present if requested.lower() in k.lower()][:10]
        hint = f"; keys containing {requested!r}: {', '.join(close)}" if close else ""
        raise InputError(
            f"the run has no key {requested!r} and it is not a vocabulary name ({', '.join(VOCABULARY)}){hint}. "
            f"The run's keys (first 30): {', '.join(present[:30]) or 'none'}"
        )
    for pattern in metric.keys:
        found = _matches(pattern, present)
        if len(found) == 1:
            return Resolved(requested, found[0], f"vocabulary: {metric.meaning}")
        if len(found) > 1:
            raise InputError(
                f"{requested!r} matches {len(found)} keys of this run: {', '.join(found[:10])}; name one of them "
                "as the metric"
            )
    raise InputError(
        f"the run logs no key for {requested!r} ({metric.meaning}); looked for "
        f"{', '.join(p.removeprefix('re:') for p in metric.keys)}. The run's keys (first 30): "
        f"{', '.join(present[:30]) or 'none'}"
    )


def mapping(keys: Iterable[str]) -> dict[str, str]:
    """Every vocabulary name this run's keys resolve to unambiguously: {name: source key}."""
    present = list(keys)
    found: dict[str, str] = {}
    for name in VOCABULARY:
        try:
            found[name] = resolve(name, present).key
        except InputError:
            continue
    return found
