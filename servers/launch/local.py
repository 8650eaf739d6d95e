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
- reports progress from the last step in metrics.jsonl (rank 0 writes it: LLM_INFRA_MCP_METRICS);
- on failure, finds the root cause (torchrun collapses every worker failure to exit 1): the "Root Cause (first
  observed failure)" block of torchrun's output gives the rank and its exit code, the rank's error.json (written
  by scripts whose entry point uses `torch.distributed.elastic.multiprocessing.errors.record`) gives the
  exception, else the rank's stderr gives the last traceback line; it raises
  RuntimeError("rank 1 failed (exit 1): ValueError: ...") so the job's reason names the rank and the error.

Nothing here imports torch: torchrun runs in a child process.
"""

import contextlib
import ctypes
import ctypes.util
import functools
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from servers.core.jobfiles import (
    BadJobFileError,
    JobContext,
    JobFiles,
    open_beneath,
    open_regular,
    subfolders_beneath,
)
from servers.core.jobstore import JobState
from servers.core.netns import LOOPBACK_ENV, isolated_argv
from servers.core.procs import stop_on_sigterm
from servers.core.sandbox import Layout, code_folders, sandbox_argv
from servers.core.settings import ENV_PREFIX as SETTINGS_PREFIX
from servers.core.settings import Settings
from servers.engines.backend import (
    GPUS_PLACEHOLDER,
    JOB_DIR_PLACEHOLDER,
    BackendHandle,
    BackendPlan,
    EngineStatus,
    SubmitRequest,
)

if TYPE_CHECKING:
    from servers.core.jobs import JobEngine

ENTRY = "servers.launch.local:run_training_job"
LOG_DIR_NAME = "torchrun-logs"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
METRICS_ENV = "LLM_INFRA_MCP_METRICS"
CHECKPOINT_ENV = "LLM_INFRA_MCP_CHECKPOINT_DIR"
JOB_ID_ENV = "LLM_INFRA_MCP_JOB_ID"
RUN_DIR_NAME = "run"
MAX_NPROC = 1024
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
_CHUNK = 4 * 1024 * 1024
_TAIL = 64 * 1024


# ---- command -------------------------------------------------------------------------------------------------------
def torchrun_argv(
    script: Path, args: list[str], nproc_per_node: int, max_restarts: int, log_dir: Path, run_id: str
) -> list[str]:
    """The torchrun command for one node, as an argv list (never a shell string).

    `--standalone` would pick a random rendezvous id; the explicit c10d rendezvous on localhost:0 (a free port) is
    what --standalone does, with `run_id` as the id, so the per-rank log folder is named after the run:
    LOG_DIR/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}. Everything after the
    script is the script's own arguments (argparse REMAINDER), passed through literally.
    """
    if not RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"bad run_id {run_id!r}: letters, digits, '_', '-' and '.' only, at most 96")
    if not 1 <= nproc_per_node <= MAX_NPROC:
        raise ValueError(f"nproc_per_node must be in [1, {MAX_NPROC}], got {nproc_per_node}")
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    if not (script.is_absolute() or str(script).startswith(JOB_DIR_PLACEHOLDER)):
        raise ValueError(f"the script path must be absolute, got {str(script)!r}")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1:1",
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        "--rdzv-id",
        run_id,
        "--max-restarts",
        str(max_restarts),
        "--log-dir",
        str(log_dir),
        "--redirects",
        "3",
        str(script),
        *[str(a) for a in args],
    ]


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
class LocalBackend:
    """torchrun on this machine. The job engine executes it: submit/poll/cancel/logs are thin wrappers over a
    JobEngine given at construction (the server's), with the job kind whose entry is `ENTRY`."""

    name = "local"

    def __init__(self, engine: "JobEngine | None" = None, kind: str = "train") -> None:
        self.engine = engine
        self.kind = kind

    def available(self) -> tuple[bool, str]:
        if importlib.util.find_spec("torch") is None:
            return False, "torch is not installed, so torchrun is missing"
        from servers.launch.backends import detect_local

        status = detect_local()
        return status.detected, status.detail

    def plan(
        self,
        spec: Mapping[str, Any],
        settings: Settings | None = None,
        *,
        job_dir: Path | None = None,
    ) -> BackendPlan:
        """The exact torchrun command for a validated spec. No side effects: nothing is created or started.
        Without `job_dir` (before the job exists), paths in the job folder read `$JOB_DIR/...`; BackendPlan.bind
        fills them in, and the worker makes the same plan with the real folder."""
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
        notes = [f"{nproc} rank(s) on this machine; per-rank logs as processes rank0..rank{nproc - 1}"]
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
        stored plan, bound to the job folder and those GPUs. The key is stored with the job (see `find`)."""
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
                    if not record.spec.get("share_gpus"):
                        held.update(gpus)
            share = bool(spec.get("share_gpus"))
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

    def find(self, key: str) -> BackendHandle | None:
        store = self._engine().store
        offset = 0
        while True:
            page = store.list_jobs(kind=self.kind, limit=200, offset=offset)
            for job in page.jobs:
                if job.spec.get("idempotency_key") == key:
                    return BackendHandle(backend=self.name, key=key, native_id=job.id, job_dir=job.job_dir)
            offset += len(page.jobs)
            if not page.jobs or offset >= page.total:
                return None

    def poll(self, handle: BackendHandle) -> JobState:
        return self._engine().get(handle.native_id).state

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

    def logs(self, handle: BackendHandle, process: str = "rank0", *, offset: int = 0, max_bytes: int = 65536) -> str:
        record = self._engine().get(handle.native_id)
        path = JobFiles(record.job_dir).log(process)
        try:
            with open(path, "rb") as f:
                f.seek(max(0, offset))
                return f.read(max(0, max_bytes)).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""


# ---- per-rank logs -------------------------------------------------------------------------------------------------
# The job's ranks write below torchrun's log folder, and the worker reading it runs outside the job's sandbox: every
# folder and file there is reached without following a symbolic link (open_beneath), so that a rank cannot make the
# worker copy, or punch holes in, a file elsewhere.
def _numbered(log_dir: Path, parent: Path, prefix: str = "") -> list[tuple[int, Path]]:
    found = []
    for name in subfolders_beneath(log_dir, parent):
        suffix = name[len(prefix) :] if name.startswith(prefix) else ""
        if suffix.isdigit():
            found.append((int(suffix), parent / name))
    return sorted(found)


def attempt_dirs(log_dir: Path) -> list[tuple[int, Path]]:
    """(attempt number, folder) for every attempt torchrun started under `log_dir`, in order."""
    attempts: list[tuple[int, Path]] = []
    for name in subfolders_beneath(log_dir, log_dir):
        attempts.extend(_numbered(log_dir, log_dir / name, "attempt_"))
    return sorted(attempts)


class RankLogMirror:
    """Copies what each rank has written (stdout.log and stderr.log of every attempt) to the job's rank<r> logs,
    by byte offset, whole lines at a time, so that the logs read well while the job runs. A line from a restart
    is preceded by a marker line.

    One copy is kept: once copied, the bytes of torchrun's files are released (a hole is punched in them, the
    file keeps its size so the rank writes on where it was), except the last `_TAIL` bytes that the root cause
    reads. The job's logs together stop at `cap_bytes`: past it a marker line says where the log was cut, the
    rest is dropped (and released) while the job goes on, and `cut` names the logs that were cut."""

    def __init__(self, log_dir: Path, log_path: Callable[[str], Path], cap_bytes: int | None = None) -> None:
        self.log_dir = log_dir
        self.log_path = log_path
        self.cap_bytes = cap_bytes
        self.written = 0
        self.dropped = 0
        self.cut: set[str] = set()
        self._offsets: dict[Path, int] = {}
        self._released: dict[Path, int] = {}
        self._started: set[tuple[int, int]] = set()

    def sync(self, *, final: bool = False) -> None:
        for attempt, attempt_dir in attempt_dirs(self.log_dir):
            for rank, rank_dir in _numbered(self.log_dir, attempt_dir):
                self.log_path(f"rank{rank}").touch(exist_ok=True)  # a silent rank still has a (empty) log
                for stream in ("stdout.log", "stderr.log"):
                    self._copy(attempt, rank, rank_dir / stream, final)

    def _copy(self, attempt: int, rank: int, source: Path, final: bool) -> None:
        offset = self._offsets.get(source, 0)
        try:
            fd = open_beneath(self.log_dir, source)
        except (OSError, ValueError):
            return
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            while size > offset:
                f.seek(offset)
                chunk = f.read(min(size - offset, _CHUNK))
                if not final and len(chunk) < _CHUNK:
                    end = chunk.rfind(b"\n")
                    if end < 0:
                        return  # a line still being written: copied once it ends
                    chunk = chunk[: end + 1]
                self._append(attempt, rank, chunk)
                offset += len(chunk)
                self._offsets[source] = offset
                self._release(f, source, offset)
                if not final:
                    return

    def _append(self, attempt: int, rank: int, chunk: bytes) -> None:
        process = f"rank{rank}"
        marker = b""
        if (attempt, rank) not in self._started:
            self._started.add((attempt, rank))
            if attempt > 0 and process not in self.cut:
                marker = f"----- torchrun restart {attempt} (attempt_{attempt}) -----\n".encode()
        if process in self.cut:
            self.dropped += len(chunk)
            return
        if self.cap_bytes is not None and self.written + len(marker) + len(chunk) > self.cap_bytes:
            room = max(0, self.cap_bytes - self.written - len(marker))
            keep = chunk[:room]
            keep = keep[: keep.rfind(b"\n") + 1]  # whole lines only
            self.dropped += len(chunk) - len(keep)
            note = (
                f"\n----- llm-infra-mcp: log cut here: the job's logs reached {self.cap_bytes} bytes "
                "(LLM_INFRA_MCP_MAX_LOG_BYTES_PER_JOB); the job goes on, its further output is dropped -----\n"
            ).encode()
            self._write(process, marker + keep + note)
            self.cut.add(process)
            _write_cut_record(self.log_path(process), self.cap_bytes)
            return
        self._write(process, marker + chunk)

    def _write(self, process: str, data: bytes) -> None:
        with open(self.log_path(process), "ab") as out:
            out.write(data)
        self.written += len(data)

    def _release(self, f: IO[bytes], source: Path, copied: int) -> None:
        """Punch out what was copied from `source` (open as `f`), keeping its last _TAIL bytes."""
        upto = max(0, copied - _TAIL) // _PAGE * _PAGE
        done = self._released.get(source, 0)
        if upto > done and punch_hole(f"/proc/self/fd/{f.fileno()}", done, upto - done):
            self._released[source] = upto
        elif upto > done:
            self._released[source] = upto  # not supported here: both copies stay, nothing else to do


def _write_cut_record(log: Path, cap: int) -> None:
    from servers.core.jobfiles import atomic_write_json

    atomic_write_json(log.with_suffix(".cut"), {"cut_at_bytes": log.stat().st_size, "cap_bytes": cap})


_PAGE = 4096
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


@functools.lru_cache(maxsize=1)
def _fallocate() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


def punch_hole(path: Path | str, offset: int, length: int) -> bool:
    """Free the disk blocks of bytes [offset, offset + length) of `path`, keeping its size (they read as zeros).
    False where the platform or the file system cannot."""
    fn = _fallocate()
    if fn is None or length <= 0:
        return False
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        return fn(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0
    finally:
        os.close(fd)


# ---- root cause ----------------------------------------------------------------------------------------------------
@dataclass
class RootCause:
    rank: int | None
    exit_code: int | None
    error: str
    attempt: int | None = None


_BLOCK_START = "Root Cause (first observed failure):"


def _tail_text(path: Path, limit: int = _TAIL, *, beneath: Path | None = None) -> str:
    """The last `limit` bytes of a regular file, as text ("" when it cannot be read); with `beneath`, reached
    without following links from that folder down (a file the job's ranks can write)."""
    try:
        f = os.fdopen(open_beneath(beneath, path), "rb") if beneath is not None else open_regular(path)
    except (OSError, ValueError, BadJobFileError):
        return ""
    try:
        with f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def parse_root_cause_block(text: str) -> dict[str, Any] | None:
    """rank, local_rank, exit_code, error_file and traceback from the last "Root Cause" block torchrun printed."""
    start = text.rfind(_BLOCK_START)
    if start < 0:
        return None
    block = text[start + len(_BLOCK_START) :]
    end = block.find("\n====")
    block = block[:end] if end >= 0 else block
    info: dict[str, Any] = {}
    if m := re.search(r"^\s*rank\s*:\s*(\d+)(?:\s*\(local_rank:\s*(\d+)\))?", block, re.M):
        info["rank"] = int(m.group(1))
        info["local_rank"] = int(m.group(2)) if m.group(2) else None
    if m := re.search(r"^\s*exitcode\s*:\s*(-?\d+)", block, re.M):
        info["exit_code"] = int(m.group(1))
    if m := re.search(r"^\s*error_file\s*:\s*(\S+)", block, re.M):
        info["error_file"] = None if m.group(1) == "<N/A>" else m.group(1)
    if m := re.search(r"^\s*traceback\s*:\s?(.*)", block, re.M | re.S):
        info["traceback"] = m.group(1).rstrip()
    return info


def read_error_file(path: Path, log_dir: Path) -> tuple[str, float | None] | None:
    """(message, timestamp) from a torchelastic error.json: {"message": {"message": "Type: text", "extraInfo":
    {"py_callstack": ..., "timestamp": "..."}}} (older or hand-written files: {"message": "text"})."""
    try:
        with os.fdopen(open_beneath(log_dir, path), "rb") as f:
            data = json.loads(f.read(_TAIL))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    message = data.get("message")
    timestamp: float | None = None
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        with contextlib.suppress(TypeError, ValueError):
            timestamp = float(extra.get("timestamp"))
        message = message.get("message")
    if not message:
        return None
    return str(message).strip(), timestamp


def last_exception_line(text: str) -> str | None:
    """The exception line ("ValueError: ...") of the last Python traceback in `text`, else None."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    indent = len(lines[starts[-1]]) - len(lines[starts[-1]].lstrip())
    found = None
    for line in lines[starts[-1] + 1 :]:
        stripped = line.strip()
        if not stripped:
            continue
        if len(line) - len(line.lstrip()) <= indent and not stripped.startswith(("File ", "^", "~")):
            found = stripped
            break
    return found


def find_root_cause(log_dir: Path, torchrun_output: Path) -> RootCause | None:
    """Which rank failed first and why, from torchrun's output, the ranks' error files and their stderr."""
    block = parse_root_cause_block(_tail_text(torchrun_output)) or {}
    attempts = attempt_dirs(log_dir)
    last_attempt, last_dir = attempts[-1] if attempts else (None, None)

    # One node: the local rank (the folder name) is the rank.
    rank = block["local_rank"] if block.get("local_rank") is not None else block.get("rank")
    error: str | None = None
    named = Path(os.path.normpath(block["error_file"])) if block.get("error_file") else None
    if named is not None and named.is_relative_to(log_dir):  # only files torchrun wrote for this job
        found = read_error_file(named, log_dir)
        error = found[0] if found else None
    if error is None and last_dir is not None:
        # The earliest error file of the last attempt: the rank that failed first.
        candidates = []
        for r, rank_dir in _numbered(log_dir, last_dir):
            found = read_error_file(rank_dir / "error.json", log_dir)
            if found and (rank is None or r == rank):
                candidates.append((found[1] if found[1] is not None else float("inf"), r, found[0]))
        if candidates:
            _, r, error = min(candidates)
            rank = r if rank is None else rank
    traceback = str(block.get("traceback") or "")
    if error is None and traceback and "Traceback" in traceback:
        error = last_exception_line(traceback)
    if error is None and rank is not None and last_dir is not None:
        stderr = _tail_text(last_dir / str(rank) / "stderr.log", beneath=log_dir)
        error = last_exception_line(stderr)
        if error is None:
            lines = [line.strip() for line in stderr.splitlines() if line.strip()]
            error = lines[-1] if lines else None
    if error is None and traceback and not traceback.startswith("To enable traceback"):
        error = traceback.strip().splitlines()[-1].strip()
    if rank is None and error is None:
        return None
    code = block.get("exit_code")
    return RootCause(rank=rank, exit_code=code, error=error or "no error message was recorded", attempt=last_attempt)


def describe_failure(returncode: int, log_dir: Path, torchrun_output: Path) -> str:
    """The job's reason for a torchrun that exited with `returncode` != 0."""
    cause = find_root_cause(log_dir, torchrun_output)
    attempts = attempt_dirs(log_dir)
    restarts = f"; after {len(attempts) - 1} restart(s)" if len(attempts) > 1 else ""
    if cause is None or cause.rank is None:
        tail = [line.strip() for line in _tail_text(torchrun_output, 8192).splitlines() if line.strip()]
        detail = (cause.error if cause else None) or (tail[-1] if tail else "no output")
        return f"torchrun exited with code {returncode}: {detail}{restarts}; see read_job_logs for process torchrun"
    code = cause.exit_code if cause.exit_code is not None else returncode
    signal_note = ""
    if code < 0:
        with contextlib.suppress(ValueError):
            name = signal.Signals(-code).name
            signal_note = f", {name}" + (" (often the out-of-memory killer)" if name == "SIGKILL" else "")
    return (
        f"rank {cause.rank} failed (exit {code}{signal_note}): {cause.error}{restarts}; "
        f"see read_job_logs for process rank{cause.rank}"
    )


# ---- the work function ---------------------------------------------------------------------------------------------
def _last_step(metrics: Path) -> int | None:
    for line in reversed(_tail_text(metrics, 16384).splitlines()):
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
    }


def _follow(
    proc: subprocess.Popen[bytes], mirror: RankLogMirror, ctx: JobContext, stop: threading.Event, total: float | None
) -> int:
    last_step: int | None = None
    while True:
        try:
            return proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if stop.is_set():
            return _stop(proc)
        mirror.sync()
        step = _last_step(ctx.files.metrics)
        if step is not None and step != last_step:
            last_step = step
            attempt = len(attempt_dirs(mirror.log_dir)) - 1
            ctx.progress(step, total, f"step {step}" + (f" (after {attempt} restart(s))" if attempt > 0 else ""))


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
