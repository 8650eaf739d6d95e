"""Real slowdowns of real processes, for tests and benchmarks of the straggler tools: a CPU quota on a rank (the
kernel's CFS bandwidth control, through a cgroup of the cpu controller), a busy neighbour on a rank's CPU with a set
scheduler weight (CpuContention), and the ranks of a running job found by the environment the launch server gives
them. Plain module (no MCP imports).

A rank whose process is throttled to a fraction q of one CPU computes about 1/q times slower when it is
single-threaded and CPU-bound. The quota is granted per period: a burst of work shorter than the quota runs at full
speed, so the period defaults to the shortest the kernel accepts for q (its smallest quota is 1 ms: a period of
1 ms / q). At such short periods this kernel throttles more than 1/q (q = 0.91-0.95 slowed tiny-gpt's forward pass
1.6-1.7x, q = 0.9 a CPU-bound loop 1.5x), so a quota gives strong slowdowns only; a busy neighbour gives milder
ones too (weights 1.05-2.2 gave tiny-gpt's rank 1.0-2.6x). Tests measure the slowdown they got rather than assume it.

cgroup v1 (the ``cpu`` controller mounted on its own, with cpu.cfs_period_us and cpu.cfs_quota_us) is what this
machine has and what the tests exercise; cgroup v2 (``cpu.max`` in the unified hierarchy, with the cpu controller
enabled in the root's subtree_control) is supported the same way but has not been run here. Root only.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from servers.core.procs import process_environ, process_start_time

CGROUP_ROOT = Path("/sys/fs/cgroup")
MIN_PERIOD_US = 1_000  # the kernel's bounds for cfs_period_us
MAX_PERIOD_US = 1_000_000
MIN_QUOTA_US = 1_000  # and the smallest quota it accepts
MAX_PROCESSES_SCANNED = 65_536
MIN_SHARE, MAX_SHARE = 0.01, 16.0  # a busy neighbour's weight, in nice-0 processes
_BUSY = "while True:\n    pass\n"


class SlowdownError(RuntimeError):
    """A slowdown could not be applied or undone; the message says why."""


@dataclass(frozen=True)
class _Hierarchy:
    version: int  # 1 or 2
    root: Path  # where the cpu controller's groups are made

    def cgroup_of(self, pid: int) -> str | None:
        """The process's group in this hierarchy, as /proc/PID/cgroup names it (None: gone)."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if (self.version == 1 and "cpu" in controllers.split(",")) or (self.version == 2 and controllers == ""):
                return path
        return None

    def make_group(self, name: str, v1: Mapping[str, str], v2: Mapping[str, str]) -> Path:
        """A new group `name` with its cpu controller files written (v1's or v2's, as this hierarchy is); on a failure
        nothing is left behind and SlowdownError says why."""
        path = self.root / name
        try:
            path.mkdir()
            if self.version == 2:
                with contextlib.suppress(OSError):  # already on, or not ours to turn on: the files say
                    (self.root / "cgroup.subtree_control").write_text("+cpu")
            for file, value in (v1 if self.version == 1 else v2).items():
                (path / file).write_text(value)
        except OSError as e:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise SlowdownError(f"could not make the cgroup {path}: {e}") from e
        return path


def _remove_group(path: Path) -> str | None:
    """Remove an empty group; None when it is gone (or was), else why not."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"could not remove {path}: {e}"
    return None


def _hierarchy() -> _Hierarchy | str:
    """The cpu controller's hierarchy here, or why there is none."""
    if os.geteuid() != 0:
        return "a CPU quota needs root (it makes a cgroup and moves processes into it)"
    v1 = CGROUP_ROOT / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        return _Hierarchy(1, v1)
    for unified in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        controllers = unified / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return _Hierarchy(2, unified)
    return "no cgroup cpu controller here (neither v1's cpu.cfs_quota_us nor v2's cpu in cgroup.controllers)"


def cpu_quota_available() -> str | None:
    """None when CpuQuota can work here, else why not."""
    found = _hierarchy()
    return found if isinstance(found, str) else None


@dataclass
class CpuQuota:
    """Throttle processes to `fraction` of one CPU: a cgroup of their own with quota = fraction x period. apply()
    moves them in (all their threads), release() moves the ones still alive back to the groups they came from and
    removes the cgroup; also a context manager."""

    fraction: float
    period_us: int = 0  # 0: the shortest the kernel accepts for the fraction (MIN_QUOTA_US / fraction)
    name: str = field(default_factory=lambda: f"llm-infra-mcp-slow-{secrets.token_hex(4)}")
    moved: dict[int, str] = field(default_factory=dict)  # pid -> the group it was in
    _path: Path | None = None
    _hier: _Hierarchy | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.fraction, int | float) and 0 < self.fraction <= 64):
            raise ValueError(f"fraction: {self.fraction}; accepted: above 0 and at most 64 (CPUs)")
        if self.period_us == 0:
            self.period_us = min(MAX_PERIOD_US, max(MIN_PERIOD_US, math.ceil(MIN_QUOTA_US / self.fraction)))
        if not MIN_PERIOD_US <= self.period_us <= MAX_PERIOD_US:
            raise ValueError(f"period_us: {self.period_us}; accepted: {MIN_PERIOD_US} to {MAX_PERIOD_US}")
        quota = self.quota_us
        if quota < MIN_QUOTA_US:
            raise ValueError(
                f"fraction: {self.fraction} of a {self.period_us} us period is a quota of {quota} us; accepted: "
                f"fraction x period_us >= {MIN_QUOTA_US} us (the kernel's smallest quota)"
            )
        if not self.name.replace("-", "").isalnum():
            raise ValueError(f"name: {self.name!r}; accepted: letters, digits and '-'")

    @property
    def quota_us(self) -> int:
        return round(self.fraction * self.period_us)

    @property
    def path(self) -> Path | None:
        """The cgroup's folder while it exists."""
        return self._path

    def throttled(self) -> int | None:
        """Periods in which the group ran out of quota so far (cpu.stat nr_throttled); None once released."""
        if self._path is None:
            return None
        try:
            stat = (self._path / "cpu.stat").read_text().split()
        except OSError:
            return None
        counts = dict(zip(stat[::2], stat[1::2], strict=False))
        value = counts.get("nr_throttled")
        return int(value) if value is not None and value.isdigit() else None

    def apply(self, pids: Iterable[int]) -> CpuQuota:
        found = _hierarchy()
        if isinstance(found, str):
            raise SlowdownError(found)
        self._hier = found
        if self._path is None:
            self._path = found.make_group(
                self.name,
                v1={"cpu.cfs_period_us": str(self.period_us), "cpu.cfs_quota_us": str(self.quota_us)},
                v2={"cpu.max": f"{self.quota_us} {self.period_us}"},
            )
        for pid in pids:
            before = found.cgroup_of(pid)
            if before is None:
                raise SlowdownError(f"process {pid} is gone")
            try:
                (self._path / "cgroup.procs").write_text(str(pid))
            except OSError as e:
                raise SlowdownError(f"could not move process {pid} into {self._path}: {e}") from e
            self.moved.setdefault(pid, before)
        return self

    def release(self) -> None:
        """Undo: every moved process that is still alive goes back; the cgroup is removed. Idempotent."""
        if self._path is None or self._hier is None:
            return
        problems = []
        for pid, before in list(self.moved.items()):
            back = self._hier.root / before.lstrip("/")
            try:
                (back / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                pass  # it ended
            except OSError as e:
                if self._hier.cgroup_of(pid) is not None:
                    problems.append(f"process {pid} could not go back to {back}: {e}")
            self.moved.pop(pid, None)
        removed = _remove_group(self._path)
        if removed is None:
            self._path = None
        else:
            problems.append(removed)
        if problems:
            raise SlowdownError("; ".join(problems))

    def __enter__(self) -> CpuQuota:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass
class CpuContention:
    """A noisy neighbour: one busy process per CPU a target may run on, pinned there, in a cgroup of its own whose
    weight is `share` times a nice-0 process's (cpu.shares 1024 x share in v1, cpu.weight 100 x share in v2). While
    the target computes, the scheduler gives the neighbour share / (1 + share) of the CPU, so the target's work takes
    up to 1 + share times as long; a short burst after a sleep gets less (the scheduler credits the sleeper), so
    tests measure the slowdown they got. The target should be pinned (os.sched_setaffinity): a target free to run on
    every CPU gets a neighbour on each. apply() starts them, release() stops them and removes the cgroup; also a
    context manager. Root only (the cgroup); v1 is what ran here."""

    share: float
    name: str = field(default_factory=lambda: f"llm-infra-mcp-busy-{secrets.token_hex(4)}")
    pids: list[int] = field(default_factory=list)
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _path: Path | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.share, int | float) and MIN_SHARE <= self.share <= MAX_SHARE):
            raise ValueError(f"share: {self.share}; accepted: {MIN_SHARE} to {MAX_SHARE} (times a nice-0 process)")
        if not self.name.replace("-", "").isalnum():
            raise ValueError(f"name: {self.name!r}; accepted: letters, digits and '-'")

    @property
    def path(self) -> Path | None:
        """The neighbours' cgroup folder while it exists."""
        return self._path

    def apply(self, target: int) -> CpuContention:
        found = _hierarchy()
        if isinstance(found, str):
            raise SlowdownError(found)
        try:
            cpus = sorted(os.sched_getaffinity(target))
        except OSError as e:
            raise SlowdownError(f"process {target} is gone") from e
        path = self._path = found.make_group(
            self.name,
            v1={"cpu.shares": str(max(2, round(1024 * self.share)))},
            v2={"cpu.weight": str(min(10_000, max(1, round(100 * self.share))))},
        )
        try:
            for cpu in cpus:
                proc = subprocess.Popen(
                    [sys.executable, "-c", _BUSY], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    preexec_fn=functools.partial(os.sched_setaffinity, 0, {cpu}),
                )  # fmt: skip
                self._procs.append(proc)
                self.pids.append(proc.pid)
                (path / "cgroup.procs").write_text(str(proc.pid))
        except OSError as e:
            self.release()
            raise SlowdownError(f"could not start the busy neighbour in {path}: {e}") from e
        return self

    def release(self) -> None:
        """Stop the neighbours and remove the cgroup. Idempotent."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._procs.clear()
        if self._path is not None:
            problem = _remove_group(self._path)
            if problem is not None:
                raise SlowdownError(problem)
            self._path = None

    def __enter__(self) -> CpuContention:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def processes_with(env: Mapping[str, str]) -> dict[int, dict[str, str]]:
    """The processes here whose environment holds every pair of `env`: pid -> their environment."""
    found: dict[int, dict[str, str]] = {}
    for scanned, entry in enumerate(Path("/proc").iterdir()):
        if scanned >= MAX_PROCESSES_SCANNED:
            break
        if not entry.name.isdigit():
            continue
        environ = process_environ(int(entry.name))
        if environ is not None and all(environ.get(k) == v for k, v in env.items()):
            found[int(entry.name)] = environ
    return found


def rank_processes(match: Mapping[str, str]) -> dict[int, int]:
    """rank -> pid of a running job's ranks here: the processes whose environment holds every pair of `match` and
    RANK (torchrun sets it for its workers, not for itself). A launch server's job is matched by its metrics file,
    ``{"LLM_INFRA_MCP_METRICS": "<job folder>/metrics.jsonl"}``, which every backend that runs here sets. A rank with
    more than one such process (a worker's own children) keeps the eldest: the lowest start time."""
    if not match:
        raise ValueError("match: give at least one environment variable and its value")
    by_rank: dict[int, tuple[int, int]] = {}
    for pid, environ in processes_with(match).items():
        rank = environ.get("RANK", "")
        if not rank.isdigit():
            continue
        started = process_start_time(pid)
        if started is None:
            continue
        if int(rank) not in by_rank or started < by_rank[int(rank)][0]:
            by_rank[int(rank)] = (started, pid)
    return {rank: pid for rank, (_, pid) in sorted(by_rank.items())}
