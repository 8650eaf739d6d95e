"""The job engine: every piece of long work (training, benchmark sweeps, probes) runs as a job.

The engine knows nothing of training or benchmarks. A job kind names a work function by "module:function";
the engine stores the job (SQLite, the source of truth), starts a supervisor process for it in a session
of its own, and answers questions about it. Jobs outlive the server: a server started later reconciles
them, tracking those still running (by pid and start time) and marking LOST those whose processes vanished
without recording an exit.
"""

import contextlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from servers.core.errors import InputError, NotFoundError, QuotaError
from servers.core.jobfiles import JobFiles, atomic_write_json, read_json
from servers.core.jobstore import ACTIVE_STATES, JobPage, JobRecord, JobState, JobStore
from servers.core.procs import ProcessIdentity, boot_id, process_start_time, terminate_group
from servers.core.settings import Settings
from servers.core.supervisor import child_command

JOB_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,95}$"
# A job row written but whose supervisor never recorded a pid: give the starting server this long.
_SPAWN_GRACE_S = 30.0


@dataclass(frozen=True)
class JobKind:
    """A kind of long work: its name, the work function ("module:function"), and its default time limit."""

    name: str
    entry: str
    description: str
    default_timeout_s: float = 3600.0


class JobEngine:
    def __init__(self, settings: Settings, *, owner: str, child_env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.owner = owner
        self.kinds: dict[str, JobKind] = {}
        self._child_env = child_env or {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        settings.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.store = JobStore(settings.db_path)

    # ---- kinds -------------------------------------------------------------------------------------
    def register_kind(self, kind: JobKind) -> None:
        existing = self.kinds.get(kind.name)
        if existing is not None and existing != kind:
            raise ValueError(f"job kind {kind.name!r} is already registered with another entry")
        self.kinds[kind.name] = kind

    # ---- submit ------------------------------------------------------------------------------------
    def submit(self, kind: str, spec: dict[str, Any], *, timeout_s: float | None = None) -> JobRecord:
        """Store a job and start its supervisor. Returns at once; the work runs in the background."""
        job_kind = self.kinds.get(kind)
        if job_kind is None:
            raise InputError(f"unknown job kind {kind!r}; this server runs: {', '.join(sorted(self.kinds)) or 'none'}")
        limit = self.settings.max_job_wall_s
        timeout = job_kind.default_timeout_s if timeout_s is None else timeout_s
        if not 0 < timeout <= limit:
            raise InputError(
                f"timeout_s must be in (0, {limit:g}] seconds (LLM_INFRA_MCP_MAX_JOB_WALL_S), got {timeout:g}"
            )
        running = len(self.reconcile_all())
        if running >= self.settings.max_concurrent_jobs:
            raise QuotaError(
                f"{running} jobs are active and at most {self.settings.max_concurrent_jobs} may run at once "
                "(LLM_INFRA_MCP_MAX_CONCURRENT_JOBS); wait for one to end (wait_for_job) or cancel one (cancel_job)"
            )

        job_id = self._new_id(kind)
        files = JobFiles(self.settings.jobs_dir / job_id)
        files.logs_dir.mkdir(parents=True)
        created = time.time()
        atomic_write_json(
            files.descriptor,
            {
                "id": job_id,
                "kind": kind,
                "entry": job_kind.entry,
                "spec": spec,
                "timeout_s": timeout,
                "created_at": created,
                "owner": self.owner,
            },
        )
        record = JobRecord(
            id=job_id,
            kind=kind,
            spec=spec,
            state=JobState.QUEUED,
            created_at=created,
            timeout_s=timeout,
            owner=self.owner,
            job_dir=str(files.dir),
        )
        self.store.insert(record)
        try:
            with open(files.log("supervisor"), "ab") as supervisor_log:
                child = subprocess.Popen(
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
        except OSError as exc:
            self.store.update(
                job_id,
                only_if_active=True,
                state=JobState.FAILED,
                ended_at=time.time(),
                reason=f"could not start the job's supervisor: {exc}",
            )
            return self._must_get(job_id)
        self._children[job_id] = child
        self.store.update(
            job_id,
            only_if_active=True,
            state=JobState.STARTING,
            supervisor_pid=child.pid,
            supervisor_start=process_start_time(child.pid),
            boot_id=boot_id(),
        )
        return self._must_get(job_id)

    @staticmethod
    def _new_id(kind: str) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        safe_kind = "".join(c if c.isalnum() or c in "_-" else "_" for c in kind.lower())[:40]
        return f"{safe_kind}-{stamp}-{secrets.token_hex(3)}"

    # ---- read --------------------------------------------------------------------------------------
    def _must_get(self, job_id: str) -> JobRecord:
        record = self.store.get(job_id)
        if record is None:
            raise NotFoundError(f"no job with id {job_id!r}; list_jobs shows the existing ones")
        return record

    def get(self, job_id: str) -> JobRecord:
        """The job, its state brought up to date with its processes."""
        return self.refresh(self._must_get(job_id))

    def list_jobs(
        self, *, kind: str | None = None, state: JobState | None = None, limit: int = 20, offset: int = 0
    ) -> JobPage:
        self.reconcile_all()
        return self.store.list_jobs(kind=kind, states=[state] if state else None, limit=limit, offset=offset)

    def files(self, record: JobRecord) -> JobFiles:
        return JobFiles(record.job_dir)

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
        files = self.files(record)
        if self._apply_exit_record(record, files):
            return self._must_get(record.id)
        if record.supervisor_pid is None:
            if time.time() - record.created_at > _SPAWN_GRACE_S:
                self.store.update(
                    record.id,
                    only_if_active=True,
                    state=JobState.LOST,
                    ended_at=time.time(),
                    reason="never started: the server that created it stopped before starting it",
                )
                return self._must_get(record.id)
            return record
        if self._identity(record, "supervisor").is_alive():
            return record
        # The supervisor is gone. It may have recorded the end a moment ago; look once more.
        if self._apply_exit_record(record, files):
            return self._must_get(record.id)
        current = self._must_get(record.id)
        if current.state not in ACTIVE_STATES:
            return current
        if current.worker_pid is not None and self._identity(current, "worker").is_alive():
            note = (
                f"its supervisor (pid {current.supervisor_pid}) is gone; the worker (pid {current.worker_pid}) "
                "still runs and is tracked directly"
            )
            if current.reason != note:
                self.store.update(record.id, reason=note)
            return self._must_get(record.id)
        rebooted = bool(current.boot_id) and current.boot_id != boot_id()
        cause = "the machine restarted" if rebooted else "they were killed from outside (SIGKILL, the OOM killer)"
        reason = (
            f"its processes vanished without recording an exit (supervisor pid {current.supervisor_pid}, "
            f"worker pid {current.worker_pid}); likely {cause}; logs so far remain readable"
        )
        self.store.update(record.id, only_if_active=True, state=JobState.LOST, ended_at=time.time(), reason=reason)
        return self._must_get(record.id)

    def _apply_exit_record(self, record: JobRecord, files: JobFiles) -> bool:
        exit_record = read_json(files.exit)
        if not isinstance(exit_record, dict):
            return False
        self.store.update(
            record.id,
            only_if_active=True,
            state=JobState(exit_record["state"]),
            exit_code=exit_record.get("exit_code"),
            reason=exit_record.get("reason"),
            ended_at=exit_record.get("ended_at"),
        )
        return True

    @staticmethod
    def _identity(record: JobRecord, which: str) -> ProcessIdentity:
        pid = record.supervisor_pid if which == "supervisor" else record.worker_pid
        start = record.supervisor_start if which == "supervisor" else record.worker_start
        assert pid is not None
        return ProcessIdentity(pid=pid, start_time=start, boot=record.boot_id or "")

    # ---- cancel ------------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, wait_s: float | None = None) -> JobRecord:
        """End a job and its whole process group. Idempotent: a job already ended is returned as it is."""
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
        supervisor_alive = record.supervisor_pid is not None and self._identity(record, "supervisor").is_alive()
        if supervisor_alive:
            assert record.supervisor_pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.supervisor_pid, signal.SIGTERM)
            # The supervisor ends the worker's group within the grace period and records CANCELLED.
            deadline = time.monotonic() + (grace + 5.0 if wait_s is None else wait_s)
            while time.monotonic() < deadline:
                record = self.get(job_id)
                if record.state not in ACTIVE_STATES:
                    return record
                time.sleep(0.05)
        # No supervisor to do it (or it did not answer): end the processes here and record the cancel.
        record = self._must_get(job_id)
        how = "absent"
        if record.worker_pid is not None and self._identity(record, "worker").is_alive():
            how = terminate_group(record.worker_pid, grace)
        if record.supervisor_pid is not None and self._identity(record, "supervisor").is_alive():
            child = self._children.get(job_id)
            terminate_group(record.supervisor_pid, 1.0, reap=child.poll if child else None)
        note = "cancelled on request by the server (the job's supervisor was not there to do it)"
        if how != "absent":
            note += f"; the worker's process group was {how}"
        self.store.update(job_id, only_if_active=True, state=JobState.CANCELLED, ended_at=time.time(), reason=note)
        return self._must_get(job_id)
