"""The job engine under attack and after faults (issue 9 of the adversarial review): a job that writes the
engine's files, concurrent submits from threads and from other processes, cancels right after submit, a
supervisor killed after its worker finished, and a damaged state database (garbage, a newer schema, a truncated
file, bad rows). Every test ends what it started, also when it fails."""

import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from servers.core.db import SCHEMA_VERSION, StateDatabaseError, forget_prepared
from servers.core.errors import InputError, QuotaError
from servers.core.jobfiles import JobContext, JobFiles
from servers.core.jobs import JobEngine, JobKind
from servers.core.jobstore import JobRecord, JobState, JobStore
from servers.core.jobview import job_view, read_log_chunk, read_metrics
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from tests.conftest import CHILD_ENV, REPO_ROOT
from tests.helpers import call_error, call_ok, create_test_suite
from tests.jobkinds import TEST_KINDS

pytestmark = pytest.mark.timeout(180)


# ---- a job kind that writes where it should not --------------------------------------------------------------


def scribble(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Write spec["writes"] (path relative to the working directory -> JSON value) and note the working directory,
    then optionally sleep and fail."""
    Path("cwd.txt").write_text(os.getcwd())
    for name, value in spec.get("writes", {}).items():
        Path(name).write_text(json.dumps(value))
    Path("written").write_text("yes")
    time.sleep(float(spec.get("seconds", 0)))
    if spec.get("fail"):
        raise RuntimeError("the scribbler failed on purpose")
    return {"wrote": sorted(spec.get("writes", {}))}


KINDS = [*TEST_KINDS, JobKind("test_scribble", "tests.test_job_robustness:scribble", "write files", 120)]


# ---- fixtures and helpers -------------------------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _kill_group(pid: int | None, marker: str) -> None:
    """SIGKILL a process group, only if its leader is still one of this test's job processes."""
    if not pid or marker not in _cmdline(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGCONT)
        os.killpg(pid, signal.SIGKILL)


def end_everything(home: Path) -> None:
    """End every job process left under `home`, whatever state the database is in."""
    jobs = home / "jobs"
    if not jobs.is_dir():
        return
    for folder in jobs.iterdir():
        pids: set[int] = set()
        with contextlib.suppress(OSError, ValueError, TypeError):
            ident = json.loads((folder / "supervisor.json").read_text())
            pids |= {p for p in (ident.get("pid"), ident.get("worker_pid")) if isinstance(p, int)}
        for pid in pids:
            _kill_group(pid, str(folder))
    with contextlib.suppress(Exception):
        for record in JobStore(home / "state.db", prepare=False).active():
            for pid in (record.supervisor_pid, record.worker_pid):
                _kill_group(pid, record.job_dir)


@pytest.fixture
def home_cleanup(home: Path) -> Iterator[Path]:
    yield home
    end_everything(home)


def make_engine(settings: Settings, **updates: Any) -> JobEngine:
    engine = JobEngine(settings.model_copy(update=updates), owner="test", child_env=CHILD_ENV)
    for kind in KINDS:
        engine.register_kind(kind)
    return engine


@pytest.fixture
def engine(settings: Settings, home_cleanup: Path) -> JobEngine:
    return make_engine(settings)


def wait(predicate: Callable[[], Any], what: str, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_done(engine: JobEngine, job_id: str, timeout_s: float = 60) -> JobRecord:
    return wait(lambda: (r := engine.get(job_id)).state.terminal and r, f"job {job_id} to end", timeout_s)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


# ---- 5: the job folder's files do not steer the engine ------------------------------------------------------


def test_the_work_runs_in_its_run_folder_apart_from_the_engines_files(engine: JobEngine) -> None:
    record = engine.submit("test_scribble", {"writes": {"exit.json": {"state": "BOGUS"}, "result.json": [1]}})
    files = JobFiles(record.job_dir)
    assert files.run_dir == files.dir / "run" and files.run_dir.is_dir()  # made by the engine with the folder
    done = wait_done(engine, record.id)
    assert done.state == JobState.SUCCEEDED, done.reason
    assert (files.run_dir / "cwd.txt").read_text() == str(files.run_dir)
    assert json.loads((files.run_dir / "exit.json").read_text()) == {"state": "BOGUS"}  # landed in run/
    assert json.loads(files.exit.read_text())["state"] == "SUCCEEDED"  # the supervisor's own record
    assert job_view(done).result == {"wrote": ["exit.json", "result.json"]}


def test_a_bogus_exit_record_and_bad_progress_break_nothing_while_the_job_runs(engine: JobEngine) -> None:
    writes = {"../exit.json": {"state": "BOGUS"}, "../progress.json": {"done": "half"}}
    record = engine.submit("test_scribble", {"writes": writes, "seconds": 60})
    files = JobFiles(record.job_dir)
    wait(lambda: (files.run_dir / "written").exists(), "the job to write its files")
    running = engine.get(record.id)
    assert running.state == JobState.RUNNING
    view = job_view(running)
    assert view.progress is None and any("progress.json is not valid" in w for w in view.warnings)
    assert [r.id for r in engine.list_jobs().jobs] == [record.id]
    other = engine.submit("test_count", {"steps": 1})  # submits still work
    assert wait_done(engine, other.id).state == JobState.SUCCEEDED
    cancelled = engine.cancel(record.id)
    assert cancelled.state == JobState.CANCELLED and "cancelled on request" in (cancelled.reason or "")
    assert not alive(cancelled.worker_pid)


def test_a_faked_success_is_not_believed_while_the_supervisor_lives(engine: JobEngine, settings: Settings) -> None:
    one_slot = make_engine(settings, max_concurrent_jobs=1)
    fake = {"state": "SUCCEEDED", "exit_code": 0, "reason": None, "ended_at": time.time()}
    record = one_slot.submit("test_scribble", {"writes": {"../exit.json": fake}, "seconds": 60})
    files = JobFiles(record.job_dir)
    wait(lambda: (files.run_dir / "written").exists(), "the job to write its files")
    assert one_slot.get(record.id).state == JobState.RUNNING
    with pytest.raises(QuotaError):  # it still holds its slot
        one_slot.submit("test_count", {})
    cancelled = one_slot.cancel(record.id)  # and cancel is no no-op
    assert cancelled.state == JobState.CANCELLED and not alive(cancelled.worker_pid)
    assert json.loads(files.exit.read_text())["state"] == "CANCELLED"


def test_bad_progress_of_a_failed_job_spoils_only_its_own_view(engine: JobEngine) -> None:
    good = wait_done(engine, engine.submit("test_count", {"steps": 2}).id)
    bad = engine.submit("test_scribble", {"writes": {"../progress.json": {"done": "half"}}, "fail": True})
    failed = wait_done(engine, bad.id)
    assert failed.state == JobState.FAILED and "failed on purpose" in (failed.reason or "")
    views = {r.id: job_view(r) for r in engine.list_jobs().jobs}
    assert views[good.id].warnings == [] and views[good.id].progress is not None
    assert views[bad.id].progress is None and views[bad.id].warnings
    assert engine.cancel(bad.id).state == JobState.FAILED  # idempotent, no error


@pytest.mark.parametrize(
    "bogus",
    [{"state": "BOGUS"}, {"state": "RUNNING"}, {"state": "FAILED", "exit_code": "seven"}, ["not", "a", "dict"]],
)
def test_an_invalid_exit_record_is_ignored_once_the_supervisor_is_gone(engine: JobEngine, bogus: Any) -> None:
    done = wait_done(engine, engine.submit("test_count", {"steps": 1}).id)
    wait(lambda: not alive(done.supervisor_pid), "the supervisor to exit", 10)
    JobFiles(done.job_dir).exit.write_text(json.dumps(bogus))
    engine.store.update(done.id, state="RUNNING", ended_at=None, exit_code=None, reason=None)
    again = engine.get(done.id)  # the supervisor is gone: exit.json is read, found invalid, and result.json used
    assert again.state == JobState.SUCCEEDED
    assert "supervisor vanished" in (again.reason or "") and "ignored: exit.json" in (again.reason or "")


def test_hostile_files_in_the_job_folder_do_not_break_views_logs_or_metrics(engine: JobEngine, tmp_path: Path) -> None:
    done = wait_done(engine, engine.submit("test_count", {"steps": 2}).id)
    files = JobFiles(done.job_dir)
    files.result.unlink()
    files.result.symlink_to("/dev/zero")
    files.progress.unlink()
    os.mkfifo(files.progress)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the agent")
    (files.logs_dir / "evil.log").symlink_to(secret)
    (files.logs_dir / "bad name.log").write_text("x")
    with open(files.metrics, "a") as f:
        f.write("[" * 100_000 + "\n" + "x" * (2 * 1024 * 1024) + "\n" + json.dumps({"step": 9, "loss": 0.1}) + "\n")
    view = job_view(engine.get(done.id))
    assert view.result is None and view.progress is None
    assert {log.process for log in view.logs} == {"main", "supervisor"}
    text = " | ".join(view.warnings)
    assert "result.json is a symbolic link" in text and "progress.json is not a regular file" in text
    assert "evil" in text
    page = read_metrics(done, None, None, 100)
    assert [r["step"] for r in page.rows] == [0, 1, 9] and page.skipped_lines == 2
    with pytest.raises(InputError):
        read_log_chunk(done, "evil", 0, 100)


# ---- 6: admission is one transaction -------------------------------------------------------------------------


def test_concurrent_submits_from_threads_start_exactly_the_quota(settings: Settings, home_cleanup: Path) -> None:
    engine = make_engine(settings, max_concurrent_jobs=2)
    barrier = threading.Barrier(8)
    started: list[str] = []
    refused: list[Exception] = []

    def submit() -> None:
        barrier.wait()
        try:
            started.append(engine.submit("test_sleep", {"seconds": 60}).id)
        except QuotaError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(started) == 2 and len(refused) == 6
    assert sorted(r.id for r in engine.store.active()) == sorted(started)


_CHILD = r"""
import json, os, sys, threading, time
from pathlib import Path
from servers.core.jobs import JobEngine
from servers.core.settings import Settings
from tests.jobkinds import TEST_KINDS

home, go, ready, threads, max_jobs, use_admit = sys.argv[1:7]
settings = Settings(home=home, cancel_grace_s=1.0, max_concurrent_jobs=int(max_jobs))
engine = JobEngine(settings, owner="test", child_env={"PYTHONPATH": os.environ["PYTHONPATH"]})
for kind in TEST_KINDS:
    engine.register_kind(kind)
seen, started, refused = [], [], []
lock = threading.Lock()

def admit(active):
    used = {g for r in active for g in r.spec.get("gpus", [])}
    with lock:
        seen.append(sorted(r.id for r in active))
    return {"seconds": 60, "gpus": [min(set(range(64)) - used)]}

barrier = threading.Barrier(int(threads))

def submit():
    barrier.wait()
    try:
        record = engine.submit("test_sleep", {"seconds": 60}, admit=admit if use_admit == "1" else None)
        with lock:
            started.append(record.id)
    except Exception as exc:
        with lock:
            refused.append(type(exc).__name__)

Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.002)
workers = [threading.Thread(target=submit) for _ in range(int(threads))]
for w in workers:
    w.start()
for w in workers:
    w.join()
print(json.dumps({"started": started, "refused": refused, "seen": seen}))
"""


def run_children(home: Path, tmp_path: Path, *, count: int, threads: int, max_jobs: int, admit: bool) -> list[dict]:
    """`count` processes, each with its own JobEngine on `home`, each submitting from `threads` threads at once."""
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = []
    try:
        for i in range(count):
            ready = tmp_path / f"ready-{i}"
            args = [str(home), str(go), str(ready), str(threads), str(max_jobs), "1" if admit else "0"]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _CHILD, *args],
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        wait(lambda: all((tmp_path / f"ready-{i}").exists() for i in range(count)), "the children", 60)
        go.touch()
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            outputs.append(json.loads(out.strip().splitlines()[-1]))
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_concurrent_submits_from_two_processes_start_exactly_the_quota(
    settings: Settings, home_cleanup: Path, tmp_path: Path
) -> None:
    make_engine(settings, max_concurrent_jobs=2)  # the state database exists before the race
    outputs = run_children(settings.home, tmp_path, count=2, threads=4, max_jobs=2, admit=False)
    started = [j for o in outputs for j in o["started"]]
    refused = [e for o in outputs for e in o["refused"]]
    assert len(started) == 2 and refused == ["QuotaError"] * 6
    assert sorted(r.id for r in JobStore(settings.db_path).active()) == sorted(started)


def test_the_admit_hook_sees_the_jobs_another_process_admitted(
    settings: Settings, home_cleanup: Path, tmp_path: Path
) -> None:
    engine = make_engine(settings, max_concurrent_jobs=7)
    first = engine.submit("test_sleep", {"seconds": 60}, admit=lambda active: {"seconds": 60, "gpus": [0], "n": 0})
    assert first.spec == {"seconds": 60, "gpus": [0], "n": 0}  # what admit returned is what is stored
    assert json.loads(JobFiles(first.job_dir).descriptor.read_text())["spec"] == first.spec
    outputs = run_children(settings.home, tmp_path, count=2, threads=3, max_jobs=7, admit=True)
    started = [j for o in outputs for j in o["started"]]
    assert len(started) == 6
    assert all(first.id in seen for o in outputs for seen in o["seen"])  # each admission saw the first job
    gpus = [g for r in engine.store.active() for g in r.spec["gpus"]]
    assert sorted(gpus) == list(range(7))  # no GPU assigned twice, across the two processes
    # Each admission saw every job admitted before it, in either process: the sets seen grow one by one.
    sizes = sorted(len(seen) for o in outputs for seen in o["seen"])
    assert sizes == [1, 2, 3, 4, 5, 6]


def test_an_admit_hook_that_refuses_writes_nothing(engine: JobEngine, settings: Settings) -> None:
    def refuse(active: list[JobRecord]) -> dict[str, Any]:
        raise QuotaError("no GPU free")

    with pytest.raises(QuotaError, match="no GPU free"):
        engine.submit("test_count", {}, admit=refuse)
    assert engine.store.ids() == set() and list(settings.jobs_dir.iterdir()) == []


# ---- 7: a cancel right after submit ends CANCELLED ------------------------------------------------------------


def test_cancels_right_after_submit_all_end_cancelled(engine: JobEngine) -> None:
    ends = []
    for _ in range(20):
        record = engine.submit("test_sleep", {"seconds": 60})
        ends.append(engine.cancel(record.id))
    assert [r.state for r in ends] == [JobState.CANCELLED] * 20, [r.reason for r in ends]
    assert not any("killed from outside" in (r.reason or "") for r in ends)
    assert all(not alive(r.worker_pid) for r in ends)
    wait(lambda: not any(alive(r.supervisor_pid) for r in ends), "the supervisors to exit", 20)


def test_processes_that_vanish_after_a_cancel_request_end_cancelled(engine: JobEngine) -> None:
    job_id = engine.submit("test_sleep", {"seconds": 60}).id
    record = wait(lambda: (r := engine.get(job_id)).state == JobState.RUNNING and r, "the job to run")
    assert record.supervisor_pid and record.worker_pid
    os.kill(record.supervisor_pid, signal.SIGSTOP)  # it cannot act on the request
    engine.store.update(record.id, cancel_requested=True)
    os.killpg(record.worker_pid, signal.SIGKILL)
    os.killpg(record.supervisor_pid, signal.SIGKILL)
    wait(lambda: not alive(record.supervisor_pid) and not alive(record.worker_pid), "the processes to go", 10)
    ended = wait(lambda: (r := engine.get(record.id)).state.terminal and r, "the engine to notice", 10)
    assert ended.state == JobState.CANCELLED and "cancelled on request" in (ended.reason or "")


# ---- 8: a supervisor killed after its worker finished ---------------------------------------------------------


@pytest.mark.parametrize("fail", [False, True])
def test_the_workers_outcome_survives_a_killed_supervisor(engine: JobEngine, fail: bool) -> None:
    record = engine.submit("test_scribble", {"seconds": 1.5, "fail": fail})
    running = wait(lambda: (r := engine.get(record.id)).state == JobState.RUNNING and r, "the job to run")
    supervisor, worker = running.supervisor_pid, running.worker_pid
    assert supervisor and worker
    try:
        os.kill(supervisor, signal.SIGSTOP)  # the worker finishes; its supervisor cannot record it
        files = JobFiles(running.job_dir)
        wait(lambda: not alive(worker), "the worker to finish")
        assert (files.error if fail else files.result).exists() and not files.exit.exists()
    finally:
        os.killpg(supervisor, signal.SIGKILL)
    wait(lambda: not alive(supervisor), "the supervisor to go", 10)
    ended = wait(lambda: (r := engine.get(record.id)).state.terminal and r, "the engine to notice", 10)
    assert "supervisor vanished" in (ended.reason or "")
    if fail:
        assert ended.state == JobState.FAILED and "RuntimeError: the scribbler failed on purpose" in ended.reason
    else:
        assert ended.state == JobState.SUCCEEDED and job_view(ended).result == {"wrote": []}


# ---- 9: a damaged state database ------------------------------------------------------------------------------


def finished_jobs(engine: JobEngine) -> dict[str, JobState]:
    ok = wait_done(engine, engine.submit("test_count", {"steps": 2}).id)
    failed = wait_done(engine, engine.submit("test_fail", {"exit_code": 5}).id)
    assert ok.state == JobState.SUCCEEDED and failed.state == JobState.FAILED
    return {ok.id: ok.state, failed.id: failed.state}


def replace_db(db_path: Path, content: bytes) -> None:
    """Put `content` in place of the database, as a restored or damaged file would be; the next server (a new
    process) checks the file afresh."""
    for suffix in ("-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    tmp = db_path.with_name("replacement")
    tmp.write_bytes(content)
    os.replace(tmp, db_path)
    forget_prepared(db_path)


def checkpointed(db_path: Path) -> bytes:
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db_path.read_bytes()


def test_a_garbage_database_is_moved_aside_and_the_jobs_rebuilt(engine: JobEngine, settings: Settings) -> None:
    before = finished_jobs(engine)
    garbage = os.urandom(8192)
    replace_db(settings.db_path, garbage)
    Path(f"{settings.db_path}-wal").write_bytes(b"old wal")
    fresh = make_engine(settings)
    assert {r.id: r.state for r in fresh.list_jobs().jobs} == before
    [moved] = settings.home.glob("state.db.damaged-*[0-9]")
    assert moved.read_bytes() == garbage and Path(f"{moved}-wal").read_bytes() == b"old wal"
    notices = fresh.notices()
    assert any("moved aside" in n and str(moved) in n for n in notices)
    assert any("re-imported" in n for n in notices)
    assert wait_done(fresh, fresh.submit("test_count", {"steps": 1}).id).state == JobState.SUCCEEDED


@pytest.mark.parametrize("cut", ["empty", "half"])
def test_a_truncated_database_gets_its_jobs_back(engine: JobEngine, settings: Settings, cut: str) -> None:
    before = finished_jobs(engine)
    whole = checkpointed(settings.db_path)
    replace_db(settings.db_path, b"" if cut == "empty" else whole[: len(whole) // 2])
    fresh = make_engine(settings)
    jobs = {r.id: r for r in fresh.list_jobs().jobs}
    assert {i: r.state for i, r in jobs.items()} == before
    assert all("re-imported" in (r.reason or "") for r in jobs.values())
    assert bool(list(settings.home.glob("state.db.damaged-*"))) == (cut == "half")


def test_a_running_job_whose_row_was_lost_is_tracked_again(engine: JobEngine, settings: Settings) -> None:
    record = engine.submit("test_sleep", {"seconds": 60})
    running = wait(lambda: (r := engine.get(record.id)).state == JobState.RUNNING and r, "the job to run")
    replace_db(settings.db_path, b"")
    fresh = make_engine(settings)
    tracked = fresh.get(record.id)
    assert tracked.state == JobState.RUNNING and tracked.supervisor_pid == running.supervisor_pid
    cancelled = fresh.cancel(record.id)  # its supervisor is signalled and records the end in the new row
    assert cancelled.state == JobState.CANCELLED and "cancelled on request" in (cancelled.reason or "")
    assert not alive(running.worker_pid)


def test_bad_rows_are_shown_damaged_and_break_nothing(engine: JobEngine, settings: Settings) -> None:
    good = wait_done(engine, engine.submit("test_count", {"steps": 1}).id)
    columns = "id, kind, spec, state, created_at, timeout_s, owner, job_dir"
    rows = [
        ("bad-spec", "test_count", "{not json", "SUCCEEDED", 1.0, 60, "test", str(settings.jobs_dir / "bad-spec")),
        ("bad-state", "test_count", "{}", "BOGUS", 2.0, 60, "test", str(settings.jobs_dir / "bad-state")),
        ("bad-time", "test_count", "[1]", "RUNNING", "yesterday", 60, "test", ""),
    ]
    with contextlib.closing(sqlite3.connect(settings.db_path)) as conn, conn:
        conn.executemany(f"INSERT INTO jobs ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    page = engine.list_jobs(limit=50)
    jobs = {r.id: r for r in page.jobs}
    assert page.total == 4 and set(jobs) == {good.id, "bad-spec", "bad-state", "bad-time"}
    assert jobs["bad-spec"].state == JobState.SUCCEEDED and jobs["bad-spec"].spec == {}
    assert jobs["bad-state"].state == JobState.LOST and jobs["bad-time"].state == JobState.LOST
    for job_id in ("bad-spec", "bad-state", "bad-time"):
        view = job_view(engine.get(job_id))
        assert view.warnings and all("database row of this job is damaged" in w for w in view.warnings)
    assert "not a job state" in job_view(jobs["bad-state"]).warnings[0]
    assert engine.cancel("bad-state").state == JobState.LOST  # shown as ended: nothing to cancel
    assert job_view(jobs[good.id]).warnings == []
    assert wait_done(engine, engine.submit("test_count", {}).id).state == JobState.SUCCEEDED  # the quota count works


def test_a_schema_1_database_is_migrated(settings: Settings) -> None:
    settings.home.mkdir(parents=True)
    old_schema = """CREATE TABLE jobs (id TEXT PRIMARY KEY, kind TEXT NOT NULL, spec TEXT NOT NULL, state TEXT NOT NULL,
        created_at REAL NOT NULL, started_at REAL, ended_at REAL, exit_code INTEGER, reason TEXT,
        timeout_s REAL NOT NULL, owner TEXT NOT NULL, job_dir TEXT NOT NULL, supervisor_pid INTEGER,
        supervisor_start INTEGER, worker_pid INTEGER, worker_start INTEGER, boot_id TEXT,
        cancel_requested INTEGER NOT NULL DEFAULT 0); PRAGMA user_version=1;"""
    with contextlib.closing(sqlite3.connect(settings.db_path)) as conn:
        conn.executescript(old_schema)
        with conn:
            conn.execute(
                "INSERT INTO jobs (id, kind, spec, state, created_at, timeout_s, owner, job_dir) VALUES "
                "('old-1', 'k', '{}', 'SUCCEEDED', 1, 1, 't', '/nowhere'), "
                "('old-2', 'k', '{}', 'RUNNING', 2, 1, 't', '/nowhere')"
            )
    store = JobStore(settings.db_path)
    done, running = store.get("old-1"), store.get("old-2")
    assert done is not None and done.state == JobState.SUCCEEDED and not done.supervisor_ready
    assert running is not None and running.supervisor_ready  # its supervisor got as far as running the work
    with contextlib.closing(sqlite3.connect(settings.db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


# ---- 9, through the tools --------------------------------------------------------------------------------------

pytest_anyio = pytest.mark.anyio
EVALUATE = {"model": "chinchilla", "at": [{"params": 7e10, "tokens": 1.4e12}]}
CURVE = [{"compute": float(c), "value": 0.25 + 0.36 / (1 + (2542 / c) ** 1.92)} for c in range(200, 40000, 800)]


def suite_app(settings: Settings) -> App:
    return App(settings, owner="test", child_env=CHILD_ENV)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest_anyio
async def test_a_newer_schema_is_left_unchanged_and_the_job_tools_say_so(
    settings: Settings, home_cleanup: Path
) -> None:
    make_engine(settings)
    with contextlib.closing(sqlite3.connect(settings.db_path)) as conn:
        conn.execute("PRAGMA user_version=99")
    digest = checkpointed(settings.db_path) and sha(settings.db_path)
    forget_prepared(settings.db_path)
    async with Client(create_test_suite(suite_app(settings)), mode="auto") as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert {"get_job", "list_jobs", "predict_scaling", "list_scaling_fits"} <= tools
        assert (await call_ok(client, "predict_scaling", EVALUATE))["values"][0]["value"] > 1.5
        for tool, args in [
            ("list_jobs", {}),
            ("get_job", {"job_id": "some-job"}),
            ("start_test_job", {"kind": "test_count", "spec": {}}),
            ("list_scaling_fits", {}),
        ]:
            text = await call_error(client, tool, args)
            assert "newer llm-infra-mcp (schema version 99" in text and "LLM_INFRA_MCP_HOME" in text, text
    assert sha(settings.db_path) == digest and not list(settings.home.glob("state.db.damaged-*"))
    with pytest.raises(StateDatabaseError):
        JobStore(settings.db_path)


@pytest_anyio
async def test_a_garbage_database_through_the_tools(settings: Settings, home_cleanup: Path) -> None:
    async with Client(create_test_suite(suite_app(settings)), mode="auto") as client:
        job = await call_ok(client, "start_test_job", {"kind": "test_count", "spec": {"steps": 2}, "wait_s": 30})
        fit = await call_ok(client, "fit_scaling_law", {"model": "scalerl", "data": {"points": CURVE}, "bootstrap": 0})
    replace_db(settings.db_path, b"this is not an SQLite file" * 100)
    async with Client(create_test_suite(suite_app(settings)), mode="auto") as client:
        assert (await call_ok(client, "predict_scaling", EVALUATE))["values"]
        listed = await call_ok(client, "list_jobs", {"detail": True, "limit": 5})
        assert [j["job_id"] for j in listed["jobs"]] == [job["job_id"]]
        assert listed["jobs"][0]["state"] == "SUCCEEDED" and listed["details"][0]["result"] == job["result"]
        assert any("moved aside" in n for n in listed["notices"])
        fits = await call_ok(client, "list_scaling_fits", {})
        assert fits["total"] == 0
        text = await call_error(client, "predict_scaling", {"fit_id": fit["fit_id"], "compute": [1000.0]})
        assert f"no fit with id {fit['fit_id']!r}" in text and "moved aside" in text, text
    assert len(list(settings.home.glob("state.db.damaged-*"))) == 1


@pytest_anyio
async def test_bad_rows_through_the_tools(settings: Settings, home_cleanup: Path) -> None:
    async with Client(create_test_suite(suite_app(settings)), mode="auto") as client:
        good = await call_ok(client, "fit_scaling_law", {"model": "scalerl", "data": {"points": CURVE}, "bootstrap": 0})
        bad = await call_ok(  # another label: the same law, points and settings again would return the stored fit
            client, "fit_scaling_law", {"model": "scalerl", "data": {"points": CURVE}, "bootstrap": 0, "label": "b"}
        )
        assert bad["fit_id"] != good["fit_id"]
        with contextlib.closing(sqlite3.connect(settings.db_path)) as conn, conn:
            conn.execute("UPDATE fits SET outcome = '{broken' WHERE id = ?", (bad["fit_id"],))
            conn.execute(
                "INSERT INTO jobs (id, kind, spec, state, created_at, timeout_s, owner, job_dir) VALUES "
                "('bad-row', 'test_count', 'nope', 'WEIRD', 1, 60, 'test', '')"
            )
        listed = await call_ok(client, "list_scaling_fits", {})
        assert [f["fit_id"] for f in listed["fits"]] == [good["fit_id"]]
        text = await call_error(client, "predict_scaling", {"fit_id": bad["fit_id"], "compute": [1000.0]})
        assert "is damaged in the state database" in text, text
        assert await call_ok(client, "predict_scaling", {"fit_id": good["fit_id"], "compute": [1000.0]})
        jobs = await call_ok(client, "list_jobs", {})
        [row] = jobs["jobs"]
        assert row["job_id"] == "bad-row" and row["state"] == "LOST" and "warning(s): get_job" in row["summary"]
        viewed = await client.call_tool("get_job", {"job_id": "bad-row"})
        assert not viewed.is_error and "Warning: the database row of this job is damaged" in viewed.content[0].text


@pytest_anyio
async def test_an_unusable_state_directory_leaves_the_other_tools_working(settings: Settings) -> None:
    settings.home.mkdir(parents=True)
    settings.db_path.mkdir()  # a folder where the database should be
    async with Client(create_test_suite(suite_app(settings)), mode="auto") as client:
        assert (await call_ok(client, "predict_scaling", EVALUATE))["values"]
        text = await call_error(client, "list_jobs", {})
        assert "cannot be used" in text and str(settings.db_path) in text, text
    assert settings.db_path.is_dir()  # left alone
