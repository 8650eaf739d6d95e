"""Overheads of the launch path, each against a baseline measured in the same run.

1. Per-job overhead of the local backend: the same trivial script run (a) by a bare `torchrun` subprocess and
   (b) through submit_training_job (in-process MCP client: plan, checks, job engine, supervisor, worker, torchrun,
   per-rank log mirroring) until SUCCEEDED; also the submit-to-RUNNING latency. Median of --runs.
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


async def through_the_server(client: Client, script: Path) -> tuple[float, float]:
    start = time.perf_counter()
    result = await client.call_tool(
        "submit_training_job", {"spec": {"script": str(script), "args": ["x"]}, "wait_s": 0}
    )
    assert not result.is_error, result.content[0].text
    job_id = result.structured_content["job_id"]
    running = None
    while True:
        job = (await client.call_tool("get_job", {"job_id": job_id})).structured_content
        if running is None and job["state"] in ("RUNNING", "SUCCEEDED", "FAILED"):
            running = time.perf_counter() - start
        if job["finished"]:
            assert job["state"] == "SUCCEEDED", job["reason"]
            return time.perf_counter() - start, running or 0.0
        await anyio.sleep(0.02)


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
        bare = [bare_torchrun(script, root) for _ in range(runs)]
        async with Client(create_server(app), mode="legacy") as client:
            served = [await through_the_server(client, script) for _ in range(runs)]
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
