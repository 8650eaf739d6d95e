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


def curve(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Log a ScaleRL-shaped pass-rate curve as metrics rows, as an RL training run would."""
    import math

    a, b, c_mid, r0 = 0.61, 1.92, 2542.0, 0.25
    points = int(spec.get("points", 30))
    for step in range(points):
        compute = 100 * (50_000 / 100) ** (step / (points - 1))
        value = r0 + (a - r0) / (1 + (c_mid / compute) ** b) + 0.004 * math.sin(7 * step)
        ctx.log_metrics(step=step, gpu_hours=round(compute, 3), pass_rate=round(value, 5))
        ctx.log_metrics(step=step, loss=1.0)  # rows without the curve's keys are skipped by the fitter
    return {"points": points}


TEST_KINDS.append(JobKind("test_curve", "tests.jobkinds:curve", "log an RL curve", 60))


def network(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Where the work's sockets live: its network namespace and its interfaces."""
    import os
    import socket

    return {"netns": os.readlink("/proc/self/ns/net"), "interfaces": sorted(n for _, n in socket.if_nameindex())}


TEST_KINDS.append(
    JobKind("test_network", "tests.jobkinds:network", "report the network namespace", 60, isolated_network=True)
)


def big(spec: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """A result larger than a tool answer carries whole: a verdict, a table, and many rows."""
    rows = [{"size": 1 << i % 30, "busbw_gbs": round(0.5 * i, 3), "note": f"row {i}"} for i in range(int(spec["rows"]))]
    return {"verdict": "all rows valid", "table": "size busbw\n" + "x" * 3000, "rows": rows}


TEST_KINDS.append(JobKind("test_big", "tests.jobkinds:big", "a large result", 60))
