"""The metrics contract between a training script and the launch server, in the standard library only.

A script finds the path of a JSON-lines file in the environment variable ``LLM_INFRA_MCP_METRICS``; rank 0 appends
one object per logged step: ``{"step": int, "time": unix seconds, ...}`` with any of loss, lr, grad_norm, tokens,
tokens_per_s, mfu, pass_rate, compute_flops, compute_gpu_hours and split ("train" or "eval"). Values that are not
finite numbers (nan, inf) are written as null, so every line is strict JSON.

This file has no dependencies beyond Python itself: copy it next to a training script or import it.

- ``MetricsWriter``: append rows (only rank 0 by default), one flushed line per call.
- ``read_metrics``: read such a file back, skipping (and counting) lines that are not valid rows.

Runs logged by a framework (TensorBoard event files, verl's file logger, TRL, MLflow, W&B) are read by the run
readers of servers/runs, not here.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

METRICS_ENV = "LLM_INFRA_MCP_METRICS"
CHECKPOINT_ENV = "LLM_INFRA_MCP_CHECKPOINT_DIR"


def _clean(value: Any) -> Any:
    """A JSON-safe version of `value`: non-finite floats become None, scalar tensors/arrays their Python number."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)  # numpy and torch scalars
    if callable(item):
        try:
            return _clean(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


class MetricsWriter:
    """Appends metric rows to a JSON-lines file.

    path: the file; by default the value of LLM_INFRA_MCP_METRICS. With neither, the writer is disabled (``log``
    still returns the row, so a script can print it). rank: this process's rank, by default the RANK environment
    variable (0 when unset). Only rank 0 writes unless all_ranks=True.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, rank: int | None = None, all_ranks: bool = False):
        if path is None:
            path = os.environ.get(METRICS_ENV) or None
        self.path: Path | None = Path(path) if path is not None else None
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else int(rank)
        self.enabled = self.path is not None and (all_ranks or self.rank == 0)
        self._handle: TextIO | None = None

    def log(self, step: int, **values: Any) -> dict[str, Any]:
        """Append {"step", "time", **values} as one line and flush it. Returns the row as written."""
        row: dict[str, Any] = {"step": int(step), "time": time.time()}
        for key, value in values.items():
            if key in ("step", "time"):
                raise ValueError(f"{key!r} is set by the writer; pass the other values only")
            row[key] = _clean(value)
        if self.enabled:
            if self._handle is None:
                assert self.path is not None
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open across calls)
            self._handle.write(json.dumps(row, allow_nan=False) + "\n")  # one write per row
            self._handle.flush()
        return row

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """(rows, skipped): every line that is a JSON object with an integer "step", in file order, and the number of
    non-blank lines that were not (bad JSON, a cut-off last line, no step). A missing file reads as ([], 0)."""
    rows: list[dict[str, Any]] = []
    skipped = 0
    try:
        handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except FileNotFoundError:
        return rows, 0
    with handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                skipped += 1
                continue
            step = row.get("step") if isinstance(row, dict) else None
            if isinstance(step, float) and step.is_integer():
                row["step"] = step = int(step)
            if not isinstance(step, int) or isinstance(step, bool):
                skipped += 1
                continue
            rows.append(row)
    return rows, skipped
