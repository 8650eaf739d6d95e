"""From a run to what the tools use: curve points (the metric at each step it was logged, with the compute at that
step), the run's planned end, and pages of rows for read_job_metrics. Standard library only.

A run is read twice: once for its keys and facts alone (no points kept), then for the metric and the keys the
compute axis needs, so that a run with hundreds of keys costs the memory of those few.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers.core.errors import InputError
from servers.runs import compute as axes
from servers.runs.registry import Target, read_run
from servers.runs.series import RunData
from servers.runs.vocabulary import VOCABULARY, Resolved, mapping, resolve

DEFAULT_METRICS = ("val_accuracy", "reward")
POINTS_CAP = 50_000  # points kept per key (a series keeps at most twice that): servers/scaling's MAX_ROWS in all
PLANNED_FACTS = ("max_steps", "total_training_steps", "planned_steps")
STEP_ARGS = re.compile(r"^(?:--steps|--max[_-]steps|--num[_-]episodes|trainer\.total_training_steps)(?:=(\d+))?$")


@dataclass(frozen=True)
class JobPlan:
    """What a launched job's spec says of its run: GPUs (or CPU processes) and planned steps."""

    gpus: int | None = None
    cpu: bool = False
    steps: int | None = None
    where: str = ""


def job_plan(spec: Mapping[str, Any], job_id: str) -> JobPlan:
    """GPUs and planned steps from a job's spec (its launch plan): gpus_wanted x nnodes, or ranks on CPU; the
    recipe's --steps (or --max_steps, trainer.total_training_steps) among its arguments."""
    nnodes = spec.get("nnodes") if isinstance(spec.get("nnodes"), int) else 1
    wanted = spec.get("gpus_wanted", spec.get("gpus"))
    nproc = spec.get("nproc_per_node")
    gpus, cpu = None, False
    if isinstance(wanted, int) and not isinstance(wanted, bool):
        if wanted > 0:
            gpus = wanted * nnodes
        elif isinstance(nproc, int) and nproc > 0:
            gpus, cpu = nproc * nnodes, True
    steps = None
    args = spec.get("args")
    if isinstance(args, list):
        for i, arg in enumerate(args):
            found = STEP_ARGS.match(str(arg))
            if found is None:
                continue
            raw = found.group(1) or (str(args[i + 1]) if i + 1 < len(args) else "")
            if raw.isdigit():
                steps = int(raw)
    return JobPlan(gpus, cpu, steps, f"job {job_id}'s launch plan")


@dataclass
class RunPoints:
    """The metric of one run against its compute: (compute, value, step) triples in step order, with how they were
    made (the run read, the key the metric mapped to, the compute axis) and what was left out."""

    run: RunData
    metric: Resolved
    axis: axes.Axis
    points: list[tuple[float, float, int]]
    notes: list[str] = field(default_factory=list)

    def info(self) -> dict[str, Any]:
        """What a fit from these points reports about its run (JSON-able, bounded)."""
        run = self.run
        return {
            "reader": run.reader,
            "source": run.source,
            "name": run.name,
            "metric": self.metric.requested,
            "metric_key": self.metric.key,
            "metric_how": self.metric.how,
            "compute": self.axis.choice,
            "compute_assumption": self.axis.assumption,
            "restarts": [f"step {r.from_step} back to {r.to_step}" for r in run.restarts[:20]],
            "partial": run.partial[:10],
            "last_step": self.points[-1][2] if self.points else None,
            "vocabulary": mapping(run.keys),
        }


def _logged(pattern: str, keys: list[str]) -> bool:
    """Whether a vocabulary pattern (a key, or re:REGEX) names any of `keys`."""
    if pattern.startswith("re:"):
        rx = re.compile(pattern[3:] + r"\Z")
        return any(rx.match(k) for k in keys)
    return pattern in keys


def _metric(run: RunData, requested: str | None) -> tuple[Resolved, list[str]]:
    if requested is not None:
        return resolve(requested, run.keys), []
    for name in DEFAULT_METRICS:
        if not any(_logged(pattern, run.keys) for pattern in VOCABULARY[name].keys):
            continue
        found = resolve(name, run.keys)  # several keys for it (two validation sets) are an error, not a fallback
        why = "" if name == DEFAULT_METRICS[0] else f" (the run has no {DEFAULT_METRICS[0]})"
        return found, [f"metric not given: {name} ({found.key}){why}; name another with data.run.metric"]
    raise InputError(
        f"metric not given and the run has neither {' nor '.join(DEFAULT_METRICS)}; name one of its keys as "
        f"data.run.metric (first 30: {', '.join(run.keys[:30]) or 'none'})"
    )


def read_points(
    where: Target,
    *,
    reader: str | None,
    metric: str | None,
    choice: str,
    given: axes.Given,
    cap: int = POINTS_CAP,
) -> RunPoints:
    """The run at `where` as curve points: the metric (a vocabulary name or a source key; default val_accuracy,
    else reward) at each step it was logged, with the compute at that step (axes.axis). A step outside the compute
    axis's steps (logged before its first or after its last) is left out and counted."""
    listing = read_run(where, keys=set(), reader=reader, cap=2)
    resolved, notes = _metric(listing, metric)
    wanted = {resolved.key} | axes.keys_for(listing.keys, choice)
    run = read_run(where, keys=wanted, reader=reader or listing.reader, cap=cap)
    if not run.keys:
        run.keys = listing.keys
    axis = axes.axis(run, choice, given)
    series = run.series.get(resolved.key)
    if series is None or len(series) == 0:
        raise InputError(f"the run's {resolved.key!r} has no finite values to fit")
    points, outside = [], 0
    for step, value in zip(series.steps, series.values, strict=True):
        at = axis.at(step)
        if at is None or not at > 0:
            outside += 1
            continue
        points.append((at, value, step))
    if outside:
        notes.append(
            f"{outside} point(s) of {resolved.key!r} left out: at steps the compute axis does not cover (before its "
            f"first step {axis.steps[0] if axis.steps else '-'} or after its last "
            f"{axis.steps[-1] if axis.steps else '-'}, or at zero compute)"
        )
    if not points:
        raise InputError(f"no point of {resolved.key!r} has a compute: the compute axis covers none of its steps")
    notes += axis.notes
    if series.nonfinite:
        notes.append(f"{series.nonfinite} non-finite value(s) of {resolved.key!r} (NaN or infinity) left out")
    if run.partial:
        notes.append("partial: fitted on what was logged so far (" + "; ".join(run.partial[:3]) + ")")
    return RunPoints(run, resolved, axis, points, notes)


def planned_steps(run: RunData, given: int | None, plan: JobPlan | None) -> tuple[int, str] | None:
    """The run's planned last step and where it came from: given > the job's plan > the run's facts."""
    if given is not None:
        return given, "given"
    if plan is not None and plan.steps is not None:
        return plan.steps, f"{plan.where} (--steps)"
    for name in PLANNED_FACTS:
        value = run.facts.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"the run's {name} ({run.fact_sources.get(name, 'its files')})"
    return None


def end_compute(result: RunPoints, end_step: int) -> tuple[float, str]:
    """The compute at `end_step`: the axis's own where it reaches it, else its last compute plus the steps left x
    the recent mean compute per step (said)."""
    axis = result.axis
    known = axis.at(end_step)
    if known is not None:
        return known, "the run's compute at that step"
    rate, span = axis.per_step()
    if not (math.isfinite(rate) and rate > 0):
        raise InputError("the run's compute per step is not positive: its end cannot be placed on the compute axis")
    last = axis.steps[-1]
    return axis.compute[-1] + (end_step - last) * rate, (
        f"the last compute ({axis.compute[-1]:.4g} at step {last}) + {end_step - last} steps x {rate:.4g} "
        f"{axis.unit} per step (the mean over the last {span} steps)"
    )


# read_job_metrics of a job whose framework writes its own run (servers/core/jobview.py calls this by reference).
def job_rows(
    job_dir: Path,
    spec: Mapping[str, Any],
    metrics: Path,
    hosts: Sequence[str],
    keys: list[str] | None,
    since_step: int | None,
    limit: int,
) -> dict[str, Any]:
    """Rows {step, time, key: value} of the job's declared run from since_step on, at most `limit`: the page
    read_job_metrics returns (rows, last_step, truncated, skipped_lines), plus the reader and the source keys."""
    from servers.runs.jobs import job_target

    where, reader = job_target(Path(job_dir), spec, metrics, hosts)
    run = read_run(where, keys=set(keys) if keys else None, reader=reader)
    by_step: dict[int, dict[str, Any]] = {}
    for key, series in run.series.items():
        for step, at, value in zip(series.steps, series.times, series.values, strict=True):
            if since_step is not None and step <= since_step:
                continue
            row = by_step.setdefault(step, {"step": step, "time": at if math.isfinite(at) else None})
            if row["time"] is None and math.isfinite(at):
                row["time"] = at
            row[key] = value
    ordered = [by_step[s] for s in sorted(by_step)]
    rows = ordered[:limit]
    return {
        "rows": rows,
        "last_step": rows[-1]["step"] if rows else None,
        "truncated": len(ordered) > limit,
        "skipped_lines": run.rows_skipped,
        "reader": run.reader,
        "source_keys": run.keys[:200],
        "notes": [*run.partial, *run.notes][:20],
    }
