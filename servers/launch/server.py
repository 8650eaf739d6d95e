"""The launch server: plan, confirm and run training jobs (torchrun locally), bundled recipes, and the job tools
to follow them. Checks, plans, tokens, the audit log and idempotency keys live in training.py; the executor is
the job engine running local.py's work function."""

import functools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult
from pydantic import Field

from servers.core.assemble import ServerPart, build_server
from servers.core.errors import InputError
from servers.core.job_tools import WaitS, summarize_job
from servers.core.jobs import JobKind
from servers.core.jobstore import JobRecord
from servers.core.jobview import JobView
from servers.core.mcp_layer import App, agent_tool, client_name, in_thread, tool_result
from servers.core.models import Model
from servers.engines.admission import Approvals, Launch, admit, elicit_asker
from servers.engines.backend import BackendStatus
from servers.launch.backends import detect_all
from servers.launch.sweeps import SweepPlan
from servers.launch.training import TrainingJobSpec, TrainingPlan

if TYPE_CHECKING:
    from servers.engines.backend import Backend
    from servers.launch.training import IdempotencyKeys

NAME = "launch"
INSTRUCTIONS = (
    "Start, watch and stop training jobs: plan first (plan_training_job: the exact command, quotas, GPU-hours), then "
    "submit (costly launches ask the person, or need the plan_token). Bundled recipes (list_recipes) run on a laptop. "
    "Follow jobs with wait_for_job, read_job_logs (per rank) and read_job_metrics; stop them with cancel_job."
)
TRAINING_KIND = "training"
REMOTE_KIND = "training_remote"


def remote_poll_s(spec: Mapping[str, Any]) -> float | None:
    """A cluster job's task poll interval: its backend's poll_s (asking more often learns nothing); None for a
    backend that is missing or not registered here (the default then)."""
    from servers.engines import registry

    name = spec.get("backend")
    if not isinstance(name, str):
        return None
    try:
        return registry.get(name).poll_s
    except ValueError:
        return None


def training_listed(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What list_jobs shows of a training job: its backend and name, from the job's spec or its training_spec."""
    training = spec.get("training_spec") if isinstance(spec.get("training_spec"), dict) else {}

    def text(key: str) -> Any:
        own = spec.get(key)
        return own if isinstance(own, str) and own else training.get(key)

    return {"backend": text("backend"), "name": text("name")}


JOB_KINDS = [
    JobKind(
        TRAINING_KIND,
        "servers.launch.local:run_training_job",
        "torchrun of a recipe or script",
        default_timeout_s=3600,
        poll_s=2.0,
        listed=training_listed,
    ),
    JobKind(
        REMOTE_KIND,
        "servers.launch.remote:run_remote_job",
        "a training job on a cluster engine, followed here",
        resumable=True,  # its follower can be lost: a new one finds the cluster's job by its key
        follows_engine=True,  # its state is the cluster engine's (QUEUED while pending there), not its follower's
        poll_s_of=remote_poll_s,
        listed=training_listed,
    ),
]
STALE_CLAIM_S = 120.0  # an idempotency key claimed this long ago without a job: its submit died
PLAN_TOKEN_PATTERN = r"^[A-Za-z0-9_\-]+\.[0-9a-f]{32}$"


class BackendRow(BackendStatus):
    options: dict[str, str] = Field(default_factory=dict, description="Its spec.options: name -> 'type: what'")


class BackendList(Model):
    backends: list[BackendRow]


def backend_rows(settings: Any) -> list[BackendRow]:
    """Every registered backend's detection, with the options a spec gives it."""
    from servers.launch.options import describe

    return [BackendRow(**b.model_dump(), options=describe(b.name)) for b in detect_all(settings)]


class RecipeArgument(Model):
    name: str
    type: str
    default: Any | None = None
    help: str | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    exclusive_minimum: int | float | None = None


class RecipeDoc(Model):
    name: str
    description: str
    arguments: list[RecipeArgument]
    expected_time_cpu: str
    expected_time_gpu: str
    metrics: list[str]
    metric_notes: dict[str, str] = Field(default_factory=dict, description="What a metric means, where it needs saying")


class RecipeList(Model):
    recipes: list[RecipeDoc]


def gpus_in_use(active: list[JobRecord]) -> int:
    """Distinct GPUs held by the active training jobs among `active` (their spec records the assignment): a GPU that
    jobs share (share_gpus) counts once, as admission counts it."""
    held = {g for r in active if r.kind == TRAINING_KIND for g in r.spec.get("gpus") or [] if isinstance(g, int)}
    return len(held)


def make_plan(
    app: App, spec: TrainingJobSpec, *, present: int | None = None, in_use: int | None = None
) -> TrainingPlan:
    """The training plan of `spec`; `present` and `in_use` (GPUs here, GPUs held) are asked when not given."""
    from servers.core.machine import gpus_present
    from servers.launch import training

    return training.plan(
        app.settings,
        spec,
        gpus_present=gpus_present() if present is None else present,
        gpus_in_use=gpus_in_use(app.engine.reconcile_all()) if in_use is None else in_use,
        backend=backend_for(app, spec.backend),
    )


def recipe_docs() -> list[RecipeDoc]:
    from servers.launch.recipes import RECIPES

    docs = []
    for info in RECIPES.values():
        args = [
            RecipeArgument(
                name=a.name,
                type=a.type,
                default=a.default,
                help=a.help,
                minimum=a.minimum,
                maximum=a.maximum,
                exclusive_minimum=a.exclusive_minimum,
            )
            for a in info.arguments
        ]
        docs.append(
            RecipeDoc(
                name=info.name,
                description=info.description,
                arguments=args,
                expected_time_cpu=info.expected_time_cpu,
                expected_time_gpu=info.expected_time_gpu,
                metrics=list(info.metrics),
                metric_notes=dict(info.metric_notes),
            )
        )
    from servers.launch.frameworks import FRAMEWORKS

    for template in FRAMEWORKS.values():  # a framework's own entry point: args are its overrides or flags
        docs.append(
            RecipeDoc(
                name=template.name,
                description=template.description,
                arguments=[],
                expected_time_cpu="does not run on CPU: GPUs required",
                expected_time_gpu="set by the run's data, model and steps",
                metrics=list(template.metrics),
            )
        )
    return docs


def register(server: MCPServer, app: App) -> None:
    register_resources(server)
    register_catalog(server, app)
    register_jobs(server, app)
    register_sweeps(server, app)


def register_catalog(server: MCPServer, app: App) -> None:
    """list_backends, list_recipes."""

    @agent_tool(
        server, title="List launch backends", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def list_backends() -> Annotated[CallToolResult, BackendList]:
        """Which spec.backend values work on this machine, with what was found for each or why not, and the
        spec.options each takes. Instant."""
        backends = await in_thread(backend_rows, app.settings)
        lines = [
            f"- {b.name}: {'found' if b.detected else 'missing'} ({b.detail})"
            + ("" if b.launch_supported else f"; {b.launch_note}")
            + (f"; options: {', '.join(b.options)}" if b.options else "")
            for b in backends
        ]
        return tool_result(BackendList(backends=backends), "\n".join(lines))

    @agent_tool(
        server, title="List training recipes", read_only=True, destructive=False, idempotent=True, open_world=False
    )
    async def list_recipes() -> Annotated[CallToolResult, RecipeList]:
        """The bundled training recipes: what each trains, its arguments, metrics and CPU/GPU run time. Instant."""
        docs = await in_thread(recipe_docs)
        lines = [f"- {d.name}: {d.description} (CPU {d.expected_time_cpu}; GPU {d.expected_time_gpu})" for d in docs]
        return tool_result(RecipeList(recipes=docs), "\n".join(lines))


def register_jobs(server: MCPServer, app: App) -> None:
    """plan_training_job, submit_training_job."""
    from servers.core.audit import AuditLog
    from servers.launch.training import IdempotencyKeys, spec_from_token, spec_hash

    @agent_tool(
        server, title="Plan a training job", read_only=False, destructive=False, idempotent=True, open_world=False
    )
    async def plan_training_job(
        ctx: Context,
        spec: TrainingJobSpec,
    ) -> Annotated[CallToolResult, TrainingPlan]:
        """Check a training job and show what would run (command, GPUs, GPU-hours, quotas, approval needed), with
        a plan_token. Instant."""
        plan = await in_thread(make_plan, app, spec)
        if plan.needs_confirmation:
            await in_thread(Approvals(app.settings).request, plan.plan_id, job_launch(plan).summary)
        AuditLog(app.settings).record(
            "plan",
            who=client_name(ctx),
            plan_hash=plan.plan_hash,
            recipe=plan.recipe,
            script=plan.script_path,
            gpus=plan.gpus,
            estimated_gpu_hours=plan.estimated_gpu_hours,
        )
        text = (
            f"would run: {' '.join(plan.argv)}\nranks {plan.nproc_per_node}, GPUs {plan.gpus} per node, "
            f"{plan.spec.get('nnodes') or 1} node(s), at most {plan.estimated_gpu_hours:.3g} GPU-hours, "
            f"{plan.estimated_node_hours:.3g} node-hours"
            + (f"; needs the person's approval (plan_id {plan.plan_id})" if plan.needs_confirmation else "")
            + "".join(f"\nwarning: {w}" for w in plan.warnings)
        )
        return tool_result(plan, text)

    @agent_tool(
        server,
        title="Submit a training job",
        read_only=False,
        destructive=False,
        idempotent=False,
        open_world=False,
        same_as={"spec": "plan_training_job"},
    )
    async def submit_training_job(
        ctx: Context,
        spec: TrainingJobSpec | None = None,
        plan_token: Annotated[
            str | None,
            Field(
                max_length=65536,
                pattern=PLAN_TOKEN_PATTERN,
                description="From plan_training_job; stands for its spec",
            ),
        ] = None,
        wait_s: WaitS = 20,
    ) -> Annotated[CallToolResult, JobView]:
        """Start a training job; returns it within wait_s, else its handle. Past a GPU-hour threshold the person
        approves it; a client that cannot ask them needs the plan_token. A retry with the spec's idempotency_key
        returns the first job."""
        if spec is None and plan_token is None:
            raise InputError("give spec, plan_token, or both")
        audit = AuditLog(app.settings)
        token_spec, token_plan = spec_from_token(app.settings, plan_token) if plan_token else (None, None)
        plan = await in_thread(make_plan, app, spec or token_spec)
        normalised = TrainingJobSpec.model_validate(plan.spec)
        if token_spec is not None and plan.plan_hash != token_plan:
            if spec is not None and spec_hash(normalised) != spec_hash(token_spec):
                raise InputError("plan_token was made for a different spec; plan this spec again and use its token")
            raise InputError(
                "the plan changed since it was shown (the machine, the settings or the script's place changed): "
                "call plan_training_job again, show the new plan, and submit with its plan_token"
            )
        keys = IdempotencyKeys(app.settings) if normalised.idempotency_key else None
        if keys is not None:
            found = await in_thread(existing_job, app, keys, normalised)
            if found is not None:
                view = await in_thread(lambda: job_view_of(app, found))
                return tool_result(view, f"already submitted with this idempotency_key: {summarize_job(view)}")
        admitted = await admit(
            app.settings,
            job_launch(plan),
            needed=plan.needs_confirmation,
            ask=elicit_asker(ctx),
            has_token=token_spec is not None,
            who=client_name(ctx),
            audit={"plan_hash": plan.plan_hash, "estimated_gpu_hours": plan.estimated_gpu_hours},
            declined=f"not started: the person declined the launch ({plan.estimated_gpu_hours:.3g} GPU-hours at most)",
        )
        try:
            record = await in_thread(start_keyed, app, keys, plan, normalised)
        except BaseException:
            await admitted.started(app.settings, None)
            raise
        view = job_view_of(app, record.id)
        await admitted.started(app.settings, view.job_id)
        audit.record(
            "submit",
            who=client_name(ctx),
            plan_hash=plan.plan_hash,
            job_id=view.job_id,
            recipe=plan.recipe,
            script=plan.script_path,
            args=normalised.args,
            gpus=record.spec.get("gpus"),
            network=record.spec.get("network"),
        )
        if wait_s > 0:
            from servers.core.job_tools import wait_for

            waited = await wait_for(app, view.job_id, wait_s, ctx)
            assert waited.job is not None
            view = waited.job
        return tool_result(view, summarize_job(view))


def register_sweeps(server: MCPServer, app: App) -> None:
    """plan_sweep, submit_sweep."""
    from servers.core.audit import AuditLog

    @agent_tool(
        server,
        title="Plan a sweep",
        read_only=False,
        destructive=False,
        idempotent=True,
        open_world=False,
        same_as={"spec": "plan_training_job"},
    )
    async def plan_sweep(
        ctx: Context,
        spec: TrainingJobSpec,
        grid: Annotated[
            dict[Annotated[str, Field(max_length=64)], list[Annotated[str, Field(max_length=256)]]] | None,
            Field(max_length=8, description='{"--lr": ["0.1", "0.2"]}: a run per combination'),
        ] = None,
        variants: Annotated[
            list[list[Annotated[str, Field(max_length=256)]]] | None,
            Field(max_length=64, description="Or a run per list of extra args"),
        ] = None,
    ) -> Annotated[CallToolResult, SweepPlan]:
        """Plan up to 64 runs of one spec over a grid or variants of its args: their plans, total GPU-hours, one
        approval, a sweep_token. Instant."""
        swept = await in_thread(make_sweep, app, spec, grid, variants)
        if swept.needs_confirmation:
            await in_thread(Approvals(app.settings).request, swept.plan_id, sweep_summary(swept))
        AuditLog(app.settings).record(
            "plan_sweep",
            who=client_name(ctx),
            sweep_id=swept.sweep_id,
            runs=len(swept.runs),
            estimated_gpu_hours=swept.total_gpu_hours,
        )
        lines = [
            f"sweep {swept.sweep_id}: {len(swept.runs)} run(s), at most {swept.total_gpu_hours:.3g} GPU-hours in all"
            + (f"; needs the person's approval (plan_id {swept.plan_id})" if swept.needs_confirmation else "")
        ]
        lines += [f"- run {r.index}: {' '.join(r.args)}" for r in swept.runs]
        if swept.array_script is not None:
            lines.append(f"on Slurm as one job array (sbatch --array=0-{len(swept.runs) - 1}): see array_script")
        return tool_result(swept, "\n".join(lines))

    @agent_tool(server, title="Submit a sweep", read_only=False, destructive=False, idempotent=True, open_world=False)
    async def submit_sweep(
        ctx: Context,
        sweep_token: Annotated[
            str, Field(max_length=262144, pattern=PLAN_TOKEN_PATTERN, description="From plan_sweep")
        ],
    ) -> Annotated[CallToolResult, SweepSubmitted]:
        """Start each run of a planned sweep as a job (on Slurm, one job array), approved once; resubmitting starts
        nothing twice. Then wait_for_job(job_id=sweep_id)."""
        from servers.launch import sweeps

        base, runs, digest = sweeps.read_token(app.settings, sweep_token)
        swept = await in_thread(functools.partial(make_sweep_from_runs, app, base, runs, own=f"sweep-{digest}"))
        if swept.plan_id != digest:
            raise InputError(
                "the sweep's plans changed since they were shown (the machine, the settings or a script changed): "
                "call plan_sweep again, show it, and submit its sweep_token"
            )
        admitted = await admit(
            app.settings,
            sweep_launch(swept),
            needed=swept.needs_confirmation,
            ask=elicit_asker(ctx),
            has_token=True,
            who=client_name(ctx),
            audit={"sweep_id": swept.sweep_id, "estimated_gpu_hours": swept.total_gpu_hours},
            declined=f"not started: the person declined the sweep ({swept.total_gpu_hours:.3g} GPU-hours)",
        )
        try:
            job_ids = await in_thread(start_sweep, app, swept)
        except BaseException:
            await admitted.started(app.settings, None)
            raise
        await admitted.started(app.settings, swept.sweep_id)
        AuditLog(app.settings).record("submit_sweep", who=client_name(ctx), sweep_id=swept.sweep_id, job_ids=job_ids)
        result = SweepSubmitted(sweep_id=swept.sweep_id, job_ids=job_ids, total_gpu_hours=swept.total_gpu_hours)
        return tool_result(
            result,
            f"sweep {swept.sweep_id}: {len(job_ids)} job(s) started or already running. Next: "
            f"wait_for_job(job_id={swept.sweep_id!r}) until all end; list_jobs(sweep_id={swept.sweep_id!r}).",
        )


class SweepSubmitted(Model):
    sweep_id: str
    job_ids: list[str] = Field(description="One job per run, in run order")
    total_gpu_hours: float


def job_launch(plan: TrainingPlan) -> Launch:
    from servers.core.display import quoted, quoted_list, visible
    from servers.launch.training import plan_summary

    nnodes = plan.spec.get("nnodes") or 1
    options = plan.spec.get("options") or {}
    image = f", image {quoted(options['image'])}" if options.get("image") else ""
    return Launch(
        plan_id=plan.plan_id,
        gpu_hours=plan.estimated_gpu_hours,
        node_hours=plan.estimated_node_hours,
        message=(  # escaped: the client shows it to the person
            f"Start training {visible(plan.recipe or plan.script_path)} on {plan.backend}{image}: {nnodes} node(s) "
            f"x {plan.nproc_per_node} rank(s), {plan.gpus} GPU(s) per node ({plan.gpus * nnodes} in all), for at "
            f"most {plan.spec['max_wall_s']:g} s: up to {plan.estimated_gpu_hours:,.4g} GPU-hours, "
            f"{plan.estimated_node_hours:,.4g} node-hours. Command: {quoted_list(plan.argv)}"
            + (f". Env: {', '.join(visible(k) for k in plan.spec['env'])}" if plan.spec.get("env") else "")
            + (f". pip: {quoted_list(options['pip_packages'])}" if options.get("pip_packages") else "")
            + (f". workdir: {quoted(plan.backend_spec['workdir'])}" if plan.backend_spec.get("workdir") else "")
        ),
        summary=plan_summary(plan),
        plan_tool="plan_training_job",
        submit_tool="submit_training_job",
        token_name="plan_token",
    )


def sweep_summary(swept: SweepPlan) -> dict[str, Any]:
    """What `llm-infra-mcp approve` shows of a sweep: run 0's plan in full, every run's args, the totals."""
    from servers.launch.training import SWEEP_SUMMARY_LAYOUT, plan_summary

    first = swept.runs[0].plan
    return {
        **plan_summary(first),
        "layout": SWEEP_SUMMARY_LAYOUT,
        "what": f"sweep of {first.recipe or first.script_path}",
        "runs": len(swept.runs),
        "args_of_each_run": [list(r.args) for r in swept.runs],
        "total_gpus": swept.gpus_at_once * (first.spec.get("nnodes") or 1),
        "estimated_gpu_hours": swept.total_gpu_hours,
        "estimated_node_hours": swept.total_node_hours,
    }


def sweep_launch(swept: SweepPlan) -> Launch:
    from servers.core.display import visible

    first = swept.runs[0].plan
    node_hours = swept.total_node_hours
    return Launch(
        plan_id=swept.plan_id,
        gpu_hours=swept.total_gpu_hours,
        node_hours=node_hours,
        message=(
            f"Start a sweep of {len(swept.runs)} runs of {visible(first.recipe or first.script_path)} "
            + (
                "on Slurm as one job array (tasks start as nodes free up)"
                if swept.array_script is not None
                else f"on {first.backend}, all at once ({swept.gpus_at_once} GPU(s) together)"
            )
            + f", {first.spec.get('nnodes') or 1} node(s) each: up to {swept.total_gpu_hours:.3g} GPU-hours, "
            f"{node_hours:.3g} node-hours in all."
        ),
        summary=sweep_summary(swept),
        plan_tool="plan_sweep",
        submit_tool="submit_sweep",
        token_name="sweep_token",
    )


def make_sweep(
    app: App, spec: TrainingJobSpec, grid: dict[str, list[str]] | None, variants: list[list[str]] | None
) -> SweepPlan:
    from servers.launch import sweeps

    return make_sweep_from_runs(app, spec, sweeps.expand(spec, grid, variants))


def make_sweep_from_runs(
    app: App, base: TrainingJobSpec, runs: list[list[str]], *, own: str | None = None
) -> SweepPlan:
    """The sweep's plan. `own`: the sweep id a submit expects (from its token): that sweep's runs already started
    (a retry) hold nothing against it."""
    from servers.core.machine import gpus_present
    from servers.launch import sweeps

    active = app.engine.reconcile_all()  # once for the whole sweep, not once per run
    present, in_use = gpus_present(), gpus_in_use([r for r in active if own is None or r.spec.get("sweep_id") != own])
    return sweeps.build(
        app.settings,
        base,
        runs,
        lambda run_spec: make_plan(app, run_spec, present=present, in_use=in_use),
        active=[(r.spec.get("sweep_id"), gpus_in_use([r])) for r in active],
    )


def start_sweep(app: App, swept: SweepPlan) -> list[str]:
    """Every run as its own job, keyed <sweep id>-<index>: runs already started are found, not started again."""
    from servers.launch.training import IdempotencyKeys

    keys = IdempotencyKeys(app.settings)
    array = swept.array_script is not None
    job_ids: list[str] = []
    for run in swept.runs:
        spec = TrainingJobSpec.model_validate(run.plan.spec).model_copy(update={"idempotency_key": run.idempotency_key})
        found = existing_job(app, keys, spec)
        if found is None:
            extra: dict[str, Any] = {"sweep_id": swept.sweep_id, "sweep_index": run.index}
            if array:
                extra["slurm_array"] = swept.sweep_id  # the run waits for the array submitted below
            found = start_keyed(app, keys, run.plan, spec, extra=extra).id
        job_ids.append(found)
    if array:
        submit_array(app, swept, job_ids)
    return job_ids


def submit_array(app: App, swept: SweepPlan, job_ids: list[str]) -> None:
    """A sweep as one job array (a backend with arrays: Slurm; idempotent by the sweep id): task i runs in the
    folder of run i's job. A run whose job ended before the array was submitted (cancelled) has its task cancelled;
    if the engine refuses the array, every run's job is cancelled and the error raised."""
    from typing import cast

    from servers.engines import registry
    from servers.engines.backend import ArrayBackend, ArrayRun

    name = swept.runs[0].plan.backend
    if not registry.get(name).can("arrays"):
        raise InputError(f"backend: {name!r} cannot run a sweep as one job array")
    records = [app.engine.get(job_id) for job_id in job_ids]
    runs = [
        ArrayRun(plan=run.plan.backend_plan, key=run.idempotency_key, job_dir=record.job_dir)
        for run, record in zip(swept.runs, records, strict=True)
    ]
    backend = cast(ArrayBackend, backend_for(app, name))
    try:
        handles = backend.submit_array(runs, sweep_key=swept.sweep_id, sweep_dir=backend.job_root / swept.sweep_id)
    except (RuntimeError, ValueError) as exc:
        for job_id in job_ids:
            app.engine.cancel(job_id)
        raise ToolError(f"the sweep's job array was not submitted: {exc}; its runs were cancelled") from exc
    for handle, job_id in zip(handles, job_ids, strict=True):
        if app.engine.get(job_id).state.terminal:
            backend.cancel(handle)


def register_resources(server: MCPServer) -> None:
    @server.resource(
        "infra://recipes",
        name="recipes",
        mime_type="application/json",
        description="The bundled training recipes: what they train, arguments, metrics, expected time",
    )
    def recipes_resource() -> str:
        return RecipeList(recipes=recipe_docs()).model_dump_json(indent=2)


def job_view_of(app: App, job_id: str) -> JobView:
    from servers.core.jobview import job_view

    return job_view(app.engine.get(job_id))


def backend_for(app: App, name: str) -> "Backend":
    """The backend a spec names, built as the registry declares it: one the job engine runs itself (in_engine:
    local torchrun) on the server's engine, any other from the config it stores with its jobs."""
    from servers.engines import registry

    info = registry.get(name)
    if info.can("in_engine"):
        return info.build({"engine": app.engine, "kind": TRAINING_KIND})
    return info.build(backend_config(app, name))


def backend_config(app: App, name: str) -> dict[str, Any]:
    """What a remote job's worker needs to reach its engine (its BackendInfo's config; no secrets: tokens stay in
    the environment)."""
    from servers.engines import registry

    return registry.get(name).config_for(app.settings)


def start_training(
    app: App, plan: TrainingPlan, spec: TrainingJobSpec, *, extra: dict[str, Any] | None = None
) -> JobRecord:
    """Submit exactly the plan that was made (and shown) through the backend; the job as the engine has it.
    `extra` joins the job's spec (a sweep's id and index)."""
    import secrets

    from servers.engines import registry
    from servers.engines.backend import SubmitRequest

    key = spec.idempotency_key or f"{plan.plan_hash}-{secrets.token_hex(6)}"
    request = SubmitRequest(
        key=key,
        spec={
            **plan.backend_spec,
            **(extra or {}),
            "plan_hash": plan.plan_hash,
            "training_spec": spec.model_dump(mode="json"),
        },
        timeout_s=spec.max_wall_s,
    )
    info = registry.get(spec.backend)
    if info.can("in_engine"):
        handle = backend_for(app, spec.backend).submit(plan.backend_plan, request)
        return app.engine.get(handle.native_id)
    # Another engine: a job of the engine here follows it (see remote.py); the key makes the submit idempotent. The
    # backend's declaration travels with the job, so that its worker builds the same backend (engines/registry.py).
    tracked = {
        **request.spec,
        "backend": spec.backend,
        "backend_info": info.record(),
        "backend_config": backend_config(app, spec.backend),
        "idempotency_key": key,
        "plan": plan.backend_plan.model_dump(mode="json"),
    }
    follow_s = min(spec.max_wall_s + info.grace_s, max(spec.max_wall_s, app.settings.max_job_wall_s))
    return app.engine.submit(REMOTE_KIND, tracked, timeout_s=follow_s)


def start_keyed(
    app: App,
    keys: "IdempotencyKeys | None",
    plan: TrainingPlan,
    spec: TrainingJobSpec,
    *,
    extra: dict[str, Any] | None = None,
) -> JobRecord:
    """start_training under the spec's idempotency key (when `keys` is given): the key is claimed first (of two
    concurrent submits one wins), released if the start fails, and bound to the job once it exists."""
    from servers.launch.training import spec_hash

    key = spec.idempotency_key
    keyed = keys if key is not None else None
    if keyed is not None and not keyed.claim(key, spec_hash(spec)):
        raise InputError(f"another submit with idempotency_key {key!r} got there first; get_job to follow it")
    try:
        record = start_training(app, plan, spec, extra=extra)
    except BaseException:
        if keyed is not None:
            keyed.release(key)
        raise
    if keyed is not None:
        keyed.bind(key, record.id)
    return record


def existing_job(app: App, keys: "IdempotencyKeys", spec: TrainingJobSpec) -> str | None:
    """The job already submitted with the spec's idempotency key, or None. A key claimed by a submit that never
    recorded its job (the server died in between) is recovered from the job engine's records, where every backend's
    job is (a local run, or the follower of a cluster's job), or released once stale."""
    from servers.launch.training import spec_hash

    key = spec.idempotency_key
    assert key is not None
    found = keys.lookup(key)
    if found is None:
        return None
    digest, job_id, claimed_at = found
    if digest != spec_hash(spec):
        raise InputError(f"idempotency_key {key!r} was used for a different spec; use a new key")
    if job_id is not None:
        return job_id
    recorded = job_of_key(app, key)
    if recorded is not None:
        keys.bind(key, recorded)
        return recorded
    if time.time() - claimed_at > STALE_CLAIM_S:
        keys.release(key)
        return None
    raise InputError("a submit with this idempotency_key is starting right now; get_job shortly")


def job_of_key(app: App, key: str) -> str | None:
    """The id of the training job (of any backend) whose spec carries this idempotency key."""
    store = app.engine.store
    for kind in (TRAINING_KIND, REMOTE_KIND):
        offset = 0
        while True:
            page = store.list_jobs(kind=kind, limit=200, offset=offset)
            for job in page.jobs:
                if job.spec.get("idempotency_key") == key:
                    return job.id
            offset += len(page.jobs)
            if not page.jobs or offset >= page.total:
                break
    return None


PART = ServerPart(name=NAME, instructions=INSTRUCTIONS, register=register, job_kinds=JOB_KINDS, starts_jobs=True)


def create_server(app: App | None = None) -> MCPServer:
    return build_server(NAME, INSTRUCTIONS, [PART], app)
