"""Training jobs on a cluster engine (Ray, Slurm, Kubernetes), followed by the job engine like any other job.

The job engine runs `run_remote_job` in a worker process under a supervisor, as it runs torchrun locally: the worker
submits the stored plan through the backend (idempotent: the submission is keyed, so a restarted worker finds the
job it submitted instead of submitting it twice), then follows it: the engine's state and its reason (a pending
reason, how it ended) become the job's state (QUEUED while the engine holds it pending: engine_state.py) and its
progress, the ranks' logs land in the job folder where read_job_logs serves them, and the job ends as the engine
says: SUCCEEDED with a result, or FAILED/CANCELLED with the engine's reason.
A cancel (SIGTERM to the worker) cancels the engine's job and waits for it to end. The server can be killed at any
time: the supervisor and the worker go on in their own sessions.

Plain module: no MCP.
"""

import threading
import time
from typing import Any

from servers.core.jobfiles import JobContext
from servers.core.jobstore import JobState
from servers.core.procs import stop_on_sigterm
from servers.launch.backend import Backend, BackendHandle, BackendPlan, EngineStatus, SubmitRequest

ENTRY = "servers.launch.remote:run_remote_job"
POLL_S = 1.0  # the slowest a follower asks its engine, unless the backend says (its `poll_s`: Ray's Jobs API is
# one cheap HTTP GET; Slurm's controller is shared by every user of the cluster and is asked at most once a second)
FIRST_POLL_S = 0.1
ARRAY_WAIT_S = 600.0  # how long a run of a sweep's job array waits for the server to submit the array
ARRAY_POLL_S = 0.2
REMOTE_BACKENDS = ("ray", "slurm", "kubernetes", "skypilot")


def make_backend(name: str, config: dict[str, Any]) -> Backend:
    """The backend a remote job names, configured from what the server stored with the job."""
    if name == "ray":
        from servers.launch.ray_backend import RayBackend

        return RayBackend(address=config.get("address") or None)
    if name == "slurm":
        from servers.launch.slurm import SlurmBackend

        return SlurmBackend(job_root=config.get("job_root") or None)
    if name == "kubernetes":
        from servers.launch.kubernetes import KubernetesBackend

        return KubernetesBackend(kubeconfig=config.get("kubeconfig") or None)
    if name == "skypilot":
        from servers.launch.skypilot import SkyPilotBackend

        return SkyPilotBackend()
    raise ValueError(f"backend: {name!r} is not a remote backend; accepted: {', '.join(REMOTE_BACKENDS)}")


def load_plan(name: str, data: dict[str, Any]) -> BackendPlan:
    if name == "ray":
        from servers.launch.ray_backend import RayPlan

        return RayPlan.model_validate(data)
    if name == "kubernetes":
        from servers.launch.kubernetes import KubernetesPlan

        return KubernetesPlan.model_validate(data)
    return BackendPlan.model_validate(data)


def run_remote_job(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The remote training kind's work function (the job's worker process). See the module docstring."""
    name = str(spec["backend"])
    backend = make_backend(name, dict(spec.get("backend_config") or {}))
    plan = load_plan(name, spec["plan"]).bind(ctx.files.dir)
    request = SubmitRequest(key=str(spec["idempotency_key"]), spec=spec, timeout_s=spec.get("max_wall_s"))
    with stop_on_sigterm() as stop:
        if spec.get("slurm_array"):
            handle = wait_for_array(backend, request.key, ctx, stop, str(spec["slurm_array"]))
        else:
            ctx.progress(0, None, f"submitting to {name}")
            handle = backend.submit(plan, request)
        status = follow(backend, handle, ctx, stop)
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


def wait_for_array(backend: Backend, key: str, ctx: JobContext, stop: threading.Event, sweep_id: str) -> BackendHandle:
    """A run of a sweep submitted as one Slurm job array: the server submits the array once every run's job (and
    folder) exists; this run waits for its task's submit record (no Slurm command) and then follows that task."""
    from servers.launch.slurm import SlurmBackend

    if not isinstance(backend, SlurmBackend):
        raise RuntimeError(f"a job array is a Slurm job; this run names the {backend.name!r} backend")
    ctx.progress(0, None, f"waiting for the job array of {sweep_id} to be submitted")
    ctx.report_state("QUEUED", f"waiting for the job array of {sweep_id} to be submitted to Slurm")
    deadline = time.monotonic() + ARRAY_WAIT_S
    while not stop.is_set():
        handle = backend.find_recorded(key, ctx.files.dir)
        if handle is not None:
            ctx.progress(0, None, f"slurm: task {handle.native_id} of the array of {sweep_id}")
            return handle
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"the job array of {sweep_id} was not submitted within {ARRAY_WAIT_S:g} s of this run's start (the "
                "server stopped before sbatch, or sbatch refused it: see the submit_sweep answer); nothing of this "
                "run reached Slurm"
            )
        stop.wait(ARRAY_POLL_S)
    raise RuntimeError(f"cancelled before the job array of {sweep_id} was submitted; nothing reached Slurm")


def follow(
    backend: Backend,
    handle: BackendHandle,
    ctx: JobContext,
    stop: threading.Event,
    *,
    done: float = 0,
    total: float | None = None,
    prefix: str = "",
) -> EngineStatus:
    """Poll until the engine's job ends; cancel it there when this worker is asked to stop. Progress reports say
    what the engine says, after `prefix`, at (done, total)."""

    def report(text: str) -> None:
        ctx.progress(done, total, (prefix + text)[:500])

    last = ""
    cancelled = False
    slowest = float(getattr(backend, "poll_s", POLL_S))
    # A backend whose logs live on the engine (Kubernetes pods) copies them into the job folder as it is followed.
    sync_logs = getattr(backend, "sync_logs", None)
    interval = FIRST_POLL_S  # quick at first and after each change (a job often moves on soon), then `slowest`
    while True:
        if stop.is_set() and not cancelled:
            cancelled = True
            report(f"cancelling on {backend.name}")
            backend.cancel(handle)
        try:
            status = backend.status(handle)
        except RuntimeError as exc:  # the engine is unreachable for now: keep the last state, say so
            note = f"{backend.name} unreachable: {exc}"
            if note != last:
                report(note)
                last = note
            stop.wait(POLL_S * 5)
            continue
        if sync_logs is not None:
            sync_logs(handle, ctx.files.dir, final=status.state.terminal)
        if status.state.terminal:
            return status
        native = status.native_state or status.state.value
        reason = status.reason or ""
        if reason.startswith(f"{native}: "):  # a reason that names the state already
            reason = reason[len(native) + 2 :]
        note = f"{backend.name} {native}" + (f": {reason}" if reason else "")
        if note != last:
            report(note)
            # The job's own state is the engine's (QUEUED while it is pending there), not this follower's.
            ctx.report_state(status.state.value, (prefix + note)[:500], status.started_at)
            last = note
            interval = FIRST_POLL_S
        stop.wait(interval)
        interval = min(slowest, interval * 1.5)
