"""Process identity and process-group termination, for a job engine whose jobs outlive their server.

A pid alone does not identify a process: after the job ends the kernel may give its pid to another. So a
process is named by (pid, start time), the start time read from /proc/<pid>/stat in clock ticks since
boot, together with the boot id, since start times restart at every boot.
"""

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


def child_command(module: str, *args: str, site: bool = True) -> list[str]:
    """argv that runs `module`'s main(args) with this package importable, installed or not. Without `site`, Python
    starts with -S (no site-packages, no .pth files run): quicker, for modules that need the standard library only."""
    package_root = str(Path(__file__).resolve().parents[2])
    bootstrap = (
        "import sys; sys.path.insert(0, sys.argv[1]); import importlib; "
        f"sys.exit(importlib.import_module({module!r}).main(sys.argv[2:]))"
    )
    return [sys.executable, *([] if site else ["-S"]), "-c", bootstrap, package_root, *args]


def boot_id() -> str:
    """The kernel's id of the current boot, or "" where /proc does not say."""
    try:
        return (_PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    return raw[raw.rfind(")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot, or None if there is no such process."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19])  # field 22 of /proc/<pid>/stat; fields[0] is field 3 (state)


def process_cpu_ticks(pid: int) -> int | None:
    """CPU time `pid` has used (user + system), in clock ticks, or None if there is no such process."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 13:
        return None
    return int(fields[11]) + int(fields[12])  # utime and stime: fields 14 and 15 of /proc/<pid>/stat


def process_parent(pid: int) -> int | None:
    """The parent pid of `pid`, or None if there is no such process."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


MAX_ENVIRON_BYTES = 1 << 20


def process_environ(pid: int) -> dict[str, str] | None:
    """The environment `pid` was started with (its first MAX_ENVIRON_BYTES), or None where it cannot be read (gone,
    or not ours to read)."""
    try:
        with open(_PROC / str(pid) / "environ", "rb") as f:
            raw = f.read(MAX_ENVIRON_BYTES)
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_time: int | None
    boot: str

    @classmethod
    def of(cls, pid: int) -> "ProcessIdentity":
        return cls(pid=pid, start_time=process_start_time(pid), boot=boot_id())

    def is_alive(self) -> bool:
        """True if this very process (not a later one with the same pid) exists and is not a zombie."""
        if self.boot and self.boot != boot_id():
            return False
        fields = _stat_fields(self.pid)
        if fields is None:
            if _PROC.is_dir():
                return False
            return _signal_zero(self.pid)  # no /proc (macOS): the pid is all we can check
        if fields[0] in ("Z", "X"):
            return False
        return self.start_time is None or int(fields[19]) == self.start_time


def _signal_zero(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    """True while any process of process group `pgid` exists (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int, started_since: int | None = None) -> list[int] | None:
    """Pids of the live processes of process group `pgid` (started at or after `started_since`, in clock ticks: a
    group's members all started after its leader), from /proc; None where there is no /proc to read."""
    if not _PROC.is_dir():
        return None
    members = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or len(fields) < 20 or fields[0] in ("Z", "X") or int(fields[2]) != pgid:
            continue
        if started_since is None or int(fields[19]) >= started_since:
            members.append(int(entry.name))
    return members


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False if the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def terminate_group(
    pgid: int, grace_s: float, *, poll_s: float = 0.05, reap: Callable[[], object] | None = None
) -> str:
    """End a whole process group: SIGTERM, up to `grace_s` for it to go, then SIGKILL.

    `reap` is called while waiting (the group leader's parent must wait() for it, or it stays a zombie and
    the group never empties). Returns "absent", "terminated" or "killed".
    """
    if not signal_group(pgid, signal.SIGTERM):
        return "absent"
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        if not group_alive(pgid):
            return "terminated"
        time.sleep(poll_s)
    signal_group(pgid, signal.SIGKILL)
    for _ in range(100):  # SIGKILL cannot be ignored; this only waits for the kernel to finish.
        if reap is not None:
            reap()
        if not group_alive(pgid):
            break
        time.sleep(poll_s)
    return "killed"


class ExitWaiter:
    """Waits of at most a given time that end early when the child `pid` ends (its pidfd, Linux 5.3+) or one of
    `wake_fds` becomes readable (what they hold is read and dropped), so that an end is acted on at once instead of
    at the next poll. Without pidfd, a wait lasts its whole time. `pid` must be the caller's own unreaped child (its
    pid cannot name another process until it is waited for)."""

    def __init__(self, pid: int, *wake_fds: int) -> None:
        self._poller = select.poll()  # not select(): it refuses descriptors past FD_SETSIZE
        self._wake_fds = wake_fds
        self._pidfd: int | None = None
        for fd in wake_fds:
            self._poller.register(fd, select.POLLIN)
        with contextlib.suppress(AttributeError, OSError):  # no pidfd here: the end is seen at the next step
            self._pidfd = os.pidfd_open(pid)
            self._poller.register(self._pidfd, select.POLLIN)

    def __call__(self, timeout_s: float) -> None:
        if self._poller.poll(max(0.0, timeout_s) * 1000):
            for fd in self._wake_fds:
                with contextlib.suppress(OSError):  # drained (a pidfd stays readable: the caller sees the end)
                    os.read(fd, 512)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def exit_watch(pid: int | None, start_time: int | None) -> int | None:
    """A descriptor that becomes readable when this very process (pid, start time) ends (a pidfd, Linux 5.3+); None
    where it cannot be watched: no pidfd here, no such process, a zombie already, or the pid now another's."""
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    # Opened first, checked after: the descriptor then names the process that was checked, never a later one.
    if not ProcessIdentity(pid, start_time, boot_id()).is_alive():
        os.close(fd)
        return None
    return fd


async def sleep_until_exit(pid: int | None, start_time: int | None, timeout_s: float) -> None:
    """Sleep `timeout_s`, or less: until the process (pid, start time) ends, when it can be watched (exit_watch).
    A job's waiter polls with it, so that the end its supervisor records just before exiting is seen at once."""
    import anyio

    fd = exit_watch(pid, start_time)
    if fd is None:
        await anyio.sleep(timeout_s)
        return
    try:
        with anyio.move_on_after(timeout_s):
            await anyio.wait_readable(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[threading.Event]:
    """An event that SIGTERM sets while the block runs (a job's worker asked to stop: cancel or its wall-time
    limit), the previous handler back afterwards. Outside the main thread no handler can be set: the event then
    stays clear."""
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield stop
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
