"""torchrun, as every backend that runs it uses it: the run layout, the per-rank log mirror with its cap, and the
root cause of a failure. local.py (the local job's work function), slurm.py (its node wrapper) and ray_wrapper.py
(on a Ray node) share this one module.

- The run layout: `torchrun_argv` (the command of one node, an argv list), torchrun's log folder
  (JOB/torchrun-logs/<run_id>_<random>/attempt_<n>/<local rank>/{stdout.log,stderr.log,error.json}: `attempt_dirs`,
  `RankLogMirror.rank_dirs`), the run folder, and the variables a job is given (METRICS_ENV, CHECKPOINT_ENV,
  JOB_ID_ENV).
- The mirror (`RankLogMirror`): copies what each rank wrote to the job's logs/rank<r>.log while the job runs, whole
  lines, keeping one copy (the copied bytes of torchrun's files are released with `punch_hole`) and the job's logs
  within their cap (LLM_INFRA_MCP_MAX_LOG_BYTES_PER_JOB).
- The root cause (`find_root_cause`, `describe_failure`): torchrun collapses every worker failure to exit 1; the
  "Root Cause (first observed failure)" block of its output names the rank and its exit code, the rank's error.json
  (scripts whose entry point uses torch.distributed.elastic.multiprocessing.errors.record) the exception, else the
  rank's stderr its last traceback line.

The job's ranks write below torchrun's log folder, and whoever reads it (the job's worker outside its sandbox, the
node wrappers) is more trusted than they are: every folder and file there is reached without following a symbolic
link (`open_beneath`), so that a rank cannot make the reader copy, or punch holes in, a file elsewhere.

Standard library only at module level: ray_backend ships this file beside ray_wrapper.py to the Ray node, which may
not have this package installed (the wrapper imports it as its sibling). Nothing here imports torch.
"""

import contextlib
import ctypes
import ctypes.util
import functools
import json
import os
import re
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

LOG_DIR_NAME = "torchrun-logs"
RUN_DIR_NAME = "run"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
METRICS_ENV = "LLM_INFRA_MCP_METRICS"
CHECKPOINT_ENV = "LLM_INFRA_MCP_CHECKPOINT_DIR"
JOB_ID_ENV = "LLM_INFRA_MCP_JOB_ID"
CAP_SETTING = "LLM_INFRA_MCP_MAX_LOG_BYTES_PER_JOB"
MAX_NPROC = 1024
STREAMS = ("stdout.log", "stderr.log")
TAIL = 64 * 1024  # what the root cause reads of a file, and what the mirror keeps of torchrun's
_CHUNK = 4 * 1024 * 1024


# ---- the command ---------------------------------------------------------------------------------------------------
def torchrun_argv(
    script: Path, args: list[str], nproc_per_node: int, max_restarts: int, log_dir: Path, run_id: str
) -> list[str]:
    """The torchrun command for one node, as an argv list (never a shell string).

    `--standalone` would pick a random rendezvous id; the explicit c10d rendezvous on localhost:0 (a free port) is
    what --standalone does, with `run_id` as the id, so the per-rank log folder is named after the run:
    LOG_DIR/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}. Everything after the
    script is the script's own arguments (argparse REMAINDER), passed through literally.
    """
    from servers.engines.backend import JOB_DIR_PLACEHOLDER  # here: the module stays standard-library-only

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


# ---- files the job's ranks can write -------------------------------------------------------------------------------
def open_beneath(base: Path, path: Path, flags: int = os.O_RDONLY, *, directory: bool = False) -> int:
    """A descriptor of `path`, which lies inside `base`, reached without following a symbolic link anywhere from
    `base` down (`base` itself included): a job that can write below `base` cannot point the reader at a file
    elsewhere, not even by swapping a folder for a link while it is read. Only a regular file (a folder with
    `directory`). OSError when it cannot be opened so; ValueError when `path` is not inside `base`."""
    relative = Path(path).relative_to(base)
    if any(part in ("..", "") for part in relative.parts):
        raise ValueError(f"{path} is not inside {base}")
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    parts = relative.parts
    if not directory and not parts:
        raise IsADirectoryError(f"{path} is the folder {base}")
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | nofollow)
    try:
        for part in parts if directory else parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=fd)
            os.close(fd)
            fd = inner
        if directory:
            found, fd = fd, -1
            return found
        target = os.open(parts[-1], flags | nofollow | os.O_NONBLOCK, dir_fd=fd)
    finally:
        if fd >= 0:
            os.close(fd)
    return _regular(target, path)


def _regular(fd: int, path: Path) -> int:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def subfolders_beneath(base: Path, path: Path) -> list[str]:
    """Names of the real folders (not links to folders) in `path`, which lies inside `base` (see open_beneath);
    [] when it cannot be read so."""
    try:
        fd = open_beneath(base, path, directory=True)
    except (OSError, ValueError):
        return []
    try:
        with os.scandir(fd) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []
    finally:
        os.close(fd)


def numbered(log_dir: Path, parent: Path, prefix: str = "") -> list[tuple[int, Path]]:
    """(n, folder) for the folders <prefix><n> of `parent` (inside `log_dir`), in order."""
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
        attempts.extend(numbered(log_dir, log_dir / name, "attempt_"))
    return sorted(attempts)


def tail_text(path: Path, limit: int = TAIL, *, beneath: Path | None = None) -> str:
    """The last `limit` bytes of a regular file, as text ("" when it cannot be read); never through a link (with
    `beneath`, none from that folder down: a file the job's ranks can write)."""
    try:
        if beneath is not None:
            fd = open_beneath(beneath, path)
        else:
            fd = _regular(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), path)
    except (OSError, ValueError):
        return ""
    try:
        with os.fdopen(fd, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
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


# ---- the per-rank log mirror ---------------------------------------------------------------------------------------
class RankLogMirror:
    """Copies what each rank has written (stdout.log and stderr.log of every attempt) to the job's rank<r> logs,
    by byte offset, whole lines at a time, so that the logs read well while the job runs. A line from a restart
    is preceded by a marker line.

    One copy is kept: once copied, the bytes of torchrun's files are released (a hole is punched in them, the
    file keeps its size so the rank writes on where it was), except the last `TAIL` bytes that the root cause
    reads. The job's logs written through this mirror (the ranks', and whatever `write` is given) together stop at
    `cap_bytes`: past it a marker line says where the log was cut, a `<log>.cut` record beside it says at which byte,
    the rest is dropped (and released) while the job goes on, and `cut` names the logs that were cut.

    `log_dir` None: no rank files to copy (a command run without torchrun), only `write`. `rank_of` maps a local
    rank to the rank its log is named after (here the same; slurm.py's nodes learn their global ranks)."""

    def __init__(self, log_dir: Path | None, log_path: Callable[[str], Path], cap_bytes: int | None = None) -> None:
        self.log_dir = log_dir
        self.log_path = log_path
        self.cap_bytes = cap_bytes if cap_bytes is None or cap_bytes > 0 else None
        self.written = 0
        self.dropped = 0
        self.cut: set[str] = set()
        self._offsets: dict[Path, int] = {}
        self._released: dict[Path, int] = {}
        self._started: set[tuple[int, int]] = set()
        self._lock = threading.Lock()  # `write` may come from another thread (the Ray wrapper's output)

    def rank_dirs(self) -> list[tuple[int, int, Path]]:
        """(attempt, local rank, folder) of every rank folder torchrun made, reached without following links."""
        if self.log_dir is None:
            return []
        return [
            (attempt, local, rank_dir)
            for attempt, attempt_dir in attempt_dirs(self.log_dir)
            for local, rank_dir in numbered(self.log_dir, attempt_dir)
        ]

    def rank_of(self, attempt: int, local: int, *, guess: bool) -> int | None:
        """The rank whose log a local rank's output goes to (None: not known yet, copied later)."""
        return local

    def sync(self, *, final: bool = False) -> None:
        """Copy what the ranks wrote since the last call: whole lines, or everything with `final`."""
        for attempt, local, rank_dir in self.rank_dirs():
            rank = self.rank_of(attempt, local, guess=final)
            if rank is None:
                continue
            self.log_path(f"rank{rank}").touch(exist_ok=True)  # a silent rank still has a (empty) log
            for stream in STREAMS:
                self._copy(attempt, rank, rank_dir / stream, final)

    def write(self, process: str, data: bytes, *, marker: bytes = b"") -> None:
        """Append `data` (after `marker`, a line of ours) to the log of `process`, within the cap."""
        with self._lock:
            if process in self.cut:
                self.dropped += len(data)
                return
            if self.cap_bytes is not None and self.written + len(marker) + len(data) > self.cap_bytes:
                if self.written + len(marker) > self.cap_bytes:
                    marker = b""  # no room for our own line either
                room = max(0, self.cap_bytes - self.written - len(marker))
                keep = data[:room]
                keep = keep[: keep.rfind(b"\n") + 1]  # whole lines only
                self.dropped += len(data) - len(keep)
                note = (
                    f"\n----- llm-infra-mcp: log cut here: the job's logs reached {self.cap_bytes} bytes "
                    f"({CAP_SETTING}); the job goes on, its further output is dropped -----\n"
                ).encode()
                self._write(process, marker + keep + note)
                self.cut.add(process)
                log = self.log_path(process)
                write_json_atomic(
                    log.with_suffix(".cut"), {"cut_at_bytes": log.stat().st_size, "cap_bytes": self.cap_bytes}
                )
                return
            self._write(process, marker + data)

    def _write(self, process: str, data: bytes) -> None:
        if not data:
            return
        with open(self.log_path(process), "ab") as out:
            out.write(data)
        self.written += len(data)

    def _copy(self, attempt: int, rank: int, source: Path, final: bool) -> None:
        assert self.log_dir is not None
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
                marker = b""
                if (attempt, rank) not in self._started:
                    self._started.add((attempt, rank))
                    if attempt > 0:
                        marker = f"----- torchrun restart {attempt} (attempt_{attempt}) -----\n".encode()
                self.write(f"rank{rank}", chunk, marker=marker)
                offset += len(chunk)
                self._offsets[source] = offset
                self._release(f, source, offset)
                if not final:
                    return

    def _release(self, f: IO[bytes], source: Path, copied: int) -> None:
        """Punch out what was copied from `source` (open as `f`), keeping its last TAIL bytes."""
        upto = max(0, copied - TAIL) // _PAGE * _PAGE
        done = self._released.get(source, 0)
        if upto > done and punch_hole(f"/proc/self/fd/{f.fileno()}", done, upto - done):
            self._released[source] = upto
        elif upto > done:
            self._released[source] = upto  # not supported here: both copies stay, nothing else to do


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
            data = json.loads(f.read(TAIL))
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
    block = parse_root_cause_block(tail_text(torchrun_output)) or {}
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
        for r, rank_dir in numbered(log_dir, last_dir):
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
        stderr = tail_text(last_dir / str(rank) / "stderr.log", beneath=log_dir)
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
        tail = [line.strip() for line in tail_text(torchrun_output, 8192).splitlines() if line.strip()]
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
