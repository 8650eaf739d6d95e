"""The files of one job's folder, and the context a job's work function gets to write them.

A job folder holds everything a job leaves behind, so that a server started later (or a person with a
shell) can read it: job.json (what to run), logs/<process>.log, metrics.jsonl, progress.json,
result.json, error.json (the exception that ended the work), exit.json (how the supervisor saw it end),
supervisor.json (the supervisor's and the worker's process identities), resume.json (the checkpoints copied
from the job it resumes from), and run/, the work's working directory.

The work runs in run/, apart from these files, but it can still write anything in the folder: every file read
from a job folder is read as untrusted (regular files only, no symbolic links followed, bounded in size,
validated by its reader).
Plain module: imported by the worker process, so it stays small.
"""

import json
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from servers.core.errors import InputError

PROCESS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAIN_PROCESS = "main"


def atomic_write_json(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


DEFAULT_JSON_LIMIT = 64 * 1024 * 1024


class BadJobFileError(InputError):
    """A file in a job folder that cannot be used: not a regular file, too big, or not what its reader expects."""


def open_regular(path: Path) -> IO[bytes]:
    """Open a job folder's file for reading; only a regular file, and not through a symbolic link (so that a job
    cannot point the server at a FIFO, a device or a file elsewhere). FileNotFoundError when it is absent."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        kind = "a symbolic link, which is not followed" if path.is_symlink() else f"not readable ({exc.strerror})"
        raise BadJobFileError(f"{path.name} is {kind}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadJobFileError(f"{path.name} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def load_json(path: Path, max_bytes: int = DEFAULT_JSON_LIMIT) -> Any:
    """The JSON in a job folder's file. FileNotFoundError when it is absent; BadJobFileError (saying why) when it is not
    a regular file, is larger than max_bytes, or is not valid JSON."""
    with open_regular(path) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BadJobFileError(f"{path.name} is larger than {max_bytes} bytes")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BadJobFileError(f"{path.name} is not valid JSON ({str(exc)[:200]})") from None


def read_json(path: Path, max_bytes: int = DEFAULT_JSON_LIMIT) -> Any | None:
    """The JSON in `path`, or None when it is absent, not (yet) valid JSON, or not a plain file of at most
    max_bytes."""
    try:
        return load_json(path, max_bytes)
    except (OSError, BadJobFileError):
        return None


def worker_error(path: Path) -> dict[str, str] | None:
    """error.json as the worker writes it ({"type": str, "message": str}), or None if absent or not of that shape."""
    data = read_json(path, 1024 * 1024)
    if not isinstance(data, dict):
        return None
    kind, message = data.get("type"), data.get("message")
    if not isinstance(kind, str) or not isinstance(message, str):
        return None
    return {"type": kind[:200], "message": message[:4000]}


class JobFiles:
    """Names of the files in one job folder."""

    def __init__(self, job_dir: Path | str) -> None:
        self.dir = Path(job_dir)

    @property
    def descriptor(self) -> Path:
        return self.dir / "job.json"

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    def log(self, process: str = MAIN_PROCESS) -> Path:
        if not PROCESS_NAME.match(process) or ".." in process:
            raise ValueError(f"bad process name {process!r}: letters, digits, '_', '-' and '.' only")
        return self.logs_dir / f"{process}.log"

    def processes(self) -> list[str]:
        """Names of the logs there are (only names read_job_logs accepts)."""
        if not self.logs_dir.is_dir():
            return []
        names = (p.stem for p in self.logs_dir.glob("*.log"))
        return sorted(n for n in names if PROCESS_NAME.match(n) and ".." not in n)

    @property
    def metrics(self) -> Path:
        return self.dir / "metrics.jsonl"

    @property
    def progress(self) -> Path:
        return self.dir / "progress.json"

    @property
    def result(self) -> Path:
        return self.dir / "result.json"

    @property
    def error(self) -> Path:
        return self.dir / "error.json"

    @property
    def exit(self) -> Path:
        return self.dir / "exit.json"

    @property
    def supervisor_identity(self) -> Path:
        return self.dir / "supervisor.json"

    @property
    def run_dir(self) -> Path:
        """The work's working directory (JOB/run), apart from the engine's files; created with the job folder."""
        return self.dir / "run"

    @property
    def checkpoints(self) -> Path:
        return self.dir / "checkpoints"

    @property
    def resume_record(self) -> Path:
        """What was copied into checkpoints/ from the job this one resumes from (launch/local.py seed_checkpoints)."""
        return self.dir / "resume.json"


class JobContext:
    """Handed to a job kind's work function: where to write metrics, progress and extra logs."""

    def __init__(self, job_id: str, kind: str, files: JobFiles, *, state_fd: int | None = None) -> None:
        self.job_id = job_id
        self.kind = kind
        self.files = files
        self._state_fd = state_fd  # the supervisor's pipe, for a kind that follows another engine (engine_state.py)

    @property
    def checkpoint_dir(self) -> Path:
        self.files.checkpoints.mkdir(parents=True, exist_ok=True)
        return self.files.checkpoints

    def log_path(self, process: str) -> Path:
        """Log file for a further process of this job (a rank, a probe); read_job_logs serves it by name."""
        path = self.files.log(process)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def log_metrics(self, step: int | None = None, **values: Any) -> None:
        """Append one metrics row (a JSON line with the step, the wall time and the values)."""
        row = {"step": step, "time": round(time.time(), 3), **values}
        line = json.dumps(row, default=float) + "\n"
        # One write() of a line opened with O_APPEND: a concurrent reader sees whole lines or none of this one.
        with open(self.files.metrics, "a") as f:
            f.write(line)

    def report_state(self, state: str, reason: str | None = None, started_at: float | None = None) -> None:
        """Tell the supervisor the state of the engine this work follows (QUEUED, STARTING or RUNNING): the job's
        state becomes it. Only a kind that follows an engine (JobKind.follows_engine) has the channel; elsewhere
        this does nothing."""
        if self._state_fd is None:
            return
        from servers.core.engine_state import write_report

        write_report(self._state_fd, state, reason, started_at)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Record how far the work is; wait_for_job turns it into progress notifications."""
        atomic_write_json(
            self.files.progress, {"done": done, "total": total, "message": message, "time": round(time.time(), 3)}
        )
