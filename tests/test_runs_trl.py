"""The TRL reader (servers/runs/trl.py) on a real run: TRL's GRPOTrainer runs the trl-grpo recipe on CPU once for
the module (a tiny random-weight Llama, report_to tensorboard), and its trainer_state.json, checkpoints, saved
model and event files are read back through the registry; then the bad inputs, on copies of that run's files."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from servers.core.errors import InputError
from servers.runs import registry
from servers.runs import trl as reader
from servers.runs.vocabulary import mapping, resolve

RECIPE = Path(__file__).resolve().parents[1] / "servers" / "launch" / "recipes" / "trl_grpo.py"
STEPS = 4
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "CUDA_VISIBLE_DEVICES": "",
    "OMP_NUM_THREADS": "1",
}


@dataclass
class GrpoRun:
    out: Path
    started: float
    ended: float
    params: int  # the count the script printed (torch's numel over the model it trained)


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory) -> GrpoRun:
    root = tmp_path_factory.mktemp("trl")
    out = root / "out"
    env = {**os.environ, **OFFLINE, "HF_HOME": str(root / "hf"), "HOME": str(root)}
    env.pop("LLM_INFRA_MCP_METRICS", None)
    started = time.time()
    done = subprocess.run(
        [sys.executable, str(RECIPE), "--steps", str(STEPS), "--save-every", "2", "--output-dir", str(out)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    ended = time.time()
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r"\[trl-grpo\] ([\d,]+) parameters", done.stdout)
    assert found, done.stdout[-2000:]
    return GrpoRun(out, started, ended, int(found.group(1).replace(",", "")))


def where(path: Path) -> registry.Target:
    return registry.target(str(path), roots=[path.parent, path])


@pytest.mark.timeout(300)
def test_a_real_grpo_run_is_detected_and_read(grpo: GrpoRun) -> None:
    target = where(grpo.out)
    assert registry.detect(target).name == "trl"
    run = registry.read_run(target)
    state = json.loads((grpo.out / "trainer_state.json").read_text())
    train = [e for e in state["log_history"] if "reward" in e]
    assert len(train) == STEPS and run.rows_read == len(state["log_history"]) and run.rows_skipped == 0
    for key in ("reward", "reward_std", "kl", "entropy", "completions/mean_length", "rewards/repeated_letter/mean"):
        assert list(run.series[key].steps) == list(range(1, STEPS + 1)), key
    assert list(run.series["reward"].values) == [e["reward"] for e in train]
    assert all(0.0 <= v <= 1.0 for v in run.series["reward"].values)
    assert mapping(run.keys)["reward"] == "reward"
    assert mapping(run.keys)["response_length"] == "completions/mean_length"
    assert resolve("kl", run.keys).key == "kl"
    assert not run.partial and not run.restarts


def test_facts_from_the_state_and_the_saved_model(grpo: GrpoRun) -> None:
    run = registry.read_run(where(grpo.out))
    assert run.facts["max_steps"] == STEPS and run.facts["global_step"] == STEPS
    assert run.facts["logging_steps"] == 1 and run.facts["train_batch_size"] == 8  # 2 prompts x 4 generations
    assert run.facts["model_type"] == "llama" and run.facts["hidden_size"] == 32
    assert run.facts["params"] == grpo.params
    assert "model.safetensors" in run.fact_sources["params"]
    assert run.facts["train_runtime"] > 0
    assert run.facts["global_batch_size"] == 8 and run.facts["num_processes"] == 1  # one process, no accumulation
    assert run.facts["device"] == "cpu"  # use_cpu, in the arguments the Trainer logged
    config = json.loads((grpo.out / "config.json").read_text())
    assert reader.estimate_params(config) == grpo.params  # the formula is exact for a Llama without biases


def test_wall_times_come_from_the_event_files(grpo: GrpoRun) -> None:
    run = registry.read_run(where(grpo.out))
    times = list(run.series["reward"].times)
    assert len(times) == STEPS and all(math.isfinite(t) for t in times)
    assert times == sorted(times)
    assert grpo.started - 5 <= times[0] and times[-1] <= grpo.ended + 5
    assert "mean_step_s" not in run.facts and "runs" in run.facts["wall_time_source"]


def test_without_event_files_the_mean_step_time_is_a_fact(grpo: GrpoRun, tmp_path: Path) -> None:
    copy = tmp_path / "no-events"
    copy.mkdir()
    shutil.copy(grpo.out / "trainer_state.json", copy)
    run = registry.read_run(where(copy))
    assert all(math.isnan(t) for t in run.series["reward"].times)
    assert any("per-step wall time is unknown" in n for n in run.notes)
    assert run.facts["mean_step_s"] == pytest.approx(run.facts["train_runtime"] / STEPS)
    assert run.fact_sources["mean_step_s"] == "train_runtime / global_step"


def test_checkpoints_only_and_the_file_itself(grpo: GrpoRun, tmp_path: Path) -> None:
    only = tmp_path / "only-checkpoints"
    only.mkdir()
    for name in ("checkpoint-2", "checkpoint-4"):
        shutil.copytree(grpo.out / name, only / name)
    run = registry.read_run(where(only))
    assert run.reader == "trl" and run.source.endswith("checkpoint-4/trainer_state.json")
    assert run.facts["global_step"] == 4 and run.facts["params"] == grpo.params
    assert any("latest checkpoint" in n for n in run.notes)
    earlier = registry.read_run(where(grpo.out / "checkpoint-2"))
    assert earlier.facts["global_step"] == 2 and list(earlier.series["reward"].steps) == [1, 2]
    assert not any("latest checkpoint" in n for n in earlier.notes)  # named, not chosen
    file = registry.read_run(where(grpo.out / "trainer_state.json"))
    assert list(file.series["reward"].steps) == list(range(1, STEPS + 1))


def test_a_run_still_being_written_reads_from_its_event_files(grpo: GrpoRun, tmp_path: Path) -> None:
    live = tmp_path / "live"
    shutil.copytree(grpo.out / "runs", live / "runs")
    shutil.copytree(grpo.out / "initial-model", live / "initial-model")
    target = where(live)
    assert registry.detect(target).name == "tensorboard"  # no trainer_state.json: not claimed as a TRL run
    run = registry.read_run(target, reader="trl")
    assert run.partial and "no trainer_state.json yet" in run.partial[0]
    assert list(run.series["reward"].steps) == list(range(1, STEPS + 1))
    assert "train/reward" not in run.series and mapping(run.keys)["reward"] == "reward"
    assert run.facts["params"] == grpo.params


def test_sharded_safetensors_are_counted(grpo: GrpoRun, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(grpo.out / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"a.safetensors": names[:half], "b.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / shard))
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert reader.count_safetensors(tmp_path) == (grpo.params, "2 safetensors shard(s)")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../etc/passwd"}}))
    assert reader.count_safetensors(tmp_path) is None


# ---- bad input ---------------------------------------------------------------------------------------------------
def state_dir(tmp_path: Path, text: str | bytes) -> Path:
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    (folder / "trainer_state.json").write_bytes(data)
    return folder


def test_a_truncated_state_is_a_clear_error(grpo: GrpoRun, tmp_path: Path) -> None:
    whole = (grpo.out / "trainer_state.json").read_bytes()
    folder = state_dir(tmp_path, whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"not valid JSON.*cut off"):
        registry.read_run(where(folder))


def test_an_oversized_state_is_refused_with_the_limit(tmp_path: Path) -> None:
    folder = state_dir(tmp_path, b"{}")
    with (folder / "trainer_state.json").open("r+b") as handle:
        handle.truncate(reader.MAX_STATE_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(InputError, match=f"accepted up to {reader.MAX_STATE_BYTES // 2**20} MiB"):
        registry.read_run(where(folder))


@pytest.mark.parametrize("text", ['{"log_history": {"step": 1}}', "[]", '{"global_step": 3}'])
def test_a_state_without_a_log_history_list(tmp_path: Path, text: str) -> None:
    with pytest.raises(InputError, match="no log_history list"):
        registry.read_run(where(state_dir(tmp_path, text)))


def test_nan_infinity_stepless_entries_and_steps_going_back(tmp_path: Path) -> None:
    text = (
        '{"global_step": 3, "max_steps": 3, "log_history": ['
        '{"step": 1, "reward": 0.1, "loss": NaN}, {"reward": 0.5}, "junk", {"step": "2", "reward": 0.2},'
        '{"step": 2, "reward": 0.2, "loss": Infinity, "note": "text"}, {"step": 3, "reward": 0.3, "loss": -Infinity},'
        '{"step": 2, "reward": 0.25}, {"step": 3.0, "reward": 0.35, "eval_accuracy": 0.5}]}'
    )
    run = registry.read_run(where(state_dir(tmp_path, text)))
    assert run.rows_read == 8 and run.rows_skipped == 3
    assert run.skipped_reasons == {
        "log_history entry without an integer step": 2,
        "log_history entry that is not an object": 1,
    }
    assert list(run.series["reward"].steps) == [1, 2, 3] and list(run.series["reward"].values) == [0.1, 0.25, 0.35]
    assert run.series["loss"].nonfinite == 3 and len(run.series["loss"]) == 0
    assert [(r.from_step, r.to_step) for r in run.restarts] == [(3, 2)]
    assert "note" in run.keys and "note" not in run.series
    assert mapping(run.keys)["val_accuracy"] == "eval_accuracy"
    assert any("non-finite" in n for n in run.notes)


def test_sources_that_are_not_trl_runs(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not reader.detect(where(empty))
    with pytest.raises(InputError, match=re.escape("holds no trainer_state.json")):
        registry.read_run(where(empty), reader="trl")
    other = tmp_path / "other.json"
    other.write_text('{"log_history": []}')
    assert not reader.detect(where(other))  # only a file named trainer_state.json is claimed
    with pytest.raises(InputError, match=re.escape("is not a trainer_state.json; accepted: a TRL")):
        registry.read_run(where(other), reader="trl")


@pytest.mark.timeout(120)
def test_the_params_formula_matches_the_models_own_count() -> None:
    """PARAMS_FORMULA against transformers' own models (random weights, nothing downloaded): grouped key/value
    heads, a head dim apart from width / heads, tied embeddings, Qwen2's q/k/v biases, Llama's attention_bias."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    sizes = {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    for config, model in (
        (Qwen2Config(**sizes, **heads), Qwen2ForCausalLM),
        (Qwen2Config(**sizes, **heads, tie_word_embeddings=True), Qwen2ForCausalLM),
        (LlamaConfig(**sizes, **heads, attention_bias=True, head_dim=8), LlamaForCausalLM),
        (LlamaConfig(**sizes, num_attention_heads=8), LlamaForCausalLM),
    ):
        counted = sum(p.numel() for p in model(config).parameters())
        assert reader.estimate_params(json.loads(config.to_json_string())) == counted, config
    assert reader.estimate_params({"hidden_size": 64, "num_hidden_layers": 2}) is None


def test_the_number_of_processes_from_the_trainers_own_counts(tmp_path: Path) -> None:
    """4 processes x 8 per device x 2 accumulation steps = 64 samples per step: the Trainer's samples per second x
    runtime / max_steps, divided by what its logged arguments say (torch's SummaryWriter writes them as the
    Trainer's TensorBoardCallback does: text 'args')."""
    from torch.utils.tensorboard import SummaryWriter

    history = [{"step": s, "loss": 1.0 / s} for s in (1, 2, 3)]
    history.append({"step": 3, "train_runtime": 7.0, "train_samples_per_second": round(3 * 64 / 7.0, 3)})
    state = {"max_steps": 3, "global_step": 3, "train_batch_size": 8, "log_history": history}
    folder = state_dir(tmp_path, json.dumps(state))
    writer = SummaryWriter(str(folder / "runs" / "Jan01_00-00-00_host"))
    writer.add_text("args", json.dumps({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}))
    for s in (1, 2, 3):
        writer.add_scalar("train/loss", 1.0 / s, s)
    writer.close()
    run = registry.read_run(where(folder))
    assert (
        run.facts["gradient_accumulation_steps"] == 2
        and "TensorBoard text" in run.fact_sources["gradient_accumulation_steps"]
    )
    assert run.facts["global_batch_size"] == 64 and run.facts["num_processes"] == 4
    assert all(math.isfinite(t) for t in run.series["loss"].times)
    (folder / "runs").rename(folder / "elsewhere")  # no arguments logged: the processes are not claimed
    run = registry.read_run(where(folder))
    assert run.facts["global_batch_size"] == 64 and "num_processes" not in run.facts
