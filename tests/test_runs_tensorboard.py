"""The TensorBoard run reader (servers/runs/tensorboard.py) on real event files: written by torch's SummaryWriter
(which writes through the tensorboard package's own event writer) or by tensorboard's EventFileWriter for the
TF2 tensor encodings torch does not write."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from torch.utils.tensorboard import SummaryWriter

from servers.core.errors import InputError
from servers.runs import registry, tensorboard
from servers.runs.registry import Target
from servers.runs.series import RunData, RunError


def read(path: Path, keys: set[str] | None = None, cap: int = 100_000) -> RunData:
    return tensorboard.read(Target(str(path), path=path), keys, cap)


def write(logdir: Path, points: dict[str, list[tuple[int, float]]], *, stamp: int | None = None) -> Path:
    """One event file in `logdir` by SummaryWriter (simple_value scalars in step order, wall time = step + 1000),
    renamed to carry `stamp` as its timestamp when given. Returns the file."""
    logdir.mkdir(parents=True, exist_ok=True)
    before = set(logdir.iterdir())
    writer = SummaryWriter(str(logdir))
    in_order = sorted((step, i, tag, value) for i, (tag, values) in enumerate(points.items()) for step, value in values)
    for step, _, tag, value in in_order:  # as a trainer logs: every tag of a step, step after step
        writer.add_scalar(tag, value, step, walltime=1000.0 + step)
    writer.close()
    (made,) = set(logdir.iterdir()) - before
    if stamp is None:
        return made
    return made.rename(logdir / f"events.out.tfevents.{stamp:010d}.host.1.0")


def offsets(data: bytes) -> list[int]:
    """Where each record of an event file starts: length (8), its CRC (4), the data, the data's CRC (4)."""
    found, at = [], 0
    while at < len(data):
        found.append(at)
        at += 16 + struct.unpack("<Q", data[at : at + 8])[0]
    return found


def test_all_points_of_every_tag_are_read_past_tensorboards_sample(tmp_path: Path) -> None:
    n = 12_000  # EventAccumulator's default keeps a sample of 10,000 per tag
    writer = SummaryWriter(str(tmp_path))
    for step in range(n):
        writer.add_scalar("train/reward", step / n, step, walltime=500.0 + step)
        if step % 100 == 0:
            writer.add_scalar("train/kl", 0.5, step)
    writer.close()
    run = read(tmp_path)
    assert run.reader == "tensorboard" and run.name == tmp_path.name
    assert sorted(run.keys) == ["train/kl", "train/reward"]
    reward = run.series["train/reward"]
    assert len(reward) == reward.read == n and reward.stride == 1
    assert list(reward.steps) == list(range(n))
    assert reward.values[-1] == pytest.approx((n - 1) / n)  # float32 in the file
    assert reward.times[7] == 507.0
    assert len(run.series["train/kl"]) == n // 100
    assert run.partial == [] and run.rows_skipped == 0
    assert run.rows_read == n + n // 100 + 1  # one event per point, and the file_version record

    thinned = read(tmp_path, keys={"train/reward"}, cap=1000)  # the collector's bound
    assert set(thinned.series) == {"train/reward"} and len(thinned.series["train/reward"]) < 2000
    assert thinned.series["train/reward"].read == n


def test_tf1_and_tf2_scalar_encodings_read_and_other_summaries_are_passed_over(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path))
    writer.add_scalar("simple", 0.5, 1)
    writer.add_scalar("tensor_float", 0.25, 1, new_style=True)
    writer.add_scalar("tensor_double", 1 / 3, 1, new_style=True, double_precision=True)
    writer.add_histogram("weights", np.array([1.0, 2.0, 3.0]), 1)
    writer.add_text("notes", "hello", 1)
    writer.add_hparams({"lr": 0.1}, {"hp/score": 2.0}, run_name=".")  # a second writer in the same directory
    writer.close()

    # TF2's other encodings of one element, which torch does not write: tensor_content, int64_val, half_val.
    def tensor(dtype: int, **fields: object) -> tensor_pb2.TensorProto:
        return tensor_pb2.TensorProto(dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(), **fields)

    scalars = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    values = [
        summary_pb2.Summary.Value(
            tag="content", metadata=scalars, tensor=tensor(1, tensor_content=struct.pack("<f", 2.5))
        ),
        summary_pb2.Summary.Value(tag="int64", tensor=tensor(9, int64_val=[7])),
        summary_pb2.Summary.Value(tag="half", tensor=tensor(19, half_val=[0x3C00])),  # 1.0 in float16
        summary_pb2.Summary.Value(tag="bfloat", tensor=tensor(14, half_val=[0x4040])),  # 3.0 in bfloat16
        summary_pb2.Summary.Value(tag="vector", tensor=tensor_pb2.TensorProto(dtype=1, float_val=[1.0, 2.0])),
        summary_pb2.Summary.Value(tag="words", tensor=tensor(7, string_val=[b"x"])),
    ]
    other = EventFileWriter(str(tmp_path / "tf2"))
    other.add_event(event_pb2.Event(step=3, wall_time=9.0, summary=summary_pb2.Summary(value=values)))
    other.close()

    run = read(tmp_path)
    got = {k: (list(s.steps), list(s.values)) for k, s in run.series.items()}
    assert got["simple"] == ([1], [0.5])
    assert got["tensor_float"] == ([1], [0.25])
    assert got["tensor_double"] == ([1], [pytest.approx(1 / 3, rel=1e-15)])
    assert got["hp/score"] == ([0], [2.0])  # torch's add_hparams logs its metric as a scalar of its own file
    assert got["tf2/content"] == ([3], [2.5])
    assert got["tf2/int64"] == ([3], [7.0])
    assert got["tf2/half"] == ([3], [1.0])
    assert got["tf2/bfloat"] == ([3], [3.0])
    assert not {"weights", "notes", "tf2/vector", "tf2/words"} & set(run.series)
    assert not {"weights", "notes", "tf2/vector", "tf2/words"} & set(run.keys)
    # the hparams file starts at step 0 after step 1: another writer, not a restart that would supersede step 1
    assert run.restarts == [] and any("another writer" in n for n in run.notes)


def test_nan_and_inf_are_counted_not_kept(tmp_path: Path) -> None:
    write(tmp_path, {"loss": [(0, 1.0), (1, math.nan), (2, math.inf), (3, -math.inf), (4, 0.5)]})
    run = read(tmp_path)
    loss = run.series["loss"]
    assert list(loss.steps) == [0, 4] and list(loss.values) == [1.0, 0.5]
    assert loss.read == 5 and loss.nonfinite == 3
    assert any("non-finite" in n for n in run.notes)


def test_a_restart_into_a_new_file_supersedes_the_earlier_steps(tmp_path: Path) -> None:
    # Written out of order on purpose: the files are read by the timestamps in their names, not by creation.
    write(tmp_path, {"loss": [(s, 100.0 + s) for s in range(5, 15)]}, stamp=2_000_000_010)
    write(
        tmp_path, {"loss": [(s, float(s)) for s in range(10)], "lr": [(s, 0.1) for s in range(10)]}, stamp=2_000_000_009
    )
    run = read(tmp_path)
    loss = run.series["loss"]
    assert list(loss.steps) == list(range(15))
    assert list(loss.values) == [float(s) for s in range(5)] + [100.0 + s for s in range(5, 15)]
    assert list(run.series["lr"].steps) == list(range(5))  # the later attempt superseded lr from step 5 too
    assert [(r.from_step, r.to_step) for r in run.restarts] == [(9, 5)]
    assert run.restarts[0].at_time == 1005.0


def test_file_order_compares_numbers_as_numbers() -> None:
    names = [
        "events.out.tfevents.0000000002.h.1.10",
        "events.out.tfevents.0000000002.h.1.9",
        "events.out.tfevents.0000000001.h.7.0",
    ]
    assert sorted(names, key=lambda n: tensorboard._file_order(Path(n))) == [names[2], names[1], names[0]]


def test_subdirectories_are_runs_of_their_own_with_prefixed_tags(tmp_path: Path) -> None:
    write(tmp_path / "seed1", {"reward": [(s, 1.0) for s in range(10)]}, stamp=1_000_000_000)
    write(tmp_path / "seed1", {"reward": [(s, 2.0) for s in range(3, 6)]}, stamp=1_000_000_001)  # a restart
    write(tmp_path / "seed2" / "train", {"reward": [(s, 3.0) for s in range(10)]})
    write(tmp_path, {"top": [(0, 4.0)]})
    run = read(tmp_path)
    assert run.name == tmp_path.name
    assert sorted(run.series) == ["seed1/reward", "seed2/train/reward", "top"]
    assert list(run.series["seed1/reward"].steps) == [0, 1, 2, 3, 4, 5]
    # the restart of seed1 leaves seed2's run whole: restarts are per stream (directory)
    assert list(run.series["seed2/train/reward"].steps) == list(range(10))
    assert [(r.from_step, r.to_step) for r in run.restarts] == [(9, 3)]
    assert any("prefixed" in n for n in run.notes)


def test_one_directory_below_the_given_one_keeps_tag_names(tmp_path: Path) -> None:
    write(tmp_path / "runs" / "Dec01_host", {"train/reward": [(1, 0.5)]})
    run = read(tmp_path)
    assert list(run.series) == ["train/reward"] and run.name == "Dec01_host"


def test_prefixed_name_colliding_with_another_runs_key_is_skipped(tmp_path: Path) -> None:
    write(tmp_path, {"a/x": [(0, 1.0)]})
    write(tmp_path / "a", {"x": [(0, 2.0)]})
    run = read(tmp_path)
    assert list(run.series["a/x"].values) == [1.0]
    assert run.skipped_reasons == {"a tag whose name collides with another directory's": 1}


def test_a_truncated_file_reads_up_to_the_cut_and_is_partial(tmp_path: Path) -> None:
    path = write(tmp_path, {"loss": [(s, float(s)) for s in range(20)]})
    data = path.read_bytes()
    path.write_bytes(data[:-5])  # the last record loses its data CRC and a byte of data
    run = read(tmp_path)
    assert list(run.series["loss"].steps) == list(range(19))
    assert len(run.partial) == 1 and "cut off" in run.partial[0]
    assert run.skipped_reasons == {"cut-off last record": 1}
    path.write_bytes(data[: offsets(data)[1] + 4])  # cut inside the first point's header
    run = read(tmp_path)
    assert "loss" not in run.series and "cut off" in run.partial[0]


def test_a_damaged_record_in_the_middle_stops_the_file_and_is_said(tmp_path: Path) -> None:
    path = write(tmp_path, {"loss": [(s, float(s)) for s in range(20)]})
    data = bytearray(path.read_bytes())
    records = offsets(data)  # record 0 is the file_version, record k the point of step k - 1
    data[records[11] + 14] ^= 0xFF  # a byte of the 11th point's data: its CRC no longer matches
    path.write_bytes(bytes(data))
    run = read(tmp_path)
    assert list(run.series["loss"].steps) == list(range(10))
    assert len(run.partial) == 1 and "damaged record" in run.partial[0]
    assert f"{len(data) - records[11]:,} bytes after it were not read" in run.partial[0]
    assert run.skipped_reasons == {"damaged record": 1}


def test_a_file_still_being_written_reads_what_was_flushed(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path))
    try:
        for step in range(50):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.flush()
        run = read(tmp_path)
        assert list(run.series["loss"].steps) == list(range(50)) and run.partial == []
        writer.add_scalar("loss", 0.0, 50)
        writer.flush()
        assert read(tmp_path).series["loss"].steps[-1] == 50
    finally:
        writer.close()


def test_no_event_files_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("x")
    with pytest.raises(RunError, match=r"no TensorBoard event files \(\*tfevents\*\) in .* or below it"):
        read(tmp_path)
    with pytest.raises(RunError, match="not a TensorBoard event file"):
        read(tmp_path / "sub" / "notes.txt")
    assert not tensorboard.detect(Target(str(tmp_path), path=tmp_path))
    with pytest.raises(InputError, match="no run reader recognises"):
        registry.detect(registry.target(str(tmp_path), roots=[tmp_path]))
    with pytest.raises(InputError, match="no TensorBoard event files"):
        registry.read_run(registry.target(str(tmp_path), roots=[tmp_path]), reader="tensorboard")


def test_registry_detects_the_directory_and_one_file(tmp_path: Path) -> None:
    path = write(tmp_path / "logs" / "run", {"train/reward": [(1, 0.5), (2, 0.75)]})
    for source in (tmp_path / "logs", path):
        where = registry.target(str(source), roots=[tmp_path])
        assert registry.detect(where).name == "tensorboard"
        run = registry.read_run(where, keys=["train/reward"])
        assert list(run.series["train/reward"].values) == [0.5, 0.75]


def test_symbolic_links_are_not_followed_and_the_walk_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    write(outside, {"secret": [(0, 1.0)]})
    inside = tmp_path / "inside"
    write(inside / "a", {"x": [(0, 1.0)]})
    write(inside / "b", {"y": [(0, 2.0)]})
    os.symlink(outside, inside / "linked_dir")
    os.symlink(next(outside.iterdir()), inside / "a" / "events.out.tfevents.9999999999.linked.1.0")
    run = read(inside)
    assert sorted(run.series) == ["a/x", "b/y"]
    monkeypatch.setattr(tensorboard, "MAX_FILES", 1)
    run = read(inside)
    assert list(run.series) == ["a/x"] and "only the first 1 of 2 event files" in run.partial[0]
    monkeypatch.setattr(tensorboard, "MAX_DIRS", 2)  # the given directory and a/: one directory found, no prefix
    run = read(inside)
    assert list(run.series) == ["x"] and any("first 2 directories" in p for p in run.partial)


def test_detect_is_cheap_and_imports_no_tensorboard(tmp_path: Path) -> None:
    import subprocess
    import sys

    write(tmp_path, {"x": [(0, 1.0)]})
    code = (
        "import sys; from pathlib import Path; from servers.runs import tensorboard as t; "
        "from servers.runs.registry import Target; p = Path(sys.argv[1]); "
        "assert t.detect(Target(str(p), path=p)); assert 'tensorboard' not in sys.modules, 'imported'"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=60, cwd=Path(__file__).parents[1])


def test_large_steps_read_exactly(tmp_path: Path) -> None:
    write(tmp_path, {"loss": [(0, 3.5), (2**40, 1.0), (2**62, 0.5)]})
    assert list(read(tmp_path).series["loss"].steps) == [0, 2**40, 2**62]


def test_tags_past_the_key_limit_are_counted_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from servers.runs import series

    monkeypatch.setattr(series, "MAX_KEYS", 3)
    monkeypatch.setattr(tensorboard, "MAX_KEYS", 3)
    write(tmp_path, {f"tag{i}": [(0, float(i)), (1, float(i))] for i in range(5)})
    run = read(tmp_path)
    assert run.keys == ["tag0", "tag1", "tag2"] and run.keys_dropped == 2 and run.rows_skipped == 0
