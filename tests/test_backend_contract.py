"""The backend contract: every registered backend passes the same suite, as the launch server drives it (plan,
then bind to the job folder unless the job engine runs the job itself, then submit; status until the job ends;
cancel), against its real engine or its stand-in:

- local: the job engine, on a state directory of this module's own;
- slurm: the session's test cluster (`slurm_cluster`, scripts/slurm-cluster.sh);
- ray: the session's Ray head (`ray_head`);
- kubernetes: the session's stand-in API (`k8s_api`, tests/fixtures/k8s/fake_api.py) over real HTTP;
- skypilot: the in-memory stand-in of SkyPilot's SDK (tests/test_skypilot_backend.py FakeSky), set as `sky`.

The scenarios: a plan has no side effects (no job, no file); a job submitted runs to SUCCEEDED and its output
reaches the job folder; a running job cancelled ends CANCELLED and its processes or engine object are gone; a new
backend object (as after a server restart) finds the job by its key and handle and says the same exact state, and
once the engine forgot the ended job it says how the job ended from the record the job left, or LOST where the
engine keeps none, never a guess. A backend registered without an entry in ENGINES fails here, so that a new
backend cannot go without the contract. What is particular to one backend (Slurm's exit records across nodes,
Kubernetes' manifests, SkyPilot's launch requests) stays in its own test file.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from servers.core.jobfiles import JobFiles
from servers.core.jobstore import JobState
from servers.core.settings import Settings
from servers.engines import registry
from servers.engines.backend import Backend, BackendHandle, BackendPlan, EngineStatus, SubmitRequest
from tests.engine_follow import wait_status, wait_until

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "launch"
QUICK = FIXTURES / "quick.py"  # prints "rank R of N done", exits 0


@dataclass
class Engine:
    """One backend's engine as the contract drives it. `make` builds a new backend object on the same engine and
    state (as a restarted server would); `spec(kind)` is a spec for a "quick" job (ends by itself, exit 0, `words`
    in its log) or a "long" one (runs until cancelled); `drive` tells a stand-in what the submitted job does (real
    engines run the script); `jobs` lists what the engine holds (its ids); `started` holds once a long job's
    processes run; `gone` once a cancelled job's processes or engine object are; `forget` makes the engine forget
    an ended job (None: the engine is the record itself); `keeps_end`: the backend then still says how it ended."""

    name: str
    make: Callable[[], Any]
    spec: Callable[[str], dict[str, Any]]
    jobs: Callable[[], set[str]]
    job_root: Path
    words: str
    drive: Callable[[BackendHandle, str], None] = lambda handle, kind: None
    started: Callable[[Any, BackendHandle], bool] = lambda backend, handle: True
    gone: Callable[[BackendHandle], bool] = lambda handle: True
    forget: Callable[[BackendHandle], None] | None = None
    forget_why: str = ""
    keeps_end: bool = True
    settings: Settings | None = None
    end_s: float = 120.0  # how long a quick job may take to end, queue and start included
    notes: dict[str, Any] = field(default_factory=dict)


def base_spec(script: Path, **extra: Any) -> dict[str, Any]:
    """A spec as training.plan hands it to a backend (the common fields; the backend's own under options)."""
    return {
        "script": str(script),
        "args": [],
        "nproc_per_node": 1,
        "max_restarts": 0,
        "env": {},
        "gpus": None,
        "gpus_wanted": 0,
        "network": "isolated",
        "workdir": None,
        "max_log_bytes": 8 * 1024 * 1024,
        "run_id": "contract",
        "max_wall_s": 600.0,
        "gpus_per_node": 0,
        "nnodes": 1,
        "idempotency_key": None,
        "recipe": None,
        "name": "contract",
        "tags": [],
        "options": {},
    } | extra


def logs_of(handle: BackendHandle) -> str:
    """Every process's log in the job folder, as read_job_logs serves them ("" before any exists)."""
    if not handle.job_dir:
        return ""
    files = JobFiles(handle.job_dir)
    return "".join(files.log(p).read_text(errors="replace") for p in files.processes() if files.log(p).exists())


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


# ---- the engines -----------------------------------------------------------------------------------------------------
def local_engine(root: Path) -> Iterator[Engine]:
    from servers.core.jobs import JobEngine, JobKind
    from servers.core.procs import ProcessIdentity
    from servers.launch.local import ENTRY, LocalBackend
    from tests.conftest import CHILD_ENV
    from tests.helpers import host_pids

    settings = Settings(home=root / "state", cancel_grace_s=5.0, allowed_roots=[root])
    engines: list[Any] = []

    def make() -> LocalBackend:
        engine = JobEngine(settings, owner="test", child_env=CHILD_ENV)  # a new one: as after a restart
        engine.register_kind(JobKind("train", ENTRY, "torchrun training", 120))
        engines.append(engine)
        return LocalBackend(engine, kind="train")

    def spec(kind: str) -> dict[str, Any]:
        if kind == "quick":
            return base_spec(QUICK)
        return base_spec(FIXTURES / "wait_go.py", nproc_per_node=2, env={"JOB_GO_FILE": str(root / "never")})

    ranks: dict[str, list[Any]] = {}

    def started(backend: LocalBackend, handle: BackendHandle) -> bool:
        said = logs_of(handle)
        logged = [int(m) for m in re.findall(r"pid (\d+)", said)]
        if said.count("waiting") < 2 or len(logged) < 2:
            return False
        ranks[handle.key] = [ProcessIdentity.of(pid) for pid in host_pids(logged, "wait_go.py")]  # own PID namespace
        return len(ranks[handle.key]) == 2 and all(p.is_alive() for p in ranks[handle.key])  # both ranks

    def jobs() -> set[str]:
        engine = engines[0] if engines else make().engine
        return {r.id for r in engine.store.list_jobs(kind="train").jobs}

    yield Engine(
        name="local",
        make=make,
        spec=spec,
        jobs=jobs,
        job_root=settings.home,
        words="rank 0 of 1 done",
        started=started,
        gone=lambda handle: not any(p.is_alive() for p in ranks.get(handle.key, [])),
        forget=None,
        forget_why="the job engine is the engine: its records are where the job's end is kept",
        settings=settings,
    )


def slurm_engine(root: Path, cluster: Path) -> Iterator[Engine]:
    import subprocess

    from servers.launch.slurm import EXIT_RECORD, SlurmBackend

    job_root = root / "slurm-jobs"
    loopback = {"GLOO_SOCKET_IFNAME": "lo"}  # the test cluster's nodes are all 127.0.0.1

    def spec(kind: str) -> dict[str, Any]:
        script = QUICK if kind == "quick" else FIXTURES / "sleep_forever.py"
        made = base_spec(script, env=dict(loopback), max_wall_s=300)
        return {k: v for k, v in made.items() if k != "network"}

    def jobs() -> set[str]:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True, timeout=30)
        return set(out.stdout.split())

    def gone(handle: BackendHandle) -> bool:
        """Slurm ended the job, and its batch script recorded the cancel in its exit record."""
        job = SlurmBackend(job_root=job_root).query(handle.native_id)
        record = read_json(Path(str(handle.job_dir)) / EXIT_RECORD)
        ended = job is None or job.state in ("CANCELLED", "COMPLETED", "FAILED")
        return ended and isinstance(record, dict) and record.get("state") == "CANCELLED"

    def forget(handle: BackendHandle) -> None:
        """Until slurmctld purged the ended job (MinJobAge, then its purge pass)."""
        backend = SlurmBackend(job_root=job_root)
        wait_until(lambda: backend.query(handle.native_id) is None, 150, f"Slurm forgets job {handle.native_id}")

    yield Engine(
        name="slurm",
        make=lambda: SlurmBackend(job_root=job_root),
        spec=spec,
        jobs=jobs,
        job_root=job_root,
        words="rank 0 of 1 done",
        started=lambda backend, handle: "sleeping" in logs_of(handle),
        gone=gone,
        forget=forget,
        end_s=180.0,
    )


def ray_engine(root: Path, head: Any) -> Iterator[Engine]:
    import contextlib

    from servers.launch.ray_backend import EXIT_RECORD as RAY_EXIT_RECORD
    from servers.launch.ray_backend import RayBackend

    job_root = root / "ray-jobs"
    job_root.mkdir()
    pid_files: dict[str, Path] = {}

    def spec(kind: str) -> dict[str, Any]:
        common = {k: v for k, v in base_spec(QUICK).items() if k != "network"}
        if kind == "quick":
            return common | {"launcher": "python"}
        pid_file = root / f"{uuid.uuid4().hex}.pid"
        pid_files["next"] = pid_file
        return common | {
            "script": str(FIXTURES / "ray_sleep.py"),
            "env": {"JOB_PID_FILE": str(pid_file), "JOB_SLEEP_S": "300"},
        }

    submitted: list[str] = []

    def drive(handle: BackendHandle, kind: str) -> None:
        submitted.append(handle.native_id)
        if kind == "long":
            pid_files[handle.key] = pid_files.pop("next")

    def make() -> RayBackend:
        return RayBackend(head.address, auth_token=head.token, jobs_dir=job_root)

    def jobs() -> set[str]:
        return {j.submission_id for j in head.client().list_jobs()}

    def rank_pid(handle: BackendHandle) -> int | None:
        pid_file = pid_files.get(handle.key)
        return int(pid_file.read_text()) if pid_file is not None and pid_file.exists() else None

    def started(backend: RayBackend, handle: BackendHandle) -> bool:
        pid = rank_pid(handle)
        return pid is not None and Path(f"/proc/{pid}").exists()

    def gone(handle: BackendHandle) -> bool:
        """Ray ended the job, its rank is gone, and the wrapper recorded that SIGTERM stopped it."""
        pid = rank_pid(handle)
        record = read_json(Path(str(handle.job_dir)) / RAY_EXIT_RECORD)
        stopped = isinstance(record, dict) and record.get("stopped_by") == "SIGTERM" and record.get("exit_code") != 0
        alive = pid is not None and Path(f"/proc/{pid}").exists()
        return head.client().get_job_status(handle.native_id).is_terminal() and stopped and not alive

    def forget(handle: BackendHandle) -> None:
        time.sleep(1)  # let Ray's job monitor finish with it (a delete while it still runs makes Ray re-record it)
        assert head.client().delete_job(handle.native_id), f"Ray did not delete job {handle.native_id}"

    yield Engine(
        name="ray",
        make=make,
        spec=spec,
        jobs=jobs,
        job_root=job_root,
        words="rank None of None done",  # python, not torchrun: no RANK set
        drive=drive,
        started=started,
        gone=gone,
        forget=forget,
    )
    head.remember()
    client = head.client()
    for sid in submitted:
        with contextlib.suppress(Exception):
            if not client.get_job_status(sid).is_terminal():
                client.stop_job(sid)


def kubernetes_engine(root: Path, fake: Any) -> Iterator[Engine]:
    from servers.launch.kubernetes import KubernetesBackend

    kubeconfig = fake.kubeconfig(root / "kubeconfig")
    job_root = root / "k8s-jobs"
    scenarios = {"quick": [("running", 1), ("complete", 1)], "long": [("running", 1)]}

    def spec(kind: str) -> dict[str, Any]:
        return base_spec(
            REPO / "servers" / "launch" / "recipes" / "tiny_gpt.py",
            recipe="tiny-gpt",
            options={"image": "ghcr.io/acme/train:1"},
        )

    def drive(handle: BackendHandle, kind: str) -> None:
        fake.set_scenario(handle.native_id.rsplit("/", 1)[-1], scenarios[kind])

    def forget(handle: BackendHandle) -> None:
        with fake.lock:
            fake.objects.clear()  # deleted behind the server's back (or by a TTL)

    yield Engine(
        name="kubernetes",
        make=lambda: KubernetesBackend(kubeconfig=str(kubeconfig), cancel_wait_s=5),
        spec=spec,
        jobs=lambda: {s.name for s in list(fake.objects.values())},
        job_root=job_root,
        words="done: loss 1.23",
        drive=drive,
        gone=lambda handle: fake.stored(handle.native_id.rsplit("/", 1)[-1]) is None,
        forget=forget,
    )


def skypilot_engine(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    from servers.launch import skypilot
    from servers.launch.skypilot import SkyPilotBackend, job_name_for
    from tests.test_skypilot_backend import FakeSky, ManagedJobStatus

    fake = FakeSky()
    monkeypatch.setitem(sys.modules, "sky", fake.module())
    monkeypatch.setitem(sys.modules, "sky.jobs", fake.jobs_module)  # type: ignore[arg-type]
    monkeypatch.setattr(skypilot, "skypilot_version", lambda: "0.14.1 (fake)")
    job_root = root / "sky-jobs"
    fake.job_log += "(head, rank=0, pid=1) done\n"

    def make() -> SkyPilotBackend:
        return SkyPilotBackend(
            jobs_dir=job_root, request_timeout_s=2.0, cancel_wait_s=2.0, request_poll_s=0.01, log_sync_s=0.0
        )

    def spec(kind: str) -> dict[str, Any]:
        return base_spec(
            REPO / "servers" / "launch" / "recipes" / "tiny_gpt.py",
            recipe="tiny-gpt",
            network="host",
            nnodes=2,
            gpus_per_node=8,
            options={"accelerator": "H100"},
        )

    def job_of(handle: BackendHandle) -> int:
        return next(i for i, job in fake.jobs.items() if job["name"] == job_name_for(handle.key))

    def drive(handle: BackendHandle, kind: str) -> None:
        states = [ManagedJobStatus.STARTING, ManagedJobStatus.RUNNING]
        fake.script(job_of(handle), *([*states, ManagedJobStatus.SUCCEEDED] if kind == "quick" else states))

    def gone(handle: BackendHandle) -> bool:
        return fake.jobs[job_of(handle)]["script"] == [ManagedJobStatus.CANCELLED]

    def forget(handle: BackendHandle) -> None:
        del fake.jobs[job_of(handle)]  # the jobs controller's database reset

    yield Engine(
        name="skypilot",
        make=make,
        spec=spec,
        jobs=lambda: {str(i) for i in fake.jobs},
        job_root=job_root,
        words="(head, rank=0, pid=1) done",
        drive=drive,
        gone=gone,
        forget=forget,
        keeps_end=False,  # a managed job's end lives in the jobs controller only: forgotten, it is LOST
        settings=Settings(home=root / "state"),
    )


# What each backend's contract needs; a registered backend missing here fails the suite.
ENGINES: dict[str, Callable[[pytest.FixtureRequest, Path], Iterator[Engine]]] = {
    "local": lambda request, root: local_engine(root),
    "slurm": lambda request, root: slurm_engine(root, request.getfixturevalue("slurm_cluster")),
    "ray": lambda request, root: ray_engine(root, request.getfixturevalue("ray_head")),
    "kubernetes": lambda request, root: kubernetes_engine(root, request.getfixturevalue("k8s_fake")),
    "skypilot": lambda request, root: skypilot_engine(root, request.getfixturevalue("monkeypatch")),
}


@pytest.fixture(params=registry.names())
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    name = request.param
    if name not in ENGINES:
        pytest.fail(
            f"backend {name!r} is registered but has no contract here: add its engine (real, or a stand-in) to ENGINES "
            "in tests/test_backend_contract.py"
        )
    made = ENGINES[name](request, tmp_path)
    yield next(made)
    for _ in made:  # the engine's own clean-up
        pass


def unique_key(tag: str) -> str:
    return f"contract-{tag}-{uuid.uuid4().hex[:12]}"


def planned(e: Engine, backend: Any, kind: str) -> tuple[BackendPlan, dict[str, Any], Path | None]:
    """The plan as the launch server makes it, bound to a job folder of its own unless the job engine runs the job
    (then the engine makes the folder)."""
    spec = e.spec(kind)
    plan = backend.plan(spec, e.settings)
    if registry.get(e.name).can("in_engine"):
        return plan, spec, None
    folder = e.job_root / uuid.uuid4().hex[:12]
    return plan.bind(folder), spec, folder


def submitted(e: Engine, backend: Any, kind: str, key: str) -> BackendHandle:
    plan, spec, folder = planned(e, backend, kind)
    handle = backend.submit(plan, SubmitRequest(key=key, spec=spec, timeout_s=600))
    assert handle.backend == e.name and handle.key == key and handle.native_id
    if folder is not None:
        assert handle.job_dir == str(folder)
    e.drive(handle, kind)
    return handle


def same(a: EngineStatus, b: EngineStatus) -> bool:
    return (a.state, a.native_state, a.exit_code) == (b.state, b.native_state, b.exit_code)


# ---- the contract ----------------------------------------------------------------------------------------------------
def test_every_registered_backend_has_a_contract() -> None:
    missing = sorted(set(registry.names()) - set(ENGINES))
    assert not missing, f"registered without a contract in tests/test_backend_contract.py ENGINES: {missing}"


@pytest.mark.timeout(120)
def test_a_plan_creates_and_starts_nothing(engine: Engine) -> None:
    backend = engine.make()
    assert isinstance(backend, Backend) and backend.name == engine.name
    before_jobs, before_files = engine.jobs(), tree(engine.job_root)
    plan = backend.plan(engine.spec("quick"), engine.settings)
    again = backend.plan(engine.spec("quick"), engine.settings)
    assert plan.backend == engine.name and plan.argv
    assert plan == again  # the plan is a function of the spec
    assert engine.jobs() == before_jobs and tree(engine.job_root) == before_files


@pytest.mark.timeout(300)
def test_a_job_runs_to_its_end_and_its_output_reaches_the_job_folder(engine: Engine) -> None:
    backend = engine.make()
    handle = submitted(engine, backend, "quick", unique_key("quick"))
    status = wait_status(backend, handle, {JobState.SUCCEEDED}, timeout_s=engine.end_s, said=lambda: logs_of(handle))
    assert status.exit_code in (0, None), status  # SkyPilot's records carry no exit code
    if registry.get(engine.name).can("log_sync"):
        backend.sync_logs(handle, handle.job_dir, final=True)
    text = wait_until(lambda: logs_of(handle), 30, f"a log of job {handle.native_id} in its folder")
    assert engine.words in text, text[-2000:]
    assert backend.cancel(handle) == JobState.SUCCEEDED  # a cancel after the end changes nothing
    assert backend.status(handle).state == JobState.SUCCEEDED


@pytest.mark.timeout(300)
def test_a_running_job_cancelled_ends_cancelled_with_its_processes_gone(engine: Engine) -> None:
    backend = engine.make()
    handle = submitted(engine, backend, "long", unique_key("long"))
    wait_status(backend, handle, {JobState.RUNNING}, timeout_s=engine.end_s, said=lambda: logs_of(handle))
    wait_until(lambda: engine.started(backend, handle), 60, f"the processes of job {handle.native_id} run")
    assert backend.cancel(handle) == JobState.CANCELLED
    assert wait_status(backend, handle, timeout_s=60).state == JobState.CANCELLED
    assert backend.cancel(handle) == JobState.CANCELLED  # idempotent
    wait_until(lambda: engine.gone(handle), 60, f"job {handle.native_id}'s processes or engine object gone")
    assert engine.make().status(handle).state == JobState.CANCELLED  # a new backend says the same


@pytest.mark.timeout(400)
def test_after_a_restart_the_job_is_found_by_its_key_and_its_end_kept(engine: Engine) -> None:
    info = registry.get(engine.name)
    first = engine.make()
    key = unique_key("restart")
    plan, spec, _folder = planned(engine, first, "quick")
    request = SubmitRequest(key=key, spec=spec, timeout_s=600)
    handle = first.submit(plan, request)
    engine.drive(handle, "quick")
    jobs = engine.jobs()
    restarted = engine.make()
    if not info.can("in_engine"):  # the job engine's own job: the launch server's key table finds it (existing_job)
        assert restarted.submit(plan, request) == handle  # the same job, nothing started again
        assert engine.jobs() == jobs
    ended = wait_status(restarted, handle, timeout_s=engine.end_s, said=lambda: logs_of(handle))
    assert ended.state == JobState.SUCCEEDED, ended
    again = engine.make().status(handle)
    assert same(again, ended), (again, ended)
    if engine.forget is None:
        assert engine.forget_why, f"{engine.name}: say why its engine cannot forget a job"
        return
    engine.forget(handle)
    after = engine.make().status(handle)
    if engine.keeps_end:
        assert (after.state, after.exit_code) == (ended.state, ended.exit_code), after
    else:
        assert after.state == JobState.LOST, after  # no record of the end: never guessed
    if not info.can("in_engine"):
        forgotten = engine.jobs()
        assert engine.make().submit(plan, request) == handle
        if engine.jobs() != forgotten:
            pytest.fail(f"{engine.name}: a submit of the key of a job the engine forgot started it again")
    if handle.job_dir and engine.keeps_end:
        shutil.rmtree(handle.job_dir)  # the job's own records gone too: nothing is left to tell its end
        assert engine.make().status(handle).state == JobState.LOST
