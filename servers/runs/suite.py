"""This suite's own metrics files (servers/launch/metrics.py): JSON lines {"step": N, "time": t, key: value, ...},
written by the bundled recipes and by any script using MetricsWriter. Standard library only."""

from __future__ import annotations

import math

from servers.runs.jsonlines import first_object, objects, step_of
from servers.runs.registry import Target
from servers.runs.series import RunCollector, RunData, RunError, number

RESERVED = ("step", "time")


def detect(target: Target) -> bool:
    path = target.path
    if path is None or not path.is_file() or path.suffix.lower() not in (".jsonl", ".ndjson"):
        return False
    first = first_object(path)
    return first is not None and step_of(first.get("step")) is not None and "data" not in first


def read(target: Target, keys: set[str] | None, cap: int) -> RunData:
    path = target.path
    if path is None or not path.is_file():
        raise RunError(f"{target.text!r} is not a metrics file")
    run = RunData("suite", str(path), path.parent.name or path.stem)
    collect = RunCollector(run, keys, cap)
    for row in objects(path, run):
        step = step_of(row.get("step"))
        if step is None:
            run.skip("no integer step")
            continue
        raw_time = number(row.get("time"))
        time = raw_time if raw_time is not None and math.isfinite(raw_time) else math.nan
        for key, raw in row.items():
            if key in RESERVED:
                continue
            value = number(raw)
            if value is None:
                collect.seen(key)
                if raw is None:  # the writer turns NaN and inf into null
                    collect.add(key, step, time, math.nan)
                continue
            collect.add(key, step, time, value)
    if run.rows_read == 0:
        raise RunError(f"{path} holds no metric rows")
    return collect.done()
