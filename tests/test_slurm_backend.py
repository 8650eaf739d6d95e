"""The Slurm backend: the batch script it renders and refuses to render, Slurm's output read in both layouts, and real
jobs on a real Slurm cluster of 2 nodes x 1 CPU on this machine (the `slurm_cluster` fixture, scripts/slurm-cluster.sh):
tiny-gpt on two nodes, a failing rank named, a time limit, a job that cannot start, idempotent submits, states exact
after Slurm forgot the job. Without Slurm the cluster tests skip (and fail under CI=true)."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from servers.core.jobfiles import JobFiles
from servers.core.jobstore import JobState
from servers.engines.backend import (
    JOB_DIR_PLACEHOLDER,
    Backend,
    BackendHandle,
    BackendPlan,
    SubmitRequest,
    map_state,
)
from servers.launch.slurm import (
    CANCEL_RECORD,
    EXIT_RECORD,
    SLURM_STATES,
    STATE_RECORD,
    SUBMIT_RECORD,
    SlurmBackend,
    SlurmJob,
    SlurmOptions,
    SlurmUnavailableError,
    array_tasks,
    from_record,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue_json,
    render_array,
    time_minutes,
    worker_ranks,
    write_exit_record,
)
from tests.engine_follow import wait_status, wait_until

FIXTURES = Path(__file__).parent / "fixtures" / "launch"
RECORDED = FIXTURES / "slurm"
TINY_GPT = Path(__file__).resolve().parents[1] / "servers" / "launch" / "recipes" / "tiny_gpt.py"
HOSTILE_ARGS = ["; rm -rf /", "$(whoami)", "`id`", "a b  c", "*", "--lr", "3e-4", "'quoted'", "", "$JOB", '"x"']
# The ranks talk over loopback only (the test cluster's nodes are all 127.0.0.1).
LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo"}


def spec_for(script: Path | str, /, **extra: object) -> dict:
    """A spec as training.plan hands it to the backend; Slurm's options in `extra` go into its options."""
    options = {k: extra.pop(k) for k in list(extra) if k in SlurmOptions.model_fields}
    return {
        "script": str(extra.pop("script", script)),
        "args": [],
        "nnodes": 2,
        "nproc_per_node": 1,
        "max_restarts": 0,
        "env": dict(LOOPBACK),
        "gpus_per_node": 0,
        "max_wall_s": 300,
        "name": "t",
        "run_id": "t1",
        "options": options,
        **extra,
    }


def unique_key(tag: str) -> str:
    return f"{tag}-{os.getpid()}-{time.monotonic_ns()}"


def submit(backend: SlurmBackend, spec: dict, key: str | None = None) -> BackendHandle:
    key = key or unique_key(spec.get("name") or "job")
    # Without the plan's sinfo checks: some tests submit what the plan refuses (nnodes 3 on 2 nodes), as a partition
    # that shrank after the plan would leave it; test_a_request_no_partition_can_hold_is_refused_at_plan_time has them.
    return backend.submit(backend.plan(spec, check_partition=False), SubmitRequest(key=key, spec=spec))


def jobs_in_squeue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True, timeout=30)
    return out.stdout.split()


def no_new_job(before: list[str]) -> None:
    """No job reached Slurm since `before` was taken: every job squeue lists now was listed then (an earlier
    test's finished job may have aged out of squeue meanwhile: that is not a submission)."""
    new = sorted(set(jobs_in_squeue()) - set(before))
    assert not new, f"jobs submitted: {new}"


@pytest.fixture
def backend(slurm_cluster: Path, tmp_path: Path) -> SlurmBackend:
    return SlurmBackend(job_root=tmp_path / "slurm-jobs")


# ---- no Slurm needed ----------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_every_slurm_state_maps_and_unknown_ones_are_lost() -> None:
    expected = {
        JobState.QUEUED: ["PENDING", "REQUEUED", "RESIZING", "SUSPENDED"],
        JobState.STARTING: ["CONFIGURING"],
        JobState.RUNNING: ["RUNNING", "COMPLETING"],
        JobState.SUCCEEDED: ["COMPLETED"],
        JobState.FAILED: ["FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"],
        JobState.CANCELLED: ["CANCELLED"],
    }
    for state, names in expected.items():
        for name in names:
            assert map_state(SLURM_STATES, name) == state, name
    assert map_state(SLURM_STATES, "SOMETHING_NEW") == JobState.LOST
    job = parse_scontrol_job(
        (RECORDED / "scontrol-22.05-cancelled.txt").read_text().replace("=CANCELLED", "=CANCELLED by 0")
    )
    assert job is not None and job.state == "CANCELLED"


@pytest.mark.timeout(60)
def test_recorded_scontrol_lines_of_slurm_22_05() -> None:
    pending = parse_scontrol_job((RECORDED / "scontrol-22.05-pending.txt").read_text())
    assert pending is not None and (pending.state, pending.reason, pending.started_at) == (
        "PENDING",
        "PartitionConfig",
        None,
    )
    failed = parse_scontrol_job((RECORDED / "scontrol-22.05-failed.txt").read_text())
    assert failed is not None and (failed.state, failed.exit_code, failed.reason) == ("FAILED", 3, "NonZeroExitCode")
    assert failed.comment == "llm-infra-mcp:cap-a" and failed.started_at and failed.ended_at
    completed = parse_scontrol_job((RECORDED / "scontrol-22.05-completed.txt").read_text())
    assert completed is not None and (completed.state, completed.exit_code) == ("COMPLETED", 0)
    timeout = parse_scontrol_job((RECORDED / "scontrol-22.05-timeout.txt").read_text())
    assert timeout is not None and (timeout.state, timeout.reason, timeout.exit_signal) == ("TIMEOUT", "TimeLimit", 15)
    assert timeout.time_limit == "00:01:00"
    assert parse_scontrol_job("slurm_load_jobs error: Invalid job id specified") is None


@pytest.mark.timeout(60)
def test_array_tasks_are_named_as_slurm_names_them(tmp_path: Path) -> None:
    line = "JobId=3 ArrayJobId=1 ArrayTaskId=1 JobName=a JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0"
    job = parse_scontrol_job(line)
    assert job is not None and job.job_id == "1_1" and job.exit_code == 1
    pending = {
        "job_id": 1,
        "array_job_id": 1,
        "array_task_id": None,
        "array_task_string": "0-2",
        "job_state": "PENDING",
    }
    started = {"job_id": 4, "array_job_id": 1, "array_task_id": {"set": True, "number": 3}, "job_state": ["RUNNING"]}
    listed = parse_squeue_json(json.dumps({"jobs": [pending, started]}))
    assert [j.job_id for j in listed] == ["1_0", "1_1", "1_2", "1_3"]
    assert array_tasks("0-2,5") == [0, 1, 2, 5] and array_tasks("[1-7:3]%2") == [1, 4, 7]
    assert array_tasks("2-1") == [] and array_tasks("x") == [] and len(array_tasks("0-9999999")) == 10000
    sacct = "7_2|COMPLETED|0:0|2024-05-01T12:00:00|2024-05-01T12:01:00|None\n"
    assert (found := parse_sacct(sacct, "7_2")) is not None and found.state == "COMPLETED"
    record = write_exit_record(
        tmp_path, 0, env={"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "2"}
    )
    assert record["job_id"] == "7_2"


def test_an_array_runs_one_shape_and_each_task_its_runs_script() -> None:
    one = "#!/bin/bash\n#SBATCH --job-name=a\n#SBATCH --nodes=1\n#SBATCH --output=/j0/logs/batch.log\necho\n"
    two = one.replace("/j0", "/j1").replace("job-name=a", "job-name=b")
    text = render_array([("/j0", one), ("/j1", two)], sweep_key="sweep-0123456789abcdef", sweep_dir="/s")
    assert "#SBATCH --array=0-1" in text and "#SBATCH --nodes=1" in text and "/j0/logs" not in text
    assert "  1) RUN=/j1 ;;" in text and 'exec /bin/bash "$RUN/slurm-job.sh"' in text
    with pytest.raises(ValueError, match="other resources"):
        render_array([("/j0", one), ("/j1", two.replace("nodes=1", "nodes=2"))], sweep_key="s", sweep_dir="/s")


def test_squeue_json_of_22_05_and_of_23_02_and_later() -> None:
    # 22.05 (OpenAPI v0.0.38): job_state a string, exit_code a wait status (768 is exit 3, 15 is SIGTERM).
    ended = {j.job_id: j for j in parse_squeue_json((RECORDED / "squeue-22.05-ended.json").read_text())}
    assert (ended["1"].state, ended["1"].exit_code, ended["1"].reason) == ("FAILED", 3, "NonZeroExitCode")
    assert (ended["2"].state, ended["2"].exit_code) == ("COMPLETED", 0)
    assert ended["3"].state == "CANCELLED"
    assert (ended["4"].state, ended["4"].exit_signal, ended["4"].reason) == ("TIMEOUT", 15, "TimeLimit")
    pending = {j.job_id: j for j in parse_squeue_json((RECORDED / "squeue-22.05-pending.json").read_text())}
    assert (pending["3"].state, pending["3"].reason) == ("PENDING", "PartitionConfig")
    assert pending["1"].comment == "llm-infra-mcp:cap-a"
    # 23.02+ (v0.0.39+): job_state a list of the state and its flags, numbers as {"set", "infinite", "number"}.
    num = lambda n: {"set": True, "infinite": False, "number": n}  # noqa: E731
    newer = {
        "jobs": [
            {"job_id": 7, "job_state": ["PENDING"], "state_reason": "Resources", "start_time": num(0)},
            {
                "job_id": 8,
                "job_state": ["RUNNING", "COMPLETING"],
                "state_reason": "None",
                "start_time": num(1700000000),
                "end_time": num(1700000100),
            },
            {
                "job_id": 9,
                "job_state": ["FAILED"],
                "exit_code": {"status": ["ERROR"], "return_code": num(1), "signal": {"id": num(0), "name": ""}},
                "restart_cnt": num(2),
            },
            {"job_id": 10, "job_state": ["CANCELLED", "COMPLETING"]},
        ]
    }
    jobs = {j.job_id: j for j in parse_squeue_json(json.dumps(newer))}
    assert (jobs["7"].state, jobs["7"].reason, jobs["7"].started_at) == ("PENDING", "Resources", None)
    assert jobs["8"].state == "COMPLETING" and jobs["8"].started_at == 1700000000
    assert (jobs["9"].state, jobs["9"].exit_code, jobs["9"].restarts) == ("FAILED", 1, 2)
    assert jobs["10"].state == "CANCELLED"
    assert parse_squeue_json("not json") == []


@pytest.mark.timeout(60)
def test_sacct_lines() -> None:
    text = "41|TIMEOUT|0:15|2024-05-01T12:00:00|2024-05-01T12:01:30|TimeLimit\n41.batch|CANCELLED|0:15|||\n"
    job = parse_sacct(text, "41")
    assert job is not None and (job.state, job.exit_signal, job.reason) == ("TIMEOUT", 15, "TimeLimit")
    assert job.ended_at is not None and job.started_at is not None and job.ended_at - job.started_at == 90
    assert parse_sacct("42|CANCELLED by 1000|0:0|||\n", "42").state == "CANCELLED"  # type: ignore[union-attr]
    assert parse_sacct(text, "99") is None


@pytest.mark.timeout(60)
def test_plan_renders_the_batch_script_without_side_effects(tmp_path: Path) -> None:
    backend = SlurmBackend(job_root=tmp_path / "root", env={"PATH": str(tmp_path / "no-slurm"), "HOME": "/root"})
    assert isinstance(backend, Backend)
    spec = spec_for(
        TINY_GPT,
        args=HOSTILE_ARGS,
        nnodes=3,
        nproc_per_node=2,
        max_wall_s=61,
        name="tiny.run-1",
        account="proj_1",
        qos="high",
        constraint="a100&ib",
        exclude="node[1-3],gpu07",
        dependency=1234,
        cpus_per_task=4,
        idempotency_key="key-1",
        partition="gpu",
    )
    plan = backend.plan(spec)
    assert not (tmp_path / "root").exists()  # no side effects
    assert plan.argv == ["sbatch", "--parsable", f"{JOB_DIR_PLACEHOLDER}/slurm-job.sh"]
    text = plan.rendered or ""
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=tiny.run-1",
        "#SBATCH --nodes=3",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --time=2",  # 61 s rounded up to whole minutes
        f"#SBATCH --output={JOB_DIR_PLACEHOLDER}/logs/batch.log",
        f"#SBATCH --error={JOB_DIR_PLACEHOLDER}/logs/batch.log",
        "#SBATCH --open-mode=append",
        "#SBATCH --export=NONE",
        "#SBATCH --comment=llm-infra-mcp:key-1",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj_1",
        "#SBATCH --qos=high",
        "#SBATCH --constraint=a100&ib",
        "#SBATCH --exclude=node[1-3],gpu07",
        "#SBATCH --dependency=afterok:1234",
    ]
    assert "--rdzv-backend c10d" in text and '--rdzv-endpoint "$HEAD_ADDR:$RDZV_PORT"' in text
    assert '--rdzv-id "$SLURM_JOB_ID"' in text and "--nnodes 3 --nproc-per-node 2" in text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text
    assert "'; rm -rf /' '$(whoami)' '`id`' 'a b  c' '*' --lr 3e-4" in text  # shell-quoted, in order
    assert plan.env["LLM_INFRA_MCP_METRICS"] == f"{JOB_DIR_PLACEHOLDER}/metrics.jsonl"
    assert plan.env["LLM_INFRA_MCP_CHECKPOINT_DIR"] == f"{JOB_DIR_PLACEHOLDER}/checkpoints"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "" and plan.nnodes == 3 and plan.nproc_per_node == 2
    assert any("partition 'gpu' was NOT checked: Slurm did not answer" in n for n in plan.notes)
    assert any("filesystem every node mounts" in n for n in plan.notes)
    assert any("Trust assumption" in n for n in plan.notes)
    assert time_minutes(60) == 1 and time_minutes(60.5) == 2 and time_minutes(1) == 1

    bound = plan.bind(tmp_path / "job")
    assert JOB_DIR_PLACEHOLDER not in (bound.rendered or "")
    script = tmp_path / "job.sh"
    script.write_text(bound.rendered or "")
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=30).returncode == 0
    # The args reach bash as the same words (parse the torchrun line with bash itself, nothing run).
    line = next(ln for ln in (bound.rendered or "").splitlines() if "torch.distributed.run" in ln)
    words = line.strip().rstrip("&").strip()
    printed = subprocess.run(
        ["bash", "-c", f"set -f; printf '%s\\0' {words[words.index(str(TINY_GPT)) :]}"],
        capture_output=True,
        timeout=30,
    )
    assert printed.stdout.split(b"\0")[:-1] == [str(TINY_GPT).encode(), *(a.encode() for a in HOSTILE_ARGS)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("name", "bad\nname", "Slurm job name"),
        ("name", "-J", "Slurm job name"),
        ("name", "a=b", "Slurm job name"),
        ("partition", "debug\n#SBATCH --wrap=id", "partition"),
        ("partition", "--wrap=id", "partition"),
        ("account", "a b", "account"),
        ("qos", "x=y", "qos"),
        ("constraint", "a100 --wrap", "constraint"),
        ("exclude", "node1 node2", "exclude"),
        ("dependency", "afterany:3", "dependency"),
        ("args", ["--wrap", "rm -rf /"], "sbatch/srun option"),
        ("args", ["--wrap=id"], "sbatch/srun option"),
        ("args", ["--export=ALL"], "sbatch/srun option"),
        ("args", ["x\n#SBATCH --wrap=id"], "newline"),
        ("args", ["#SBATCH --nodes=99"], "#SBATCH"),
        ("env", {"SLURM_CONF": "/tmp/x"}, "Slurm's own"),
        ("env", {"LD_PRELOAD": "/tmp/x.so"}, "may not be set"),
        ("env", {"NCCL_DEBUG": "INFO\n#SBATCH"}, "control character"),
        ("nnodes", 0, "nnodes"),
        ("nproc_per_node", "2", "nproc_per_node"),
        ("max_wall_s", -1, "max_wall_s"),
        ("gpus_per_node", 1, "gpus_per_node"),  # with nproc_per_node 2
        ("idempotency_key", "k\n#SBATCH", "idempotency_key"),
        ("script", "relative.py", "absolute path"),
    ],
)
def test_plan_refuses_what_could_smuggle_an_option_or_shell(
    tmp_path: Path, field: str, value: object, said: str
) -> None:
    backend = SlurmBackend(job_root=tmp_path / "root", env={"PATH": str(tmp_path)})
    spec = spec_for(TINY_GPT, **({"nproc_per_node": 2} | {field: value}))
    with pytest.raises(ValueError, match="accepted") as raised:
        backend.plan(spec)
    assert said in str(raised.value)
    assert not (tmp_path / "root").exists()


@pytest.mark.timeout(60)
def test_a_job_folder_sbatch_would_misread_is_refused(tmp_path: Path) -> None:
    backend = SlurmBackend(job_root=tmp_path)
    with pytest.raises(ValueError, match="#SBATCH"):
        backend.plan(spec_for(TINY_GPT), job_dir=tmp_path / "has space")
    with pytest.raises(ValueError, match="expands '%'"):
        backend.plan(spec_for(TINY_GPT), job_dir=tmp_path / "job%j")


@pytest.mark.timeout(60)
def test_the_exit_record_names_the_node_that_failed_not_the_one_stopped_after(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "slurm-node0-exit.json").write_text(
        json.dumps({"node": 0, "exit_code": 1, "signal": "SIGTERM", "reason": None, "ended_at": 5.0})
    )
    (tmp_path / "slurm-node1-exit.json").write_text(
        json.dumps(
            {
                "node": 1,
                "exit_code": 1,
                "signal": None,
                "reason": "rank 1 failed (exit 1): ValueError: x",
                "rank": 1,
                "ended_at": 4.0,
            }
        )
    )
    record = write_exit_record(tmp_path, 1, env={"SLURM_JOB_ID": "12"})
    assert (record["state"], record["rank"], record["node"]) == ("FAILED", 1, 1)
    status = from_record(json.loads((tmp_path / EXIT_RECORD).read_text()), None)
    assert status.state == JobState.FAILED and "rank 1 failed (exit 1): ValueError: x" in (status.reason or "")
    assert "Slurm no longer knows the job" in (status.reason or "")
    # A record that only the shell wrote (the helper could not start) still tells success from failure.
    assert from_record({"job_id": "12", "exit_code": 0, "signal": ""}, None).state == JobState.SUCCEEDED
    assert from_record({"job_id": "12", "exit_code": 2, "signal": ""}, None).state == JobState.FAILED
    assert from_record({"job_id": "12", "exit_code": 143, "signal": "TERM"}, None).state == JobState.CANCELLED


# ---- a real Slurm cluster -------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_available_names_partitions_and_idle_nodes(backend: SlurmBackend) -> None:
    ok, detail = backend.available()
    assert ok, detail
    assert "debug" in detail and "2 node(s)" in detail and "no accounting" in detail
    assert backend.partitions() == ["debug"]
    elsewhere = SlurmBackend(job_root=backend.job_root, env={**os.environ, "PATH": str(backend.job_root)})
    ok, detail = elsewhere.available()
    assert not ok and "sbatch, squeue, scontrol, scancel, sinfo not found on PATH" in detail


@pytest.mark.timeout(300)
def test_tiny_gpt_on_two_nodes_succeeds_with_rank_logs_of_both_nodes_and_metrics(backend: SlurmBackend) -> None:
    spec = spec_for(TINY_GPT, args=["--steps", "20", "--log-every", "5"], name="tiny-gpt", partition="debug")
    plan = backend.plan(spec)
    assert "partition debug (checked with sinfo)" in plan.notes
    handle = backend.submit(plan, SubmitRequest(key=unique_key("tiny"), spec=spec))
    status = wait_status(backend, handle, timeout_s=240)
    assert status.state == JobState.SUCCEEDED, status
    assert status.exit_code == 0 and status.native_state == "COMPLETED"
    folder = Path(handle.job_dir or "")
    assert {"batch", "rank0", "rank1", "torchrun-node0", "torchrun-node1"} <= set(JobFiles(folder).processes())
    assert "2 rank(s) on cpu (gloo)" in log_of(handle, "rank0")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows and max(r["step"] for r in rows) == 20 and any(r.get("loss") for r in rows)
    record = json.loads((folder / EXIT_RECORD).read_text())
    assert record["state"] == "COMPLETED" and record["job_id"] == handle.native_id
    ranks = sorted(rank for node in record["nodes"] for rank in node["ranks"].values())
    assert ranks == [0, 1]  # each node learnt its rank from the rendezvous


@pytest.mark.timeout(300)
def test_hostile_args_reach_the_script_literally_across_nodes(backend: SlurmBackend, tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    spec = spec_for(FIXTURES / "echo_args.py", args=HOSTILE_ARGS, env={**LOOPBACK, "JOB_ECHO_ARGS_OUT": str(out)})
    handle = submit(backend, spec)
    status = wait_status(backend, handle, timeout_s=240)
    assert status.state == JobState.SUCCEEDED, status
    assert json.loads(out.read_text()) == HOSTILE_ARGS
    assert "rank 0 of 2: sum 2" in log_of(handle, "rank0")
    assert "rank 1 of 2: sum 2" in log_of(handle, "rank1") and "rank 1 stderr line" in log_of(handle, "rank1")


@pytest.mark.timeout(300)
def test_a_failing_rank_on_the_other_node_is_named_with_its_exception(backend: SlurmBackend) -> None:
    handle = submit(backend, spec_for(FIXTURES / "fail_rank1.py", name="fail"))
    status = wait_status(backend, handle, timeout_s=240)
    assert status.state == JobState.FAILED, status
    assert "rank 1 failed (exit 1): ValueError: bad batch at step 3" in (status.reason or ""), status.reason
    assert "ValueError: bad batch at step 3" in log_of(handle, "rank1")
    assert "rank 0 started" in log_of(handle, "rank0")


@pytest.mark.timeout(300)
def test_a_job_past_its_time_limit_fails_with_timeout(backend: SlurmBackend) -> None:
    # max_wall_s 60 is --time=1 (whole minutes). Slurm ends a job at its first time-limit check (every 30 s) past
    # its end time, 60-90 s after the start; not to wait the minute, the running job's end time is brought forward
    # (scontrol update EndTime, as an admin shortens a job): Slurm then ends it as at its --time, state TIMEOUT.
    handle = submit(backend, spec_for(FIXTURES / "sleep_forever.py", name="sleepy", max_wall_s=60))
    wait_until(lambda: "sleeping" in log_of(handle, "rank0"), 120, "rank 0 of the job sleeps")
    job = backend.query(handle.native_id)
    assert job is not None and job.state == "RUNNING" and job.time_limit == "00:01:00", job  # --time=1 was asked
    shortened = time.monotonic()
    update = ["scontrol", "update", f"JobId={handle.native_id}", "EndTime=now+2"]
    done = subprocess.run(update, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    status = wait_status(backend, handle, timeout_s=120)
    assert status.state == JobState.FAILED, status
    assert status.native_state == "TIMEOUT" and "TIMEOUT" in (status.reason or "")
    assert 1.5 < time.monotonic() - shortened < 120  # ended by Slurm's time-limit check, not at the update
    record = json.loads((Path(handle.job_dir or "") / EXIT_RECORD).read_text())
    assert record["state"] == "TIMEOUT" and record["signal"] == "TERM"
    assert "sleeping" in log_of(handle, "rank0")


@pytest.mark.timeout(180)
def test_a_job_that_cannot_start_is_queued_with_its_reason_then_cancelled(backend: SlurmBackend) -> None:
    handle = submit(backend, spec_for(FIXTURES / "sleep_forever.py", nnodes=3, name="three"))
    status = wait_status(backend, handle, lambda s: s.reason and "PartitionConfig" in s.reason, timeout_s=60)
    assert status.state == JobState.QUEUED and status.native_state == "PENDING", status
    assert "PartitionConfig" in (status.reason or "") and "more nodes than it has" in (status.reason or "")
    assert backend.cancel(handle) == JobState.CANCELLED
    assert backend.cancel(handle) == JobState.CANCELLED  # idempotent
    assert backend.status(handle).state == JobState.CANCELLED
    # A running job cancelled, and its exit record: tests/test_backend_contract.py.


@pytest.mark.timeout(240)
def test_submit_is_idempotent_by_the_key(backend: SlurmBackend, tmp_path: Path) -> None:
    spec = spec_for(FIXTURES / "sleep_forever.py", nnodes=3, name="idem")  # stays pending: nothing runs
    key = unique_key("idem")
    plan = backend.plan(spec, check_partition=False)
    first = backend.submit(plan, SubmitRequest(key=key, spec=spec))
    try:
        assert backend.submit(plan, SubmitRequest(key=key, spec=spec)) == first
        restarted = SlurmBackend(job_root=backend.job_root)  # a new server: nothing in memory
        assert restarted.submit(restarted.plan(spec, check_partition=False), SubmitRequest(key=key, spec=spec)) == first
        # The submit record lost (a crash right after sbatch): the job is found by its --comment.
        (Path(first.job_dir or "") / SUBMIT_RECORD).unlink()
        again = SlurmBackend(job_root=backend.job_root)
        assert again.submit(again.plan(spec, check_partition=False), SubmitRequest(key=key, spec=spec)) == first
        with_key = [
            line
            for line in subprocess.run(
                ["squeue", "-h", "-o", "%i|%k"], capture_output=True, text=True, timeout=30
            ).stdout.splitlines()
            if line.endswith(f"llm-infra-mcp:{key}")
        ]
        assert with_key == [f"{first.native_id}|llm-infra-mcp:{key}"]
    finally:
        backend.cancel(first)
    # A submit that died inside sbatch (its record says "submitting") and whose job cannot be found is not repeated.
    other = unique_key("unsure")
    fresh = SlurmBackend(job_root=backend.job_root)
    folder = backend.job_root / "unsure"
    folder.mkdir(parents=True)
    (folder / SUBMIT_RECORD).write_text(json.dumps({"key": other, "state": "submitting", "at": 1.0}))
    before = jobs_in_squeue()
    with pytest.raises(RuntimeError, match="not submitted again automatically"):
        fresh.submit(fresh.plan(spec, check_partition=False), SubmitRequest(key=other, spec=spec), job_dir=folder)
    no_new_job(before)


@pytest.mark.timeout(400)
def test_states_are_exact_after_slurm_forgot_the_job(backend: SlurmBackend, tmp_path: Path) -> None:
    ok = submit(backend, spec_for(FIXTURES / "quick.py", nnodes=1, name="ok"))
    bad = submit(backend, spec_for(FIXTURES / "quick.py", args=["3"], nnodes=1, name="bad"))
    never = submit(backend, spec_for(FIXTURES / "quick.py", nnodes=3, name="never"))
    assert backend.cancel(never) == JobState.CANCELLED
    for handle in (ok, bad, never):  # until slurmctld purged the ended job (MinJobAge, then its purge pass)
        wait_until(lambda h=handle: backend.query(h.native_id) is None, 150, f"Slurm forgets job {handle.native_id}")
    # Ask only now: the backend never saw them end, so what it says comes from the job folder.
    for handle in (ok, bad, never):
        (Path(handle.job_dir or "") / STATE_RECORD).unlink(missing_ok=True)
    fresh = SlurmBackend(job_root=backend.job_root)
    status = fresh.status(ok)
    assert (status.state, status.exit_code, status.native_state) == (JobState.SUCCEEDED, 0, "COMPLETED"), status
    assert status.ended_at is not None and "exit record" in (status.reason or "")
    status = fresh.status(bad)
    assert (status.state, status.exit_code) == (JobState.FAILED, 1), status  # torchrun's exit code: 1
    assert "rank 0 failed (exit 3)" in (status.reason or ""), status.reason
    status = fresh.status(never)
    assert status.state == JobState.CANCELLED and "before it started" in (status.reason or ""), status
    # A job gone without any record is LOST, never SUCCEEDED.
    (Path(ok.job_dir or "") / EXIT_RECORD).unlink()
    status = fresh.status(ok)
    assert status.state == JobState.LOST and "no exit record" in (status.reason or ""), status
    (Path(never.job_dir or "") / CANCEL_RECORD).unlink()
    assert fresh.status(never).state == JobState.LOST
    # Slurm cannot be asked (no commands here): the exit record still answers; without one it is an error, not a guess.
    cut_off = SlurmBackend(job_root=backend.job_root, env={"PATH": str(tmp_path)})
    status = cut_off.status(bad)
    assert status.state == JobState.FAILED and "Slurm did not answer" in (status.reason or ""), status
    with pytest.raises(SlurmUnavailableError, match="not installed or not on PATH"):
        cut_off.status(ok)
    unknown = BackendHandle(backend="slurm", key="k", native_id="999999", job_dir=str(tmp_path / "nothing"))
    assert fresh.status(unknown).state == JobState.LOST
    assert fresh.status(BackendHandle(backend="slurm", key="k", native_id="999998")).state == JobState.LOST


@pytest.mark.timeout(60)
def test_a_request_no_partition_can_hold_is_refused_at_plan_time(backend: SlurmBackend) -> None:
    # Issue 22, defect 5: nnodes 5 on a 3-node cluster was submitted and stayed PENDING (PartitionConfig) for ever.
    before = jobs_in_squeue()
    with pytest.raises(ValueError, match=r"asks 3 nodes; partition debug \(the default\) has 2: Slurm would keep"):
        backend.plan(spec_for(TINY_GPT, nnodes=3))
    with pytest.raises(ValueError, match="asks 3 nodes; partition debug has 2"):
        backend.plan(spec_for(TINY_GPT, nnodes=3, partition="debug"))
    assert backend.partition_sizes() == ({"debug": (2, None)}, "debug")
    assert backend.never_fits(2, None) is None and backend.plan(spec_for(TINY_GPT, nnodes=2)).nnodes == 2
    no_new_job(before)


@pytest.mark.timeout(180)
def test_bad_inputs_are_refused_and_nothing_is_submitted(backend: SlurmBackend) -> None:
    before = jobs_in_squeue()
    with pytest.raises(ValueError, match="'nope' is not a partition of this cluster; accepted: debug"):
        backend.plan(spec_for(TINY_GPT, partition="nope"))
    with pytest.raises(ValueError, match="sbatch/srun option"):
        backend.plan(spec_for(TINY_GPT, args=["--steps", "2", "--wrap", "id"]))
    with pytest.raises(ValueError, match="Slurm job name"):
        backend.plan(spec_for(TINY_GPT, name="x\n#SBATCH --wrap=id"))
    # sbatch itself refuses a job (GPUs on a cluster without them): an error saying so, no record left behind, so
    # that a corrected submit with the same key may go ahead.
    spec = spec_for(TINY_GPT, gpus_per_node=1)
    key = unique_key("gpu")
    with pytest.raises(RuntimeError, match="sbatch refused the job"):
        submit(backend, spec, key)
    no_new_job(before)
    assert not any(backend.job_root.glob(f"*/{SUBMIT_RECORD}"))
    # A plan of another backend is not run.
    other = BackendPlan(backend="local", argv=["sbatch", "--wrap", "id"], cwd="/", rendered="#!/bin/sh")
    with pytest.raises(ValueError, match=r"SlurmBackend\.plan"):
        backend.submit(other, SubmitRequest(key=unique_key("other"), spec={}))
    no_new_job(before)


@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")
def test_the_global_rank_of_a_local_rank_is_read_from_the_worker(tmp_path: Path) -> None:
    env = {**os.environ, "LOCAL_RANK": "0", "RANK": "5", "TORCHELASTIC_RESTART_COUNT": "2"}
    child = subprocess.Popen(["sleep", "30"], env=env)
    try:
        deadline = time.monotonic() + 10
        while (found := worker_ranks(os.getpid())) == {} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found == {(2, 0): 5}
    finally:
        child.kill()
        child.wait()


@pytest.mark.timeout(60)
def test_an_exit_record_is_not_believed_while_slurm_says_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21, 13: the training script can write JOB/slurm-exit.json itself and run on. While Slurm says RUNNING
    the job is RUNNING; once Slurm says COMPLETING (the batch script ended) the record answers."""
    backend = SlurmBackend(job_root=tmp_path)
    (tmp_path / EXIT_RECORD).write_text(json.dumps({"job_id": "41", "exit_code": 0, "state": "COMPLETED"}))
    handle = BackendHandle(backend="slurm", key="k", native_id="41", job_dir=str(tmp_path))
    seen = {"state": "RUNNING"}
    monkeypatch.setattr(backend, "query", lambda job_id: SlurmJob(job_id=job_id, state=seen["state"]))
    assert backend.status(handle).state is JobState.RUNNING
    seen["state"] = "COMPLETING"
    assert backend.status(handle).state is JobState.SUCCEEDED


def log_of(handle: BackendHandle, process: str) -> str:
    """A process's log in the job folder, as read_job_logs serves it ("" before it exists)."""
    path = JobFiles(str(handle.job_dir)).log(process)
    return path.read_text(errors="replace") if path.exists() else ""
