"""Following an engine's job until it ends: what a job's worker process does for every backend the job engine does
not run itself (launch/remote.py's training jobs, the bandwidth check's probes).

The follower asks the backend's ``status`` quickly at first and after each change (a job often moves on soon),
then at most every ``poll_s`` of the backend's BackendInfo; the engine's state and its words become the job's
progress and its state (QUEUED while the engine holds it pending); a backend declaring ``log_sync`` copies the
ranks' logs into the job folder at each poll; a stop (SIGTERM to the worker) cancels the engine's job and waits for
it to end. An engine that cannot be reached keeps the last state, says so, and is asked again later.

Plain module: no MCP, no server package.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, cast

from servers.engines import registry
from servers.engines.backend import Backend, BackendHandle, EngineStatus, LogSyncBackend

if TYPE_CHECKING:
    from servers.core.jobfiles import JobContext

FIRST_POLL_S = 0.1  # the first interval, and the one after each change of state
UNREACHABLE_WAIT_S = 5.0  # how long a follower waits before asking an engine that did not answer again
GROWTH = 1.5  # each quiet poll waits this much longer, up to the backend's poll_s


def follow(
    backend: Backend,
    handle: BackendHandle,
    ctx: JobContext,
    stop: threading.Event,
    *,
    info: registry.BackendInfo | None = None,
    done: float = 0,
    total: float | None = None,
    prefix: str = "",
) -> EngineStatus:
    """Poll until the engine's job ends; cancel it there when this worker is asked to stop. Progress reports say
    what the engine says, after `prefix`, at (done, total). `info`: the backend's declaration (its poll interval,
    whether it syncs logs); by default the registry's of `backend.name`."""
    declared = info if info is not None else registry.get(backend.name)
    syncer = cast(LogSyncBackend, backend) if declared.can("log_sync") else None
    slowest = max(FIRST_POLL_S, declared.poll_s)

    def report(text: str) -> None:
        ctx.progress(done, total, (prefix + text)[:500])

    last = ""
    cancelled = False
    interval = FIRST_POLL_S
    while True:
        if stop.is_set() and not cancelled:
            cancelled = True
            report(f"cancelling on {backend.name}")
            backend.cancel(handle)
        try:
            status = backend.status(handle)
        except RuntimeError as exc:  # the engine is unreachable for now: keep the last state, say so
            note = f"{backend.name} unreachable: {exc}"
            if note != last:
                report(note)
                last = note
            stop.wait(UNREACHABLE_WAIT_S)
            continue
        if syncer is not None:
            syncer.sync_logs(handle, ctx.files.dir, final=status.state.terminal)
        if status.state.terminal:
            return status
        native = status.native_state or status.state.value
        reason = status.reason or ""
        if reason.startswith(f"{native}: "):  # a reason that names the state already
            reason = reason[len(native) + 2 :]
        note = f"{backend.name} {native}" + (f": {reason}" if reason else "")
        if note != last:
            report(note)
            # The job's own state is the engine's (QUEUED while it is pending there), not this follower's.
            ctx.report_state(status.state.value, (prefix + note)[:500], status.started_at)
            last = note
            interval = FIRST_POLL_S
        stop.wait(interval)
        interval = min(slowest, interval * GROWTH)
