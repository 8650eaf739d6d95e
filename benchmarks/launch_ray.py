"""Overhead of the Ray backend against Ray's own Jobs SDK, measured in the same run on the same head.

The same trivial script runs (a) through `JobSubmissionClient.submit_job` directly (`python SCRIPT x`) and (b)
through `RayBackend` (plan, submit with its wrapper, status polls), alternately, --runs times each. Both poll every
--poll-s seconds. Reported: the medians of submit-to-RUNNING and submit-to-SUCCEEDED, and their ratios (backend /
direct). With --torchrun also the backend's default launcher (torchrun, one rank) against `torchrun SCRIPT x`
submitted directly.

    python benchmarks/launch_ray.py --runs 7                  # starts a head of its own (2 CPUs, 127.0.0.1)
    python benchmarks/launch_ray.py --address http://127.0.0.1:8265 --token ...
"""

import argparse
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.core.jobstore import JobState
from servers.launch.backend import SubmitRequest
from servers.launch.ray_backend import RayBackend
from tests.fixtures.launch.ray_head import start_head

SCRIPT = "import sys\nprint('args', sys.argv[1:], flush=True)\n"


def timed_direct(client: Any, entrypoint: str, poll_s: float, timeout_s: float) -> tuple[float, float]:
    start = time.perf_counter()
    sid = client.submit_job(
        entrypoint=entrypoint,
        submission_id=f"bench-direct-{secrets.token_hex(6)}",
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}},
        entrypoint_num_cpus=1,
    )
    running = None
    while time.perf_counter() - start < timeout_s:
        status = str(client.get_job_status(sid))
        if running is None and status in ("RUNNING", "SUCCEEDED"):
            running = time.perf_counter() - start
        if status == "SUCCEEDED":
            return running or 0.0, time.perf_counter() - start
        if status in ("FAILED", "STOPPED"):
            raise RuntimeError(f"direct job {sid} ended {status}: {client.get_job_logs(sid)[-2000:]}")
        time.sleep(poll_s)
    raise TimeoutError(f"direct job {sid} did not end within {timeout_s} s")


def timed_backend(
    backend: RayBackend, spec: dict[str, Any], folder: Path, poll_s: float, timeout_s: float
) -> tuple[float, float]:
    key = f"bench-{secrets.token_hex(6)}"
    start = time.perf_counter()
    plan = backend.plan(spec, job_dir=folder / key)
    handle = backend.submit(plan, SubmitRequest(key=key, spec=spec))
    running = None
    while time.perf_counter() - start < timeout_s:
        state = backend.poll(handle)
        if running is None and state in (JobState.RUNNING, JobState.SUCCEEDED):
            running = time.perf_counter() - start
        if state == JobState.SUCCEEDED:
            return running or 0.0, time.perf_counter() - start
        if state.terminal:
            raise RuntimeError(f"backend job {key} ended {backend.status(handle)}")
        time.sleep(poll_s)
    raise TimeoutError(f"backend job {key} did not end within {timeout_s} s")


def compare(
    name: str, direct: Callable[[], tuple[float, float]], through: Callable[[], tuple[float, float]], runs: int
) -> None:
    direct_runs: list[tuple[float, float]] = []
    backend_runs: list[tuple[float, float]] = []
    direct(), through()  # warm both paths (the first job on a head pays for worker start-up)
    for i in range(runs):
        order = (direct, through) if i % 2 == 0 else (through, direct)
        for fn in order:
            (direct_runs if fn is direct else backend_runs).append(fn())
    d_run = statistics.median(r for r, _ in direct_runs)
    d_end = statistics.median(e for _, e in direct_runs)
    b_run = statistics.median(r for r, _ in backend_runs)
    b_end = statistics.median(e for _, e in backend_runs)
    print(f"\n{name} (median of {runs}):")
    print(f"  submit -> RUNNING    direct {d_run:6.3f} s   RayBackend {b_run:6.3f} s   ratio {b_run / d_run:5.2f}")
    print(f"  submit -> SUCCEEDED  direct {d_end:6.3f} s   RayBackend {b_end:6.3f} s   ratio {b_end / d_end:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--poll-s", type=float, default=0.05)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--address", help="an existing head's Jobs API; default: start one of its own")
    parser.add_argument("--token", help="that head's token, if it uses token authentication")
    parser.add_argument("--torchrun", action="store_true", help="also compare the torchrun launcher")
    args = parser.parse_args()

    head = None
    if args.address:
        address, token = args.address, args.token
    else:
        started = time.perf_counter()
        head = start_head()
        address, token = head.address, head.token
        print(f"head started (and a warm-up job run) in {time.perf_counter() - started:.1f} s at {address}")
    try:
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(address, headers={"Authorization": f"Bearer {token}"} if token else None)
        backend = RayBackend(address, auth_token=token)
        with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
            folder = Path(tmp)
            script = folder / "trivial.py"
            script.write_text(SCRIPT)
            spec = {"script": str(script), "args": ["x"], "nproc_per_node": 1, "launcher": "python", "max_wall_s": 60}
            direct_cmd = shlex.join([sys.executable, str(script), "x"])
            compare(
                "trivial script, python launcher",
                lambda: timed_direct(client, direct_cmd, args.poll_s, args.timeout_s),
                lambda: timed_backend(backend, spec, folder / "jobs", args.poll_s, args.timeout_s),
                args.runs,
            )
            if args.torchrun:
                torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
                rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]
                torchrun_cmd = shlex.join([*torchrun, *rendezvous, str(script), "x"])
                compare(
                    "trivial script, torchrun launcher (1 rank)",
                    lambda: timed_direct(client, torchrun_cmd, args.poll_s, args.timeout_s),
                    lambda: timed_backend(backend, spec | {"launcher": "torchrun"}, folder / "jobs", args.poll_s, 120),
                    args.runs,
                )
    finally:
        if head is not None:
            head.stop()


if __name__ == "__main__":
    main()
