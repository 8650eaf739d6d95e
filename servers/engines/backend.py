"""The protocol every launch backend implements, and the models it speaks (plain: pydantic and the standard library).

A backend is an adapter between a validated training spec and one engine. What the servers call, and nothing else:

- ``available()``: whether the engine is usable here, and what was found or is missing. Cheap, starts nothing
  (list_backends asks it through the registry's detection).
- ``plan(spec, settings)``: what would run, exactly, with NO side effects (no files, no processes, no network):
  the argv or the rendered batch script/manifest, the environment additions, the working directory, the
  resources. The server shows the plan for confirmation, and the launch is bound to it.
- ``submit(plan, request)``: start exactly that plan, recording ``request.key`` with the job, idempotently: a second
  submit of one key (a restarted follower) finds the job the first one started. The idempotency table is the launch
  server's, one for every backend (training.IdempotencyKeys); a key whose bind was lost is recovered from the job
  engine's records, where every backend's job is (launch/server.py existing_job).
- ``status(handle)``: the engine's state mapped onto the job engine's seven states (``JobState``), with the engine's
  own words; what a follower (engines/follow.py) asks until the job ends.
- ``cancel(handle)``: stop it; idempotent.

What only some engines can do is a sub-protocol, tied to the capability the backend declares in its BackendInfo
(engines/registry.py), never found by getattr or isinstance:

- ``log_sync`` -> ``LogSyncBackend.sync_logs``: the ranks' logs live on the engine and are copied into the job
  folder while the job is followed (read_job_logs serves the job folder, for every backend);
- ``arrays`` -> ``ArrayBackend``: a sweep planned and submitted as one job array, each run finding its task's
  submit record.

Engines' own states map onto ``JobState`` with ``map_state`` and a per-engine table, e.g. Slurm
PENDING -> QUEUED, CONFIGURING -> STARTING, COMPLETED -> SUCCEEDED, TIMEOUT/OUT_OF_MEMORY -> FAILED,
CANCELLED -> CANCELLED; anything unknown maps to LOST rather than being guessed.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import Field

from servers.core.jobstore import JobState
from servers.core.models import Model

if TYPE_CHECKING:
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


class BackendStatus(Model):
    # What list_backends says of one engine on this machine (no docstring: it would enter the published schema).
    name: str
    detected: bool = Field(description="Whether what this engine needs is present on this machine")
    detail: str = Field(description="What was found, or what is missing")
    launch_supported: bool = Field(description="Whether this server version can launch jobs on it")
    launch_note: str | None = None


@dataclass
class ArrayRun:
    """One run of a job array: its plan (the backend's own), its idempotency key and its own job folder."""

    plan: BackendPlan
    key: str
    job_dir: Path | str


@runtime_checkable
class Backend(Protocol):
    """One launch engine. See the module docstring for the contract of each method."""

    name: str

    def available(self) -> tuple[bool, str]:
        """(usable here, what was found or what is missing). Cheap; starts nothing."""
        ...

    def plan(self, spec: Mapping[str, Any], settings: "Settings | None" = None) -> BackendPlan:
        """The exact command for a validated spec. No side effects."""
        ...

    def submit(self, plan: BackendPlan, request: SubmitRequest) -> BackendHandle:
        """Start exactly this plan, recording request.key with the job; a second submit of the key finds that job."""
        ...

    def status(self, handle: BackendHandle) -> EngineStatus:
        """The job's state with the engine's own words: the pending reason, the exit code, how it ended. Exact
        also after the engine forgot the job (an exit record the job wrote itself), never guessed: a job the
        engine no longer knows and that left no record is LOST, never SUCCEEDED."""
        ...

    def cancel(self, handle: BackendHandle) -> JobState:
        """Stop the job (idempotent); returns the state after the attempt."""
        ...


@runtime_checkable
class LogSyncBackend(Backend, Protocol):
    """Capability ``log_sync``: the ranks' logs live on the engine (Kubernetes pods)."""

    def sync_logs(self, handle: BackendHandle, job_dir: Path | str, *, final: bool = False) -> None:
        """Copy what is new of the job's logs into the job folder (bounded); `final`: the job ended, copy the rest."""
        ...


@runtime_checkable
class ArrayBackend(Backend, Protocol):
    """Capability ``arrays``: a sweep as one job array (Slurm)."""

    job_root: Path  # where the array's own folder (job_root/<sweep key>) is made

    def plan_array(self, runs: Sequence[tuple[Path | str, str]], *, sweep_key: str, sweep_dir: Path | str) -> str:
        """The array's script for (run folder, that run's rendered plan) pairs. No side effects; ValueError naming
        why the runs cannot be one array."""
        ...

    def submit_array(self, runs: Sequence[ArrayRun], *, sweep_key: str, sweep_dir: Path | str) -> list[BackendHandle]:
        """One submission for every run (idempotent by `sweep_key`): a handle per run, in order."""
        ...

    def find_recorded(self, key: str, job_dir: Path | str) -> BackendHandle | None:
        """The job of `key` by the submit record in its folder alone (no engine command): what a run of an array
        waits for while the array is being submitted."""
        ...


def map_state(table: Mapping[str, JobState], native: str) -> JobState:
    """An engine's state name mapped with `table` (case-insensitive); unknown names become LOST."""
    return table.get(native.strip().upper(), JobState.LOST)
