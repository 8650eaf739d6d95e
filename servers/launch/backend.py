"""The protocol every launch backend implements: local torchrun now; Slurm, Kubernetes and SkyPilot later.

A backend is an adapter between a validated training spec and one engine. Its five steps:

- ``available()``: whether the engine is usable here, and what was found or is missing. Cheap, starts nothing.
- ``plan(spec, settings)``: what would run, exactly, with NO side effects (no files, no processes, no network):
  the argv or the rendered batch script/manifest, the environment additions, the working directory, the
  resources. The server shows the plan for confirmation, and the launch is bound to it.
- ``submit(plan, request)``: start exactly that plan, recording ``request.key`` with the job. Idempotency is the
  launch server's, one table for every backend (training.IdempotencyKeys); ``find(key)`` recovers a job whose
  submit was not recorded there (the server died in between).
- ``poll(handle)``: the engine's state mapped onto the job engine's seven states (``JobState``).
- ``cancel(handle)``: stop it; idempotent. ``logs(handle, ...)``: text of one process's log.

Engines' own states map onto ``JobState`` with ``map_state`` and a per-engine table, e.g. Slurm
PENDING -> QUEUED, CONFIGURING -> STARTING, COMPLETED -> SUCCEEDED, TIMEOUT/OUT_OF_MEMORY -> FAILED,
CANCELLED -> CANCELLED; anything unknown maps to LOST rather than being guessed.

Plain module (pydantic and the standard library only): the server imports it at start-up.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from servers.core.jobstore import JobState
from servers.core.models import Model
from servers.core.settings import Settings

# The placeholder a plan made before its job folder exists uses for that folder; binding replaces it.
JOB_DIR_PLACEHOLDER = "$JOB_DIR"
# The placeholder for the GPUs a job is given when it is admitted (comma-separated indices); binding replaces it.
GPUS_PLACEHOLDER = "$ASSIGNED_GPUS"


class BackendPlan(Model):
    """What a backend would run, exactly. Built without side effects; submit runs this and nothing else."""

    backend: str = Field(description="The backend that made the plan, e.g. 'local'")
    argv: list[str] = Field(description="The command, one argument per item; never run through a shell")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables added for the command")
    cwd: str = Field(description="Working directory of the command")
    gpus: list[int] | None = Field(default=None, description="GPU indices given to the job; None: none assigned")
    nnodes: int = Field(default=1, ge=1, description="Nodes the job spans")
    nproc_per_node: int = Field(default=1, ge=1, description="Processes (ranks) per node")
    rendered: str | None = Field(
        default=None, description="A rendered batch script or manifest (Slurm, Kubernetes, SkyPilot); None locally"
    )
    notes: list[str] = Field(default_factory=list, description="What a person should know before confirming")

    gpus_wanted: int = Field(default=0, ge=0, description="GPUs per node the job is given when it is admitted")

    def bind(self, job_dir: Path | str, gpus: list[int] | None = None) -> "BackendPlan":
        """The plan with the placeholders replaced: the job folder (once the job exists) and, when given, the GPUs
        assigned at admission."""
        folder = str(job_dir)
        assigned = ",".join(str(g) for g in gpus) if gpus is not None else None

        def sub(text: str) -> str:
            text = text.replace(JOB_DIR_PLACEHOLDER, folder)
            return text if assigned is None else text.replace(GPUS_PLACEHOLDER, assigned)

        return self.model_copy(
            update={
                "gpus": list(gpus) if gpus is not None else self.gpus,
                "argv": [sub(a) for a in self.argv],
                "env": {k: sub(v) for k, v in self.env.items()},
                "cwd": sub(self.cwd),
                "rendered": sub(self.rendered) if self.rendered is not None else None,
                "notes": [sub(n) for n in self.notes],
            }
        )


class SubmitRequest(Model):
    """What submit needs besides the plan: the idempotency key, the spec to store, the wall-time limit."""

    key: str = Field(min_length=1, max_length=200, description="Idempotency key: same key, same job")
    spec: dict[str, Any] = Field(description="The validated spec the plan was made from")
    timeout_s: float | None = Field(default=None, gt=0, description="Wall-time limit; None: the kind's default")


class BackendHandle(Model):
    """How a backend finds a submitted job again (also after a server restart)."""

    backend: str
    key: str = Field(description="The idempotency key it was submitted with")
    native_id: str = Field(description="The engine's id: a job id locally, a Slurm job id, a TrainJob name...")
    job_dir: str | None = Field(
        default=None, description="The job folder (logs, metrics, the exit record the job writes), when it has one"
    )


class EngineStatus(Model):
    """What an engine says of a job, mapped onto the job engine's states, with what a person needs to know."""

    state: JobState
    native_state: str | None = Field(default=None, description="The engine's own state name, e.g. PENDING, TIMEOUT")
    reason: str | None = Field(
        default=None, description="Why it waits (e.g. Slurm's Resources, Priority) or how it ended, in words"
    )
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    restarts: int = Field(default=0, description="Times the engine requeued or restarted it")


@runtime_checkable
class Backend(Protocol):
    """One launch engine. See the module docstring for the contract of each method."""

    name: str

    def available(self) -> tuple[bool, str]:
        """(usable here, what was found or what is missing). Cheap; starts nothing."""
        ...

    def plan(self, spec: Mapping[str, Any], settings: Settings | None = None) -> BackendPlan:
        """The exact command for a validated spec. No side effects."""
        ...

    def submit(self, plan: BackendPlan, request: SubmitRequest) -> BackendHandle:
        """Start exactly this plan, recording request.key with the job (so `find` recovers it)."""
        ...

    def find(self, key: str) -> BackendHandle | None:
        """The job submitted with this key, if the engine has one: what recovers a submit whose server died
        between starting the job and recording it (the launch server keeps the one idempotency table)."""
        ...

    def poll(self, handle: BackendHandle) -> JobState:
        """The job's state, mapped onto the engine's seven states."""
        ...

    def status(self, handle: BackendHandle) -> EngineStatus:
        """The job's state with the engine's own words: the pending reason, the exit code, how it ended. Exact
        also after the engine forgot the job (an exit record the job wrote itself), never guessed: a job the
        engine no longer knows and that left no record is LOST, never SUCCEEDED."""
        ...

    def cancel(self, handle: BackendHandle) -> JobState:
        """Stop the job (idempotent); returns the state after the attempt."""
        ...

    def logs(self, handle: BackendHandle, process: str = "rank0", *, offset: int = 0, max_bytes: int = 65536) -> str:
        """Text of one process's log from byte `offset`, at most `max_bytes`."""
        ...


def map_state(table: Mapping[str, JobState], native: str) -> JobState:
    """An engine's state name mapped with `table` (case-insensitive); unknown names become LOST."""
    return table.get(native.strip().upper(), JobState.LOST)
