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
from typing import Any

from servers.core.engine_state import STATE_FD_ENV, StateReader, StateReport
from servers.core.jobfiles import JobFiles, atomic_write_json, read_json, worker_error
from servers.core.jobstore import JobState, JobStore
from servers.core.procs import (
    boot_id,
    child_command,
    group_alive,
    process_start_time,
    signal_group,
    terminate_group,
)

_DB_POLL_S = 1.0


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


def engine_fields(report: StateReport, *, created_at: float, first: bool) -> dict[str, Any]:
    """The row's columns for a report of the followed engine: its state and reason, and, the first time it says
    RUNNING, the start (the engine's own when it gives one between the job's creation and now, else now)."""
    fields: dict[str, Any] = {"state": JobState(report.state), "reason": report.reason}
    if report.state == JobState.RUNNING.value and first:
        now = time.time()
        said = report.started_at
        fields["started_at"] = said if said is not None and created_at <= said <= now else now
    return fields


def main(argv: list[str]) -> int:
    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    signal.signal(signal.SIGINT, lambda *_: cancel.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    files = JobFiles(Path(argv[0]).resolve())
    store = JobStore(Path(argv[1]), prepare=False)  # the server made and checked the file; only our row is written
    grace_s = float(argv[2])
    descriptor = read_json(files.descriptor, 1024 * 1024)
    if not isinstance(descriptor, dict) or not isinstance(descriptor.get("id"), str):
        print(f"supervisor: cannot read {files.descriptor}", file=sys.stderr)
        return 2
    job_id = descriptor["id"]
    timeout_s = float(descriptor["timeout_s"])
    me = os.getpid()
    identity = {"pid": me, "start_time": process_start_time(me), "boot_id": boot_id()}
    atomic_write_json(files.supervisor_identity, identity)
    try:
        store.update(
            job_id,
            only_if_active=True,
            supervisor_ready=True,
            supervisor_pid=me,
            supervisor_start=identity["start_time"],
            boot_id=identity["boot_id"],
        )
    except Exception as exc:  # not marked ready: a cancel then waits, and we still see it in the row below
        print(f"supervisor: marking the job ready failed ({exc!r})", file=sys.stderr)

    def finish(state: JobState, exit_code: int | None, reason: str | None) -> int:
        ended = time.time()
        record = {"state": state.value, "exit_code": exit_code, "reason": reason, "ended_at": ended}
        atomic_write_json(files.exit, record)
        for attempt in range(20):  # the database may be busy; exit.json already holds the truth
            try:
                store.update(
                    job_id, only_if_active=True, state=state, exit_code=exit_code, reason=reason, ended_at=ended
                )
                break
            except Exception as exc:
                print(f"supervisor: recording the end failed ({exc!r}), attempt {attempt + 1}", file=sys.stderr)
                time.sleep(0.5)
        print(f"supervisor: {job_id} ended {json.dumps(record)}", file=sys.stderr)
        return 0

    record = store.get(job_id)
    if record is None:
        print(f"supervisor: job {job_id} is not in {argv[1]}", file=sys.stderr)
        return 2
    if cancel.is_set() or record.cancel_requested:
        return finish(JobState.CANCELLED, None, "cancelled before it started")

    # A job that follows another engine's job has that engine's state, as its worker reports it (engine_state.py):
    # not RUNNING because its follower runs here. Until the engine has it, it is STARTING (being submitted).
    follows = descriptor.get("follows_engine") is True
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LLM_INFRA_MCP_JOB_ID": job_id}
    reader: StateReader | None = None
    write_end: int | None = None
    if follows:
        store.update(job_id, only_in=frozenset({JobState.QUEUED}), state=JobState.STARTING)
        read_end, write_end = os.pipe()
        os.set_inheritable(read_end, False)
        reader = StateReader(read_end)
        env[STATE_FD_ENV] = str(write_end)
    files.logs_dir.mkdir(parents=True, exist_ok=True)
    files.run_dir.mkdir(parents=True, exist_ok=True)
    with open(files.log(), "ab") as log:
        try:
            worker = subprocess.Popen(
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
            return finish(JobState.FAILED, None, f"could not start the worker: {exc}")
        finally:
            if write_end is not None:
                os.close(write_end)  # the worker holds it now; our copy would keep the pipe open past its end
    started = time.time()
    worker_start = process_start_time(worker.pid)
    atomic_write_json(
        files.supervisor_identity,
        {**identity, "worker_pid": worker.pid, "worker_start": worker_start, "started_at": started},
    )
    running = {} if follows else {"state": JobState.RUNNING, "started_at": started}
    store.update(
        job_id,
        only_if_active=True,
        worker_pid=worker.pid,
        worker_start=worker_start,
        boot_id=boot_id(),
        **running,
    )

    # The wall-time limit counts from the start: the worker's, or for a followed job the engine's (time in the
    # engine's queue is not run time); a followed job may wait in the queue as long again, then it is ended.
    deadline = time.monotonic() + timeout_s
    engine_started = False
    next_db_check = time.monotonic() + _DB_POLL_S
    outcome = "exited"
    while (returncode := worker.poll()) is None:
        if cancel.is_set():
            outcome = "cancelled"
            break
        if reader is not None and (report := reader.latest()) is not None:
            fields = engine_fields(
                report, created_at=float(descriptor.get("created_at") or 0), first=not engine_started
            )
            if report.state == JobState.RUNNING.value and not engine_started:
                engine_started = True
                deadline = time.monotonic() + timeout_s
            store.update(job_id, only_if_active=True, **fields)
        if time.monotonic() >= deadline:
            outcome = "timed out" if engine_started or not follows else "queued too long"
            break
        if time.monotonic() >= next_db_check:  # a cancel recorded by a server that could not signal us
            next_db_check = time.monotonic() + _DB_POLL_S
            current = store.get(job_id)
            if current is not None and current.cancel_requested:
                outcome = "cancelled"
                break
        cancel.wait(0.05)

    if outcome == "exited":
        if group_alive(worker.pid):  # the worker is gone; leftovers in its group would run unsupervised
            signal_group(worker.pid, signal.SIGKILL)
        if returncode == 0:
            return finish(JobState.SUCCEEDED, 0, None)
        return finish(JobState.FAILED, returncode, describe_exit(returncode, worker_error(files.error)))

    how = terminate_group(worker.pid, grace_s, reap=worker.poll)
    returncode = worker.wait()
    ended_by = (
        "ended with SIGTERM" if how != "killed" else f"did not stop within {grace_s:g} s of SIGTERM and was killed"
    )
    if outcome == "cancelled":
        return finish(JobState.CANCELLED, returncode, f"cancelled on request; the process group {ended_by}")
    if outcome == "queued too long":
        return finish(
            JobState.FAILED,
            returncode,
            f"never started: the engine kept it queued past {timeout_s:g} s (the job's wall-time limit, which counts "
            f"from its start); its follower was stopped, which cancels it there; the process group {ended_by}",
        )
    return finish(
        JobState.FAILED,
        returncode,
        f"timed out: it ran past its wall-time limit of {timeout_s:g} s; the process group {ended_by}",
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
