"""The job engine: every piece of long work (training, benchmark sweeps, probes) runs as a job.

The engine knows nothing of training or benchmarks. A job kind names a work function by "module:function";
the engine stores the job (SQLite, the source of truth), starts a supervisor process for it in a session
of its own, and answers questions about it. Jobs outlive the server: a server started later reconciles
them, tracking those still running (by pid and start time) and marking LOST those whose processes vanished
without recording an exit.

What the engine believes, in order: the database row, which the supervisor writes; while the supervisor lives
(pid and start time), nothing else. Files in the job folder are written by code the engine does not control (the
work runs there), so they are read only once the supervisor is gone, and validated: exit.json (the supervisor's
own record of the end, written just before the row), then the worker's result.json or error.json.
"""

import contextlib
import json
import logging
import math
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from servers.core.db import notices, record_event
from servers.core.errors import InputError, NotFoundError, QuotaError
from servers.core.jobfiles import BadJobFileError, JobFiles, atomic_write_json, load_json, worker_error
from servers.core.jobstore import ACTIVE_STATES, JobPage, JobRecord, JobState, JobStore
from servers.core.models import Model
from servers.core.procs import (
    ProcessIdentity,
    boot_id,
    child_command,
    group_alive,
    group_members,
    process_start_time,
    terminate_group,
)
from servers.core.settings import Settings

JOB_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,95}$"
MAX_FOLLOWERS = 5  # times a resumable job is taken up again after its processes here were lost
# A job row written but whose supervisor never recorded a pid: give the starting server this long.
_SPAWN_GRACE_S = 30.0
# How long a cancel waits for a supervisor that has not yet installed its signal handlers.
_READY_WAIT_S = 20.0
_SMALL_FILE = 1024 * 1024

log = logging.getLogger(__name__)

Admit = Callable[[list[JobRecord]], dict[str, Any]]


@dataclass(frozen=True)
class JobKind:
    """A kind of long work: its name, the work function ("module:function"), and its default time limit."""

    name: str
    entry: str
    description: str
    default_timeout_s: float = 3600.0
    # Work whose processes talk to each other through a torch.distributed store (an unauthenticated TCPStore that
    # listens on every interface) runs in a network namespace of its own with only loopback, unless the person
    # chose the host's network (LLM_INFRA_MCP_JOB_NETWORK=host). See servers/core/netns.py.
    isolated_network: bool = False
    # Work that only follows something running elsewhere (a cluster's job): if its processes here are lost, a new
    # supervisor takes it up again (the work must find what it started, e.g. by an idempotent keyed submit).
    resumable: bool = False
    # Work that follows a job of another engine (a cluster's): the job's state is that engine's, as the work reports
    # it (JobContext.report_state): QUEUED while the engine holds it pending, RUNNING only once the engine runs it.
    # Its start, and so its run time and wall-time limit, is the engine's start, not the follower's.
    follows_engine: bool = False
    # How often a client following a job of this kind should ask about it (the tasks extension's pollIntervalMs):
    # about as often as the job has news. None: the default of servers.core.tasks.
    poll_s: float | None = None
    # For a kind whose interval depends on the job (a cluster job: its backend's): a function of the job's spec
    # giving the seconds, or None to use poll_s.
    poll_s_of: Callable[[Mapping[str, Any]], float | None] | None = None
    # What a listing (list_jobs) shows of a job: a function of its spec giving a mapping with "backend" (where it
    # runs) and "name"; None: the spec's own "backend" and "name".
    listed: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None

    def poll_interval(self, spec: Mapping[str, Any]) -> float | None:
        """The seconds between two looks at a job of this kind with this spec; None when the kind says nothing.
        A poll_s_of that fails or answers nonsense counts as saying nothing about that job."""
        if self.poll_s_of is not None:
            try:
                seconds = self.poll_s_of(spec)
            except Exception:
                log.exception("job kind %s: poll_s_of failed; using its poll_s", self.name)
                seconds = None
            if _positive(seconds):
                return float(seconds)  # type: ignore[arg-type]
        return float(self.poll_s) if _positive(self.poll_s) else None


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


Number = Annotated[float, BeforeValidator(_number)]
Text = Annotated[StrictStr, BeforeValidator(lambda v: v[:4000] if isinstance(v, str) else v)]


class ExitRecord(Model):
    """exit.json, as the supervisor writes it; anything else in its place is not believed."""

    model_config = ConfigDict(extra="ignore")

    state: JobState
    exit_code: StrictInt | None = None
    reason: Text | None = None
    ended_at: Number | None = None

    @field_validator("state")
    @classmethod
    def _final(cls, state: JobState) -> JobState:
        if not state.terminal:
            raise ValueError(f"{state.value} is not a final state")
        return state


class Descriptor(Model):
    """job.json, read back when a job's row has to be rebuilt from its folder."""

    model_config = ConfigDict(extra="ignore")

    id: Annotated[StrictStr, Field(pattern=JOB_ID_PATTERN)]
    kind: StrictStr
    spec: dict[str, Any]
    timeout_s: Number
    created_at: Number
    owner: StrictStr = "unknown"
    follows_engine: bool = False


class Identity(Model):
    """supervisor.json: the supervisor's own pid and start time, and its worker's."""

    model_config = ConfigDict(extra="ignore")

    pid: StrictInt
    start_time: StrictInt | None = None
    boot_id: StrictStr = ""
    worker_pid: StrictInt | None = None
    worker_start: StrictInt | None = None
    started_at: Number | None = None


def read_exit_record(files: JobFiles) -> tuple[ExitRecord | None, str | None]:
    """(the validated exit record or None, what was wrong with the file if it was there but not valid)."""
    try:
        data = load_json(files.exit, _SMALL_FILE)
        return ExitRecord.model_validate(data), None
    except FileNotFoundError:
        return None, None
    except (OSError, BadJobFileError) as exc:
        return None, f"exit.json is not usable: {exc}"
    except (ValidationError, ValueError) as exc:
        return None, f"exit.json is not a valid exit record: {_first_error(exc)}"


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    return str(exc)[:300]


def private_folder(folder: Path) -> None:
    """Make `folder` (the state directory) this user's alone: other local users must not read the database, the job
    folders or the logs. Created 0700; an existing folder of this user that others may enter is tightened (logged)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = folder.stat()
    if info.st_uid == os.geteuid() and info.st_mode & 0o077:
        os.chmod(folder, info.st_mode & 0o700)
        log.warning(
            "the state directory %s was open to other users (mode %o); it is now 0700", folder, info.st_mode & 0o777
        )


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


class JobEngine:
    def __init__(self, settings: Settings, *, owner: str, child_env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.owner = owner
        self.kinds: dict[str, JobKind] = {}
        self._child_env = child_env or {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        private_folder(settings.home)
        settings.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.store = JobStore(settings.db_path)
        self.import_missing()

    # ---- kinds -------------------------------------------------------------------------------------
    def register_kind(self, kind: JobKind) -> None:
        existing = self.kinds.get(kind.name)
        if existing is not None and existing != kind:
            raise ValueError(f"job kind {kind.name!r} is already registered with another entry")
        self.kinds[kind.name] = kind

    # ---- submit ------------------------------------------------------------------------------------
    def submit(
        self, kind: str, spec: dict[str, Any], *, timeout_s: float | None = None, admit: Admit | None = None
    ) -> JobRecord:
        """Store a job and start its supervisor. Returns at once; the work runs in the background.

        Admission is one write transaction of the database, so that concurrent submits (threads, or servers
        sharing the state directory) never admit more than max_concurrent_jobs: the jobs in active states are
        counted and the row inserted together. `admit`, if given, runs inside that transaction with the active
        jobs' records and returns the spec to store (e.g. with GPUs assigned); if it raises (InputError,
        QuotaError), nothing is written and the exception propagates. Keep it quick: it holds the write lock.
        """
        job_kind = self.kinds.get(kind)
        if job_kind is None:
            raise InputError(f"unknown job kind {kind!r}; this server runs: {', '.join(sorted(self.kinds)) or 'none'}")
        limit = self.settings.max_job_wall_s
        timeout = job_kind.default_timeout_s if timeout_s is None else timeout_s
        if not 0 < timeout <= limit:
            raise InputError(
                f"timeout_s must be in (0, {limit:g}] seconds (LLM_INFRA_MCP_MAX_JOB_WALL_S), got {timeout:g}"
            )
        network = self._network(job_kind)
        self.reconcile_all()  # outside the transaction: it reads /proc and may record ends

        job_id = self._new_id(kind)
        files = JobFiles(self.settings.jobs_dir / job_id)
        created = time.time()
        max_jobs = self.settings.max_concurrent_jobs

        def build(active: list[JobRecord]) -> JobRecord:
            if len(active) >= max_jobs:
                raise QuotaError(
                    f"{len(active)} jobs are active and at most {max_jobs} may run at once "
                    "(LLM_INFRA_MCP_MAX_CONCURRENT_JOBS); wait for one to end (wait_for_job) or cancel one "
                    "(cancel_job)"
                )
            stored = spec if admit is None else admit(active)
            if not isinstance(stored, dict):
                raise TypeError(f"admit must return the spec to store (a dict), not {type(stored).__name__}")
            return JobRecord(
                id=job_id,
                kind=kind,
                spec=stored,
                state=JobState.QUEUED,
                created_at=created,
                timeout_s=timeout,
                owner=self.owner,
                job_dir=str(files.dir),
            )

        record = self.store.admit(build)
        # The folder (job.json last) only after the row: a folder with a job.json but no row is a lost row.
        try:
            files.logs_dir.mkdir(parents=True)
            files.run_dir.mkdir()
            atomic_write_json(
                files.descriptor,
                {
                    "id": job_id,
                    "kind": kind,
                    "entry": job_kind.entry,
                    "network": network,
                    "follows_engine": job_kind.follows_engine,
                    "spec": record.spec,
                    "timeout_s": timeout,
                    "created_at": created,
                    "owner": self.owner,
                },
            )
            child = self._spawn_supervisor(files)
        except OSError as exc:
            self.store.update(
                job_id,
                only_if_active=True,
                state=JobState.FAILED,
                ended_at=time.time(),
                reason=f"could not prepare the job folder or start the job's supervisor: {exc}",
            )
            return self._must_get(job_id)
        self._children[job_id] = child
        # The supervisor may already have recorded more (RUNNING, or an end): never move its state back.
        self.store.update(
            job_id,
            only_if_active=True,
            supervisor_pid=child.pid,
            supervisor_start=process_start_time(child.pid),
            boot_id=boot_id(),
        )
        if not job_kind.follows_engine:  # a followed job's supervisor and worker say what its engine says
            self.store.update(job_id, only_in=frozenset({JobState.QUEUED}), state=JobState.STARTING)
        return self._must_get(job_id)

    def _spawn_supervisor(self, files: JobFiles) -> "subprocess.Popen[bytes]":
        with open(files.log("supervisor"), "ab") as supervisor_log:
            return subprocess.Popen(
                child_command(
                    "servers.core.supervisor",
                    str(files.dir),
                    str(self.settings.db_path),
                    str(self.settings.cancel_grace_s),
                ),
                stdin=subprocess.DEVNULL,
                stdout=supervisor_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not in the server's group: a signal to the server spares the job
                cwd=files.dir,
                env={**os.environ, **self._child_env},
            )

    def _follow_again(self, record: JobRecord, files: JobFiles) -> bool:
        """Start a new supervisor for a resumable job whose processes here were lost (at most MAX_FOLLOWERS
        times); False when it may not or cannot be."""
        marker = files.dir / "followers.json"
        try:
            count = int(json.loads(marker.read_text()).get("count", 0))
        except (OSError, ValueError, AttributeError, TypeError):
            count = 0
        if count >= MAX_FOLLOWERS:
            return False
        try:
            atomic_write_json(marker, {"count": count + 1, "at": time.time()})
            child = self._spawn_supervisor(files)
        except OSError:
            return False
        self._children[record.id] = child
        lost = f"supervisor pid {record.supervisor_pid}, worker pid {record.worker_pid}"
        self.store.update(
            record.id,
            only_if_active=True,
            supervisor_pid=child.pid,
            supervisor_start=process_start_time(child.pid),
            worker_pid=None,
            worker_start=None,
            supervisor_ready=False,
            boot_id=boot_id(),
            reason=f"its processes here were lost ({lost}); a new supervisor follows the work again "
            f"(time {count + 1} of at most {MAX_FOLLOWERS})",
        )
        return True

    def _network(self, kind: JobKind) -> str:
        """'isolated' (the worker enters a private network namespace) or 'host'; refuses when isolation is due
        and this machine cannot provide it."""
        if not kind.isolated_network or self.settings.job_network == "host":
            return "host"
        from servers.core.netns import probe

        found = probe()
        if not found.available:
            raise InputError(
                f"this machine cannot give the job a private network namespace ({found.detail}); without one its "
                "torch.distributed store listens on every interface with no authentication. To run in the host's "
                "network anyway (a trusted network only), the person sets LLM_INFRA_MCP_JOB_NETWORK=host"
            )
        return "isolated"

    @staticmethod
    def _new_id(kind: str) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        safe_kind = "".join(c if c.isalnum() or c in "_-" else "_" for c in kind.lower())[:40]
        return f"{safe_kind}-{stamp}-{secrets.token_hex(3)}"

    # ---- read --------------------------------------------------------------------------------------
    def _must_get(self, job_id: str) -> JobRecord:
        record = self.store.get(job_id)
        if record is None:
            record = self._import_one(job_id)
        if record is None:
            raise NotFoundError(f"no job with id {job_id!r}; list_jobs shows the existing ones")
        return record

    def get(self, job_id: str) -> JobRecord:
        """The job, its state brought up to date with its processes."""
        return self.refresh(self._must_get(job_id))

    def list_jobs(
        self,
        *,
        kind: str | None = None,
        state: JobState | None = None,
        limit: int = 20,
        offset: int = 0,
        sweep_id: str | None = None,
    ) -> JobPage:
        self.reconcile_all()
        return self.store.list_jobs(
            kind=kind, states=[state] if state else None, limit=limit, offset=offset, sweep_id=sweep_id
        )

    def files(self, record: JobRecord) -> JobFiles:
        return JobFiles(record.job_dir)

    def notices(self) -> list[str]:
        """What happened to the state database that the tools should tell (moved aside, jobs re-imported)."""
        return notices(self.settings.db_path)

    # ---- rebuilding lost rows ----------------------------------------------------------------------
    def import_missing(self) -> list[str]:
        """Put back jobs that have a folder (with job.json) but no row: the database was replaced (moved aside as
        damaged, truncated, restored from an old copy). Each becomes terminal if its folder holds an exit record,
        is tracked if its supervisor or worker still runs, and otherwise ends as its files say (result.json,
        error.json) or LOST. Returns the ids imported."""
        try:
            folders = sorted(p for p in self.settings.jobs_dir.iterdir() if p.is_dir() and not p.is_symlink())
        except OSError:
            return []
        known = self.store.ids()
        imported: list[str] = []
        unreadable: list[str] = []
        for folder in folders:
            if folder.name in known:
                continue
            try:
                record = self._record_from_folder(JobFiles(folder))
            except FileNotFoundError:
                continue  # no job.json: not a job folder, or one whose job is being created right now
            except (OSError, BadJobFileError, ValidationError) as exc:
                unreadable.append(f"{folder.name} ({_first_error(exc)})")
                continue
            if self.store.insert(record, or_ignore=True):
                imported.append(record.id)
        if imported or unreadable:
            message = ""
            if imported:
                shown = ", ".join(imported[:10]) + (f" and {len(imported) - 10} more" if len(imported) > 10 else "")
                message = (
                    f"{len(imported)} job(s) had a folder in {self.settings.jobs_dir} but no row in the state "
                    f"database (it was replaced, truncated or moved aside) and were re-imported from their folders: "
                    f"{shown}"
                )
            if unreadable:
                message += ("; " if message else "") + (
                    f"{len(unreadable)} job folder(s) could not be read and were left out: " + ", ".join(unreadable[:5])
                )
            log.warning("%s", message)
            with contextlib.suppress(Exception):
                record_event(self.settings.db_path, "reimported", message)
        for job_id in imported:
            with contextlib.suppress(NotFoundError):
                self.get(job_id)
        return imported

    def _import_one(self, job_id: str) -> JobRecord | None:
        """A job asked for by id with no row: its folder, if it has one, is imported (the database was replaced
        while this server ran)."""
        if not isinstance(job_id, str) or not job_id or "/" in job_id or job_id.startswith("."):
            return None
        folder = self.settings.jobs_dir / job_id
        if not folder.is_dir() or folder.is_symlink():
            return None
        try:
            record = self._record_from_folder(JobFiles(folder))
        except (OSError, BadJobFileError, ValidationError):
            return None
        self.store.insert(record, or_ignore=True)
        return self.store.get(job_id)

    def _record_from_folder(self, files: JobFiles) -> JobRecord:
        descriptor = Descriptor.model_validate(load_json(files.descriptor, _SMALL_FILE))
        if descriptor.id != files.dir.name:
            raise BadJobFileError(f"job.json names job {descriptor.id!r}, not the folder's {files.dir.name!r}")
        note = "re-imported from its folder (its row in the state database was lost)"
        record = JobRecord(
            id=descriptor.id,
            kind=descriptor.kind,
            spec=descriptor.spec,
            state=JobState.STARTING,
            created_at=descriptor.created_at,
            timeout_s=descriptor.timeout_s,
            owner=descriptor.owner,
            job_dir=str(files.dir),
            reason=note,
        )
        exit_record, exit_problem = read_exit_record(files)
        if exit_record is not None:
            return record.model_copy(
                update={
                    "state": exit_record.state,
                    "exit_code": exit_record.exit_code,
                    "ended_at": exit_record.ended_at or time.time(),
                    "reason": f"{note}; {exit_record.reason}" if exit_record.reason else note,
                }
            )
        identity = self._live_identity(files)
        if identity is not None:
            if descriptor.follows_engine:  # its engine's state is not known here; its follower reports the next one
                note += "; the state of the engine it follows is shown once its follower next reports it"
                return record.model_copy(
                    update={**identity, "started_at": None, "reason": note, "supervisor_ready": True}
                )
            return record.model_copy(update={**identity, "state": JobState.RUNNING, "supervisor_ready": True})
        state, exit_code, reason = self._vanished_outcome(record, files, exit_problem, note)
        return record.model_copy(
            update={"state": state, "exit_code": exit_code, "reason": reason, "ended_at": time.time()}
        )

    @staticmethod
    def _live_identity(files: JobFiles) -> dict[str, Any] | None:
        """Process fields for a re-imported job from supervisor.json, keeping only processes that still run and
        are this job's (start time, and a command line naming the engine's module and this folder)."""
        try:
            identity = Identity.model_validate(load_json(files.supervisor_identity, _SMALL_FILE))
        except (OSError, BadJobFileError, ValidationError):
            return None
        folder = str(files.dir)

        def ours(pid: int | None, start: int | None, module: str) -> bool:
            if pid is None or pid <= 0:
                return False
            if not ProcessIdentity(pid=pid, start_time=start, boot=identity.boot_id).is_alive():
                return False
            argv = _cmdline(pid)
            return any(module in a for a in argv) and folder in argv

        fields: dict[str, Any] = {"boot_id": identity.boot_id, "started_at": identity.started_at}
        supervisor = ours(identity.pid, identity.start_time, "servers.core.supervisor")
        worker = ours(identity.worker_pid, identity.worker_start, "servers.core.worker")
        if not supervisor and not worker:
            return None
        if supervisor:
            fields.update(supervisor_pid=identity.pid, supervisor_start=identity.start_time)
        else:  # a pid no longer ours: record one that cannot match a live process
            fields.update(supervisor_pid=identity.pid, supervisor_start=-1)
        if worker:
            fields.update(worker_pid=identity.worker_pid, worker_start=identity.worker_start)
        return fields

    # ---- reconcile ---------------------------------------------------------------------------------
    def reconcile_all(self) -> list[JobRecord]:
        """Bring every active job up to date; returns those still active."""
        return [r for r in (self.refresh(r) for r in self.store.active()) if r.state in ACTIVE_STATES]

    def refresh(self, record: JobRecord) -> JobRecord:
        if record.state not in ACTIVE_STATES:
            return record
        child = self._children.get(record.id)
        if child is not None and child.poll() is not None:  # reap our own supervisor once it ends
            self._children.pop(record.id, None)
        if record.supervisor_pid is None:
            if time.time() - record.created_at > _SPAWN_GRACE_S:
                cancelled = record.cancel_requested
                self.store.update(
                    record.id,
                    only_if_active=True,
                    state=JobState.CANCELLED if cancelled else JobState.LOST,
                    ended_at=time.time(),
                    reason=("cancelled before it started; " if cancelled else "never started: ")
                    + "the server that created it stopped before starting its supervisor",
                )
                return self._must_get(record.id)
            return record
        if self._identity(record, "supervisor").is_alive():
            return record  # while the supervisor lives, its row is the truth; the job folder's files are not read
        # The supervisor is gone. It may have recorded the end a moment ago; read the row once more.
        current = self._must_get(record.id)
        if current.state not in ACTIVE_STATES:
            return current
        if self._work_alive(current):  # nothing in the folder is believed while the job's processes live
            return self._track_orphan(current)
        files = self.files(current)
        exit_record, exit_problem = read_exit_record(files)
        if exit_record is not None:  # it wrote exit.json, then died before (or while) writing the row
            self.store.update(
                record.id,
                only_if_active=True,
                state=exit_record.state,
                exit_code=exit_record.exit_code,
                reason=exit_record.reason,
                ended_at=exit_record.ended_at or time.time(),
            )
            return self._must_get(record.id)
        state, exit_code, reason = self._vanished_outcome(current, files, exit_problem)
        kind = self.kinds.get(current.kind)
        if state is JobState.LOST and kind is not None and kind.resumable and self._follow_again(current, files):
            return self._must_get(record.id)
        self.store.update(
            record.id, only_if_active=True, state=state, exit_code=exit_code, ended_at=time.time(), reason=reason
        )
        return self._must_get(record.id)

    def _vanished_outcome(
        self, record: JobRecord, files: JobFiles, exit_problem: str | None, prefix: str | None = None
    ) -> tuple[JobState, int | None, str]:
        """How a job ended whose processes are gone without an exit record: as the worker's own files say
        (result.json: it succeeded; error.json: it failed), else CANCELLED if a cancel was asked for, else LOST."""
        supervisor = f"supervisor pid {record.supervisor_pid}" if record.supervisor_pid else "no supervisor recorded"
        vanished = f"its supervisor vanished without recording the end ({supervisor})"
        problems = [exit_problem] if exit_problem else []
        has_result = False
        try:
            load_json(files.result)
            has_result = True
        except FileNotFoundError:
            pass
        except (OSError, BadJobFileError) as exc:
            problems.append(f"result.json is not usable: {exc}")
        error = None if has_result else worker_error(files.error)
        if has_result:
            state = JobState.SUCCEEDED
            reason = f"{vanished}; the worker had written its result, so it succeeded (its exit code is unknown)"
        elif error is not None:
            state = JobState.FAILED
            reason = f"{error['type']}: {error['message']} ({vanished}, so its exit code is unknown)"
        elif record.cancel_requested:
            state = JobState.CANCELLED
            reason = (
                f"cancelled on request; its processes ended without recording an exit ({supervisor}, worker pid "
                f"{record.worker_pid})"
            )
        else:
            state = JobState.LOST
            rebooted = bool(record.boot_id) and record.boot_id != boot_id()
            cause = "the machine restarted" if rebooted else "they were killed from outside (SIGKILL, the OOM killer)"
            reason = (
                f"its processes vanished without recording an exit ({supervisor}, worker pid {record.worker_pid}); "
                f"likely {cause}; logs so far remain readable"
            )
        if problems:
            reason += "; ignored: " + "; ".join(problems)
        return state, None, f"{prefix}; {reason}" if prefix else reason

    def _work_alive(self, record: JobRecord) -> bool:
        """Whether any process of the job's work still runs: the worker, or anything left in its process group (a
        job whose supervisor is gone, killed from outside or by the job itself, is still running while they do)."""
        if record.worker_pid is None:
            return False
        if self._identity(record, "worker").is_alive():
            return True
        if record.boot_id and record.boot_id != boot_id():
            return False
        members = group_members(record.worker_pid, record.worker_start)
        return bool(members) if members is not None else group_alive(record.worker_pid)

    def _track_orphan(self, record: JobRecord) -> JobRecord:
        """A job whose supervisor is gone while its work runs: still RUNNING (counted against the quotas,
        cancellable); its wall-time limit is enforced here, at the next look, since nobody else is left to."""
        assert record.worker_pid is not None
        started = record.started_at or record.created_at
        if time.time() > started + record.timeout_s:
            how = terminate_group(record.worker_pid, self.settings.cancel_grace_s)
            self.store.update(
                record.id,
                only_if_active=True,
                state=JobState.FAILED,
                ended_at=time.time(),
                reason=f"timed out: it ran past its wall-time limit of {record.timeout_s:g} s after its supervisor "
                f"(pid {record.supervisor_pid}) was gone; the server ended its process group ({how})",
            )
            return self._must_get(record.id)
        note = (
            f"its supervisor (pid {record.supervisor_pid}) is gone; the work (process group {record.worker_pid}) "
            "still runs and is tracked directly; files in its folder are not believed while it runs"
        )
        if record.reason != note:
            self.store.update(record.id, only_if_active=True, reason=note)
        return self._must_get(record.id)

    @staticmethod
    def _identity(record: JobRecord, which: str) -> ProcessIdentity:
        pid = record.supervisor_pid if which == "supervisor" else record.worker_pid
        start = record.supervisor_start if which == "supervisor" else record.worker_start
        assert pid is not None
        return ProcessIdentity(pid=pid, start_time=start, boot=record.boot_id or "")

    def _supervisor_alive(self, record: JobRecord) -> bool:
        return record.supervisor_pid is not None and self._identity(record, "supervisor").is_alive()

    # ---- cancel ------------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, wait_s: float | None = None) -> JobRecord:
        """End a job and its whole process group. Idempotent: a job already ended is returned as it is.

        The cancel is recorded in the row first. A supervisor that has installed its handlers (supervisor_ready)
        gets SIGTERM; one still starting is not signalled (SIGTERM would kill it before it can record anything):
        it reads the request once ready and ends the job as CANCELLED. Only if nothing answers in time does the
        engine end the processes itself."""
        record = self.get(job_id)
        if record.state not in ACTIVE_STATES:
            return record
        if record.owner != self.owner:
            raise InputError(
                f"job {job_id} was started by the {record.owner!r} server; only that server cancels it "
                f"(this is {self.owner!r})"
            )
        self.store.update(job_id, cancel_requested=True)
        grace = self.settings.cancel_grace_s
        ready_wait = 0.0 if record.supervisor_ready else _READY_WAIT_S
        budget = wait_s if wait_s is not None else grace + 5.0 + ready_wait
        deadline = time.monotonic() + budget
        signalled = False
        while True:
            record = self.get(job_id)  # a supervisor gone while the cancel was asked for ends it CANCELLED
            if record.state not in ACTIVE_STATES:
                return record
            if record.supervisor_pid is not None and not self._supervisor_alive(record):
                break  # no supervisor left to ask: end the work here
            if not signalled and record.supervisor_ready and self._supervisor_alive(record):
                assert record.supervisor_pid is not None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.supervisor_pid, signal.SIGTERM)
                signalled = True
                # The supervisor ends the worker's group within the grace period and records CANCELLED.
                if wait_s is None:
                    deadline = max(deadline, time.monotonic() + grace + 5.0)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        # No supervisor to do it (or it did not answer): end the processes here and record the cancel.
        record = self._must_get(job_id)
        how = "absent"
        if self._work_alive(record):
            assert record.worker_pid is not None
            how = terminate_group(record.worker_pid, grace)
        if self._supervisor_alive(record):
            assert record.supervisor_pid is not None
            child = self._children.get(job_id)
            terminate_group(record.supervisor_pid, 1.0, reap=child.poll if child else None)
        note = "cancelled on request by the server (the job's supervisor was not there to do it)"
        if how != "absent":
            note += f"; the worker's process group was {how}"
        self.store.update(job_id, only_if_active=True, state=JobState.CANCELLED, ended_at=time.time(), reason=note)
        return self._must_get(job_id)
