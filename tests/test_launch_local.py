"""The local torchrun backend: real torchrun runs with 2 CPU ranks (gloo), the command it builds, GPU assignment,
per-rank logs while running, and the root cause of a failure named in the job's reason."""

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from servers.core.jobfiles import JobContext, JobFiles
from servers.core.jobs import JobEngine, JobKind
from servers.core.jobstore import JobState
from servers.core.settings import Settings
from servers.engines.backend import JOB_DIR_PLACEHOLDER, Backend, BackendHandle, SubmitRequest, map_state
from servers.launch.local import ENTRY, LocalBackend, assign_gpus, run_training_job
from servers.launch.torchrun import describe_failure, last_exception_line, parse_root_cause_block, torchrun_argv
from tests.conftest import CHILD_ENV

FIXTURES = Path(__file__).parent / "fixtures" / "launch"
HOSTILE_ARGS = ["; rm -rf /", "$(whoami)", "`id`", "a b  c", "*", "--lr", "3e-4", "'quoted'", ""]


def make_ctx(tmp_path: Path, job_id: str = "train-test-1") -> JobContext:
    job_dir = tmp_path / "job"
    job_dir.mkdir(parents=True, exist_ok=True)
    return JobContext(job_id, "train", JobFiles(job_dir))


def spec_for(script: str, **extra: object) -> dict:
    return {
        "script": str(FIXTURES / script),
        "args": [],
        "nproc_per_node": 2,
        "max_restarts": 0,
        "env": {},
        "gpus": None,
        "run_id": "t1",
        **extra,
    }


def read_log(ctx: JobContext, process: str) -> str:
    path = ctx.files.log(process)
    return path.read_text() if path.exists() else ""


# ---- no processes ---------------------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_torchrun_argv_is_an_argv_list_with_the_script_args_last_and_literal(tmp_path: Path) -> None:
    script = FIXTURES / "echo_args.py"
    argv = torchrun_argv(script, HOSTILE_ARGS, 2, 1, tmp_path / "logs", "run-1")
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert argv[-len(HOSTILE_ARGS) - 1 :] == [str(script), *HOSTILE_ARGS]
    flags = argv[3 : -len(HOSTILE_ARGS) - 1]
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    assert pairs["--nproc-per-node"] == "2"
    assert pairs["--max-restarts"] == "1"
    assert pairs["--log-dir"] == str(tmp_path / "logs")
    assert pairs["--redirects"] == "3"
    assert pairs["--rdzv-id"] == "run-1"
    assert not any(a in ("sh", "bash", "/bin/sh", "-c", "shell=True") for a in argv)
    with pytest.raises(ValueError, match="run_id"):
        torchrun_argv(script, [], 1, 0, tmp_path, "../x")
    with pytest.raises(ValueError, match="absolute"):
        torchrun_argv(Path("echo_args.py"), [], 1, 0, tmp_path, "r")
    with pytest.raises(ValueError, match="nproc_per_node"):
        torchrun_argv(script, [], 0, 0, tmp_path, "r")


@pytest.mark.timeout(180)
def test_assign_gpus_never_hands_out_a_busy_gpu() -> None:
    assert assign_gpus(2, set(), 0) == []  # CPU: nothing to assign
    assert assign_gpus(2, {0, 2}, 8) == [1, 3]
    assert assign_gpus(4, {1, 3, 5}, 8) == [0, 2, 4, 6]
    for busy in ({0}, {0, 1, 2}, {3, 4, 5, 6}):
        picked = assign_gpus(8 - len(busy), busy, 8)
        assert not set(picked) & busy and len(set(picked)) == len(picked)
    with pytest.raises(ValueError, match="only 1 of 4 are free"):
        assign_gpus(2, {0, 1, 2}, 4)
    with pytest.raises(ValueError, match="has 2"):
        assign_gpus(4, set(), 2)
    assert assign_gpus(2, {0, 1, 2}, 4, share_gpus=True) == [3, 0]


@pytest.mark.timeout(180)
def test_plan_has_no_side_effects_and_binds_to_the_job_folder(tmp_path: Path) -> None:
    backend = LocalBackend()
    assert isinstance(backend, Backend)
    job_dir = tmp_path / "not-yet"
    spec = spec_for("echo_args.py", args=HOSTILE_ARGS, gpus=[2, 5], env={"FOO": "1"})
    before = sorted(tmp_path.rglob("*"))
    unbound = backend.plan(spec, Settings(home=tmp_path / "home"))
    bound = backend.plan(spec, Settings(home=tmp_path / "home"), job_dir=job_dir)
    assert sorted(tmp_path.rglob("*")) == before  # nothing created: no job folder, no log folder, no home
    assert f"{JOB_DIR_PLACEHOLDER}/torchrun-logs" in unbound.argv
    assert unbound.bind(job_dir) == bound
    assert bound.argv[-len(HOSTILE_ARGS) :] == HOSTILE_ARGS
    assert bound.env["CUDA_VISIBLE_DEVICES"] == "2,5"
    assert bound.env["FOO"] == "1"
    assert bound.env["LLM_INFRA_MCP_METRICS"] == str(job_dir / "metrics.jsonl")
    assert bound.env["LLM_INFRA_MCP_CHECKPOINT_DIR"] == str(job_dir / "checkpoints")
    assert bound.cwd == str(job_dir / "run") and bound.gpus == [2, 5] and bound.nproc_per_node == 2
    # A job given no GPUs sees none (never the GPUs of the server's environment).
    assert backend.plan(spec_for("echo_args.py"), job_dir=job_dir).env["CUDA_VISIBLE_DEVICES"] == ""
    assert backend.plan(spec_for("echo_args.py", gpus=[]), job_dir=job_dir).env["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(ValueError, match="need 2 GPUs"):
        backend.plan(spec_for("echo_args.py", gpus=[0]), job_dir=job_dir)
    assert map_state({"COMPLETED": JobState.SUCCEEDED}, "completed") is JobState.SUCCEEDED
    assert map_state({}, "WEIRD") is JobState.LOST


@pytest.mark.timeout(180)
def test_root_cause_parsing_without_an_error_file(tmp_path: Path) -> None:
    """A script without @record: no error.json; the rank's stderr gives the exception line."""
    output = tmp_path / "torchrun.log"
    output.write_text(
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2026-11-30_18:12:50\n"
        "  host      : localhost\n"
        "  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : 1 (pid: 941)\n"
        "  error_file: <N/A>\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
        "============================================================\n"
    )
    rank_dir = tmp_path / "logs" / "r_abc" / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stderr.log").write_text(
        'Traceback (most recent call last):\n  File "/x/train.py", line 3, in <module>\n    f()\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    block = parse_root_cause_block(output.read_text())
    assert block == {
        "rank": 1,
        "local_rank": 1,
        "exit_code": 1,
        "error_file": None,
        "traceback": "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    }
    reason = describe_failure(1, tmp_path / "logs", output)
    assert reason.startswith("rank 1 failed (exit 1): torch.OutOfMemoryError: CUDA out of memory.")
    assert last_exception_line("no traceback here") is None
    killed = output.read_text().replace("exitcode  : 1 (pid: 941)", "exitcode  : -9 (pid: 941)")
    output.write_text(killed)
    assert describe_failure(1, tmp_path / "logs", output).startswith("rank 1 failed (exit -9, SIGKILL")
    output.write_text("RuntimeError: rendezvous timed out\n")
    assert describe_failure(1, tmp_path / "none", output).startswith(
        "torchrun exited with code 1: RuntimeError: rendezvous timed out"
    )


# ---- real torchrun --------------------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_args_reach_the_script_literally_with_per_rank_logs_and_metrics(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    out = tmp_path / "argv.json"
    result = run_training_job(spec_for("echo_args.py", args=HOSTILE_ARGS, env={"JOB_ECHO_ARGS_OUT": str(out)}), ctx)
    assert json.loads(out.read_text()) == HOSTILE_ARGS
    assert result["exit_code"] == 0 and result["restarts"] == 0 and result["ranks"] == 2
    assert result["last_step"] == 2
    assert {"rank0", "rank1", "torchrun"} <= set(ctx.files.processes())
    assert "rank 0 of 2: sum 2" in read_log(ctx, "rank0") and "rank 0 stderr line" in read_log(ctx, "rank0")
    assert "rank 1 of 2: sum 2" in read_log(ctx, "rank1")
    rows = [json.loads(line) for line in ctx.files.metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert json.loads(ctx.files.progress.read_text())["done"] == 2


@pytest.mark.timeout(180)
def test_rank_logs_are_readable_while_the_job_runs(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    go = tmp_path / "go"
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["result"] = run_training_job(spec_for("wait_go.py", env={"JOB_GO_FILE": str(go)}), ctx)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(f"rank {r} waiting" in read_log(ctx, f"rank{r}") for r in (0, 1)):
            time.sleep(0.2)
        assert "rank 0 waiting" in read_log(ctx, "rank0")
        assert "rank 1 waiting" in read_log(ctx, "rank1")
        assert thread.is_alive()  # seen while the ranks still run
    finally:
        go.touch()
        thread.join(60)
    assert "error" not in outcome, outcome
    assert outcome["result"]["exit_code"] == 0
    assert "rank 1 done" in read_log(ctx, "rank1")


@pytest.mark.timeout(180)
def test_a_failing_rank_is_named_with_its_exception(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    with pytest.raises(RuntimeError) as caught:
        run_training_job(spec_for("fail_rank1.py"), ctx)
    reason = str(caught.value)
    assert reason.startswith("rank 1 failed (exit 1): ValueError: bad batch at step 3"), reason
    assert "ValueError: bad batch at step 3" in read_log(ctx, "rank1")
    assert "rank 0 started" in read_log(ctx, "rank0")
    assert "Root Cause" in read_log(ctx, "torchrun")


@pytest.mark.timeout(180)
def test_max_restarts_lets_a_failed_first_attempt_resume_from_its_checkpoint(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    result = run_training_job(spec_for("restart_once.py", max_restarts=1), ctx)
    assert result["exit_code"] == 0 and result["restarts"] == 1 and result["attempts"] == 2
    assert json.loads((ctx.checkpoint_dir / "rank0.json").read_text()) == {"step": 3, "restart": 1}
    log = read_log(ctx, "rank0")
    assert log.index("rank 0 attempt 0") < log.index("torchrun restart 1") < log.index("rank 0 resumed at step 3")


@pytest.mark.timeout(180)
def test_through_the_job_engine_the_reason_names_the_rank_and_the_job_keeps_its_key(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "state", cancel_grace_s=1.0, allowed_roots=[tmp_path])
    engine = JobEngine(settings, owner="test", child_env=CHILD_ENV)
    engine.register_kind(JobKind("train", ENTRY, "torchrun training", 120))
    backend = LocalBackend(engine, kind="train")
    spec = spec_for("fail_rank1.py")
    plan = backend.plan(spec, settings)
    request = SubmitRequest(key="k-1", spec=spec, timeout_s=120)
    handle = backend.submit(plan, request)
    # The key is stored with the job: what recovers a lost bind (launch/server.py job_of_key).
    assert engine.get(handle.native_id).spec["idempotency_key"] == "k-1"
    deadline = time.monotonic() + 90
    while backend.status(handle).state not in (JobState.FAILED, JobState.SUCCEEDED) and time.monotonic() < deadline:
        time.sleep(0.3)
    record = engine.get(handle.native_id)
    assert record.state is JobState.FAILED
    assert record.reason is not None and "rank 1 failed (exit 1): ValueError: bad batch at step 3" in record.reason
    assert "bad batch at step 3" in log_of(handle, "rank1")
    assert engine.store.list_jobs(kind="train").total == 1


def log_of(handle: BackendHandle, process: str) -> str:
    """A process's log in the job folder, as read_job_logs serves it ("" before it exists)."""
    path = JobFiles(str(handle.job_dir)).log(process)
    return path.read_text(errors="replace") if path.exists() else ""
