"""The compute axis of a run: cumulative compute at each step, with the choice made and its assumption stated.

None of the RL frameworks logs cumulative GPU-hours (ScaleRL's x-axis, Khatri et al. 2025), so it is derived:

- "gpu_hours": per-step seconds x the run's GPUs / 3600, cumulated over steps. Per-step seconds come from a per-step
  timing key (vocabulary "step_time": verl timing_s/step, NeMo-RL timing/train/total_step_time), else from the wall
  time between consecutive logged steps (gaps far above the typical step, a pause or a resume, are left out and
  said), else from a mean step time (TRL: train_runtime / global_step: uniform steps assumed). A key logged every k
  steps stands for the k steps since its previous point. GPUs: given, else the job's launch plan, else the run's
  own facts; never assumed.
- "flops": training ~6 N D (forward and backward over the D tokens trained on) and generation ~2 N D per generated
  token (Kaplan et al. 2020; Chinchilla's C = 6ND), N the parameter count (given, or the run's facts).
- a key that already is compute (compute_flops, compute_gpu_hours: this suite's recipes), or any key named (a key
  named like one of the choices, "gpu_hours" say, is read as the choice: name compute_gpu_hours or rename it).
- "steps": the step itself; no unit of compute.
- "auto": a logged compute key, else gpu_hours where time and GPUs are known, else flops where params and tokens
  are; else an error saying what is missing and how to give it.

Restarts: the reader has already dropped the superseded points (series.py), so each step counts once, along the
attempt that survived; the restarts are reported. Standard library only.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from dataclasses import dataclass, field

from servers.core.errors import InputError
from servers.runs.series import RunData, Series
from servers.runs.vocabulary import resolve

COMPUTE_KEYS = {"compute_gpu_hours": "gpu_hours", "compute_flops": "flops"}  # keys that already are compute: unit
CHOICES = ("auto", "gpu_hours", "flops", "steps")
GAP_FACTOR = 10.0  # a wall-time step more than this many typical steps long is a gap (a pause, a resume)
RECENT = 0.25  # the share of the latest steps whose mean compute per step extends the run to its planned end
# Token counts by key: whether the value is per step or cumulative, and what the tokens are. TRL's num_tokens is
# the Trainer's num_input_tokens_seen (prompt and completion tokens the policy trained on, cumulative); verl's
# perf/total_num_tokens is the step's batch (prompt and response tokens, per step: verl/trainer/ppo/metric_utils.py).
TOKEN_KEYS: dict[str, tuple[str | None, str]] = {
    "num_tokens": ("cumulative", "tokens the policy trained on (prompt and completion; TRL num_input_tokens_seen)"),
    "perf/total_num_tokens": ("per step", "the step's batch tokens trained on (prompt and response; verl)"),
    "train/num_tokens": ("per step", "tokens trained on per step"),
    "tokens": (None, "tokens trained on"),
}
FLOPS_FORMULA = (
    "FLOPs = 6 N D_train + 2 N D_gen (training: forward and backward, 6 FLOPs per parameter per token; generation: "
    "forward only, 2 per parameter per generated token)"
)


@dataclass
class Axis:
    """Cumulative compute at ascending steps, in `unit`; `choice` and `assumption` say how it was made."""

    choice: str  # gpu_hours, flops, steps, or the source key taken as compute
    unit: str
    steps: list[int]
    compute: list[float]
    assumption: str
    notes: list[str] = field(default_factory=list)

    def at(self, step: int) -> float | None:
        """The compute at `step`: exact at a step of the axis, linear between two, None outside them."""
        i = bisect.bisect_left(self.steps, step)
        if i < len(self.steps) and self.steps[i] == step:
            return self.compute[i]
        if i == 0 or i == len(self.steps):
            return None
        s0, s1, c0, c1 = self.steps[i - 1], self.steps[i], self.compute[i - 1], self.compute[i]
        return c0 + (c1 - c0) * (step - s0) / (s1 - s0)

    def per_step(self) -> tuple[float, int]:
        """The mean compute per step over the latest RECENT share of the axis (at least two points), and how many
        steps that mean spans."""
        if len(self.steps) < 2:
            return (self.compute[0] / max(self.steps[0], 1) if self.steps else math.nan), 1
        first = min(len(self.steps) - 2, int(len(self.steps) * (1 - RECENT)))
        span = self.steps[-1] - self.steps[first]
        return (self.compute[-1] - self.compute[first]) / span, span


@dataclass(frozen=True)
class Given:
    """What the caller (or a job's launch plan) says about the run: its GPUs (and where that came from), whether it
    ran on CPU (then `gpus` counts processes), and its parameter count."""

    gpus: int | None = None
    gpus_from: str = "given"
    cpu: bool = False
    params: float | None = None


def _try(requested: str, keys: list[str]) -> str | None:
    try:
        return resolve(requested, keys).key
    except InputError:
        return None


def keys_for(keys: list[str], choice: str) -> set[str]:
    """The source keys the axis `choice` may use among a run's `keys` (read them with the metric)."""
    present = set(keys)
    if choice not in CHOICES:
        return {choice} & present
    wanted = {k for k in COMPUTE_KEYS if k in present} if choice == "auto" else set()
    if choice in ("auto", "gpu_hours"):
        step_time = _try("step_time", keys)
        wanted |= {step_time} if step_time else set()
    if choice in ("auto", "flops"):
        wanted |= {k for k in TOKEN_KEYS if k in present}
    return wanted


def _cumulate(steps: list[int], per_step: list[float], scale: float) -> list[float]:
    """Cumulative sum of per_step x scale, each point standing for the steps since the previous one (the first for
    its own step)."""
    out, total, prev = [], 0.0, None
    for step, value in zip(steps, per_step, strict=True):
        total += value * scale * (1 if prev is None else step - prev)
        out.append(total)
        prev = step
    return out


def gpus_of(run: RunData, given: Given) -> tuple[int, str] | None:
    """(GPUs, where the number came from): given > the job's plan > the run's facts; None when nothing says."""
    if given.gpus is not None:
        return given.gpus, given.gpus_from
    facts = run.facts
    for name in ("gpus", "world_size", "num_processes"):
        value = facts.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"the run's {name} ({run.fact_sources.get(name, 'its files')})"
    nodes, per_node = facts.get("nnodes"), facts.get("n_gpus_per_node")
    if isinstance(nodes, int) and isinstance(per_node, int) and nodes > 0 and per_node > 0:
        return nodes * per_node, "the run's nnodes x n_gpus_per_node"
    return None


def _timed(run: RunData) -> Series | None:
    """The series with the most points that carry a wall time (at least 3)."""
    best, count = None, 2
    for s in run.series.values():
        n = sum(1 for t in s.times if math.isfinite(t))
        if n > count:
            best, count = s, n
    return best


def _wall_seconds(run: RunData) -> tuple[list[int], list[float], str, list[str]] | None:
    """Per-step seconds from wall-time differences between consecutive logged steps, gaps left out; None without
    wall times."""
    series = _timed(run)
    if series is None:
        return None
    pairs = [(s, t) for s, t in zip(series.steps, series.times, strict=True) if math.isfinite(t)]
    rates = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(pairs)]
    positive = [r for r in rates if r > 0]
    if not positive:
        return None
    typical = statistics.median(positive)
    per_step, gaps, lost = [typical], 0, 0.0
    for (s0, _), (s1, _), rate in zip(pairs, pairs[1:], rates, strict=False):
        if rate <= 0 or rate > GAP_FACTOR * typical:
            gaps += 1
            lost += max(rate - typical, 0.0) * (s1 - s0)
            rate = typical
        per_step.append(rate)
    notes = []
    if gaps:
        notes.append(
            f"{gaps} wall-time gap(s) (a step more than {GAP_FACTOR:g}x the typical {typical:.3g} s, or time going "
            f"back: a pause, a restart, a resume) were left out: {lost:.4g} s not counted, those steps taken at the "
            "typical step time"
        )
    where = f"wall time between consecutive logged steps of {series.key!r} (the first step taken as a typical one)"
    return [s for s, _ in pairs], per_step, where, notes


def _seconds(run: RunData) -> tuple[list[int], list[float], str, list[str]] | None:
    """Per-step seconds at steps, where they came from, and notes; None when the run says nothing of time."""
    key = _try("step_time", run.keys)
    series = run.series.get(key) if key else None
    if series is not None and len(series):
        return list(series.steps), list(series.values), f"the per-step timing key {key!r} (seconds per step)", []
    wall = _wall_seconds(run)
    if wall is not None:
        return wall
    mean = run.facts.get("mean_step_s")
    steps = _all_steps(run)
    if isinstance(mean, (int, float)) and mean > 0 and steps:
        where = f"a mean step time of {mean:.4g} s ({run.fact_sources.get('mean_step_s', 'the run')}): uniform steps"
        return steps, [float(mean)] * len(steps), where + " assumed", []
    return None


def _all_steps(run: RunData) -> list[int]:
    return sorted({s for series in run.series.values() for s in series.steps})


def gpu_hours(run: RunData, given: Given) -> Axis:
    seconds = _seconds(run)
    if seconds is None:
        raise InputError(
            "compute 'gpu_hours': the run logs no per-step time (no step_time key such as timing_s/step, no wall "
            "times, no train_runtime); choose compute 'flops' (with params), 'steps', or a key that is compute"
        )
    gpus = gpus_of(run, given)
    if gpus is None:
        raise InputError(
            "compute 'gpu_hours': the run's GPU count is unknown (its files do not say); give it as data.run.gpus "
            "(all GPUs of the run: nodes x GPUs per node), or choose compute 'flops' or 'steps'"
        )
    steps, per_step, where, notes = seconds
    count, gpus_from = gpus
    what = "CPU process" if given.cpu else "GPU"
    assumption = (
        f"{what}-hours = per-step seconds x {count} {what}(s) ({gpus_from}) / 3600, per-step seconds from {where}"
    )
    if given.cpu:
        assumption += "; the job ran on CPU, so these are CPU-process hours, not GPU-hours"
    return Axis("gpu_hours", "gpu_hours", steps, _cumulate(steps, per_step, count / 3600), assumption, notes)


def _token_series(run: RunData) -> tuple[Series, bool, str] | None:
    """The tokens series, whether it is cumulative, and what its tokens are; None when there is none."""
    for key, (kind, meaning) in TOKEN_KEYS.items():
        series = run.series.get(key)
        if series is None or len(series) == 0:
            continue
        if kind is None:  # by its values: a count that never falls and grows is cumulative
            values = series.values
            rising = all(b >= a for a, b in itertools.pairwise(values))
            kind = "cumulative" if rising and len(values) > 1 and values[-1] > 2 * max(values[0], 1) else "per step"
            meaning += f" (taken as {kind}: {'it never decreases' if kind == 'cumulative' else 'it does not grow'})"
        return series, kind == "cumulative", f"{key!r}: {meaning}, {kind}"
    return None


def flops(run: RunData, given: Given) -> Axis:
    params = given.params
    params_from = "given"
    if params is None:
        raw = run.facts.get("params")
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw > 0:
            params, params_from = float(raw), f"the run's params ({run.fact_sources.get('params', 'its files')})"
    tokens = _token_series(run)
    missing = ([] if params is not None else ["the parameter count (give data.run.params)"]) + (
        [] if tokens is not None else [f"a token count key ({', '.join(TOKEN_KEYS)})"]
    )
    if missing:
        raise InputError(f"compute 'flops' needs {' and '.join(missing)}; or choose compute 'gpu_hours' or 'steps'")
    assert params is not None and tokens is not None
    series, cumulative, where = tokens
    steps = list(series.steps)
    if cumulative:
        computed = [6 * params * v for v in series.values]
    else:
        computed = _cumulate(steps, list(series.values), 6 * params)
    assumption = (
        f"{FLOPS_FORMULA}; N = {params:.4g} ({params_from}); D_train from {where}; generation FLOPs not counted "
        "(the run logs no count of generated tokens): a lower bound of the run's compute"
    )
    return Axis("flops", "flops", steps, computed, assumption)


def logged(run: RunData, key: str, unit: str | None = None) -> Axis:
    series = run.series.get(key)
    if series is None or len(series) == 0:
        raise InputError(
            f"compute {key!r}: the run has no values for that key; its keys (first 30): {', '.join(run.keys[:30])}"
        )
    unit = unit or COMPUTE_KEYS.get(key) or key
    pairs = [(s, v) for s, v in zip(series.steps, series.values, strict=True) if v > 0]
    notes = [] if len(pairs) == len(series) else [f"{len(series) - len(pairs)} value(s) of {key!r} <= 0 left out"]
    return Axis(
        key,
        unit,
        [s for s, _ in pairs],
        [v for _, v in pairs],
        f"the run's own {key!r} values, taken as cumulative compute at each step",
        notes,
    )


def by_steps(run: RunData) -> Axis:
    steps = [s for s in _all_steps(run) if s > 0]
    return Axis("steps", "steps", steps, [float(s) for s in steps], "the step itself: no unit of compute")


def axis(run: RunData, choice: str, given: Given) -> Axis:
    """The compute axis of `run` by `choice` (see the module's docstring); InputError saying what is missing."""
    if choice == "steps":
        return by_steps(run)
    if choice == "gpu_hours":
        return _with_restarts(run, gpu_hours(run, given))
    if choice == "flops":
        return _with_restarts(run, flops(run, given))
    if choice != "auto":
        return _with_restarts(run, logged(run, choice))
    for key in COMPUTE_KEYS:
        if run.series.get(key):
            return _with_restarts(run, logged(run, key))
    problems = []
    for build in (gpu_hours, flops):
        try:
            return _with_restarts(run, build(run, given))
        except InputError as exc:
            problems.append(str(exc))
    raise InputError(
        "compute 'auto': the run logs no compute key (compute_flops, compute_gpu_hours) and neither derivation "
        "works: " + " | ".join(problems) + "; or give compute 'steps', or name a key that is compute"
    )


def _with_restarts(run: RunData, result: Axis) -> Axis:
    if run.restarts:
        shown = ", ".join(f"step {r.from_step} back to {r.to_step}" for r in run.restarts[:5])
        result.notes.append(
            f"{len(run.restarts)} restart(s) or resume(s) ({shown}): each step's compute is counted once, along the "
            "attempt that survived (the superseded attempt's steps are not counted again)"
        )
    if any(b <= a for a, b in zip(result.compute, result.compute[1:], strict=False)):
        result.notes.append("the compute does not rise at every step (a step of zero time or tokens)")
    return result
