"""A training job that continues from another job's checkpoints (TrainingJobSpec.resume_from): the plan checks the
source job (it exists here, is a training job, has ended, ran the same recipe or script, left a checkpoint) and the
backend (its job folder is on this machine: local, Slurm, Ray), and shows what will be copied; the job's worker
copies the source's checkpoints folder into the new job's before anything of the job starts (regular files only, no
symbolic link followed, bounded), and the recipe resumes from the newest. Real runs: tiny-grpo on this machine
through the MCP tools, on the session's Slurm cluster and on its Ray head."""

import os
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from servers.core.jobfiles import JobContext, JobFiles, read_json
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from servers.launch import local
from servers.launch.training import TRAINING_KINDS, TrainingJobSpec, spec_hash
from tests.conftest import CHILD_ENV
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

FIRST = ["--steps", "120", "--ckpt-every", "50", "--evals", "5"]
SECOND = ["--steps", "240", "--ckpt-every", "50", "--evals", "5"]


def grpo(args: list[str], **extra: Any) -> dict[str, Any]:
    return {"recipe": "tiny-grpo", "args": args, "nproc_per_node": 1, "max_wall_s": 600, **extra}


def job_dir(app: App, job_id: str) -> Path:
    return Path(app.engine.get(job_id).job_dir)


def metric_steps(app: App, job_id: str) -> list[int]:
    import json

    rows = [json.loads(line) for line in JobFiles(job_dir(app, job_id)).metrics.read_text().splitlines() if line]
    return [int(r["step"]) for r in rows if r.get("step") is not None]


async def resume_twice(client: Client, app: App, tmp_path: Path, backend: str = "local") -> tuple[str, dict, dict]:
    """Job 1 (120 steps) to its end, job 2 (240 steps) resuming from it; (job 1's id, job 2's plan, job 2 ended)."""
    first = await ok(client, "submit_training_job", {"spec": grpo(FIRST, backend=backend), "wait_s": 0})
    done = await finish_job(client, first["job_id"], 120)
    assert done["state"] == "SUCCEEDED", done["reason"]
    source = JobFiles(job_dir(app, first["job_id"])).checkpoints
    assert sorted(p.name for p in source.iterdir()) == ["step_00000100.pt", "step_00000120.pt"]
    outside = tmp_path / "outside-secret.pt"
    outside.write_bytes(b"not a checkpoint of this job")
    (source / "step_00999999.pt").symlink_to(outside)  # planted: never followed, never copied
    plan = await ok(client, "plan_training_job", {"spec": grpo(SECOND, backend=backend, resume_from=first["job_id"])})
    second = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
    ended = await finish_job(client, second["job_id"], 120)
    assert ended["state"] == "SUCCEEDED", ended["reason"]
    copied = JobFiles(job_dir(app, second["job_id"]))
    assert not (copied.checkpoints / "step_00999999.pt").exists()
    assert not (copied.checkpoints / "step_00999999.pt").is_symlink()
    assert outside.read_bytes() == b"not a checkpoint of this job"
    record = read_json(copied.resume_record)
    assert record is not None and record["from_job"] == first["job_id"] and record["newest_step"] == 120
    assert record["files"] == 2 and any("step_00999999.pt: a symbolic link" in s for s in record["skipped"])
    return first["job_id"], plan, ended


# ---- on this machine, through the tools ------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_a_job_resumes_from_another_jobs_newest_checkpoint(
    suite_client: Client, app: App, tmp_path: Path
) -> None:
    source, plan, ended = await resume_twice(suite_client, app, tmp_path)
    assert plan["spec"]["resume_from"] == source
    assert plan["resume"]["job_id"] == source and plan["resume"]["newest_step"] == 120
    assert plan["resume"]["files"] == 2 and plan["resume"]["bytes"] > 0
    assert any(s.startswith("step_00999999.pt: a symbolic link") for s in plan["resume"]["skipped"])
    assert any(f"resumes from job {source}: its newest checkpoint (step 120), 2 file(s)" in n for n in plan["notes"])
    log = await ok(suite_client, "read_job_logs", {"job_id": ended["job_id"], "process": "rank0"})
    assert "resumed from step 120" in log["text"], log["text"][-2000:]
    steps = metric_steps(app, ended["job_id"])
    assert steps and min(steps) > 120 and max(steps) == 240, steps
    assert ended["result"]["resumed_from"]["from_job"] == source
    assert ended["result"]["resumed_from"]["newest_step"] == 120
    said = await ok(suite_client, "read_job_logs", {"job_id": ended["job_id"], "process": "resume"})
    assert f"resumes from job {source}" in said["text"] and "step_00999999.pt: a symbolic link" in said["text"]


def test_the_spec_hash_and_the_plan_token_bind_resume_from() -> None:
    plain = TrainingJobSpec(recipe="tiny-grpo")
    resumed = plain.model_copy(update={"resume_from": "abc"})
    assert spec_hash(plain) != spec_hash(resumed)
    from servers.launch import server

    assert (server.TRAINING_KIND, server.REMOTE_KIND) == TRAINING_KINDS
    with pytest.raises(ValueError, match="resume_from"):
        TrainingJobSpec(recipe="tiny-grpo", resume_from="../other")


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_a_plan_token_stands_for_its_resume_from_alone(app: App, tmp_path: Path) -> None:
    script = tmp_path / "saves.py"
    script.write_text(
        "import os, pathlib\n"
        "d = pathlib.Path(os.environ['LLM_INFRA_MCP_CHECKPOINT_DIR'])\n"
        "print('found', sorted(p.name for p in d.iterdir()), flush=True)\n"
        "(d / 'state.bin').write_bytes(b'x' * 10)\n"
    )
    spec = {"script": str(script), "nproc_per_node": 1, "max_wall_s": 120}
    async with Client(create_test_suite(app), mode="legacy") as client:
        first = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
        assert (await finish_job(client, first["job_id"], 120))["state"] == "SUCCEEDED"
        plan = await ok(client, "plan_training_job", {"spec": {**spec, "resume_from": first["job_id"]}})
        assert plan["resume"]["newest_step"] is None and plan["resume"]["files"] == 1
        assert any(
            f"resumes from job {first['job_id']}: its checkpoints, 1 file(s), 10 bytes" in n for n in plan["notes"]
        )
        said = await error(client, "submit_training_job", {"spec": spec, "plan_token": plan["plan_token"]})
        assert "plan_token was made for a different spec" in said
        second = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        ended = await finish_job(client, second["job_id"], 120)
        assert ended["state"] == "SUCCEEDED", ended["reason"]
        log = await ok(client, "read_job_logs", {"job_id": second["job_id"], "process": "rank0"})
        assert "found ['state.bin']" in log["text"]


# ---- refusals --------------------------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_resume_from_refuses_what_it_cannot_resume_from(app: App, tmp_path: Path) -> None:
    script = tmp_path / "sleeps.py"
    script.write_text("import sys, time\ntime.sleep(float(sys.argv[1]))\n")
    spec = {"script": str(script), "nproc_per_node": 1, "max_wall_s": 120}
    async with Client(create_test_suite(app), mode="legacy") as client:

        async def refused(resume_spec: dict[str, Any]) -> str:
            said = await error(client, "plan_training_job", {"spec": resume_spec})
            again = await error(client, "submit_training_job", {"spec": resume_spec, "wait_s": 0})
            assert said.split(": ", 1)[1] == again.split(": ", 1)[1]  # "Error executing tool <name>: ..."
            return said

        said = await refused(grpo(FIRST, resume_from="no-such-job"))
        assert "resume_from no-such-job: no such job in this server's job store" in said

        test_job = await ok(client, "start_test_job", {"kind": "test_count", "spec": {"steps": 1}, "wait_s": 20})
        said = await refused(grpo(FIRST, resume_from=test_job["job_id"]))
        assert f"resume_from {test_job['job_id']}: a test_count job, not a training job" in said

        running = await ok(client, "submit_training_job", {"spec": {**spec, "args": ["60"]}, "wait_s": 0})
        said = await refused({**spec, "args": ["1"], "resume_from": running["job_id"]})
        assert f"resume_from {running['job_id']}: the job is " in said and "accepted: a job that has ended" in said
        await ok(client, "cancel_job", {"job_id": running["job_id"]})

        said = await refused(grpo(FIRST, resume_from=running["job_id"]))  # ended now, but another program
        assert f"it ran script {script}, this job runs recipe tiny-grpo" in said

        other = tmp_path / "other.py"
        other.write_text("pass\n")
        said = await refused({**spec, "script": str(other), "resume_from": running["job_id"]})
        assert f"it ran script {script}, this job runs script {other}" in said and "same script" in said

        said = await refused({**spec, "args": ["1"], "resume_from": running["job_id"]})
        assert f"resume_from {running['job_id']}: its checkpoints folder" in said and "holds no checkpoint" in said

        for backend, extra in (("kubernetes", {"image": "x/y:1"}), ("skypilot", {})):
            said = await refused(grpo(FIRST, backend=backend, options=extra, resume_from=running["job_id"]))
            assert f"resume_from {running['job_id']}: the {backend} backend runs the job in a folder of its own" in said
            assert "accepted: backend local, slurm, ray" in said
        assert (await ok(client, "list_jobs", {}))["total"] == 2  # the test job and the cancelled one: nothing else


# ---- the copy --------------------------------------------------------------------------------------------------------
def source_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "old-job" / "checkpoints"
    (folder / "nested" / "deeper").mkdir(parents=True)
    (folder / "step_00000010.pt").write_bytes(b"a" * 100)
    (folder / "step_00000020.pt").write_bytes(b"b" * 200)
    (folder / "nested" / "deeper" / "opt.bin").write_bytes(b"c" * 30)
    (folder / ".step_00000030.pt.tmp123").write_bytes(b"half")
    outside = tmp_path / "secret"
    outside.write_bytes(b"secret")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.pt").write_bytes(b"x")
    (folder / "step_00000099.pt").symlink_to(outside)
    (folder / "linked-dir").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(folder / "a-fifo")
    return folder


def new_ctx(tmp_path: Path) -> JobContext:
    (tmp_path / "new-job").mkdir()
    return JobContext("new-job", "training", JobFiles(tmp_path / "new-job"))


@pytest.mark.timeout(60)
def test_the_copy_takes_regular_files_only_and_never_follows_a_link(tmp_path: Path) -> None:
    folder = source_folder(tmp_path)
    scan = local.scan_checkpoints(folder)
    assert scan.files == [("nested/deeper/opt.bin", 30), ("step_00000010.pt", 100), ("step_00000020.pt", 200)]
    assert scan.newest_step == 20 and scan.total_bytes == 330
    ctx = new_ctx(tmp_path)
    spec = {"resume_from": {"job_id": "old-job", "checkpoints": str(folder)}}
    record = local.seed_checkpoints(spec, ctx)
    assert record is not None and record["files"] == 3 and record["bytes"] == 330 and record["newest_step"] == 20
    skipped = "\n".join(record["skipped"])
    for name, why in (
        ("step_00000099.pt", "a symbolic link, not followed"),
        ("linked-dir", "a symbolic link, not followed"),
        ("a-fifo", "not a regular file"),
        (".step_00000030.pt.tmp123", "a temporary file"),
    ):
        assert f"{name}: {why}" in skipped
    dest = ctx.files.checkpoints
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert found == ["nested", "nested/deeper", "nested/deeper/opt.bin", "step_00000010.pt", "step_00000020.pt"]
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    copy, original = dest / "step_00000020.pt", folder / "step_00000020.pt"
    assert copy.read_bytes() == b"b" * 200 and os.stat(copy).st_ino != os.stat(original).st_ino
    assert os.stat(copy).st_mtime_ns == os.stat(original).st_mtime_ns
    with open(copy, "r+b") as f:  # the new job writing its copy in place leaves the old job's file as it was
        f.write(b"z" * 200)
    assert original.read_bytes() == b"b" * 200
    assert read_json(ctx.files.resume_record) == record
    assert "resumes from job old-job: copied its newest checkpoint (step 20), 3 file(s), 330 bytes" in (
        ctx.files.log("resume").read_text()
    )
    (folder / "step_00000030.pt").write_bytes(b"new")  # taken up again (a follower replaced): nothing copied twice
    assert local.seed_checkpoints(spec, ctx) == record and not (dest / "step_00000030.pt").exists()
    assert local.seed_checkpoints({}, ctx) is None


@pytest.mark.timeout(60)
def test_the_copy_is_bounded_and_a_failed_copy_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = source_folder(tmp_path)
    spec = {"resume_from": {"job_id": "old-job", "checkpoints": str(folder)}}
    monkeypatch.setattr(local, "MAX_RESUME_BYTES", 250)
    with pytest.raises(local.ResumeError, match=r"330 bytes in 3 file\(s\) so far, more than the 250 bytes"):
        local.scan_checkpoints(folder)
    ctx = new_ctx(tmp_path)
    too_big = r"resume_from old-job: copying its checkpoints from .* failed: 330 bytes in 3 file\(s\) so far"
    with pytest.raises(RuntimeError, match=too_big):
        local.seed_checkpoints(spec, ctx)
    assert not [p for p in ctx.files.checkpoints.rglob("*") if p.name.startswith(".")]  # no temporary left behind
    assert not ctx.files.resume_record.exists()
    monkeypatch.setattr(local, "MAX_RESUME_BYTES", 8 * 1024**3)
    monkeypatch.setattr(local, "MAX_RESUME_FILES", 2)
    with pytest.raises(local.ResumeError, match="more than 2 files"):
        local.scan_checkpoints(folder)
    monkeypatch.setattr(local, "MAX_RESUME_FILES", 4096)
    linked = tmp_path / "linked-job"
    linked.mkdir()
    (linked / "checkpoints").symlink_to(folder)  # the folder itself a link: refused, not followed
    with pytest.raises(local.ResumeError, match="a symbolic link is not followed"):
        local.scan_checkpoints(linked / "checkpoints")
    other = JobContext("new-2", "training", JobFiles(tmp_path / "new-2"))
    (tmp_path / "new-2").mkdir()
    bad = {"resume_from": {"job_id": "linked-job", "checkpoints": str(linked / "checkpoints")}}
    with pytest.raises(RuntimeError, match=r"resume_from linked-job: its checkpoints folder .* cannot be read"):
        local.seed_checkpoints(bad, other)
    array = {**spec, "slurm_array": "sweep-1"}
    with pytest.raises(RuntimeError, match="a run of a job array cannot resume"):
        local.seed_checkpoints(array, other)


# ---- Slurm and Ray ---------------------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.timeout(300)
async def test_a_slurm_job_resumes_from_another(app: App, slurm_cluster: Path, tmp_path: Path) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        _, plan, ended = await resume_twice(client, app, tmp_path, backend="slurm")
        assert plan["backend"] == "slurm" and plan["resume"]["newest_step"] == 120
        log = await ok(client, "read_job_logs", {"job_id": ended["job_id"], "process": "rank0"})
        assert "resumed from step 120" in log["text"]
        steps = metric_steps(app, ended["job_id"])
        assert steps and min(steps) > 120 and max(steps) == 240, steps


@pytest.mark.anyio
@pytest.mark.timeout(300)
async def test_a_ray_job_resumes_from_another(
    settings: Settings, ray_head: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", ray_head.token)
    configured = settings.model_copy(update={"ray_address": ray_head.address})
    app = App(configured, owner="test", child_env={**CHILD_ENV, "RAY_AUTH_TOKEN": ray_head.token})
    async with Client(create_test_suite(app), mode="legacy") as client:
        _, plan, ended = await resume_twice(client, app, tmp_path, backend="ray")
        assert plan["backend"] == "ray" and plan["resume"]["newest_step"] == 120
        log = await ok(client, "read_job_logs", {"job_id": ended["job_id"], "process": "rank0"})
        assert "resumed from step 120" in log["text"]
        steps = metric_steps(app, ended["job_id"])
        assert steps and min(steps) > 120 and max(steps) == 240, steps
