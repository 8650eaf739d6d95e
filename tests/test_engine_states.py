"""Issue 22, defect 5: a job that has not started is never RUNNING.

The reproduction: a Slurm job that could never start (PENDING, PartitionConfig) was RUNNING in get_job for minutes,
its pending reason only in the progress text: the supervisor marked every job RUNNING once its worker (here the
follower) started. Now a job that follows another engine has that engine's state, reported by the follower over a
pipe only it holds (servers/core/engine_state.py): QUEUED while the engine holds it pending, with the engine's
reason; RUNNING only once the engine runs it; its start (run time, wall-time limit) is the engine's.

The property, for every backend: each state the backend's own table (Slurm, Ray, SkyPilot) or status code (the
Kubernetes stand-in API) maps to QUEUED, STARTING or RUNNING is the job's state in get_job's view, in a seeded
random order, repeats and requeues included. The real Slurm reproduction is in tests/test_launch_slurm.py.
"""

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from servers.core.engine_state import StateReader, parse_report, write_report
from servers.core.jobs import JobEngine
from servers.core.jobstore import JobRecord, JobState
from servers.core.jobview import job_view
from servers.core.settings import Settings
from servers.engines.backend import EngineStatus, map_state
from servers.launch.ray_backend import RAY_STATES
from servers.launch.skypilot import MANAGED_JOB_STATES
from servers.launch.slurm import SLURM_STATES
from tests.conftest import CHILD_ENV
from tests.engine_follow import FOLLOW_KIND, KIND, write_status

ACTIVE = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING)
TABLES = {"slurm": SLURM_STATES, "ray": RAY_STATES, "skypilot": MANAGED_JOB_STATES}


@pytest.fixture
def engine(settings: Settings) -> JobEngine:
    engine = JobEngine(settings, owner="test", child_env=CHILD_ENV)
    engine.register_kind(KIND)
    return engine


def wait_for(engine: JobEngine, job_id: str, done: Callable[[JobRecord], bool], limit_s: float = 15) -> JobRecord:
    deadline = time.monotonic() + limit_s
    while True:
        record = engine.get(job_id)
        if done(record) or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


def table_statuses(name: str) -> list[EngineStatus]:
    """Every native state of the backend's table that maps to an active state, as its status() would say it."""
    now = time.time()
    statuses = []
    for native in TABLES[name]:
        state = map_state(TABLES[name], native)
        if state in ACTIVE:
            started = now - 3 if state is JobState.RUNNING else None
            statuses.append(EngineStatus(state=state, native_state=native, reason=f"why-{native}", started_at=started))
    return statuses


def kubernetes_statuses(tmp_path: Path) -> list[EngineStatus]:
    """What the real Kubernetes backend says of each active scenario of the stand-in API (tests/fixtures/k8s)."""
    from tests.test_k8s_backend import STATUS_CASES, FakeKubernetes, KubernetesBackend, need_client, submit

    need_client()
    api = FakeKubernetes().start()
    try:
        backend = KubernetesBackend(kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")))
        statuses = []
        for index, (phase, (state, _)) in enumerate(STATUS_CASES.items()):
            api.next_scenario = [(phase, 1)]
            queue = {"queue": "team-a"} if phase == "suspended" else {}
            status = backend.status(submit(backend, tmp_path / f"k{index}", f"key-{index}", **queue))
            assert status.state == state, (phase, status)
            statuses.append(status.model_copy(update={"native_state": f"{status.native_state} ({phase})"}))
        return statuses
    finally:
        api.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["slurm", "ray", "skypilot", "kubernetes"])
def test_every_pending_engine_state_is_queued_in_get_job(engine: JobEngine, tmp_path: Path, backend: str) -> None:
    statuses = kubernetes_statuses(tmp_path) if backend == "kubernetes" else table_statuses(backend)
    assert {s.state for s in statuses} >= {JobState.QUEUED, JobState.RUNNING}, statuses
    rng = random.Random(22)
    order = statuses + rng.sample(statuses, len(statuses))  # each once, then again in another order (requeues)
    rng.shuffle(order)
    control = tmp_path / "engine.json"
    write_status(control, order[0])
    record = engine.submit(FOLLOW_KIND, {"backend": backend, "control": str(control)})
    assert record.state in (JobState.QUEUED, JobState.STARTING)  # never RUNNING because its follower starts
    ran = False
    for status in order:
        write_status(control, status)
        said = f"{backend} {status.native_state}"
        record = wait_for(engine, record.id, lambda r: r.state is status.state and said in (r.reason or ""))  # noqa: B023
        view = job_view(record)
        assert view.state is status.state and said in (view.reason or ""), (status, view.state, view.reason)
        ran = ran or status.state is JobState.RUNNING
        if not ran:  # nothing counted as run time before the engine ran it
            assert view.started_at is None and view.elapsed_s is None, view
        else:
            assert record.started_at is not None and record.started_at >= record.created_at
    write_status(control, EngineStatus(state=JobState.SUCCEEDED, native_state="DONE"))
    record = wait_for(engine, record.id, lambda r: r.state.terminal)
    assert record.state is JobState.SUCCEEDED, record.reason


@pytest.mark.timeout(60)
def test_the_wall_time_limit_counts_from_the_engines_start(engine: JobEngine, tmp_path: Path) -> None:
    control = tmp_path / "engine.json"
    write_status(control, EngineStatus(state=JobState.QUEUED, native_state="PENDING", reason="Priority"))
    job = engine.submit(FOLLOW_KIND, {"backend": "slurm", "control": str(control)}, timeout_s=4)
    queued = wait_for(engine, job.id, lambda r: "Priority" in (r.reason or ""))
    assert queued.state is JobState.QUEUED and "PENDING: Priority" in (queued.reason or ""), queued
    time.sleep(2.5)  # in the queue: not run time
    write_status(control, EngineStatus(state=JobState.RUNNING, native_state="RUNNING"))
    running = wait_for(engine, job.id, lambda r: r.state is JobState.RUNNING)
    assert running.state is JobState.RUNNING and running.started_at is not None
    time.sleep(2.5)  # 5 s after the follower started, 2.5 s after the engine did: within the 4 s limit
    assert engine.get(job.id).state is JobState.RUNNING
    ended = wait_for(engine, job.id, lambda r: r.state.terminal, 20)
    assert ended.state is JobState.FAILED and "timed out" in (ended.reason or ""), ended.reason
    assert ended.ended_at is not None and ended.started_at is not None and ended.ended_at - ended.started_at >= 3.5


@pytest.mark.timeout(60)
def test_a_job_queued_past_its_limit_is_ended_as_never_started(engine: JobEngine, tmp_path: Path) -> None:
    control = tmp_path / "engine.json"
    write_status(control, EngineStatus(state=JobState.QUEUED, native_state="PENDING", reason="Resources"))
    job = engine.submit(FOLLOW_KIND, {"backend": "slurm", "control": str(control)}, timeout_s=2)
    ended = wait_for(engine, job.id, lambda r: r.state.terminal, 20)
    assert ended.state is JobState.FAILED and "never started" in (ended.reason or ""), ended.reason
    assert ended.started_at is None and job_view(ended).elapsed_s is None
    assert EngineStatus.model_validate_json(control.read_text()).state is JobState.CANCELLED  # cancelled there


def test_the_channel_takes_only_active_states_and_bounded_lines() -> None:
    read_end, write_end = os.pipe()
    reader = StateReader(read_end)
    try:
        assert reader.latest() is None  # nothing written: no block, no report
        write_report(write_end, "QUEUED", "PENDING: Resources")
        write_report(write_end, "RUNNING", "x" * 10_000, started_at=5.0)
        report = reader.latest()
        assert report is not None and report.state == "RUNNING" and report.started_at == 5.0
        assert report.reason is not None and len(report.reason) <= 500
        with pytest.raises(ValueError, match="accepted: QUEUED, STARTING, RUNNING"):
            write_report(write_end, "SUCCEEDED")
        os.write(write_end, b'{"state": "SUCCEEDED"}\n{"state": "RUNNING", "started_at": "soon"}\nnot json\n')
        os.write(write_end, b"y" * 8_000)  # an overlong line is dropped, not buffered
        assert reader.latest() is None and reader.latest() is None
        os.write(write_end, b'\n{"state": "QUEUED", "reason": "again"}\n')
        again = reader.latest()
        assert again is not None and (again.state, again.reason) == ("QUEUED", "again")
    finally:
        os.close(write_end)
        reader.close()
    assert parse_report(b'{"state": "RUNNING", "started_at": true}') is None
    assert parse_report(b'{"state": "QUEUED", "reason": 3}') is None
