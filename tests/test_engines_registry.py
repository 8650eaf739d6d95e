"""The engines registry: a backend is one class and one registry line.

A toy backend declared here (it runs the planned argv as a subprocess of the job's worker and reports its state from
that process) is registered by a fixture and driven through the launch tools of an in-process MCP client: planned,
submitted, followed by the job engine's worker (which rebuilds it from the declaration the server stored with the
job: it never ran this fixture), read, cancelled; a lost idempotency-key bind of its job is recovered. The registry's
own rules (duplicate names, unknown capabilities, unknown names) are unit-tested.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from servers.core.jobfiles import JobFiles, atomic_write_json, read_json
from servers.core.jobstore import JobState
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from servers.engines import registry
from servers.engines.backend import (
    JOB_DIR_PLACEHOLDER,
    Backend,
    BackendHandle,
    BackendPlan,
    EngineStatus,
    SubmitRequest,
)
from servers.engines.registry import BackendInfo
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

SUBMIT_RECORD = "toy-submit.json"
EXIT_RECORD = "toy-exit.json"


class ToyBackend:
    """The planned argv as a subprocess of this process (the job's worker): its output is the job's rank0 log, its
    exit code the job's end. Idempotent by a submit record in the job folder; a process it did not start and that
    left no exit record is RUNNING while it lives and LOST once gone."""

    name = "toy"

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.cancelled: set[str] = set()

    def available(self) -> tuple[bool, str]:
        return True, f"subprocesses of {sys.executable}"

    def plan(self, spec: Mapping[str, Any], settings: Settings | None = None) -> BackendPlan:
        return BackendPlan(
            backend=self.name,
            argv=[sys.executable, str(spec["script"]), *spec.get("args", [])],
            cwd=JOB_DIR_PLACEHOLDER,
            notes=["a subprocess of the job's worker"],
        )

    def submit(self, plan: BackendPlan, request: SubmitRequest) -> BackendHandle:
        folder = Path(plan.cwd)
        record = read_json(folder / SUBMIT_RECORD)
        if isinstance(record, dict) and record.get("key") == request.key:
            return BackendHandle(backend=self.name, key=request.key, native_id=str(record["pid"]), job_dir=str(folder))
        log = JobFiles(folder).log("rank0")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(plan.argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        atomic_write_json(folder / SUBMIT_RECORD, {"key": request.key, "pid": proc.pid})
        self.procs[str(proc.pid)] = proc
        return BackendHandle(backend=self.name, key=request.key, native_id=str(proc.pid), job_dir=str(folder))

    def status(self, handle: BackendHandle) -> EngineStatus:
        folder = Path(str(handle.job_dir))
        proc = self.procs.get(handle.native_id)
        if proc is not None and (code := proc.poll()) is not None:
            atomic_write_json(folder / EXIT_RECORD, {"code": code, "cancelled": handle.native_id in self.cancelled})
        ended = read_json(folder / EXIT_RECORD)
        if isinstance(ended, dict):
            code = int(ended["code"])
            if ended["cancelled"]:
                return EngineStatus(state=JobState.CANCELLED, native_state="KILLED", exit_code=code)
            state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
            return EngineStatus(state=state, native_state=f"EXITED {code}", exit_code=code)
        if proc is not None or _alive(int(handle.native_id)):
            return EngineStatus(state=JobState.RUNNING, native_state="RUNNING")
        return EngineStatus(state=JobState.LOST, native_state="GONE", reason="the process ended and left no record")

    def cancel(self, handle: BackendHandle) -> JobState:
        proc = self.procs.get(handle.native_id)
        if proc is None or proc.poll() is not None:
            return self.status(handle).state
        self.cancelled.add(handle.native_id)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return self.status(handle).state


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def toy() -> Iterator[BackendInfo]:
    info = registry.register(BackendInfo(name="toy", summary="a subprocess here", factory=ToyBackend, poll_s=0.2))
    yield info
    registry.unregister("toy")


SCRIPT = """import os, sys, time
print("toy says", " ".join(sys.argv[1:]), flush=True)
if len(sys.argv) > 2 and sys.argv[1] == "--wait":
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    time.sleep(120)
"""


def toy_spec(tmp_path: Path, *args: str, **extra: Any) -> dict[str, Any]:
    script = tmp_path / "toy_train.py"
    script.write_text(SCRIPT)
    return {"script": str(script), "args": list(args), "backend": "toy", "max_wall_s": 300, **extra}


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_toy_backend_registered_here_works_through_the_launch_tools(
    toy: BackendInfo, app: App, tmp_path: Path
) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        listed = {b["name"]: b for b in (await ok(client, "list_backends", {}))["backends"]}
        assert listed["toy"]["detected"] and listed["toy"]["detail"] == f"subprocesses of {sys.executable}"

        plan = await ok(client, "plan_training_job", {"spec": toy_spec(tmp_path, "hello", "world")})
        assert plan["backend"] == "toy" and plan["argv"][-2:] == ["hello", "world"]
        job = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        done = await finish_job(client, job["job_id"], 90)
        assert done["state"] == "SUCCEEDED", done["reason"]
        record = app.engine.get(job["job_id"])
        assert record.spec["backend_info"]["factory"] == f"{__name__}:ToyBackend"  # what the worker built it from
        logs = await ok(client, "read_job_logs", {"job_id": job["job_id"], "process": "rank0"})
        assert "toy says hello world" in json.dumps(logs)
        assert (await ok(client, "get_job", {"job_id": job["job_id"]}))["state"] == "SUCCEEDED"

        pidfile = tmp_path / "toy.pid"
        waiting = await ok(
            client, "submit_training_job", {"spec": toy_spec(tmp_path, "--wait", str(pidfile)), "wait_s": 0}
        )
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            await anyio.sleep(0.1)
        pid = int(pidfile.read_text())
        assert _alive(pid)
        await ok(client, "cancel_job", {"job_id": waiting["job_id"]})
        cancelled = await finish_job(client, waiting["job_id"], 60)
        assert cancelled["state"] == "CANCELLED", cancelled["reason"]
        assert not _alive(pid), "the toy's process outlived its cancelled job"


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_lost_key_bind_of_a_remote_job_is_recovered(toy: BackendInfo, app: App, tmp_path: Path) -> None:
    from servers.core.db import connect
    from servers.launch.training import IdempotencyKeys

    spec = toy_spec(tmp_path, "keyed", idempotency_key="toy-lost-bind")
    async with Client(create_test_suite(app), mode="legacy") as client:
        first = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
        # The server died after the follower's job was recorded, before the key was bound to it:
        with connect(app.settings.db_path) as conn:
            conn.execute("UPDATE launch_keys SET job_id = NULL WHERE key = 'toy-lost-bind'")
        again = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
        assert again["job_id"] == first["job_id"]
        assert IdempotencyKeys(app.settings).lookup("toy-lost-bind")[1] == first["job_id"]
        assert (await finish_job(client, first["job_id"], 90))["state"] == "SUCCEEDED"
        assert (await ok(client, "list_jobs", {}))["total"] == 1


@pytest.mark.anyio
async def test_an_unknown_backend_is_refused_naming_the_registered_ones(toy: BackendInfo, app: App) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        text = await error(client, "plan_training_job", {"spec": {"recipe": "tiny-gpt", "backend": "nosuch"}})
    assert "'nosuch' is not a known backend" in text and "toy" in text and "slurm" in text


def test_the_toy_is_a_backend_and_the_builtin_ones_declare_their_abilities(toy: BackendInfo) -> None:
    assert isinstance(toy.build({}), Backend)
    assert registry.get("toy") is toy and "toy" in registry.names()
    assert registry.with_capability("arrays") == ("slurm",)
    assert registry.with_capability("log_sync") == ("kubernetes",)
    assert registry.with_capability("in_engine") == ("local",)
    assert not toy.can("in_engine")


def test_duplicate_names_are_refused() -> None:
    first = registry.register(BackendInfo(name="twice", summary="one", factory=ToyBackend))
    try:
        assert registry.register(first) is first  # the same declaration again: a module imported twice
        with pytest.raises(ValueError, match="'twice' is registered already"):
            registry.register(BackendInfo(name="twice", summary="two", factory=ToyBackend))
        with pytest.raises(ValueError, match="'local' is registered already"):
            registry.register(BackendInfo(name="local", summary="mine", factory=ToyBackend))
    finally:
        registry.unregister("twice")
    assert "twice" not in registry.names()


def test_unknown_capabilities_and_names_are_refused_with_what_is_accepted() -> None:
    with pytest.raises(ValueError, match=r"unknown capabilities \['gpus'\]; known: arrays, cluster_nodes"):
        BackendInfo(name="odd", summary="x", factory=ToyBackend, capabilities=frozenset({"gpus"}))
    with pytest.raises(ValueError, match="unknown capability 'gpus'"):
        registry.get("local").can("gpus")
    with pytest.raises(ValueError, match="lower-case letters"):
        BackendInfo(name="Bad-Name", summary="x", factory=ToyBackend)
    with pytest.raises(ValueError, match="poll_s must be > 0"):
        BackendInfo(name="fast", summary="x", factory=ToyBackend, poll_s=0)
    with pytest.raises(ValueError) as refused:
        registry.get("nosuch")
    assert str(refused.value) == (
        "backend: 'nosuch' is not a known backend; accepted: " + ", ".join(registry.names())
    ) and "slurm" in str(refused.value)


def test_a_declaration_travels_with_a_job_as_references() -> None:
    for name in registry.names():
        info = registry.get(name)
        again = registry.from_record(json.loads(json.dumps(info.record())))
        assert (again.name, again.poll_s, again.grace_s, again.capabilities) == (
            info.name,
            info.poll_s,
            info.grace_s,
            info.capabilities,
        )
        assert registry.resolve(again.factory) is registry.resolve(info.factory)
    assert registry.get("skypilot").record()["grace_s"] == 6 * 3600.0
    with pytest.raises(ValueError, match="no module-level name"):
        BackendInfo(name="closure", summary="x", factory=lambda config: ToyBackend(config)).record()
    with pytest.raises(ValueError, match="lacks 'factory'"):
        registry.from_record({"name": "toy", "poll_s": 1, "grace_s": 1})


def test_a_stored_plan_is_read_back_as_the_backends_plan_model() -> None:
    from servers.launch.ray_backend import RayPlan

    plan = {"backend": "ray", "argv": ["x"], "cwd": "/"}
    assert type(registry.get("slurm").load_plan(plan)) is BackendPlan
    ray = {**plan, "runtime_env": {"env_vars": {}}, "entrypoint_num_cpus": 1, "entrypoint_num_gpus": 0}
    assert type(registry.get("ray").load_plan(ray)) is RayPlan


class Scripted:
    """A backend whose job runs for three statuses, then succeeds; it can sync logs, whether declared or not."""

    name = "scripted"

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.statuses = 0
        self.synced: list[bool] = []
        self.cancelled = False

    def status(self, handle: BackendHandle) -> EngineStatus:
        self.statuses += 1
        if self.cancelled:
            return EngineStatus(state=JobState.CANCELLED, native_state="CANCELLED")
        if self.statuses < 3:
            return EngineStatus(state=JobState.RUNNING, native_state="RUNNING")
        return EngineStatus(state=JobState.SUCCEEDED, native_state="DONE")

    def cancel(self, handle: BackendHandle) -> JobState:
        self.cancelled = True
        return JobState.CANCELLED

    def sync_logs(self, handle: BackendHandle, job_dir: Path | str, *, final: bool = False) -> None:
        self.synced.append(final)


class Context:
    def __init__(self, folder: Path) -> None:
        self.files = JobFiles(folder)
        self.said: list[str] = []
        self.states: list[str] = []

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self.said.append(message or "")

    def report_state(self, state: str, reason: str | None = None, started_at: float | None = None) -> None:
        self.states.append(state)


def test_follow_syncs_logs_only_for_a_backend_that_declares_it(tmp_path: Path) -> None:
    import threading

    from servers.engines.follow import follow

    handle = BackendHandle(backend="scripted", key="k", native_id="1", job_dir=str(tmp_path))
    for capabilities, synced in ((frozenset({"log_sync"}), [False, False, True]), (frozenset(), [])):
        info = BackendInfo(name="scripted", summary="x", factory=Scripted, poll_s=0.01, capabilities=capabilities)
        backend, ctx = Scripted({}), Context(tmp_path)
        status = follow(backend, handle, ctx, threading.Event(), info=info)  # type: ignore[arg-type]
        assert status.state is JobState.SUCCEEDED and backend.statuses == 3
        assert backend.synced == synced  # declared, never found by getattr
        assert ctx.states == ["RUNNING"] and ctx.said == ["scripted RUNNING"]
    stop = threading.Event()
    stop.set()
    backend = Scripted({})
    info = BackendInfo(name="scripted", summary="x", factory=Scripted, poll_s=0.01)
    assert follow(backend, handle, Context(tmp_path), stop, info=info).state is JobState.CANCELLED  # type: ignore[arg-type]
    assert backend.cancelled


def test_every_bundled_backend_implements_what_it_declares(tmp_path: Path) -> None:
    from servers.engines.backend import ArrayBackend, LogSyncBackend

    settings = Settings(home=tmp_path / "state", allowed_roots=[tmp_path])
    for name in ("local", "slurm", "ray", "kubernetes", "skypilot"):
        info = registry.get(name)
        in_engine = {"engine": None, "kind": "training"}  # built, never used: no job engine needed
        backend = info.build(in_engine if info.can("in_engine") else info.config_for(settings))
        assert backend.name == name and isinstance(backend, Backend)
        if info.can("log_sync"):
            assert isinstance(backend, LogSyncBackend), name
        if info.can("arrays"):
            assert isinstance(backend, ArrayBackend), name
        else:
            assert not isinstance(backend, ArrayBackend), name  # an array a sweep would never use


def test_a_remote_job_names_its_backend_by_its_stored_declaration_else_by_name() -> None:
    from servers.launch.remote import declared

    assert declared({"backend": "slurm"}) is registry.get("slurm")  # a job stored before declarations travelled
    stored = BackendInfo(name="elsewhere", summary="x", factory=ToyBackend, poll_s=3.0).record()
    rebuilt = declared({"backend": "elsewhere", "backend_info": stored})  # never registered in this process
    assert rebuilt.name == "elsewhere" and rebuilt.poll_s == 3.0 and isinstance(rebuilt.build({}), ToyBackend)
    with pytest.raises(ValueError, match="not a known backend"):
        declared({"backend": "elsewhere"})
