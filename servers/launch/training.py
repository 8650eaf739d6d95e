"""Training jobs before they start: the spec, its checks (paths, environment, quotas), the plan with a token
bound to it, the audit log, and idempotency keys. Plain module; the MCP layer is server.py, the executor is the
job engine with the local backend's work function (local.py).

A plan_token is self-contained: the canonical spec, signed with an HMAC key kept in the state directory. Submit
accepts the token alone (it carries the spec) or with the spec (they must match), so nothing is stored at plan
time except the audit line.
"""

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from servers.core.db import connect, initialise
from servers.core.errors import InputError
from servers.core.jobs import JOB_ID_PATTERN
from servers.core.models import Model
from servers.core.paths import resolve_inside_roots
from servers.core.settings import Settings
from servers.engines import admission, registry
from servers.engines.admission import confirmation_needed
from servers.engines.backend import Backend, BackendPlan
from servers.launch import frameworks
from servers.launch import options as backend_options
from servers.launch.envpolicy import check_env
from servers.runs.jobs import RUN_SOURCE_KEY, run_source

KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
# What `options` takes, per bundled backend (the options models in their modules; a test keeps this in step).
OPTIONS_TEXT = (
    "The backend's own options (list_backends lists them): local: share_gpus; slurm: partition, account, qos, "
    "constraint, exclude, nodelist, dependency; kubernetes: image (required), namespace, queue, runtime, k8s_kind; "
    "skypilot: image, accelerator, infra, use_spot, job_recovery, max_restarts_on_errors, pip_packages; ray: none"
)


def _backend_names(schema: dict[str, Any]) -> None:
    schema["enum"] = list(registry.names())


class TrainingJobSpec(Model):
    """Exactly one of recipe or script. The fields every backend reads; what one backend alone takes is in
    `options`, checked against that backend's own (list_backends shows them)."""

    recipe: Annotated[str, Field(max_length=64)] | None = Field(default=None, description="See list_recipes")
    script: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="A .py in the allowed roots"
    )
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=256, description="One per item, no shell"
    )
    nproc_per_node: int | None = Field(default=None, ge=1, le=64)
    nnodes: int = Field(default=1, ge=1, le=64, description=">1: slurm, kubernetes, skypilot; ray for verl/OpenRLHF")
    gpus_per_node: int | None = Field(default=None, ge=0, le=64)
    env: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=64,
        description="NCCL_*, TORCH_*, CUDA_*, OMP_*, JOB_* and the like; no paths",
    )
    workdir: Annotated[str, Field(max_length=4096)] | None = Field(default=None, description="In the allowed roots")
    max_wall_s: float = Field(default=3600, gt=0, le=30 * 86400)
    max_restarts: int = Field(default=0, ge=0, le=10)
    name: Annotated[str, Field(max_length=128)] | None = None
    tags: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=32)
    idempotency_key: Annotated[str, Field(pattern=KEY_PATTERN)] | None = None
    backend: Annotated[str, Field(max_length=64)] = Field(default="local", json_schema_extra=_backend_names)
    resume_from: Annotated[str, Field(pattern=JOB_ID_PATTERN)] | None = Field(
        default=None, description="Start from this ended job's newest checkpoint"
    )
    options: dict[Annotated[str, Field(max_length=64)], Any] = Field(
        default_factory=dict, max_length=backend_options.MAX_OPTIONS, description=OPTIONS_TEXT
    )

    @model_validator(mode="before")
    @classmethod
    def _options_at_the_top(cls, data: Any) -> Any:
        """A backend's option given beside the common fields (where specs had them before): say where it goes."""
        if isinstance(data, dict):
            lines = []
            for name in [k for k in data if isinstance(k, str) and k not in cls.model_fields][:8]:
                takers = backend_options.owners(name)
                if takers:
                    lines.append(
                        f"{name}: a {' and '.join(takers)} option; give it in options, e.g. "
                        f'{{"backend": "{takers[0]}", "options": {{"{name}": ...}}}}'
                    )
            if lines:
                raise ValueError("; ".join(lines))
        return data

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in registry.names():
            raise ValueError(f"{value[:64]!r} is not a known backend; accepted: {', '.join(registry.names())}")
        return value

    @field_validator("options")
    @classmethod
    def _backend_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        backend = info.data.get("backend")
        if backend is None:  # the backend was refused: its error says so
            return value
        # strict for JSON input, as the tool layer validates every other field ("1" is no integer there)
        return backend_options.validate(backend, value, within="", join="; ", strict=info.mode == "json")


class ResumeSource(Model):
    job_id: str
    checkpoints: str = Field(description="Its checkpoints folder, copied into the new job's before it starts")
    newest_step: int | None = Field(description="The newest step_<N>.pt there, when the files are named so")
    files: int
    bytes: int
    skipped: list[str] = Field(description="What is not copied: links (never followed), other non-regular files")


class TrainingPlan(Model):
    plan_token: str = Field(description="Pass to submit_training_job: it is bound to exactly this spec")
    plan_hash: str = Field(description="Hash of the normalised spec; recorded in the audit log")
    spec: dict[str, Any] = Field(description="The normalised spec (defaults filled in)")
    backend: str
    argv: list[str] = Field(description="The exact command; $JOB_DIR is the job folder, known once submitted")
    cwd: str
    env: dict[str, str] = Field(description="Variables added to the job's environment ($ASSIGNED_GPUS: at admission)")
    rendered: str | None = Field(default=None, description="The batch script or manifest, for engines that take one")
    notes: list[str] = Field(default_factory=list, description="What the backend says a person should know")
    backend_spec: dict[str, Any] = Field(description="What the backend planned from (paths resolved)")
    backend_plan: BackendPlan = Field(description="The plan the submit runs, exactly; the plan_token binds it")
    script_path: str
    recipe: str | None
    nproc_per_node: int
    gpus: int = Field(description="GPUs the job will hold")
    estimated_gpu_hours: float = Field(description="Upper bound: GPUs x wall-time limit")
    estimated_node_hours: float = Field(description="Upper bound: nodes x wall-time limit")
    expected_runtime: str | None = Field(default=None, description="The recipe's typical run time, when known")
    needs_confirmation: bool = Field(
        description="True above LLM_INFRA_MCP_CONFIRM_ABOVE_GPU_HOURS, or for cluster nodes without GPUs above "
        "LLM_INFRA_MCP_CONFIRM_ABOVE_NODE_HOURS"
    )
    plan_id: str = Field(description="What the person names to approve this plan: `llm-infra-mcp approve PLAN_ID`")
    network: str = Field(description="Where the job's sockets live, and the trust that assumes")
    quotas: list[str] = Field(description="The quotas checked, with their values")
    warnings: list[str]
    resume: ResumeSource | None = Field(default=None, description="The checkpoints the job starts from")


# The job kinds of training jobs (launch/server.py TRAINING_KIND and REMOTE_KIND; a test keeps them in step).
TRAINING_KINDS = ("training", "training_remote")


def resume_source(settings: Settings, spec: "TrainingJobSpec", script: Path, recipe: str | None) -> ResumeSource:
    """The job `spec.resume_from` names, checked: a training job of this state directory that has ended, ran the
    same recipe (or script), and left at least one checkpoint; on a backend whose job folder is on this machine,
    where the checkpoints are copied before the job starts (launch/local.py seed_checkpoints). InputError naming
    the job and what is wrong otherwise."""
    from servers.core.jobfiles import JobFiles
    from servers.core.jobstore import JobStore
    from servers.launch.local import ResumeError, scan_checkpoints

    job_id = spec.resume_from
    assert job_id is not None
    accepted = ", ".join(registry.with_capability("local_job_folder"))
    if not registry.get(spec.backend).can("local_job_folder"):
        raise InputError(
            f"resume_from {job_id}: the {spec.backend} backend runs the job in a folder of its own cluster, not in "
            f"its job folder on this machine, so job {job_id}'s checkpoints cannot be copied to it; accepted: "
            f"backend {accepted}"
        )
    # Read only (no migration): the plan has no side effects; no database yet means no job yet.
    record = JobStore(settings.db_path, prepare=False).get(job_id) if settings.db_path.is_file() else None
    if record is None:
        raise InputError(f"resume_from {job_id}: no such job in this server's job store (list_jobs shows them)")
    if record.kind not in TRAINING_KINDS:
        raise InputError(f"resume_from {job_id}: a {record.kind} job, not a training job; accepted: a training job")
    if not record.state.terminal:
        raise InputError(
            f"resume_from {job_id}: the job is {record.state.value}; accepted: a job that has ended (its "
            "checkpoints still change while it runs): wait_for_job, or cancel_job"
        )
    theirs, ours = record.spec.get("recipe"), recipe
    if ours is not None and theirs != ours:
        raise InputError(
            f"resume_from {job_id}: it ran {_ran(record.spec)}, this job runs recipe {ours}; accepted: a job of "
            "the same recipe (its checkpoints hold that recipe's model)"
        )
    if ours is None and (theirs is not None or record.spec.get("script") != str(script)):
        raise InputError(
            f"resume_from {job_id}: it ran {_ran(record.spec)}, this job runs script {script}; accepted: a job of "
            "the same script"
        )
    folder = JobFiles(record.job_dir).checkpoints
    try:
        found = scan_checkpoints(folder)
    except ResumeError as exc:
        raise InputError(f"resume_from {job_id}: its checkpoints cannot be copied: {exc}") from None
    if not found.files:
        raise InputError(
            f"resume_from {job_id}: its checkpoints folder {folder} holds no checkpoint"
            + (f" ({len(found.skipped)} entries skipped: {'; '.join(found.skipped[:3])})" if found.skipped else "")
            + "; accepted: a job that saved at least one (the recipes' --ckpt-every)"
        )
    return ResumeSource(
        job_id=job_id,
        checkpoints=str(folder),
        newest_step=found.newest_step,
        files=len(found.files),
        bytes=found.total_bytes,
        skipped=found.skipped[:32],
    )


def _ran(spec: dict[str, Any]) -> str:
    recipe = spec.get("recipe")
    return f"recipe {recipe}" if isinstance(recipe, str) else f"script {str(spec.get('script'))[:4096]}"


def state_dir_refusal(settings: Settings, folder: Path) -> str | None:
    """Why `folder` (resolved) may not be a job's workdir or script, or None: the state directory (the signing key,
    the database, every job's folder) must never be a job's working directory nor travel in an upload, so a path
    may neither be it, lie inside it, nor contain it."""
    home = settings.home
    if folder == home:
        return "is the state directory"
    if folder.is_relative_to(home):
        return "lies inside the state directory"
    if home.is_relative_to(folder):
        return "contains the state directory"
    return None


def key_file(settings: Settings) -> Path:
    return settings.home / "launch.key"


def _signing_key(settings: Settings) -> bytes:
    """The state directory's HMAC key, made on first use. Several processes (a study's servers, a person's CLI) may
    race to make it: the key is written whole to a private temporary file and linked into place, which fails if
    another process linked first; then that process's key is the one, and it is read (complete, as linked)."""
    path = key_file(settings)
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_bytes(32)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".launch-key-")
        try:
            with os.fdopen(fd, "wb") as f:  # mkstemp makes it 0600
                f.write(key)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:  # another process linked its key first: use that one
                key = path.read_bytes()
        finally:
            os.unlink(tmp)
    if len(key) < 32:
        raise OSError(f"the signing key {path} is damaged ({len(key)} bytes; 32 expected): remove it to make a new one")
    return key


def canonical(spec: TrainingJobSpec) -> str:
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def spec_hash(spec: TrainingJobSpec) -> str:
    return hashlib.sha256(canonical(spec).encode()).hexdigest()[:16]


def plan_digest(spec: TrainingJobSpec, backend_plan: BackendPlan) -> str:
    """The plan's id: the normalised spec and the backend's exact plan together."""
    plan_json = json.dumps(backend_plan.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256((canonical(spec) + "\n" + plan_json).encode()).hexdigest()[:16]


def sign(settings: Settings, purpose: str, payload: dict[str, Any]) -> str:
    """A self-contained token: the payload (canonical JSON, base64url) and an HMAC over it and its purpose, with
    the key of this state directory. `purpose` keeps a token of one kind from standing for another."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    body = base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
    signature = hmac.new(_signing_key(settings), f"{purpose}:{body}".encode(), hashlib.sha256).hexdigest()[:32]
    return f"{body}.{signature}"


def unsign(settings: Settings, purpose: str, token: str, *, name: str, remedy: str) -> dict[str, Any]:
    """The payload of a token made by `sign` for `purpose`; InputError naming the token and the remedy otherwise."""
    body, _, signature = token.rpartition(".")
    expected = hmac.new(_signing_key(settings), f"{purpose}:{body}".encode(), hashlib.sha256).hexdigest()[:32]
    if not body or not hmac.compare_digest(signature, expected):
        raise InputError(
            f"{name} is not valid here: it was not made on this state directory, or it was altered; {remedy}"
        )
    try:
        data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except ValueError:
        raise InputError(f"{name} cannot be decoded; {remedy}") from None
    if not isinstance(data, dict):
        raise InputError(f"{name} is not one this version makes; {remedy}")
    return data


def make_token(settings: Settings, spec: TrainingJobSpec, digest: str) -> str:
    return sign(settings, "plan", {"spec": spec.model_dump(mode="json"), "plan": digest})


def spec_from_token(settings: Settings, token: str) -> tuple[TrainingJobSpec, str]:
    """The spec a token was made for and the id of the plan it bound (checked against a fresh plan at submit)."""
    data = unsign(settings, "plan", token, name="plan_token", remedy="make a new plan with plan_training_job")
    if not isinstance(data.get("plan"), str) or not isinstance(data.get("spec"), dict):
        raise InputError("plan_token is from an older version; make a new plan")
    try:
        return TrainingJobSpec.model_validate(data["spec"]), data["plan"]
    except ValueError:  # a spec of an older shape (flat backend fields) or of a backend no longer registered
        raise InputError("plan_token is from an older version; make a new plan with plan_training_job") from None


_KEYS_SCHEMA = """
CREATE TABLE IF NOT EXISTS launch_keys (
    key TEXT PRIMARY KEY,
    spec_hash TEXT NOT NULL,
    job_id TEXT,
    created_at REAL NOT NULL
);
"""


class IdempotencyKeys:
    """key -> job. Claiming a key is one INSERT: of two concurrent submits with one key, one wins."""

    def __init__(self, settings: Settings) -> None:
        self.db_path = settings.db_path
        initialise(self.db_path, _KEYS_SCHEMA)

    def lookup(self, key: str) -> tuple[str, str | None, float] | None:
        """(spec hash, job id or None while the submit runs, when the key was claimed)."""
        with connect(self.db_path) as conn:
            row = conn.execute("SELECT spec_hash, job_id, created_at FROM launch_keys WHERE key = ?", (key,)).fetchone()
        return None if row is None else (row[0], row[1], float(row[2]))

    def claim(self, key: str, digest: str) -> bool:
        import sqlite3

        try:
            with connect(self.db_path) as conn:
                conn.execute(
                    "INSERT INTO launch_keys (key, spec_hash, job_id, created_at) VALUES (?, ?, NULL, ?)",
                    (key, digest, time.time()),
                )
            return True
        except sqlite3.IntegrityError:
            return False

    def bind(self, key: str, job_id: str) -> None:
        with connect(self.db_path) as conn:
            conn.execute("UPDATE launch_keys SET job_id = ? WHERE key = ?", (job_id, key))

    def release(self, key: str) -> None:
        with connect(self.db_path) as conn:
            conn.execute("DELETE FROM launch_keys WHERE key = ? AND job_id IS NULL", (key,))


SUMMARY_LAYOUT = "training-job/2"  # what `llm-infra-mcp approve` knows how to show field by field
SWEEP_SUMMARY_LAYOUT = "sweep/2"  # the same, with the sweep's runs and totals (server.sweep_summary)
# Options the summary shows in fields of their own; the others are where the job runs (placement).
SHOWN_APART = ("image", "pip_packages", "share_gpus")


def plan_summary(plan: "TrainingPlan") -> dict[str, Any]:
    """What a person approving this plan is shown (`llm-infra-mcp approve`, which escapes every value): every
    field that decides what runs and what it costs. Plain JSON values; `SUMMARY_LAYOUT` names the layout."""
    spec = plan.spec
    nnodes = int(spec.get("nnodes") or 1)
    options = spec.get("options") or {}
    placement = {k: v for k, v in options.items() if k not in SHOWN_APART and v not in (None, False, 0, "", [])}
    for field in ("namespace", "context", "server"):  # Kubernetes: what the kubeconfig decided
        value = getattr(plan.backend_plan, field, None)
        if isinstance(value, str) and value and field not in placement:
            placement[field] = value
    return {
        "layout": SUMMARY_LAYOUT,
        "backend": plan.backend,
        "recipe": plan.recipe,
        "script": plan.script_path,
        "image": options.get("image"),
        "nnodes": nnodes,
        "nproc_per_node": plan.nproc_per_node,
        "gpus_per_node": plan.gpus,
        "total_gpus": plan.gpus * nnodes,
        "max_wall_s": spec.get("max_wall_s"),
        "estimated_gpu_hours": plan.estimated_gpu_hours,
        "estimated_node_hours": plan.estimated_node_hours,
        "argv": list(plan.argv),
        "env": dict(spec.get("env") or {}),
        "pip_packages": list(options.get("pip_packages") or []),
        "workdir": plan.backend_spec.get("workdir"),
        "cwd": plan.cwd,
        "placement": placement,
        "max_restarts": spec.get("max_restarts"),
        "share_gpus": bool(options.get("share_gpus", False)),
        "name": spec.get("name"),
        "network": plan.network,
        "warnings": list(plan.warnings),
    }


def resolve_script(settings: Settings, spec: TrainingJobSpec) -> tuple[Path, str | None, str | None]:
    """(script path, recipe name, expected runtime text)."""
    if (spec.recipe is None) == (spec.script is None):
        raise InputError(
            "give exactly one of recipe (a bundled one, see list_recipes) or script (a file inside the allowed roots)"
        )
    if spec.recipe is not None:
        from servers.launch.recipes import RECIPES

        info = RECIPES.get(spec.recipe)
        if info is None:
            known = sorted([*RECIPES, *frameworks.FRAMEWORKS])
            raise InputError(f"unknown recipe {spec.recipe!r}; bundled recipes: {', '.join(known)}")
        return Path(info.path), info.name, f"CPU: {info.expected_time_cpu}; GPU: {info.expected_time_gpu}"
    assert spec.script is not None
    path = resolve_inside_roots(spec.script, settings.roots(), what="script")
    refusal = interpreter_area(path)
    if refusal is not None:
        raise InputError(
            f"script {spec.script!r} is {refusal}: a training script may not come from an installed Python, its "
            "site-packages or a virtual environment (any module there would run with the job's rights); put the "
            "script in a project folder inside the allowed roots"
        )
    if not path.is_file():
        raise InputError(f"script {spec.script!r} does not exist or is not a file (resolved to {path})")
    if path.suffix != ".py":
        raise InputError(f"script {path} is not a Python file (.py); torchrun runs Python scripts")
    return path, None, None


def interpreter_area(path: Path) -> str | None:
    """What `path` belongs to if it lies in a Python installation (prefixes, site-packages, a virtual
    environment: any folder above it holding pyvenv.cfg), else None."""
    import site
    import sysconfig

    areas = {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    areas.update(Path(p) for p in sysconfig.get_paths().values())
    with contextlib.suppress(AttributeError):
        areas.update(Path(p) for p in site.getsitepackages())
    with contextlib.suppress(AttributeError, TypeError):
        areas.add(Path(site.getusersitepackages()))
    for area in areas:
        with contextlib.suppress(OSError):
            resolved = area.resolve()
            if path == resolved or path.is_relative_to(resolved):
                return f"inside the Python installation {resolved}"
    for parent in path.parents:
        if (parent / "pyvenv.cfg").is_file():
            return f"inside the virtual environment {parent}"
        if parent.name in ("site-packages", "dist-packages"):
            return f"inside {parent}"
        if parent.name.startswith("python") and (parent / "os.py").is_file():
            return f"inside the standard library of a Python installation ({parent})"
    return None


def _default_backend() -> "Backend":
    from servers.launch.local import LocalBackend

    return LocalBackend()


def plan(
    settings: Settings,
    spec: TrainingJobSpec,
    *,
    gpus_present: int,
    gpus_in_use: int,
    backend: "Backend | None" = None,
) -> TrainingPlan:
    """Check everything and describe exactly what would run. No side effects beyond the signing key file."""
    framework = frameworks.for_spec(spec)  # verl, OpenRLHF: their own entry point, rendered and validated
    if framework is None:
        script, recipe, expected = resolve_script(settings, spec)
    else:
        script, recipe, expected = Path(framework.module), spec.recipe, None
    check_env(spec.env)
    info = registry.get(spec.backend)
    if spec.resume_from is not None and framework is not None:
        raise InputError(
            f"resume_from {spec.resume_from}: {spec.recipe} keeps its checkpoints its own way; accepted: a bundled "
            "recipe (list_recipes) or a script, which read LLM_INFRA_MCP_CHECKPOINT_DIR"
        )
    resume = resume_source(settings, spec, script, recipe) if spec.resume_from is not None else None
    try:  # again: a spec made with model_copy skipped its validators
        options = backend_options.validate(spec.backend, spec.options)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if spec.nnodes > 1 and not info.can("multi_node") and framework is None:  # a framework's template decides
        raise InputError(
            f"nnodes: {spec.nnodes} nodes; accepted: 1 on the {spec.backend} backend "
            f"(more on {', '.join(registry.with_capability('multi_node'))})"
        )
    remote = not info.can("in_engine")  # the cluster's machines, not this one: the engine places the ranks
    if framework is None:
        nproc, gpus, warnings = _ranks(spec, gpus_present, remote=remote, cluster_nodes=info.can("cluster_nodes"))
    else:
        nproc, gpus, warnings = framework.ranks(gpus_present, remote=remote)
    quotas = [
        f"max_job_wall_s {settings.max_job_wall_s:g} s",
        f"max_gpus_per_job {settings.max_gpus_per_job}",
        f"max_concurrent_gpus {settings.max_concurrent_gpus} ({gpus_in_use} in use)",
        f"max_concurrent_jobs {settings.max_concurrent_jobs}",
    ]
    admission.check_wall(settings, spec.max_wall_s)
    admission.check_gpus_per_job(settings, gpus)
    if not remote:
        admission.check_gpus_here(settings, gpus, gpus_in_use, shared=bool(options.get("share_gpus")))
    workdir = _workdir(settings, spec, script)
    from servers.launch.local import NETWORK_NOTES

    if not remote:  # the cluster's network otherwise: the backend's notes state the trust it assumes
        warnings += _isolation(settings, spec, workdir)
    if framework is None:
        checked, declared_run = recipe_checks(recipe, spec.args)
    else:
        checked, declared_run = [framework.validated, *framework.notes], framework.run_source
    normalised = spec.model_copy(update={"nproc_per_node": nproc, "gpus_per_node": gpus, "options": options})
    backend_spec = {
        "script": str(script),
        "args": list(spec.args),
        "nproc_per_node": nproc,
        "max_restarts": spec.max_restarts,
        "env": dict(spec.env),
        "gpus_wanted": gpus,
        "network": settings.job_network,
        "sandbox": settings.job_sandbox,
        "state_dir": str(settings.home),
        "workdir": str(workdir) if spec.workdir else None,
        "max_log_bytes": settings.max_log_bytes_per_job,
        "run_id": spec_hash(normalised),
        "max_wall_s": spec.max_wall_s,
        "gpus_per_node": gpus,
        "nnodes": spec.nnodes,
        "idempotency_key": spec.idempotency_key,
        "options": backend_options.full(spec.backend, options),
        "recipe": recipe,
        "name": spec.name,
        "tags": list(spec.tags),
    }
    if declared_run is not None:
        backend_spec[RUN_SOURCE_KEY] = declared_run
    if resume is not None:  # what the job's worker copies before the job starts (launch/local.py seed_checkpoints)
        backend_spec["resume_from"] = {"job_id": resume.job_id, "checkpoints": resume.checkpoints}
        checked.append(
            f"resumes from job {resume.job_id}: "
            + (
                f"its newest checkpoint (step {resume.newest_step})"
                if resume.newest_step is not None
                else "its checkpoints"
            )
            + f", {resume.files} file(s), {resume.bytes} bytes, copied into this job's checkpoints before it starts"
            + (f"; {len(resume.skipped)} skipped (not regular files)" if resume.skipped else "")
        )
    if framework is not None:  # python -m MODULE ARGS in place of torchrun SCRIPT ARGS
        backend_spec.update(module=framework.module, args=framework.args, env={**spec.env, **framework.env})
    try:
        backend_plan = (backend or _default_backend()).plan(backend_spec, settings)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    estimated = gpus * spec.nnodes * spec.max_wall_s / 3600
    node_hours = spec.nnodes * spec.max_wall_s / 3600
    warnings += info.warnings_for(backend_plan, backend_spec)
    if any(a.strip().startswith(("$(", "`")) or ";" in a or "&&" in a or "|" in a for a in spec.args):
        warnings.append("some args look like shell syntax: they reach the script as literal strings, no shell runs")
    digest = plan_digest(normalised, backend_plan)
    return TrainingPlan(
        plan_token=make_token(settings, normalised, digest),
        plan_hash=digest,
        spec=normalised.model_dump(mode="json"),
        backend=spec.backend,
        argv=backend_plan.argv,
        cwd=backend_plan.cwd,
        env=backend_plan.env,
        rendered=backend_plan.rendered,
        notes=[*backend_plan.notes, *checked],
        backend_spec=backend_spec,
        backend_plan=backend_plan,
        script_path=str(script),
        recipe=recipe,
        nproc_per_node=nproc,
        gpus=gpus,
        estimated_gpu_hours=estimated,
        estimated_node_hours=node_hours,
        expected_runtime=expected,
        needs_confirmation=confirmation_needed(
            settings, backend=spec.backend, gpus_per_node=gpus, gpu_hours=estimated, node_hours=node_hours
        ),
        plan_id=digest,
        network=(
            "network: the cluster's; the ranks' rendezvous store listens on the nodes' network without "
            "authentication, so every machine that reaches the nodes is trusted"
            if remote
            else NETWORK_NOTES[settings.job_network]
        ),
        quotas=quotas,
        warnings=warnings,
        resume=resume,
    )


def recipe_checks(recipe: str | None, args: list[str]) -> tuple[list[str], dict[str, str] | None]:
    """A bundled recipe's plan-time check of the job's args (its note for the plan; InputError with its refusal)
    and the run its framework writes, declared for the job's spec (servers/runs/jobs.py)."""
    if recipe is None:
        return [], None
    from servers.core.refs import resolve
    from servers.launch.recipes import RECIPES, check_recipe_args

    info = RECIPES[recipe]
    notes: list[str] = []
    try:  # the recipe's own parser (torch-free), bounds included: a bad value is refused before any job starts
        check_recipe_args(recipe, list(args))
    except ValueError as exc:
        raise InputError(f"args: {exc}") from None
    if info.plan_check is not None:
        try:
            notes.append(resolve(info.plan_check)(list(args)))
        except ValueError as exc:
            raise InputError(f"args: {exc}") from None
    declared = run_source(info.run_reader, info.run_path) if info.run_reader and info.run_path else None
    return notes, declared


def _ranks(
    spec: TrainingJobSpec, gpus_present: int, *, remote: bool, cluster_nodes: bool
) -> tuple[int, int, list[str]]:
    """(ranks per node, GPUs per node, warnings): this machine's GPUs and cores bound a local job; a cluster's
    engine places and limits the ranks of a remote one."""
    warnings: list[str] = []
    if remote:
        nproc = spec.nproc_per_node or 1
        gpus = spec.gpus_per_node or 0
    else:
        nproc = spec.nproc_per_node or max(1, gpus_present)
        gpus = spec.gpus_per_node if spec.gpus_per_node is not None else (nproc if gpus_present else 0)
    if remote:
        if gpus and nproc > gpus:
            raise InputError(f"nproc_per_node {nproc} is more than the {gpus} GPU(s) asked for: one rank per GPU")
    elif gpus > gpus_present:
        raise InputError(f"the job asks for {gpus} GPU(s) but this machine has {gpus_present}")
    if cluster_nodes:
        pass  # the cluster's nodes, never this machine: its GPUs and cores say nothing of them
    elif gpus_present == 0:
        cap = max(2, os.cpu_count() or 1)
        if nproc > cap:
            raise InputError(
                f"nproc_per_node {nproc} is more than this machine runs without GPUs: at most {cap} (CPU cores)"
            )
        warnings.append("no GPU here: ranks run on CPU with gloo")
    elif nproc > gpus and gpus > 0:
        raise InputError(f"nproc_per_node {nproc} is more than the {gpus} GPU(s) given to the job: one rank per GPU")
    return nproc, gpus, warnings


def _workdir(settings: Settings, spec: TrainingJobSpec, script: Path) -> Path | None:
    """The job's workdir resolved inside the roots (None when not given), and the script, both outside the state
    directory."""
    workdir = resolve_inside_roots(spec.workdir, settings.roots(), what="workdir") if spec.workdir else None
    if workdir is not None and (why := state_dir_refusal(settings, workdir)):
        raise InputError(
            f"workdir: {spec.workdir!r} {why} (it would be the job's working directory, and ray and skypilot upload "
            "it); accepted: a folder inside the roots that neither is nor contains the state directory "
            f"({settings.home})"
        )
    if workdir is not None and not workdir.is_dir():
        raise InputError(f"workdir {spec.workdir!r} is not a directory")
    if why := state_dir_refusal(settings, script):  # the database, launch.key, the cache: never a script
        raise InputError(
            f"script: {str(script)!r} {why} (which a local job's sandbox hides and a cluster backend would copy "
            f"from); accepted: a script inside the roots and outside {settings.home}"
        )
    return workdir


def _isolation(settings: Settings, spec: TrainingJobSpec, workdir: Path | None) -> list[str]:
    """A job on this machine: the sandbox and the network namespace it needs, probed (InputError when missing);
    the warnings of the settings that weaken them."""
    from servers.launch.local import NETWORK_NOTES, SANDBOX_NOTES

    warnings: list[str] = []
    if settings.job_sandbox == "on":
        from servers.core.sandbox import code_folders
        from servers.core.sandbox import probe as sandbox_probe

        if workdir is not None and (code := next((c for c in code_folders() if workdir.is_relative_to(c)), None)):
            raise InputError(
                f"workdir: {spec.workdir!r} lies in {code}, this package's folder or the Python installation, which "
                "a job may read but never write (the next server start would run what it planted); accepted: a "
                "folder inside the roots and outside those"
            )
        found = sandbox_probe(settings.job_network)
        if not found.available:
            raise InputError(
                f"this machine cannot sandbox the job ({found.detail}); without the sandbox the job's script could "
                "write the state database (approvals, job records), the launch key and the tool cache. To run "
                "jobs with the server's full access anyway (trusted scripts only), the person sets "
                "LLM_INFRA_MCP_JOB_SANDBOX=off"
            )
        if settings.job_network == "host":
            warnings.append(NETWORK_NOTES["host"])
    elif settings.job_network == "isolated":
        from servers.core.netns import probe

        found = probe()
        if not found.available:
            raise InputError(
                f"this machine cannot give the job a private network namespace ({found.detail}); without one, "
                "torchrun's rendezvous store listens on every interface with no authentication and runs code "
                "sent to it. To run in the host's network anyway (a trusted network only), the person sets "
                "LLM_INFRA_MCP_JOB_NETWORK=host"
            )
    else:
        warnings.append(NETWORK_NOTES["host"])
    if settings.job_sandbox == "off":
        warnings.append(SANDBOX_NOTES["off"])
    return warnings
