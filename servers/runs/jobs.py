"""The run a launched job writes. A job whose script logs through a framework (TRL, verl, OpenRLHF) rather than
this suite's metrics file declares it in its spec, at plan time: spec["run_source"] = {"reader": NAME, "path":
PATH}, PATH relative to the job's directory (the recipe or template sets the framework's logger to write there).
A job without it has the suite's own metrics file (JobFiles.metrics), read by the "suite" reader."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from servers.core.errors import InputError
from servers.runs.registry import DEFAULT_HOSTS, Target

RUN_SOURCE_KEY = "run_source"


def run_source(reader: str, path: str) -> dict[str, str]:
    """The spec entry for a job whose framework writes its run at `path` (relative to the job directory)."""
    if Path(path).is_absolute() or ".." in Path(path).parts:
        raise ValueError(f"a job's run path is relative to its directory and stays inside it, got {path!r}")
    return {"reader": reader, "path": path}


def job_target(
    job_dir: Path, spec: Mapping[str, Any], metrics: Path, hosts: Iterable[str] = DEFAULT_HOSTS
) -> tuple[Target, str]:
    """(Target, reader name) of the run job `job_dir` writes: its declared run source, else its metrics file
    `metrics` with the suite reader. InputError when the declared path has not been written yet."""
    declared = spec.get(RUN_SOURCE_KEY) if isinstance(spec, Mapping) else None
    if not isinstance(declared, Mapping):
        return Target(str(metrics), path=metrics, hosts=tuple(hosts)), "suite"
    reader, relative = str(declared.get("reader", "")), str(declared.get("path", ""))
    root = job_dir.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise InputError(f"the job's declared run path {relative!r} leaves its directory")
    if not path.exists():
        raise InputError(
            f"the job's {reader} run ({relative} in its directory) has not been written yet: the framework writes "
            "it once training logs its first step"
        )
    return Target(str(path), path=path, hosts=tuple(hosts)), reader
