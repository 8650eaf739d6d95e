"""Training jobs on another engine (every backend the job engine does not run itself: Slurm, Ray, Kubernetes,
SkyPilot, one registered from outside), followed by the job engine like any other job.

The job engine runs `run_remote_job` in a worker process under a supervisor, as it runs torchrun locally: the worker
builds the backend from the declaration the server stored with the job (engines/registry.py), submits the stored
plan through it (idempotent: the submission is keyed, so a restarted worker finds the job it submitted instead of
submitting it twice), then follows it (engines/follow.py): the engine's state and its reason (a pending
reason, how it ended) become the job's state (QUEUED while the engine holds it pending: engine_state.py) and its
progress, the ranks' logs land in the job folder where read_job_logs serves them, and the job ends as the engine
says: SUCCEEDED with a result, or FAILED/CANCELLED with the engine's reason.
A cancel (SIGTERM to the worker) cancels the engine's job and waits for it to end. The server can be killed at any
time: the supervisor and the worker go on in their own sessions.

Plain module: no MCP.
"""

import threading
import time
from typing import Any, cast

from servers.core.jobfiles import JobContext
from servers.core.jobstore import JobState
from servers.core.procs import stop_on_sigterm
from servers.engines import registry
from servers.engines.backend import ArrayBackend, Backend, BackendHandle, SubmitRequest
from servers.engines.follow import follow

ENTRY = "servers.launch.remote:run_remote_job"
ARRAY_WAIT_S = 600.0  # how long a run of a sweep's job array waits for the server to submit the array
ARRAY_POLL_S = 0.2


def declared(spec: dict[str, Any]) -> registry.BackendInfo:
    """The backend a remote job names, as the server declared it when it stored the job (its `backend_info`, see
    engines/registry.py); a job stored without one names a registered backend."""
    stored = spec.get("backend_info")
    if isinstance(stored, dict):
        return registry.from_record(stored)
    return registry.get(str(spec["backend"]))


def run_remote_job(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The remote training kind's work function (the job's worker process). See the module docstring."""
    info = declared(spec)
    name = info.name
    backend: Backend = info.build(dict(spec.get("backend_config") or {}))
    plan = info.load_plan(spec["plan"]).bind(ctx.files.dir)
    request = SubmitRequest(key=str(spec["idempotency_key"]), spec=spec, timeout_s=spec.get("max_wall_s"))
    from servers.launch.local import seed_checkpoints

    seed_checkpoints(spec, ctx)  # resume_from: the other job's checkpoints, before the engine gets this job
    with stop_on_sigterm() as stop:
        if spec.get("slurm_array"):
            handle = wait_for_array(info, backend, request.key, ctx, stop, str(spec["slurm_array"]))
        else:
            ctx.progress(0, None, f"submitting to {name}")
            handle = backend.submit(plan, request)
        status = follow(backend, handle, ctx, stop, info=info)
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


def wait_for_array(
    info: registry.BackendInfo, backend: Backend, key: str, ctx: JobContext, stop: threading.Event, sweep_id: str
) -> BackendHandle:
    """A run of a sweep submitted as one job array (Slurm's): the server submits the array once every run's job (and
    folder) exists; this run waits for its task's submit record (no engine command) and then follows that task."""
    if not info.can("arrays"):
        raise RuntimeError(f"a job array needs a backend with arrays; this run names the {info.name!r} backend")
    arrays = cast(ArrayBackend, backend)
    ctx.progress(0, None, f"waiting for the job array of {sweep_id} to be submitted")
    ctx.report_state("QUEUED", f"waiting for the job array of {sweep_id} to be submitted to {info.name}")
    deadline = time.monotonic() + ARRAY_WAIT_S
    while not stop.is_set():
        handle = arrays.find_recorded(key, ctx.files.dir)
        if handle is not None:
            ctx.progress(0, None, f"{info.name}: task {handle.native_id} of the array of {sweep_id}")
            return handle
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"the job array of {sweep_id} was not submitted within {ARRAY_WAIT_S:g} s of this run's start (the "
                "server stopped before sbatch, or sbatch refused it: see the submit_sweep answer); nothing of this "
                f"run reached {info.name}"
            )
        stop.wait(ARRAY_POLL_S)
    raise RuntimeError(f"cancelled before the job array of {sweep_id} was submitted; nothing reached {info.name}")
