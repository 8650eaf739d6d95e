"""The job engine with real child processes: success, failure with its exit code, an exception, a crash by
signal, cancel (also of work that ignores SIGTERM and has children), timeout, quotas, and reconciliation of
jobs whose processes are gone or whose pid was reused."""

import os
import signal
import time
from pathlib import Path

import pytest

from servers.core.errors import InputError, NotFoundError, QuotaError
from servers.core.jobfiles import JobFiles
from servers.core.jobs import JobEngine
from servers.core.jobstore import JobRecord, JobState
from servers.core.procs import ProcessIdentity, process_start_time
from servers.core.settings import Settings
from tests.conftest import CHILD_ENV
from tests.jobkinds import TEST_KINDS

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def engine(settings: Settings) -> JobEngine:
    engine = JobEngine(settings, owner="test", child_env=CHILD_ENV)
    for kind in TEST_KINDS:
        engine.register_kind(kind)
    return engine


def wait_until_done(engine: JobEngine, job_id: str, timeout_s: float = 30) -> JobRecord:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = engine.get(job_id)
        if record.state.terminal:
            return record
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {engine.get(job_id).state} after {timeout_s} s")


def wait_for_state(engine: JobEngine, job_id: str, state: JobState, timeout_s: float = 30) -> JobRecord:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = engine.get(job_id)
        if record.state == state:
            return record
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {state}; it is {engine.get(job_id).state}")


def test_success_records_result_metrics_progress_and_log(engine: JobEngine) -> None:
    record = engine.submit("test_count", {"steps": 4})
    assert record.state in (JobState.STARTING, JobState.RUNNING)
    done = wait_until_done(engine, record.id)
    assert done.state == JobState.SUCCEEDED and done.exit_code == 0 and done.reason is None
    assert done.started_at is not None and done.ended_at is not None and done.ended_at >= done.started_at
    files = JobFiles(done.job_dir)
    import json

    result = json.loads(files.result.read_text())
    assert result["steps"] == 4 and result["pid"] == done.worker_pid  # the work ran in the worker, not here
    assert result["pid"] != os.getpid()
    rows = [json.loads(line) for line in files.metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[0]["loss"] == 1.0
    assert json.loads(files.progress.read_text())["message"] == "step 4/4"
    assert "step 3 done" in files.log().read_text()
    assert json.loads(files.exit.read_text())["state"] == "SUCCEEDED"


def test_failure_keeps_the_exit_code(engine: JobEngine) -> None:
    done = wait_until_done(engine, engine.submit("test_fail", {"exit_code": 7}).id)
    assert done.state == JobState.FAILED and done.exit_code == 7
    assert "exit code 7" in (done.reason or "")


def test_exception_becomes_the_reason_and_the_traceback_is_logged(engine: JobEngine) -> None:
    done = wait_until_done(engine, engine.submit("test_fail", {"raise": True}).id)
    assert done.state == JobState.FAILED and done.exit_code == 1
    assert done.reason is not None and done.reason.startswith("RuntimeError: the loss went to NaN at step 7")
    assert "Traceback" in JobFiles(done.job_dir).log().read_text()


def test_crash_by_signal_is_named(engine: JobEngine) -> None:
    done = wait_until_done(engine, engine.submit("test_crash", {}).id)
    assert done.state == JobState.FAILED and done.exit_code == -signal.SIGSEGV
    assert "SIGSEGV" in (done.reason or "")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cancel_ends_the_whole_group_even_when_sigterm_is_ignored(engine: JobEngine) -> None:
    record = engine.submit("test_sleep", {"ignore_sigterm": True, "grandchild": True})
    files = JobFiles(record.job_dir)
    running = wait_for_state(engine, record.id, JobState.RUNNING)
    deadline = time.monotonic() + 20
    while not (files.dir / "grandchild.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int((files.dir / "grandchild.pid").read_text())
    assert _alive(grandchild) and running.worker_pid is not None and _alive(running.worker_pid)

    cancelled = engine.cancel(record.id)
    assert cancelled.state == JobState.CANCELLED
    assert "killed" in (cancelled.reason or "")  # it ignored SIGTERM, so the grace period ended in SIGKILL
    assert not _alive(running.worker_pid) and not _alive(grandchild)
    # idempotent: a second cancel changes nothing
    again = engine.cancel(record.id)
    assert again.state == JobState.CANCELLED and again.ended_at == cancelled.ended_at


def test_cancel_of_cooperative_work_uses_sigterm(engine: JobEngine) -> None:
    record = engine.submit("test_sleep", {"seconds": 60})
    wait_for_state(engine, record.id, JobState.RUNNING)
    cancelled = engine.cancel(record.id)
    assert cancelled.state == JobState.CANCELLED and "ended with SIGTERM" in (cancelled.reason or "")
    assert cancelled.exit_code == -signal.SIGTERM


def test_timeout_ends_the_job_as_failed(engine: JobEngine) -> None:
    record = engine.submit("test_sleep", {"seconds": 60}, timeout_s=1.0)
    done = wait_until_done(engine, record.id)
    assert done.state == JobState.FAILED and "timed out" in (done.reason or "")
    assert done.ended_at is not None and done.started_at is not None and done.ended_at - done.started_at < 20
    assert done.worker_pid is not None and not _alive(done.worker_pid)


def test_bad_submissions_are_refused_clearly(engine: JobEngine, settings: Settings) -> None:
    with pytest.raises(InputError, match="unknown job kind 'nope'; this server runs: test_big, test_count, test_crash"):
        engine.submit("nope", {})
    with pytest.raises(InputError, match="timeout_s must be in"):
        engine.submit("test_count", {}, timeout_s=settings.max_job_wall_s * 2)
    with pytest.raises(NotFoundError, match="no job with id 'missing-1'"):
        engine.get("missing-1")


def test_concurrency_quota(settings: Settings) -> None:
    engine = JobEngine(settings.model_copy(update={"max_concurrent_jobs": 1}), owner="test", child_env=CHILD_ENV)
    for kind in TEST_KINDS:
        engine.register_kind(kind)
    first = engine.submit("test_sleep", {"seconds": 60})
    with pytest.raises(QuotaError, match="LLM_INFRA_MCP_MAX_CONCURRENT_JOBS"):
        engine.submit("test_count", {})
    engine.cancel(first.id)
    wait_until_done(engine, engine.submit("test_count", {}).id)  # the slot is free again


def _kill_job_processes(record: JobRecord) -> None:
    assert record.supervisor_pid is not None and record.worker_pid is not None
    os.killpg(record.supervisor_pid, signal.SIGKILL)
    os.killpg(record.worker_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (_alive(record.supervisor_pid) or _alive(record.worker_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_new_engine_marks_vanished_jobs_lost(engine: JobEngine, settings: Settings) -> None:
    record = wait_for_state(engine, engine.submit("test_sleep", {"seconds": 60}).id, JobState.RUNNING)
    _kill_job_processes(record)
    # A new engine (as a restarted server would make) reconciles: nothing recorded an exit, nothing runs.
    fresh = JobEngine(settings, owner="test")
    active = fresh.reconcile_all()
    assert record.id not in [r.id for r in active]
    lost = fresh.get(record.id)
    assert lost.state == JobState.LOST and "vanished without recording an exit" in (lost.reason or "")
    assert lost.ended_at is not None


def test_worker_outliving_its_supervisor_is_still_tracked(engine: JobEngine, settings: Settings) -> None:
    record = wait_for_state(engine, engine.submit("test_sleep", {"seconds": 60}).id, JobState.RUNNING)
    assert record.supervisor_pid is not None and record.worker_pid is not None
    os.killpg(record.supervisor_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(record.supervisor_pid) and time.monotonic() < deadline:
        engine.get(record.id)  # lets the engine reap its child
        time.sleep(0.05)
    fresh = JobEngine(settings, owner="test")
    tracked = fresh.get(record.id)
    assert tracked.state == JobState.RUNNING and "tracked directly" in (tracked.reason or "")
    cancelled = fresh.cancel(record.id)  # no supervisor: the engine ends the worker's group itself
    assert cancelled.state == JobState.CANCELLED and not _alive(record.worker_pid)


def test_a_reused_pid_is_not_mistaken_for_the_job(engine: JobEngine) -> None:
    record = wait_for_state(engine, engine.submit("test_sleep", {"seconds": 60}).id, JobState.RUNNING)
    assert record.supervisor_pid is not None and record.worker_pid is not None
    _kill_job_processes(record)
    # Pretend both pids now belong to other live processes: this test process, with its own start time.
    me = os.getpid()
    engine.store.update(
        record.id,
        supervisor_pid=me,
        worker_pid=me,
        supervisor_start=(process_start_time(me) or 0) + 1,
        worker_start=(process_start_time(me) or 0) + 1,
    )
    assert ProcessIdentity(me, process_start_time(me), "").is_alive()
    lost = engine.get(record.id)
    assert lost.state == JobState.LOST


def test_a_job_whose_server_died_before_starting_it_is_lost(engine: JobEngine) -> None:
    record = JobRecord(
        id="test_count-orphan-000001",
        kind="test_count",
        spec={},
        state=JobState.QUEUED,
        created_at=time.time() - 3600,
        timeout_s=60,
        owner="test",
        job_dir=str(engine.settings.jobs_dir),
    )
    engine.store.insert(record)
    lost = engine.get(record.id)
    assert lost.state == JobState.LOST and "never started" in (lost.reason or "")


def test_exit_recorded_only_in_the_job_folder_is_picked_up(engine: JobEngine) -> None:
    """The supervisor writes exit.json before the database; a server reading later, once the supervisor is gone,
    trusts the file (while the supervisor lives, only the database row is believed)."""
    done = wait_until_done(engine, engine.submit("test_count", {"steps": 1}).id)
    deadline = time.monotonic() + 10
    while done.supervisor_pid is not None and _alive(done.supervisor_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    engine.store.update(done.id, state="RUNNING", ended_at=None, exit_code=None)
    assert engine.get(done.id).state == JobState.SUCCEEDED


def test_only_the_server_that_started_a_job_cancels_it(engine: JobEngine, settings: Settings) -> None:
    record = wait_for_state(engine, engine.submit("test_sleep", {"seconds": 60}).id, JobState.RUNNING)
    other = JobEngine(settings, owner="someone-else")
    with pytest.raises(InputError, match="started by the 'test' server"):
        other.cancel(record.id)
    assert engine.cancel(record.id).state == JobState.CANCELLED
