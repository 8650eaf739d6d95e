"""Work functions for the job-engine tests: real code run in real worker processes."""

import os
import signal
import subprocess
import sys
import time
from typing import Any

from servers.core.jobfiles import JobContext
from servers.core.jobs import JobKind


def count(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Log a metrics row per step and some progress, then return a result."""
    steps = int(spec.get("steps", 3))
    for step in range(steps):
        ctx.log_metrics(step=step, loss=1.0 / (step + 1))
        ctx.progress(step + 1, steps, f"step {step + 1}/{steps}")
        print(f"step {step} done", flush=True)
        time.sleep(float(spec.get("step_s", 0.0)))
    return {"steps": steps, "pid": os.getpid()}


def fail(spec: dict[str, Any], ctx: JobContext) -> None:
    print("about to fail", flush=True)
    if spec.get("raise"):
        raise RuntimeError("the loss went to NaN at step 7")
    sys.exit(int(spec.get("exit_code", 3)))


def sleep(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Sleep, optionally ignoring SIGTERM and with a grandchild in the same group (both must be ended)."""
    if spec.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if spec.get("grandchild"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (ctx.files.dir / "grandchild.pid").write_text(str(child.pid))
    print("sleeping", flush=True)
    time.sleep(float(spec.get("seconds", 600)))
    return {"slept": spec.get("seconds")}


def crash(spec: dict[str, Any], ctx: JobContext) -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


TEST_KINDS = [
    JobKind("test_count", "tests.jobkinds:count", "count steps", 60),
    JobKind("test_fail", "tests.jobkinds:fail", "fail", 60),
    JobKind("test_sleep", "tests.jobkinds:sleep", "sleep", 600),
    JobKind("test_crash", "tests.jobkinds:crash", "segfault", 60),
]
