"""Sweeps: one training spec run over a grid (or a list) of argument variants, planned and confirmed once.

A sweep is a list of runs, each a training spec that differs from the base in its arguments: a grid
{"--lr": ["0.02", "0.005"], "--seed": ["0", "1"]} gives the 4 combinations (each flag's value replaced in the base
args, or appended), a list of variants gives one run per list of extra arguments. The plan lists every run with its
own plan (the backend's exact command) and GPU-hours, and their total; the sweep token binds all of them. Each run
is its own job here with the idempotency key `<sweep id>-<index>`, so a retried submit of the same sweep starts
nothing twice, and every job's spec carries the sweep id: list_jobs and wait_for_job take it. On Slurm the runs are
one job array (one sbatch; task i runs run i's batch script in run i's job folder); elsewhere separate jobs.

Plain module; the MCP layer is server.py.
"""

import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from typing import Annotated, Any, cast

from pydantic import Field

from servers.core.errors import InputError, QuotaError
from servers.core.models import Model
from servers.core.settings import Settings
from servers.engines import registry
from servers.engines.admission import confirmation_needed
from servers.engines.backend import ArrayBackend
from servers.launch.training import TrainingJobSpec, TrainingPlan, sign, unsign

MAX_RUNS = 64
SWEEP_ID_PATTERN = r"^sweep-[0-9a-f]{16}$"
FLAG = re.compile(r"-{1,2}[A-Za-z][A-Za-z0-9_.-]{0,63}")
Arg = Annotated[str, Field(max_length=4096)]


class SweepRun(Model):
    index: int
    args: list[str] = Field(description="The run's arguments: the base args with this run's values")
    idempotency_key: str = Field(description="The key the run is submitted with: <sweep id>-<index>")
    plan: TrainingPlan = Field(description="This run's plan, as plan_training_job shows it")


class SweepPlan(Model):
    sweep_id: str = Field(description="Names the sweep in list_jobs(sweep_id) and wait_for_job(job_id)")
    sweep_token: str = Field(description="Pass to submit_sweep: it binds every run's plan")
    plan_id: str = Field(description="What the person names to approve the whole sweep: `llm-infra-mcp approve`")
    runs: list[SweepRun]
    total_gpu_hours: float = Field(description="Sum of the runs' upper bounds (GPUs x wall-time limit)")
    gpus_at_once: int = Field(description="GPUs the runs hold together when they all run at once")
    needs_confirmation: bool = Field(
        description="True when the total is above LLM_INFRA_MCP_CONFIRM_ABOVE_GPU_HOURS (or, cluster nodes without "
        "GPUs, the node-hours above LLM_INFRA_MCP_CONFIRM_ABOVE_NODE_HOURS)"
    )
    quotas: list[str]
    warnings: list[str]
    array_script: str | None = Field(
        default=None,
        description="Slurm: the job array submitted for the whole sweep (task i runs run i's script in its folder)",
    )

    @property
    def total_node_hours(self) -> float:
        """Sum of the runs' node-hours (nodes x wall-time limit): what approval weighs for nodes without GPUs."""
        return sum(run.plan.estimated_node_hours for run in self.runs)


def with_values(args: list[str], values: dict[str, str]) -> list[str]:
    """`args` with each flag's value replaced (`--lr 0.1` or `--lr=0.1`), or the flag and value appended."""
    out = list(args)
    for flag, value in values.items():
        for i, arg in enumerate(out):
            if arg == flag and i + 1 < len(out):
                out[i + 1] = value
                break
            if arg.startswith(flag + "="):
                out[i] = f"{flag}={value}"
                break
        else:
            out += [flag, value]
    return out


def expand(
    base: TrainingJobSpec, grid: dict[str, list[str]] | None, variants: list[list[str]] | None
) -> list[list[str]]:
    """The argument list of every run, in order."""
    if (grid is None) == (variants is None):
        raise InputError("give exactly one of grid (flag -> values, every combination) or variants (lists of args)")
    if grid is not None:
        if not grid:
            raise InputError('grid: empty; accepted: {"--flag": ["value", ...], ...}')
        for flag, values in grid.items():
            if not FLAG.fullmatch(flag):
                raise InputError(f"grid: {flag!r} is not a flag; accepted: --name or -n (letters, digits, _ . -)")
            if not values:
                raise InputError(f"grid: {flag} has no values")
        count = 1
        for values in grid.values():
            count *= len(values)
        if count > MAX_RUNS:
            raise InputError(f"grid: {count} combinations; a sweep has at most {MAX_RUNS} runs")
        flags = list(grid)
        return [
            with_values(base.args, dict(zip(flags, combo, strict=True))) for combo in itertools.product(*grid.values())
        ]
    assert variants is not None
    if not variants:
        raise InputError("variants: empty; accepted: a list of argument lists, one per run")
    if len(variants) > MAX_RUNS:
        raise InputError(f"variants: {len(variants)} runs; a sweep has at most {MAX_RUNS}")
    return [list(base.args) + list(v) for v in variants]


def sweep_digest(base: TrainingJobSpec, plans: list[TrainingPlan]) -> str:
    text = json.dumps([base.model_dump(mode="json"), [p.plan_hash for p in plans]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_token(settings: Settings, base: TrainingJobSpec, runs: list[list[str]], digest: str) -> str:
    return sign(settings, "sweep", {"base": base.model_dump(mode="json"), "runs": runs, "sweep": digest})


def read_token(settings: Settings, token: str) -> tuple[TrainingJobSpec, list[list[str]], str]:
    data = unsign(settings, "sweep", token, name="sweep_token", remedy="plan the sweep again with plan_sweep")
    try:
        return TrainingJobSpec.model_validate(data["base"]), [list(r) for r in data["runs"]], str(data["sweep"])
    except (ValueError, KeyError, TypeError):
        raise InputError("sweep_token cannot be decoded; plan the sweep again") from None


def build(
    settings: Settings,
    base: TrainingJobSpec,
    runs: list[list[str]],
    plan_run: Any,
    *,
    active: Sequence[tuple[str | None, int]],
) -> SweepPlan:
    """Plan every run with `plan_run(spec) -> TrainingPlan` and the sweep around them; quotas for the whole sweep.
    `active`: (sweep id or None, GPUs held) of every active job; the sweep's own runs (already submitted: a retry)
    are not counted against it."""
    if base.idempotency_key is not None:
        raise InputError("spec.idempotency_key: a sweep gives each run its own key (<sweep id>-<index>); leave it out")
    plans = [plan_run(base.model_copy(update={"args": args})) for args in runs]
    digest = sweep_digest(base, plans)
    sweep_id = f"sweep-{digest}"
    others = [gpus for owner, gpus in active if owner != sweep_id]
    active_jobs, gpus_in_use = len(others), sum(others)
    total = sum(p.estimated_gpu_hours for p in plans)
    gpus = sum(p.gpus for p in plans)
    free_slots = settings.max_concurrent_jobs - active_jobs
    if len(plans) > free_slots:
        raise QuotaError(
            f"the sweep has {len(plans)} runs and {free_slots} of LLM_INFRA_MCP_MAX_CONCURRENT_JOBS="
            f"{settings.max_concurrent_jobs} job slots are free; they all start at once: fewer runs, or wait"
        )
    if gpus and gpus_in_use + gpus > settings.max_concurrent_gpus and not base.options.get("share_gpus"):
        raise QuotaError(
            f"the sweep's runs hold {gpus} GPUs together and {gpus_in_use} are in use; at most "
            f"{settings.max_concurrent_gpus} at once (LLM_INFRA_MCP_MAX_CONCURRENT_GPUS)"
        )
    warnings = sorted({w for p in plans for w in p.warnings})
    array_script = None
    info = registry.get(base.backend)
    if info.can("arrays"):  # one job array for the whole sweep (Slurm's)
        arrays = cast(ArrayBackend, info.build(info.config_for(settings)))
        try:
            array_script = arrays.plan_array(
                [(f"<job folder of run {i}>", p.backend_plan.rendered or "") for i, p in enumerate(plans)],
                sweep_key=sweep_id,
                sweep_dir=arrays.job_root / sweep_id,
            )
        except ValueError as exc:
            raise InputError(f"the sweep cannot be one {base.backend} job array: {exc}") from None
    return SweepPlan(
        sweep_id=sweep_id,
        sweep_token=make_token(settings, base, runs, digest),
        plan_id=digest,
        runs=[
            SweepRun(index=i, args=args, idempotency_key=f"{sweep_id}-{i}", plan=p)
            for i, (args, p) in enumerate(zip(runs, plans, strict=True))
        ],
        total_gpu_hours=total,
        gpus_at_once=gpus,
        needs_confirmation=confirmation_needed(
            settings,
            backend=base.backend,
            gpus_per_node=plans[0].gpus,
            gpu_hours=total,
            node_hours=sum(p.estimated_node_hours for p in plans),
        ),
        quotas=[
            f"max_concurrent_jobs {settings.max_concurrent_jobs} ({active_jobs} active)",
            f"max_concurrent_gpus {settings.max_concurrent_gpus} ({gpus_in_use} in use)",
            f"at most {MAX_RUNS} runs",
        ],
        warnings=warnings,
        array_script=array_script,
    )
