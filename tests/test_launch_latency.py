"""What keeps a job's start and end quick (benchmarks/launch.py): the processes on every job's path import only what
they need, and an ended process is noticed when it ends, not at the next poll."""

import atexit
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from servers.core.jobfiles import JobContext
from servers.core.jobs import JobEngine, JobKind
from servers.core.jobstore import JobRecord, JobState
from servers.core.procs import exit_watch, process_start_time, sleep_until_exit
from servers.core.settings import Settings
from tests.conftest import CHILD_ENV

REPO = Path(__file__).resolve().parents[1]


def _imported(module: str, *flags: str) -> set[str]:
    code = (
        f"import sys, json; sys.path.insert(0, {str(REPO)!r}); import {module}; print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(done.stdout))


@pytest.mark.timeout(120)
def test_the_supervisor_and_the_launchers_import_no_model_library() -> None:
    # The supervisor runs before every job's worker; pydantic alone would add ~100 ms of imports to each start.
    heavy = {"pydantic", "pydantic_core", "pydantic_settings", "anyio", "mcp", "torch"}
    assert not heavy & _imported("servers.core.supervisor")
    # The sandbox and network launchers start with -S (no site-packages): they must need the standard library only.
    for module in ("servers.core.sandbox", "servers.core.netns"):
        assert not heavy & _imported(module, "-S")
    # A local training job's worker imports its work function's module before torchrun starts: not the settings
    # machinery (~70 ms), nor the MCP SDK or torch.
    assert not {"pydantic_settings", "mcp", "anyio", "torch"} & _imported("servers.launch.local")


@pytest.mark.timeout(60)
def test_sleep_until_exit_wakes_when_the_process_ends() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    start_time = process_start_time(proc.pid)
    try:
        began = time.monotonic()
        anyio.run(sleep_until_exit, proc.pid, start_time, 30.0)
        waited = time.monotonic() - began
    finally:
        proc.wait(timeout=30)
    assert waited < 20, f"woke after {waited:.1f} s, not when the process ended"


@pytest.mark.timeout(60)
def test_sleep_until_exit_sleeps_the_whole_time_while_the_process_runs() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        began = time.monotonic()
        anyio.run(sleep_until_exit, proc.pid, process_start_time(proc.pid), 0.3)
        assert time.monotonic() - began >= 0.29
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.timeout(60)
def test_a_process_that_cannot_be_watched_gives_a_plain_sleep() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start_time = process_start_time(proc.pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # ended, not yet reaped: a zombie, which a watch would see as ended forever
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            break
        time.sleep(0.01)
    try:
        assert exit_watch(proc.pid, start_time) is None  # a zombie
        alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            wrong = (process_start_time(alive.pid) or 0) + 1
            assert exit_watch(alive.pid, wrong) is None  # the pid now names another process
            assert exit_watch(None, None) is None
            began = time.monotonic()
            anyio.run(sleep_until_exit, alive.pid, wrong, 0.3)
            assert time.monotonic() - began >= 0.29  # slept, did not return at once (no busy loop in a waiter)
        finally:
            alive.kill()
            alive.wait(timeout=30)
    finally:
        proc.wait(timeout=30)


# ---- the worker's quick exit: what a normal exit would do still happens -------------------------------------------
_kept: list[Any] = []


def leave_files_open(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Work that writes to files it never closes (buffered, not flushed) and registers an atexit handler."""
    text = open(ctx.files.run_dir / "unclosed.txt", "w")  # noqa: SIM115 - left open on purpose
    text.write("written, never flushed\n")
    raw = open(ctx.files.run_dir / "unclosed.bin", "wb")  # noqa: SIM115
    raw.write(b"bytes, never flushed")
    _kept.extend([text, raw])
    atexit.register(lambda: (ctx.files.run_dir / "atexit.txt").write_text("ran"))
    return {}


def leave_a_thread(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Work whose non-daemon thread is still working when the function returns: the process waits for it."""

    def late() -> None:
        time.sleep(0.5)
        (ctx.files.run_dir / "thread.txt").write_text("finished")

    threading.Thread(target=late).start()
    return {}


def _engine(settings: Settings) -> JobEngine:
    engine = JobEngine(settings, owner="test", child_env=CHILD_ENV)
    for name in ("leave_files_open", "leave_a_thread"):
        engine.register_kind(JobKind(name=name, entry=f"tests.test_launch_latency:{name}", description=name))
    return engine


def _done(engine: JobEngine, job_id: str, limit_s: float = 60) -> JobRecord:
    deadline = time.monotonic() + limit_s
    while (record := engine.get(job_id)).state.terminal is False:
        assert time.monotonic() < deadline, f"job {job_id} still {record.state}"
        time.sleep(0.05)
    return record


@pytest.mark.timeout(120)
def test_the_quick_exit_flushes_open_files_and_runs_atexit_handlers(settings: Settings) -> None:
    engine = _engine(settings)
    record = _done(engine, engine.submit("leave_files_open", {}).id)
    assert record.state == JobState.SUCCEEDED, record.reason
    run = Path(record.job_dir) / "run"
    assert (run / "unclosed.txt").read_text() == "written, never flushed\n"
    assert (run / "unclosed.bin").read_bytes() == b"bytes, never flushed"
    assert (run / "atexit.txt").read_text() == "ran"


@pytest.mark.timeout(120)
def test_a_worker_waits_for_the_threads_its_work_left_running(settings: Settings) -> None:
    engine = _engine(settings)
    record = _done(engine, engine.submit("leave_a_thread", {}).id)
    assert record.state == JobState.SUCCEEDED, record.reason
    assert (Path(record.job_dir) / "run" / "thread.txt").read_text() == "finished"
