"""Training on Slurm through the MCP tools: the launch server plans through the Slurm backend (the batch script is in
the plan), a job of the engine here follows the Slurm job (its state and pending reason, rank logs of every node and
metrics in the job folder), a cancel scancels it; bad inputs start nothing. Against the session's real two-node
cluster (tests/conftest.py `slurm_cluster`)."""

import subprocess
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from servers.core.mcp_layer import App
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


async def test_tiny_gpt_on_two_slurm_nodes_through_the_tools(app: App, slurm_cluster: Path) -> None:
    spec = {"recipe": "tiny-gpt", "args": ["--steps", "20", "--log-every", "5"], "nproc_per_node": 1}
    spec |= {"nnodes": 2, "backend": "slurm", "max_wall_s": 600}
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await ok(client, "plan_training_job", {"spec": spec})
        assert "#SBATCH --nodes=2" in plan["rendered"] and "srun" in plan["rendered"]
        job = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        done = await finish_job(client, job["job_id"], 240)
        assert done["state"] == "SUCCEEDED", done["reason"]
        assert done["result"]["backend"] == "slurm"
        logs = {entry["process"] for entry in done["logs"]}
        assert {"rank0", "rank1", "batch"} <= logs, logs
        rows = (await ok(client, "read_job_metrics", {"job_id": job["job_id"], "keys": ["loss"]}))["rows"]
        assert [r["step"] for r in rows if r.get("loss") is not None][:4] == [5, 10, 15, 20]
        backends = {b["name"]: b for b in (await ok(client, "list_backends", {}))["backends"]}
        assert backends["slurm"]["detected"] and backends["slurm"]["launch_supported"]


async def test_a_request_no_partition_can_hold_is_refused_with_the_numbers(app: App, slurm_cluster: Path) -> None:
    # Issue 22, defect 5: nnodes 5 on a 3-node cluster was submitted, stayed PENDING (PartitionConfig) for ever and
    # was RUNNING in get_job. Here nnodes 3 on the session's 2 nodes: refused at plan time, nothing submitted.
    spec = {"recipe": "tiny-gpt", "nproc_per_node": 1, "nnodes": 3, "backend": "slurm", "max_wall_s": 600}
    async with Client(create_test_suite(app), mode="legacy") as client:
        for tool in ("plan_training_job", "submit_training_job"):
            said = await error(client, tool, {"spec": spec})
            assert "asks 3 nodes; partition debug (the default) has 2" in said, said
        assert (await ok(client, "list_jobs", {}))["total"] == 0


async def test_a_pending_slurm_job_is_queued_with_its_reason_until_cancelled(app: App, slurm_cluster: Path) -> None:
    # A job Slurm keeps PENDING (here: its dependency, a job still running) is QUEUED in get_job with Slurm's reason,
    # with no start and no run time; the old follower called it RUNNING as soon as it started.
    blocker = subprocess.run(
        ["sbatch", "--parsable", "-N1", "--time=5", "--wrap", "sleep 240"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    spec = {"recipe": "tiny-gpt", "nproc_per_node": 1, "nnodes": 1, "backend": "slurm", "max_wall_s": 600}
    spec["options"] = {"dependency": blocker.split(";")[0]}
    try:
        async with Client(create_test_suite(app), mode="legacy") as client:
            job = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                job = await ok(client, "get_job", {"job_id": job["job_id"]})
                if "PENDING" in (job["reason"] or ""):
                    break
                assert job["state"] in ("QUEUED", "STARTING"), job
                await anyio.sleep(0.5)
            assert job["state"] == "QUEUED" and "slurm PENDING: Dependency" in job["reason"], job["reason"]
            assert job["started_at"] is None and job["elapsed_s"] is None, job
            summary = (await client.call_tool("get_job", {"job_id": job["job_id"]})).content[0].text
            assert ": QUEUED; slurm PENDING: Dependency" in summary and "RUNNING" not in summary, summary
            listed = await ok(client, "list_jobs", {})
            assert [(j["job_id"], j["state"]) for j in listed["jobs"]] == [(job["job_id"], "QUEUED")], listed
            cancelled = await ok(client, "cancel_job", {"job_id": job["job_id"]})
            assert cancelled["state"] == "CANCELLED" and cancelled["started_at"] is None, cancelled
    finally:
        subprocess.run(["scancel", blocker.split(";")[0]], capture_output=True, timeout=30, check=False)


async def test_slurm_bad_inputs_submit_nothing(app: App, slurm_cluster: Path) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        local = {"recipe": "tiny-gpt", "nnodes": 2}
        assert "accepted: 1 on the local backend" in await error(client, "plan_training_job", {"spec": local})
        wrap = {"recipe": "tiny-gpt", "backend": "slurm", "args": ["--wrap", "id"]}
        assert "--wrap" in await error(client, "submit_training_job", {"spec": wrap})
        name = {"recipe": "tiny-gpt", "backend": "slurm", "name": "x\n#SBATCH --uid=0"}
        assert "name" in await error(client, "submit_training_job", {"spec": name})
        unknown = {"recipe": "tiny-gpt", "backend": "slurm", "options": {"partition": "nosuchpart"}}
        assert "nosuchpart" in await error(client, "submit_training_job", {"spec": unknown})
        assert "qos: a slurm option, not a local one" in await error(
            client, "plan_training_job", {"spec": {"recipe": "tiny-gpt", "options": {"qos": "hi"}}}
        )
        assert "qos: a slurm option; give it in options" in await error(
            client, "plan_training_job", {"spec": {"recipe": "tiny-gpt", "backend": "slurm", "qos": "hi"}}
        )
        assert (await ok(client, "list_jobs", {}))["total"] == 0


async def test_a_lost_follower_is_replaced_and_the_slurm_job_runs_once(
    app: App, slurm_cluster: Path, tmp_path: Path
) -> None:
    """The processes here that follow a Slurm job are killed (SIGKILL): the next look at the job starts a new
    follower, which finds the Slurm job by its key instead of submitting it again, and the job ends SUCCEEDED."""
    import json
    import os
    import shutil
    import signal

    from servers.core.procs import ProcessIdentity

    script = tmp_path / "scripts" / "wait_go.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).parent / "fixtures" / "launch" / "wait_go.py", script)
    go = tmp_path / "go"
    spec = {"script": str(script), "nproc_per_node": 1, "backend": "slurm", "env": {"JOB_GO_FILE": str(go)}}
    async with Client(create_test_suite(app), mode="legacy") as client:
        job = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
        job_dir = Path(app.engine.get(job["job_id"]).job_dir)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "waiting" not in _text(job_dir / "logs" / "rank0.log"):
            time.sleep(0.3)
        assert "waiting" in _text(job_dir / "logs" / "rank0.log"), _text(job_dir / "logs" / "batch.log")
        submitted = json.loads((job_dir / "slurm-submit.json").read_text())
        record = app.engine.store.get(job["job_id"])
        assert record is not None and record.worker_pid and record.supervisor_pid
        followers = [ProcessIdentity.of(record.supervisor_pid), ProcessIdentity.of(record.worker_pid)]
        os.killpg(record.worker_pid, signal.SIGKILL)
        os.kill(record.supervisor_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(p.is_alive() for p in followers):
            time.sleep(0.1)
        view = await ok(client, "get_job", {"job_id": job["job_id"]})
        assert not view["finished"] and "follows the work again" in view["reason"], view["reason"]
        go.touch()
        done = await finish_job(client, job["job_id"], 180)
        assert done["state"] == "SUCCEEDED", done["reason"]
        assert json.loads((job_dir / "slurm-submit.json").read_text()) == submitted  # submitted once
        assert _text(job_dir / "logs" / "rank0.log").count("rank 0 done") == 1


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


async def test_a_slurm_job_survives_a_sigkilled_server_and_ends_exact_after_restart(
    home: Path, slurm_cluster: Path
) -> None:
    """The launch server (a real stdio subprocess) is SIGKILLed while its Slurm job runs; a new server finds the
    job, and its end is exact once it is over (SUCCEEDED, the metrics complete)."""
    import os

    import anyio
    from mcp.client.stdio import StdioServerParameters

    from tests.conftest import PYTHON, REPO_ROOT, server_env
    from tests.test_stdio import kill_and_wait

    env = server_env(home, SLURM_CONF=os.environ["SLURM_CONF"])
    code = (
        "import os, sys; print(os.getpid(), file=open(sys.argv[1], 'w'), flush=True); "
        "from tests.helpers import create_test_suite; create_test_suite().run()"
    )
    params = StdioServerParameters(
        command=PYTHON, args=["-c", code, str(home.parent / "server.pid")], env=env, cwd=str(REPO_ROOT)
    )
    spec = {"recipe": "tiny-gpt", "args": ["--steps", "60", "--log-every", "5"], "nproc_per_node": 1}
    spec |= {"backend": "slurm", "nnodes": 2, "max_wall_s": 600}
    job: dict = {}
    killed = False
    try:
        async with Client(params, mode="legacy") as client:
            pid = int((home.parent / "server.pid").read_text())
            result = await client.call_tool("submit_training_job", {"spec": spec, "wait_s": 0})
            assert not result.is_error, result.content[0].text
            job = result.structured_content
            for _ in range(600):
                view = (await client.call_tool("get_job", {"job_id": job["job_id"]})).structured_content
                if view["state"] == "RUNNING" and "RUNNING" in ((view["progress"] or {}).get("message") or ""):
                    break
                await anyio.sleep(0.2)
            kill_and_wait(pid)
            killed = True
            await client.list_tools()
    except BaseException:
        if not killed:
            raise
    assert job
    async with Client(params, mode="legacy") as client:
        final = await finish_job(client, job["job_id"], 240)
        assert final["state"] == "SUCCEEDED", final["reason"]
        rows = (await client.call_tool("read_job_metrics", {"job_id": job["job_id"]})).structured_content["rows"]
        assert [r["step"] for r in rows if r.get("loss") is not None and r.get("split") == "train"][-1] == 60


async def test_a_sweep_on_slurm_is_one_job_array(app: App, slurm_cluster: Path, tmp_path: Path) -> None:
    """Three runs on two one-CPU nodes: one sbatch --array=0-2 (the third task waits for a node), each run a job
    here with its own folder, state and logs (run 1 exits 3: FAILED, the others SUCCEEDED); submitting the sweep
    again submits nothing."""
    import json
    import shutil

    script = tmp_path / "scripts" / "quick.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).parent / "fixtures" / "launch" / "quick.py", script)
    spec = {"script": str(script), "nproc_per_node": 1, "backend": "slurm", "max_wall_s": 300}
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await ok(client, "plan_sweep", {"spec": spec, "variants": [["0"], ["3"], ["0"]]})
        assert "#SBATCH --array=0-2" in plan["array_script"] and "#SBATCH --nodes=1" in plan["array_script"]
        submitted = await ok(client, "submit_sweep", {"sweep_token": plan["sweep_token"]})
        sweep_dir = app.settings.home / "slurm-jobs" / plan["sweep_id"]
        array = json.loads((sweep_dir / "slurm-array-submit.json").read_text())
        again = await ok(client, "submit_sweep", {"sweep_token": plan["sweep_token"]})
        assert again["job_ids"] == submitted["job_ids"]
        assert json.loads((sweep_dir / "slurm-array-submit.json").read_text()) == array  # one sbatch
        deadline = time.monotonic() + 240
        waited: dict = {}
        while time.monotonic() < deadline:
            waited = await ok(client, "wait_for_job", {"job_id": plan["sweep_id"], "wait_s": 30})
            if waited["sweep"]["finished"] == 3:
                break
        assert waited["sweep"]["states"] == {"SUCCEEDED": 2, "FAILED": 1}, waited["sweep"]
        views = [await ok(client, "get_job", {"job_id": j}) for j in submitted["job_ids"]]
        assert [v["state"] for v in views] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
        assert [v["result"]["native_id"] for v in (views[0], views[2])] == [
            f"{array['job_id']}_0",
            f"{array['job_id']}_2",
        ]
        assert f"{array['job_id']}_1" in views[1]["reason"] and "(exit 3)" in views[1]["reason"], views[1]["reason"]
        for view in views:
            log = _text(Path(app.engine.get(view["job_id"]).job_dir) / "logs" / "rank0.log")
            assert "rank 0 of 1 done" in log, log
