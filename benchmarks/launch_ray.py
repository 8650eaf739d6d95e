"""Overhead of the Ray backend and of the MCP tools against Ray's own Jobs SDK, measured in the same run on the same
head.

The same trivial script runs, --runs times each, in rotated order, every variant polled every --poll-s seconds:

  direct-python     `JobSubmissionClient.submit_job` of `python SCRIPT x`, polled with `get_job_status`
  backend-python    `RayBackend` (plan, submit with its wrapper, status polls), launcher python
  direct-torchrun   `JobSubmissionClient.submit_job` of `torchrun --nproc-per-node 1 SCRIPT x` (RayBackend's work)
  backend-torchrun  `RayBackend` with its default launcher (torchrun, one rank)
  mcp-tools         submit_training_job (backend ray) through an in-process MCP client to the launch server, polled
                    with get_job: the whole path an agent takes (plan, checks, the job engine's worker and its
                    follower, the backend). RUNNING is when get_job first reports Ray's RUNNING (the follower's
                    progress message "ray RUNNING") or SUCCEEDED; SUCCEEDED is when get_job says so.

Reported: medians and mins of submit-to-RUNNING and submit-to-SUCCEEDED, and the ratios to the direct client
(goal of issue 11: mcp-tools / direct <= 1.2x). The MCP session is opened once (as an agent's is) and its job
engine started by a first, unmeasured job; every variant also runs once unmeasured first (the first job on a head
pays for worker start-up).

    python benchmarks/launch_ray.py --runs 5          # starts a head of its own (2 CPUs, 127.0.0.1, its own ports)
    python benchmarks/launch_ray.py --address http://127.0.0.1:8265 --token ...
"""

import argparse
import contextlib
import logging
import os
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.core.jobstore import JobState
from servers.engines import registry
from servers.engines.backend import SubmitRequest
from servers.launch.ray_backend import RayBackend
from tests.fixtures.launch.ray_head import start_head

SCRIPT = "import sys\nprint('args', sys.argv[1:], flush=True)\n"
GOAL = 1.2


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
        state = backend.status(handle).state
        if running is None and state in (JobState.RUNNING, JobState.SUCCEEDED):
            running = time.perf_counter() - start
        if state == JobState.SUCCEEDED:
            return running or 0.0, time.perf_counter() - start
        if state.terminal:
            raise RuntimeError(f"backend job {key} ended {backend.status(handle)}")
        time.sleep(poll_s)
    raise TimeoutError(f"backend job {key} did not end within {timeout_s} s")


@contextlib.contextmanager
def mcp_session(folder: Path, address: str, token: str | None) -> Iterator[Callable[..., Any]]:
    """One in-process MCP session with the launch server configured for this head, held open for the whole run
    (as an agent's is); yields `call(tool, arguments) -> structured content`, blocking."""
    from anyio.from_thread import start_blocking_portal
    from mcp import Client

    from servers.core.mcp_layer import App
    from servers.core.settings import Settings
    from servers.launch.server import create_server

    os.environ["LLM_INFRA_MCP_RAY_ADDRESS"] = address  # what a person configures; Settings reads it
    if token:
        os.environ["RAY_AUTH_TOKEN"] = token  # the server's and its job workers' RayBackend read it
    settings = Settings(home=folder / "mcp-state", allowed_roots=[folder], cancel_grace_s=2.0)
    assert settings.ray_address == address, settings.ray_address
    with start_blocking_portal() as portal:
        client = portal.wrap_async_context_manager(Client(create_server(App(settings, owner="bench")), mode="legacy"))
        with client as session:

            def call(tool: str, arguments: dict[str, Any]) -> Any:
                result = portal.call(session.call_tool, tool, arguments)
                if result.is_error:
                    raise RuntimeError(f"{tool}: {result.content}")
                return result.structured_content

            yield call


def timed_mcp(
    call: Callable[..., Any], spec: dict[str, Any], poll_s: float, timeout_s: float, stages: list[tuple[float, float]]
) -> tuple[float, float]:
    """submit_training_job until get_job says Ray runs it (the follower's progress), then SUCCEEDED. Appends to
    `stages` when the submit call returned and when the job's worker first reported (any progress message)."""
    start = time.perf_counter()
    job = call("submit_training_job", {"spec": spec, "wait_s": 0})
    submitted = time.perf_counter() - start
    running = worker = None
    while True:
        view = call("get_job", {"job_id": job["job_id"]})
        now = time.perf_counter() - start
        message = (view.get("progress") or {}).get("message") or ""
        if worker is None and (message or view["finished"]):
            worker = now
        if running is None and ("ray RUNNING" in message or view["state"] == "SUCCEEDED"):
            running = now
        if view["state"] == "SUCCEEDED":
            stages.append((submitted, worker or now))
            return running or now, now
        if view["finished"] or now > timeout_s:
            raise RuntimeError(f"MCP job {job['job_id']} ended {view['state']}: {view['reason']}")
        time.sleep(poll_s)


def report(
    times: dict[str, list[tuple[float, float]]], stages: list[tuple[float, float]], runs: int, poll_s: float
) -> None:
    med = {n: (statistics.median(r for r, _ in ts), statistics.median(e for _, e in ts)) for n, ts in times.items()}
    print(f"\ntrivial script, {runs} runs, polled every {poll_s:g} s; seconds")
    print(f"{'variant':<18}{'med RUNNING':>12}{'med SUCCEEDED':>15}{'min RUNNING':>13}{'min SUCCEEDED':>15}")
    for name, (to_run, to_end) in med.items():
        low_run, low_end = min(r for r, _ in times[name]), min(e for _, e in times[name])
        print(f"{name:<18}{to_run:>12.3f}{to_end:>15.3f}{low_run:>13.3f}{low_end:>15.3f}")
    print(f"\nratios of the medians (goal for mcp-tools / direct: <= {GOAL:g}x)")
    pairs = [
        ("backend-python", "direct-python"),
        ("backend-torchrun", "direct-torchrun"),
        ("mcp-tools", "direct-python"),
        ("mcp-tools", "direct-torchrun"),
    ]
    for ours, base in pairs:
        r, e = med[ours][0] / med[base][0], med[ours][1] / med[base][1]
        mark = "" if not ours.startswith("mcp") else ("  (goal met)" if max(r, e) <= GOAL else "  (above the goal)")
        print(f"  {ours + ' / ' + base:<36} to RUNNING {r:5.2f}x   to SUCCEEDED {e:5.2f}x{mark}")
    if stages:
        call_s = statistics.median(s for s, _ in stages)
        worker_s = statistics.median(w for _, w in stages)
        print(
            f"mcp-tools stages (medians): submit_training_job returned after {call_s:.3f} s; the job's worker "
            f"reported after {worker_s:.3f} s (the follower polls Ray every 0.1 s at first, then at most every "
            f"{registry.get('ray').poll_s:g} s)"
        )


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Ray's SDK turns on INFO logging: no line per request
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--poll-s", type=float, default=0.05)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--address", help="an existing head's Jobs API; default: start one of its own")
    parser.add_argument("--token", help="that head's token, if it uses token authentication")
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
        with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp, mcp_session(Path(tmp), address, token) as call:
            folder = Path(tmp)
            script = folder / "trivial.py"
            script.write_text(SCRIPT)
            spec = {"script": str(script), "args": ["x"], "nproc_per_node": 1, "launcher": "python", "max_wall_s": 60}
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
            rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]
            python_cmd = shlex.join([sys.executable, str(script), "x"])
            torchrun_cmd = shlex.join([*torchrun, *rendezvous, str(script), "x"])
            mcp_spec = {"script": str(script), "args": ["x"], "nproc_per_node": 1, "max_wall_s": 60, "backend": "ray"}
            poll, limit = args.poll_s, args.timeout_s
            variants: dict[str, Callable[[], tuple[float, float]]] = {
                "direct-python": lambda: timed_direct(client, python_cmd, poll, limit),
                "backend-python": lambda: timed_backend(backend, spec, folder / "jobs", poll, limit),
                "direct-torchrun": lambda: timed_direct(client, torchrun_cmd, poll, limit),
                "backend-torchrun": lambda: timed_backend(
                    backend, spec | {"launcher": "torchrun"}, folder / "jobs", poll, limit
                ),
                "mcp-tools": lambda: timed_mcp(call, mcp_spec, poll, limit, stages),
            }
            stages: list[tuple[float, float]] = []
            for fn in variants.values():  # warm every path: imports, the head's workers, the MCP job engine
                fn()
            stages.clear()
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
            names = list(variants)
            for run in range(args.runs):
                shift = run % len(names)
                for name in names[shift:] + names[:shift]:  # rotated, so that no variant always goes first
                    times[name].append(variants[name]())
            report(times, stages, args.runs, args.poll_s)
    finally:
        if head is not None:
            head.stop()


if __name__ == "__main__":
    main()
