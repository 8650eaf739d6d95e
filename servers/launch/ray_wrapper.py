"""llm-infra-mcp: the entrypoint of a Ray job (standard library only, and torchrun.py beside it).

python ray_entry.py --job-dir D [--cwd C] [--max-wall-s S] [--log-cap N] [--output NAME] [--rank-logs R] -- CMD...

Runs CMD (an argv list; no shell) in C, copies its output to this process's output (Ray's job log) and to
D/logs/NAME.log, copies torchrun's per-rank files under R to D/logs/rank<r>.log line by line (torchrun.py's
RankLogMirror, the one the local and Slurm backends use: the job's logs together within N bytes, 0 for no cap),
ends CMD at the wall-time limit S (SIGTERM, then SIGKILL of what is left after a grace), and at the end writes
D/ray_exit.json (exit code or signal, times, attempts, the logs cut): how the job ended stays known after Ray
forgets the job.

The Ray node may not have llm-infra-mcp installed: ray_backend.py's submit writes this file into the job folder as
ray_entry.py, and servers/launch/torchrun.py beside it as torchrun.py, which this script imports as its sibling.
"""

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

# The sibling file (servers/launch/torchrun.py, shipped beside this one), found first even where Python does not put
# a script's folder on sys.path (python -P, PYTHONSAFEPATH).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchrun

GRACE_S = 30.0
POLL_S = 0.5
CANCEL_RECORD = "ray_cancel.json"
EXIT_RECORD = "ray_exit.json"


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), children first found first."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, index = [pid], 0
    while index < len(found):
        found.extend(children.get(found[index], []))
        index += 1
    return found[1:]


def kill_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def become_subreaper() -> None:
    """Orphans of the command (ranks whose torchrun died) become this process's children, so none outlives it."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]] | None:
    if "--" not in argv:
        print("usage: ray_entry.py --job-dir D [options] -- CMD...", file=sys.stderr)
        return None
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="ray_entry.py")
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--cwd", default="")
    parser.add_argument("--max-wall-s", type=float, default=0.0)
    parser.add_argument("--log-cap", type=int, default=0)
    parser.add_argument("--output", default="main")
    parser.add_argument("--rank-logs", default="")
    opts = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        print("ray_entry.py: no command after --", file=sys.stderr)
        return None
    return opts, command


def say(mirror: torchrun.RankLogMirror, process: str, line: str) -> None:
    """A line of ours, in Ray's job log and in the command's own log."""
    sys.stdout.write(line)
    sys.stdout.flush()
    mirror.write(process, line.encode())


def tee(source: IO[bytes], mirror: torchrun.RankLogMirror, process: str) -> None:
    """Copy the command's output to this process's output (Ray's job log) and to its log, until it ends."""
    out = getattr(sys.stdout, "buffer", None)
    while True:
        try:
            data = os.read(source.fileno(), 65536)
        except OSError:
            return
        if not data:
            return
        if out is not None:
            try:
                out.write(data)
                out.flush()
            except (OSError, ValueError):
                out = None
        mirror.write(process, data)


def supervise(
    proc: subprocess.Popen[bytes], mirror: torchrun.RankLogMirror, opts: argparse.Namespace, started: float
) -> tuple[bool, list[str]]:
    """Wait for the command, mirroring the ranks' logs; forward a stop to it and end it at the wall-time limit.
    (timed out, the signals that asked this process to stop)."""
    stopped: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stopped.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    deadline = started + opts.max_wall_s if opts.max_wall_s > 0 else None
    timed_out, kill_at, forwarded = False, None, False
    while True:
        try:
            proc.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        mirror.sync()
        now = time.time()
        if stopped and not forwarded:
            forwarded = True  # Ray signals every process of the job itself; make sure the command hears it
            kill_all([proc.pid], signal.SIGTERM)
            kill_at = kill_at or now + GRACE_S
        if deadline is not None and now >= deadline and not timed_out:
            timed_out = True
            say(
                mirror,
                opts.output,
                f"llm-infra-mcp: wall-time limit of {opts.max_wall_s:g} s reached: stopping the command (SIGTERM)\n",
            )
            kill_all([proc.pid], signal.SIGTERM)
            kill_at = now + GRACE_S
        if kill_at is not None and now >= kill_at:
            kill_all([*descendants(proc.pid), proc.pid], signal.SIGKILL)
            kill_at = now + GRACE_S
    return timed_out, stopped


def main(argv: list[str]) -> int:
    parsed = parse(argv)
    if parsed is None:
        return 2
    opts, command = parsed
    job_dir = Path(opts.job_dir)
    logs_dir = job_dir / "logs"
    for folder in (str(logs_dir), str(job_dir / "checkpoints"), opts.rank_logs, opts.cwd):
        if folder:
            os.makedirs(folder, exist_ok=True)
    if opts.cwd:
        os.chdir(opts.cwd)
    rank_logs = Path(opts.rank_logs) if opts.rank_logs else None
    mirror = torchrun.RankLogMirror(rank_logs, lambda process: logs_dir / f"{process}.log", cap_bytes=opts.log_cap)
    mirror.log_path(opts.output).touch(exist_ok=True)
    become_subreaper()
    record: dict[str, Any] = {"started_at": time.time(), "host": socket.gethostname(), "pid": os.getpid()}
    record["cwd"] = os.getcwd()
    exit_record = job_dir / EXIT_RECORD
    if (job_dir / CANCEL_RECORD).exists():
        # Cancelled while Ray still held it (Ray cannot stop a job that waits for resources): never run it.
        say(mirror, opts.output, "llm-infra-mcp: the job was cancelled before it started; the command is not run\n")
        record.update(exit_code=None, signal=None, timed_out=False, stopped_by=None, cancelled_before_start=True)
        record.update(ended_at=time.time(), attempts=0)
        torchrun.write_json_atomic(exit_record, record)
        return 125
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        say(mirror, opts.output, f"llm-infra-mcp: cannot start {command[0]}: {exc}\n")
        record.update(exit_code=127, signal=None, timed_out=False, stopped_by=None, ended_at=time.time())
        record.update(attempts=0, error=str(exc)[:2000])
        torchrun.write_json_atomic(exit_record, record)
        return 127
    record["child_pid"] = proc.pid
    assert proc.stdout is not None
    reader = threading.Thread(target=tee, args=(proc.stdout, mirror, opts.output), daemon=True)
    reader.start()
    timed_out, stopped = supervise(proc, mirror, opts, record["started_at"])
    kill_all(descendants(os.getpid()), signal.SIGKILL)  # nothing of the command outlives it (we are its reaper)
    reader.join(timeout=5)
    mirror.sync(final=True)
    code = proc.returncode
    record.update(
        exit_code=code if code >= 0 else None,
        signal=signal.Signals(-code).name if code < 0 else None,
        timed_out=timed_out,
        stopped_by=stopped[0] if stopped else None,
        ended_at=time.time(),
        attempts=len(torchrun.attempt_dirs(rank_logs)) if rank_logs is not None else 0,
        logs_cut=sorted(mirror.cut),
        log_bytes_dropped=mirror.dropped,
    )
    torchrun.write_json_atomic(exit_record, record)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
