"""The files of one job's folder, and the context a job's work function gets to write them.

A job folder holds everything a job leaves behind, so that a server started later (or a person with a
shell) can read it: job.json (what to run), logs/<process>.log, metrics.jsonl, progress.json,
result.json, error.json (the exception that ended the work), exit.json (how the supervisor saw it end).
Plain module: imported by the worker process, so it stays small.
"""

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

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


def read_json(path: Path) -> Any | None:
    """The JSON in `path`, or None when it is absent or not (yet) valid JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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
        if not self.logs_dir.is_dir():
            return []
        return sorted(p.stem for p in self.logs_dir.glob("*.log"))

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
    def checkpoints(self) -> Path:
        return self.dir / "checkpoints"


class JobContext:
    """Handed to a job kind's work function: where to write metrics, progress and extra logs."""

    def __init__(self, job_id: str, kind: str, files: JobFiles) -> None:
        self.job_id = job_id
        self.kind = kind
        self.files = files

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

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Record how far the work is; wait_for_job turns it into progress notifications."""
        atomic_write_json(
            self.files.progress, {"done": done, "total": total, "message": message, "time": round(time.time(), 3)}
        )
