"""The channel by which a job that follows another engine (a Slurm, Ray, Kubernetes or SkyPilot job) tells its
supervisor what that engine says, so that the job's state is the engine's: QUEUED while the engine holds it
pending, STARTING while it is being placed or started, RUNNING only once the engine runs it.

The channel is a pipe the supervisor makes and hands to the worker alone (its write end, passed by descriptor
number in LLM_INFRA_MCP_STATE_FD, which the worker removes from its environment and marks close-on-exec): no file
in the job folder, which code on the cluster's nodes can write, is believed for a state. One report is one JSON
line of at most PIPE_BUF bytes (one write(), so never interleaved): {"state", "reason", "started_at"}. The
supervisor reads what is there without blocking, keeps the last valid report and ignores the rest; only active
states travel here, an end is still recorded by the supervisor from the worker's exit.

Plain module: the standard library only (the worker imports it).
"""

import contextlib
import json
import math
import os
from dataclasses import dataclass

STATE_FD_ENV = "LLM_INFRA_MCP_STATE_FD"
REPORTED_STATES = ("QUEUED", "STARTING", "RUNNING")
REASON_CHARS = 500  # a report's reason is cut here, so one line stays within PIPE_BUF
_LINE_MAX = 4096
_READ_MAX = 64 * 1024  # read at most this much per look; the rest waits for the next


@dataclass(frozen=True)
class StateReport:
    """What the followed engine says: one of REPORTED_STATES, in words, and when it started the job (if it says)."""

    state: str
    reason: str | None = None
    started_at: float | None = None


def write_report(fd: int, state: str, reason: str | None = None, started_at: float | None = None) -> None:
    """One report on the channel. A state outside REPORTED_STATES is a programming error (ValueError); a channel
    whose reader is gone (the supervisor died) is ignored: the job is then tracked without it."""
    if state not in REPORTED_STATES:
        raise ValueError(f"state {state!r} cannot be reported; accepted: {', '.join(REPORTED_STATES)}")
    data: dict[str, object] = {"state": state, "reason": reason[:REASON_CHARS] if reason else None}
    if started_at is not None and isinstance(started_at, int | float) and math.isfinite(started_at):
        data["started_at"] = float(started_at)
    line = (json.dumps(data, ensure_ascii=True) + "\n").encode()
    with contextlib.suppress(OSError):
        os.write(fd, line)


def parse_report(line: bytes) -> StateReport | None:
    """The report in one line, or None when it is not one (wrong shape, unknown state, too long)."""
    if len(line) > _LINE_MAX:
        return None
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("state") not in REPORTED_STATES:
        return None
    reason = data.get("reason")
    if reason is not None and not isinstance(reason, str):
        return None
    started = data.get("started_at")
    if started is not None and (
        isinstance(started, bool) or not isinstance(started, int | float) or not math.isfinite(started)
    ):
        return None
    return StateReport(
        state=data["state"],
        reason=reason[:REASON_CHARS] if reason else None,
        started_at=float(started) if started is not None else None,
    )


class StateReader:
    """The supervisor's end of the channel: `latest()` returns the newest valid report since the last call, or
    None; it never blocks and reads a bounded amount each time."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        self._partial = b""
        os.set_blocking(fd, False)

    def latest(self) -> StateReport | None:
        if self.fd is None:
            return None
        chunks: list[bytes] = []
        read = 0
        while read < _READ_MAX:
            try:  # the descriptor is non-blocking (no select(): it refuses descriptors past FD_SETSIZE)
                data = os.read(self.fd, _READ_MAX - read)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:  # the worker closed its end (it ended)
                self.close()
                break
            chunks.append(data)
            read += len(data)
        if not chunks:
            return None
        text = self._partial + b"".join(chunks)
        *lines, self._partial = text.split(b"\n")
        if len(self._partial) > _LINE_MAX:  # an overlong line: drop it, never buffer without bound
            self._partial = b""
        found = None
        for line in lines:
            report = parse_report(line)
            if report is not None:
                found = report
        return found

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
