"""Issue 21's structural fix: a job cannot reach the server's state. Each attack of the review is performed by a real
training job (tests/fixtures/launch/attack_state.py) through the tools: approving a costly launch in the database,
forging its own exit record and killing its supervisor, reading launch.key, rewriting the tool cache, reading other
jobs' folders, unmounting the sandbox, writing the package's code, escaping through /proc. And the engine's side of
defect 3: a job whose supervisor is gone (killed from outside) while its processes live is still RUNNING, counted,
cancellable, held to its wall time, and its own exit.json is not believed."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client

from servers.core.errors import QuotaError
from servers.core.jobfiles import JobFiles
from servers.core.jobs import JobEngine, JobKind
from servers.core.jobstore import JobState
from servers.core.mcp_layer import App
from servers.core.procs import ProcessIdentity, group_members
from servers.core.sandbox import Layout, probe, sandbox_argv
from servers.core.settings import Settings
from tests.conftest import CHILD_ENV, REPO_ROOT
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, host_pids

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "launch"
needs_sandbox = pytest.mark.skipif(not probe().available, reason=f"no sandbox here: {probe().detail}")
COSTLY = {"recipe": "tiny-gpt", "args": ["--steps", "3"], "nproc_per_node": 2, "gpus_per_node": 2, "max_wall_s": 3600}


@pytest.fixture
def pretend_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import servers.core.machine as machine

    monkeypatch.setattr(machine, "gpus_present", lambda: 2)


def _wait_for(path: Path, limit_s: float = 120) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return json.loads(path.read_text())
        time.sleep(0.2)
    raise AssertionError(f"{path} was not written in {limit_s} s")


@needs_sandbox
@pytest.mark.anyio
@pytest.mark.timeout(300)
async def test_a_job_cannot_reach_the_servers_state(app: App, tmp_path: Path, pretend_gpus: None) -> None:
    script = tmp_path / "scripts" / "attack_state.py"
    script.parent.mkdir()
    shutil.copy(FIXTURES / "attack_state.py", script)
    out = tmp_path / "attack.json"
    planted = REPO_ROOT / "servers" / "_planted_by_a_job.py"
    env = {"JOB_ATTACK_OUT": str(out), "JOB_ATTACK_SLEEP": "60", "JOB_ATTACK_PACKAGE": str(REPO_ROOT)}
    spec = {"script": str(script), "nproc_per_node": 1, "gpus_per_node": 0, "max_wall_s": 600, "env": env}
    try:
        async with Client(create_test_suite(app), mode="legacy") as client:
            costly = await ok(client, "plan_training_job", {"spec": COSTLY})
            assert costly["needs_confirmation"]
            plan = await ok(client, "plan_training_job", {"spec": spec})
            assert not plan["needs_confirmation"] and "servers.core.sandbox" in " ".join(plan["argv"])
            job = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
            report = _wait_for(out)
            for attack in (
                "approve_in_db",
                "forge_exit",
                "read_key",
                "rewrite_cache",
                "see_other_jobs",
                "kill_supervisor",
                "unmount_state",
                "write_package",
                "through_proc",
            ):
                assert str(report[attack]).startswith("refused"), (attack, report[attack])
            assert report["processes_seen"] <= 4  # its init, its torchrun and rank (and a helper at most)
            # The launch the job tried to approve still needs the person; the audit says nothing of an approval.
            text = await error(client, "submit_training_job", {"plan_token": costly["plan_token"]})
            assert "cannot approve" in text
            with sqlite3.connect(app.settings.db_path) as conn:
                approved = conn.execute("SELECT approved_at FROM launch_approvals").fetchall()
            assert approved and all(row[0] is None for row in approved)
            # It runs on, and says so; its exit.json was never written, its own metrics were.
            time.sleep(3)
            view = await ok(client, "get_job", {"job_id": job["job_id"]})
            assert view["state"] == "RUNNING", view
            record = app.engine.get(job["job_id"])
            assert not JobFiles(record.job_dir).exit.exists()
            assert (Path(record.job_dir) / "checkpoints" / "ckpt.txt").read_text() == "ok"
            metrics = await ok(client, "read_job_metrics", {"job_id": job["job_id"]})
            assert metrics["rows"] and metrics["rows"][0]["step"] == 1
            workers = host_pids(list(range(1, 64)), "attack_state.py")
            assert workers
            cancelled = await ok(client, "cancel_job", {"job_id": job["job_id"]})
            assert cancelled["state"] == "CANCELLED"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and any(ProcessIdentity.of(p).is_alive() for p in workers):
                time.sleep(0.2)
            alive = [p for p in workers if ProcessIdentity.of(p).is_alive()]
            assert not alive, [Path(f"/proc/{p}/status").read_text()[:300] for p in alive]
    finally:
        planted.unlink(missing_ok=True)


@needs_sandbox
@pytest.mark.timeout(120)
def test_the_sandbox_kills_what_a_command_leaves_behind_and_ends_as_it_did(tmp_path: Path) -> None:
    """A daemon a job starts (double fork, its own session) does not outlive the job; the launcher's exit status is
    the command's: its code, or the signal that ended it."""
    marker = f"sandbox-orphan-{os.getpid()}"
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execvp(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', {marker!r}])\n"
        "    os._exit(0)\n"
        "time.sleep(1)\n"
        "sys.exit(7)\n"
    )
    layout = Layout(hide=(str(tmp_path / "state"),), network="isolated")
    (tmp_path / "state").mkdir()
    done = subprocess.run(sandbox_argv([sys.executable, "-c", code], layout), timeout=60, capture_output=True)
    assert done.returncode == 7, done.stderr
    time.sleep(0.5)
    assert host_pids(list(range(1, 64)), marker) == []
    killed = subprocess.run(
        sandbox_argv([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], layout),
        timeout=60,
        capture_output=True,
    )
    assert killed.returncode == -signal.SIGSEGV, killed.stderr


def test_without_the_sandbox_a_plan_is_refused_and_says_what_to_set(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servers.core import sandbox
    from servers.core.errors import InputError
    from servers.launch import training

    monkeypatch.setattr(sandbox, "probe", lambda network="isolated": sandbox.Probe(False, "unshare(user): EPERM"))
    with pytest.raises(InputError, match="LLM_INFRA_MCP_JOB_SANDBOX=off") as caught:
        training.plan(settings, training.TrainingJobSpec(recipe="tiny-gpt"), gpus_present=0, gpus_in_use=0)
    assert "EPERM" in str(caught.value)
    off = training.plan(
        settings.model_copy(update={"job_sandbox": "off"}),
        training.TrainingJobSpec(recipe="tiny-gpt"),
        gpus_present=0,
        gpus_in_use=0,
    )
    assert "servers.core.sandbox" not in " ".join(off.argv)
    assert any("LLM_INFRA_MCP_JOB_SANDBOX=off" in w for w in off.warnings)


def test_a_script_inside_the_state_directory_is_refused(settings: Settings) -> None:
    from servers.core.errors import InputError
    from servers.launch import training

    inside = settings.home / "scripts" / "train.py"
    inside.parent.mkdir(parents=True)
    inside.write_text("print('hi')\n")
    with pytest.raises(InputError, match="inside the state directory"):
        training.plan(
            settings.model_copy(update={"allowed_roots": [settings.home]}),
            training.TrainingJobSpec(script=str(inside)),
            gpus_present=0,
            gpus_in_use=0,
        )


# ---- the engine: a job whose supervisor is gone while its processes live ------------------------------------------
def _sleeping_job(engine: JobEngine, seconds: float, timeout_s: float = 120) -> str:
    return engine.submit("sleepy", {"seconds": seconds}, timeout_s=timeout_s).id


def _running(engine: JobEngine, job_id: str) -> None:
    deadline = time.monotonic() + 60
    while engine.get(job_id).worker_pid is None or engine.get(job_id).state is not JobState.RUNNING:
        assert time.monotonic() < deadline, engine.get(job_id)
        time.sleep(0.1)


def _orphan(engine: JobEngine, job_id: str, state: str = "SUCCEEDED") -> None:
    """What the review's job did, from outside: forge an end in exit.json and SIGKILL the supervisor."""
    record = engine.get(job_id)
    forged = {"state": state, "exit_code": 0, "reason": "forged", "ended_at": 1.0}
    JobFiles(record.job_dir).exit.write_text(json.dumps(forged))
    assert record.supervisor_pid is not None
    os.kill(record.supervisor_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while ProcessIdentity(record.supervisor_pid, record.supervisor_start, record.boot_id or "").is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.fixture
def sleepy_engine(tmp_path: Path) -> JobEngine:
    settings = Settings(home=tmp_path / "state", cancel_grace_s=1.0, max_concurrent_jobs=1, allowed_roots=[tmp_path])
    engine = JobEngine(settings, owner="test", child_env=CHILD_ENV)
    engine.register_kind(JobKind("sleepy", "tests.jobkinds:sleep", "sleeps", 120))
    return engine


@pytest.mark.timeout(120)
def test_a_job_whose_supervisor_was_killed_still_runs_counts_and_cancels(sleepy_engine: JobEngine) -> None:
    engine = sleepy_engine
    job_id = _sleeping_job(engine, 90)
    _running(engine, job_id)
    _orphan(engine, job_id)
    record = engine.get(job_id)
    assert record.state is JobState.RUNNING, record.reason
    assert "not believed" in (record.reason or "")
    with pytest.raises(QuotaError):  # it is still counted: max_concurrent_jobs 1
        _sleeping_job(engine, 1)
    worker = record.worker_pid
    assert worker is not None and group_members(worker, record.worker_start)
    started = time.monotonic()
    ended = engine.cancel(job_id)
    assert ended.state is JobState.CANCELLED and time.monotonic() - started < 15
    assert not group_members(worker, record.worker_start)


@pytest.mark.timeout(120)
def test_an_orphaned_job_is_held_to_its_wall_time(sleepy_engine: JobEngine) -> None:
    engine = sleepy_engine
    job_id = _sleeping_job(engine, 90, timeout_s=4)
    _running(engine, job_id)
    _orphan(engine, job_id)
    assert engine.get(job_id).state is JobState.RUNNING
    deadline = time.monotonic() + 30
    while (record := engine.get(job_id)).state is JobState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert record.state is JobState.FAILED and "wall-time limit" in (record.reason or ""), record.reason
    assert record.worker_pid is not None and not group_members(record.worker_pid, record.worker_start)


@pytest.mark.timeout(120)
def test_once_its_processes_are_gone_an_orphaned_jobs_record_is_read(sleepy_engine: JobEngine) -> None:
    """The control: the exit record is believed once nothing of the job runs (what the supervisor writes last)."""
    engine = sleepy_engine
    job_id = _sleeping_job(engine, 3)
    _running(engine, job_id)
    _orphan(engine, job_id, state="FAILED")
    assert engine.get(job_id).state is JobState.RUNNING
    deadline = time.monotonic() + 30
    while (record := engine.get(job_id)).state is JobState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert record.state is JobState.FAILED and record.reason == "forged"


def test_the_state_directory_is_the_users_alone(tmp_path: Path) -> None:
    """Other local users read nothing of it: created 0700, and an existing one open to others is tightened."""
    fresh = tmp_path / "fresh"
    JobEngine(Settings(home=fresh, allowed_roots=[tmp_path]), owner="test")
    assert fresh.stat().st_mode & 0o777 == 0o700
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    JobEngine(Settings(home=old, allowed_roots=[tmp_path]), owner="test")
    assert old.stat().st_mode & 0o077 == 0


def test_a_workdir_in_the_packages_folder_is_refused(settings: Settings) -> None:
    """The sandbox makes the package read-only; a workdir mounted writable inside it would undo that."""
    from servers.core.errors import InputError
    from servers.launch import training

    inside = REPO_ROOT / "servers" / "launch"
    wide = settings.model_copy(update={"allowed_roots": [REPO_ROOT, settings.home.parent]})
    with pytest.raises(InputError, match="never write"):
        training.plan(
            wide,
            training.TrainingJobSpec(recipe="tiny-gpt", workdir=str(inside)),
            gpus_present=0,
            gpus_in_use=0,
        )
