"""The Slurm backend: multi-node torchrun as one Slurm batch job, driven through Slurm's own commands.

plan renders a batch script (shown to the person in BackendPlan.rendered; argv ``sbatch --parsable SCRIPT``). Its
``#SBATCH`` lines come only from validated spec fields (each value fullmatches a safe pattern); its body runs one
task per node, ``srun ... python -m servers.launch.slurm node ... -- python -m torch.distributed.run --nnodes N
--nproc-per-node P --rdzv-backend c10d --rdzv-endpoint HEAD:PORT --rdzv-id $SLURM_JOB_ID ... SCRIPT ARGS``, every
argument shell-quoted. HEAD is the first host of ``scontrol show hostnames "$SLURM_JOB_NODELIST"`` (its NodeAddr),
PORT a free port picked on it when the job starts.

The node wrapper (``node``, one per node, this module's ``main``) runs torchrun with its per-rank logs under
JOB/torchrun-logs/node<SLURM_NODEID>, copies each rank's output to JOB/logs/rank<global rank>.log while the job runs
(torchrun.py's RankLogMirror; the global rank of a local rank is read from the worker's own environment, since the c10d
rendezvous orders nodes as it likes), and on exit writes JOB/slurm-node<N>-exit.json: its exit code and, when
torchrun failed, torchrun.py's describe_failure of its output with the global rank.

The batch script always ends by writing JOB/slurm-exit.json (``exit-record``): the exit code, the end time, Slurm's
state as the job saw it (COMPLETED, FAILED, TIMEOUT, CANCELLED...) and the failing rank with its exception; also on
scancel and at the time limit (a trap on SIGTERM, which Slurm sends KillWait seconds before SIGKILL). Where the Python
helper cannot run, the shell writes a plain record instead (exit code, signal, times). Either is written whole
(a temporary file renamed), so a reader never sees half of one.

status reads, in order: the job's exit record (a file read); ``scontrol show job -o ID`` while Slurm knows the job
(``squeue --json`` as the fallback: on 22.05 it ignores ``-j`` and lists every job; both JSON layouts are read), whose
state wins, except that a job Slurm calls COMPLETING whose batch script already wrote its exit record is reported from
that record (not while Slurm says RUNNING: the job's own processes could have written it); once Slurm forgot the job
(MinJobAge, 300 s by default): ``sacct`` where accounting exists,
then what this backend saw Slurm say of the ended job (slurm-state.json), then the exit record, then a cancel this
backend requested of a job that never started (slurm-cancel.json); a job with none of these is LOST with the reason,
never SUCCEEDED. If Slurm cannot be asked, the exit record answers, else SlurmUnavailableError.

submit is idempotent by the key: the job folder is named after it, holds the submit record (slurm-submit.json),
and the job carries the key in its --comment, which a retried submit looks for in squeue before starting anything.
"""

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from servers.core.jobfiles import JobFiles, atomic_write_json, read_json
from servers.core.jobstore import JobState
from servers.core.procs import process_environ, process_parent
from servers.core.settings import Settings
from servers.engines.backend import (
    JOB_DIR_PLACEHOLDER,
    ArrayRun,
    BackendHandle,
    BackendPlan,
    EngineStatus,
    SubmitRequest,
    map_state,
)
from servers.launch.envpolicy import env_refusal
from servers.launch.options import Options, given_options
from servers.launch.torchrun import (
    CHECKPOINT_ENV,
    LOG_DIR_NAME,
    MAX_NPROC,
    METRICS_ENV,
    RUN_DIR_NAME,
    RUN_ID_PATTERN,
    RankLogMirror,
    describe_failure,
    find_root_cause,
    parse_root_cause_block,
    tail_text,
)

BACKEND_NAME = "slurm"
SCRIPT_NAME = "slurm-job.sh"
EXIT_RECORD = "slurm-exit.json"
SUBMIT_RECORD = "slurm-submit.json"
STATE_RECORD = "slurm-state.json"
CANCEL_RECORD = "slurm-cancel.json"
NODE_RECORD = "slurm-node{node}-exit.json"
ARRAY_SCRIPT = "slurm-array.sh"  # a sweep's job array, in the sweep's folder
ARRAY_RECORD = "slurm-array-submit.json"
# The #SBATCH options of a run that are its own, not the array's (the array sets them for all its tasks).
PER_RUN_OPTIONS = ("--job-name", "--output", "--error", "--open-mode", "--comment", "--export")
COMMENT_PREFIX = "llm-infra-mcp:"
KEY_LATER = "(set at submit)"  # in a plan made without an idempotency key; submit fills in the request's key
HELPER_MARK = "LLM_INFRA_MCP_SLURM_HELPER"
NODE_LOG_DIR = "node%n"  # the node wrapper replaces %n by SLURM_NODEID (Slurm's own spelling in srun -o)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]

# The Slurm commands this backend runs (argv lists, never a shell).
COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")

# ---- states ---------------------------------------------------------------------------------------------------------
# TorchX's map (torchx/schedulers/slurm_scheduler.py) onto the job engine's states, with the states it leaves out.
SLURM_STATES: dict[str, JobState] = {
    "PENDING": JobState.QUEUED,
    "REQUEUED": JobState.QUEUED,
    "REQUEUE_FED": JobState.QUEUED,
    "REQUEUE_HOLD": JobState.QUEUED,
    "RESIZING": JobState.QUEUED,
    "SUSPENDED": JobState.QUEUED,
    "STOPPED": JobState.QUEUED,
    "CONFIGURING": JobState.STARTING,
    "POWER_UP_NODE": JobState.STARTING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "PREEMPTED": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "REVOKED": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
}

ENDED_WORDS = {
    "TIMEOUT": "the job ran past its time limit (--time) and Slurm ended it",
    "PREEMPTED": "Slurm preempted the job for another one",
    "NODE_FAIL": "a node of the job failed",
    "OUT_OF_MEMORY": "a node ran out of memory (the job's memory limit)",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "the job reached its --deadline",
    "REVOKED": "a sibling cluster of the federation started the job instead",
    "SPECIAL_EXIT": "the job exited with a special code and was held",
}

PENDING_WORDS = {
    "Resources": "the nodes, CPUs or GPUs it asks for are busy; it starts when they free up",
    "Priority": "jobs of higher priority are ahead of it",
    "PartitionConfig": "the partition can never offer what it asks for (e.g. more nodes than it has): it will not "
    "start as it is; cancel it and ask for less",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows a job",
    "PartitionTimeLimit": "its time limit exceeds the partition's",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "ReqNodeNotAvail": "a node it needs is not available (down, drained or reserved)",
    "Dependency": "it waits for the job it depends on (--dependency)",
    "DependencyNeverSatisfied": "the job it depends on did not succeed: it will never start; cancel it",
    "BeginTime": "its start time (--begin) is not reached",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "BadConstraints": "its constraints (--constraint) can never be met",
    "QOSMaxJobsPerUserLimit": "the QOS limits how many jobs a user runs at once",
    "AssocGrpCpuLimit": "the account's CPU limit is reached",
    "AssocGrpGRES": "the account's GPU limit is reached",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QOS is not valid",
    "Reservation": "it waits for its reservation",
    "NodeDown": "a node it needs is down",
    "launch failed requeued held": "its launch failed; it was requeued and held",
}

# ---- validation ------------------------------------------------------------------------------------------------------
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAME_ACCEPTED = "a letter or digit, then letters, digits, '_', '.' or '-' (at most 64)"
CONSTRAINT_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}(?:[&|,][A-Za-z0-9_.-]{1,64}){0,31}")
CONSTRAINT_ACCEPTED = "feature names (letters, digits, '_', '.', '-') joined by '&', '|' or ','"
NODELIST_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-\[\],]{0,1023}")
NODELIST_ACCEPTED = "node names and ranges such as node[1-3],gpu07 (letters, digits, '_', '.', '-', '[', ']', ',')"
KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
KEY_ACCEPTED = "a letter or digit, then letters, digits, '_', '.', ':' or '-' (at most 128)"
# A job id, or an array task's "<array job id>_<task index>" (how scontrol, squeue and scancel name one task).
JOB_ID_PATTERN = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,7})?")
SUBMITTED_ID_PATTERN = re.compile(r"[0-9]{1,12}")  # what sbatch --parsable prints (an array's too)
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# The job folder appears in #SBATCH lines, which sbatch splits at spaces and in which it expands %j, %N...
SAFE_PATH_PATTERN = re.compile(r"/[A-Za-z0-9_./+-]{0,1023}")
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# sbatch/srun options that must not be smuggled in through a training argument.
SMUGGLED_OPTIONS = ("--wrap", "--export", "--get-user-env", "--uid", "--gid", "--chdir", "--comment")
MAX_NODES = 4096
MAX_WALL_S = 30 * 86400
DEFAULT_WALL_S = 3600.0
OPTIONAL_FIELDS = ("partition", "account", "qos", "constraint", "exclude", "nodelist")
SLURM_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class SlurmOptions(Options):
    """The Slurm backend's options (a spec's `options`): each becomes an #SBATCH line."""

    partition: str | None = Field(default=None, pattern=SLURM_NAME)
    account: str | None = Field(default=None, pattern=SLURM_NAME)
    qos: str | None = Field(default=None, pattern=SLURM_NAME)
    constraint: str | None = Field(default=None, max_length=2048)
    exclude: str | None = Field(default=None, max_length=1024)
    nodelist: str | None = Field(default=None, max_length=1024)
    dependency: str | None = Field(default=None, pattern=r"^[0-9]{1,12}$", description="Slurm job ID to succeed first")


COMMAND_TIMEOUT_S = 30.0
CANCEL_WAIT_S = 15.0
POLL_S = 0.5


class SlurmUnavailableError(RuntimeError):
    """Slurm's commands are missing or its controller does not answer; the message says which and why."""


@dataclass
class SlurmJob:
    """One job as Slurm reports it (scontrol, squeue --json or sacct), in plain fields."""

    job_id: str
    state: str
    reason: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    restarts: int = 0
    comment: str | None = None
    time_limit: str | None = None
    nodes: str | None = None


# ---- parsing Slurm's output ---------------------------------------------------------------------------------------
def base_state(native: str) -> str:
    """'CANCELLED by 0' -> 'CANCELLED'; 'RUNNING+...' flags and case dropped."""
    word = native.strip().split()[0] if native.strip() else ""
    return word.split("+")[0].upper()


def slurm_time(text: str | None) -> float | None:
    """Slurm's local time '2024-05-01T12:00:00' as epoch seconds; None for Unknown, None, N/A or an epoch of 0."""
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    if text.isdigit():
        value = float(text)
        return value or None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _exit_pair(text: str | None) -> tuple[int | None, int | None]:
    """'143:0' -> (143, 0)."""
    if not text:
        return None, None
    code, _, sig = text.partition(":")
    try:
        return int(code), int(sig) if sig else 0
    except ValueError:
        return None, None


def parse_scontrol_job(text: str) -> SlurmJob | None:
    """`scontrol show job -o ID`: one line of Key=Value pairs. None when there is no JobId/JobState."""
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), "")
    if not line:
        return None
    fields: dict[str, str] = {}
    # Values have no spaces except a few free-text ones (Comment, Command, WorkDir, Reason...): a key starts a field.
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?=\s[A-Za-z][A-Za-z0-9_/:]*=|\s*$)", line):
        fields.setdefault(m.group(1), m.group(2).strip())
    job_id, state = fields.get("JobId"), fields.get("JobState")
    if not job_id or not state:
        return None
    array_id, task = fields.get("ArrayJobId"), fields.get("ArrayTaskId")
    if array_id and task and array_id.isdigit() and task.isdigit():
        job_id = f"{array_id}_{task}"  # one task of an array: named as Slurm's commands name it
    code, sig = _exit_pair(fields.get("ExitCode"))
    pending = base_state(state) == "PENDING"
    restarts = fields.get("Restarts", "0")
    comment = fields.get("Comment")
    return SlurmJob(
        job_id=job_id,
        state=base_state(state),
        reason=fields.get("Reason") if fields.get("Reason") not in (None, "None", "(null)") else None,
        exit_code=code,
        exit_signal=sig,
        started_at=None if pending else slurm_time(fields.get("StartTime")),
        ended_at=None if pending else slurm_time(fields.get("EndTime")),
        restarts=int(restarts) if restarts.isdigit() else 0,
        comment=None if comment in (None, "(null)") else comment,
        time_limit=fields.get("TimeLimit"),
        nodes=fields.get("NodeList"),
    )


def _number(value: Any) -> float | None:
    """A JSON number of either layout: 5, or {"set": true, "number": 5} (v0.0.39+)."""
    if isinstance(value, dict):
        if value.get("set") is False or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _json_exit(value: Any) -> tuple[int | None, int | None]:
    """exit_code of either layout: a wait status (22.05: 36608 for 143:0) or {"return_code": ..., "signal": ...}."""
    if isinstance(value, dict):
        code = _number(value.get("return_code"))
        sig_info = value.get("signal")
        sig = _number(sig_info.get("id", sig_info.get("signal_id"))) if isinstance(sig_info, dict) else None
        return (None if code is None else int(code)), (None if sig is None else int(sig))
    number = _number(value)
    if number is None:
        return None, None
    raw = int(number)
    if raw > 255 or raw & 0x7F:  # a wait(2) status
        return (raw >> 8) & 0xFF, raw & 0x7F
    return raw, 0


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """The jobs of `squeue --json` (also `scontrol show job --json`): 22.05 (v0.0.38: job_state a string, exit_code
    a wait status) and 23.02+ (job_state a list of the state and its flags, numbers as {"set", "number"})."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    jobs = data.get("jobs") if isinstance(data, dict) else None
    out: list[SlurmJob] = []
    for job in jobs if isinstance(jobs, list) else []:
        if not isinstance(job, dict):
            continue
        job_id = _number(job.get("job_id"))
        raw_state = job.get("job_state")
        states = [str(s) for s in raw_state] if isinstance(raw_state, list) else [str(raw_state or "")]
        if job_id is None or not states or not states[0]:
            continue
        state = base_state(states[0])
        if "COMPLETING" in states[1:] and SLURM_STATES.get(state) in (JobState.RUNNING, None):
            state = "COMPLETING"
        code, sig = _json_exit(job.get("exit_code"))
        reason = job.get("state_reason")
        pending = state == "PENDING"
        array_id, task = _number(job.get("array_job_id")), _number(job.get("array_task_id"))
        if array_id and task is not None:
            names = [f"{int(array_id)}_{int(task)}"]
        elif array_id and job.get("array_task_string"):  # tasks not started yet, listed as one: "0-2,5%2"
            names = [f"{int(array_id)}_{t}" for t in array_tasks(str(job["array_task_string"]))]
        else:
            names = [str(int(job_id))]
        out += [
            SlurmJob(
                job_id=name,
                state=state,
                reason=str(reason) if reason and reason != "None" else None,
                exit_code=code,
                exit_signal=sig,
                started_at=None if pending else _number(job.get("start_time")) or None,
                ended_at=None if pending else _number(job.get("end_time")) or None,
                restarts=int(_number(job.get("restart_cnt")) or 0),
                comment=str(job["comment"]) if job.get("comment") else None,
                nodes=str(job.get("nodes") or "") or None,
            )
            for name in names
        ]
    return out


def array_tasks(text: str, limit: int = 10000) -> list[int]:
    """The task indices of Slurm's array notation: "0-2,5", "1-7:2", "[0-3]%2" (the '%' throttle dropped); at most
    `limit` of them. Anything else gives no task."""
    body = text.strip().split("%")[0].strip("[]")
    tasks: list[int] = []
    for part in body.split(","):
        m = re.fullmatch(r"(\d{1,7})(?:-(\d{1,7})(?::(\d{1,7}))?)?", part.strip())
        if m is None:
            return []
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
        step = int(m.group(3)) if m.group(3) else 1
        if step < 1 or last < first:
            return []
        tasks += range(first, min(last, first + limit * step) + 1, step)
        if len(tasks) >= limit:
            return tasks[:limit]
    return tasks


def parse_sacct(text: str, job_id: str) -> SlurmJob | None:
    """`sacct -j ID -X --parsable2 --noheader -o JobID,State,ExitCode,Start,End,Reason`: the job's line (JobID, not
    JobIDRaw: an array task's JobID is "<array id>_<task>", as this backend names it)."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or parts[0] != job_id:
            continue
        code, sig = _exit_pair(parts[2])
        reason = parts[5] if len(parts) > 5 and parts[5] not in ("", "None") else None
        state = base_state(parts[1])
        return SlurmJob(
            job_id=job_id,
            state=state,
            reason=reason,
            exit_code=code,
            exit_signal=sig,
            started_at=slurm_time(parts[3]),
            ended_at=slurm_time(parts[4]),
        )
    return None


def time_minutes(max_wall_s: float) -> int:
    """sbatch --time in whole minutes, rounded up (at least 1)."""
    return max(1, math.ceil(max_wall_s / 60.0))


def job_folder_name(key: str) -> str:
    """The job folder's name for an idempotency key: the same key, the same folder."""
    return "slurm-" + hashlib.sha256(key.encode()).hexdigest()[:20]


# ---- the backend ----------------------------------------------------------------------------------------------------
class SlurmBackend:
    """Training jobs as Slurm batch jobs (sbatch, squeue/scontrol, sacct, scancel). See the module docstring.

    job_root: where job folders are made (one per idempotency key) when submit is not given a folder; it must be on
        a filesystem every node mounts at the same path. Default: <state dir>/slurm-jobs.
    python: the interpreter the nodes run (torchrun and the node wrapper); it must exist at that path on every node.
        Default: this interpreter.
    rdzv_port: the rendezvous port on the head node; None: a free port picked there when the job starts.
    env: the environment of the Slurm commands (SLURM_CONF...); default: this process's.
    """

    name = BACKEND_NAME

    def __init__(
        self,
        job_root: Path | str | None = None,
        settings: Settings | None = None,
        *,
        python: str | None = None,
        rdzv_port: int | None = None,
        env: Mapping[str, str] | None = None,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        cancel_wait_s: float = CANCEL_WAIT_S,
    ) -> None:
        self.settings = settings
        if job_root is None:
            job_root = (settings or Settings()).home / "slurm-jobs"
        self.job_root = Path(job_root)
        self.python = python or sys.executable
        if rdzv_port is not None and not 1 <= rdzv_port <= 65535:
            raise ValueError(f"rdzv_port must be in [1, 65535], got {rdzv_port}")
        self.rdzv_port = rdzv_port
        self.env = dict(env) if env is not None else None
        self.command_timeout_s = command_timeout_s
        self.cancel_wait_s = cancel_wait_s
        self._by_key: dict[str, BackendHandle] = {}
        self._lock = threading.Lock()
        self._accounting: bool | None = None

    # ---- commands ----
    def _run(
        self, argv: Sequence[str], *, timeout: float | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                list(argv),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout or self.command_timeout_s,
                env=self.env,
                check=False,
            )
        except FileNotFoundError as exc:
            raise SlurmUnavailableError(f"slurm: {argv[0]} is not installed or not on PATH") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailableError(
                f"slurm: {' '.join(argv[:2])} did not answer within {exc.timeout:g} s (is slurmctld up?)"
            ) from exc

    @staticmethod
    def _said(proc: subprocess.CompletedProcess[str]) -> str:
        text = " ".join((proc.stderr or proc.stdout or "").split())
        return text[:400] or f"exit code {proc.returncode}"

    def available(self) -> tuple[bool, str]:
        missing = [c for c in COMMANDS if shutil.which(c, path=(self.env or os.environ).get("PATH")) is None]
        if missing:
            return False, f"slurm: {', '.join(missing)} not found on PATH (install slurm-wlm, or use a login node)"
        try:
            proc = self._run(["sinfo", "-h", "-o", "%P|%a|%D|%t"], timeout=10)
        except SlurmUnavailableError as exc:
            return False, str(exc)
        if proc.returncode != 0:
            return False, f"slurm: sinfo failed: {self._said(proc)}"
        parts: dict[str, dict[str, int]] = {}
        avail: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            fields = line.strip().split("|")
            if len(fields) != 4 or not fields[2].isdigit():
                continue
            name, up, count, state = fields
            parts.setdefault(name, {})
            parts[name][state] = parts[name].get(state, 0) + int(count)
            avail[name] = up
        if not parts:
            return False, "slurm: sinfo answered but lists no partition"
        version = self._run(["sinfo", "--version"], timeout=10).stdout.strip() or "slurm"
        described = []
        for name, states in parts.items():
            total = sum(states.values())
            idle = sum(n for s, n in states.items() if s.rstrip("*~#!%$@^-") == "idle")
            described.append(f"{name} ({avail[name]}, {total} node(s), {idle} idle)")
        accounting = "sacct available" if self.accounting() else "no accounting (state from the job's exit record)"
        return True, f"{version}; partitions: {', '.join(described)}; {accounting}"

    def accounting(self) -> bool:
        """Whether Slurm keeps accounting (sacct answers for ended jobs). Asked once."""
        if self._accounting is None:
            try:
                proc = self._run(["scontrol", "show", "config"], timeout=10)
            except SlurmUnavailableError:
                return False
            m = re.search(r"^AccountingStorageType\s*=\s*(\S+)", proc.stdout, re.M)
            self._accounting = m is not None and not m.group(1).endswith("/none")
        return self._accounting

    def partitions(self) -> list[str]:
        """The partitions of the cluster (`sinfo -h -o %P`, the default one without its '*')."""
        proc = self._run(["sinfo", "-h", "-o", "%P"], timeout=10)
        if proc.returncode != 0:
            raise SlurmUnavailableError(f"slurm: sinfo failed: {self._said(proc)}")
        return sorted({line.strip().rstrip("*") for line in proc.stdout.splitlines() if line.strip()})

    def partition_sizes(self) -> tuple[dict[str, tuple[int, int | None]], str | None]:
        """({partition: (its nodes, in any state; the most one job may have, None when unlimited)}, the default
        partition), from `sinfo -h -o %P|%D|%s` (a partition's lines, one per node state, add up)."""
        proc = self._run(["sinfo", "-h", "-o", "%P|%D|%s"], timeout=10)
        if proc.returncode != 0:
            raise SlurmUnavailableError(f"slurm: sinfo failed: {self._said(proc)}")
        sizes: dict[str, tuple[int, int | None]] = {}
        default = None
        for line in proc.stdout.splitlines():
            fields = line.strip().split("|")
            if len(fields) != 3 or not fields[1].isdigit():
                continue
            name = fields[0].rstrip("*")
            if fields[0].endswith("*"):
                default = name
            most = int(fields[2]) if fields[2].isdigit() else None
            count, _ = sizes.get(name, (0, None))
            sizes[name] = (count + int(fields[1]), most)
        return sizes, default

    def never_fits(self, nnodes: int, partition: str | None) -> str | None:
        """Why no partition can ever give a job `nnodes` nodes (more than the partition has, or more than its
        per-job maximum), with the numbers; None when it can, or when Slurm does not say (then it is not judged)."""
        sizes, default = self.partition_sizes()
        name = partition or default
        if name is None or name not in sizes:
            return None
        count, most = sizes[name]
        others = ", ".join(f"{p} has {n}" for p, (n, _) in sorted(sizes.items()) if p != name)
        elsewhere = f" ({others})" if others else ""
        which = f"partition {name}" + ("" if partition else " (the default)")
        if nnodes > count:
            return f"asks {nnodes} nodes; {which} has {count}{elsewhere}: Slurm would keep it PENDING forever"
        if most is not None and nnodes > most:
            return f"asks {nnodes} nodes; {which} allows at most {most} per job (MaxNodes){elsewhere}"
        return None

    def nodes(self, partition: str | None = None) -> list[str]:
        """The nodes sinfo lists as usable (idle, mixed or allocated), in its order; of one partition if given."""
        argv = ["sinfo", "-h", "-N", "-o", "%N|%t"] + (["-p", partition] if partition else [])
        proc = self._run(argv, timeout=10)
        if proc.returncode != 0:
            raise SlurmUnavailableError(f"slurm: sinfo failed: {self._said(proc)}")
        found: list[str] = []
        for line in proc.stdout.splitlines():
            name, _, state = line.strip().partition("|")
            if name and state.rstrip("*~#!%$@^-") in ("idle", "mix", "alloc") and name not in found:
                found.append(name)
        return found

    # ---- plan ----
    def plan(
        self,
        spec: Mapping[str, Any],
        settings: Settings | None = None,
        *,
        job_dir: Path | str | None = None,
        check_partition: bool = True,
    ) -> BackendPlan:
        """The batch script for a validated spec, and `sbatch --parsable SCRIPT`. No side effects (the partition is
        looked up with sinfo when Slurm answers). Without `job_dir`, paths in the job folder read `$JOB_DIR/...`;
        BackendPlan.bind (or submit) fills them in. Any field that does not pass raises ValueError saying what is
        accepted."""
        s = _SpecReader(spec)
        script = s.path("script", required=True)
        args = s.args()
        nnodes = s.integer("nnodes", 1, 1, MAX_NODES)
        nproc = s.integer("nproc_per_node", 1, 1, MAX_NPROC)
        max_restarts = s.integer("max_restarts", 0, 0, 100)
        gpus_per_node = s.gpus_per_node()
        if gpus_per_node and gpus_per_node < nproc:
            raise ValueError(
                f"gpus_per_node: {nproc} ranks per node need {nproc} GPUs each node, and gpus_per_node is "
                f"{gpus_per_node}; accepted: gpus_per_node >= nproc_per_node, or 0 (CPU, gloo)"
            )
        cpus_per_task = s.integer("cpus_per_task", max(1, nproc), 1, 4096)
        max_wall_s = s.number("max_wall_s", DEFAULT_WALL_S, MAX_WALL_S)
        run_id = str(spec.get("run_id") or "run")
        if not RUN_ID_PATTERN.match(run_id):
            raise ValueError(f"run_id: {run_id!r} is not accepted; accepted: {NAME_ACCEPTED} (at most 96)")
        name = s.name("name", default=run_id[:64])
        key = spec.get("idempotency_key")
        if key is not None and not (isinstance(key, str) and KEY_PATTERN.fullmatch(key)):
            raise ValueError(f"idempotency_key: {key!r} is not accepted; accepted: {KEY_ACCEPTED}")
        options = {f: s.option(f) for f in OPTIONAL_FIELDS}
        dependency = s.dependency()
        env = s.env()
        workdir = s.path("workdir", required=False)
        cap = spec.get("max_log_bytes")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise ValueError(f"max_log_bytes: must be a whole number of bytes >= 0, got {cap!r}")

        folder = str(job_dir) if job_dir is not None else JOB_DIR_PLACEHOLDER
        if job_dir is not None:
            check_job_dir(Path(folder))
        notes = self._placement_notes(options["partition"], nnodes, check_partition=check_partition)
        job_env = dict(env)
        job_env[METRICS_ENV] = f"{folder}/metrics.jsonl"
        job_env[CHECKPOINT_ENV] = f"{folder}/checkpoints"
        job_env.setdefault("PYTHONUNBUFFERED", "1")
        job_env.setdefault("OMP_NUM_THREADS", "1")
        if not gpus_per_node:
            job_env["CUDA_VISIBLE_DEVICES"] = ""
        cwd = workdir or f"{folder}/{RUN_DIR_NAME}"
        key_text = key if isinstance(key, str) else KEY_LATER

        directives = _directives(
            name=name,
            nnodes=nnodes,
            cpus_per_task=cpus_per_task,
            max_wall_s=max_wall_s,
            folder=folder,
            key_text=key_text,
            gpus_per_node=gpus_per_node,
            options=options,
            dependency=dependency,
        )
        rendered = self._render(
            directives=directives,
            folder=folder,
            cwd=cwd,
            env=job_env,
            nnodes=nnodes,
            nproc=nproc,
            max_restarts=max_restarts,
            cap=None if cap is None else int(cap) // nnodes,
            script=script,
            args=args,
        )
        notes += self._plan_notes(
            folder=folder,
            nnodes=nnodes,
            nproc=nproc,
            max_wall_s=max_wall_s,
            gpus_per_node=gpus_per_node,
            max_restarts=max_restarts,
            dependency=dependency,
            key_given=key is not None,
            network=spec.get("network"),
        )
        return BackendPlan(
            backend=self.name,
            argv=["sbatch", "--parsable", f"{folder}/{SCRIPT_NAME}"],
            env=job_env,
            cwd=cwd,
            gpus=None,
            nnodes=nnodes,
            nproc_per_node=nproc,
            rendered=rendered,
            notes=notes,
        )

    def _placement_notes(self, partition: str | None, nnodes: int, *, check_partition: bool) -> list[str]:
        """The partition checked against sinfo, and nnodes against the partitions' sizes (ValueError when a job
        could never be placed); notes saying what was not checked."""
        notes: list[str] = []
        if partition is not None and check_partition:
            try:
                known = self.partitions()
            except SlurmUnavailableError as exc:
                notes.append(f"partition {partition!r} was NOT checked: Slurm did not answer ({exc})")
            else:
                if partition not in known:
                    raise ValueError(
                        f"partition: {partition!r} is not a partition of this cluster; accepted: "
                        f"{', '.join(known) or 'none found'}"
                    )
                notes.append(f"partition {partition} (checked with sinfo)")
        if check_partition:  # a job no partition can ever place would wait in the queue for ever: refused here
            try:
                never = self.never_fits(nnodes, partition)
            except SlurmUnavailableError as exc:
                notes.append(
                    f"the partition's size was NOT checked against nnodes {nnodes}: Slurm did not answer ({exc})"
                )
            else:
                if never is not None:
                    raise ValueError(f"nnodes: {never}; accepted: at most the nodes of a partition (sinfo)")
        return notes

    def _plan_notes(
        self,
        *,
        folder: str,
        nnodes: int,
        nproc: int,
        max_wall_s: float,
        gpus_per_node: int,
        max_restarts: int,
        dependency: str | None,
        key_given: bool,
        network: Any,
    ) -> list[str]:
        """What a person should know about the batch job: layout, limits, what the nodes must share, the trust."""
        world = nnodes * nproc
        notes = [
            f"{nnodes} node(s) x {nproc} rank(s) = {world}; per-rank logs as processes rank0..rank{world - 1} (every "
            "node's), the batch output as main, each node's torchrun output as torchrun-node<N>",
            f"time limit {time_minutes(max_wall_s)} min (sbatch --time, max_wall_s rounded up to whole minutes)",
            f"the job folder {folder} must be on a filesystem every node mounts at the same path (logs, metrics, "
            "checkpoints and the exit record are written there by the nodes)",
            f"the nodes run {self.python} (torch installed) and this package from {PACKAGE_ROOT}: both must exist at "
            "those paths on every node",
            "network: multi-node torchrun listens on the cluster network: its rendezvous store on the head node "
            "(a TCPStore, no authentication) and the ranks' collectives; anyone who reaches the nodes can run code as "
            "the job's user. Trust assumption: every machine that reaches the nodes is trusted",
            "environment: sbatch --export=NONE: the job gets Slurm's login environment, PATH and HOME of this "
            "server, and the variables shown, nothing else of this server's environment",
            f"state: Slurm while it knows the job, then the exit record {folder}/{EXIT_RECORD} the batch script "
            "writes at its end (also on cancel and timeout)",
        ]
        if network == "isolated":
            notes.append(
                "LLM_INFRA_MCP_JOB_NETWORK=isolated (a private loopback namespace) applies to local jobs only: a "
                "multi-node job needs the cluster network"
            )
        notes.append(
            f"GPUs: {gpus_per_node} per node (--gpus-per-node; Slurm sets CUDA_VISIBLE_DEVICES)"
            if gpus_per_node
            else "no GPU: CUDA_VISIBLE_DEVICES is empty, the ranks run on CPU (gloo)"
        )
        if max_restarts:
            notes.append(f"torchrun restarts all ranks up to {max_restarts} time(s) after a failure")
        if dependency is not None:
            notes.append(f"starts only after Slurm job {dependency} succeeded (--dependency=afterok:{dependency})")
        if not key_given:
            notes.append("the idempotency key is filled in at submit (--comment)")
        return notes

    def _render(
        self,
        *,
        directives: list[str],
        folder: str,
        cwd: str,
        env: Mapping[str, str],
        nnodes: int,
        nproc: int,
        max_restarts: int,
        cap: int | None,
        script: str,
        args: list[str],
    ) -> str:
        q = shlex.quote
        path_env = (self.env or os.environ).get("PATH", "/usr/local/bin:/usr/bin:/bin")
        home = (self.env or os.environ).get("HOME")
        lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives)]
        lines += [
            "# Rendered by llm-infra-mcp (servers/launch/slurm.py). Every value below is shell-quoted.",
            "set -u",
            f"JOBDIR={q(folder)}",
            f"PY={q(self.python)}",
            f"export PATH={q(path_env)}",
        ]
        if home:
            lines.append(f"export HOME={q(home)}")
        lines += [f"export {k}={q(v)}" for k, v in sorted(env.items())]
        lines += [
            f'LIM=(env PYTHONPATH={q(str(PACKAGE_ROOT))} {HELPER_MARK}=1 "$PY" -m servers.launch.slurm)',
            "",
            f'rm -f "$JOBDIR/{EXIT_RECORD}" "$JOBDIR"/slurm-node*-exit.json',
            "STARTED_AT=$(date +%s)",
            "# How Slurm's commands name this job: its id, or <array id>_<task> for a task of an array (a sweep).",
            "JOB_NAME_ID=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID:-}}",
            "JOB_NAME_ID=${JOB_NAME_ID:-${SLURM_JOB_ID:-}}",
            "srun_pid=",
            "finish() {  # exit code, signal name ('' when none): the exit record, whatever happened",
            "  trap - TERM INT USR1 USR2 HUP",
            '  "${LIM[@]}" exit-record --job-dir "$JOBDIR" --exit-code "$1" --signal "$2" --started-at "$STARTED_AT" '
            '&& exit "$1"',
            "  # The helper could not write it (Python missing on this node...): a plain record, by the shell.",
            '  printf \'{"job_id": "%s", "exit_code": %d, "signal": "%s", "started_at": %s, "ended_at": %s, '
            '"restart_count": %s, "source": "batch-shell"}\\n\' \\',
            '    "$JOB_NAME_ID" "$1" "$2" "$STARTED_AT" "$(date +%s)" "${SLURM_RESTART_COUNT:-0}" '
            f'> "$JOBDIR/.{EXIT_RECORD}.tmp" && mv -f "$JOBDIR/.{EXIT_RECORD}.tmp" "$JOBDIR/{EXIT_RECORD}"',
            '  exit "$1"',
            "}",
            "on_signal() {  # scancel, the time limit, preemption: Slurm sends SIGTERM, then SIGKILL after KillWait",
            '  [ -n "$srun_pid" ] && { kill -TERM "$srun_pid" 2>/dev/null; wait "$srun_pid" 2>/dev/null; }',
            '  finish "$2" "$1"',
            "}",
            "trap 'on_signal TERM 143' TERM; trap 'on_signal INT 130' INT; trap 'on_signal USR1 138' USR1",
            "trap 'on_signal USR2 140' USR2; trap 'on_signal HUP 129' HUP",
            "",
            "# The head node: the first host of the allocation, by its address (NodeAddr).",
            'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            'HEAD_ADDR=$(scontrol show node "$HEAD" -o 2>/dev/null | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)',
            "HEAD_ADDR=${HEAD_ADDR:-$HEAD}",
        ]
        if self.rdzv_port is not None:
            lines.append(f"RDZV_PORT={self.rdzv_port}")
        else:
            lines.append(
                'RDZV_PORT=$("$PY" -c \'import socket; s = socket.socket(); s.bind(("", 0)); '
                "print(s.getsockname()[1])') || finish 1 ''"
            )
        node_args = ["node", "--job-dir", '"$JOBDIR"', "--nproc-per-node", str(nproc)]
        if cap is not None:
            node_args += ["--max-log-bytes", str(cap)]
        torchrun = [
            '"$PY"', "-m", "torch.distributed.run",
            "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", '"$HEAD_ADDR:$RDZV_PORT"',
            "--rdzv-id", '"$SLURM_JOB_ID"',
            "--max-restarts", str(max_restarts),
            "--log-dir", f'"$JOBDIR"/{LOG_DIR_NAME}/{NODE_LOG_DIR}',
            "--redirects", "3",
            q(script),
            *(q(a) for a in args),
        ]  # fmt: skip
        lines += [
            f"cd -- {q(cwd)} || finish 1 ''",
            "",
            "# One task per node: the node wrapper runs torchrun there, mirroring its ranks' logs into the job folder.",
            f"srun --export=ALL --kill-on-bad-exit=1 --nodes={nnodes} --ntasks-per-node=1 \\",
            '  "${LIM[@]}" ' + " ".join(node_args) + " -- \\",
            "  " + " ".join(torchrun) + " &",
            "srun_pid=$!",
            'wait "$srun_pid"',
            "finish $? ''",
            "",
        ]
        return "\n".join(lines)

    # ---- submit ----
    def submit(self, plan: BackendPlan, request: SubmitRequest, *, job_dir: Path | str | None = None) -> BackendHandle:
        """sbatch the plan's script; the same key returns the first job and starts nothing.

        The job folder: `job_dir`, else the folder the plan was bound to, else job_root/<name from the key>. The first
        submit with a key writes the script and slurm-submit.json there; a retry finds the job by that record, by the
        exit record the job wrote, or by its --comment in squeue. A submit interrupted between sbatch and its record
        whose job cannot be found is refused rather than repeated (it may have run)."""
        key = request.key
        if not KEY_PATTERN.fullmatch(key):
            raise ValueError(f"key: {key!r} is not accepted; accepted: {KEY_ACCEPTED}")
        if plan.backend != self.name or plan.rendered is None:
            raise ValueError(f"plan: made by the {plan.backend!r} backend; accepted: a plan of SlurmBackend.plan")
        folder = self._job_dir_for(plan, key, job_dir)
        bound = plan.bind(folder) if JOB_DIR_PLACEHOLDER in (plan.rendered or "") else plan
        if bound.argv != ["sbatch", "--parsable", str(folder / SCRIPT_NAME)]:
            raise ValueError("plan: its command is not `sbatch --parsable JOB/slurm-job.sh`; make the plan again")
        rendered = _with_key(bound.rendered or "", key)
        with self._lock:
            if key in self._by_key:
                return self._by_key[key]
            folder.mkdir(parents=True, exist_ok=True)
            with _locked(folder / ".submit.lock"):
                handle = self._find_submitted(folder, key) or self._sbatch(bound, rendered, folder, key)
            self._by_key[key] = handle
            return handle

    def _job_dir_for(self, plan: BackendPlan, key: str, job_dir: Path | str | None) -> Path:
        from_plan = None
        if JOB_DIR_PLACEHOLDER not in (plan.rendered or "") and plan.env.get(METRICS_ENV):
            from_plan = Path(plan.env[METRICS_ENV]).parent
        if job_dir is not None:
            folder = Path(job_dir)
            if from_plan is not None and from_plan != folder:
                raise ValueError(f"job_dir: the plan is bound to {from_plan}, not {folder}")
        else:
            folder = from_plan or self.job_root / job_folder_name(key)
        check_job_dir(folder)
        return folder

    def _find_submitted(self, folder: Path, key: str, *, refuse_unsure: bool = True) -> BackendHandle | None:
        record = read_json(folder / SUBMIT_RECORD, 64 * 1024)
        if isinstance(record, dict):
            if record.get("key") != key:
                raise ValueError(f"job_dir: {folder} holds the job of another key; accepted: a folder of its own")
            job_id = record.get("job_id")
            if isinstance(job_id, str) and JOB_ID_PATTERN.fullmatch(job_id):
                return self._handle(key, job_id, folder)
        exit_record = read_json(folder / EXIT_RECORD, 1024 * 1024)
        if isinstance(exit_record, dict) and JOB_ID_PATTERN.fullmatch(str(exit_record.get("job_id", ""))):
            return self._recorded(folder, key, str(exit_record["job_id"]), "found by its exit record")
        job_id = self.find_by_comment(key)
        if job_id is not None:
            return self._recorded(folder, key, job_id, "found by its --comment in squeue")
        if refuse_unsure and isinstance(record, dict) and record.get("state") == "submitting":
            raise RuntimeError(
                f"a submit with key {key!r} began at {record.get('at')} and may have reached Slurm, but no job with "
                f"--comment {COMMENT_PREFIX}{key} is visible and it left no exit record in {folder}; it is not "
                "submitted again automatically: check squeue/sacct, then submit with a new key"
            )
        return None

    def _recorded(self, folder: Path, key: str, job_id: str, how: str) -> BackendHandle:
        atomic_write_json(folder / SUBMIT_RECORD, {"key": key, "job_id": job_id, "at": time.time(), "how": how})
        return self._handle(key, job_id, folder)

    def _handle(self, key: str, job_id: str, folder: Path) -> BackendHandle:
        return BackendHandle(backend=self.name, key=key, native_id=job_id, job_dir=str(folder))

    def find_by_comment(self, key: str, *, array: bool = False) -> str | None:
        """The id of this user's job whose --comment carries `key`, if squeue still knows one; with `array`, the
        array job id of an array's (squeue's %F)."""
        column, pattern = ("%F", SUBMITTED_ID_PATTERN) if array else ("%i", JOB_ID_PATTERN)
        proc = self._run(["squeue", "-h", "-u", str(os.getuid()), "-t", "all", "-o", f"{column}|%k"])
        if proc.returncode != 0:
            raise SlurmUnavailableError(f"slurm: squeue failed: {self._said(proc)}")
        wanted = f"{COMMENT_PREFIX}{key}"
        for line in proc.stdout.splitlines():
            job_id, _, comment = line.strip().partition("|")
            if comment.strip() == wanted and pattern.fullmatch(job_id):
                return job_id
        return None

    def _sbatch(self, plan: BackendPlan, rendered: str, folder: Path, key: str) -> BackendHandle:
        self._write_script(folder, rendered, plan)
        atomic_write_json(folder / SUBMIT_RECORD, {"key": key, "state": "submitting", "at": time.time()})
        try:
            proc = self._run(plan.argv, cwd=folder)  # the job's WorkDir: the shared job folder
        except SlurmUnavailableError as exc:
            if "not installed" in str(exc):
                (folder / SUBMIT_RECORD).unlink(missing_ok=True)  # nothing ran: a retry may submit
            raise
        job_id = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else ""
        if not SUBMITTED_ID_PATTERN.fullmatch(job_id):
            (folder / SUBMIT_RECORD).unlink(missing_ok=True)  # sbatch refused it: nothing was submitted
            raise RuntimeError(f"sbatch refused the job: {self._said(proc)}")
        return self._recorded(folder, key, job_id, "submitted")

    # ---- a sweep as one job array ----
    def plan_array(self, runs: Sequence[tuple[Path | str, str]], *, sweep_key: str, sweep_dir: Path | str) -> str:
        """The array script of a sweep, without side effects (render_array)."""
        return render_array(runs, sweep_key=sweep_key, sweep_dir=sweep_dir)

    def submit_array(self, runs: Sequence[ArrayRun], *, sweep_key: str, sweep_dir: Path | str) -> list[BackendHandle]:
        """One `sbatch --array=0-(N-1)` for the runs of a sweep: task i runs run i's own batch script in run i's
        job folder (its logs, metrics and exit record there, exactly as a job of its own); each run is then the
        Slurm job "<array id>_<i>". Idempotent by `sweep_key`: the array's submit record in `sweep_dir` (and the
        array's --comment in squeue) finds the array a retry already submitted; a run folder without its submit
        record gets it. Every run must ask for the same resources (a sweep varies arguments only)."""
        if not runs:
            raise ValueError("runs: a job array needs at least one run")
        if not KEY_PATTERN.fullmatch(sweep_key):
            raise ValueError(f"sweep_key: {sweep_key!r} is not accepted; accepted: {KEY_ACCEPTED}")
        folder = Path(sweep_dir)
        check_job_dir(folder)
        scripts: list[tuple[Path, str, str, BackendPlan]] = []  # (run folder, key, rendered script, bound plan)
        for run in runs:
            if not KEY_PATTERN.fullmatch(run.key):
                raise ValueError(f"key: {run.key!r} is not accepted; accepted: {KEY_ACCEPTED}")
            if run.plan.backend != self.name or run.plan.rendered is None:
                raise ValueError(f"plan: made by the {run.plan.backend!r} backend; accepted: SlurmBackend.plan's")
            run_dir = Path(run.job_dir)
            check_job_dir(run_dir)
            bound = run.plan.bind(run_dir) if JOB_DIR_PLACEHOLDER in run.plan.rendered else run.plan
            scripts.append((run_dir, run.key, _with_key(bound.rendered or "", run.key), bound))
        rendered = render_array(
            [(d, text) for d, _, text, _ in scripts], sweep_key=sweep_key, sweep_dir=folder
        )  # ValueError when the runs differ in resources
        folder.mkdir(parents=True, exist_ok=True)
        with self._lock, _locked(folder / ".submit.lock"):
            array_id = self._array_submitted(folder, sweep_key)
            if array_id is None:
                for run_dir, key, text, bound in scripts:
                    self._write_script(run_dir, text, bound)
                    atomic_write_json(run_dir / SUBMIT_RECORD, {"key": key, "state": "in-array", "array": sweep_key})
                array_id = self._sbatch_array(folder, rendered, sweep_key)
            handles = []
            for i, (run_dir, key, _, _) in enumerate(scripts):
                record = read_json(run_dir / SUBMIT_RECORD, 64 * 1024)
                task_id = f"{array_id}_{i}"
                if not (isinstance(record, dict) and record.get("key") == key and record.get("job_id") == task_id):
                    atomic_write_json(
                        run_dir / SUBMIT_RECORD,
                        {"key": key, "job_id": task_id, "at": time.time(), "how": f"task {i} of array {array_id}"},
                    )
                handle = self._handle(key, task_id, run_dir)
                self._by_key[key] = handle
                handles.append(handle)
            return handles

    def find_recorded(self, key: str, job_dir: Path | str) -> BackendHandle | None:
        """The job of `key` by its submit record in `job_dir` alone (no Slurm command): what a run of a job array
        waits for while the sweep's array is being submitted."""
        folder = Path(job_dir)
        record = read_json(folder / SUBMIT_RECORD, 64 * 1024)
        if isinstance(record, dict) and record.get("key") == key:
            job_id = record.get("job_id")
            if isinstance(job_id, str) and JOB_ID_PATTERN.fullmatch(job_id):
                return self._handle(key, job_id, folder)
        return None

    def _array_submitted(self, folder: Path, sweep_key: str) -> str | None:
        record = read_json(folder / ARRAY_RECORD, 64 * 1024)
        if isinstance(record, dict):
            if record.get("key") != sweep_key:
                raise ValueError(f"sweep_dir: {folder} holds the array of another sweep; accepted: one of its own")
            job_id = record.get("job_id")
            if isinstance(job_id, str) and SUBMITTED_ID_PATTERN.fullmatch(job_id):
                return job_id
        found = self.find_by_comment(sweep_key, array=True)
        if found is not None:
            atomic_write_json(folder / ARRAY_RECORD, {"key": sweep_key, "job_id": found, "at": time.time()})
            return found
        if isinstance(record, dict) and record.get("state") == "submitting":
            raise RuntimeError(
                f"the job array of {sweep_key!r} was being submitted at {record.get('at')} and may have reached Slurm, "
                f"but no array with --comment {COMMENT_PREFIX}{sweep_key} is visible; it is not submitted again "
                "automatically: check squeue/sacct, then plan the sweep anew"
            )
        return None

    def _write_script(self, folder: Path, rendered: str, plan: BackendPlan) -> None:
        for sub in ("logs", RUN_DIR_NAME, LOG_DIR_NAME, "checkpoints"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        Path(plan.cwd).mkdir(parents=True, exist_ok=True)
        _write_executable(folder / SCRIPT_NAME, rendered)

    def _sbatch_array(self, folder: Path, rendered: str, sweep_key: str) -> str:
        (folder / "logs").mkdir(exist_ok=True)
        script = _write_executable(folder / ARRAY_SCRIPT, rendered)
        atomic_write_json(folder / ARRAY_RECORD, {"key": sweep_key, "state": "submitting", "at": time.time()})
        try:
            proc = self._run(["sbatch", "--parsable", str(script)], cwd=folder)
        except SlurmUnavailableError as exc:
            if "not installed" in str(exc):
                (folder / ARRAY_RECORD).unlink(missing_ok=True)
            raise
        job_id = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else ""
        if not SUBMITTED_ID_PATTERN.fullmatch(job_id):
            (folder / ARRAY_RECORD).unlink(missing_ok=True)  # refused: nothing was submitted
            raise RuntimeError(f"sbatch refused the job array: {self._said(proc)}")
        atomic_write_json(folder / ARRAY_RECORD, {"key": sweep_key, "job_id": job_id, "at": time.time()})
        return job_id

    # ---- state ----
    def query(self, job_id: str) -> SlurmJob | None:
        """What Slurm's controller says of the job now (scontrol, else squeue --json); None when it no longer knows
        it. SlurmUnavailableError when it cannot be asked."""
        proc = self._run(["scontrol", "show", "job", "-o", job_id])
        if proc.returncode == 0:
            found = parse_scontrol_job(proc.stdout)
            if found is not None and found.job_id == job_id:
                return found
        elif "Invalid job id" in (proc.stderr + proc.stdout) or f"Job {job_id} not found" in proc.stdout + proc.stderr:
            return None  # (the second: how 22.05 answers for an array task it no longer knows)
        listed = self._run(["squeue", "--json", "--jobs", job_id])
        if listed.returncode != 0:
            if "Invalid job id" in (listed.stderr + listed.stdout):
                return None
            raise SlurmUnavailableError(f"slurm: scontrol and squeue failed: {self._said(proc)}; {self._said(listed)}")
        return next((j for j in parse_squeue_json(listed.stdout) if j.job_id == job_id), None)

    def query_sacct(self, job_id: str) -> SlurmJob | None:
        if not self.accounting():
            return None
        proc = self._run(
            ["sacct", "-j", job_id, "-X", "--parsable2", "--noheader", "-o", "JobID,State,ExitCode,Start,End,Reason"]
        )
        return parse_sacct(proc.stdout, job_id) if proc.returncode == 0 else None

    def status(self, handle: BackendHandle) -> EngineStatus:
        job_id = handle.native_id
        folder = Path(handle.job_dir) if handle.job_dir else None
        record = exit_record(folder) if folder else None
        try:
            job = self.query(job_id)
        except SlurmUnavailableError as exc:
            if record is None:
                raise
            return from_record(record, None, note=f"from the job's exit record; Slurm did not answer ({exc})")
        if job is not None:
            if record is not None and job.state == "COMPLETING" and record_is_current(record, job):
                return from_record(record, job)  # the batch script has ended; Slurm is still cleaning up
            # While Slurm says RUNNING the record is not believed: the job's own processes can write its folder
            # (a script that writes slurm-exit.json and runs on must not end as SUCCEEDED).
            status = from_slurm(job, record)
            if status.state.terminal and folder is not None:
                _remember(folder, job)
            return status
        job = self.query_sacct(job_id)
        if job is not None:
            return from_slurm(job, record)
        remembered = _remembered(folder, job_id) if folder else None
        if remembered is not None and (record is None or record_is_current(record, remembered)):
            return from_slurm(remembered, record)
        if record is not None:
            return from_record(record, None)
        cancel = read_json(folder / CANCEL_RECORD, 64 * 1024) if folder else None
        if isinstance(cancel, dict):
            return EngineStatus(
                state=JobState.CANCELLED,
                native_state="CANCELLED",
                reason="cancelled through llm-infra-mcp before it started: Slurm no longer knows the job and it "
                "left no exit record, so its batch script never ran",
                ended_at=_float(cancel.get("at")),
            )
        where = f" in {folder}" if folder else ""
        accounting = "sacct has no record of it" if self.accounting() else "there is no accounting (sacct)"
        return EngineStatus(
            state=JobState.LOST,
            native_state=None,
            reason=f"Slurm no longer knows job {job_id} (a finished job leaves after MinJobAge), {accounting}, and "
            f"the job left no exit record{where}: it was killed before it could write one (SIGKILL, a node failure) "
            "or never ran; its outcome is unknown",
        )

    def cancel(self, handle: BackendHandle) -> JobState:
        """scancel the job (idempotent) and wait up to cancel_wait_s for it to end; the state after."""
        status = self.status(handle)
        if status.state.terminal:
            return status.state
        if handle.job_dir:
            with contextlib.suppress(OSError):
                atomic_write_json(Path(handle.job_dir) / CANCEL_RECORD, {"job_id": handle.native_id, "at": time.time()})
        proc = self._run(["scancel", handle.native_id])
        if proc.returncode != 0 and "Invalid job id" not in (proc.stderr + proc.stdout):
            raise SlurmUnavailableError(f"slurm: scancel failed: {self._said(proc)}")
        deadline = time.monotonic() + self.cancel_wait_s
        while True:
            state = self.status(handle).state
            if state.terminal or time.monotonic() >= deadline:
                return state
            time.sleep(POLL_S)


def _directives(
    *,
    name: str,
    nnodes: int,
    cpus_per_task: int,
    max_wall_s: float,
    folder: str,
    key_text: str,
    gpus_per_node: int,
    options: Mapping[str, str | None],
    dependency: str | None,
) -> list[str]:
    """The batch script's #SBATCH options, each value checked already."""
    directives = [
        f"--job-name={name}",
        f"--nodes={nnodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus_per_task}",
        f"--time={time_minutes(max_wall_s)}",
        f"--output={folder}/logs/batch.log",
        f"--error={folder}/logs/batch.log",
        "--open-mode=append",
        "--export=NONE",
        f"--comment={COMMENT_PREFIX}{key_text}",
    ]
    if gpus_per_node:
        directives.append(f"--gpus-per-node={gpus_per_node}")
    for field in OPTIONAL_FIELDS:
        if options[field] is not None:
            directives.append(f"--{field}={options[field]}")
    if dependency is not None:
        directives.append(f"--dependency=afterok:{dependency}")
    return directives


# ---- spec reading ----------------------------------------------------------------------------------------------------
class _SpecReader:
    """Strict readers of the spec's fields; each ValueError names the field and what is accepted."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec
        self.options = given_options(spec, "slurm")  # partition, account...: SlurmOptions' names

    def integer(self, field: str, default: int, low: int, high: int) -> int:
        value = self.spec.get(field)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{field}: {value!r} is not accepted; accepted: a whole number in [{low}, {high}]")
        return value

    def number(self, field: str, default: float, high: float) -> float:
        value = self.spec.get(field)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= high:
            raise ValueError(f"{field}: {value!r} is not accepted; accepted: seconds in (0, {high:g}]")
        return float(value)

    def gpus_per_node(self) -> int:
        per_node = self.integer("gpus_per_node", 0, 0, 64) if self.spec.get("gpus_per_node") is not None else None
        wanted = self.integer("gpus_wanted", 0, 0, 64) if self.spec.get("gpus_wanted") is not None else None
        if per_node is not None and wanted is not None and per_node != wanted:
            raise ValueError(f"gpus_wanted: {wanted} disagrees with gpus_per_node {per_node}; accepted: equal values")
        per_node = per_node if per_node is not None else wanted
        gpus = self.spec.get("gpus")
        if isinstance(gpus, list):
            count: int | None = len(gpus) if gpus else None
        elif gpus is None or (isinstance(gpus, int) and not isinstance(gpus, bool) and 0 <= gpus <= 64):
            count = gpus
        else:
            raise ValueError(f"gpus: {gpus!r} is not accepted; accepted: GPUs per node, a whole number in [0, 64]")
        if per_node is not None and count not in (None, per_node):
            raise ValueError(f"gpus: {count} disagrees with gpus_per_node {per_node}; accepted: one of them, or equal")
        return per_node if per_node is not None else (count or 0)

    def name(self, field: str, default: str) -> str:
        value = self.spec.get(field)
        if value is None or value == "":
            value = default if NAME_PATTERN.fullmatch(default) else "llm-infra-mcp"
        if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
            raise ValueError(
                f"{field}: {value!r} is not accepted as a Slurm job name (no spaces, newlines, '=' or leading '-': it "
                f"goes into an #SBATCH line); accepted: {NAME_ACCEPTED}"
            )
        return value

    def option(self, field: str) -> str | None:
        value = self.options.get(field)
        if value is None or value == "":
            return None
        pattern, accepted = {
            "constraint": (CONSTRAINT_PATTERN, CONSTRAINT_ACCEPTED),
            "exclude": (NODELIST_PATTERN, NODELIST_ACCEPTED),
            "nodelist": (NODELIST_PATTERN, NODELIST_ACCEPTED),
        }.get(field, (NAME_PATTERN, NAME_ACCEPTED))
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValueError(
                f"{field}: {value!r} is not accepted (it goes into an #SBATCH line: no spaces, newlines, '=' or "
                f"leading '-'); accepted: {accepted}"
            )
        return value

    def dependency(self) -> str | None:
        value = self.options.get("dependency")
        if value is None or value == "":
            return None
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not JOB_ID_PATTERN.fullmatch(text):
            raise ValueError(
                f"dependency: {value!r} is not accepted; accepted: one Slurm job id (digits), which must succeed "
                "first (--dependency=afterok:ID)"
            )
        return text

    def path(self, field: str, *, required: bool) -> str | None:
        value = self.spec.get(field)
        if value is None or value == "":
            if required:
                raise ValueError(f"{field}: missing; accepted: an absolute path")
            return None
        if not isinstance(value, str | os.PathLike):
            raise ValueError(f"{field}: {value!r} is not accepted; accepted: an absolute path")
        text = str(value)
        if CONTROL.search(text) or not (text.startswith("/") or text.startswith(JOB_DIR_PLACEHOLDER)):
            raise ValueError(
                f"{field}: {text!r} is not accepted; accepted: an absolute path without control characters"
            )
        return text

    def args(self) -> list[str]:
        args = self.spec.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError("args: must be a list of strings")
        for a in args:
            problem = None
            if CONTROL.search(a):
                problem = "contains a newline or another control character"
            elif "#SBATCH" in a.upper():
                problem = "contains an #SBATCH directive"
            elif any(a == opt or a.startswith(opt + "=") for opt in SMUGGLED_OPTIONS):
                problem = "is an sbatch/srun option"
            if problem:
                raise ValueError(
                    f"args: {a!r} {problem}; accepted: the training script's own arguments (passed to it shell-quoted, "
                    "after the script); the batch script's options come only from the spec's fields "
                    f"({', '.join(SMUGGLED_OPTIONS)}, newlines and #SBATCH are refused)"
                )
        return list(args)

    def env(self) -> dict[str, str]:
        env = self.spec.get("env") or {}
        if not isinstance(env, dict):
            raise ValueError("env: must map names to string values")
        problems = []
        for k, v in env.items():
            if not isinstance(k, str) or not isinstance(v, str):
                problems.append(f"env: {k!r} must map a name to a string")
                continue
            why = "not a valid name" if not ENV_NAME_PATTERN.fullmatch(k) else env_refusal(k, v)
            if k.startswith("SLURM_"):
                why = "Slurm's own variables are set by Slurm"
            if why is None and CONTROL.search(v):
                why = "its value contains a newline or another control character"
            if why is not None:
                problems.append(f"env: {k!r} may not be set: {why}")
        if problems:
            raise ValueError("; ".join(problems) + "; accepted: see envpolicy.env_refusal (NCCL_*, TORCH_*, GLOO_*...)")
        return dict(env)


def sbatch_options(rendered: str) -> list[str]:
    """The #SBATCH options of a rendered batch script, in order."""
    return [line[len("#SBATCH ") :].strip() for line in rendered.splitlines() if line.startswith("#SBATCH ")]


def render_array(runs: Sequence[tuple[Path | str, str]], *, sweep_key: str, sweep_dir: Path | str) -> str:
    """The array script of a sweep: `runs` are (run folder, that run's rendered batch script). The array asks for
    the resources every run asks for (they must be the same: ValueError naming the difference otherwise); task i
    appends its output to run i's logs/batch.log and runs run i's script, which writes run i's exit record."""
    q = shlex.quote
    shared: list[str] | None = None
    for i, (_, text) in enumerate(runs):
        options = [o for o in sbatch_options(text) if not o.startswith(PER_RUN_OPTIONS)]
        if shared is None:
            shared = options
        elif options != shared:
            differ = sorted(set(options) ^ set(shared))
            raise ValueError(
                f"run {i} asks for other resources than run 0 ({', '.join(differ)}); a job array runs tasks of one "
                "shape: sweep arguments only"
            )
    folder = str(sweep_dir)
    name = sweep_key[:64]
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --array=0-{len(runs) - 1}",
        *(f"#SBATCH {o}" for o in shared or []),
        f"#SBATCH --output={folder}/logs/array-%a.log",
        f"#SBATCH --error={folder}/logs/array-%a.log",
        "#SBATCH --open-mode=append",
        "#SBATCH --export=NONE",
        f"#SBATCH --comment={COMMENT_PREFIX}{sweep_key}",
        "# Rendered by llm-infra-mcp (servers/launch/slurm.py): task i of the array runs run i's own batch script",
        "# (shown in that run's plan) in run i's job folder, where its logs, metrics and exit record go.",
        "set -u",
        'case "${SLURM_ARRAY_TASK_ID:-}" in',
        *(f"  {i}) RUN={q(str(run_dir))} ;;" for i, (run_dir, _) in enumerate(runs)),
        '  *) echo "no run for array task ${SLURM_ARRAY_TASK_ID:-(unset)}" >&2; exit 1 ;;',
        "esac",
        'exec >>"$RUN/logs/batch.log" 2>&1',
        f'exec /bin/bash "$RUN/{SCRIPT_NAME}"',
        "",
    ]
    return "\n".join(lines)


def _write_executable(path: Path, text: str) -> Path:
    """`text` as an executable file (0700), whole or not at all (a temporary file renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o700)
    os.replace(tmp, path)
    return path


def check_job_dir(folder: Path) -> None:
    """A job folder this backend can name in #SBATCH lines: absolute, only safe characters."""
    if not SAFE_PATH_PATTERN.fullmatch(str(folder)):
        raise ValueError(
            f"job_dir: {str(folder)!r} cannot be used in an #SBATCH line (sbatch splits at spaces and expands '%'); "
            "accepted: an absolute path of letters, digits, '_', '.', '/', '+' and '-' (choose another job_root)"
        )


def _with_key(rendered: str, key: str) -> str:
    """The script with the key in its --comment (filled in here when the plan was made without one)."""
    line = f"#SBATCH --comment={COMMENT_PREFIX}{key}\n"
    rendered = rendered.replace(f"#SBATCH --comment={COMMENT_PREFIX}{KEY_LATER}\n", line)
    if line not in rendered:
        raise ValueError(f"key: the plan was made for another idempotency key than {key!r}; make the plan again")
    return rendered


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (two servers submitting the same key)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- from what Slurm says / what the job wrote to EngineStatus -------------------------------------------------------
def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any, limit: int = 2000) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def exit_record(folder: Path) -> dict[str, Any] | None:
    """The job's slurm-exit.json, when it is there and of the expected shape."""
    data = read_json(folder / EXIT_RECORD, 1024 * 1024)
    if not isinstance(data, dict) or _int(data.get("exit_code")) is None:
        return None
    return data


def record_is_current(record: Mapping[str, Any], job: SlurmJob) -> bool:
    """Whether the record is of this run of the job (not of one before a requeue)."""
    return str(record.get("job_id")) == job.job_id and (_int(record.get("restart_count")) or 0) == job.restarts


def record_state(record: Mapping[str, Any]) -> str:
    """Slurm's state name for what the record says."""
    state = record.get("state")
    if isinstance(state, str) and state.upper() in SLURM_STATES:
        return state.upper()
    if record.get("signal"):
        return "CANCELLED"
    return "COMPLETED" if record.get("exit_code") == 0 else "FAILED"


def _ended_reason(native: str, job: SlurmJob | None, record: Mapping[str, Any] | None) -> str | None:
    detail = _text(record.get("reason")) if record else None
    if native == "COMPLETED":
        return None
    if native == "CANCELLED":
        who = _text(record.get("cancelled_by")) if record else None
        base = "cancelled" + (f" ({who})" if who else "")
        return base + (f"; {detail}" if detail and detail != base else "")
    if native == "FAILED":
        if detail:
            return detail
        code = job.exit_code if job else _int(record.get("exit_code")) if record else None
        said = f" ({job.reason})" if job and job.reason else ""
        return f"the batch script exited with code {code}{said}; see read_job_logs for process main"
    words = ENDED_WORDS.get(native, f"Slurm ended it in state {native}")
    limit = f" (time limit {job.time_limit})" if job and job.time_limit and native == "TIMEOUT" else ""
    failing = record is not None and record.get("rank") is not None
    return f"{native}: {words}{limit}" + (f"; {detail}" if detail and failing else "")


def from_slurm(job: SlurmJob, record: Mapping[str, Any] | None) -> EngineStatus:
    native = job.state
    state = map_state(SLURM_STATES, native)
    current = record if record is not None and record_is_current(record, job) else None
    if state == JobState.QUEUED:
        reason = job.reason or "waiting"
        words = PENDING_WORDS.get(reason.split(",")[0].strip("()"))
        text = f"{native}: {reason}" + (f" ({words})" if words else "")
    elif state.terminal:
        text = _ended_reason(native, job, current)
    elif state == JobState.LOST:
        text = f"Slurm reports state {native!r}, which this backend does not know; not guessed"
    else:
        text = None
    return EngineStatus(
        state=state,
        native_state=native,
        reason=text,
        exit_code=job.exit_code if state.terminal else None,
        started_at=job.started_at,
        ended_at=job.ended_at if state.terminal else None,
        restarts=job.restarts,
    )


def from_record(record: Mapping[str, Any], job: SlurmJob | None, note: str | None = None) -> EngineStatus:
    native = record_state(record)
    state = map_state(SLURM_STATES, native)
    reason = _ended_reason(native, job, record)
    if job is None:
        note = note or "from the job's exit record (Slurm no longer knows the job)"
        reason = (reason + "; " if reason else "") + note
    return EngineStatus(
        state=state,
        native_state=native,
        reason=reason,
        exit_code=_int(record.get("exit_code")),
        started_at=_float(record.get("started_at")) or (job.started_at if job else None),
        ended_at=_float(record.get("ended_at")),
        restarts=_int(record.get("restart_count")) or 0,
    )


def _remember(folder: Path, job: SlurmJob) -> None:
    """Keep what Slurm said of the ended job, for after it forgets it."""
    path = folder / STATE_RECORD
    if path.exists():
        return
    with contextlib.suppress(OSError):
        atomic_write_json(path, {**job.__dict__, "observed_at": time.time()})


def _remembered(folder: Path, job_id: str) -> SlurmJob | None:
    data = read_json(folder / STATE_RECORD, 64 * 1024)
    if not isinstance(data, dict) or data.get("job_id") != job_id or data.get("state") not in SLURM_STATES:
        return None
    return SlurmJob(
        job_id=job_id,
        state=str(data["state"]),
        reason=_text(data.get("reason"), 200),
        exit_code=_int(data.get("exit_code")),
        exit_signal=_int(data.get("exit_signal")),
        started_at=_float(data.get("started_at")),
        ended_at=_float(data.get("ended_at")),
        restarts=_int(data.get("restarts")) or 0,
        time_limit=_text(data.get("time_limit"), 64),
    )


# ---- on the nodes: the node wrapper and the exit record --------------------------------------------------------------
def worker_ranks(parent_pid: int) -> dict[tuple[int, int], int]:
    """{(attempt, local rank): global rank} of torchrun's worker processes, read from their environment (Linux)."""
    found: dict[tuple[int, int], int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        if process_parent(int(entry)) != parent_pid:
            continue
        env = process_environ(int(entry))
        if env is None:
            continue
        try:
            local, rank = int(env["LOCAL_RANK"]), int(env["RANK"])
            attempt = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
        except (KeyError, ValueError):
            continue
        found[(attempt, local)] = rank
    return found


class NodeRankMirror(RankLogMirror):
    """torchrun.py's mirror for one node of many: a local rank's output goes to the log of its global rank, which the
    c10d rendezvous decides (`learn` reads it from the workers). Output of a rank not yet known waits; at the end an
    unknown one is named from the other ranks of its attempt, else node * nproc + local rank."""

    def __init__(
        self, log_dir: Path, log_path: Callable[[str], Path], node: int, nproc: int, cap_bytes: int | None = None
    ) -> None:
        super().__init__(log_dir, log_path, cap_bytes=cap_bytes)
        self.node = node
        self.nproc = nproc
        self.ranks: dict[tuple[int, int], int] = {}

    def learn(self, torchrun_pid: int) -> None:
        """Read the global ranks of torchrun's workers, while some rank folder's is not known (scanning /proc costs)."""
        if all((attempt, local) in self.ranks for attempt, local, _ in self.rank_dirs()):
            return
        self.ranks.update(worker_ranks(torchrun_pid))

    def rank_of(self, attempt: int, local: int, *, guess: bool) -> int | None:
        if (attempt, local) in self.ranks:
            return self.ranks[(attempt, local)]
        if not guess:
            return None
        same = [g - lr for (a, lr), g in self.ranks.items() if a == attempt]
        if same:
            return same[0] + local
        earlier = [g for (a, lr), g in sorted(self.ranks.items()) if lr == local]
        return earlier[-1] if earlier else self.node * self.nproc + local


def node_failure(returncode: int, log_dir: Path, output: Path, mirror: NodeRankMirror) -> tuple[str, int | None]:
    """torchrun.py's describe_failure of this node's torchrun, with the rank named by its global rank."""
    text = describe_failure(returncode, log_dir, output)
    cause = find_root_cause(log_dir, output)
    if cause is None or cause.rank is None:
        return text, None
    block = parse_root_cause_block(tail_text(output)) or {}
    local = cause.rank
    rank = block.get("rank") if isinstance(block.get("rank"), int) and block.get("local_rank") == local else None
    if rank is None:
        rank = mirror.rank_of(cause.attempt or 0, local, guess=True)
    prefix = f"rank {local} failed"
    if rank is not None and rank != local:
        if text.startswith(prefix):
            text = f"rank {rank} failed" + text[len(prefix) :]
            text = text.replace(f"process rank{local}", f"process rank{rank}")
        else:
            text += f" (global rank {rank})"
    return f"{text} (node {mirror.node})", rank


def run_node(job_dir: Path, nproc: int, argv: list[str], max_log_bytes: int | None = None) -> int:
    """One node's part of the job (runs under srun): torchrun, its ranks' logs mirrored, the node's exit record."""
    node = int(os.environ.get("SLURM_NODEID", "0"))
    argv = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--log-dir" and argv[i + 1].endswith("/" + NODE_LOG_DIR):
            argv[i + 1] = argv[i + 1][: -len(NODE_LOG_DIR)] + f"node{node}"
            break
    log_dir = Path(argv[argv.index("--log-dir") + 1]) if "--log-dir" in argv else job_dir / LOG_DIR_NAME
    log_dir.mkdir(parents=True, exist_ok=True)
    files = JobFiles(job_dir)
    files.logs_dir.mkdir(parents=True, exist_ok=True)
    output = files.log(f"torchrun-node{node}")
    env = dict(os.environ)
    if env.pop(HELPER_MARK, None) is not None:
        env.pop("PYTHONPATH", None)  # set only to import this helper; the job sees its own environment
    mirror = NodeRankMirror(log_dir, files.log, node, nproc, cap_bytes=max_log_bytes)

    stopped: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopped.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    with open(output, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
    forwarded = False
    stop_deadline = None
    while True:
        try:
            returncode = proc.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if stopped and not forwarded:
            forwarded = True
            stop_deadline = time.monotonic() + 20.0
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        if stop_deadline is not None and time.monotonic() > stop_deadline:
            proc.kill()
        with contextlib.suppress(OSError):
            mirror.learn(proc.pid)
            mirror.sync()
    with contextlib.suppress(OSError):
        mirror.sync(final=True)
    reason, rank = (None, None)
    if returncode != 0 and not stopped:
        reason, rank = node_failure(returncode, log_dir, output, mirror)
    atomic_write_json(
        job_dir / NODE_RECORD.format(node=node),
        {
            "node": node,
            "host": socket.gethostname(),
            "exit_code": returncode,
            "signal": signal.Signals(stopped[0]).name if stopped else None,
            "reason": reason,
            "rank": rank,
            "ranks": {f"{a}:{lr}": g for (a, lr), g in sorted(mirror.ranks.items())},
            "ended_at": time.time(),
            "logs_cut": sorted(mirror.cut),
        },
    )
    return returncode if returncode >= 0 else 128 - returncode


def _node_records(job_dir: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(job_dir.glob("slurm-node*-exit.json")):
        data = read_json(path, 1024 * 1024)
        if isinstance(data, dict) and _int(data.get("node")) is not None:
            records.append(data)
    return records


def write_exit_record(
    job_dir: Path,
    exit_code: int,
    signal_name: str = "",
    *,
    started_at: float | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The job's exit record (runs at the end of the batch script): how it ended, and why, in one file."""
    env = env if env is not None else os.environ
    job_id = env.get("SLURM_JOB_ID", "")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job_id = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"  # as the backend names the task
    nodes = _node_records(job_dir)
    record: dict[str, Any] = {
        "job_id": job_id,
        "exit_code": exit_code,
        "signal": signal_name or None,
        "started_at": started_at,
        "ended_at": time.time(),
        "restart_count": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "source": "exit-record",
        "nodes": nodes,
    }
    if signal_name:
        reason = None
        if JOB_ID_PATTERN.fullmatch(job_id):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                said = subprocess.run(
                    ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=10, check=False
                )
                job = parse_scontrol_job(said.stdout)
                reason = job.reason if job else None
        cancel = read_json(job_dir / CANCEL_RECORD, 64 * 1024)
        if reason == "TimeLimit":
            record["state"] = "TIMEOUT"
        elif isinstance(cancel, dict):
            record["state"], record["cancelled_by"] = "CANCELLED", "through llm-infra-mcp"
        elif reason and "preempt" in reason.lower():
            record["state"] = "PREEMPTED"
        elif reason in ("NodeDown", "NodeFail"):
            record["state"] = "NODE_FAIL"
        else:
            record["state"], record["cancelled_by"] = "CANCELLED", "scancel or another signal"
        record["reason"] = f"the batch script got SIG{signal_name}" + (f" (Slurm's reason: {reason})" if reason else "")
    elif exit_code == 0:
        record["state"] = "COMPLETED"
    else:
        record["state"] = "FAILED"
        failed = [n for n in nodes if n.get("reason") and not n.get("signal")]
        failed.sort(key=lambda n: _float(n.get("ended_at")) or float("inf"))
        if failed:
            record["reason"] = failed[0]["reason"]
            record["rank"], record["node"] = failed[0].get("rank"), failed[0].get("node")
        else:
            tail = [ln.strip() for ln in tail_text(job_dir / "logs" / "batch.log", 8192).splitlines() if ln.strip()]
            record["reason"] = (
                f"srun exited with code {exit_code}: {tail[-1] if tail else 'no output'}; see read_job_logs for "
                "process main"
            )
    atomic_write_json(job_dir / EXIT_RECORD, record)
    return record


def main(argv: list[str] | None = None) -> int:
    """`python -m servers.launch.slurm node ... -- CMD...` and `... exit-record ...`: the helpers the batch script
    runs on the nodes."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m servers.launch.slurm")
    sub = parser.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node", help="one node's torchrun, with its ranks' logs mirrored into the job folder")
    node.add_argument("--job-dir", required=True, type=Path)
    node.add_argument("--nproc-per-node", required=True, type=int)
    node.add_argument("--max-log-bytes", type=int, default=None)
    node.add_argument("cmd", nargs=argparse.REMAINDER)
    record = sub.add_parser("exit-record", help="write the job's exit record (the end of the batch script)")
    record.add_argument("--job-dir", required=True, type=Path)
    record.add_argument("--exit-code", required=True, type=int)
    record.add_argument("--signal", default="")
    record.add_argument("--started-at", type=float, default=None)
    args = parser.parse_args(argv)
    if args.command == "node":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            parser.error("node: the torchrun command is missing after --")
        return run_node(args.job_dir, args.nproc_per_node, cmd, args.max_log_bytes)
    write_exit_record(args.job_dir, args.exit_code, args.signal, started_at=args.started_at)
    return 0


if __name__ == "__main__":
    sys.exit(main())
