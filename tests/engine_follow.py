"""A scripted stand-in for a cluster engine, followed in a real worker process by the real `follow`: the test
writes what the engine says (an EngineStatus as JSON) into a control file, the stand-in answers status() with it.
What it answers is built by the test from each backend's own state table or status code; this module invents none.
"""

import json
import time
from pathlib import Path
from typing import Any

from servers.core.jobfiles import JobContext
from servers.core.jobs import JobKind
from servers.core.jobstore import JobState
from servers.core.procs import stop_on_sigterm
from servers.engines.backend import BackendHandle, EngineStatus
from servers.engines.follow import follow
from servers.engines.registry import BackendInfo

FOLLOW_KIND = "test_follow_engine"


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
