"""Overheads of the launch path, each against a baseline measured in the same run.

1. Per-job overhead of the local backend: the same trivial script run (a) by a bare `torchrun` subprocess and
   (b) through submit_training_job with wait_s (in-process MCP client: plan, checks, job engine, supervisor, worker,
   sandbox, torchrun, per-rank log mirroring, the tool's wait) until its answer says SUCCEEDED; also the latency
   from the call to the start the supervisor records (RUNNING). Median of --runs. The two
   alternate, one of each per round (which goes first alternates too), so that a change in the machine's load hits
   both alike; one unmeasured round first (the server's first job runs its isolation probes).
2. Job listing at scale: list_jobs (a page of 20, reconciled) and get_job with 10,000 jobs in the database, against
   the same calls with 100 jobs.

    python benchmarks/launch.py --runs 5
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp import Client

from servers.core.jobstore import JobRecord, JobState
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from servers.launch.server import create_server

SCRIPT = "import os, sys\nprint('rank', os.environ.get('RANK'), sys.argv[1:], flush=True)\n"


def bare_torchrun(script: Path, workdir: Path) -> float:
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1:1",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        str(script),
        "x",
    ]
    start = time.perf_counter()
    subprocess.run(
        argv,
        cwd=workdir,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


async def through_the_server(client: Client, app: App, script: Path) -> tuple[float, float]:
    """(seconds from the call to the answer saying SUCCEEDED, seconds from the call to the start its supervisor
    recorded): the tool waits for the end itself (wait_s), as a client would, rather than the client asking get_job
    every few milliseconds, which on a small machine takes CPU from the job being measured."""
    called = time.time()
    start = time.perf_counter()
    result = await client.call_tool(
        "submit_training_job", {"spec": {"script": str(script), "args": ["x"]}, "wait_s": 50}
    )
    elapsed = time.perf_counter() - start
    assert not result.is_error, result.content[0].text
    job = result.structured_content
    assert job["state"] == "SUCCEEDED", job.get("reason")
    record = app.engine.store.get(job["job_id"])
    assert record is not None and record.started_at is not None
    return elapsed, record.started_at - called


def fill(app: App, n: int) -> None:
    store = app.engine.store
    now = time.time()
    for i in range(n):
        store.insert(
            JobRecord(
                id=f"training-bench-{i:06d}",
                kind="training",
                spec={"script": "x.py", "args": []},
                state=JobState.SUCCEEDED,
                created_at=now - i,
                started_at=now - i,
                ended_at=now - i,
                exit_code=0,
                timeout_s=60,
                owner="bench",
                job_dir=str(app.settings.jobs_dir / "none"),
            )
        )


async def listing(client: Client, repeats: int) -> tuple[float, float]:
    list_times, get_times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        page = await client.call_tool("list_jobs", {"limit": 20})
        list_times.append(time.perf_counter() - start)
        job_id = page.structured_content["jobs"][0]["job_id"]
        start = time.perf_counter()
        await client.call_tool("get_job", {"job_id": job_id})
        get_times.append(time.perf_counter() - start)
    return statistics.median(list_times) * 1e3, statistics.median(get_times) * 1e3


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        script = root / "hello.py"
        script.write_text(SCRIPT)
        app = App(Settings(home=root / "state", allowed_roots=[root]), owner="launch")
        bare: list[float] = []
        served: list[tuple[float, float]] = []
        async with Client(create_server(app), mode="legacy") as client:
            for round_no in range(runs + 1):
                if round_no % 2:
                    one_served = await through_the_server(client, app, script)
                    one_bare = bare_torchrun(script, root)
                else:
                    one_bare = bare_torchrun(script, root)
                    one_served = await through_the_server(client, app, script)
                if round_no > 0:
                    bare.append(one_bare)
                    served.append(one_served)
        total = [t for t, _ in served]
        to_running = [r for _, r in served]
        print(f"per-job overhead, median of {runs} runs (1 rank, trivial script)")
        print(f"  bare torchrun                      {statistics.median(bare) * 1e3:8.0f} ms")
        print(
            f"  submit_training_job to SUCCEEDED   {statistics.median(total) * 1e3:8.0f} ms   "
            f"ratio {statistics.median(total) / statistics.median(bare):.2f}x, overhead "
            f"{(statistics.median(total) - statistics.median(bare)) * 1e3:.0f} ms"
        )
        print(f"  submit to RUNNING                  {statistics.median(to_running) * 1e3:8.0f} ms")

    for n in (100, 10_000):
        with tempfile.TemporaryDirectory() as tmp:
            app = App(Settings(home=Path(tmp) / "state"), owner="launch")
            fill(app, n)
            async with Client(create_server(app), mode="legacy") as client:
                list_ms, get_ms = await listing(client, 20)
            print(f"with {n:6d} jobs: list_jobs (page of 20) {list_ms:7.2f} ms, get_job {get_ms:6.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    anyio.run(main, parser.parse_args().runs)
