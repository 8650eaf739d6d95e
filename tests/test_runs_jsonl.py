"""The JSON-lines run readers (servers/runs/verl.py: verl's file logger; servers/runs/suite.py: this suite's
metrics.jsonl) on what real logs hold: many rows read with bounded memory, cut-off and bad lines, NaN and inf,
restarts, unknown keys, a line too long to hold."""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import pytest

from servers.runs import jsonlines, registry, suite, verl
from servers.runs.registry import Target
from servers.runs.series import RunData, RunError


def read_verl(path: Path, keys: set[str] | None = None, cap: int = 100_000) -> RunData:
    return verl.read(Target(str(path), path=path), keys, cap)


def read_suite(path: Path, keys: set[str] | None = None, cap: int = 100_000) -> RunData:
    return suite.read(Target(str(path), path=path), keys, cap)


def verl_line(step: int, **data: object) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"  # verl/utils/tracking.py FileLogger.log's shape


def suite_line(step: int, **values: object) -> str:
    return json.dumps({"step": step, "time": 1000.0 + step, **values}) + "\n"


@pytest.mark.parametrize("kind", ["verl", "suite"])
def test_many_rows_are_read_with_bounded_memory(tmp_path: Path, kind: str) -> None:
    n, cap = 50_000, 50
    path = tmp_path / "run.jsonl"
    with path.open("w") as handle:
        if kind == "verl":
            handle.writelines(
                f'{{"step": {i}, "data": {{"critic/score/mean": {i}.5, "timing_s/step": 1.5}}}}\n' for i in range(n)
            )
        else:
            handle.writelines(f'{{"step": {i}, "time": {i}.0, "loss": {i}.5, "lr": 0.001}}\n' for i in range(n))
    reader = read_verl if kind == "verl" else read_suite
    tracemalloc.start()
    try:
        run = reader(path, cap=cap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert run.rows_read == n and run.rows_skipped == 0 and run.partial == []
    all_points = 2 * n * (8 + 8 + 8)  # two keys, every point kept as a step, a time and a value (array of 8 bytes)
    assert peak < all_points / 4, (peak, all_points)
    for series in run.series.values():
        assert series.read == n and len(series) < 2 * cap and series.stride > 1
        assert series.steps[0] == 0 and list(series.steps) == sorted(series.steps)
    assert any("thinned" in note for note in run.notes)


def test_verl_edge_cases(tmp_path: Path) -> None:
    path = tmp_path / "project" / "exp.jsonl"
    path.parent.mkdir()
    lines = [
        verl_line(1, **{"critic/score/mean": 0.1, "my/custom_metric": 5, "note": "text"}),
        "not json\n",
        "[1, 2]\n",
        json.dumps({"step": 2, "metrics": {}}) + "\n",  # no data object
        '{"step": 2, "data": {"critic/score/mean": NaN, "actor/entropy": Infinity}}\n',  # json.dumps(nan) writes these
        verl_line(3, **{"critic/score/mean": 0.3}),
        verl_line(3, **{"critic/score/mean": 0.35}),  # a duplicated step: the later value replaces it
        '{"step": 4, "data": {"critic/score/mean": 0.4, "x": "' + "y" * (jsonlines.MAX_LINE_BYTES + 10) + '"}}\n',
        verl_line(5, **{"critic/score/mean": 0.5}),
        verl_line(4, **{"critic/score/mean": 0.45, "my/custom_metric": 6}),  # resumed from step 4: a restart
        '{"step": 6, "data": {"critic/score/me',  # the run is still being written
    ]
    path.write_text("".join(lines))
    run = read_verl(path)
    score = run.series["critic/score/mean"]
    assert list(score.steps) == [1, 3, 4] and list(score.values) == [0.1, 0.35, 0.45]
    assert score.nonfinite == 1 and run.series["actor/entropy"].nonfinite == 1
    assert list(run.series["my/custom_metric"].values) == [5.0, 6.0]  # an unknown key kept as its source key
    assert "note" in run.keys and "note" not in run.series
    assert [(r.from_step, r.to_step) for r in run.restarts] == [(5, 4)]
    assert run.skipped_reasons == {
        "not JSON": 1,
        "not a JSON object": 1,
        "not a {step, data} record": 1,
        "line longer than 1 MiB": 1,
        "cut-off last line": 1,
    }
    assert len(run.partial) == 1 and "cut off" in run.partial[0]
    assert run.facts["project"] == "project"


def test_suite_edge_cases(tmp_path: Path) -> None:
    path = tmp_path / "job" / "metrics.jsonl"
    path.parent.mkdir()
    lines = [
        suite_line(1, loss=2.0, split="train"),
        suite_line(2, loss=None),  # the writer turns NaN and inf into null
        json.dumps({"time": 1.0, "loss": 1.0}) + "\n",  # no step
        json.dumps({"step": "3", "loss": 1.0}) + "\n",
        suite_line(3, loss=1.5, **{"custom/metric": 7}),
        suite_line(2, loss=1.75),  # steps going back: a resumed run
        "x" * (jsonlines.MAX_LINE_BYTES + 1) + "\n",
        suite_line(3, loss=1.25),
        '{"step": 4, "lo',
    ]
    path.write_text("".join(lines))
    run = read_suite(path)
    assert run.name == "job"
    loss = run.series["loss"]
    assert list(loss.steps) == [1, 2, 3] and list(loss.values) == [2.0, 1.75, 1.25]
    assert loss.nonfinite == 1 and list(loss.times) == [1001.0, 1002.0, 1003.0]
    assert "custom/metric" in run.keys and "split" in run.keys and "split" not in run.series
    assert list(run.series["custom/metric"].steps) == []  # step 3 superseded by the restart from step 2
    assert run.series["custom/metric"].superseded == 1
    assert [(r.from_step, r.to_step) for r in run.restarts] == [(3, 2)]
    assert run.skipped_reasons == {"no integer step": 2, "line longer than 1 MiB": 1, "cut-off last line": 1}
    assert run.partial and "cut off" in run.partial[0]


def test_empty_or_foreign_files_are_clear_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(RunError, match="no verl records"):
        read_verl(empty)
    with pytest.raises(RunError, match="no metric rows"):
        read_suite(empty)
    with pytest.raises(RunError, match="not a verl file-logger file"):
        read_verl(tmp_path)
    verl_file = tmp_path / "v.jsonl"
    verl_file.write_text(verl_line(0, a=1.0))
    suite_file = tmp_path / "m.jsonl"
    suite_file.write_text(suite_line(0, a=1.0))
    assert registry.detect(registry.target(str(verl_file), roots=[tmp_path])).name == "verl"
    assert registry.detect(registry.target(str(suite_file), roots=[tmp_path])).name == "suite"


def test_nan_literals_of_both_signs_count_as_nonfinite(tmp_path: Path) -> None:
    path = tmp_path / "v.jsonl"
    path.write_text("".join(verl_line(i, x=v) for i, v in enumerate([1.0, math.nan, math.inf, -math.inf, 2.0])))
    x = read_verl(path).series["x"]
    assert list(x.values) == [1.0, 2.0] and x.nonfinite == 3 and x.read == 5


def test_a_restart_supersedes_only_its_own_streams_points() -> None:
    from servers.runs.series import RunCollector

    collect = RunCollector(RunData("x", "x", "x"), None)
    for step in range(5):
        collect.add("a", step, math.nan, 1.0, stream="one")
        collect.add("b", step, math.nan, 2.0, stream="two")
    collect.add("a", 2, math.nan, 3.0, stream="one")  # stream one resumes from step 2
    run = collect.done()
    assert list(run.series["a"].steps) == [0, 1, 2] and run.series["a"].values[-1] == 3.0
    assert list(run.series["b"].steps) == [0, 1, 2, 3, 4]  # stream two is another run: untouched
    assert [(r.from_step, r.to_step) for r in run.restarts] == [(4, 2)]
    everything = RunCollector(RunData("x", "x", "x"), None)
    for key in ("a", "b"):
        everything.add(key, 3, math.nan, 1.0, stream=key)
    everything.restart(3, 1, math.nan)  # no stream: every key's points from step 1 on, as before
    assert all(len(s) == 0 for s in everything.done().series.values())
