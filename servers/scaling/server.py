"""The scaling server: fit, compare and extrapolate RL compute curves (ScaleRL's sigmoid, the power law) and
pretraining laws (Chinchilla); predictions with bootstrap intervals; plots. Numerics live in the plain modules
beside this one (imported when a tool runs, so the server starts without numpy or scipy)."""

import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.types import CallToolResult, ContentBlock
from pydantic import BaseModel, Field

from servers.core.assemble import ServerPart, build_server
from servers.core.errors import InputError
from servers.core.jobs import JOB_ID_PATTERN
from servers.core.mcp_layer import App, agent_tool, in_thread, png_content, tool_result
from servers.core.models import Model
from servers.core.paths import resolve_inside_roots
from servers.scaling import laws, limits
from servers.scaling.data import Columns, DataPoint, Excluded, RunSource, load_run, points_from_rows, read_rows
from servers.scaling.fitstore import FIT_ID_PATTERN, FitStore, StoredFit, fit_digest, new_fit
from servers.scaling.fitting import (
    Comparison,
    ComputeForTarget,
    FitOutcome,
    NotIdentified,
    ParameterEstimate,
    PredictedValue,
)

NAME = "scaling"
INSTRUCTIONS = (
    "Scaling laws for LLM training: fit ScaleRL's sigmoid of RL reward against compute (and the power law it is "
    "compared with) or Chinchilla pretraining loss, with bootstrap intervals; predict, check extrapolation, compare "
    "recipes, plot, and give Chinchilla's compute-optimal model size and tokens for a FLOP budget (predict_scaling). "
    "Fits are stored and readable as infra://fits/{fit_id}."
)

FitId = Annotated[str, Field(pattern=FIT_ID_PATTERN, max_length=40)]
ComputeValue = Annotated[float, Field(gt=0, le=1e40, allow_inf_nan=False)]


class DataSource(Model):
    """Exactly one of points, path, job_id, run."""

    points: list[DataPoint] | None = Field(
        default=None,
        max_length=limits.MAX_ROWS,
        description="{compute, value, run?}; chinchilla: {params, tokens, loss}",
    )
    path: Annotated[str, Field(max_length=4096)] | None = Field(default=None, description="CSV with header, or JSONL")
    job_id: Annotated[str, Field(pattern=JOB_ID_PATTERN, max_length=96)] | None = None
    columns: Columns = Field(default_factory=Columns, description="Column or metrics-key names")
    run: RunSource | None = Field(default=None, description="A run: its metric against its compute (not chinchilla)")


def non_finite(value: Any, path: str = "") -> str | None:
    """Where the first float in `value` (a model dump) that is not finite sits, or None if there is none."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path or "result"
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for key, item in items:
        found = non_finite(item, f"{path}{key}" if str(key).startswith("[") else f"{path}.{key}" if path else key)
        if found is not None:
            return found
    return None


def finite_result(result: BaseModel, summary: str, *extra: ContentBlock) -> CallToolResult:
    """tool_result, after checking that every number in the result is finite: JSON has no infinity, so an
    infinite field would reach the client as null and break the tool's own output schema. Extreme inputs that
    overflow are answered with an input error naming the field instead."""
    where = non_finite(result.model_dump())
    if where is not None:
        raise InputError(
            f"{where}: these inputs give a number too large or too small to represent (overflow); use inputs of a "
            "moderate size (compute within a few decades of the fitted data, exponents of order 0.1..10)"
        )
    return tool_result(result, summary, *extra)


def _fits(app: App) -> FitStore:
    store = getattr(app, "_fit_store", None)
    if store is None:
        store = FitStore(app.settings)
        app._fit_store = store  # type: ignore[attr-defined]
    return store


def _wanted_keys(model: str, columns: Columns) -> list[str]:
    law = laws.get(model)
    keys = [getattr(columns, n) for n in law.columns]
    return keys + ([columns.run] if columns.run and law.on_compute else [])


FLOPS_COLUMN = "compute_flops"  # what the bundled recipes log: deterministic training FLOPs
GPU_HOURS_COLUMN = "compute_gpu_hours"  # training wall time x ranks / 3600: GPU-hours on GPUs, wall time on CPU


@dataclass
class LoadedData:
    """Points read for a fit, where they came from, and what the agent should know about how they were read."""

    points: list[DataPoint]
    source: str
    compute_column: str | None = None  # the file's or job's column the compute came from
    notes: list[str] = field(default_factory=list)
    run: Any = None  # data.LoadedRun, for a run source
    metric: str | None = None  # the metric's name where the source names it (plots label their y axis with it)


def metric_name(model: str, source: DataSource) -> str | None:
    """The name of what a fit of `source` fits: the value (curves) or loss (chinchilla) column's name, for a file or
    a job (read from that column) or for inline points whose data.columns names it; else None."""
    column = "value" if laws.get(model).on_compute else "loss"
    if source.points is not None and column not in source.columns.model_fields_set:
        return None
    return str(getattr(source.columns, column))


def job_device(spec: dict[str, Any], rows: list[dict[str, Any]]) -> str | None:
    """Where a job's compute was spent: 'cpu' or 'cuda' from its metrics rows (the bundled recipes log `device`),
    else from its spec (a training job planned with no GPUs ran on CPU); None when neither says."""
    devices = {str(r["device"]) for r in rows if r.get("device") not in (None, "")}
    if devices:
        return "cpu" if devices == {"cpu"} else "cuda" if "cpu" not in devices else "mixed"
    if "gpus_wanted" in spec:
        return "cuda" if spec.get("gpus_wanted") or spec.get("gpus") else "cpu"
    return None


def cpu_wall_time_warning(where: str, has_flops: bool) -> str:
    return (
        f"The compute of this fit is {GPU_HOURS_COLUMN} of {where}, which ran on CPU: there it counts "
        "CPU-process wall hours, not GPU-hours, and wall time varies with the machine's load, so the same run fits "
        "a different curve on a busier machine (C_mid and every compute in predictions shift with it). Fit CPU "
        f"runs on {FLOPS_COLUMN} (data.columns.compute='{FLOPS_COLUMN}', compute_unit='flops'), which is "
        "deterministic" + ("; these metrics have it." if has_flops else ".")
    )


def load_points(app: App, model: str, source: DataSource) -> LoadedData:
    given = [name for name in ("points", "path", "job_id", "run") if getattr(source, name) is not None]
    if len(given) != 1:
        raise InputError(f"give exactly one of points, path, job_id or run (got {', '.join(given) or 'none'})")
    if source.points is not None:
        return LoadedData(source.points, "inline", metric=metric_name(model, source))
    if source.run is not None:
        if not laws.get(model).on_compute:
            raise InputError(f"data.run: a run gives a metric against compute; {model} fits params, tokens and loss")
        run = load_run(app.settings, app.engine, source.run)
        key = run.info.get("metric_key")
        return LoadedData(run.points, run.source, run.unit, run.notes, run, str(key) if key else None)
    keys = _wanted_keys(model, source.columns)
    curves = laws.get(model).on_compute
    if source.path is not None:
        path = resolve_inside_roots(source.path, app.settings.roots(), what="data file")
        if not path.is_file():
            raise InputError(f"data file {source.path!r} does not exist (resolved to {path})")
        wall = curves and source.columns.compute == GPU_HOURS_COLUMN  # a recipe's metrics file: where it ran
        rows, present = read_rows(
            path, list(dict.fromkeys(keys + (["device", FLOPS_COLUMN] if wall else []))), str(path)
        )
        points = points_from_rows(rows, present, model, source.columns, str(path))
        notes = []
        if wall and job_device({}, [r for r in rows if r.get(source.columns.value) not in (None, "")]) == "cpu":
            notes.append(cpu_wall_time_warning(f"the run in {path.name}", FLOPS_COLUMN in present))
        compute_column = source.columns.compute if curves else None
        return LoadedData(points, f"file:{path}", compute_column, notes, metric=metric_name(model, source))
    assert source.job_id is not None
    record = app.engine.get(source.job_id)
    metrics = app.engine.files(record).metrics
    if not metrics.exists():
        raise InputError(f"job {source.job_id!r} has logged no metrics yet")
    where = f"job {source.job_id}'s metrics"
    extra = [FLOPS_COLUMN, GPU_HOURS_COLUMN, "device"] if curves else []
    rows, present = read_rows(metrics, list(dict.fromkeys(keys + extra)), where)
    columns, notes = source.columns, []
    if not curves:
        points = points_from_rows(rows, present, model, columns, where)
        return LoadedData(points, f"job:{source.job_id}", metric=metric_name(model, source))
    with_value = [r for r in rows if r.get(columns.value) not in (None, "")]
    device = job_device(record.spec if isinstance(record.spec, dict) else {}, with_value)
    if "compute" not in columns.model_fields_set and columns.compute not in present:
        # No compute column named, and the default is absent: the recipes' own columns, the deterministic FLOPs
        # first unless the job ran on GPUs (then GPU-hours, ScaleRL's unit).
        order = (GPU_HOURS_COLUMN, FLOPS_COLUMN) if device == "cuda" else (FLOPS_COLUMN, GPU_HOURS_COLUMN)
        chosen = next((c for c in order if c in present), None)
        if chosen is not None:
            columns = columns.model_copy(update={"compute": chosen})
            why = " (the job ran on CPU, where GPU-hours are wall time)" if device == "cpu" else ""
            notes.append(
                f"Compute: the job's metrics have no {source.columns.compute!r} column, so {chosen} was used{why}; "
                "name another with data.columns.compute."
            )
    if columns.compute == GPU_HOURS_COLUMN and device == "cpu":
        notes.append(cpu_wall_time_warning(f"job {source.job_id}", FLOPS_COLUMN in present))
    points = points_from_rows(rows, present, model, columns, where)
    return LoadedData(points, f"job:{source.job_id}", columns.compute, notes, metric=metric_name(model, source))


PLAUSIBLE_UNIT = 1e9  # no training run has used 1e9 GPU-hours (Llama 3 405B: 3.08e7), nor as few as 1e9 FLOPs
GPU_HOUR_UNITS = {"gpu_hours", "gpu-hours", "gpu_hour", "gpuhours", "hours", "h"}


def default_compute_unit(compute_unit: str | None, loaded: LoadedData) -> str:
    """The compute unit: the one given (with a warning in the fit when the values are implausible for it); else
    'flops' for the compute_flops column and 'gpu_hours' for compute_gpu_hours; else inferred from the values
    (the largest >= 1e9: flops, else gpu_hours), with a warning saying so. Warnings go to loaded.notes."""
    values = [p.compute for p in loaded.points if p.compute is not None]
    if not values:  # chinchilla: no compute values (FLOPs are 6ND)
        return compute_unit or ("flops" if loaded.compute_column == FLOPS_COLUMN else "gpu_hours")
    top = max(values)
    if compute_unit is not None:
        hours = compute_unit.lower() in GPU_HOUR_UNITS
        if hours and top >= PLAUSIBLE_UNIT:
            loaded.notes.append(
                f"compute_unit {compute_unit!r}, but the compute values reach {top:.3g}: no training run has used "
                f"{PLAUSIBLE_UNIT:.0e} GPU-hours; if these are FLOPs, refit with compute_unit='flops'."
            )
        elif compute_unit.lower() == "flops" and top < PLAUSIBLE_UNIT:
            loaded.notes.append(
                f"compute_unit 'flops', but the compute values reach only {top:.3g}: fewer than {PLAUSIBLE_UNIT:.0e} "
                "FLOPs is no training run; if these are GPU-hours (or FLOPs in some multiple), name that unit."
            )
        return compute_unit
    if loaded.run is not None:  # a run source: its compute axis says its unit
        return loaded.run.unit
    if loaded.compute_column == FLOPS_COLUMN:
        return "flops"
    if loaded.compute_column == GPU_HOURS_COLUMN:
        return "gpu_hours"
    unit = "flops" if top >= PLAUSIBLE_UNIT else "gpu_hours"
    why = (
        f"values up to {top:.3g} are implausible as GPU-hours (no run has used {PLAUSIBLE_UNIT:.0e})"
        if unit == "flops"
        else f"values up to {top:.3g} are plausible GPU-hours"
    )
    loaded.notes.append(
        f"compute_unit not given: taken as {unit} ({why}); every compute here (C_mid, predictions) is in {unit}. "
        "Give compute_unit to name the unit (e.g. 'flops', or 'pflops' for FLOPs / 1e15)."
    )
    return unit


class FitReport(Model):
    fit_id: str
    label: str | None
    model: str
    method: str
    compute_unit: str
    parameters: dict[str, ParameterEstimate]
    rmse: float = Field(description="Residual error of the fitted points, in the metric's units")
    converged: bool
    message: str
    warnings: list[str]
    not_identified: list[NotIdentified] = Field(
        default_factory=list, description="Parameters these data do not determine, and why"
    )
    points_used: int = Field(description="Points the fit used")
    points_excluded: int = Field(description="Points left out by min_compute / max_compute")
    points_thinned: int = Field(
        default=0,
        description=f"Points left out by the thinning rule ({limits.THINNING_RULE}); 0 below the cap",
    )
    thinning: str | None = Field(default=None, description="How the points were thinned, or null when they were not")
    excluded: list[Excluded] = Field(description="Which points were left out and why (first 200)")
    level: float = Field(default=0.95, description="Coverage of the parameters' bootstrap intervals")
    bootstrap: int = Field(description="Bootstrap resamples whose refit is used: the intervals rest on these")
    bootstrap_requested: int = Field(
        default=0,
        description=f"Resamples asked for; fewer are run above the bootstrap budget ({limits.BOOTSTRAP_RULE})",
    )
    bootstrap_run: int = Field(
        default=0, description="Resamples refitted (those asked for, less any budget cut): bootstrap + failed"
    )
    bootstrap_failed: dict[str, int] = Field(
        default_factory=dict, description="Refits left out of the intervals, counted by reason"
    )
    duration_s: float
    resource_uri: str
    run: dict[str, Any] | None = Field(
        default=None, description="A run source's reader, metric key, compute choice and assumption, restarts, partial"
    )
    stored_before: bool = Field(
        default=False,
        exclude_if=lambda v: not v,
        description="Present, true: this fit (same law, points, settings, label) was stored already; that one is "
        "returned",
    )


def report(fit: StoredFit, stored_before: bool = False) -> FitReport:
    o = fit.outcome
    thinning = fit.options.get("thinning") or {}
    return FitReport(
        fit_id=fit.id,
        label=fit.label,
        model=fit.model,
        method=fit.method,
        compute_unit=fit.compute_unit,
        parameters=o.parameters,
        rmse=o.rmse,
        converged=o.converged,
        message=o.message,
        warnings=o.warnings,
        not_identified=o.not_identified,
        points_used=o.points_used,
        points_excluded=len(fit.excluded),
        points_thinned=int(thinning.get("before", 0)) - int(thinning.get("after", 0)),
        thinning=thinning.get("rule"),
        excluded=fit.excluded[:200],
        level=o.level,
        bootstrap=o.bootstrap,
        bootstrap_requested=int(fit.options.get("bootstrap", o.bootstrap)),
        bootstrap_run=o.bootstrap_run if o.bootstrap_run is not None else o.bootstrap,
        bootstrap_failed=o.bootstrap_failed,
        duration_s=o.duration_s,
        resource_uri=fit.resource_uri,
        run=fit.options.get("run"),
        stored_before=stored_before,
    )


def describe_parameters(parameters: dict[str, ParameterEstimate]) -> str:
    parts = []
    for name, p in parameters.items():
        text = f"{name}={p.value:.4g}"
        if p.fixed:
            text += " (fixed)"
        elif p.ci_low is not None and p.ci_high is not None:
            text += f" [{p.ci_low:.4g}, {p.ci_high:.4g}]"
        parts.append(text)
    return ", ".join(parts)


def describe_bootstrap(result: "FitReport") -> str:
    """The bootstrap's counts in words: asked, run, used, failed and why."""
    if result.bootstrap_requested == 0:
        return "no bootstrap (no intervals)"
    if result.bootstrap_run == 0:
        return f"no bootstrap run of the {result.bootstrap_requested} resamples asked (see the warnings)"
    text = f"bootstrap: {result.bootstrap} of {result.bootstrap_requested} resamples used"
    if result.bootstrap_run < result.bootstrap_requested:
        text += f" ({result.bootstrap_run} run within the budget)"
    failed = sum(result.bootstrap_failed.values())
    if failed:
        reasons = ", ".join(f"{n} {why}" for why, n in result.bootstrap_failed.items())
        text += f"; {failed} refit(s) left out: {reasons}"
    return text + f"; intervals at {result.level:.0%}"


def r0_start_points(points: list[DataPoint]) -> tuple[list[float], list[float], list[str]]:
    """The points the default R0 ('first') is taken from, by the one rule (fit_sigmoid.start_points), over every
    point of the runs (those below min_compute too: they still say where the curve starts)."""
    from servers.scaling.fit_sigmoid import start_points

    usable = [p for p in points if p.compute is not None and p.value is not None]
    starts = start_points([p.compute for p in usable], [p.value for p in usable], [p.run or "" for p in usable])
    return [c for _, c, _ in starts], [v for _, _, v in starts], [r for r, _, _ in starts]


@dataclass
class PreparedFit:
    """A validated fit request: the numerics to run, and what was left out on the way (and why)."""

    task: limits.FitTask
    excluded: list[Excluded]
    thinning: limits.Thinning | None
    options: dict[str, Any]
    notes: list[str]


def prepare_fit(
    model: str,
    points: list[DataPoint],
    *,
    min_compute: float | None,
    max_compute: float | None,
    r0: float | str,
    y_max: float,
    method: str,
    bootstrap: int,
    seed: int,
    level: float = 0.95,
) -> PreparedFit:
    """Validate the points, leave out those outside [min_compute, max_compute], thin above the point cap, and
    cut the bootstrap to its budget (limits.py). Cheap: plain Python, O(points)."""
    law = laws.get(model)
    options: dict[str, Any] = {
        "min_compute": min_compute,
        "max_compute": max_compute,
        "r0": r0,
        "y_max": y_max,
        "method": method,
        "bootstrap": bootstrap,
        "seed": seed,
        "level": level,
    }
    if method not in law.work:
        having = ", ".join(n for n in laws.names() if method in laws.get(n).work)
        raise InputError(
            f"method {method!r} applies to model {having} only; fit {model} with {', '.join(map(repr, law.work))}"
        )
    if law.on_compute:
        task, excluded, thinning = _curve_task(law, points, min_compute, max_compute, r0, y_max, method)
    else:
        task, excluded, thinning = _sizes_task(law, points, method)
    task.bootstrap, task.seed, task.level = bootstrap, seed, level
    notes = []
    if thinning is not None:
        options["thinning"] = {"before": thinning.before, "after": thinning.after, "rule": thinning.describe()}
        notes.append(
            f"Thinned: {thinning.describe()}. Average repeated evaluations, or fit a narrower compute range, to fit "
            "every point."
        )
    allowed = limits.bootstrap_allowed(task.proc, task.points, bootstrap)
    if allowed < bootstrap:
        notes.append(
            f"Bootstrap cut to {allowed} of the {bootstrap} resamples asked for ({task.points:,} points; "
            f"{limits.BOOTSTRAP_RULE}): the intervals rest on fewer resamples."
        )
        task.bootstrap = allowed
    return PreparedFit(task=task, excluded=excluded, thinning=thinning, options=options, notes=notes)


def _sizes_task(
    law: laws.Law, points: list[DataPoint], method: str
) -> tuple[limits.FitTask, list[Excluded], limits.Thinning | None]:
    """A fit task of a law of loss against N and D: its points checked, thinned above the cap."""
    from servers.scaling.data import loss_data

    data = loss_data(points, law.name)
    kept, thinning = limits.thin_loss(data.params, data.tokens)
    task = limits.FitTask(
        law=law,
        method=method,
        bootstrap=0,
        seed=0,
        params=[data.params[i] for i in kept],
        tokens=[data.tokens[i] for i in kept],
        loss=[data.loss[i] for i in kept],
    )
    return task, [], thinning


def _curve_task(
    law: laws.Law,
    points: list[DataPoint],
    min_compute: float | None,
    max_compute: float | None,
    r0: float | str,
    y_max: float,
    method: str,
) -> tuple[limits.FitTask, list[Excluded], limits.Thinning | None]:
    """A fit task of a law of a metric against compute: points checked, those outside the range left out (with the
    reason), thinned above the cap; r0 sets the law's start parameter (scalerl's R0) where it has one."""
    from servers.scaling.data import curve_data

    curve, excluded = curve_data(points, y_max=y_max, min_compute=min_compute, max_compute=max_compute, model=law.name)
    kept, thinning = limits.thin_curve(curve.compute, curve.run)
    runs = [curve.run[i] for i in kept]
    task = limits.FitTask(
        law=law,
        method=method,
        bootstrap=0,
        seed=0,
        compute=[curve.compute[i] for i in kept],
        value=[curve.value[i] for i in kept],
        run=runs if any(runs) else None,
        r0=None if r0 in ("first", "free") else float(r0),
        r0_from=r0_start_points(points) if r0 == "first" and law.start is not None else None,
        free_r0=r0 == "free",
        y_max=y_max,
    )
    return task, excluded, thinning


async def compute_outcome(task: limits.FitTask) -> FitOutcome:
    """Run a fit's numerics. Small fits (limits.INLINE_WORK) run in a thread: they end within about half a second,
    and a cancelled call returns as soon as they do. Larger ones run in a worker process (anyio's pool, reused
    between calls) with cancellable=True: when the client cancels the request (the SDK cancels the tool call's
    scope on notifications/cancelled), the worker is killed (SIGKILL) and the work stops at once."""
    if not limits.runs_in_process(task.proc, task.points, task.bootstrap):
        return await in_thread(limits.compute_fit, task)
    import anyio.to_process
    from anyio import BrokenWorkerProcess

    try:
        return await anyio.to_process.run_sync(limits.compute_fit, task, cancellable=True)
    except BrokenWorkerProcess as exc:
        raise InputError(
            "the fit's worker process ended before it answered (out of memory, or killed); nothing was stored; "
            f"try fewer points or resamples ({type(exc.__cause__ or exc).__name__})"
        ) from exc


def check_outcome(outcome: FitOutcome, model: str, compute_unit: str) -> None:
    """A fit whose estimates or residual error are not finite numbers is refused (nothing stored), with advice."""
    bad = [name for name, p in outcome.parameters.items() if not math.isfinite(p.value)]
    bad += [f"{name} interval" for name, p in outcome.parameters.items() if not finite_or_none(p.ci_low, p.ci_high)]
    if not math.isfinite(outcome.rmse):
        bad.append("rmse")
    if bad:
        advice = (
            "use values of a moderate size for compute (e.g. GPU-hours, or FLOPs divided by 1e18)"
            if laws.get(model).on_compute
            else "check that params, tokens and loss are in their usual units"
        )
        raise InputError(
            f"the {model} fit overflowed: {', '.join(bad)} not finite (compute unit {compute_unit!r}); {advice}, "
            "or restrict the range with min_compute / max_compute"
        )


def finite_or_none(*values: float | None) -> bool:
    return all(v is None or math.isfinite(v) for v in values)


async def run_fit(
    app: App,
    model: str,
    points: list[DataPoint],
    *,
    source: str,
    label: str | None,
    compute_unit: str,
    min_compute: float | None,
    max_compute: float | None,
    r0: float | str,
    y_max: float,
    method: str,
    bootstrap: int,
    seed: int,
    level: float = 0.95,
    notes: list[str] | None = None,
    run: dict[str, Any] | None = None,
    store: bool = True,
    metric: str | None = None,
) -> tuple[StoredFit, bool]:
    """Validate, fit and store: (the fit, False). Stored once: when the same fit (fitstore.fit_digest: the law, the
    points, the options, the label, the compute unit) is stored already, (that fit, True), without fitting again.
    store=False: the fit is kept in memory only, its id "unstored". Nothing is stored unless the whole fit succeeded
    (and was not cancelled). `run`: what a run source's fit reports of its run; `metric`: the metric's name."""
    prepared: PreparedFit = await in_thread(
        prepare_fit,
        model,
        points,
        min_compute=min_compute,
        max_compute=max_compute,
        r0=r0,
        y_max=y_max,
        method=method,
        bootstrap=bootstrap,
        seed=seed,
        level=level,
    )
    options = {**prepared.options, "run": run} if run is not None else dict(prepared.options)
    if metric is not None:
        options["metric"] = metric
    digest = fit_digest(model=model, label=label, compute_unit=compute_unit, options=options, points=points)
    if store:
        before = await in_thread(_fits(app).find, digest)
        if before is not None:
            return before, True
    outcome = await compute_outcome(prepared.task)
    check_outcome(outcome, model, compute_unit)
    outcome.warnings = [*outcome.warnings, *prepared.notes, *(notes or [])]
    if not store:
        fitted = new_fit(
            "unstored",
            label=label,
            compute_unit=compute_unit,
            source=source,
            options=options,
            outcome=outcome,
            points=points,
            excluded=prepared.excluded,
        )
        return fitted, False
    stored: tuple[StoredFit, bool] = await in_thread(
        _fits(app).add,
        label=label,
        compute_unit=compute_unit,
        source=source,
        options=options,
        outcome=outcome,
        points=points,
        excluded=prepared.excluded,
        digest=digest,
    )
    return stored


class Prediction(Model):
    """What predict_scaling gives: values at the points asked (`compute` for curves, `at` for chinchilla), the
    compute-optimal allocation for chinchilla FLOP budgets (`compute`), and the compute to reach a target; each
    section is present when it was asked for."""

    fit_id: str | None = Field(description="The stored fit used; null for parameters given (or the published fit)")
    model: str
    parameters: dict[str, float] = Field(description="The point estimates used: the fit's, yours, or the published")
    asymptote: float = Field(
        description="Value approached with unlimited compute: A (scalerl, power_law) or E (chinchilla)"
    )
    compute_unit: str | None = Field(description="The fit's compute unit; null for parameters given (theirs)")
    level: float
    intervals: bool = Field(
        description="Whether the values carry bootstrap intervals: false for parameters given (no fit: extrapolated "
        "is null too) and for a fit without bootstrap draws"
    )
    note: str | None = Field(default=None, description="Where the parameters came from when no fit was used")
    values: list[PredictedValue] = Field(
        default_factory=list, description="Predicted value (or loss) per point of `compute` or `at`, with intervals"
    )
    allocations: list[laws.ComputeOptimal] | None = Field(
        default=None, description="chinchilla with `compute`: the compute-optimal N, D and loss per FLOP budget"
    )
    table: list[laws.ComputeOptimal] | None = Field(
        default=None,
        description="The same over a range of budgets, from a tenth of the smallest to ten times the largest "
        "(log-spaced), to show the trend",
    )
    target: ComputeForTarget | None = Field(default=None, description="The compute needed to reach the target")
    forecast: "Forecast | None" = Field(default=None, description="A run's fit: the metric at its planned end")
    warnings: list[str] = Field(
        default_factory=list, description="What the prediction rests on that the fit's data do not determine"
    )


class Forecast(Model):
    run: str
    metric_key: str
    last_step: int | None
    planned_steps: int | None = None
    planned_from: str | None = None
    compute: float | None = Field(default=None, description="At the planned end, and how it was placed")
    compute_how: str | None = None
    value: PredictedValue | None = None
    reached: bool = False
    observed: float | None = Field(default=None, description="The metric logged at the end, once reached")
    statement: str


class ModelCheck(Model):
    model: str
    fit_id: str
    parameters: dict[str, ParameterEstimate]
    asymptote: float
    mean_abs_error: float
    max_abs_error: float
    per_point: list[dict[str, float]] = Field(description="compute, observed, predicted, error (first 500)")
    warnings: list[str]


class ExtrapolationCheck(Model):
    split: float
    compute_unit: str
    fit_points: int
    held_out_points: int
    models: list[ModelCheck]
    better_model: str
    verdict: str


class PlotInfo(Model):
    fit_ids: list[str]
    width: int
    height: int
    png_bytes: int


class FitList(Model):
    fits: list[FitReport]
    total: int = Field(description="Stored fits that can be read (damaged rows are counted in `damaged`)")
    damaged: int = Field(default=0, description="Stored fits that are damaged and cannot be read")
    next_offset: int | None
    notices: list[str] = Field(
        default_factory=list,
        description="What happened to the store lately, e.g. a damaged state database moved aside (the fits "
        "stored before are in the moved file), and damaged fits on this page",
    )


class ComputeConversion(Model):
    gpu: str
    dtype: str
    peak_tflops: float
    mfu: float
    gpu_hours: float
    flops: float
    note: str


R0Value = Annotated[float, Field(ge=-1e12, le=1e12, allow_inf_nan=False)] | Literal["first", "free"]
R0Option = Annotated[R0Value, Field(description="scalerl: fixed R0, 'first' (value at the least compute) or 'free'")]
COMPUTE_UNIT_PATTERN = r"^[A-Za-z0-9_./ -]+$"
ComputeUnit = Annotated[
    str | None,
    Field(
        max_length=32,
        pattern=COMPUTE_UNIT_PATTERN,
        description="Default: flops for a compute_flops column, gpu_hours for compute_gpu_hours, else from the values "
        "(>= 1e9: flops, else gpu_hours) with a warning",
    ),
]


def describe_values(params: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in params.items())


def predict_at(
    fit: StoredFit | None,
    params: dict[str, float],
    kind: str,
    level: float,
    compute: list[float] | None = None,
    at: list[laws.SizePoint] | None = None,
) -> list[PredictedValue]:
    """Values at compute (a law on compute) or at {params, tokens} (a law on N and D): from a stored fit with its
    bootstrap intervals, or from parameters given (plain Python: no intervals, extrapolated null)."""
    sizes = [(p.params, p.tokens) for p in at or []]
    if fit is not None:
        from servers.scaling import analysis

        if not laws.get(kind).on_compute:
            return analysis.predict_loss(fit, sizes, level)
        return analysis.predict_curve(fit, compute or [], level)
    asked = [laws.EvaluationPoint(params=n, tokens=d) for n, d in sizes] + [
        laws.EvaluationPoint(compute=c) for c in compute or []
    ]
    return [
        PredictedValue(compute=v.compute, params=v.params, tokens=v.tokens, value=v.value, extrapolated=None)
        for v in laws.evaluate(kind, params, asked)
    ]


def allocate(
    law: laws.Law, fit_id: str | None, params: dict[str, float], budgets: list[float]
) -> tuple[list[laws.ComputeOptimal], list[laws.ComputeOptimal]]:
    """The compute-optimal N and D (C = 6ND) and the loss there per FLOP budget, and a trend table over a range of
    budgets around them. A fit with a term on its bound (chinchilla: A, B, alpha or beta at 0) has no
    compute-optimal path."""
    if law.allocate is None:
        raise InputError(f"the {law.name} law gives no compute-optimal allocation; predict `at` params and tokens")
    for i, c in enumerate(budgets):
        if not c >= 1:
            raise InputError(f"compute[{i}] = {c:g}: a {law.name} FLOP budget must be 1 to 1e+40 FLOPs")
    why = law.undefined(params) if law.undefined is not None else None
    if why is not None:
        raise InputError(
            f"fit {fit_id} has {why}; refit with runs that span more of N and D, or give model {law.name} alone "
            "for the published fit"
        )
    rows = [law.allocate(c, params) for c in budgets]
    low, high = min(budgets) / 10, max(budgets) * 10
    table = []
    for i in range(9):
        try:  # the trend table is illustrative: a budget the law cannot represent is left out of it
            table.append(law.allocate(low * (high / low) ** (i / 8), params))
        except InputError:
            continue
    return rows, table


@dataclass
class Asked:
    """What predict_scaling was asked: where to predict, and at what level."""

    compute: list[float] | None
    at: list[laws.SizePoint] | None
    target: float | None
    level: float


async def prediction_law(
    app: App, fit_id: str | None, model: str | None, parameters: dict[str, float] | None
) -> tuple[StoredFit | None, laws.Law, dict[str, float], str | None]:
    """The fit (or None), the law, the point parameters and a note on where they came from."""
    if fit_id is not None:
        if model is not None or parameters is not None:
            raise InputError("fit_id: give fit_id (a stored fit) or model and parameters, not both")
        fit = await in_thread(_fits(app).get, fit_id)
        return fit, laws.get(fit.model), {name: p.value for name, p in fit.outcome.parameters.items()}, None
    if model is None:
        raise InputError("fit_id: give fit_id (a stored fit), or model and parameters (a law you give)")
    law = laws.get(model)
    if parameters is None:
        if law.published is None:
            raise InputError(f"model {model!r} needs parameters: {', '.join(law.parameter_names)}")
        parameters, note = dict(law.published), law.published_note
    else:
        note = "parameters given, no fit: no intervals, nothing flagged as extrapolated"
    return None, law, laws.check_parameters(model, parameters), note


async def forecast_fit(app: App, model: str | None, data: DataSource) -> StoredFit:
    """predict_scaling's fit of `data` (robust, 200 resamples, seed 0), kept in memory: not stored."""
    name = model or laws.SCALERL.name
    if not laws.get(name).on_compute:
        raise InputError(f"data: predict_scaling fits a curve of a metric against compute; {name} is not one")
    loaded = await in_thread(load_points, app, name, data)
    unit = default_compute_unit(None, loaded)
    note = "fitted for this prediction and not stored (fit_scaling_law stores a fit)"
    fit, _ = await run_fit(
        app,
        name,
        loaded.points,
        source=loaded.source,
        label=None,
        compute_unit=unit,
        min_compute=None,
        max_compute=None,
        r0="first",
        y_max=1.0,
        method="robust",
        bootstrap=200,
        seed=0,
        notes=[note, *loaded.notes],
        run=loaded.run.info if loaded.run is not None else None,
        store=False,
        metric=loaded.metric,
    )
    return fit


def forecast_end(fit: StoredFit, level: float) -> Forecast | None:
    """The metric at the planned end of the run a fit was made from (its options' run), with its intervals; None
    for a fit of no run."""
    from servers.scaling import analysis

    info = fit.options.get("run")
    if not isinstance(info, dict):
        return None
    end = info.get("end")
    base = {"run": str(info.get("name")), "metric_key": str(info.get("metric_key")), "last_step": info.get("last_step")}
    if not isinstance(end, dict):
        return Forecast(
            **base,
            statement="the run's planned end is unknown (its files name no max_steps or total_training_steps): give "
            "data.run.steps, or predict at a compute",
        )
    [value] = analysis.predict_curve(fit, [float(end["compute"])], level)
    value = contain(value)
    band = f"[{value.pi_low:.4g}, {value.pi_high:.4g}]" if value.pi_low is not None else "(no interval: no bootstrap)"
    statement = (
        f"{info.get('metric_key')} at the planned end (step {end['steps']}, {end['steps_from']}; compute "
        f"{end['compute']:.4g} {fit.compute_unit}): {value.value:.4g}, {level:.0%} prediction interval {band}; "
        f"fitted on the steps logged up to {info.get('last_step')}"
    )
    if end.get("reached"):
        observed = end.get("observed")
        statement += f"; the run has reached its end: observed {observed:.4g}" if observed is not None else ""
    return Forecast(
        **base,
        planned_steps=end["steps"],
        planned_from=end["steps_from"],
        compute=end["compute"],
        compute_how=end["compute_how"],
        value=value,
        reached=bool(end.get("reached")),
        observed=end.get("observed"),
        statement=statement,
    )


def contain(value: PredictedValue) -> PredictedValue:
    """The value with every interval widened, where needed, to contain its estimate (a bootstrap percentile
    interval of a skewed fit can miss the point estimate)."""
    update: dict[str, float] = {}
    for low, high in (("ci_low", "ci_high"), ("pi_low", "pi_high")):
        lo, hi = getattr(value, low), getattr(value, high)
        if lo is not None and lo > value.value:
            update[low] = value.value
        if hi is not None and hi < value.value:
            update[high] = value.value
    return value.model_copy(update=update) if update else value


async def predict(
    app: App,
    fit_id: str | None,
    model: str | None,
    parameters: dict[str, float] | None,
    asked: Asked,
    data: DataSource | None = None,
) -> CallToolResult:
    """predict_scaling's work: values, allocations and the compute for a target, with what they rest on; from a
    run (data, or a stored fit of one), the forecast at its planned end."""
    compute, at, target, level = asked.compute, asked.at, asked.target, asked.level
    if data is not None:
        if fit_id is not None or parameters is not None:
            raise InputError("data: give data (fitted now) or fit_id or parameters, one of them")
        fitted: StoredFit | None = await forecast_fit(app, model, data)
        assert fitted is not None
        fit, law, note = fitted, laws.get(fitted.model), "fitted now from data (robust, 200 resamples), not stored"
        params = {name: p.value for name, p in fitted.outcome.parameters.items()}
    else:
        fit, law, params, note = await prediction_law(app, fit_id, model, parameters)
    forecast = await in_thread(forecast_end, fit, level) if fit is not None else None
    if compute is None and at is None and target is None and forecast is None:
        raise InputError("give compute (curves, or chinchilla FLOP budgets), at (chinchilla) and/or target")
    kind = law.name
    values: list[PredictedValue] = []
    allocations = table = None
    if not law.on_compute:
        if at is not None:
            values = await in_thread(predict_at, fit, params, kind, level, None, at)
        if compute is not None:
            allocations, table = allocate(law, fit_id, params, compute)
    else:
        if at is not None:
            raise InputError(f"a {kind} law predicts at compute values: use `compute`, not `at`")
        if compute is not None:
            values = await in_thread(predict_at, fit, params, kind, level, compute)
    reach = None
    if target is not None:
        from servers.scaling import analysis

        unit = "FLOPs" if not law.on_compute else fit.compute_unit if fit else "compute units"
        draws = fit.outcome.bootstrap_draws if fit else []
        reach = await in_thread(analysis.law_for_target, kind, params, draws, target, level, unit)
        if fit is not None:
            reach = analysis.target_given_identifiability(fit, reach)
    cautions: list[str] = []
    if fit is not None and law.on_compute:
        from servers.scaling import analysis

        where = list(compute or []) + ([reach.compute] if reach is not None and reach.compute else [])
        cautions = analysis.prediction_warnings(fit, where or [math.inf])
    result = Prediction(
        fit_id=fit_id,
        model=kind,
        parameters=params,
        asymptote=params[law.asymptote],
        compute_unit=fit.compute_unit if fit else None,
        level=level,
        intervals=bool(fit and fit.outcome.bootstrap_draws),
        note=note,
        values=values,
        allocations=allocations,
        table=table,
        target=reach,
        warnings=cautions,
        forecast=forecast,
    )
    return finite_result(result, prediction_text(result, fit))


def prediction_text(result: Prediction, fit: StoredFit | None) -> str:
    lines = [f"warning: {w}" for w in result.warnings]
    if result.forecast is not None:
        lines.append(result.forecast.statement)
    for v in result.values[:12]:
        where = f"C={v.compute:.4g}" if v.compute is not None else f"N={v.params:.3g}, D={v.tokens:.3g}"
        band = f" [{v.ci_low:.4g}, {v.ci_high:.4g}]" if v.ci_low is not None else ""
        lines.append(f"{where}: {v.value:.4g}{band}{' (extrapolated)' if v.extrapolated else ''}")
    lines += [
        f"C={r.compute_flops:.3g} FLOPs: N={r.params:.3g}, D={r.tokens:.3g} ({r.tokens_per_param:.1f} "
        f"tokens per parameter), loss {r.loss:.4f}"
        for r in (result.allocations or [])[:12]
    ]
    if result.target is not None:
        lines.append(f"target {result.target.target:g}: {result.target.statement}")
    if result.note:
        lines.append(f"{result.model} with {describe_values(result.parameters)}: {result.note}")
    if fit and fit.outcome.warnings:
        lines.append("fit warnings: " + " | ".join(fit.outcome.warnings[:4]))
    return "\n".join(lines)


def _register_fit_scaling_law(server: MCPServer, app: App) -> None:
    law_name, forms, fit_method = laws.name_type(), laws.forms(), Literal[laws.methods()]  # type: ignore[valid-type]

    @agent_tool(
        server, title="Fit a scaling law", read_only=False, destructive=False, idempotent=False, open_world=False
    )
    async def fit_scaling_law(
        ctx: Context,
        model: Annotated[law_name, Field(description=forms)],
        data: DataSource,
        label: Annotated[str | None, Field(max_length=128)] = None,
        compute_unit: ComputeUnit = None,
        min_compute: Annotated[ComputeValue | None, Field(description="ScaleRL: ~1.5k GPU-hours")] = None,
        max_compute: ComputeValue | None = None,
        r0: R0Option = "first",
        y_max: Annotated[float, Field(gt=0, le=1e6, description="Metric's maximum; bounds A")] = 1.0,
        method: Annotated[
            fit_method,
            Field(description="scalerl-grid: the ScaleRL paper's grid (A 0.45-0.8; C_mid 100-40000, else the data's)"),
        ] = "robust",
        bootstrap: Annotated[int, Field(ge=0, le=2000, description="Resamples for intervals; 0: none")] = 200,
        seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0,
        level: Annotated[float, Field(ge=0.5, le=0.99)] = 0.95,
    ) -> Annotated[CallToolResult, FitReport]:
        """Fit and store a scaling law: RL curves (scalerl, power_law) or pretraining losses (chinchilla), with
        bootstrap intervals and warnings to act on. Returns a fit_id. Seconds."""
        loaded = await in_thread(load_points, app, model, data)
        points = loaded.points
        await ctx.report_progress(0, 1, f"fitting {model} to {len(points)} points")
        fit, stored_before = await run_fit(
            app,
            model,
            points,
            source=loaded.source,
            label=label if label is not None or loaded.run is None else loaded.run.info["name"],
            compute_unit=default_compute_unit(compute_unit, loaded),
            min_compute=min_compute,
            max_compute=max_compute,
            r0=r0,
            y_max=y_max,
            method=method,
            bootstrap=bootstrap,
            seed=seed,
            level=level,
            notes=loaded.notes,
            run=loaded.run.info if loaded.run is not None else None,
            metric=loaded.metric,
        )
        await ctx.report_progress(1, 1, "fitted")
        result = report(fit, stored_before)
        again = " (stored before: the same law, points, settings and label; not fitted or stored again)"
        text = (
            f"{model} fit {fit.id}{again if stored_before else ''}: {describe_parameters(result.parameters)}; "
            f"rmse {result.rmse:.4g} on {result.points_used} points ({result.points_excluded} excluded), compute "
            f"in {fit.compute_unit}; {describe_bootstrap(result)}"
        )
        if result.warnings:
            text += "\nwarnings:\n" + "\n".join(f"- {w}" for w in result.warnings)
        return finite_result(result, text)


def _register_predict_scaling(server: MCPServer, app: App) -> None:
    law_name = laws.name_type()

    @agent_tool(
        server,
        title="Predict from a scaling law",
        read_only=True,
        destructive=False,
        idempotent=True,
        open_world=False,
        same_as={"data": "fit_scaling_law"},
    )
    async def predict_scaling(
        fit_id: FitId | None = None,
        data: DataSource | None = None,
        model: law_name | None = None,
        parameters: Annotated[
            dict[str, Annotated[float, Field(ge=-1e40, le=1e40, allow_inf_nan=False)]] | None,
            Field(
                max_length=8,
                description="Named as in fit_scaling_law's model; chinchilla default: Hoffmann et al.'s fit",
            ),
        ] = None,
        compute: Annotated[
            list[ComputeValue] | None,
            Field(min_length=1, max_length=1000, description="Curves: where to predict; chinchilla: FLOP budgets"),
        ] = None,
        at: Annotated[list[laws.SizePoint] | None, Field(min_length=1, max_length=1000)] = None,
        target: Annotated[float | None, Field(allow_inf_nan=False, ge=-1e6, le=1e6)] = None,
        level: Annotated[float, Field(ge=0.5, le=0.99)] = 0.95,
    ) -> Annotated[CallToolResult, Prediction]:
        """Predict from a stored fit (fit_id; with intervals), data fitted now (not stored), or a law you give
        (model, parameters): values at compute, chinchilla loss `at` or compute-optimal N, D and loss per FLOP
        budget, the compute to reach a target; a run's fit: its metric at its planned end. Instant; data: seconds."""
        return await predict(app, fit_id, model, parameters, Asked(compute, at, target, level), data)


# ScaleRL's extrapolation test compares its sigmoid with the power law (Khatri et al. 2025, section 3).
EXTRAPOLATION_FORMS = [laws.SCALERL.name, laws.POWER_LAW.name]


def _register_check_extrapolation(server: MCPServer, app: App) -> None:
    curve_law = laws.name_type(on_compute=True)

    @agent_tool(
        server,
        title="Check extrapolation",
        read_only=False,
        destructive=False,
        idempotent=False,
        open_world=False,
        same_as={"data": "fit_scaling_law"},
    )
    async def check_extrapolation(
        ctx: Context,
        data: DataSource,
        models: Annotated[list[curve_law], Field(min_length=1, max_length=2)] = EXTRAPOLATION_FORMS,
        split: Annotated[
            ComputeValue | None,
            Field(description="Default: half the largest compute"),
        ] = None,
        min_compute: ComputeValue | None = None,
        compute_unit: Annotated[str | None, Field(max_length=32, pattern=COMPUTE_UNIT_PATTERN)] = None,
        r0: Annotated[R0Value, Field(description="As in fit_scaling_law")] = "first",
        y_max: Annotated[float, Field(gt=0, le=1e6)] = 1.0,
        bootstrap: Annotated[int, Field(ge=0, le=2000)] = 100,
    ) -> Annotated[CallToolResult, ExtrapolationCheck]:
        """ScaleRL's extrapolation test: fit each form on compute <= split, predict the points beyond; errors and the
        better form (the power law tends to overshoot). Stores the fits. Seconds."""
        loaded = await in_thread(load_points, app, models[0], data)
        points, source = loaded.points, loaded.source
        compute_unit = default_compute_unit(compute_unit, loaded)
        computes = [p.compute for p in points if p.compute is not None]
        if not computes:
            raise InputError("the data have no compute values")
        cut = split if split is not None else max(computes) / 2
        held = [
            p
            for p in points
            if p.compute is not None and p.compute > cut and (min_compute is None or p.compute >= min_compute)
        ]
        if not held:
            raise InputError(f"no points lie beyond split={cut:g}; choose a smaller split")
        checks = []
        for k, model in enumerate(models):
            await ctx.report_progress(k, len(models), f"fitting {model} on compute <= {cut:g}")
            fit, _ = await run_fit(
                app,
                model,
                points,
                source=source,
                label=f"{model} up to {cut:g}",
                compute_unit=compute_unit,
                min_compute=min_compute,
                max_compute=cut,
                r0=r0,
                y_max=y_max,
                method="robust",
                bootstrap=bootstrap,
                seed=0,
                notes=loaded.notes,
                run=loaded.run.info if loaded.run is not None else None,
                metric=loaded.metric,
            )
            import numpy as np

            from servers.scaling.analysis import curve, point_params

            x = np.array([p.compute for p in held])
            observed = np.array([p.value for p in held])
            with np.errstate(all="ignore"):  # an overflow shows as a non-finite error, refused by finite_result
                predicted = curve(model, point_params(fit), x)
            errors = predicted - observed
            checks.append(
                ModelCheck(
                    model=model,
                    fit_id=fit.id,
                    parameters=fit.outcome.parameters,
                    asymptote=fit.outcome.parameters[laws.get(model).asymptote].value,
                    mean_abs_error=float(np.mean(np.abs(errors))),
                    max_abs_error=float(np.max(np.abs(errors))),
                    per_point=[
                        {"compute": float(c), "observed": float(o), "predicted": float(p), "error": float(e)}
                        for c, o, p, e in list(zip(x, observed, predicted, errors, strict=True))[:500]
                    ],
                    warnings=fit.outcome.warnings,
                )
            )
        best = min(checks, key=lambda c: c.mean_abs_error)
        verdict = (
            f"{best.model} extrapolates better beyond {cut:g} {compute_unit} (mean |error| "
            + ", ".join(f"{c.model} {c.mean_abs_error:.4f}" for c in checks)
            + ")"
        )
        overshoot = [c for c in checks if not laws.get(c.model).bounded_asymptote and c.asymptote > y_max]
        if overshoot:
            verdict += (
                f"; the {laws.get(overshoot[0].model).title}'s asymptote {overshoot[0].asymptote:.3g} exceeds the "
                f"metric's maximum {y_max:g}"
            )
        result = ExtrapolationCheck(
            split=cut,
            compute_unit=compute_unit,
            fit_points=sum(1 for c in computes if c <= cut and (min_compute is None or c >= min_compute)),
            held_out_points=len(held),
            models=checks,
            better_model=best.model,
            verdict=verdict,
        )
        return finite_result(result, verdict)


def _register_compare_scaling_fits(server: MCPServer, app: App) -> None:
    @agent_tool(
        server, title="Compare scaling fits", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def compare_scaling_fits(
        fit_ids: Annotated[
            list[FitId],
            Field(min_length=2, max_length=8),
        ],
        level: Annotated[
            float, Field(ge=0.5, le=0.99, description="Share of draw pairs that must agree to call a lead")
        ] = 0.95,
        at_compute: Annotated[ComputeValue | None, Field(description="Also compare the curves here")] = None,
    ) -> Annotated[CallToolResult, Comparison]:
        """Compare RL recipes' fits: who has the higher asymptote, who is more efficient, who leads where along
        compute, with bootstrap probabilities. Instant."""
        from servers.scaling.analysis import compare

        fits = [await in_thread(_fits(app).get, i) for i in fit_ids]
        comparison = await in_thread(compare, fits, level, at_compute)
        return finite_result(comparison, comparison.verdict)


def _register_plot_scaling_fit(server: MCPServer, app: App) -> None:
    @agent_tool(server, title="Plot scaling fits", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def plot_scaling_fit(
        fit_ids: Annotated[
            list[FitId],
            Field(min_length=1, max_length=6),
        ],
        extrapolate_to: ComputeValue | None = None,
        level: Annotated[float, Field(ge=0.5, le=0.99)] = 0.95,
        width: Annotated[int, Field(ge=320, le=2400)] = 900,
        height: Annotated[int, Field(ge=240, le=1600)] = 560,
    ) -> Annotated[CallToolResult, PlotInfo]:
        """Plot fits as a PNG: points, curves with bootstrap bands, the extrapolated region; several recipes, or one
        chinchilla fit (loss against 6ND). About a second."""
        from servers.scaling.plot import plot_curves

        fits = [await in_thread(_fits(app).get, i) for i in fit_ids]
        sizes = [f for f in fits if not laws.get(f.model).on_compute]
        if sizes:
            law = laws.get(sizes[0].model)
            if len(fits) > 1:
                raise InputError(f"plot one {law.name} fit at a time")
            if law.plot is None:
                raise InputError(f"the {law.name} law has no plot")
            png = await in_thread(laws.resolve(law.plot), fits[0], width, height)
        else:
            units = {f.compute_unit for f in fits}
            if len(units) > 1:
                raise InputError(f"the fits use different compute units {sorted(units)}; plot them separately")
            png = await in_thread(plot_curves, fits, extrapolate_to, level, width, height)
        info = PlotInfo(fit_ids=fit_ids, width=width, height=height, png_bytes=len(png))
        return finite_result(info, f"plot of {', '.join(fit_ids)} ({len(png)} bytes PNG)", png_content(png))


def _register_list_scaling_fits(server: MCPServer, app: App) -> None:
    @agent_tool(server, title="List scaling fits", read_only=True, destructive=False, idempotent=True, open_world=False)
    async def list_scaling_fits(
        limit: Annotated[int, Field(ge=1, le=100)] = 20,
        offset: Annotated[int, Field(ge=0, le=1_000_000)] = 0,
    ) -> Annotated[CallToolResult, FitList]:
        """List stored fits, newest first, with parameters and warnings, to find fit ids from earlier sessions.
        Cheap."""
        store = _fits(app)
        page = await in_thread(store.list_fits, limit=limit, offset=offset)
        notices = [*await in_thread(store.notices), *page.problems]
        next_offset = offset + page.consumed if page.consumed and offset + page.consumed < page.listed else None
        head = f"{page.total} fit(s)" + (f", {page.damaged} damaged (not listed)" if page.damaged else "")
        lines = [head] + [
            f"- {f.id} {f.label or ''} {f.model}: {describe_parameters(f.outcome.parameters)}" for f in page.fits
        ]
        lines += [f"Note: {n}" for n in notices]
        result = FitList(
            fits=[report(f) for f in page.fits],
            total=page.total,
            damaged=page.damaged,
            next_offset=next_offset,
            notices=notices,
        )
        return finite_result(result, "\n".join(lines))


def _register_convert_compute_units(server: MCPServer, app: App) -> None:
    @agent_tool(
        server,
        title="Convert GPU-hours and FLOPs",
        read_only=True,
        destructive=False,
        idempotent=True,
        open_world=False,
    )
    async def convert_compute_units(
        value: Annotated[float, Field(gt=0, le=1e40, allow_inf_nan=False)],
        unit: Literal["gpu_hours", "flops"],
        gpu: Annotated[str, Field(max_length=64, description="e.g. H100-SXM (infra://gpus.json)")],
        dtype: Literal["bf16", "fp16", "fp8", "tf32", "fp32"] = "bf16",
        mfu: Annotated[float, Field(ge=0.001, le=1, description="Share of peak; 0.3-0.5 typical")] = 0.4,
    ) -> Annotated[CallToolResult, ComputeConversion]:
        """Convert compute between GPU-hours and FLOPs for a catalog GPU: FLOPs = GPU-hours x 3600 x dense peak FLOP/s
        x MFU. Instant."""
        from servers.core.gpus import find_gpu, peak_tflops

        spec = find_gpu(gpu)
        peak = peak_tflops(spec, dtype)
        per_hour = 3600 * peak * 1e12 * mfu
        hours = value if unit == "gpu_hours" else value / per_hour
        flops = value * per_hour if unit == "gpu_hours" else value
        result = ComputeConversion(
            gpu=spec.name,
            dtype=dtype,
            peak_tflops=peak,
            mfu=mfu,
            gpu_hours=hours,
            flops=flops,
            note=f"{spec.name} {dtype} dense peak {peak:g} TFLOP/s at MFU {mfu:g}",
        )
        return finite_result(result, f"{hours:.4g} GPU-hours on {spec.name} = {flops:.4g} FLOPs ({result.note})")


def _register_fit_resource(server: MCPServer, app: App) -> None:
    @server.resource(
        "infra://fits/{fit_id}",
        name="scaling_fit",
        mime_type="application/json",
        description="A stored scaling fit: parameters, intervals, bootstrap draws, data and options",
    )
    async def fit_resource(fit_id: str) -> str:
        try:
            fit = await in_thread(_fits(app).get, fit_id)
        except InputError as exc:
            raise ResourceError(str(exc)) from exc
        return fit.model_dump_json(indent=1)


def register(server: MCPServer, app: App) -> None:
    """The scaling tools and the fits resource; the law names they accept are the registry's (laws.py) now."""
    _register_fit_scaling_law(server, app)
    _register_predict_scaling(server, app)
    _register_check_extrapolation(server, app)
    _register_compare_scaling_fits(server, app)
    _register_plot_scaling_fit(server, app)
    _register_list_scaling_fits(server, app)
    _register_convert_compute_units(server, app)
    _register_fit_resource(server, app)


PART = ServerPart(name=NAME, instructions=INSTRUCTIONS, register=register)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, [PART], app)
