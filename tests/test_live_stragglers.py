"""Stragglers from real slowdowns of real jobs, found on the live job: a rank of tiny-gpt (2 ranks, gloo on CPU)
throttled by a CPU quota (a cgroup, servers/diagnostics/slowdowns.py) while it runs, locally and on the session's
two-node Slurm cluster, and detect_stragglers polled through the tools until it names the rank; a NIC of the
fault-injection testbed rate-limited under a job whose ranks run in the testbed's nodes (benchmarks/live_stragglers.py),
where the job's slowdown is put on communication; clean runs that claim nothing. Needs root (CI is root: it fails
there otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from benchmarks.live_stragglers import Trial, last_step, run_trial
from servers.core.jobfiles import JobFiles
from servers.core.mcp_layer import App
from servers.core.procs import process_cpu_ticks
from servers.diagnostics.slowdowns import (
    CpuContention,
    CpuQuota,
    SlowdownError,
    cpu_quota_available,
    rank_processes,
)
from servers.diagnostics.testbed import Testbed, available
from tests.conftest import skip_unless_present
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

pytestmark = [pytest.mark.anyio]
ARGS = ["--steps", "70", "--log-every", "1", "--ckpt-every", "0", "--batch-size", "32", "--d-model", "128"]
INJECT_AT = 20  # steps logged before the quota goes on


async def slow_a_rank_live(client: Client, app: App, spec: dict, rank: int, fraction: float) -> tuple[dict, int, int]:
    """Submit the job; once INJECT_AT steps are logged, throttle `rank` to `fraction` of a CPU and poll
    detect_stragglers on the live job until it names a straggler. (report, injection step, detection step)."""
    job_id = (await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0}))["job_id"]
    metrics = JobFiles(app.engine.get(job_id).job_dir).metrics
    quota: CpuQuota | None = None
    inject = 0
    deadline = time.monotonic() + 200
    try:
        while time.monotonic() < deadline:
            last = last_step(metrics)
            if quota is None and last >= INJECT_AT:
                pids = rank_processes({"LLM_INFRA_MCP_METRICS": str(metrics)})
                assert sorted(pids) == [0, 1], pids
                quota = CpuQuota(fraction).apply([pids[rank]])
                inject = last_step(metrics)
            if quota is not None and last > inject:
                report = await ok(client, "detect_stragglers", {"job_id": job_id})
                if report["stragglers"] or report["likely_stragglers"]:
                    break
            view = await ok(client, "get_job", {"job_id": job_id})
            assert not view["finished"], f"the job ended before the straggler was found: {view['reason']}"
            await anyio.sleep(0.5)
        else:
            raise AssertionError("no straggler found in 200 s")
    finally:
        if quota is not None:
            quota.release()
    done = await finish_job(client, job_id, 200)
    assert done["state"] == "SUCCEEDED", done["reason"]
    return report, inject, last


def check_found(report: dict, rank: int, inject: int, detected: int, action: str) -> None:
    named = report["stragglers"] + report["likely_stragglers"]
    assert [e["rank"] for e in named] == [rank], report["summary"]
    assert named[0]["attribution"] == "compute" and action in named[0]["action"], named[0]
    assert named[0]["since_step"] >= inject - 5, named[0]
    assert detected - inject <= 15, f"found {detected - inject} steps after the injection: {report['summary']}"


@pytest.mark.timeout(300)
async def test_a_rank_throttled_by_a_cpu_quota_is_found_on_the_live_local_job(app: App) -> None:
    skip_unless_present(cpu_quota_available())
    async with Client(create_test_suite(app), mode="legacy") as client:
        spec = {"recipe": "tiny-gpt", "args": ARGS, "nproc_per_node": 2}
        report, inject, detected = await slow_a_rank_live(client, app, spec, rank=1, fraction=0.4)
        check_found(report, 1, inject, detected, "compute-bound")


@pytest.mark.timeout(400)
async def test_a_rank_throttled_by_a_cpu_quota_is_found_on_the_live_slurm_job(app: App, slurm_cluster: Path) -> None:
    skip_unless_present(cpu_quota_available())
    async with Client(create_test_suite(app), mode="legacy") as client:
        spec = {"recipe": "tiny-gpt", "args": ARGS, "nproc_per_node": 1, "nnodes": 2, "backend": "slurm"}
        report, inject, detected = await slow_a_rank_live(client, app, {**spec, "max_wall_s": 600}, 0, 0.4)
        check_found(report, 0, inject, detected, "Drain node node0: its only rank is slow")
        assert report["nodes"] and report["nodes"][0]["node"] == "node0", report["nodes"]


@pytest.mark.timeout(300)
def test_a_slow_nic_under_a_job_on_the_testbed_is_communication_and_a_clean_run_claims_nothing(
    tmp_path: Path,
) -> None:
    skip_unless_present(available())
    with Testbed(nodes=2, rails=1, leaves_per_rail=2, spines=2) as bed:
        slow = run_trial(Trial("network", factor=6.0), tmp_path / "slow", bed=bed, steps=60, inject_at=INJECT_AT)
        clean = run_trial(Trial("clean", network=True), tmp_path / "clean", bed=bed, steps=60)
    assert slow.found and not slow.false_alarm, slow
    assert slow.measured is not None and slow.measured > 1.3, slow
    assert slow.latency_steps is not None and slow.latency_steps <= 15, slow
    assert "communication" in slow.said, slow
    assert not clean.found and not clean.false_alarm, clean
    assert clean.steps == 60


def test_a_cpu_quota_goes_on_and_comes_off_and_refuses_what_the_kernel_would() -> None:
    skip_unless_present(cpu_quota_available())
    spin = "import time\nwhile True:\n    sum(range(10000))\n"
    proc = subprocess.Popen([sys.executable, "-c", spin], env={**os.environ, "LLM_INFRA_MCP_TEST": "spin", "RANK": "3"})
    try:
        assert rank_processes({"LLM_INFRA_MCP_TEST": "spin"}) == {3: proc.pid}
        before = Path(f"/proc/{proc.pid}/cgroup").read_text()
        quota = CpuQuota(0.5)
        assert quota.period_us == 2000 and quota.quota_us == 1000  # the shortest period the kernel takes for 0.5
        with quota.apply([proc.pid]):
            assert quota.path is not None and quota.name in Path(f"/proc/{proc.pid}/cgroup").read_text()
            folder = quota.path
            time.sleep(0.5)
            throttled = quota.throttled()
            assert throttled is not None and throttled > 10, throttled  # a spinning process at half a CPU
        assert quota.path is None and not folder.exists() and quota.throttled() is None
        assert Path(f"/proc/{proc.pid}/cgroup").read_text() == before
        quota.release()  # idempotent
    finally:
        proc.kill()
        proc.wait(timeout=10)
    for bad in (0.0, -1.0, 0.0001, 100.0):
        with pytest.raises(ValueError, match="fraction"):
            CpuQuota(bad)
    with pytest.raises(ValueError, match="period_us"):
        CpuQuota(0.5, period_us=10)
    with pytest.raises(SlowdownError, match="gone"), CpuQuota(0.5) as gone:
        gone.apply([proc.pid])
    with pytest.raises(ValueError, match="at least one"):
        rank_processes({})


def _cpu_share(pid: int, seconds: float) -> float:
    """The share of one CPU the process used over the next `seconds` (utime + stime from /proc/PID/stat)."""

    hz = os.sysconf("SC_CLK_TCK")
    start, t0 = process_cpu_ticks(pid), time.monotonic()
    time.sleep(seconds)
    end = process_cpu_ticks(pid)
    assert start is not None and end is not None, f"process {pid} is gone"
    return (end - start) / hz / (time.monotonic() - t0)


@pytest.mark.timeout(60)
def test_a_busy_neighbour_shares_the_ranks_cpu_by_its_weight_and_goes_away() -> None:
    skip_unless_present(cpu_quota_available())
    cpu = sorted(os.sched_getaffinity(0))[-1]
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    sum(range(10000))\n"
    proc = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)
        alone = _cpu_share(proc.pid, 1.5)
        busy = CpuContention(2.0)
        with busy.apply(proc.pid):
            assert len(busy.pids) == 1 and os.sched_getaffinity(busy.pids[0]) == {cpu}
            assert busy.path is not None and (busy.path / "cpu.shares").read_text().strip() == "2048"
            folder = busy.path
            time.sleep(0.3)
            shared = _cpu_share(proc.pid, 1.5)
            neighbour = busy.pids[0]
        # weight 2 against 1: about a third of the CPU is left to the spinning process (generous bounds: CI is busy)
        assert shared < 0.7 * alone, (alone, shared)
        assert not folder.exists() and not Path(f"/proc/{neighbour}").exists()
        busy.release()  # idempotent
    finally:
        proc.kill()
        proc.wait(timeout=10)
    for bad in (0.0, -1.0, 100.0):
        with pytest.raises(ValueError, match="share"):
            CpuContention(bad)
    with pytest.raises(SlowdownError, match="gone"):
        CpuContention(1.0).apply(proc.pid)
