"""Overhead of the Slurm backend against raw sbatch + squeue polling, measured in the same run on the same cluster.

For a trivial script (tests/fixtures/launch/quick.py) on --nodes nodes, each run measures submit-to-RUNNING and
submit-to-SUCCEEDED (COMPLETED) of:

  raw-srun      sbatch of a hand-written `srun python quick.py`, polled by hand (`squeue -h -j ID -t all -o %T`)
  raw-torchrun  the same with `srun python -m torch.distributed.run --nnodes N ... quick.py` (SlurmBackend's work)
  backend       SlurmBackend.plan + submit, polled with SlurmBackend.status (scontrol; the exit record)
  mcp-tools     submit_training_job (backend slurm) through an in-process MCP client to the launch server, polled
                with get_job: the whole path an agent takes (plan, checks, the job engine's follower, the backend)

Every variant is polled every --poll-s seconds and starts on idle nodes; runs are interleaved (rotated); medians
are reported with the ratios backend / raw-srun and backend / raw-torchrun. Without SLURM_CONF it starts a cluster of
2 nodes x 1 CPU with scripts/slurm-cluster.sh (root, slurm-wlm and munge installed) and stops it at the end.

    python benchmarks/launch_slurm.py --runs 5
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.core.jobstore import JobState
from servers.engines.backend import SubmitRequest
from servers.launch.slurm import SlurmBackend

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "tests" / "fixtures" / "launch" / "quick.py"
CLUSTER = ROOT / "scripts" / "slurm-cluster.sh"


def raw_script(folder: Path, nodes: int, torchrun: bool) -> Path:
    py = sys.executable
    if torchrun:
        work = (
            f'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            f'ADDR=$(scontrol show node "$HEAD" -o | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)\n'
            f"PORT=$({py} -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])')\n"
            f"srun {py} -m torch.distributed.run --nnodes {nodes} --nproc-per-node 1 --rdzv-backend c10d "
            f'--rdzv-endpoint "$ADDR:$PORT" --rdzv-id "$SLURM_JOB_ID" {QUICK}\n'
        )
    else:
        work = f"srun {py} {QUICK}\n"
    script = folder / ("raw-torchrun.sh" if torchrun else "raw-srun.sh")
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node=1\n#SBATCH --time=5\n"
        f"#SBATCH --output={folder}/raw-%j.log\n"
        "export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1\n" + work
    )
    return script


def time_raw(script: Path, poll_s: float) -> tuple[float, float]:
    start = time.perf_counter()
    job_id = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True
    ).stdout.strip()
    running = None
    while True:
        state = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        now = time.perf_counter() - start
        if state in ("RUNNING", "COMPLETING", "COMPLETED") and running is None:
            running = now
        if state == "COMPLETED":
            return running or now, now
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") or now > 300:
            raise RuntimeError(f"raw job {job_id} ended {state or 'out of sight'}")
        time.sleep(poll_s)


def time_backend(backend: SlurmBackend, nodes: int, poll_s: float, run: int) -> tuple[float, float]:
    spec = {
        "script": str(QUICK),
        "nnodes": nodes,
        "nproc_per_node": 1,
        "max_wall_s": 300,
        "env": {"GLOO_SOCKET_IFNAME": "lo"},
        "name": "bench",
    }
    start = time.perf_counter()
    plan = backend.plan(spec)
    handle = backend.submit(plan, SubmitRequest(key=f"bench-{os.getpid()}-{run}-{time.time_ns()}", spec=spec))
    running = None
    while True:
        status = backend.status(handle)
        now = time.perf_counter() - start
        if status.state in (JobState.RUNNING, JobState.SUCCEEDED) and running is None:
            running = now
        if status.state == JobState.SUCCEEDED:
            return running or now, now
        if status.state.terminal or now > 300:
            raise RuntimeError(f"backend job {handle.native_id} ended {status.state}: {status.reason}")
        time.sleep(poll_s)


def time_mcp(folder: Path, nodes: int, poll_s: float) -> tuple[float, float]:
    """submit_training_job through an in-process MCP client until get_job says RUNNING on Slurm, then SUCCEEDED."""
    import anyio
    from mcp import Client

    from servers.core.mcp_layer import App
    from servers.core.settings import Settings
    from servers.launch.server import create_server

    settings = Settings(home=folder / "mcp-state", allowed_roots=[ROOT], cancel_grace_s=2.0)
    spec = {"script": str(QUICK), "nnodes": nodes, "nproc_per_node": 1, "max_wall_s": 300, "backend": "slurm"}

    async def run() -> tuple[float, float]:
        async with Client(create_server(App(settings, owner="bench")), mode="legacy") as client:
            start = time.perf_counter()
            job = (await client.call_tool("submit_training_job", {"spec": spec, "wait_s": 0})).structured_content
            running = None
            while True:
                view = (await client.call_tool("get_job", {"job_id": job["job_id"]})).structured_content
                now = time.perf_counter() - start
                message = (view.get("progress") or {}).get("message") or ""
                if running is None and ("slurm RUNNING" in message or view["state"] == "SUCCEEDED"):
                    running = now
                if view["state"] == "SUCCEEDED":
                    return running or now, now
                if view["finished"] or now > 300:
                    raise RuntimeError(f"MCP job {job['job_id']} ended {view['state']}: {view['reason']}")
                await anyio.sleep(poll_s)

    return anyio.run(run)


def wait_idle(nodes: int, limit_s: float = 60) -> None:
    """Until every node is idle again (the previous job's nodes are released), so no variant waits for another."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        idle = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], capture_output=True, text=True)
        if len(idle.stdout.split()) >= nodes:
            return
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--poll-s", type=float, default=0.1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        folder = Path(tmp)
        started_cluster = None
        if not os.environ.get("SLURM_CONF"):
            started_cluster = folder / "cluster"
            out = subprocess.run(
                ["bash", str(CLUSTER), "start", str(started_cluster), str(args.nodes), "1"],
                capture_output=True,
                text=True,
                check=True,
            )
            os.environ["SLURM_CONF"] = out.stdout.strip().split("=", 1)[1]
        try:
            backend = SlurmBackend(job_root=folder / "jobs")
            print(backend.available()[1])
            variants: dict[str, Callable[[int], tuple[float, float]]] = {
                "raw-srun": lambda run: time_raw(raw_script(folder, args.nodes, False), args.poll_s),
                "raw-torchrun": lambda run: time_raw(raw_script(folder, args.nodes, True), args.poll_s),
                "backend": lambda run: time_backend(backend, args.nodes, args.poll_s, run),
                "mcp-tools": lambda run: time_mcp(folder, args.nodes, args.poll_s),
            }
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
            variants["backend"](-1)  # warm-up: imports, page cache
            names = list(variants)
            for run in range(args.runs):
                shift = run % len(names)
                for name in names[shift:] + names[:shift]:  # rotated, so that no variant always goes first
                    wait_idle(args.nodes)
                    times[name].append(variants[name](run))
            print(f"{args.nodes} node(s), {args.runs} runs, polled every {args.poll_s:g} s; medians in seconds")
            print("(Slurm's scheduler itself sometimes takes ~3 s to start a job: see the min columns)")
            print(f"{'variant':<14}{'to RUNNING':>12}{'to SUCCEEDED':>14}{'min RUNNING':>13}{'min SUCCEEDED':>15}")
            med = {
                n: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for n, ts in times.items()
            }
            for name, (to_run, to_end) in med.items():
                low_run, low_end = min(t[0] for t in times[name]), min(t[1] for t in times[name])
                print(f"{name:<14}{to_run:>12.2f}{to_end:>14.2f}{low_run:>13.2f}{low_end:>15.2f}")
            for ours in ("backend", "mcp-tools"):
                for base in ("raw-srun", "raw-torchrun"):
                    r = med[ours][0] / med[base][0]
                    e = med[ours][1] / med[base][1]
                    print(f"ratio {ours} / {base}: to RUNNING {r:.2f}x, to SUCCEEDED {e:.2f}x")
        finally:
            if started_cluster is not None:
                subprocess.run(["scancel", "--user", str(os.getuid())], capture_output=True)
                subprocess.run(["bash", str(CLUSTER), "stop", str(started_cluster)], capture_output=True)


if __name__ == "__main__":
    main()
