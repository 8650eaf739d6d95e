"""The Ray backend (servers/launch/ray_backend.py): plans offline, its entrypoint wrapper run here, and jobs on a
real local Ray head (the session's `ray_head` fixture: 127.0.0.1, its own ports, token authentication with a token
of its own that these tests pass to the client). Without ray the head tests skip, except under CI=true."""

import contextlib
import json
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from servers.core.errors import InputError
from servers.core.jobfiles import JobFiles
from servers.core.jobstore import JobState
from servers.core.settings import Settings
from servers.engines.backend import JOB_DIR_PLACEHOLDER, Backend, BackendHandle, SubmitRequest, map_state
from servers.launch.ray_backend import (
    CANCEL_RECORD,
    EXIT_RECORD,
    RAY_STATES,
    SUBMIT_RECORD,
    WRAPPER_NAME,
    RayBackend,
    RayPlan,
    RayUnavailableError,
    submission_id_for,
    write_wrapper,
)
from tests.engine_follow import wait_status
from tests.hostile import HOSTILE_ARGS

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "launch"
TINY_GRPO = REPO / "servers" / "launch" / "recipes" / "tiny_grpo.py"


def make_spec(script: Path, args: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """A spec as the server builds it for a backend (the keys local.py's plan reads, and the Ray ones)."""
    return {
        "script": str(script),
        "args": list(args or []),
        "nproc_per_node": 1,
        "max_restarts": 0,
        "env": {},
        "gpus": [],
        "run_id": "run",
        "workdir": None,
        "max_log_bytes": 8 * 1024 * 1024,
        "nnodes": 1,
        "gpus_per_node": 0,
        "max_wall_s": 600.0,
        "name": "ray-test",
        "idempotency_key": None,
    } | extra


def torchrun_log(handle: BackendHandle) -> Callable[[], str]:
    """What a failed wait shows: the end of the job's torchrun log."""
    return lambda: log_of(handle, "torchrun")[-8000:]


# ---- no Ray needed ---------------------------------------------------------------------------------------------------
def test_ray_plan_is_exact_and_side_effect_free(tmp_path: Path) -> None:
    backend = RayBackend("http://127.0.0.1:9")  # nothing listens there: plan must not talk to it
    before = sorted(tmp_path.rglob("*"))
    plan = backend.plan(make_spec(TINY_GRPO, ["--steps", "3", "$(id)"]))
    assert isinstance(plan, RayPlan) and isinstance(backend, Backend)
    assert plan.rendered == shlex.join(plan.argv) and shlex.split(plan.rendered) == plan.argv
    assert plan.argv[:2] == [sys.executable, f"{JOB_DIR_PLACEHOLDER}/{WRAPPER_NAME}"]
    command = plan.argv[plan.argv.index("--") + 1 :]
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[-4:] == [str(TINY_GRPO), "--steps", "3", "$(id)"]
    assert "'$(id)'" in plan.rendered  # quoted for Ray's shell
    assert plan.env["LLM_INFRA_MCP_METRICS"] == f"{JOB_DIR_PLACEHOLDER}/metrics.jsonl"
    assert plan.env["LLM_INFRA_MCP_CHECKPOINT_DIR"] == f"{JOB_DIR_PLACEHOLDER}/checkpoints"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.runtime_env == {"env_vars": plan.env}  # no working_dir without a workdir
    assert (plan.entrypoint_num_cpus, plan.entrypoint_num_gpus) == (1.0, 0.0)
    notes = " ".join(plan.notes)
    assert "shlex.quote" in notes and "file system the Ray node sees" in notes

    bound = plan.bind(tmp_path / "job")
    assert isinstance(bound, RayPlan)
    assert JOB_DIR_PLACEHOLDER not in bound.rendered + json.dumps(bound.runtime_env)
    assert bound.runtime_env["env_vars"] == bound.env
    assert bound.env["LLM_INFRA_MCP_METRICS"] == str(tmp_path / "job" / "metrics.jsonl")
    assert RayPlan.model_validate(bound.model_dump(mode="json")) == bound  # a stored plan comes back whole
    assert sorted(tmp_path.rglob("*")) == before  # no side effects

    gpu = backend.plan(make_spec(TINY_GRPO, nproc_per_node=2, gpus_per_node=2))
    assert gpu.entrypoint_num_gpus == 2.0 and gpu.entrypoint_num_cpus == 2.0
    assert "CUDA_VISIBLE_DEVICES" not in gpu.env  # Ray sets it to the GPUs it assigns
    single = backend.plan(make_spec(TINY_GRPO, ["--steps", "3"], launcher="python"))
    assert single.argv[single.argv.index("--") + 1 :] == [sys.executable, str(TINY_GRPO), "--steps", "3"]


def test_ray_plan_working_dir_only_inside_allowed_roots(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    script = project / "train.py"
    script.write_text("print('hi')\n")
    settings = Settings(home=tmp_path / "state", allowed_roots=[project])
    backend = RayBackend("http://127.0.0.1:9")
    plan = backend.plan(make_spec(script, workdir=str(project)), settings)
    assert plan.runtime_env["working_dir"] == str(project.resolve())
    assert plan.argv[plan.argv.index("--") + 1 :][-1] == "train.py"  # runs from Ray's copy of the working_dir
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(InputError, match="workdir"):
        backend.plan(make_spec(script, workdir=str(outside)), settings)
    with pytest.raises(ValueError, match="nnodes"):
        backend.plan(make_spec(script, nnodes=2), settings)
    with pytest.raises(ValueError, match="launcher"):
        backend.plan(make_spec(script, nproc_per_node=2, launcher="python"), settings)


def test_ray_state_map_and_submission_ids() -> None:
    expected = {
        "PENDING": JobState.QUEUED,
        "RUNNING": JobState.RUNNING,
        "STOPPED": JobState.CANCELLED,
        "SUCCEEDED": JobState.SUCCEEDED,
        "FAILED": JobState.FAILED,
    }
    for native, state in expected.items():
        assert map_state(RAY_STATES, native) == state
        assert map_state(RAY_STATES, native.lower()) == state
    assert map_state(RAY_STATES, "DELETED") == JobState.LOST
    assert map_state(RAY_STATES, "") == JobState.LOST
    sid = submission_id_for("my key/../x?y")
    assert sid == submission_id_for("my key/../x?y") and sid != submission_id_for("my key/../x?z")
    assert all(c.isalnum() or c in "-_" for c in sid)


def test_two_state_directories_on_one_ray_cluster_never_share_a_submission_id(tmp_path: Path) -> None:
    """The same idempotency key from two servers (two state directories) on one Ray cluster: two submission ids,
    so neither finds the other's job; the same state directory keeps its id across restarts (a retry finds it)."""
    from servers.engines import registry

    info = registry.get("ray")

    def backend(home: Path) -> Any:
        return info.build(info.config_for(Settings(home=home, allowed_roots=[tmp_path])))

    first, second, again = backend(tmp_path / "a"), backend(tmp_path / "b"), backend(tmp_path / "a")
    assert first.submission_id("study-pilot-0") != second.submission_id("study-pilot-0")
    assert first.submission_id("study-pilot-0") == again.submission_id("study-pilot-0")
    assert all(c.isalnum() or c in "-_" for c in second.submission_id("study-pilot-0"))


def test_ray_backend_does_not_import_ray() -> None:
    code = "import sys, servers.launch.ray_backend; sys.exit(int('ray' in sys.modules))"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_ray_available_without_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    found, detail = RayBackend().available()
    assert not found
    assert "LLM_INFRA_MCP_RAY_ADDRESS" in detail or "ray is not installed" in detail


def run_wrapper(job: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    job.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(write_wrapper(job)), "--job-dir", str(job), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_ray_wrapper_runs_literally_and_records_exit(tmp_path: Path) -> None:
    """The entrypoint wrapper alone (no Ray): runs the command with its args as given, copies its output, writes the
    exit record, and ends the command at the wall-time limit."""
    job = tmp_path / "job"
    out = tmp_path / "args.json"
    code = "import json,sys; json.dump(sys.argv[1:], open(sys.argv[1], 'w')); print('hello'); sys.exit(3)"
    done = run_wrapper(job, "--cwd", str(job / "run"), "--output", "rank0", "--", sys.executable, "-c", code, str(out))
    assert done.returncode == 3, done.stderr
    assert "hello" in done.stdout and "hello" in (job / "logs" / "rank0.log").read_text()
    record = json.loads((job / EXIT_RECORD).read_text())
    assert record["exit_code"] == 3 and record["timed_out"] is False and record["cwd"] == str(job / "run")

    started = time.monotonic()
    slow = run_wrapper(
        tmp_path / "slow", "--max-wall-s", "1", "--", sys.executable, "-c", "import time; time.sleep(60)"
    )
    assert time.monotonic() - started < 30
    record = json.loads((tmp_path / "slow" / EXIT_RECORD).read_text())
    assert record["timed_out"] is True and record["signal"] == "SIGTERM" and slow.returncode == 128 + 15


def test_ray_status_from_exit_record_when_ray_cannot_be_asked(tmp_path: Path) -> None:
    """No Ray at the address: the exit record still gives the exact end; without one, status raises (never a guess)."""
    backend = RayBackend("http://127.0.0.1:9", request_timeout_s=5)
    job = tmp_path / "job"
    job.mkdir()
    handle = BackendHandle(backend="ray", key="k", native_id=submission_id_for("k"), job_dir=str(job))
    with pytest.raises(RayUnavailableError, match=r"127\.0\.0\.1:9|ray is not installed"):
        backend.status(handle)
    (job / EXIT_RECORD).write_text(json.dumps({"exit_code": 0, "started_at": 1.0, "ended_at": 2.0, "attempts": 1}))
    assert backend.status(handle).state == JobState.SUCCEEDED
    (job / EXIT_RECORD).write_text(json.dumps({"exit_code": None, "signal": "SIGTERM", "ended_at": 2.0}))
    assert backend.status(handle).state == JobState.FAILED
    (job / CANCEL_RECORD).write_text("{}")
    assert backend.status(handle).state == JobState.CANCELLED


# ---- against a real local Ray head -----------------------------------------------------------------------------------
@pytest.fixture
def ray_jobs(ray_head: Any) -> Iterator[list[str]]:
    """Submission ids a test submits; whatever of them still runs at the end is stopped (the test may have failed)."""
    sids: list[str] = []
    yield sids
    ray_head.remember()
    client = ray_head.client()
    deadline = time.monotonic() + 30
    for sid in sids:
        with contextlib.suppress(Exception):
            if not client.get_job_status(sid).is_terminal():
                client.stop_job(sid)
            while str(client.get_job_status(sid)) == "RUNNING" and time.monotonic() < deadline:
                time.sleep(0.2)  # (Ray cannot stop a PENDING job: ray-project/ray#58353; the head goes at the end)


def backend_for(ray_head: Any, **kwargs: Any) -> RayBackend:
    return RayBackend(ray_head.address, auth_token=ray_head.token, **kwargs)


def submit(backend: RayBackend, spec: dict[str, Any], job_dir: Path, key: str, sids: list[str]) -> BackendHandle:
    sids.append(backend.submission_id(key))
    plan = backend.plan(spec, job_dir=job_dir)
    return backend.submit(plan, SubmitRequest(key=key, spec=spec))


@pytest.mark.timeout(240)
def test_ray_tiny_grpo_succeeds_with_metrics_and_logs(ray_head: Any, ray_jobs: list[str], tmp_path: Path) -> None:
    backend = backend_for(ray_head)
    found, detail = backend.available()
    assert found, detail
    assert ray_head.address in detail and "2 CPU" in detail
    spec = make_spec(TINY_GRPO, ["--steps", "200", "--evals", "5", "--eval-size", "256"])
    job = tmp_path / "job"
    handle = submit(backend, spec, job, "tiny-grpo", ray_jobs)
    assert handle.job_dir == str(job.resolve()) and handle.backend == "ray"
    status = wait_status(backend, handle, {JobState.SUCCEEDED}, timeout_s=180, said=torchrun_log(handle))
    assert status.exit_code == 0 and status.native_state == "SUCCEEDED"
    assert status.started_at and status.ended_at and status.ended_at >= status.started_at

    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("split") == "eval"]
    assert len(evals) == 5 and evals[-1]["step"] == 200 and 0 <= evals[-1]["pass_rate"] <= 1
    record = json.loads((job / EXIT_RECORD).read_text())
    assert record["exit_code"] == 0 and record["attempts"] == 1

    assert "eval pass rate" in log_of(handle, "rank0")
    assert {"rank0", "torchrun"} <= set(JobFiles(job).processes())
    assert backend.cancel(handle) == JobState.SUCCEEDED  # a cancel after the end changes nothing
    assert backend.status(handle).state == JobState.SUCCEEDED


@pytest.mark.timeout(180)
def test_ray_submit_is_idempotent(ray_head: Any, ray_jobs: list[str], tmp_path: Path) -> None:
    backend = backend_for(ray_head)
    out = tmp_path / "args.json"
    spec = make_spec(FIXTURES / "ray_echo_args.py", ["once"], env={"JOB_ECHO_ARGS_OUT": str(out)}, launcher="python")
    job = tmp_path / "job"
    plan = backend.plan(spec)  # not yet bound: submit binds it to job_dir
    request = SubmitRequest(key="same-key", spec=spec)
    ray_jobs.append(backend.submission_id("same-key"))
    results: list[BackendHandle] = []
    threads = [
        threading.Thread(target=lambda: results.append(backend.submit(plan, request, job_dir=job))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 3 and len({h.model_dump_json() for h in results}) == 1
    first = results[0]
    wait_status(backend, first, {JobState.SUCCEEDED}, timeout_s=60, said=torchrun_log(first))
    again = backend_for(ray_head).submit(plan, request, job_dir=job)  # a restarted server retrying
    assert again == first
    sids = [j.submission_id for j in ray_head.client().list_jobs()]
    assert sids.count(first.native_id) == 1
    assert json.loads((job / SUBMIT_RECORD).read_text())["submission_id"] == first.native_id
    assert json.loads(out.read_text())["args"] == ["once"]


@pytest.mark.timeout(120)
def test_ray_unreachable_address_or_bad_token_is_a_clear_error(ray_head: Any, tmp_path: Path) -> None:
    from tests.fixtures.launch.ray_head import free_ports

    closed = f"http://127.0.0.1:{free_ports(1)[0]}"
    spec = make_spec(FIXTURES / "ray_echo_args.py", launcher="python")
    for backend, words in (
        (RayBackend(closed, auth_token=ray_head.token), [closed, "LLM_INFRA_MCP_RAY_ADDRESS", "nothing was submitted"]),
        (RayBackend(ray_head.address, auth_token="wrong-token"), [ray_head.address, "token"]),
    ):
        job = tmp_path / f"job-{len(words)}"
        key = f"never-{len(words)}"
        with pytest.raises(RayUnavailableError) as caught:
            backend.submit(backend.plan(spec, job_dir=job), SubmitRequest(key=key, spec=spec))
        for word in words:
            assert word in str(caught.value)
        assert "Traceback" not in str(caught.value) and "wrong-token" not in str(caught.value)
        assert not (job / SUBMIT_RECORD).exists()
        found, detail = backend.available()
        assert not found and words[0] in detail
        assert backend.submission_id(key) not in [j.submission_id for j in ray_head.client().list_jobs()]


@pytest.mark.timeout(180)
def test_ray_hostile_args_reach_the_script_literally(ray_head: Any, ray_jobs: list[str], tmp_path: Path) -> None:
    backend = backend_for(ray_head)
    out = tmp_path / "args.json"
    job = tmp_path / "job"
    spec = make_spec(FIXTURES / "ray_echo_args.py", HOSTILE_ARGS, env={"JOB_ECHO_ARGS_OUT": str(out)})
    handle = submit(backend, spec, job, "hostile", ray_jobs)  # torchrun, the default launcher
    wait_status(backend, handle, {JobState.SUCCEEDED}, timeout_s=120, said=torchrun_log(handle))
    seen = json.loads(out.read_text())
    assert seen["args"] == HOSTILE_ARGS and seen["rank"] == "0"
    assert seen["cwd"] == str(job.resolve() / "run")
    for folder in (job / "run", job, tmp_path, Path(seen["cwd"])):
        assert not list(folder.glob("PWNED*")), f"shell syntax ran in {folder}"


@pytest.mark.timeout(180)
def test_ray_failure_names_the_root_cause(ray_head: Any, ray_jobs: list[str], tmp_path: Path) -> None:
    backend = backend_for(ray_head)
    handle = submit(backend, make_spec(FIXTURES / "ray_fail.py"), tmp_path / "job", "fails", ray_jobs)
    status = wait_status(backend, handle, {JobState.FAILED}, timeout_s=120, said=torchrun_log(handle))
    assert status.native_state == "FAILED" and status.exit_code == 1
    assert status.reason and "rank 0 failed" in status.reason and "ValueError: bad batch at step 3" in status.reason
    assert "ValueError: bad batch at step 3" in log_of(handle, "rank0")


@pytest.mark.timeout(120)
def test_ray_wall_time_limit_ends_the_job(ray_head: Any, ray_jobs: list[str], tmp_path: Path) -> None:
    backend = backend_for(ray_head)
    spec = make_spec(
        FIXTURES / "ray_sleep.py", env={"JOB_PID_FILE": str(tmp_path / "pid")}, launcher="python", max_wall_s=2.0
    )
    handle = submit(backend, spec, tmp_path / "job", "too-long", ray_jobs)
    status = wait_status(backend, handle, {JobState.FAILED}, timeout_s=90, said=torchrun_log(handle))
    assert status.reason and "wall-time limit" in status.reason


@pytest.mark.timeout(120)
def test_ray_job_waiting_for_resources_is_queued_and_cancelled(
    ray_head: Any, ray_jobs: list[str], tmp_path: Path
) -> None:
    backend = backend_for(ray_head)
    spec = make_spec(FIXTURES / "ray_fail.py", nproc_per_node=4)  # 4 CPUs for the entrypoint; the head has 2
    handle = submit(backend, spec, tmp_path / "job", "too-big", ray_jobs)
    time.sleep(1)
    status = backend.status(handle)
    assert status.state == JobState.QUEUED and status.native_state == "PENDING" and status.reason
    assert backend.cancel(handle) == JobState.CANCELLED  # Ray cannot stop a PENDING job: the wrapper will refuse
    status = backend.status(handle)
    assert status.state == JobState.CANCELLED and "ray-project/ray#58353" in (status.reason or "")
    assert backend.cancel(handle) == JobState.CANCELLED

    # If it starts after all, the wrapper ends at once without running the command.
    job = tmp_path / "job"
    done = run_wrapper(job, "--", sys.executable, "-c", "open('RAN', 'w')")
    assert done.returncode == 125 and not (job / "RAN").exists() and not Path("RAN").exists()
    assert json.loads((job / EXIT_RECORD).read_text())["cancelled_before_start"] is True
    assert backend.status(handle).state == JobState.CANCELLED


@pytest.mark.timeout(180)
def test_ray_working_dir_goes_through_the_sdk_and_following_imports_no_ray(
    ray_head: Any, ray_jobs: list[str], tmp_path: Path
) -> None:
    """A workdir is uploaded by Ray's SDK (the job runs in Ray's copy of it); following a job (status, logs) goes
    through the REST client and never imports ray (it costs every follower process about half a second)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import os\nprint('sees', sorted(os.listdir('.')), flush=True)\n")
    (project / "data.txt").write_text("x\n")
    settings = Settings(home=tmp_path / "state", allowed_roots=[project, tmp_path])
    backend = backend_for(ray_head)
    spec = make_spec(project / "train.py", workdir=str(project), launcher="python")
    ray_jobs.append(backend.submission_id("workdir"))
    handle = backend.submit(
        backend.plan(spec, settings, job_dir=tmp_path / "job"), SubmitRequest(key="workdir", spec=spec)
    )
    wait_status(backend, handle, {JobState.SUCCEEDED}, timeout_s=120, said=torchrun_log(handle))
    assert "sees ['data.txt', 'train.py']" in log_of(handle, "rank0")
    code = (
        "import sys, json; from servers.launch.ray_backend import RayBackend; from servers.engines.backend import "
        "BackendHandle; b = RayBackend(sys.argv[1], auth_token=sys.argv[2]); "
        "h = BackendHandle.model_validate_json(sys.argv[3]); s = b.status(h); "
        "print(json.dumps([s.state.value, 'ray' in sys.modules]))"
    )
    said = subprocess.run(
        [sys.executable, "-c", code, ray_head.address, ray_head.token, handle.model_dump_json()],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(said.stdout) == ["SUCCEEDED", False], said.stderr


def log_of(handle: BackendHandle, process: str) -> str:
    """A process's log in the job folder, as read_job_logs serves it ("" before it exists)."""
    path = JobFiles(str(handle.job_dir)).log(process)
    return path.read_text(errors="replace") if path.exists() else ""
