"""The local backend: torchrun on this machine, run as a job of the job engine.

The job engine is this backend's executor: `submit` stores a job whose work function, `run_training_job`,
runs in the job's worker process (its own process group, so a cancel or the wall-time limit ends torchrun
and every rank with it). The work function:

- builds the command with `LocalBackend.plan` (the same function that made the plan a person confirmed):
  `python -m torch.distributed.run ... --log-dir JOB/torchrun-logs --redirects 3 SCRIPT ARGS...`, an argv list,
  never a shell;
- starts it with torchrun's own output in logs/torchrun.log, and every ~0.5 s copies the new complete lines of
  each rank's stdout.log and stderr.log (torchrun writes them under torchrun-logs/<run_id>_*/attempt_<n>/<rank>/)
  to logs/rank<r>.log, so read_job_logs serves "rank0", "rank1"... while the job runs;
- for a job that resumes from another (resume_from), first copies that job's checkpoints into its own folder
  (`seed_checkpoints`, below; the remote backends' worker calls it too);
- reports progress from the last step in metrics.jsonl (rank 0 writes it: LLM_INFRA_MCP_METRICS);
- on failure, finds the root cause (torchrun collapses every worker failure to exit 1): the "Root Cause (first
  observed failure)" block of torchrun's output gives the rank and its exit code, the rank's error.json (written
  by scripts whose entry point uses `torch.distributed.elastic.multiprocessing.errors.record`) gives the
  exception, else the rank's stderr gives the last traceback line; it raises
  RuntimeError("rank 1 failed (exit 1): ValueError: ...") so the job's reason names the rank and the error.

The command, the mirror and the root cause are torchrun.py's, shared with the Slurm and Ray backends.

Nothing here imports torch: torchrun runs in a child process.
"""

import contextlib
import importlib.util
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from servers.core import ENV_PREFIX as SETTINGS_PREFIX
from servers.core.jobfiles import JobContext, JobFiles, atomic_write_json, read_json
from servers.core.jobstore import JobState
from servers.core.netns import LOOPBACK_ENV, isolated_argv
from servers.core.procs import ExitWaiter, stop_on_sigterm
from servers.core.sandbox import Layout, code_folders, sandbox_argv
from servers.engines.backend import (
    GPUS_PLACEHOLDER,
    JOB_DIR_PLACEHOLDER,
    BackendHandle,
    BackendPlan,
    EngineStatus,
    SubmitRequest,
)
from servers.launch.options import Options, given_options
from servers.launch.torchrun import (
    CHECKPOINT_ENV,
    JOB_ID_ENV,
    LOG_DIR_NAME,
    METRICS_ENV,
    RUN_DIR_NAME,
    RankLogMirror,
    attempt_dirs,
    describe_failure,
    open_beneath,
    tail_text,
    torchrun_argv,
)

if TYPE_CHECKING:
    from servers.core.jobs import JobEngine
    from servers.core.settings import Settings

ENTRY = "servers.launch.local:run_training_job"
NETWORKS = ("isolated", "host")
NETWORK_NOTES = {
    "isolated": "network: a private namespace with only loopback; torchrun's rendezvous store (a TCPStore: no "
    "authentication, and its rendezvous unpickles what it reads) is reachable from no other process or machine",
    "host": "network: the host's (LLM_INFRA_MCP_JOB_NETWORK=host); torchrun's rendezvous store listens on every "
    "interface without authentication, and anyone who reaches its port can run code as the job's user: use only "
    "on a trusted network",
}
SANDBOXES = ("on", "off")
SANDBOX_NOTES = {
    "on": "sandbox: the job's processes see the state directory {state_dir} as an empty folder holding only their "
    "own run folder, torchrun logs, checkpoints and metrics.jsonl (no database, keys, approvals, cache or other "
    "jobs), this package and the Python installation read-only, and only their own processes (servers/core/sandbox.py)",
    "off": "sandbox: off (LLM_INFRA_MCP_JOB_SANDBOX=off): the job runs as this server's user with the state directory "
    "(database, launch key, approvals, tool cache, other jobs' folders) writable: only for jobs you trust",
}
POLL_S = 0.5
# After SIGTERM, how long torchrun gets to stop its ranks before it is killed (the supervisor's grace still rules).
_STOP_WAIT_S = 30.0


def assign_gpus(nproc: int, busy: set[int], present: int, *, share_gpus: bool = False) -> list[int]:
    """GPU indices for `nproc` ranks, one each: free ones first. On a machine without GPUs (present == 0): []
    (the ranks run on CPU with gloo). Without `share_gpus`, a GPU another job holds (`busy`) is never handed out,
    and too few free GPUs is a ValueError; with it, busy GPUs are used after the free ones."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if present <= 0:
        return []
    if nproc > present:
        raise ValueError(f"{nproc} ranks need {nproc} GPUs, and this machine has {present}")
    free = [i for i in range(present) if i not in busy]
    if share_gpus:
        return (free + [i for i in range(present) if i in busy])[:nproc]
    if len(free) < nproc:
        held = ", ".join(str(i) for i in sorted(b for b in busy if b < present)) or "none"
        raise ValueError(
            f"{nproc} GPUs needed but only {len(free)} of {present} are free (held by other jobs: {held}); "
            "wait for a job to end, ask for fewer ranks, or set share_gpus"
        )
    return free[:nproc]


# ---- the backend ----------------------------------------------------------------------------------------------------
class LocalOptions(Options):
    """The local backend's options (a spec's `options`)."""

    share_gpus: bool = Field(
        default=False,
        description="may use GPUs other share_gpus jobs use (not a non-sharing job's); each GPU counts once "
        "in LLM_INFRA_MCP_MAX_CONCURRENT_GPUS",
    )


def shares_gpus(spec: Mapping[str, Any]) -> bool:
    """Whether a job's spec (a backend spec or a job record's) asks for share_gpus."""
    options = spec.get("options")
    return isinstance(options, Mapping) and options.get("share_gpus") is True


class LocalBackend:
    """torchrun on this machine. The job engine executes it: submit/status/cancel are thin wrappers over a
    JobEngine given at construction (the server's), with the job kind whose entry is `ENTRY`."""

    name = "local"

    def __init__(self, engine: "JobEngine | None" = None, kind: str = "train") -> None:
        self.engine = engine
        self.kind = kind

    def available(self) -> tuple[bool, str]:
        """torch installed here (so torchrun), and which torchrun runs; imports nothing heavy."""
        import shutil
        from importlib import metadata

        try:
            version: str | None = metadata.version("torch")
        except metadata.PackageNotFoundError:
            version = None
        if version is None or importlib.util.find_spec("torch") is None:
            return False, "torch is not installed, so torchrun is missing"
        return True, f"torch {version}; torchrun: {shutil.which('torchrun') or 'python -m torch.distributed.run'}"

    def plan(
        self,
        spec: Mapping[str, Any],
        settings: "Settings | None" = None,
        *,
        job_dir: Path | None = None,
    ) -> BackendPlan:
        """The exact torchrun command for a validated spec. No side effects: nothing is created or started.
        Without `job_dir` (before the job exists), paths in the job folder read `$JOB_DIR/...`; BackendPlan.bind
        fills them in, and the worker makes the same plan with the real folder."""
        given_options(spec, self.name)  # share_gpus is admission's (shares_gpus); a misplaced option is refused
        script = Path(str(spec["script"]))
        args = spec.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError("args must be a list of strings")
        nproc = int(spec.get("nproc_per_node", 1))
        max_restarts = int(spec.get("max_restarts", 0))
        run_id = str(spec.get("run_id") or "run")
        user_env = dict(spec.get("env") or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in user_env.items()):
            raise ValueError("env must map names to string values")
        # A job given no GPUs sees none: CUDA_VISIBLE_DEVICES is always set, "" when the list is empty or absent.
        # GPUs are named either now ("gpus": indices) or at admission ("gpus_wanted": how many; the plan then
        # holds GPUS_PLACEHOLDER, which bind() replaces with the indices the job was given).
        gpus = [int(g) for g in spec.get("gpus") or []]
        if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
            raise ValueError(f"gpus must be distinct indices >= 0, got {gpus}")
        if gpus and len(gpus) < nproc:
            raise ValueError(f"{nproc} ranks need {nproc} GPUs, and gpus names {len(gpus)}")
        wanted = 0 if gpus else int(spec.get("gpus_wanted") or 0)
        if wanted and wanted < nproc:
            raise ValueError(f"{nproc} ranks need {nproc} GPUs, and gpus_wanted is {wanted}")
        network = str(spec.get("network") or "isolated")
        if network not in NETWORKS:
            raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {network!r}")

        folder = str(job_dir) if job_dir is not None else JOB_DIR_PLACEHOLDER
        log_dir = Path(folder) / LOG_DIR_NAME
        module = spec.get("module")  # a framework's own entry point (servers/launch/frameworks.py): no torchrun
        if module and (nproc != 1 or max_restarts):
            raise ValueError("module: python -m runs one process without restarts (nproc_per_node 1, max_restarts 0)")
        if module:
            argv = [sys.executable, "-m", str(module), *args]
        else:
            argv = torchrun_argv(script, args, nproc, max_restarts, log_dir, run_id)
        workdir = spec.get("workdir")
        cwd = str(workdir) if workdir else str(Path(folder) / RUN_DIR_NAME)

        env = dict(user_env)
        files = JobFiles(folder)
        env[METRICS_ENV] = str(files.metrics)
        env[CHECKPOINT_ENV] = str(files.checkpoints)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if "OMP_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = "1"
        notes = [
            f"python -m {module} on this machine (the framework starts its own workers); its output as process torchrun"
            if module
            else f"{nproc} rank(s) on this machine; per-rank logs as processes rank0..rank{nproc - 1}"
        ]
        env["CUDA_VISIBLE_DEVICES"] = GPUS_PLACEHOLDER if wanted else ",".join(str(g) for g in gpus)
        if wanted:
            notes.append(
                f"{wanted} free GPU(s), assigned when the job is admitted (CUDA_VISIBLE_DEVICES); rank r uses cuda:r"
            )
        elif gpus:
            notes.append(f"GPUs {env['CUDA_VISIBLE_DEVICES']} (CUDA_VISIBLE_DEVICES); rank r uses cuda:r")
        else:
            notes.append("no GPU: CUDA_VISIBLE_DEVICES is empty, the ranks run on CPU (gloo)")
        sandbox = str(spec.get("sandbox") or "on")
        if sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {sandbox!r}")
        if sandbox == "on":
            from servers.core.settings import Settings

            state_dir = spec.get("state_dir") or str((settings or Settings()).home)
            writable = (cwd, str(log_dir), str(files.checkpoints), str(files.metrics))
            layout = Layout(hide=(str(state_dir),), readonly=code_folders(), writable=writable, network=network)
            argv = sandbox_argv(argv, layout)
            notes.append(SANDBOX_NOTES["on"].format(state_dir=state_dir))
        elif network == "isolated":
            argv = isolated_argv(argv)
        if sandbox == "off":
            notes.append(SANDBOX_NOTES["off"])
        if network == "isolated":
            for key, value in LOOPBACK_ENV.items():
                env.setdefault(key, value)
        notes.append(NETWORK_NOTES[network])
        notes.append(f"working directory {cwd}" + ("" if workdir else " (a folder apart from the job's own files)"))
        if max_restarts:
            notes.append(f"torchrun restarts all ranks in place up to {max_restarts} time(s) after a failure")
        return BackendPlan(
            backend=self.name,
            argv=argv,
            env=env,
            cwd=cwd,
            gpus=None if wanted else gpus,
            gpus_wanted=wanted,
            nnodes=1,
            nproc_per_node=nproc,
            notes=notes,
        )

    def _engine(self) -> "JobEngine":
        if self.engine is None:
            raise RuntimeError("this LocalBackend has no job engine; construct it with the server's JobEngine")
        return self.engine

    def submit(self, plan: BackendPlan, request: SubmitRequest) -> BackendHandle:
        """Start exactly `plan` through the engine: the job is admitted (the concurrency quota, and its GPUs
        assigned) in one transaction with the jobs of every server on this state directory; the worker runs the
        stored plan, bound to the job folder and those GPUs. The key is stored with the job (what
        recovers a lost bind: launch/server.py job_of_key)."""
        engine = self._engine()
        spec = {**request.spec, "idempotency_key": request.key, "plan": plan.model_dump(mode="json")}
        try:
            record = engine.submit(self.kind, spec, timeout_s=request.timeout_s, admit=self._admission(plan, spec))
        except ValueError as exc:  # assign_gpus: too few free GPUs
            from servers.core.errors import QuotaError

            raise QuotaError(str(exc)) from exc
        return BackendHandle(backend=self.name, key=request.key, native_id=record.id, job_dir=record.job_dir)

    def _admission(self, plan: BackendPlan, spec: dict[str, Any]) -> Callable[[list[Any]], dict[str, Any]] | None:
        """GPU assignment, run by the engine inside the transaction that admits the job, so that two submits
        (from this server or another) never count the same free GPU.

        LLM_INFRA_MCP_MAX_CONCURRENT_GPUS bounds the distinct GPUs that active training jobs hold, shared or not:
        a GPU that several share_gpus jobs use counts once, and a job that asks for more GPUs than the quota is
        refused whether it shares or not. A job without share_gpus gets GPUs no active job uses; one with it may
        also get GPUs that only other share_gpus jobs use (never one a job without it holds): free GPUs first, as
        many as the quota leaves room for, then the shared GPUs fewest jobs use."""
        wanted = plan.gpus_wanted
        if not wanted:
            return None
        from servers.core.errors import QuotaError
        from servers.core.machine import gpus_present

        present = gpus_present()
        limit = self._engine().settings.max_concurrent_gpus

        def admit(active: list[Any]) -> dict[str, Any]:
            in_use: dict[int, int] = {}  # GPU -> active jobs using it, shared or not
            held: set[int] = set()  # the GPUs of jobs that do not share
            for record in active:
                if record.kind == self.kind:
                    gpus = {g for g in record.spec.get("gpus") or [] if isinstance(g, int)}
                    for g in gpus:
                        in_use[g] = in_use.get(g, 0) + 1
                    if not shares_gpus(record.spec):
                        held.update(gpus)
            share = shares_gpus(spec)
            quota = "LLM_INFRA_MCP_MAX_CONCURRENT_GPUS, distinct GPUs in use by training jobs, shared or not"
            if wanted > limit:
                raise QuotaError(
                    f"this job needs {wanted} GPUs and at most {limit} may be in use at once ({quota}); "
                    "share_gpus does not change that: ask for fewer"
                )
            if not share:
                if len(in_use) + wanted > limit:
                    raise QuotaError(
                        f"{len(in_use)} GPUs are in use and this job needs {wanted}; at most {limit} at once ({quota})"
                    )
                return {**spec, "gpus": assign_gpus(wanted, set(in_use), present)}
            if present <= 0:
                return {**spec, "gpus": []}  # as assign_gpus: no GPU here, the ranks run on CPU
            if wanted > present:
                raise ValueError(f"{wanted} ranks need {wanted} GPUs, and this machine has {present}")
            room = max(0, limit - len(in_use))
            free = [g for g in range(present) if g not in in_use][: min(room, wanted)]
            shared = sorted((g for g in in_use if g not in held and g < present), key=lambda g: (in_use[g], g))
            picked = free + shared[: wanted - len(free)]
            if len(picked) < wanted:
                raise QuotaError(
                    f"{len(in_use)} GPUs are in use ({len(held)} by jobs that do not share) and this job needs "
                    f"{wanted}: the quota leaves room for {room} more, and {len(shared)} are shared; at most {limit} "
                    f"at once ({quota}); wait for a job to end or ask for fewer"
                )
            return {**spec, "gpus": sorted(picked)}

        return admit

    def status(self, handle: BackendHandle) -> EngineStatus:
        record = self._engine().get(handle.native_id)
        return EngineStatus(
            state=record.state,
            native_state=record.state.value,
            reason=record.reason,
            exit_code=record.exit_code,
            started_at=record.started_at,
            ended_at=record.ended_at,
        )

    def cancel(self, handle: BackendHandle) -> JobState:
        return self._engine().cancel(handle.native_id).state


# ---- the work function ---------------------------------------------------------------------------------------------
def _last_step(metrics: Path) -> int | None:
    for line in reversed(tail_text(metrics, 16384).splitlines()):
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict) and isinstance(row.get("step"), int | float):
                return int(row["step"])
    return None


def plan_to_run(spec: Mapping[str, Any], job_dir: Path) -> BackendPlan:
    """What the worker runs: the plan that was shown and submitted (stored with the job), bound to the job folder
    and to the GPUs the job was given at admission; a spec without a stored plan (a direct call) is planned here."""
    stored = spec.get("plan")
    if stored is None:
        return LocalBackend().plan(spec, job_dir=job_dir)
    plan = BackendPlan.model_validate(stored)
    if plan.gpus_wanted:
        gpus = spec.get("gpus")
        if not isinstance(gpus, list) or len(gpus) != plan.gpus_wanted:
            raise RuntimeError(f"the job was admitted without its {plan.gpus_wanted} GPU(s); submit it again")
        return plan.bind(job_dir, [int(g) for g in gpus])
    return plan.bind(job_dir)


def run_training_job(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The training job kind's work function (runs in the job's worker process). See the module docstring."""
    job_dir = ctx.files.dir
    plan = plan_to_run(spec, job_dir)
    log_dir = job_dir / LOG_DIR_NAME
    log_dir.mkdir(parents=True, exist_ok=True)
    ctx.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    Path(plan.cwd).mkdir(parents=True, exist_ok=True)
    ctx.files.metrics.touch(exist_ok=True)  # shown to the sandboxed job as it is: it must exist
    resumed = seed_checkpoints(spec, ctx)  # another job's checkpoints, before any process of this one starts
    # The server's settings (an HTTP token among them) are not the job's business: only the plan's own variables.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(SETTINGS_PREFIX)}
    env = {**inherited, **plan.env, JOB_ID_ENV: ctx.job_id}
    total = spec.get("total_steps")
    total_steps = float(total) if isinstance(total, int | float) else None
    torchrun_output = ctx.log_path("torchrun")
    cap = spec.get("max_log_bytes")
    mirror = RankLogMirror(log_dir, ctx.log_path, cap_bytes=int(cap) if isinstance(cap, int) else None)

    ctx.progress(0, total_steps, f"starting torchrun with {plan.nproc_per_node} rank(s)")
    with stop_on_sigterm() as stop:
        try:
            with open(torchrun_output, "ab") as out:
                proc = subprocess.Popen(
                    plan.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=plan.cwd, env=env
                )
            try:
                returncode = _follow(proc, mirror, ctx, stop, total_steps)
            except BaseException:
                _stop(proc)
                raise
        finally:
            mirror.sync(final=True)

    if stop.is_set():
        raise RuntimeError(f"stopped by SIGTERM (cancel or wall-time limit); torchrun exited with code {returncode}")
    attempts = attempt_dirs(log_dir)
    restarts = max(0, len(attempts) - 1)
    if returncode != 0:
        raise RuntimeError(describe_failure(returncode, log_dir, torchrun_output))
    step = _last_step(ctx.files.metrics)
    ctx.progress(step if step is not None else 0, total_steps, "finished")
    return {
        "exit_code": 0,
        "restarts": restarts,
        "attempts": len(attempts),
        "ranks": plan.nproc_per_node,
        "log_dir": str(log_dir),
        "last_step": step,
        "gpus": plan.gpus,
        "logs_cut": sorted(mirror.cut),
        "log_bytes_dropped": mirror.dropped,
        **({"resumed_from": _resumed(resumed)} if resumed is not None else {}),
    }


def _resumed(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a job's result says of the checkpoints it started from (resume.json has the files)."""
    return {k: record.get(k) for k in ("from_job", "newest_step", "files", "bytes", "skipped")}


def _follow(
    proc: subprocess.Popen[bytes], mirror: RankLogMirror, ctx: JobContext, stop: threading.Event, total: float | None
) -> int:
    last_step: int | None = None
    wait = ExitWaiter(proc.pid)  # torchrun's end is seen when it happens, not at the next poll
    try:
        while True:
            wait(POLL_S)
            if (returncode := proc.poll()) is not None:
                return returncode
            if stop.is_set():
                return _stop(proc)
            mirror.sync()
            step = _last_step(ctx.files.metrics)
            if step is not None and step != last_step:
                last_step = step
                attempt = len(attempt_dirs(mirror.log_dir)) - 1
                ctx.progress(step, total, f"step {step}" + (f" (after {attempt} restart(s))" if attempt > 0 else ""))
    finally:
        wait.close()


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM torchrun (it stops its ranks), then SIGKILL if it does not end in time."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


# ---- resume: another job's checkpoints, copied in before the job starts ----------------------------------------------
# A job that resumes from another (TrainingJobSpec.resume_from) starts with a copy of that job's checkpoints folder in
# its own: each job sees only its own folder (the sandbox hides the others), and the recipes resume from the newest
# checkpoint in LLM_INFRA_MCP_CHECKPOINT_DIR. Every backend whose job folder is on this machine (the registry's
# `local_job_folder`: local, Slurm, Ray) copies here, in the job's worker, before its processes start or its
# engine gets it (run_training_job, remote.run_remote_job).
#
# Copied, never hard-linked: the new job's processes run as the server's user and may open a linked file for writing,
# which would change the old job's checkpoint in place (common.save_checkpoint writes a new file and renames it, but a
# job's own script need not). A reflink (FICLONE: copy-on-write, where the file system has it) costs no space; else
# the bytes are copied. Regular files only, reached without following a symbolic link; anything else is skipped and
# named in the record. A name starting with '.' is an unfinished write (save_checkpoint's temporary): skipped.
MAX_RESUME_BYTES = 8 * 1024**3
MAX_RESUME_FILES = 4096
MAX_RESUME_DEPTH = 8
_STEP_NAME = re.compile(r"^step_(\d{1,18})\.pt$")
_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_CHUNK = 8 * 1024 * 1024
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ResumeError(ValueError):
    """A source job's checkpoints that cannot be used: too many, too big, or unreadable (the message says which)."""


@dataclass
class CheckpointFiles:
    """The regular files of a checkpoints folder (paths relative to it, with their sizes) and what was skipped."""

    files: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    @property
    def newest_step(self) -> int | None:
        """The highest step of the step_<N>.pt files at the top (what common.load_latest_checkpoint reads first)."""
        steps = [int(m.group(1)) for name, _ in self.files if (m := _STEP_NAME.match(name))]
        return max(steps) if steps else None

    def describe(self) -> str:
        step = self.newest_step
        what = f"its newest checkpoint (step {step})" if step is not None else "its checkpoints"
        skipped = f"; {len(self.skipped)} skipped (not regular files)" if self.skipped else ""
        return f"{what}, {len(self.files)} file(s), {self.total_bytes} bytes{skipped}"


def scan_checkpoints(folder: Path) -> CheckpointFiles:
    """The files `folder` holds, down to MAX_RESUME_DEPTH folders, without following a symbolic link (`folder`
    included); ResumeError past MAX_RESUME_FILES files or MAX_RESUME_BYTES bytes, with the numbers. An absent
    folder holds nothing."""
    found = CheckpointFiles()
    try:
        fd = os.open(folder, _NOFOLLOW_DIR)
    except FileNotFoundError:
        return found
    except OSError as exc:
        raise ResumeError(
            f"{folder} cannot be read as a folder (a symbolic link is not followed): {exc.strerror}"
        ) from None
    try:
        _walk(fd, "", 0, found, None)
    finally:
        os.close(fd)
    return found


def _walk(fd: int, prefix: str, depth: int, found: CheckpointFiles, into: int | None) -> None:
    """Scan (into None) or copy (into: the destination folder's descriptor) the folder open as `fd`."""
    with os.scandir(fd) as listing:
        names = sorted(entry.name for entry in listing)
    for name in names:
        relative = f"{prefix}{name}"
        if name.startswith("."):
            found.skipped.append(f"{relative}: a temporary file (a name starting with '.')")
            continue
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            found.skipped.append(f"{relative}: a symbolic link, not followed")
        elif stat.S_ISDIR(info.st_mode):
            if depth >= MAX_RESUME_DEPTH:
                found.skipped.append(f"{relative}: a folder deeper than {MAX_RESUME_DEPTH} levels")
                continue
            inner = os.open(name, _NOFOLLOW_DIR, dir_fd=fd)
            target = None
            try:
                if into is not None:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o700, dir_fd=into)
                    target = os.open(name, _NOFOLLOW_DIR, dir_fd=into)
                _walk(inner, f"{relative}/", depth + 1, found, target)
            finally:
                os.close(inner)
                if target is not None:
                    os.close(target)
        elif stat.S_ISREG(info.st_mode):
            size = info.st_size if into is None else _copy_file(fd, name, into, relative, found)
            found.files.append((relative, size))
            _check_bounds(found)
        else:
            found.skipped.append(f"{relative}: not a regular file")


def _check_bounds(found: CheckpointFiles) -> None:
    if len(found.files) > MAX_RESUME_FILES:
        raise ResumeError(
            f"more than {MAX_RESUME_FILES} files (at {found.files[-1][0]!r}); at most {MAX_RESUME_FILES} are copied"
        )
    if found.total_bytes > MAX_RESUME_BYTES:
        raise _too_big(found.total_bytes, len(found.files))


def _too_big(total: int, files: int) -> ResumeError:
    return ResumeError(
        f"{total} bytes in {files} file(s) so far, more than the {MAX_RESUME_BYTES} bytes "
        f"({MAX_RESUME_BYTES / 1024**3:g} GiB) that are copied at most"
    )


def _copy_file(src_dir: int, name: str, dst_dir: int, relative: str, found: CheckpointFiles) -> int:
    """Copy one regular file into `dst_dir` under a temporary name, then rename it; its size."""
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_dir)
    tmp = f".{name}.resume-{os.getpid()}.tmp"
    try:
        info = os.fstat(src)
        if not stat.S_ISREG(info.st_mode):
            raise ResumeError(f"{relative} changed into something other than a regular file while it was copied")
        os.set_blocking(src, True)
        room = MAX_RESUME_BYTES - found.total_bytes
        if info.st_size > room:
            raise _too_big(found.total_bytes + info.st_size, len(found.files) + 1)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst_dir)
        try:
            copied = _copy_bytes(src, dst, room, relative)
            os.fsync(dst)
        finally:
            os.close(dst)
        os.utime(tmp, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=dst_dir)
        os.replace(tmp, name, src_dir_fd=dst_dir, dst_dir_fd=dst_dir)
        return copied
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dst_dir)
        raise
    finally:
        os.close(src)


def _copy_bytes(src: int, dst: int, room: int, relative: str) -> int:
    """The file's bytes: a reflink where the file system makes one, else copied in chunks; at most `room` bytes."""
    import fcntl

    size = os.fstat(src).st_size
    if size <= room:
        with contextlib.suppress(OSError):
            fcntl.ioctl(dst, _FICLONE, src)
            if os.fstat(dst).st_size == size:
                return size
            os.ftruncate(dst, 0)
    copied = 0
    while True:
        chunk = os.read(src, _CHUNK)
        if not chunk:
            return copied
        copied += len(chunk)
        if copied > room:
            raise ResumeError(
                f"{relative} grew while it was copied, past the {MAX_RESUME_BYTES} bytes that are copied at most"
            )
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]


def seed_checkpoints(spec: Mapping[str, Any], ctx: JobContext) -> dict[str, Any] | None:
    """For a job that resumes from another (its spec's `resume_from`, set by the server at plan time: the source job's
    id and its checkpoints folder), copy that folder into this job's checkpoints folder, once: resume.json records
    what was copied (a follower taken up again finds it and copies nothing twice), logs/resume.log says it. None for
    a job that resumes from nothing; RuntimeError (the job's reason) when the copy fails."""
    source = spec.get("resume_from")
    if not isinstance(source, Mapping):
        return None
    job_id, folder = str(source.get("job_id")), Path(str(source.get("checkpoints")))
    done = read_json(ctx.files.resume_record, 4 * 1024 * 1024)
    if isinstance(done, dict) and done.get("from_job") == job_id:
        return done
    if spec.get("slurm_array"):
        raise RuntimeError(
            f"resume_from {job_id}: a run of a job array cannot resume (the array may start before the copy ends); "
            "nothing ran. Submit the run as a job of its own"
        )
    dest = ctx.checkpoint_dir
    try:
        source_fd = open_beneath(folder.parent, folder, directory=True)
    except (OSError, ValueError) as exc:
        raise RuntimeError(
            f"resume_from {job_id}: its checkpoints folder {folder} cannot be read (a symbolic link is not followed): "
            f"{exc}; nothing of this job ran"
        ) from exc
    copied = CheckpointFiles()
    try:
        dest_fd = os.open(dest, _NOFOLLOW_DIR)
        try:
            _walk(source_fd, "", 0, copied, dest_fd)
        finally:
            os.close(dest_fd)
    except (OSError, ResumeError) as exc:
        raise RuntimeError(
            f"resume_from {job_id}: copying its checkpoints from {folder} failed: {exc}; nothing of this job ran"
        ) from exc
    finally:
        os.close(source_fd)
    if not copied.files:
        raise RuntimeError(f"resume_from {job_id}: {folder} holds no checkpoint any more; nothing of this job ran")
    record = {
        "from_job": job_id,
        "source": str(folder),
        "files": len(copied.files),
        "bytes": copied.total_bytes,
        "newest_step": copied.newest_step,
        "copied": [{"path": p, "bytes": b} for p, b in copied.files[:256]],
        "skipped": copied.skipped[:256],
        "at": round(time.time(), 3),
    }
    atomic_write_json(ctx.files.resume_record, record)
    line = f"resumes from job {job_id}: copied {copied.describe()} from {folder} into {dest}\n"
    line += "".join(f"skipped {s}\n" for s in copied.skipped[:256])
    with open(ctx.log_path("resume"), "a") as log:
        log.write(line)
    ctx.progress(0, None, f"copied {len(copied.files)} checkpoint file(s) of job {job_id}")
    return record
