"""verl and OpenRLHF launch templates (servers/launch/frameworks.py): the command each renders on the backends it
runs on (exact argv, env, the run its job declares, GPUs and cost), validation against the frameworks' own
definitions (a real compose of verl's shipped ppo_trainer config; OpenRLHF's recorded argparse flags), refusals
on the backends they do not run on, and the plan through the launch server's tool in process. No run is submitted:
both frameworks train on GPUs only."""

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
from mcp import Client

from servers.core.errors import InputError
from servers.core.settings import Settings
from servers.launch import frameworks, training
from servers.launch.ray_backend import RayBackend
from servers.runs import registry
from servers.runs.jobs import job_target
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok

VERL_VERSION = importlib.metadata.version("verl")
DATA = ["data.train_files=/data/gsm8k/train.parquet", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"]
OPENRLHF = ["--pretrain", "Qwen/Qwen2.5-0.5B-Instruct", "--prompt_data", "/data/prompts", "--remote_rm_url", "/r.py"]


def ray_plan(settings: Settings, **fields: object) -> training.TrainingPlan:
    spec = training.TrainingJobSpec.model_validate({"backend": "ray", **fields})
    return training.plan(settings, spec, gpus_present=0, gpus_in_use=0, backend=RayBackend("http://127.0.0.1:9"))


def command(plan: training.TrainingPlan) -> list[str]:
    """What the Ray wrapper runs: argv after its '--'."""
    return plan.argv[plan.argv.index("--") + 1 :]


def refusal(settings: Settings, gpus_present: int = 0, **fields: object) -> str:
    spec = training.TrainingJobSpec.model_validate(fields)
    with pytest.raises(InputError) as caught:
        training.plan(
            settings, spec, gpus_present=gpus_present, gpus_in_use=0, backend=RayBackend("http://127.0.0.1:9")
        )
    return str(caught.value)


def test_verl_on_ray_renders_main_ppo_with_the_file_logger(settings: Settings) -> None:
    plan = ray_plan(settings, recipe="verl-grpo", args=DATA, nnodes=2, gpus_per_node=8, max_wall_s=7200)
    python = plan.argv[0]
    assert command(plan) == [
        python,
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=5",
        *DATA,
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=8",
        "trainer.logger=[console,file]",
        "trainer.default_local_dir=$JOB_DIR/checkpoints",
    ]
    assert plan.env["VERL_FILE_LOGGER_PATH"] == "$JOB_DIR/metrics.jsonl"
    assert plan.backend_spec["run_source"] == {"reader": "verl", "path": "metrics.jsonl"}
    # the job holds 2 x 8 GPUs: the cost bound and admission's confirmation see them; the driver itself holds none
    assert plan.gpus == 8 and plan.spec["nnodes"] == 2 and plan.nproc_per_node == 1
    assert plan.estimated_gpu_hours == pytest.approx(16 * 2) and plan.needs_confirmation
    assert plan.backend_plan.entrypoint_num_gpus == 0 and plan.backend_plan.entrypoint_num_cpus == 1
    assert plan.backend_plan.nnodes == 2 and "CUDA_VISIBLE_DEVICES" not in plan.env
    assert f"validated against verl {VERL_VERSION}'s shipped ppo_trainer config" in " ".join(plan.notes)
    assert plan.recipe == "verl-grpo" and plan.script_path == "verl.trainer.main_ppo"
    assert any("verl.trainer.main_ppo must be importable" in n for n in plan.notes)
    assert not any("the script must exist" in n for n in plan.notes)


def test_verl_on_local_runs_python_m_with_the_gpus_assigned_at_admission(settings: Settings) -> None:
    spec = training.TrainingJobSpec(recipe="verl-grpo", args=DATA, gpus_per_node=2)
    plan = training.plan(settings, spec, gpus_present=2, gpus_in_use=0)
    tail = command(plan)  # what the sandbox runs
    assert tail[:3] == [sys.executable, "-m", "verl.trainer.main_ppo"] and "trainer.n_gpus_per_node=2" in tail
    assert "torch.distributed.run" not in plan.argv
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "$ASSIGNED_GPUS" and plan.backend_plan.gpus_wanted == 2
    assert plan.env["VERL_FILE_LOGGER_PATH"] == "$JOB_DIR/metrics.jsonl" and plan.gpus == 2
    # more GPUs than this machine has, or none at all: refused before anything is planned
    assert "this machine has 1" in refusal(settings, 1, recipe="verl-grpo", gpus_per_node=2, backend="local")
    assert "gpus_per_node" in refusal(settings, 4, recipe="verl-grpo", backend="local")


def test_verl_refusals_on_backends_and_fields(settings: Settings) -> None:
    text = refusal(settings, recipe="verl-grpo", gpus_per_node=8, backend="slurm")
    assert "Ray cluster" in text and "accepted: local, ray" in text
    assert "accepted: local, ray" in refusal(settings, recipe="verl-grpo", gpus_per_node=8, backend="kubernetes")
    text = refusal(settings, 4, recipe="verl-grpo", gpus_per_node=2, nnodes=2, backend="local")
    assert "1 node on the local backend" in text
    assert "max_restarts" in refusal(settings, recipe="verl-grpo", gpus_per_node=8, max_restarts=1, backend="ray")
    assert "nproc_per_node" in refusal(settings, recipe="verl-grpo", gpus_per_node=8, nproc_per_node=8, backend="ray")
    text = refusal(settings, recipe="verl-grpo", gpus_per_node=8, script="/x.py", backend="ray")
    assert "exactly one of recipe or script" in text


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["trainer.total_epochz=2"], "trainer.total_epochz"),  # misspelled: hydra names it
        (["trainer.total_epochs=many"], "trainer.total_epochs is an integer"),
        (["trainer.total_epochs=1.5"], "trainer.total_epochs is an integer"),
        (["trainer.val_before_train=3"], "is a boolean"),
        (["actor_rollout_ref.rollout.n=1"], "rollout.n must be at least 2"),
        (["trainer.nnodes=4"], "trainer.nnodes is set from nnodes"),
        (["trainer.logger=[wandb]"], "trainer.logger is set from the template"),
        (["--config-name=x"], "flags are not accepted"),
        (["trainer.total_epochs"], "Error parsing override"),
        (["trainer.total_epochs=1,2"], "is a sweep"),
    ],
)
def test_verl_overrides_checked_against_its_shipped_config(args: list[str], expected: str) -> None:
    with pytest.raises(InputError) as caught:
        frameworks.render("verl-grpo", [*DATA, *args], backend="ray", nnodes=1, gpus_per_node=8)
    assert expected in str(caught.value)


def test_verl_valid_overrides_compose_and_additions_are_said_unvalidated() -> None:
    args = [*DATA, "trainer.total_epochs=2", "actor_rollout_ref.rollout.n=8", "+trainer.my_tag=1"]
    rendered = frameworks.render("verl-grpo", args, backend="ray", nnodes=1, gpus_per_node=4)
    assert rendered.args.count("actor_rollout_ref.rollout.n=8") == 1 and "actor_rollout_ref.rollout.n=5" not in (
        rendered.args
    )
    assert rendered.validated.startswith(f"validated against verl {VERL_VERSION}")
    assert any("not validated: +trainer.my_tag=1" in n for n in rendered.notes)


def test_verl_interpolations_are_never_resolved_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """${oc.env:...} would read this server's environment: it goes to verl as written, unevaluated."""
    monkeypatch.setenv("FRAMEWORKS_TEST_SECRET", "hunter2-not-a-number")
    args = [*DATA, "trainer.total_epochs=${oc.env:FRAMEWORKS_TEST_SECRET}", "actor_rollout_ref.rollout.n=${oc.env:N}"]
    rendered = frameworks.render("verl-grpo", args, backend="ray", nnodes=1, gpus_per_node=1)
    assert "hunter2" not in repr(rendered) and "trainer.total_epochs=${oc.env:FRAMEWORKS_TEST_SECRET}" in rendered.args


def test_verl_not_installed_plans_with_the_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frameworks, "verl_config_dir", lambda: None)
    rendered = frameworks.render("verl-grpo", ["trainer.anything=1"], backend="ray", nnodes=1, gpus_per_node=1)
    assert rendered.validated == (
        "not validated: verl is not installed here (the overrides go to verl's main_ppo as given)"
    )


def test_openrlhf_on_ray_colocates_every_model_on_the_jobs_gpus(settings: Settings) -> None:
    args = [*OPENRLHF, "--vllm_tensor_parallel_size", "2", "--init_kl_coef", "0.001"]
    plan = ray_plan(settings, recipe="openrlhf-grpo", args=args, nnodes=2, gpus_per_node=4)
    assert command(plan) == [
        plan.argv[0],
        "-m",
        "openrlhf.cli.train_ppo_ray",
        *("--actor_num_nodes", "2", "--actor_num_gpus_per_node", "4"),
        *("--ref_num_nodes", "2", "--ref_num_gpus_per_node", "4"),
        *("--colocate_all_models", "--vllm_num_engines", "4"),
        *("--advantage_estimator", "group_norm", "--n_samples_per_prompt", "8"),
        *args,
        *("--use_tensorboard", "$JOB_DIR/tensorboard"),
    ]
    assert plan.backend_spec["run_source"] == {"reader": "tensorboard", "path": "tensorboard"}
    assert plan.gpus == 4 and plan.estimated_gpu_hours == pytest.approx(8) and plan.backend_plan.nnodes == 2
    assert plan.backend_plan.entrypoint_num_gpus == 0
    _, version, commit = frameworks.openrlhf_flags()
    assert f"validated against OpenRLHF {version}'s train_ppo_ray argparse flags" in " ".join(plan.notes)
    assert commit[:12] in " ".join(plan.notes)


def test_openrlhf_reward_model_and_critic_share_the_placement() -> None:
    args = ["--pretrain", "m", "--prompt_data", "p", "--reward_pretrain", "rm", "--critic_pretrain", "c"]
    rendered = frameworks.render(
        "openrlhf-grpo", [*args, "--advantage_estimator", "gae"], backend="ray", nnodes=1, gpus_per_node=8
    )
    joined = " ".join(rendered.args)
    assert "--critic_num_nodes 1 --critic_num_gpus_per_node 8" in joined
    assert "--reward_num_nodes 1 --reward_num_gpus_per_node 8" in joined
    assert rendered.args.count("--advantage_estimator") == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--pretrian", "m"], "nearest: --pretrain"),
        (["--micro_train_batch_size", "two"], "takes an int"),
        (["--advantage_estimator", "ppo"], "accepted: gae, reinforce"),
        (["--n_samples_per_prompt", "1"], "--n_samples_per_prompt must be >= 2"),
        (["--actor_num_gpus_per_node", "2"], "set by the template"),
        (["--async_train"], "set by the template"),
        (["--apply_chat_template=yes"], "is a switch"),
        (["--eps_clip_low_high", "0.2"], "takes 2 value(s)"),
        (["--seed", "1", "--seed", "2"], "given twice"),
        (["stray"], "follows no flag"),
        (["--vllm_tensor_parallel_size", "3"], "does not divide the job's 8 GPU(s)"),
    ],
)
def test_openrlhf_flags_checked_against_its_argparse_definitions(args: list[str], expected: str) -> None:
    with pytest.raises(InputError) as caught:
        frameworks.render("openrlhf-grpo", [*OPENRLHF, *args], backend="ray", nnodes=1, gpus_per_node=8)
    assert expected in str(caught.value)


def test_openrlhf_needs_a_model_prompts_and_a_reward() -> None:
    for missing, expected in (("--pretrain", "needs --pretrain"), ("--prompt_data", "needs --prompt_data")):
        i = OPENRLHF.index(missing)
        args = OPENRLHF[:i] + OPENRLHF[i + 2 :]
        with pytest.raises(InputError, match=expected):
            frameworks.render("openrlhf-grpo", args, backend="ray", nnodes=1, gpus_per_node=1)
    with pytest.raises(InputError, match="needs a reward"):
        frameworks.render("openrlhf-grpo", OPENRLHF[:4], backend="ray", nnodes=1, gpus_per_node=1)


def test_openrlhf_only_on_ray(settings: Settings) -> None:
    for backend in ("local", "slurm"):
        text = refusal(settings, 8, recipe="openrlhf-grpo", args=OPENRLHF, gpus_per_node=8, backend=backend)
        assert "Ray driver" in text and "accepted: ray" in text


def test_openrlhf_recorded_flags_name_their_source() -> None:
    flags, version, commit = frameworks.openrlhf_flags()
    header = frameworks.FLAGS_FILE.read_text().splitlines()[:8]
    assert any("openrlhf/cli/train_ppo_ray.py" in line for line in header) and len(commit) == 40
    assert version == "0.9.9" and len(flags) > 100
    assert flags["--colocate_all_models"].nargs == "0" and flags["--actor_num_nodes"].type == "int"
    assert flags["--adam_betas"].nargs == "2" and "group_norm" in flags["--advantage_estimator"].choices
    assert all(name.startswith("--") and f.nargs in ("0", "1", "2", "*") for name, f in flags.items())


def test_the_declared_run_is_where_verl_writes_and_is_read(settings: Settings, tmp_path: Path) -> None:
    plan = ray_plan(settings, recipe="verl-grpo", args=DATA, gpus_per_node=1)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    bound = plan.backend_plan.bind(job_dir)
    logged = Path(bound.env["VERL_FILE_LOGGER_PATH"])
    # the lines verl's FileLogger writes (verl/utils/tracking.py: {"step": N, "data": {...}} per log call)
    with open(logged, "w") as f:
        for step in range(1, 6):
            f.write(json.dumps({"step": step, "data": {"critic/score/mean": 0.1 * step, "timing_s/step": 2.0}}) + "\n")
    where, reader = job_target(job_dir, plan.backend_spec, job_dir / "metrics.jsonl")
    assert reader == "verl" and where.path == logged.resolve()
    run = registry.read_run(where, reader=reader)
    assert list(run.series["critic/score/mean"].steps) == [1, 2, 3, 4, 5]


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_plan_tool_renders_and_validates_the_frameworks(suite_client: Client) -> None:
    recipes = {r["name"]: r for r in (await ok(suite_client, "list_recipes", {}))["recipes"]}
    assert {"verl-grpo", "openrlhf-grpo"} <= set(recipes)
    assert "GPUs required" in recipes["verl-grpo"]["expected_time_cpu"]
    spec = {"recipe": "verl-grpo", "backend": "ray", "args": DATA, "gpus_per_node": 8, "nnodes": 2}
    plan = await ok(suite_client, "plan_training_job", {"spec": spec})
    assert plan["gpus"] == 8 and plan["backend_spec"]["run_source"]["reader"] == "verl"
    assert "trainer.n_gpus_per_node=8" in plan["argv"] and plan["env"]["VERL_FILE_LOGGER_PATH"].endswith(
        "metrics.jsonl"
    )
    assert any(n.startswith(f"validated against verl {VERL_VERSION}") for n in plan["notes"])
    text = await error(suite_client, "plan_training_job", {"spec": {**spec, "args": ["trainer.nnodez=2"]}})
    assert "trainer.nnodez" in text
    spec = {"recipe": "openrlhf-grpo", "backend": "ray", "args": OPENRLHF, "gpus_per_node": 4}
    plan = await ok(suite_client, "plan_training_job", {"spec": spec})
    assert plan["backend_spec"]["run_source"] == {"reader": "tensorboard", "path": "tensorboard"}
    assert any("OpenRLHF 0.9.9" in n for n in plan["notes"])
    text = await error(
        suite_client, "plan_training_job", {"spec": {**spec, "args": [*OPENRLHF, "--actor_learnig_rate", "1"]}}
    )
    assert "nearest: --actor_learning_rate" in text
    text = await error(suite_client, "plan_training_job", {"spec": {**spec, "backend": "local"}})
    assert "accepted: ray" in text
    assert (await ok(suite_client, "list_jobs", {}))["total"] == 0
