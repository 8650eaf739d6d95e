"""Training jobs on a cluster engine (Ray, Slurm), followed by the job engine like any other job.

The job engine runs `run_remote_job` in a worker process under a supervisor, as it runs torchrun locally: the worker
submits the stored plan through the backend (idempotent: the submission is keyed, so a restarted worker finds the
job it submitted instead of submitting it twice), then follows it: the engine's state and its reason (a pending
reason, how it ended) become the job's progress, the ranks' logs land in the job folder where read_job_logs serves
them, and the job ends as the engine says: SUCCEEDED with a result, or FAILED/CANCELLED with the engine's reason.
A cancel (SIGTERM to the worker) cancels the engine's job and waits for it to end. The server can be killed at any
time: the supervisor and the worker go on in their own sessions.

Plain module: no MCP.
"""

import signal
import threading
from typing import Any

from servers.core.jobfiles import JobContext
from servers.core.jobstore import JobState
from servers.launch.backend import Backend, BackendHandle, BackendPlan, EngineStatus, SubmitRequest

ENTRY = "servers.launch.remote:run_remote_job"
POLL_S = 1.0
REMOTE_BACKENDS = ("ray", "slurm")


def make_backend(name: str, config: dict[str, Any]) -> Backend:
    """The backend a remote job names, configured from what the server stored with the job."""
    if name == "ray":
        from servers.launch.ray_backend import RayBackend

        return RayBackend(address=config.get("address") or None)
    if name == "slurm":
        from servers.launch.slurm import SlurmBackend

        return SlurmBackend(job_root=config.get("job_root") or None)
    raise ValueError(f"backend: {name!r} is not a remote backend; accepted: {', '.join(REMOTE_BACKENDS)}")


def load_plan(name: str, data: dict[str, Any]) -> BackendPlan:
    if name == "ray":
        from servers.launch.ray_backend import RayPlan

        return RayPlan.model_validate(data)
    return BackendPlan.model_validate(data)


def run_remote_job(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The remote training kind's work function (the job's worker process). See the module docstring."""
    name = str(spec["backend"])
    backend = make_backend(name, dict(spec.get("backend_config") or {}))
    plan = load_plan(name, spec["plan"]).bind(ctx.files.dir)
    request = SubmitRequest(key=str(spec["idempotency_key"]), spec=spec, timeout_s=spec.get("max_wall_s"))
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        ctx.progress(0, None, f"submitting to {name}")
        handle = backend.submit(plan, request)
        status = follow(backend, handle, ctx, stop)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    result = {
        "backend": name,
        "native_id": handle.native_id,
        "native_state": status.native_state,
        "exit_code": status.exit_code,
        "restarts": status.restarts,
    }
    if status.state is JobState.SUCCEEDED:
        ctx.progress(1, 1, f"{name}: {status.native_state or 'SUCCEEDED'}")
        return result
    what = status.reason or status.native_state or status.state.value
    if stop.is_set() or status.state is JobState.CANCELLED:
        raise RuntimeError(f"cancelled on {name} ({handle.native_id}): {what}")
    raise RuntimeError(f"{name} job {handle.native_id} ended {status.state.value}: {what}")


def follow(backend: Backend, handle: BackendHandle, ctx: JobContext, stop: threading.Event) -> EngineStatus:
    """Poll until the engine's job ends; cancel it there when this worker is asked to stop."""
    last = ""
    cancelled = False
    while True:
        if stop.is_set() and not cancelled:
            cancelled = True
            ctx.progress(0, None, f"cancelling on {backend.name}")
            backend.cancel(handle)
        try:
            status = backend.status(handle)
        except RuntimeError as exc:  # the engine is unreachable for now: keep the last state, say so
            note = f"{backend.name} unreachable: {exc}"[:500]
            if note != last:
                ctx.progress(0, None, note)
                last = note
            stop.wait(POLL_S * 5)
            continue
        if status.state.terminal:
            return status
        note = f"{backend.name} {status.native_state or status.state.value}" + (
            f": {status.reason}" if status.reason else ""
        )
        if note != last:
            ctx.progress(0, None, note[:500])
            last = note
        stop.wait(POLL_S)
