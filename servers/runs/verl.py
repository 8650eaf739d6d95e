"""verl's file logger: JSON lines {"step": N, "data": {key: value, ...}} written by verl/utils/tracking.py's
FileLogger (trainer.logger including 'file') to VERL_FILE_LOGGER_PATH, or by default to
$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl. The lines carry no wall time: verl logs its own per-step
timing (timing_s/step), which the compute axis uses. Standard library only."""

from __future__ import annotations

import math

from servers.runs.jsonlines import first_object, objects, step_of
from servers.runs.registry import Target
from servers.runs.series import RunCollector, RunData, RunError, number


def detect(target: Target) -> bool:
    path = target.path
    if path is None or not path.is_file():
        return False
    first = first_object(path)
    return first is not None and step_of(first.get("step")) is not None and isinstance(first.get("data"), dict)


def read(target: Target, keys: set[str] | None, cap: int) -> RunData:
    path = target.path
    if path is None or not path.is_file():
        raise RunError(f"{target.text!r} is not a verl file-logger file")
    run = RunData("verl", str(path), path.stem)
    if path.parent.name:
        run.fact("project", path.parent.name, "the file's directory (VERL_FILE_LOGGER_ROOT/<project>/<experiment>)")
    collect = RunCollector(run, keys, cap)
    for row in objects(path, run):
        step = step_of(row.get("step"))
        data = row.get("data")
        if step is None or not isinstance(data, dict):
            run.skip("not a {step, data} record")
            continue
        for key, raw in data.items():
            value = number(raw)
            if value is None:
                collect.seen(str(key))
                continue
            collect.add(str(key), step, math.nan, value)
    if run.rows_read == 0:
        raise RunError(f"{path} holds no verl records")
    return collect.done()
