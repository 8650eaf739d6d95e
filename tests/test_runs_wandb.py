"""The W&B run reader (servers/runs/wandb_reader.py) on real W&B data: offline runs written by the wandb package
itself (WANDB_MODE=offline, in a child process: wandb.init starts its wandb-core service and hooks the console,
which a test process should not carry), and exported histories written with pandas in the shape of
run.history() / scan_history(). No network: offline mode, and the child gets no proxy to reach anything."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.runs import registry, wandb_reader
from servers.runs.registry import Target
from servers.runs.series import RunData, RunError
from servers.runs.vocabulary import resolve
from tests.helpers import wandb_offline_env

STEPS = 300
NAN_STEPS = (5, 50)
INF_STEPS = (7,)
BLOB_STEP = 120  # this step also logs a 100 kB text value: its record spans blocks (FIRST, MIDDLE, LAST)

WRITER = textwrap.dedent(
    """
    import math, sys, wandb
    steps, blob_step = int(sys.argv[1]), int(sys.argv[2])
    nan_steps, inf_steps = {5, 50}, {7}
    first = wandb.init(project="wb-test", name="first-run", config={"lr": 0.1})
    first.log({"loss": 1.0}, step=0)
    first.finish()
    run = wandb.init(
        project="wb-test",
        name="grpo-wandb",
        config={
            "trainer": {"nnodes": 2, "n_gpus_per_node": 4, "total_training_steps": 1000},
            "actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-0.5B"}},
            "lr": 1e-6,
        },
    )
    for step in range(steps):
        row = {
            "loss": 1.0 / (step + 1),
            "critic/score/mean": math.nan if step in nan_steps else step / steps,
            "ratio": math.inf if step in inf_steps else 0.5,
            "actor": {"entropy": 2.0 - step / steps},
            "note": "text",
        }
        if step == blob_step:
            row["blob"] = "x" * 100_000
        run.log(row, step=step)
    run.finish()
    """
)


def read(path: Path, keys: set[str] | None = None, cap: int = 100_000) -> RunData:
    return wandb_reader.read(Target(str(path), path=path), keys, cap)


def claims(path: Path) -> bool:
    return wandb_reader.detect(Target(str(path), path=path))


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wandb/ directory of two offline runs written by wandb itself: 'first-run' (one point), then
    'grpo-wandb' (STEPS steps of a few keys, NaN and inf values, a nested dict, a text key, one 100 kB row)."""
    root = tmp_path_factory.mktemp("wandb-offline")
    script = root / "write_run.py"
    script.write_text(WRITER)
    env = wandb_offline_env(root)
    done = subprocess.run(
        [sys.executable, str(script), str(STEPS), str(BLOB_STEP)],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return root / "wandb"


def latest_log(offline: Path) -> Path:
    runs = [p for p in offline.glob("offline-run-*/run-*.wandb")]
    assert len(runs) == 2
    return max(runs, key=lambda p: (p.parent.name[12:27], p.stat().st_mtime))


@pytest.mark.timeout(180)
def test_offline_run_reads_every_point_with_its_config_facts(offline: Path) -> None:
    run = read(offline)
    assert run.reader == "wandb" and run.name == "grpo-wandb"
    assert run.partial == [] and run.rows_read == STEPS and run.rows_skipped == 0
    loss = run.series["loss"]
    assert list(loss.steps) == list(range(STEPS)) and loss.read == STEPS and loss.stride == 1
    assert list(loss.values) == [1.0 / (s + 1) for s in range(STEPS)]
    score = run.series["critic/score/mean"]
    assert score.nonfinite == len(NAN_STEPS) and len(score) == STEPS - len(NAN_STEPS)
    assert list(score.steps) == [s for s in range(STEPS) if s not in NAN_STEPS]
    assert run.series["ratio"].nonfinite == len(INF_STEPS)
    entropy = run.series["actor.entropy"]  # a nested dict: named as W&B's backend flattens it
    assert len(entropy) == STEPS and entropy.values[-1] == pytest.approx(2.0 - (STEPS - 1) / STEPS)
    assert "note" in run.keys and "note" not in run.series and "blob" in run.keys  # text: seen, no points
    assert "_step" not in run.keys and not any(k.startswith("_wandb") for k in run.keys)
    times = list(loss.times)
    assert all(math.isfinite(t) for t in times) and times == sorted(times)
    assert abs(times[-1] - time.time()) < 3600  # _timestamp: unix seconds
    assert run.facts["nnodes"] == 2 and run.facts["gpus_per_node"] == 4 and run.facts["gpus"] == 8
    assert run.fact_sources["nnodes"] == "wandb config trainer.nnodes"
    assert run.fact_sources["gpus"] == "wandb config trainer.nnodes x trainer.n_gpus_per_node"
    assert run.facts["max_steps"] == 1000 and run.facts["model"] == "Qwen/Qwen2.5-0.5B"
    assert run.fact_sources["model"] == "wandb config actor_rollout_ref.model.path"
    assert resolve("reward", run.keys).key == "critic/score/mean"


@pytest.mark.timeout(180)
def test_the_latest_run_is_read_and_the_others_named(offline: Path) -> None:
    run = read(offline)
    log = latest_log(offline)
    assert run.source == str(log)
    (other,) = {p.parent.name for p in offline.glob("offline-run-*/run-*.wandb")} - {log.parent.name}
    assert any(f"read the latest of 2 runs, {log.parent.name}" in n and other in n for n in run.notes)
    earlier = read(offline / other)  # the run directory itself reads that run
    assert earlier.name == "first-run" and list(earlier.series["loss"].values) == [1.0]
    assert read(log).series["loss"].read == STEPS  # so does its .wandb file
    assert read(offline.parent).source == str(log)  # and the folder holding wandb/


@pytest.mark.timeout(180)
def test_detection_and_registry(offline: Path) -> None:
    log = latest_log(offline)
    for path in (offline, log.parent, log, offline.parent):
        assert claims(path)
        assert registry.detect(registry.target(str(path), roots=[offline.parent])).name == "wandb"
    assert not claims(offline / "latest-run")  # a symbolic link is not followed inside the reader; the registry
    latest = registry.target(str(offline / "latest-run"), roots=[offline.parent])  # resolves it inside the roots
    assert registry.read_run(latest).source == str(log)
    run = registry.read_run(registry.target(str(log), roots=[offline.parent]), keys=["loss"])
    assert set(run.series) == {"loss"} and "critic/score/mean" in run.keys


@pytest.mark.timeout(180)
def test_keys_and_cap_bound_what_is_kept(offline: Path) -> None:
    run = read(offline, keys={"loss"}, cap=50)
    loss = run.series["loss"]
    assert set(run.series) == {"loss"} and loss.read == STEPS and len(loss) < 100 and loss.stride > 1
    assert loss.steps[0] == 0


@pytest.mark.timeout(180)
def test_a_truncated_file_reads_what_was_complete_as_partial(offline: Path, tmp_path: Path) -> None:
    data = latest_log(offline).read_bytes()
    whole = read(latest_log(offline)).series["loss"]
    for size in (len(data) // 3, len(data) // 2, len(data) - 3, 32_768 + 5):
        cut = tmp_path / "run-cut.wandb"
        cut.write_bytes(data[:size])
        run = read(cut)
        assert any("cut off" in reason for reason in run.partial)
        assert any("no exit record" in reason for reason in run.partial)
        loss = run.series["loss"]
        assert 0 < len(loss) <= len(whole) and list(loss.values) == list(whole.values)[: len(loss)]
    tiny = tmp_path / "run-tiny.wandb"
    tiny.write_bytes(data[:12])
    with pytest.raises(RunError, match="cut off"):
        read(tiny)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(0.0, 1.0), flip=st.integers(0, 255))
@pytest.mark.timeout(180)
def test_any_cut_or_damaged_byte_never_crashes(offline: Path, tmp_path: Path, fraction: float, flip: int) -> None:
    data = bytearray(latest_log(offline).read_bytes())
    at = 7 + int(fraction * (len(data) - 8))
    data[at] ^= flip or 1
    bad = tmp_path / "run-bad.wandb"
    kept = bytes(data[: at + 1 + int(fraction * 1000)])
    bad.write_bytes(kept)
    try:
        run = read(bad)
    except RunError:
        return
    if len(kept) < len(data):
        assert run.partial  # cut (the exit record is the last): never said to be whole
    assert all(list(s.steps) == sorted(s.steps) for s in run.series.values())


@pytest.mark.timeout(180)
def test_a_damaged_block_is_skipped_and_said(offline: Path, tmp_path: Path) -> None:
    data = bytearray(latest_log(offline).read_bytes())
    data[40_000] ^= 0xFF  # inside the second block
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(bytes(data))
    run = read(bad)
    assert any("damaged" in reason for reason in run.partial)
    assert any("damaged block" in reason for reason in run.skipped_reasons)
    assert 0 < len(run.series["loss"]) < STEPS  # the block's rows are missing, the rest read
    assert run.series["loss"].steps[-1] == STEPS - 1


def export_frame(rows: int = 400) -> pd.DataFrame:
    """A history in W&B's exported shape: _step, _runtime, _timestamp and the keys, NaN where a key was not
    logged at that step (eval every 10 steps), an infinity logged once."""
    frame = pd.DataFrame(
        {
            "_step": range(rows),
            "_runtime": [0.5 * s for s in range(rows)],
            "_timestamp": [1.7e9 + 0.5 * s for s in range(rows)],
            "reward": [s / rows for s in range(rows)],
            "eval_accuracy": [s / rows if s % 10 == 0 else math.nan for s in range(rows)],
            "grad_norm": [math.inf if s == 3 else 1.0 for s in range(rows)],
            "phase": ["train"] * rows,
        }
    )
    return frame


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_an_exported_history_reads_every_row(tmp_path: Path, kind: str) -> None:
    frame = export_frame()
    path = tmp_path / f"history.{kind}"
    frame.to_csv(path, index=False) if kind == "csv" else frame.to_parquet(path, index=False)
    assert claims(path)
    run = read(path)
    assert run.reader == "wandb" and run.partial == [] and run.rows_read == 400
    reward = run.series["reward"]
    assert list(reward.steps) == list(range(400)) and reward.values[123] == pytest.approx(123 / 400)
    assert list(reward.times) == [1.7e9 + 0.5 * s for s in range(400)]
    accuracy = run.series["eval_accuracy"]  # NaN: not logged at that step, so absent and not counted
    assert list(accuracy.steps) == list(range(0, 400, 10)) and accuracy.nonfinite == 0
    assert run.series["grad_norm"].nonfinite == 1 and len(run.series["grad_norm"]) == 399
    assert "phase" in run.keys and "phase" not in run.series
    assert "_runtime" in run.series and "_step" not in run.keys
    assert resolve("val_accuracy", run.keys).key == "eval_accuracy"
    only = read(path, keys={"reward"})
    assert set(only.series) == {"reward"}


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_an_export_with_runtime_only_says_its_times_are_relative(tmp_path: Path, kind: str) -> None:
    frame = export_frame(20).drop(columns=["_timestamp"])
    path = tmp_path / f"history.{kind}"
    frame.to_csv(path, index=False) if kind == "csv" else frame.to_parquet(path, index=False)
    run = read(path)
    assert run.series["reward"].times[4] == pytest.approx(2.0)
    assert any("_runtime, seconds since the run started" in note for note in run.notes)


def test_csvs_and_parquets_without_a_step_column_are_not_claimed(tmp_path: Path) -> None:
    scaling = tmp_path / "points.csv"  # the suite's own scaling data: compute, metric
    scaling.write_text("compute,metric\n1e18,0.5\n2e18,0.6\n")
    assert not claims(scaling)
    with pytest.raises(InputError, match="no run reader recognises"):
        registry.detect(registry.target(str(scaling), roots=[tmp_path]))
    with pytest.raises(RunError, match="no _step column"):
        read(scaling)
    table = tmp_path / "other.parquet"
    pd.DataFrame({"step": [1, 2], "loss": [0.5, 0.4]}).to_parquet(table)
    assert not claims(table)
    with pytest.raises(RunError, match="no _step column"):
        read(table)
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(b"PAR1 _step but not a parquet file PAR1")
    assert not claims(fake)
    with pytest.raises(RunError, match="not a readable parquet"):
        read(fake)


def test_a_directory_without_a_run_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "wandb" / "offline-run-20260101_000000-abc").mkdir(parents=True)  # a run dir with no .wandb file
    (tmp_path / "notes.txt").write_text("nothing here")
    assert not claims(tmp_path)
    with pytest.raises(RunError, match="holds no W&B run"):
        read(tmp_path)
    with pytest.raises(InputError, match="offline-run"):
        registry.read_run(registry.target(str(tmp_path), roots=[tmp_path]), reader="wandb")


def test_a_file_that_is_not_a_transaction_log_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "run-junk.wandb"
    junk.write_bytes(b"not a wandb file at all" * 10)
    assert not claims(junk)
    with pytest.raises(RunError, match="no :W&B header"):
        read(junk)
    folder = tmp_path / "offline-run-20260101_000000-junk"
    folder.mkdir()
    (folder / "run-junk.wandb").write_bytes(b"junk")
    assert not claims(folder)


@pytest.mark.timeout(180)
def test_a_record_over_the_size_limit_is_skipped_and_counted(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wandb_reader, "MAX_RECORD_BYTES", 50_000)  # the 100 kB row (and its summary) pass it
    run = read(latest_log(offline))
    assert run.skipped_reasons.get("record over 0 MiB", 0) >= 1
    assert run.rows_read == STEPS - 1 and BLOB_STEP not in run.series["loss"].steps
    assert run.series["loss"].steps[-1] == STEPS - 1


def test_a_csv_line_over_the_limit_is_skipped_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wandb_reader, "MAX_LINE_CHARS", 100)
    path = tmp_path / "history.csv"
    path.write_text("_step,loss,text\n0,0.5,a\n1,0.4," + "x" * 5000 + "\n2,0.3,c\n")
    run = read(path)
    assert list(run.series["loss"].steps) == [0, 2] and run.skipped_reasons == {"line longer than 0 MiB": 1}


def test_typed_history_values_read_when_a_writer_sends_no_json() -> None:
    from wandb.proto import wandb_internal_pb2 as pb

    assert wandb_reader._history_value(pb.HistoryItem(key="a", value_json="Infinity")) == math.inf
    assert wandb_reader._history_value(pb.HistoryItem(key="a", value_json='"text"')) == "text"
    assert wandb_reader._history_value(pb.HistoryItem(key="a", number=2.5)) == 2.5
    assert wandb_reader._history_value(pb.HistoryItem(key="a", integer=3)) == 3
    assert wandb_reader._history_value(pb.HistoryItem(key="a", text="x")) is None
    assert wandb_reader._item_value(pb.ConfigItem(key="a")) is None  # a config item without its JSON
