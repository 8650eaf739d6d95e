"""Run one function on several rank processes joined in a torch.distributed process group.

`run_ranks(world_size, target, args, backend=..., timeout_s=...)` starts `world_size` fresh Python processes with
subprocess.Popen (not multiprocessing): each one imports the target by module and name, joins the group through a
TCP rendezvous on 127.0.0.1 at a free port, calls `target(info, *args)` and writes its return value (pickled) or its
exception into a scratch folder. The parent polls the processes and the folder, so:

- a rank that raises (or dies from a signal) ends the run at once: the other ranks are killed and RuntimeError names
  the rank that failed first, with its error;
- ranks still running when `timeout_s` has passed are killed and TimeoutError says which ones (a hung collective);
- each rank's stdout and stderr, including what C++ code (gloo, NCCL) prints, go to `log_dir/rank{r}.log`.

Why subprocess: the caller's `__main__` is never re-imported (multiprocessing's spawn does that, and needs guards),
the log redirection happens at the file-descriptor level, and ending a rank is a plain kill. The ranks stay in the
caller's process group, so a job cancel or timeout that kills the worker's group ends them too.

Plain module: torch is imported only inside functions (the server imports this package at start-up).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

# One probe and one set of decisions for the server and the worker: re-exported here for the work functions.
from servers.overlap.limits import check_memory, check_world_size, confirm_cuda_runtime, max_world_size, resolve_backend

__all__ = [
    "RankInfo",
    "check_memory",
    "check_world_size",
    "describe_device",
    "max_world_size",
    "rank_progress",
    "resolve_backend",
    "run_ranks",
    "slowest_rank_median",
    "slowest_rank_series",
    "time_iterations",
]

Backend = Literal["gloo", "nccl"]
# What a benchmark that runs ranks takes (the collective and overlap specs and their tools), typed once.
BackendChoice = Annotated[Literal["auto", "gloo", "nccl"], Field(description="auto: nccl if usable, else gloo")]
WorldSize = Annotated[int, Field(ge=1, le=64, description="Ranks: GPUs (nccl) or processes (gloo)")]
RankTimeoutS = Annotated[float, Field(gt=0, le=3600, description="A rank past it is ended as hung")]
_POLL_S = 0.05
_GRACE_AFTER_FAILURE_S = 1.0  # time the other ranks get to report their own error after a first failure
_BOOTSTRAP = (
    "import json, sys; sys.path[:0] = json.load(open(sys.argv[1])); "
    "from servers.overlap.distributed import _rank_main; sys.exit(_rank_main(sys.argv[2], int(sys.argv[3])))"
)


@dataclass(frozen=True)
class RankInfo:
    """What a rank's target is told about itself: its rank, the group size, the backend and its torch device."""

    rank: int
    world_size: int
    backend: str
    device: str  # "cpu" for gloo, "cuda:<rank>" for nccl


_progress_file: Path | None = None


def rank_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    """Report progress from inside a rank (only rank 0's reports reach the caller's `on_progress`)."""
    if _progress_file is None:
        return
    tmp = _progress_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"done": done, "total": total, "message": message}))
    os.replace(tmp, _progress_file)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _target_name(target: Callable[..., Any]) -> tuple[str, str]:
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"the rank target {target!r} must be a module-level function importable by name "
            "(not defined in __main__, not a lambda or a nested function)"
        )
    return module, qualname


def _describe_returncode(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def run_ranks(
    world_size: int,
    target: Callable[..., Any],
    args: tuple[Any, ...] | list[Any] = (),
    *,
    backend: str,
    timeout_s: float,
    log_dir: Path | str | None = None,
    on_progress: Callable[[float, float | None, str | None], None] | None = None,
) -> list[Any]:
    """Run `target(RankInfo, *args)` on `world_size` ranks; return the ranks' return values, in rank order.

    `backend`: gloo (CPU), nccl (rank r on cuda:r) or auto. `timeout_s` covers everything: start-up, the
    rendezvous and the work. `target` must be a module-level function, and args and return values picklable.
    Raises ValueError (InputError, from limits.py: a world size or backend this machine cannot run), RuntimeError
    (a rank failed: which and why; or CUDA does not initialise for nccl) or TimeoutError (ranks still running after
    timeout_s: a collective hung).
    """
    backend = resolve_backend(backend)
    check_world_size(world_size, backend)
    confirm_cuda_runtime(backend, world_size)
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    module, qualname = _target_name(target)

    with tempfile.TemporaryDirectory(prefix="ranks-") as scratch:
        run_dir = Path(scratch)
        logs = Path(log_dir) if log_dir is not None else run_dir
        logs.mkdir(parents=True, exist_ok=True)
        (run_dir / "sys_path.json").write_text(json.dumps([p for p in sys.path if p]))
        payload = {"module": module, "qualname": qualname, "args": tuple(args), "backend": backend}
        for attempt in range(2):
            payload["init_method"] = f"tcp://127.0.0.1:{free_port()}"
            payload["world_size"] = world_size
            payload["timeout_s"] = timeout_s
            with open(run_dir / "payload.pkl", "wb") as f:
                pickle.dump(payload, f)
            for r in range(world_size):
                for suffix in ("out", "err"):
                    (run_dir / f"rank{r}.{suffix}").unlink(missing_ok=True)
            try:
                return _launch_and_wait(run_dir, logs, world_size, timeout_s, on_progress)
            except _PortTakenError:
                if attempt == 1:
                    raise RuntimeError("the rendezvous port was taken twice in a row; try again") from None
        raise AssertionError("unreachable")


class _PortTakenError(Exception):
    pass


def _launch_and_wait(
    run_dir: Path,
    logs: Path,
    world_size: int,
    timeout_s: float,
    on_progress: Callable[[float, float | None, str | None], None] | None,
) -> list[Any]:
    env = dict(os.environ)
    if "GLOO_SOCKET_IFNAME" not in env and Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # every rank is on this host: the loopback interface always works
    env["PYTHONUNBUFFERED"] = "1"
    procs: list[subprocess.Popen[bytes]] = []
    log_files = []
    start = time.monotonic()
    progress_path = run_dir / "progress.json"
    last_progress = None
    exited_at: dict[int, float] = {}  # wall-clock time each rank was first seen ended, to order the failures
    try:
        for r in range(world_size):
            log = open(logs / f"rank{r}.log", "ab")  # noqa: SIM115 (closed in finally)
            log_files.append(log)
            # Several runs of one job (a tune sweep) share the rank logs: mark where each one starts.
            log.write(f"--- rank {r} of {world_size}, started {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
            log.flush()
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _BOOTSTRAP, str(run_dir / "sys_path.json"), str(run_dir), str(r)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        while True:
            codes = [p.poll() for p in procs]
            for r, c in enumerate(codes):
                if c is not None:
                    exited_at.setdefault(r, time.time())
            if on_progress is not None and progress_path.exists():
                with contextlib.suppress(OSError, ValueError):
                    report = json.loads(progress_path.read_text())
                    if report != last_progress:
                        last_progress = report
                        on_progress(report["done"], report.get("total"), report.get("message"))
            failed = [r for r, c in enumerate(codes) if c is not None and c != 0]
            if failed:
                deadline = time.monotonic() + _GRACE_AFTER_FAILURE_S
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    time.sleep(_POLL_S)
                killed = _kill_all(procs)
                raise _failure(run_dir, logs, procs, killed, exited_at)
            if all(c == 0 for c in codes):
                break
            if time.monotonic() - start > timeout_s:
                hung = [r for r, c in enumerate(codes) if c is None]
                _kill_all(procs)
                names = ", ".join(str(r) for r in hung)
                raise TimeoutError(
                    f"a collective hung: ranks {names} did not finish within {timeout_s:g} s "
                    f"(of {world_size}; they were killed; see the rank logs)"
                )
            time.sleep(_POLL_S)
    finally:
        _kill_all(procs)
        for log in log_files:
            log.close()
    results = []
    for r in range(world_size):
        with open(run_dir / f"rank{r}.out", "rb") as f:
            results.append(pickle.load(f))
    return results


def _kill_all(procs: list[subprocess.Popen[bytes]]) -> set[int]:
    """Kill the ranks still running; return which ones that was."""
    killed = set()
    for r, p in enumerate(procs):
        if p.poll() is None:
            killed.add(r)
            with contextlib.suppress(ProcessLookupError):
                p.kill()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
    return killed


# Errors a rank raises because a peer went away: a consequence of another rank's failure, never its cause while
# another rank failed otherwise (a rank killed by the OOM killer makes every peer's collective fail like this).
_PEER_LOST = re.compile(
    r"connection (reset|closed) by peer|broken pipe|connection refused|socket closed|peer.{0,20}(closed|gone|lost)",
    re.IGNORECASE,
)
_PEER_LOST_TYPES = {"DistNetworkError", "DistStoreError", "ConnectionResetError", "BrokenPipeError"}


def _failure(
    run_dir: Path,
    logs: Path,
    procs: list[subprocess.Popen[bytes]],
    killed: set[int],
    exited_at: dict[int, float],
) -> Exception:
    """The error that names the rank that failed first, and mentions the others.

    Order: a rank whose error says a peer went away comes after every other failure; within each group, by
    time (the time a rank recorded its error, or, for one that ended without recording, when it was seen
    ended, less one poll interval: it may have ended that much earlier).
    """
    reports = []
    for r, p in enumerate(procs):
        err_path = run_dir / f"rank{r}.err"
        if err_path.exists():
            with contextlib.suppress(OSError, ValueError):
                err = json.loads(err_path.read_text())
                secondary = err["type"] in _PEER_LOST_TYPES or bool(_PEER_LOST.search(err["message"]))
                reports.append((secondary, err["time"], r, f"{err['type']}: {err['message']}", err["type"]))
                continue
        if r not in killed and p.returncode not in (None, 0):
            tail = _log_tail(logs / f"rank{r}.log")
            oom = p.returncode == -signal.SIGKILL
            hint = " (SIGKILL from outside is often the out-of-memory killer)" if oom else ""
            detail = _describe_returncode(p.returncode) + hint + (f"; last log lines:\n{tail}" if tail else "")
            seen = exited_at.get(r, time.time()) - _POLL_S
            reports.append((False, seen, r, detail, "exit"))
    if not reports:
        return RuntimeError("a rank ended without recording why; see the rank logs")
    reports.sort()
    if any(kind == "_PortTakenError" for *_, kind in reports):
        return _PortTakenError()
    _, _, first, detail, _ = reports[0]
    message = f"rank {first} failed: {detail}"
    others = [f"rank {r}: {d.splitlines()[0][:200]}" for _, _, r, d, _ in reports[1:]]
    if others:
        message += " (then " + "; ".join(others) + ")"
    return RuntimeError(message)


def _rank_main(run_dir_text: str, rank: int) -> int:
    """Entry point of one rank process (see _BOOTSTRAP)."""
    global _progress_file
    run_dir = Path(run_dir_text)

    def record_error(kind: str, message: str) -> None:
        (run_dir / f"rank{rank}.err").write_text(json.dumps({"type": kind, "message": message, "time": time.time()}))

    try:
        with open(run_dir / "payload.pkl", "rb") as f:
            payload = pickle.load(f)
        import importlib
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        target: Any = importlib.import_module(payload["module"])
        for part in payload["qualname"].split("."):
            target = getattr(target, part)
        world_size = payload["world_size"]
        backend = payload["backend"]
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = f"cuda:{rank}"
        else:
            device = "cpu"
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        if rank == 0:
            _progress_file = run_dir / "progress.json"
        try:
            dist.init_process_group(
                backend,
                init_method=payload["init_method"],
                world_size=world_size,
                rank=rank,
                device_id=torch.device(device) if backend == "nccl" else None,
                # Longer than the caller's deadline, so that a hang is reported by the caller as a hang.
                timeout=timedelta(seconds=2 * float(payload["timeout_s"]) + 30),
            )
        except Exception as exc:  # a port another process took between free_port() and the bind: retried once
            if rank == 0 and "address already in use" in str(exc).lower():
                record_error("_PortTakenError", str(exc))
                return 3
            raise
        value = target(RankInfo(rank, world_size, backend, device), *payload["args"])
        with open(run_dir / f"rank{rank}.out.tmp", "wb") as f:
            pickle.dump(value, f)
        os.replace(run_dir / f"rank{rank}.out.tmp", run_dir / f"rank{rank}.out")
        # Rank 0 hosts the rendezvous store: nobody leaves while another rank may still need it.
        dist.barrier(device_ids=[rank] if backend == "nccl" else None)
        dist.destroy_process_group()
        return 0
    except BaseException as exc:
        # Record the error first, then leave at once: tearing down a group whose peers are stuck could hang.
        traceback.print_exc()
        record_error(type(exc).__name__, str(exc)[:2000])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def time_iterations(fn: Callable[[], Any], *, warmup: int, iters: int, cuda: bool) -> list[float]:
    """Milliseconds of each of `iters` calls of fn() after `warmup` untimed ones, with a barrier before each.

    Call it on every rank. CUDA: events on the current stream around the call (fn must leave all of its work
    ordered before the current stream's end); CPU: time.perf_counter.
    """
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times: list[float] = []
    for _ in range(iters):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def slowest_rank_series(per_rank: list[list[float]]) -> list[float]:
    """The slowest rank's time in each iteration (what the medians and the spreads are computed from)."""
    return [float(max(values)) for values in zip(*per_rank, strict=True)]


def slowest_rank_median(per_rank: list[list[float]]) -> float:
    """Median over iterations of the slowest rank's time in each iteration."""
    import statistics

    return float(statistics.median(slowest_rank_series(per_rank)))


def describe_device(backend: str) -> dict[str, str | None]:
    """device ("cpu" or "cuda"), device_name (torch's name of cuda:0, or "cpu") and gpu_catalog_name (the GPU
    catalog's entry for it, when there is one): the keys the cost model reads to match stored results to a GPU."""
    if backend != "nccl":
        return {"device": "cpu", "device_name": "cpu", "gpu_catalog_name": None}
    import torch

    name = torch.cuda.get_device_name(0)
    catalog = None
    try:
        from servers.core.gpus import find_gpu

        catalog = find_gpu(name).name
    except Exception:  # not catalogued (InputError), or the catalog cannot be read here
        catalog = None
    return {"device": "cuda", "device_name": name, "gpu_catalog_name": catalog}
