"""The small process that runs one job: `python -m servers.core.supervisor JOB_DIR DB_PATH GRACE_S`.

It lives in a session of its own, so it outlives the server that started it (a client may kill or
restart its server at any time). It starts the worker in a further process group, with the job's run/ folder
as its working directory, enforces the wall-time limit, turns SIGTERM (a cancel) into ending the worker's whole
group (SIGTERM, a grace period, SIGKILL), and records how the job ended: first in exit.json in the job folder,
then in the database. A server that is not its parent, and so cannot wait() for it, learns the outcome from
the database, or from exit.json once this process is gone.

Its first act is to install its signal handlers; then it marks its row supervisor_ready, and only from then on
does a server cancel by SIGTERM (before, SIGTERM would kill it unrecorded). It reads the row's cancel request
right after, so a cancel asked for while it started is not missed.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servers.core.jobfiles import JobFiles, atomic_write_json, read_json, worker_error
from servers.core.jobrow import JobRow, JobState
from servers.core.procs import (
    ExitWaiter,
    boot_id,
    child_command,
    group_alive,
    process_start_time,
    signal_group,
    terminate_group,
)

if TYPE_CHECKING:
    from servers.core.engine_state import StateReader, StateReport

_DB_POLL_S = 1.0
_STEP_S = 0.05  # the longest a cancel signal or an engine report waits to be acted on; the worker's end wakes us


def describe_exit(returncode: int, error: dict[str, str] | None) -> str:
    """A reason a person can act on, from the worker's exit status and its error.json."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (SIGKILL from outside is often the out-of-memory killer)" if name == "SIGKILL" else ""
        return f"the worker was killed by {name}{hint}; see read_job_logs"
    if error:
        return f"{error.get('type', 'Error')}: {error.get('message', '')} (exit code {returncode})"
    return f"the worker exited with code {returncode}; see read_job_logs"


def engine_fields(report: "StateReport", *, created_at: float, first: bool) -> dict[str, Any]:
    """The row's columns for a report of the followed engine: its state and reason, and, the first time it says
    RUNNING, the start (the engine's own when it gives one between the job's creation and now, else now)."""
    fields: dict[str, Any] = {"state": JobState(report.state), "reason": report.reason}
    if report.state == JobState.RUNNING.value and first:
        now = time.time()
        said = report.started_at
        fields["started_at"] = said if said is not None and created_at <= said <= now else now
    return fields


def _handle_signals() -> tuple[threading.Event, int]:
    """Our first act: SIGTERM and SIGINT (a cancel) set the event and wake the watch (signal.set_wakeup_fd: the
    returned descriptor becomes readable), SIGHUP is ignored."""
    cancel = threading.Event()
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    signal.signal(signal.SIGINT, lambda *_: cancel.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return cancel, wake_r


class _Run:
    """One job's run, step by step: mark ready, start the worker, watch it, record how it ended."""

    def __init__(
        self, files: JobFiles, row: JobRow, descriptor: dict[str, Any], grace_s: float, cancel: threading.Event
    ) -> None:
        self.files = files
        self.row = row
        self.job_id = row.job_id
        self.descriptor = descriptor
        self.grace_s = grace_s
        self.cancel = cancel
        self.timeout_s = float(descriptor["timeout_s"])
        # A job that follows another engine's job has that engine's state, as its worker reports it
        # (engine_state.py): not RUNNING because its follower runs here. Until the engine has it, it is STARTING.
        self.follows = descriptor.get("follows_engine") is True
        self.reader: StateReader | None = None
        me = os.getpid()
        self.identity: dict[str, Any] = {"pid": me, "start_time": process_start_time(me), "boot_id": boot_id()}

    def mark_ready(self) -> None:
        atomic_write_json(self.files.supervisor_identity, self.identity)
        try:
            self.row.update(
                only_if_active=True,
                supervisor_ready=True,
                supervisor_pid=self.identity["pid"],
                supervisor_start=self.identity["start_time"],
                boot_id=self.identity["boot_id"],
            )
        except Exception as exc:  # not marked ready: a cancel then waits, and we still see it in the row after
            print(f"supervisor: marking the job ready failed ({exc!r})", file=sys.stderr)

    def finish(self, state: JobState, exit_code: int | None, reason: str | None) -> int:
        ended = time.time()
        record = {"state": state.value, "exit_code": exit_code, "reason": reason, "ended_at": ended}
        atomic_write_json(self.files.exit, record)
        for attempt in range(20):  # the database may be busy; exit.json already holds the truth
            try:
                self.row.update(only_if_active=True, state=state, exit_code=exit_code, reason=reason, ended_at=ended)
                break
            except Exception as exc:
                print(f"supervisor: recording the end failed ({exc!r}), attempt {attempt + 1}", file=sys.stderr)
                time.sleep(0.5)
        print(f"supervisor: {self.job_id} ended {json.dumps(record)}", file=sys.stderr)
        return 0

    def start_worker(self) -> "subprocess.Popen[bytes] | str":
        """The worker in a process group of its own, in the job's run/ folder; or why it could not start."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "LLM_INFRA_MCP_JOB_ID": self.job_id}
        write_end: int | None = None
        if self.follows:
            from servers.core.engine_state import STATE_FD_ENV, StateReader

            self.row.update(only_in=frozenset({JobState.QUEUED}), state=JobState.STARTING)
            read_end, write_end = os.pipe()
            os.set_inheritable(read_end, False)
            self.reader = StateReader(read_end)
            env[STATE_FD_ENV] = str(write_end)
        files = self.files
        files.logs_dir.mkdir(parents=True, exist_ok=True)
        files.run_dir.mkdir(parents=True, exist_ok=True)
        with open(files.log(), "ab") as log:
            try:
                return subprocess.Popen(
                    child_command("servers.core.worker", str(files.dir)),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: ending the job ends everything it started
                    cwd=files.run_dir,  # apart from the engine's files (exit.json, result.json...)
                    env=env,
                    pass_fds=(write_end,) if write_end is not None else (),
                )
            except OSError as exc:
                return f"could not start the worker: {exc}"
            finally:
                if write_end is not None:
                    os.close(write_end)  # the worker holds it now; our copy would keep the pipe open past its end

    def record_start(self, worker: "subprocess.Popen[bytes]") -> None:
        started = time.time()
        worker_start = process_start_time(worker.pid)
        atomic_write_json(
            self.files.supervisor_identity,
            {**self.identity, "worker_pid": worker.pid, "worker_start": worker_start, "started_at": started},
        )
        running = {} if self.follows else {"state": JobState.RUNNING, "started_at": started}
        self.row.update(
            only_if_active=True, worker_pid=worker.pid, worker_start=worker_start, boot_id=boot_id(), **running
        )

    def watch(self, worker: "subprocess.Popen[bytes]", wake_fd: int) -> tuple[str, int | None]:
        """Until the worker ends, a cancel (a signal, or recorded in the row by a server that could not signal us)
        or the wall-time limit: (what happened, the worker's exit status if it ended)."""
        # The wall-time limit counts from the start: the worker's, or for a followed job the engine's (time in the
        # engine's queue is not run time); a followed job may wait in the queue as long again, then it is ended.
        deadline = time.monotonic() + self.timeout_s
        engine_started = False
        next_db_check = time.monotonic() + _DB_POLL_S
        wait = ExitWaiter(worker.pid, wake_fd)  # wakes on the worker's end and on signals
        while (returncode := worker.poll()) is None:
            if self.cancel.is_set():
                return "cancelled", None
            if self.reader is not None and (report := self.reader.latest()) is not None:
                created_at = float(self.descriptor.get("created_at") or 0)
                fields = engine_fields(report, created_at=created_at, first=not engine_started)
                if report.state == JobState.RUNNING.value and not engine_started:
                    engine_started = True
                    deadline = time.monotonic() + self.timeout_s
                self.row.update(only_if_active=True, **fields)
            if time.monotonic() >= deadline:
                return ("timed out" if engine_started or not self.follows else "queued too long"), None
            if time.monotonic() >= next_db_check:  # a cancel recorded by a server that could not signal us
                next_db_check = time.monotonic() + _DB_POLL_S
                if self.row.cancel_requested():
                    return "cancelled", None
            wait(_STEP_S)
        return "exited", returncode

    def conclude(self, worker: "subprocess.Popen[bytes]", outcome: str, returncode: int | None) -> int:
        if outcome == "exited" and returncode is not None:
            if group_alive(worker.pid):  # the worker is gone; leftovers in its group would run unsupervised
                signal_group(worker.pid, signal.SIGKILL)
            if returncode == 0:
                return self.finish(JobState.SUCCEEDED, 0, None)
            return self.finish(JobState.FAILED, returncode, describe_exit(returncode, worker_error(self.files.error)))
        grace_s, timeout_s = self.grace_s, self.timeout_s
        how = terminate_group(worker.pid, grace_s, reap=worker.poll)
        returncode = worker.wait()
        ended_by = (
            "ended with SIGTERM" if how != "killed" else f"did not stop within {grace_s:g} s of SIGTERM and was killed"
        )
        if outcome == "cancelled":
            return self.finish(JobState.CANCELLED, returncode, f"cancelled on request; the process group {ended_by}")
        if outcome == "queued too long":
            return self.finish(
                JobState.FAILED,
                returncode,
                f"never started: the engine kept it queued past {timeout_s:g} s (the job's wall-time limit, which "
                "counts from its start); its follower was stopped, which cancels it there; "
                f"the process group {ended_by}",
            )
        return self.finish(
            JobState.FAILED,
            returncode,
            f"timed out: it ran past its wall-time limit of {timeout_s:g} s; the process group {ended_by}",
        )


def main(argv: list[str]) -> int:
    """Run the job, then leave at once: a job's waiter wakes when this process ends (procs.sleep_until_exit), and the
    interpreter's teardown would only delay that (nothing here needs it: every file and connection is closed)."""
    code = _supervise(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _supervise(argv: list[str]) -> int:
    cancel, wake_fd = _handle_signals()
    files = JobFiles(Path(argv[0]).resolve())
    grace_s = float(argv[2])
    descriptor = read_json(files.descriptor, 1024 * 1024)
    if not isinstance(descriptor, dict) or not isinstance(descriptor.get("id"), str):
        print(f"supervisor: cannot read {files.descriptor}", file=sys.stderr)
        return 2
    # The server made and checked the database; only our row is written.
    run = _Run(files, JobRow(Path(argv[1]), descriptor["id"]), descriptor, grace_s, cancel)
    run.mark_ready()
    cancel_recorded = run.row.cancel_requested()
    if cancel_recorded is None:
        print(f"supervisor: job {run.job_id} is not in {argv[1]}", file=sys.stderr)
        return 2
    if cancel.is_set() or cancel_recorded:
        return run.finish(JobState.CANCELLED, None, "cancelled before it started")
    worker = run.start_worker()
    if isinstance(worker, str):
        return run.finish(JobState.FAILED, None, worker)
    run.record_start(worker)
    outcome, returncode = run.watch(worker, wake_fd)
    return run.conclude(worker, outcome, returncode)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
