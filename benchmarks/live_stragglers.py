"""Stragglers from real slowdowns of a real job: tiny-gpt on 2 ranks (gloo on CPU), one of them slowed while it runs,
and detect_stragglers polled on the live metrics until it says what happened. Used by benchmarks/faults.py
(--stragglers) and by tests/test_live_stragglers.py.

Both ranks are started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each pinned to its
own CPU, and the poller runs under SCHED_IDLE: with the ranks free to move and the poller at normal priority, a
clean rank ran 1.1-1.2x its peer for several steps in 2 of 20 clean runs (a false claim). Pinning alone did not
stop it (the poller's detect_stragglers calls take a rank's core for ~45 ms); both together, and the detector's
floor for ranks with so few peers (servers/diagnostics/stragglers.py), gave no false claim in 20 clean runs.

Kinds of trial:
- ``compute``: the two ranks on this machine (loopback); at step --inject-at a rank's process is put in a cgroup
  with a CPU quota of 1/factor of one CPU, or (``how="busy"``) a busy process pinned to the rank's CPU with
  factor - 1 times its scheduler weight (servers/diagnostics/slowdowns.py). Found when that rank is a straggler
  (or likely one), compute-bound, and no other rank is.
- ``network``: one rank per testbed node (servers/diagnostics/testbed.py: two nodes on different leaves, so the
  traffic crosses a spine), gloo over the nodes' rail-0 NICs; at the step, node 1's NIC is rate-limited by tc htb
  (both directions). A synchronised all-reduce makes every rank wait for the slow NIC, so step times cannot name
  the rank: found when the report's job_slowdown says communication and names no straggler.
- ``clean``: either setup, nothing injected; any straggler, likely straggler or job slowdown is a false alarm.

Every rank logs each step (--log-every 1). While the job runs, the metrics are polled and detect_stragglers run on
them (the seconds from injection to the first right report). After it, the rows are replayed step by step: the
detection step is the first k at which the report on steps 1..k is right, the latency is k minus the injection step
(the last logged step when the slowdown was applied), and a false alarm is a wrong claim at any k (a poller that
read after every step would have seen it). The slowdown each trial got is measured, not assumed: the slowed rank's
own work (compute) or the job's step time (network), median after over median before.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.core.errors import InputError
from servers.diagnostics.slowdowns import CpuContention, CpuQuota, rank_processes
from servers.diagnostics.stragglers import StragglerReport, detect_stragglers_in_metrics
from servers.diagnostics.testbed import Testbed
from servers.launch.metrics import read_metrics
from servers.launch.recipes import recipe_path

Kind = Literal["clean", "compute", "network"]
RECIPE_ARGS = ["--log-every", "1", "--ckpt-every", "0", "--batch-size", "32", "--d-model", "128"]
MASTER_PORT = 29_611
MIN_STEPS_JUDGED = 12  # the first prefix replayed: a baseline (10 iterations) and a few rows after it


@dataclass
class Trial:
    kind: Kind
    rank: int = 1  # the rank slowed (compute); network slows node 1's NIC
    factor: float = 2.0  # compute: 1 / CPU quota, or 1 + the busy neighbour's share; network: line rate / new rate
    how: Literal["quota", "busy"] = "quota"  # compute: a CPU quota (CpuQuota) or a busy neighbour (CpuContention)
    network: bool = False  # clean trials: on the testbed (True) or on this machine


@dataclass
class Outcome:
    kind: Kind
    network: bool
    how: str | None  # compute: "quota" or "busy"
    nominal: float | None
    measured: float | None  # the slowdown the trial got (see the module's docstring)
    inject_step: int | None
    detect_step: int | None
    detect_s: float | None  # live: seconds from injection to the first poll whose report was right
    found: bool  # replayed: the right verdict (compute: the rank, compute-bound; network: communication)
    false_alarm: bool  # replayed: anything else claimed at any step (another rank, a slowdown in a clean run)
    said: str
    steps: int

    @property
    def latency_steps(self) -> int | None:
        if self.detect_step is None or self.inject_step is None:
            return None
        return self.detect_step - self.inject_step

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "latency_steps": self.latency_steps}


def _env(folder: Path, job_id: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(folder),
        "OMP_NUM_THREADS": "1",
        "LLM_INFRA_MCP_METRICS": str(folder / "metrics.jsonl"),
        "LLM_INFRA_MCP_CHECKPOINT_DIR": str(folder / "ckpt"),
        "LLM_INFRA_MCP_JOB_ID": job_id,
    }


def _start_ranks(folder: Path, job_id: str, steps: int, bed: Testbed | None) -> list[subprocess.Popen]:
    """The job's two ranks, started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), each
    pinned to its own CPU (rank % CPUs), so that the ranks do not take turns on one core and a busy neighbour
    (CpuContention) shares one rank's core only. On the testbed each rank runs in its node's namespace and gloo
    uses rail 0; else both run here on loopback."""
    cpus = sorted(os.sched_getaffinity(0))
    procs = []
    for rank in range(2):
        env = _env(folder, job_id) | {
            "RANK": str(rank), "LOCAL_RANK": "0" if bed else str(rank), "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "1" if bed else "2", "MASTER_PORT": str(MASTER_PORT),
            "MASTER_ADDR": bed.nic_address(0, 0) if bed else "127.0.0.1",
        }  # fmt: skip
        argv = [sys.executable, str(recipe_path("tiny-gpt")), "--steps", str(steps), *RECIPE_ARGS]
        if bed is not None:
            env["GLOO_SOCKET_IFNAME"] = "r0"
            argv = ["ip", "netns", "exec", bed.ns(f"n{rank}"), *argv]
        log = open(folder / f"rank{rank}.log", "wb")  # noqa: SIM115 (closed with the process)
        pin = functools.partial(os.sched_setaffinity, 0, {cpus[rank % len(cpus)]})  # the child and all it starts
        procs.append(subprocess.Popen(argv, env=env, cwd=folder, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin))
    return procs


def _poll_when_idle() -> Callable[[], None]:
    """Put this thread (the poller: a detect_stragglers call costs about 45 ms here) under SCHED_IDLE, so that it
    runs only when a CPU has nothing else to do and never takes a rank's turn (at normal priority, a clean pinned
    rank ran 1.2x its peer for several steps while it polled). Returns the undo."""
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        return lambda: None

    def undo() -> None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, before[0], before[1])

    return undo


def _sockets(bed: Testbed) -> str:
    """The two nodes' TCP sockets (ss -tnio), their NICs' qdiscs (tc -s) and neighbours, for a stalled trial's
    error."""
    out = []
    for i in range(2):
        done = subprocess.run(["ip", "netns", "exec", bed.ns(f"n{i}"), "ss", "-tnio"], capture_output=True, text=True,
                              timeout=10, check=False)  # fmt: skip
        out.append(f"node{i}: {done.stdout.strip()[:1500]}")
    for port in (*bed.nic_ports(0, 0), *bed.nic_ports(1, 0)):
        done = subprocess.run(["tc", "-s", "-n", port.netns, "qdisc", "show", "dev", port.dev], capture_output=True,
                              text=True, timeout=10, check=False)  # fmt: skip
        out.append(f"{port.netns} {port.dev}: {done.stdout.strip()[:600]}")
    for i in range(2):
        neigh = subprocess.run(["ip", "-n", bed.ns(f"n{i}"), "neigh"], capture_output=True, text=True, timeout=10,
                               check=False)  # fmt: skip
        out.append(f"node{i} neighbours: {neigh.stdout.strip()[:400]}")
    return "\n" + "\n".join(out)


def train_steps(rows: list[dict[str, Any]]) -> list[int]:
    """The steps of the rows that carry per-rank times (train rows), sorted."""
    return sorted({r["step"] for r in rows if r.get("split", "train") == "train" and "rank_step_s" in r})


def last_step(path: Path) -> int:
    """The last step of a metrics file with per-rank times (0: none yet)."""
    steps = train_steps(read_metrics(path)[0])
    return steps[-1] if steps else 0


def _judge(report: StragglerReport, trial: Trial, injected: bool) -> tuple[bool, bool, str]:
    """(found, false alarm, what it said) for one report."""
    named = [e for e in report.stragglers + report.likely_stragglers]
    slowdown = report.job_slowdown
    said = report.summary
    if trial.kind == "compute" and injected:
        right = [e for e in named if e.rank == trial.rank and e.attribution == "compute"]
        wrong = [e for e in named if e.rank != trial.rank]
        return bool(right) and not wrong, bool(wrong), said
    if trial.kind == "network" and injected:
        right = slowdown is not None and slowdown.attribution == "communication" and not named
        wrong = bool(named) or (slowdown is not None and slowdown.attribution in ("compute", "stragglers"))
        return right, wrong, said
    return False, bool(named) or slowdown is not None, said


def _measured(rows: list[dict[str, Any]], trial: Trial, inject_step: int) -> float | None:
    key = "rank_work_s" if trial.kind == "compute" else "rank_step_s"
    before, after = [], []
    for r in rows:
        values = r.get(key)
        if r.get("split", "train") != "train" or not isinstance(values, list) or len(values) < 2:
            continue
        value = values[trial.rank] if trial.kind == "compute" else statistics.median(values)
        if 5 <= r["step"] <= inject_step:
            before.append(value)
        elif r["step"] > inject_step + 2:
            after.append(value)
    if not before or not after:
        return None
    return round(statistics.median(after) / statistics.median(before), 3)


def replay(rows: list[dict[str, Any]], trial: Trial, inject_step: int | None) -> tuple[int | None, bool, str]:
    """detect_stragglers on every prefix of the job's rows (steps 1..k, k from MIN_STEPS_JUDGED), as a poller that
    read the metrics after every step would have seen them: (the first k whose report is right, whether any prefix
    claimed something wrong, what the deciding report said)."""
    first: int | None = None
    wrong_any = False
    said = ""
    for k in train_steps(rows):
        if k < MIN_STEPS_JUDGED:
            continue
        injected = inject_step is not None and k > inject_step
        try:
            report = detect_stragglers_in_metrics([r for r in rows if r["step"] <= k], ranks_per_node=1)
        except InputError:
            continue
        hit, wrong, said_now = _judge(report, trial, injected)
        if wrong and not wrong_any:
            wrong_any, said = True, f"at step {k}: {said_now}"
        if hit and first is None:
            first = k
            said = said if wrong_any else f"at step {k}: {said_now}"
    return first, wrong_any, said


def run_trial(
    trial: Trial, folder: Path, *, bed: Testbed | None = None, steps: int = 80, inject_at: int = 30,
    poll_s: float = 0.5, timeout_s: float = 180, stall_s: float = 30,
) -> Outcome:  # fmt: skip
    """One trial, start to end (the processes are stopped and the slowdown undone also when it fails). Live: the
    metrics are read every poll_s and detect_stragglers run on them until it is right (the seconds from injection
    to that poll). Then the final rows are replayed step by step (replay) for the latency in steps and false
    alarms, so that they do not depend on when the polls fell."""
    folder.mkdir(parents=True, exist_ok=True)
    job_id = f"live-{secrets.token_hex(4)}"
    metrics = folder / "metrics.jsonl"
    on_testbed = trial.kind == "network" or (trial.kind == "clean" and trial.network)
    if on_testbed and bed is None:
        raise ValueError("a network trial needs a testbed")
    procs = _start_ranks(folder, job_id, steps, bed if on_testbed else None)
    restore = _poll_when_idle()
    quota: CpuQuota | CpuContention | None = None
    fault = None
    inject_step: int | None = None
    injected_at = 0.0
    detect_s = None
    deadline = time.monotonic() + timeout_s
    progress = (0, time.monotonic())
    try:
        while time.monotonic() < deadline:
            running = any(p.poll() is None for p in procs)
            rows, _ = read_metrics(metrics)
            logged = train_steps(rows)
            last = logged[-1] if logged else 0
            if last > progress[0]:
                progress = (last, time.monotonic())
            elif last and time.monotonic() - progress[1] > stall_s:
                sockets = _sockets(bed) if on_testbed and bed is not None else ""
                raise RuntimeError(f"trial {trial}: no step logged for {stall_s:g} s after step {last}{sockets}")
            if inject_step is None and last >= inject_at and trial.kind != "clean":
                if trial.kind == "compute":
                    pids = rank_processes({"LLM_INFRA_MCP_JOB_ID": job_id})
                    if trial.rank not in pids:
                        raise RuntimeError(f"rank {trial.rank} of {job_id} not found (found {sorted(pids)})")
                    if trial.how == "busy":
                        quota = CpuContention(trial.factor - 1.0).apply(pids[trial.rank])
                    else:
                        quota = CpuQuota(1.0 / trial.factor).apply([pids[trial.rank]])
                else:
                    assert bed is not None
                    fault = bed.inject("nic_slow", bed.nic_name(1, 0), bed.nic_mbit / trial.factor)
                inject_step, injected_at = last_step(metrics), time.monotonic()
            if detect_s is None and inject_step is not None and last > inject_step:
                with contextlib.suppress(InputError):  # no per-rank rows yet: try again
                    if _judge(detect_stragglers_in_metrics(rows, ranks_per_node=1), trial, True)[0]:
                        detect_s = time.monotonic() - injected_at
            if not running:
                break
            time.sleep(poll_s)
        else:
            raise TimeoutError(f"trial {trial} did not end in {timeout_s} s")
        for p in procs:
            if p.wait(timeout=30) != 0:
                logs = " | ".join(f.read_text(errors="replace")[-600:] for f in sorted(folder.glob("*.log")))
                raise RuntimeError(f"trial {trial}: a rank exited {p.returncode}: {logs}")
    finally:
        restore()
        for p in procs:
            if p.poll() is None:
                p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
        if quota is not None:
            quota.release()
        if fault is not None and bed is not None:
            bed.clear(fault)
    rows, _ = read_metrics(metrics)
    logged = train_steps(rows)
    detect_step, false_alarm, said = replay(rows, trial, inject_step)
    return Outcome(
        kind=trial.kind,
        network=on_testbed,
        how=trial.how if trial.kind == "compute" else None,
        nominal=None if trial.kind == "clean" else trial.factor,
        measured=_measured(rows, trial, inject_step) if inject_step is not None else None,
        inject_step=inject_step,
        detect_step=detect_step,
        detect_s=round(detect_s, 2) if detect_s is not None else None,
        found=detect_step is not None,
        false_alarm=false_alarm,
        said=said[:400],
        steps=logged[-1] if logged else 0,
    )
