"""The compute axis of a run (servers/runs/compute.py) and a run's curve points (servers/runs/points.py), on runs
written by the real producers: verl's Tracking with its file backend, this suite's MetricsWriter, and
torch's TensorBoard SummaryWriter. The metric is a sigmoid in log compute with seeded noise."""

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.runs import compute as axes
from servers.runs.points import end_compute, job_plan, planned_steps, read_points
from servers.runs.registry import Target, read_run

pytestmark = pytest.mark.timeout(120)

TRUTH = {"A": 0.7, "B": 1.5, "C_mid": 4.0, "R0": 0.1}
STEP_S, GPUS, TOKENS, STEPS = 36.0, 8, 4096, 200  # 0.08 GPU-hours per step: 16 at the end
VAL_EVERY = 5
VAL_KEY = "val-core/gsm8k/acc/mean@1"


def sigmoid(c: np.ndarray | float, A: float, B: float, C_mid: float, R0: float) -> Any:  # noqa: N803
    return R0 + (A - R0) / (1 + (C_mid / c) ** B)


def curve(seed: int, steps: int = STEPS, noise: float = 0.01, **truth: float) -> dict[str, np.ndarray]:
    """Per step (1..steps): its seconds, tokens, cumulative GPU-hours, the reward and the validation accuracy."""
    p = {**TRUTH, **truth}
    rng = np.random.default_rng(seed)
    seconds = STEP_S * (1 + rng.uniform(-0.05, 0.05, steps))
    tokens = TOKENS + rng.integers(-256, 256, steps)
    hours = np.cumsum(seconds) * GPUS / 3600
    value = sigmoid(hours, **p)
    return {
        "seconds": seconds,
        "tokens": tokens,
        "hours": hours,
        "reward": np.clip(value + rng.normal(0, noise, steps), 0, 1),
        "val": np.clip(value + rng.normal(0, noise, steps), 0, 1),
    }


def write_verl(
    path: Path, seed: int = 0, upto: int = STEPS, extra: dict[str, float] | None = None, **truth: float
) -> dict[str, np.ndarray]:
    """A verl run written by verl's own Tracking (file backend, VERL_FILE_LOGGER_PATH): steps 1..upto."""
    from verl.utils.tracking import Tracking

    data = curve(seed, **truth)
    old = os.environ.get("VERL_FILE_LOGGER_PATH")
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        tracking = Tracking("scaling", path.stem, default_backend=["file"])
        for i in range(upto):
            step = i + 1
            row = {
                "critic/score/mean": float(data["reward"][i]),
                "timing_s/step": float(data["seconds"][i]),
                "perf/total_num_tokens": int(data["tokens"][i]),
                "response_length/mean": 200.0 + i,
            }
            if step % VAL_EVERY == 0:
                row[VAL_KEY] = float(data["val"][i])
                row.update(extra or {})
            tracking.log(data=row, step=step)
        tracking.logger["file"].finish()
    finally:
        if old is None:
            os.environ.pop("VERL_FILE_LOGGER_PATH", None)
        else:
            os.environ["VERL_FILE_LOGGER_PATH"] = old
    return data


class Clock:
    """The wall clock MetricsWriter stamps its rows with, set by the test."""

    def __init__(self) -> None:
        self.now = 1.7e9

    def time(self) -> float:
        return self.now


def write_suite(
    path: Path, monkeypatch: pytest.MonkeyPatch, steps: list[int], seed: int = 0, pause_at: int | None = None
) -> dict[str, np.ndarray]:
    """A suite metrics.jsonl written by MetricsWriter: pass_rate at each step, one STEP_S-second step apart (a
    1000 s pause before step `pause_at`); steps may go back (a resumed run)."""
    import servers.launch.metrics as metrics

    clock = Clock()
    monkeypatch.setattr(metrics, "time", clock)
    data = curve(seed)
    with metrics.MetricsWriter(path) as writer:
        for step in steps:
            clock.now += STEP_S + (1000.0 if step == pause_at else 0.0)
            writer.log(step, pass_rate=float(data["val"][step]), device="cpu")
    return data


def run_of(path: Path, keys: set[str] | None = None) -> Any:
    return read_run(Target(str(path), path=path), keys=keys)


@pytest.fixture(scope="module")
def verl_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("verl") / "grpo.jsonl"
    return path, write_verl(path)


def test_gpu_hours_from_verl_per_step_timing_and_the_gpus_given(verl_file: tuple[Path, Any]) -> None:
    path, data = verl_file
    run = run_of(path)
    axis = axes.axis(run, "gpu_hours", axes.Given(gpus=GPUS))
    assert axis.unit == "gpu_hours" and axis.steps == list(range(1, STEPS + 1))
    assert np.allclose(axis.compute, data["hours"], rtol=1e-9)
    assert "timing_s/step" in axis.assumption and "8 GPU(s)" in axis.assumption
    # auto, with the GPUs known and no logged compute key: gpu_hours, the first derivation in trust
    assert axes.axis(run, "auto", axes.Given(gpus=GPUS)).choice == "gpu_hours"


def test_gpu_hours_without_a_gpu_count_says_how_to_give_it(verl_file: tuple[Path, Any]) -> None:
    run = run_of(verl_file[0])
    with pytest.raises(InputError, match=r"GPU count is unknown.*data\.run\.gpus"):
        axes.axis(run, "gpu_hours", axes.Given())
    with pytest.raises(InputError, match=r"compute 'auto'.*data\.run\.gpus.*parameter count"):
        axes.axis(run, "auto", axes.Given())


def test_flops_from_params_and_per_step_tokens_state_the_formula(verl_file: tuple[Path, Any]) -> None:
    run = run_of(verl_file[0])
    n = 5e8
    axis = axes.axis(run, "flops", axes.Given(params=n))
    assert np.allclose(axis.compute, 6 * n * np.cumsum(verl_file[1]["tokens"]), rtol=1e-12)
    assert "6 N D_train + 2 N D_gen" in axis.assumption and "generation FLOPs not counted" in axis.assumption
    with pytest.raises(InputError, match="parameter count"):
        axes.axis(run, "flops", axes.Given())


def test_validation_every_k_steps_gets_the_cumulative_compute_of_its_step(verl_file: tuple[Path, Any]) -> None:
    path, data = verl_file
    result = read_points(
        Target(str(path), path=path), reader=None, metric=None, choice="gpu_hours", given=axes.Given(gpus=GPUS)
    )
    assert result.metric.key == VAL_KEY and result.metric.requested == "val_accuracy"
    assert [s for _, _, s in result.points] == list(range(VAL_EVERY, STEPS + 1, VAL_EVERY))
    for c, v, s in result.points:
        assert c == pytest.approx(data["hours"][s - 1], rel=1e-9) and v == pytest.approx(data["val"][s - 1])
    info = result.info()
    assert info["metric_key"] == VAL_KEY and info["compute"] == "gpu_hours" and info["vocabulary"]["reward"]
    # only the metric and what the axis needs were kept in memory
    assert set(result.run.series) <= {VAL_KEY, "timing_s/step"}


def test_unknown_and_ambiguous_metrics_are_errors_that_list_keys(tmp_path: Path) -> None:
    path = tmp_path / "two.jsonl"
    write_verl(path, upto=20, extra={"val-core/math/acc/mean@1": 0.3})
    where = Target(str(path), path=path)
    with pytest.raises(InputError, match=r"matches 2 keys.*val-core/gsm8k.*val-core/math"):
        read_points(where, reader=None, metric="val_accuracy", choice="steps", given=axes.Given())
    with pytest.raises(InputError, match=r"no key 'pass@1'.*timing_s/step"):
        read_points(where, reader=None, metric="pass@1", choice="steps", given=axes.Given())
    steps = read_points(where, reader=None, metric="reward", choice="steps", given=axes.Given())
    assert steps.axis.unit == "steps" and [c for c, _, _ in steps.points] == [float(s) for s in range(1, 21)]


def test_a_logged_compute_key_is_taken_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servers.launch.metrics as metrics

    path = tmp_path / "metrics.jsonl"
    with metrics.MetricsWriter(path) as writer:
        for step in range(1, 11):
            writer.log(step, pass_rate=0.1 * step / 2, compute_flops=1e12 * step)
    run = run_of(path)
    axis = axes.axis(run, "auto", axes.Given())
    assert axis.choice == "compute_flops" and axis.unit == "flops" and axis.compute[-1] == 1e13
    with pytest.raises(InputError, match="no values for that key"):
        axes.axis(run, "compute_gpu_hours", axes.Given())


def test_wall_time_gaps_are_left_out_and_cpu_jobs_count_process_hours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "metrics.jsonl"
    write_suite(path, monkeypatch, list(range(1, 41)), pause_at=20)
    axis = axes.axis(run_of(path), "gpu_hours", axes.Given(gpus=2, gpus_from="job x's launch plan", cpu=True))
    # 40 steps of 36 s on 2 processes; the 1000 s pause is not compute
    assert axis.compute[-1] == pytest.approx(40 * STEP_S * 2 / 3600, rel=1e-9)
    assert any("1 wall-time gap(s)" in n and "1000 s not counted" in n for n in axis.notes)
    assert "CPU-process hours" in axis.assumption and "wall time between consecutive logged steps" in axis.assumption


def test_a_resumed_run_does_not_count_its_superseded_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "metrics.jsonl"
    # steps 1..30, then a resume from the checkpoint at step 20: 20..40 logged again, later
    write_suite(path, monkeypatch, list(range(1, 31)) + list(range(20, 41)), pause_at=None)
    run = run_of(path)
    assert [(r.from_step, r.to_step) for r in run.restarts] == [(30, 20)]
    axis = axes.axis(run, "gpu_hours", axes.Given(gpus=1))
    assert axis.steps == list(range(1, 41))
    assert axis.compute[-1] == pytest.approx(40 * STEP_S / 3600, rel=1e-9)  # each step once
    assert any("restart(s) or resume(s) (step 30 back to 20)" in n for n in axis.notes)
    assert any("wall-time gap" in n for n in axis.notes)  # the resume's wall-time jump is not compute either


def test_tensorboard_wall_times_give_gpu_hours(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    data = curve(3)
    logdir = tmp_path / "tb"
    writer = SummaryWriter(str(logdir))
    start = 1.7e9
    for i in range(60):
        writer.add_scalar("train/reward", float(data["reward"][i]), i + 1, walltime=start + STEP_S * (i + 1))
    writer.close()
    result = read_points(
        Target(str(logdir), path=logdir), reader=None, metric="reward", choice="gpu_hours", given=axes.Given(gpus=4)
    )
    assert result.run.reader == "tensorboard" and result.metric.key == "train/reward"
    assert result.points[-1][0] == pytest.approx(60 * STEP_S * 4 / 3600, rel=1e-6)


def test_the_planned_end_is_placed_by_the_recent_compute_per_step(verl_file: tuple[Path, Any], tmp_path: Path) -> None:
    half = tmp_path / "half.jsonl"
    data = write_verl(half, upto=100)
    result = read_points(
        Target(str(half), path=half), reader=None, metric="reward", choice="gpu_hours", given=axes.Given(gpus=GPUS)
    )
    assert planned_steps(result.run, None, None) is None
    assert planned_steps(result.run, 200, None) == (200, "given")
    compute, how = end_compute(result, 200)
    assert compute == pytest.approx(data["hours"][-1], rel=0.03) and "mean over the last" in how
    known, how = end_compute(result, 50)
    assert known == pytest.approx(data["hours"][49]) and how == "the run's compute at that step"


def test_a_jobs_plan_gives_gpus_cpu_ranks_and_steps() -> None:
    plan = job_plan({"gpus_wanted": 0, "nproc_per_node": 2, "args": ["--steps", "40", "--lr", "1e-3"]}, "j1")
    assert (plan.gpus, plan.cpu, plan.steps) == (2, True, 40)
    plan = job_plan({"gpus_wanted": 4, "nnodes": 2, "args": ["trainer.total_training_steps=300"]}, "j2")
    assert (plan.gpus, plan.cpu, plan.steps) == (8, False, 300)
    assert job_plan({}, "j3") == job_plan({"args": "not a list"}, "j3")


def test_axis_interpolates_between_its_steps_and_refuses_outside() -> None:
    axis = axes.Axis("x", "gpu_hours", [2, 4, 8], [1.0, 2.0, 4.0], "test")
    assert axis.at(3) == 1.5 and axis.at(8) == 4.0 and axis.at(1) is None and axis.at(9) is None
    rate, span = axis.per_step()
    assert rate == pytest.approx(0.5) and span == 4
    assert math.isnan(axes.Axis("x", "u", [], [], "").per_step()[0])


def test_the_written_verl_lines_are_verls_format(verl_file: tuple[Path, Any]) -> None:
    first = json.loads(verl_file[0].read_text().splitlines()[0])
    assert first["step"] == 1 and set(first["data"]) >= {"critic/score/mean", "timing_s/step"}


def write_trl(folder: Path, seed: int = 0, upto: int = 100, max_steps: int = STEPS) -> dict[str, np.ndarray]:
    """A TRL GRPO output directory's trainer_state.json, written by transformers' own TrainerState: reward,
    num_tokens (cumulative) at each step, then the Trainer's closing entry with train_runtime."""
    from transformers import TrainerState

    data = curve(seed)
    history: list[dict[str, Any]] = [
        {"step": i + 1, "reward": float(data["reward"][i]), "num_tokens": float(np.sum(data["tokens"][: i + 1]))}
        for i in range(upto)
    ]
    history.append({"step": upto, "train_runtime": STEP_S * upto, "train_loss": 0.1})
    folder.mkdir(parents=True, exist_ok=True)
    TrainerState(global_step=upto, max_steps=max_steps, log_history=history).save_to_json(
        str(folder / "trainer_state.json")
    )
    return data


def test_a_trl_run_gives_gpu_hours_from_its_mean_step_time_and_flops_from_its_tokens(tmp_path: Path) -> None:
    data = write_trl(tmp_path / "grpo-out")
    where = Target(str(tmp_path / "grpo-out"), path=tmp_path / "grpo-out")
    hours = read_points(where, reader=None, metric="reward", choice="gpu_hours", given=axes.Given(gpus=2))
    assert hours.run.reader == "trl" and "uniform steps assumed" in hours.axis.assumption
    assert hours.points[-1][0] == pytest.approx(100 * STEP_S * 2 / 3600, rel=1e-9)
    assert planned_steps(hours.run, None, None) == (STEPS, f"the run's max_steps ({'trainer_state.json: max_steps'})")
    n = 1.5e8
    flops = read_points(where, reader=None, metric="reward", choice="flops", given=axes.Given(params=n))
    assert "cumulative" in flops.axis.assumption and "TRL num_input_tokens_seen" in flops.axis.assumption
    assert flops.points[-1][0] == pytest.approx(6 * n * np.sum(data["tokens"][:100]), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    durations=st.lists(st.floats(0.5, 2.0), min_size=4, max_size=60),
    pause=st.floats(0.0, 1e5),
    at=st.integers(1, 59),
)
def test_wall_time_compute_rises_and_never_counts_more_than_the_time_gone(
    durations: list[float], pause: float, at: int
) -> None:
    from servers.runs.series import RunCollector, RunData

    collect, now = RunCollector(RunData("suite", "test", "t"), None), 0.0
    for step, seconds in enumerate(durations, start=1):
        now += seconds + (pause if step == at else 0.0)
        collect.add("reward", step, now, 0.5)
    axis = axes.axis(collect.done(), "gpu_hours", axes.Given(gpus=3))
    assert all(b > a for a, b in zip(axis.compute, axis.compute[1:], strict=False))
    typical = float(np.median(np.diff([0.0, *np.cumsum(durations)])[1:]))  # the first step is taken as typical
    assert axis.compute[-1] <= (now + typical) * 3 / 3600 + 1e-9


def test_a_run_still_being_written_is_fitted_as_partial(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    write_verl(path, upto=40)
    with path.open("ab") as handle:  # the step being written when the run was read
        handle.write(b'{"step": 41, "data": {"critic/score/mean": 0.')
    result = read_points(
        Target(str(path), path=path), reader=None, metric="reward", choice="gpu_hours", given=axes.Given(gpus=GPUS)
    )
    assert len(result.points) == 40 and result.info()["partial"]
    assert any(n.startswith("partial: fitted on what was logged so far") for n in result.notes)
