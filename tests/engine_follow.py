"""Following engines in tests: the one way a test waits on a backend's job (`wait_status`, `wait_until`), and a
scripted stand-in for a cluster engine, followed in a real worker process by the real `follow`: the test writes what
the engine says (an EngineStatus as JSON) into a control file, the stand-in answers status() with it. What it answers
is built by the test from each backend's own state table or status code; this module invents none.
"""

import json
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Protocol

from servers.core.jobfiles import JobContext
from servers.core.jobs import JobKind
from servers.core.jobstore import JobState
from servers.core.procs import stop_on_sigterm
from servers.engines.backend import BackendHandle, EngineStatus
from servers.engines.follow import follow
from servers.engines.registry import BackendInfo

FOLLOW_KIND = "test_follow_engine"


class Asked(Protocol):
    def status(self, handle: BackendHandle) -> EngineStatus: ...


def wait_until(done: Callable[[], object], timeout_s: float, what: str, *, every_s: float = 0.2) -> Any:
    """Ask `done` until it returns something true (returned); an AssertionError saying `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = done()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(every_s)


def wait_status(
    backend: Asked,
    handle: BackendHandle,
    until: Collection[JobState] | Callable[[EngineStatus], object] | None = None,
    *,
    timeout_s: float,
    every_s: float = 0.2,
    said: Callable[[], str] | None = None,
) -> EngineStatus:
    """Ask backend.status(handle) until `until` holds: one of these states, a predicate on the status, or (None) the
    job ended. The status is returned; after timeout_s, or when the job ended in a state not wanted, an
    AssertionError with the last status and what `said` adds (e.g. the job's log)."""
    if until is None:
        wanted: Callable[[EngineStatus], object] = lambda s: s.state.terminal  # noqa: E731
    elif callable(until):
        wanted = until
    else:
        states = frozenset(until)
        wanted = lambda s: s.state in states  # noqa: E731
    deadline = time.monotonic() + timeout_s
    while True:
        status = backend.status(handle)
        if wanted(status):
            return status
        ended = status.state.terminal and until is not None and not callable(until)
        if ended or time.monotonic() > deadline:
            why = "ended" if ended else f"not within {timeout_s:g} s"
            extra = f"\n{said()}" if said is not None else ""
            raise AssertionError(f"job {handle.native_id} of {handle.backend}: {why}; last {status!r}{extra}")
        time.sleep(every_s)


class ScriptedEngine:
    def __init__(self, name: str, control: Path) -> None:
        self.name = name
        self.control = control

    def status(self, handle: BackendHandle) -> EngineStatus:
        try:
            return EngineStatus.model_validate_json(self.control.read_text())
        except (OSError, ValueError):
            return EngineStatus(state=JobState.QUEUED, native_state="PENDING", reason="control file not written yet")

    def cancel(self, handle: BackendHandle) -> JobState:
        self.control.write_text(EngineStatus(state=JobState.CANCELLED, native_state="CANCELLED").model_dump_json())
        return JobState.CANCELLED


def run_follow(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    engine = ScriptedEngine(str(spec["backend"]), Path(spec["control"]))
    handle = BackendHandle(backend=engine.name, key="k", native_id="1")
    with stop_on_sigterm() as stop:
        # Declared as the engine it stands for would be, but asked every 0.2 s at most (the test's pace).
        info = BackendInfo(name=engine.name, summary="a scripted stand-in", factory=ScriptedEngine, poll_s=0.2)
        status = follow(engine, handle, ctx, stop, info=info)  # type: ignore[arg-type]
    return {"state": status.state.value, "at": time.time()}


def write_status(control: Path, status: EngineStatus) -> None:
    tmp = control.with_suffix(".tmp")
    tmp.write_text(json.dumps(status.model_dump(mode="json")))
    tmp.replace(control)


KIND = JobKind(
    FOLLOW_KIND,
    "tests.engine_follow:run_follow",
    "follows a scripted engine",
    default_timeout_s=120,
    follows_engine=True,
)
