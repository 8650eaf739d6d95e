"""The scaling tools taking a run (data.run), through in-process MCP clients in both protocol eras: a run written
by its real producer (verl's Tracking, TensorBoard's SummaryWriter, this suite's MetricsWriter in a job) is fitted
in one call, forecast to its planned end from half of it with an interval, and compared with another run, in at
most 4 tool calls; read_job_metrics reads a framework job's declared run; bad run sources are clear errors."""

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from servers.core.mcp_layer import App
from tests.helpers import call_error as error
from tests.helpers import call_ok, wandb_offline_env
from tests.test_runs_compute import GPUS, STEP_S, STEPS, TRUTH, VAL_KEY, curve, sigmoid, write_verl

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


class Calls:
    """Counts the tool calls an agent makes."""

    def __init__(self, client: Client) -> None:
        self.client, self.count = client, 0

    async def ok(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        self.count += 1
        return await call_ok(self.client, tool, args)


def run(source: Path | str, **fields: Any) -> dict[str, Any]:
    return {"run": {"source": str(source), **fields}}


async def test_a_verl_run_is_forecast_from_half_fitted_and_compared_in_four_calls(
    suite_client: Client, tmp_path: Path
) -> None:
    full = write_verl(tmp_path / "recipe_a.jsonl", seed=0)
    write_verl(tmp_path / "recipe_a_half.jsonl", seed=0, upto=STEPS // 2)
    write_verl(tmp_path / "recipe_b.jsonl", seed=1, A=0.55)
    agent = Calls(suite_client)

    # 1. the forecast from half of the run: fitted on what was logged, at the planned end, with an interval
    half = await agent.ok(
        "predict_scaling", {"data": run(tmp_path / "recipe_a_half.jsonl", gpus=GPUS, steps=STEPS), "compute": [12.0]}
    )
    forecast = half["forecast"]
    assert half["fit_id"] is None and half["intervals"] and half["compute_unit"] == "gpu_hours"
    assert forecast["metric_key"] == VAL_KEY and forecast["last_step"] == STEPS // 2
    assert forecast["planned_steps"] == STEPS and forecast["planned_from"] == "given" and not forecast["reached"]
    assert forecast["compute"] == pytest.approx(full["hours"][-1], rel=0.03)
    value = forecast["value"]
    assert value["extrapolated"] and value["pi_low"] <= value["value"] <= value["pi_high"]
    truth = sigmoid(full["hours"][-1], **TRUTH)
    assert abs(value["value"] - truth) < 0.08 and value["pi_low"] - 0.02 < truth < value["pi_high"] + 0.02
    assert half["values"][0]["compute"] == 12.0

    # 2, 3. both whole runs fitted, each in one call
    fits = []
    for name in ("recipe_a", "recipe_b"):
        report = await agent.ok(
            "fit_scaling_law",
            {"model": "scalerl", "data": run(tmp_path / f"{name}.jsonl", gpus=GPUS), "bootstrap": 40},
        )
        assert report["compute_unit"] == "gpu_hours" and report["points_used"] == STEPS // 5
        assert report["run"]["metric_key"] == VAL_KEY and report["run"]["reader"] == "verl"
        assert "timing_s/step" in report["run"]["compute_assumption"]
        assert any("metric not given: val_accuracy" in w for w in report["warnings"])
        fits.append(report)
    assert fits[0]["parameters"]["A"]["value"] == pytest.approx(TRUTH["A"], abs=0.05)

    # 4. compared
    comparison = await agent.ok("compare_scaling_fits", {"fit_ids": [f["fit_id"] for f in fits]})
    assert comparison["verdict"].startswith("Best asymptote: recipe_a") and agent.count == 4


async def test_a_finished_runs_fit_forecasts_its_end_beside_what_it_logged(
    suite_client: Client, tmp_path: Path
) -> None:
    data = write_verl(tmp_path / "done.jsonl", seed=2)
    report = await call_ok(
        suite_client,
        "fit_scaling_law",
        {"model": "scalerl", "data": run(tmp_path / "done.jsonl", gpus=GPUS, steps=STEPS, metric="reward")},
    )
    assert report["run"]["metric_key"] == "critic/score/mean" and report["points_used"] == STEPS
    predicted = await call_ok(suite_client, "predict_scaling", {"fit_id": report["fit_id"]})
    forecast = predicted["forecast"]
    assert forecast["reached"] and forecast["observed"] == pytest.approx(data["reward"][-1])
    assert "has reached its end: observed" in forecast["statement"]
    assert forecast["compute"] == pytest.approx(data["hours"][-1])


async def test_a_tensorboard_run_fits_extrapolates_and_plots(suite_client: Client, tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    data = curve(4)
    writer = SummaryWriter(str(tmp_path / "tb"))
    for i in range(STEPS):
        writer.add_scalar("train/reward", float(data["reward"][i]), i + 1, walltime=1.7e9 + STEP_S * (i + 1))
    writer.close()
    source = run(tmp_path / "tb", gpus=GPUS, metric="reward")
    report = await call_ok(suite_client, "fit_scaling_law", {"model": "scalerl", "data": source, "bootstrap": 20})
    assert report["run"]["reader"] == "tensorboard" and report["run"]["metric_key"] == "train/reward"
    assert "wall time between consecutive logged steps" in report["run"]["compute_assumption"]
    check = await call_ok(suite_client, "check_extrapolation", {"data": source, "bootstrap": 20})
    assert check["split"] == pytest.approx(STEPS * STEP_S * GPUS / 3600 / 2, rel=1e-6)
    assert check["held_out_points"] == STEPS // 2
    result = await suite_client.call_tool("plot_scaling_fit", {"fit_ids": [report["fit_id"]]})
    assert not result.is_error and result.content[1].type == "image"


async def test_a_framework_jobs_declared_run_is_read_and_fitted_by_its_job_id(
    suite_client: Client, app: App, tmp_path: Path
) -> None:
    from tests.helpers import finish_job

    spec = {"steps": 1, "run_source": {"reader": "verl", "path": "verl/run.jsonl"}}
    job = await call_ok(suite_client, "start_test_job", {"kind": "test_count", "spec": spec, "wait_s": 30})
    job_id = job["job_id"]
    await finish_job(suite_client, job_id)
    early = await call_ok(suite_client, "read_job_metrics", {"job_id": job_id})
    assert early["rows"] == [] and early["reader"] == "verl" and "has not been written yet" in early["notes"][0]
    job_dir = Path(app.engine.get(job_id).job_dir)
    (job_dir / "verl").mkdir()
    data = write_verl(job_dir / "verl" / "run.jsonl", seed=5, upto=60)
    page = await call_ok(suite_client, "read_job_metrics", {"job_id": job_id, "limit": 10, "since_step": 20})
    assert page["reader"] == "verl" and "timing_s/step" in page["source_keys"] and page["truncated"]
    assert [r["step"] for r in page["rows"]] == list(range(21, 31)) and page["last_step"] == 30
    assert page["rows"][0]["critic/score/mean"] == pytest.approx(data["reward"][20])
    report = await call_ok(
        suite_client,
        "fit_scaling_law",
        {"model": "scalerl", "data": run(job_id, metric="reward", compute="steps"), "bootstrap": 0},
    )
    assert report["compute_unit"] == "steps" and report["points_used"] == 60
    assert report["run"]["compute_assumption"] == "the step itself: no unit of compute"


async def test_bad_run_sources_are_clear_errors(suite_client: Client, tmp_path: Path) -> None:
    write_verl(tmp_path / "two.jsonl", upto=20, extra={"val-core/math/acc/mean@1": 0.3})

    async def refused(data: dict[str, Any], model: str = "scalerl") -> str:
        return await error(suite_client, "fit_scaling_law", {"model": model, "data": data, "bootstrap": 0})

    text = await refused(run(tmp_path / "two.jsonl", metric="reward"))
    assert "GPU count is unknown" in text and "data.run.gpus" in text
    text = await refused(run(tmp_path / "two.jsonl"))
    assert "matches 2 keys" in text and "val-core/math/acc/mean@1" in text
    text = await refused(run(tmp_path / "two.jsonl", metric="pass@1", compute="steps"))
    assert "no key 'pass@1'" in text and "critic/score/mean" in text
    text = await refused(run("mlflow+http://example.com:5000/0123abcd", metric="reward"))
    assert "not an allowed tracking host" in text and "127.0.0.1" in text
    text = await refused(run("/etc", metric="reward"))
    assert "run source" in text and "allowed" in text
    text = await refused(run(tmp_path / "two.jsonl", compute="steps"), model="chinchilla")
    assert "data.run" in text and "chinchilla" in text
    text = await refused({**run(tmp_path / "two.jsonl"), "path": str(tmp_path / "two.jsonl")})
    assert "exactly one of points, path, job_id or run" in text


async def test_a_suite_jobs_metrics_are_its_run_and_a_trl_run_is_forecast_in_one_call(
    suite_client: Client, tmp_path: Path
) -> None:
    from tests.helpers import finish_job
    from tests.test_runs_compute import write_trl

    job = await call_ok(suite_client, "start_test_job", {"kind": "test_curve", "spec": {}, "wait_s": 30})
    await finish_job(suite_client, job["job_id"])
    report = await call_ok(
        suite_client,
        "fit_scaling_law",
        {"model": "scalerl", "data": run(job["job_id"], compute="steps"), "bootstrap": 0},
    )
    assert report["run"]["reader"] == "suite" and report["run"]["metric_key"] == "pass_rate"
    assert report["points_used"] == 29  # step 0 has no compute on the steps axis

    write_trl(tmp_path / "grpo-out", upto=100)
    predicted = await call_ok(
        suite_client, "predict_scaling", {"data": run(tmp_path / "grpo-out", metric="reward", gpus=GPUS)}
    )
    forecast = predicted["forecast"]
    assert forecast["planned_steps"] == STEPS and "max_steps" in forecast["planned_from"]
    assert forecast["value"]["pi_low"] <= forecast["value"]["value"] <= forecast["value"]["pi_high"]


async def test_an_mlflow_run_is_forecast_from_its_own_facts_in_one_call(
    suite_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns"
    client = MlflowClient(store.as_uri())
    run_id = client.create_run(client.create_experiment("grpo"), run_name="grpo-mlflow").info.run_id
    for name, value in {
        "trainer/nnodes": "1",
        "trainer/n_gpus_per_node": "8",
        "trainer/total_training_steps": "200",
    }.items():
        client.log_param(run_id, name, value)  # verl's config, flattened with "/" by its MLflow logger
    data = curve(6)
    stamp = 1_700_000_000_000
    metrics = []
    for i in range(STEPS // 2):
        stamp += int(data["seconds"][i] * 1000)
        metrics += [
            Metric("critic/score/mean", float(data["reward"][i]), stamp, i + 1),
            Metric("timing_s/step", float(data["seconds"][i]), stamp, i + 1),
        ]
    for at in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[at : at + 1000])
    predicted = await call_ok(suite_client, "predict_scaling", {"data": run(store, metric="reward")})
    forecast = predicted["forecast"]
    assert forecast["run"] == "grpo-mlflow" and forecast["planned_steps"] == STEPS
    assert "total_training_steps" in forecast["planned_from"]
    assert forecast["compute"] == pytest.approx(data["hours"][-1], rel=0.03)  # 8 GPUs from the run's params
    assert forecast["value"]["pi_low"] <= forecast["value"]["value"] <= forecast["value"]["pi_high"]


WANDB_WRITER = """
import json, sys, wandb
rows = json.load(open(sys.argv[1]))
run = wandb.init(
    project="scaling", name="grpo-wandb",
    config={"trainer": {"nnodes": 1, "n_gpus_per_node": 8, "total_training_steps": 200}},
)
for step, row in enumerate(rows, start=1):
    run.log(row, step=step)
run.finish()
"""


@pytest.mark.timeout(240)
async def test_a_wandb_offline_run_is_forecast_from_its_own_config_in_one_call(
    suite_client: Client, tmp_path: Path
) -> None:
    import json
    import subprocess
    import sys

    data = curve(7)
    rows = [
        {"critic/score/mean": float(data["reward"][i]), "timing_s/step": float(data["seconds"][i])}
        for i in range(STEPS // 2)
    ]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    (tmp_path / "write.py").write_text(WANDB_WRITER)
    env = wandb_offline_env(tmp_path)
    done = subprocess.run(
        [sys.executable, "write.py", "rows.json"], cwd=tmp_path, env=env, capture_output=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    [folder] = (tmp_path / "wandb").glob("offline-run-*")
    predicted = await call_ok(suite_client, "predict_scaling", {"data": run(folder, metric="reward")})
    forecast = predicted["forecast"]
    assert forecast["run"] == "grpo-wandb" and forecast["planned_steps"] == STEPS
    assert forecast["compute"] == pytest.approx(data["hours"][-1], rel=0.03)  # 8 GPUs from the run's config
    assert forecast["value"]["pi_low"] <= forecast["value"]["value"] <= forecast["value"]["pi_high"]
