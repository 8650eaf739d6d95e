"""Code the bundled recipes share: distributed setup, checkpoints, the metrics writer and the GPU catalog.

torchrun runs a recipe as a file, not as part of the ``servers`` package, so the recipes import this module by
putting their own folder on ``sys.path``; it must therefore not import ``servers`` either. The metrics writer is
loaded from ``../metrics.py`` by path (it is standard library only).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
CHECKPOINT_ENV = "LLM_INFRA_MCP_CHECKPOINT_DIR"
_CKPT_RE = re.compile(r"^step_(\d+)\.pt$")


def load_metrics_module() -> ModuleType:
    """servers/launch/metrics.py, loaded by path under a private name (no dependency on the package)."""
    name = "llm_infra_mcp_metrics"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE.parent / "metrics.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE.parent / 'metrics.py'}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None when running as a single process without a process group
    restart_count: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Dist:
    """Read torchrun's variables; nccl on cuda:LOCAL_RANK when GPUs exist, gloo on CPU. A plain `python script.py`
    (no WORLD_SIZE) runs as one process without a process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if world > 1:
        if backend == "nccl":
            dist.init_process_group(backend, device_id=device)
        else:
            dist.init_process_group(backend)
        world = dist.get_world_size()
        rank = dist.get_rank()
    else:
        backend = None
    return Dist(rank, local_rank, world, device, backend, restarts)


def finish_distributed() -> None:
    """After a run that ended well on this rank: wait for every rank (rank 0 may still evaluate or save) before
    the group is torn down; a rank that tears gloo down while another still uses it can abort. Not for failures:
    a rank that failed must not wait for the others."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_mean(values: list[float], d: Dist) -> list[float]:
    """The mean of each value over ranks (identity without a process group)."""
    if d.backend is None:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return (t / d.world_size).tolist()


def checkpoint_dir(arg: str | None) -> Path | None:
    """--ckpt-dir when given, else LLM_INFRA_MCP_CHECKPOINT_DIR, else None (no checkpoints)."""
    value = arg or os.environ.get(CHECKPOINT_ENV) or None
    return Path(value) if value else None


RNG_KEY = "torch_rng"


def rng_state() -> dict[str, Any]:
    """torch's global random state: the CPU generator's, and every CUDA device's when CUDA is initialised."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set torch's global random state back to `state` (from rng_state); the CUDA states of the devices present
    (a checkpoint from a machine with more devices restores the first ones)."""
    torch.set_rng_state(state["cpu"].cpu())
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        for index, device_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state.cpu(), index)


def save_checkpoint(directory: Path | None, step: int, state: dict[str, Any], d: Dist, keep: int = 2) -> Path | None:
    """Rank 0 writes step_<step>.pt atomically (temporary file, then rename) and keeps the newest `keep`. The file
    also carries torch's global random state (rng_state, under RNG_KEY), which load_latest_checkpoint restores, so
    that a resumed run draws what the run made straight through would have drawn. Rank 0's state stands for every
    rank's: the recipes seed every rank alike and draw the same amounts on each (per-rank draws use their own
    generators)."""
    if directory is None or not d.is_main:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{step:08d}.pt"
    tmp = directory / f".step_{step:08d}.pt.tmp{os.getpid()}"
    torch.save({"step": step, **state, RNG_KEY: rng_state()}, tmp)
    os.replace(tmp, path)
    for old in _checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def _checkpoints(directory: Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _CKPT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def load_latest_checkpoint(
    directory: Path | None, device: torch.device, *, restore_rng: bool = True
) -> dict[str, Any] | None:
    """The newest readable checkpoint in `directory` (an unreadable one is skipped with a message), or None. With
    `restore_rng` (the default), torch's global random state is set back to the one saved with it (checkpoints
    older than that have none: the state is left as it is)."""
    if directory is None or not directory.is_dir():
        return None
    for path in reversed(_checkpoints(directory)):
        try:
            state: dict[str, Any] = torch.load(path, map_location=device, weights_only=True)
        except Exception as exc:  # a damaged file: fall back to the one before
            print(f"[recipe] could not read checkpoint {path}: {exc}; trying an older one", flush=True)
            continue
        if restore_rng and isinstance(state.get(RNG_KEY), dict):
            restore_rng_state(state[RNG_KEY])
        return state
    return None


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.lower()).removeprefix("nvidia").removeprefix("amd")


def catalog_path() -> Path | None:
    """resources/gpus.json in a checkout (../../../resources) or in an installed wheel (../../_data/resources)."""
    for candidate in (
        HERE.parents[2] / "resources" / "gpus.json",
        HERE.parents[1] / "_data" / "resources" / "gpus.json",
    ):
        if candidate.is_file():
            return candidate
    return None


def gpu_peak_tflops(device_name: str, dtype: str = "bf16") -> tuple[str, float] | None:
    """(catalog name, dense peak TFLOP/s for dtype) of the catalogued GPU that `device_name` (e.g. from
    torch.cuda.get_device_name) matches loosely, or None. Exact alias matches win; otherwise the longest alias
    contained in the device name."""
    path = catalog_path()
    if path is None:
        return None
    try:
        gpus = json.loads(path.read_text())["gpus"]
    except (OSError, ValueError, KeyError):
        return None
    key = _norm(device_name)
    best: tuple[int, dict[str, Any]] | None = None
    for gpu in gpus:
        for label in (gpu["name"], *gpu.get("aliases", ())):
            alias = _norm(label)
            if not alias:
                continue
            if alias == key:
                best = (10_000, gpu)
            elif alias in key and (best is None or len(alias) > best[0]):
                best = (len(alias), gpu)
    if best is None:
        return None
    peak = best[1].get(f"{dtype}_tflops")
    return (best[1]["name"], float(peak)) if peak else None


class Timer:
    """Wall time that survives restarts: `offset` seconds from earlier attempts plus this process's time."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return self.offset + time.perf_counter() - self.start


class StepTimes:
    """Per-rank step timing: each rank's own work per step (`work_s`: from the step's start to the end of its
    computation, before it waits for the others) and the whole step (`step_s`), averaged over the steps since the
    last report; `report` gathers them from every rank (a collective: every rank must call it at the same step)
    for rank 0 to log as lists indexed by rank (rank_work_s, rank_step_s). The straggler arguments slow one rank's
    work by sleeping in `work_done`."""

    def __init__(self, d: Dist, slow_rank: int = -1, slow_factor: float = 1.0, slow_from_step: int = 0) -> None:
        self.d = d
        self.slow = d.rank == slow_rank and slow_factor > 1.0
        self.factor = slow_factor
        self.from_step = slow_from_step
        self._start = 0.0
        self._work = 0.0
        self._step = 0.0
        self._count = 0

    def start(self) -> None:
        self._start = time.perf_counter()

    def work_done(self, step: int) -> None:
        if self.slow and step >= self.from_step:
            time.sleep((time.perf_counter() - self._start) * (self.factor - 1.0))
        self._work += time.perf_counter() - self._start

    def end(self) -> None:
        self._step += time.perf_counter() - self._start
        self._count += 1

    def report(self) -> dict[str, list[float]]:
        n = max(1, self._count)
        mine = [self._work / n, self._step / n]
        self._work = self._step = 0.0
        self._count = 0
        if self.d.backend is None:
            rows = [mine]
        else:
            t = torch.tensor(mine, dtype=torch.float64, device=self.d.device)
            gathered = [torch.zeros_like(t) for _ in range(self.d.world_size)]
            dist.all_gather(gathered, t)
            rows = [g.tolist() for g in gathered]
        return {
            "rank_work_s": [round(r[0], 6) for r in rows],
            "rank_step_s": [round(r[1], 6) for r in rows],
        }
