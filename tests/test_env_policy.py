"""Issue 21, defect 5: path-valued variables passed the environment allow-list. TORCH_LOGS=+c10d with
TORCH_LOGS_OUT=/outside/file wrote outside the roots, uncounted by the log cap; NCCL_DEBUG_FILE (NCCL opens it for
writing), NCCL_CONF_FILE, NCCL_TOPO_FILE, NCCL_GRAPH_DUMP_FILE, PYTORCH_TUNABLEOP_FILENAME, OMP_TOOL_LIBRARIES,
CUDA_MPS_PIPE_DIRECTORY... were accepted too.

The rule (envpolicy.env_refusal, the one check of every backend): outside JOB_*, a variable that names a file,
folder, library, pipe or socket is refused by name (a known list, and words of the name: *_FILE, *_DIR, *_PATH,
*_LIB*, *_PLUGIN, *_CONF_*, *_DUMP_*, ..._OUT, ..._TRACE...), and a value that reads as a path ('/', or a leading
'~' or '.') or holds a control character is refused, but in the forms a few variables take (TZ=Europe/Paris).
JOB_* variables are the script's own: they may hold paths."""

import json
from pathlib import Path

import pytest
from mcp import Client

from servers.core.errors import InputError
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from servers.launch import training
from servers.launch.envpolicy import check_env, env_refusal
from servers.launch.slurm import SlurmBackend
from servers.launch.training import TrainingJobSpec
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

# The list, and the path-valued variables of NCCL, torch, CUDA and OpenMP known when this was written.
PATH_VARIABLES = [
    "TORCH_LOGS_OUT",
    "TORCH_TRACE",
    "NCCL_DEBUG_FILE",
    "NCCL_CONF_FILE",
    "NCCL_TOPO_FILE",
    "NCCL_TOPO_DUMP_FILE",
    "NCCL_GRAPH_FILE",
    "NCCL_GRAPH_DUMP_FILE",
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_TUNER_CONFIG_FILE",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_ENV_PLUGIN",
    "NCCL_PROXY_PROFILE",
    "NCCL_IBVERBS_LIB",
    "NCCL_LIBIBVERBS_SO",
    "NCCL_RAS_ADDR",
    "NCCL_RAS_ENABLE",
    "PYTORCH_TUNABLEOP_FILENAME",
    "PYTORCH_TUNABLEOP_UNTUNED_FILENAME",
    "PYTORCH_KERNEL_CACHE_PATH",
    "TORCH_COMPILE_DEBUG_DIR",
    "TORCH_EXTENSIONS_DIR",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_CACHE_PATH",
    "CUDA_INJECTION64_PATH",
    "CUDA_COREDUMP_FILE",
    "CUDA_COREDUMP_PIPE",
    "CUDA_LOG_FILE",
    "CUDNN_LOGDEST_DBG",
    "CUBLAS_LOGDEST_DBG",
    "OMP_TOOL",
    "OMP_TOOL_LIBRARIES",
    "OMP_TOOL_VERBOSE_INIT",
    "KMP_STATS_FILE",
    "KMP_CPUINFO_FILE",
    "MKL_VERBOSE_OUTPUT_FILE",
]
# Names no list holds: the words of the name catch them.
UNLISTED_PATH_VARIABLES = [
    "NCCL_SOME_FUTURE_FILE",
    "TORCH_NEW_CACHE_DIR",
    "CUDA_SOMETHING_LIBRARY",
    "NCCL_NEW_PLUGIN",
    "TORCH_FOO_OUT",
    "NVTE_DEBUG_DUMP_DIR",
    "GLOO_CONF_FILENAME",
    "OPENBLAS_CONF_X",
]
# Settings whose plain values must still pass (some hold a '/', or a word the name rules look for).
ACCEPTED = {
    "TORCH_LOGS": "+c10d",
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "NCCL_SOCKET_IFNAME": "^docker,lo",
    "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
    "NCCL_IB_ADDR_RANGE": "10.0.0.0/16",
    "NCCL_ALGO": "allreduce:tree;allgather:ring",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "KMP_DUPLICATE_LIB_OK": "TRUE",
    "KMP_AFFINITY": "granularity=fine,compact,1,0",
    "OMP_NUM_THREADS": "4",
    "TZ": "Europe/Paris",
    "JOB_DATA_FILE": "/data/train.bin",
    "JOB_OUT_DIR": "~/runs/a",
    "JOB_NOTE": "a\nb",
}


@pytest.mark.parametrize("name", PATH_VARIABLES + UNLISTED_PATH_VARIABLES)
@pytest.mark.parametrize("value", ["/outside/file", "plain"])
def test_a_variable_that_names_a_path_is_refused_whatever_its_value(name: str, value: str) -> None:
    why = env_refusal(name, value)
    assert why is not None
    with pytest.raises(InputError) as caught:
        check_env({"TORCH_LOGS": "+c10d", name: value})
    text = str(caught.value)
    assert f"env: {name!r} may not be set by a job" in text
    assert "TORCH_LOGS'" not in text  # the allowed one is not named
    assert "accepted: NCCL_*" in text and "JOB_*" in text
    if not name.startswith("NCCL_RAS_"):
        assert "file, folder, library, pipe or socket" in text


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NCCL_ALGO", "/outside/file"),
        ("TORCH_LOGS", "~/x"),
        ("NCCL_SOCKET_IFNAME", "../../etc"),
        ("OMP_NUM_THREADS", ".hidden"),
        ("TZ", "/etc/passwd"),
        ("TZ", ":/etc/localtime"),
        ("TZ", "Europe/../../../tmp/x"),
        ("NCCL_IB_ADDR_RANGE", "/tmp/x"),
        ("NCCL_DEBUG", "INFO\nNCCL_DEBUG_FILE=/tmp/x"),
        ("NCCL_DEBUG", "INFO\x85x"),
        ("NCCL_DEBUG", "INFO\u2028x"),
        ("JOB_X", "a\x00b"),
    ],
)
def test_a_value_that_reads_as_a_path_or_holds_a_control_is_refused(name: str, value: str) -> None:
    why = env_refusal(name, value)
    assert why is not None and "value" in why
    with pytest.raises(InputError, match=f"env: '{name}' may not be set by a job: its value"):
        check_env({name: value})


def test_plain_settings_and_the_jobs_own_paths_are_accepted() -> None:
    check_env(ACCEPTED)
    assert all(env_refusal(k, v) is None for k, v in ACCEPTED.items())


@pytest.mark.parametrize("backend", ["local", "slurm", "ray", "kubernetes", "skypilot"])
def test_every_backend_refuses_them_in_the_plan(settings: Settings, backend: str) -> None:
    """training.plan checks the spec before any backend sees it: the same rule on every backend."""
    spec = TrainingJobSpec(
        recipe="tiny-gpt",
        backend=backend,
        env={"TORCH_LOGS": "+c10d", "TORCH_LOGS_OUT": "/outside/file", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p"},
    )
    with pytest.raises(InputError) as caught:
        training.plan(settings, spec, gpus_present=0, gpus_in_use=0)
    assert "'TORCH_LOGS_OUT' may not be set" in str(caught.value)
    assert "'NCCL_DEBUG_FILE' may not be set" in str(caught.value)


def test_the_slurm_batch_script_applies_the_same_rule(tmp_path: Path) -> None:
    """The Slurm backend checks the variables it writes into its batch script again, with env_refusal."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = {
        "script": str(script),
        "nproc_per_node": 1,
        "gpus_per_node": 0,
        "max_wall_s": 60,
        "name": "t",
        "run_id": "t1",
    }
    backend = SlurmBackend(job_root=tmp_path / "slurm-jobs")
    for env in ({"TORCH_LOGS_OUT": "/outside/file"}, {"NCCL_ALGO": "/outside/file"}):
        with pytest.raises(ValueError, match=f"env: '{next(iter(env))}' may not be set"):
            backend.plan({**spec, "env": env}, check_partition=False)


@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_the_attack_through_the_tools_and_a_job_with_torch_logs_still_runs(app: App, tmp_path: Path) -> None:
    """The issue's attack through plan_training_job and submit_training_job: refused, nothing written outside.
    The allowed half of it (TORCH_LOGS=+c10d) still runs a real local job, which sees the value."""
    script = tmp_path / "scripts" / "show_logs.py"
    script.parent.mkdir()
    script.write_text(
        "import json, os\n"
        "if int(os.environ['RANK']) == 0:\n"
        "    with open(os.environ['JOB_SEEN_OUT'], 'w') as f:\n"
        "        json.dump({'TORCH_LOGS': os.environ.get('TORCH_LOGS')}, f)\n"
    )
    outside = tmp_path.parent / f"{tmp_path.name}-outside" / "c10d.log"
    seen = tmp_path / "seen.json"
    spec = {"script": str(script), "nproc_per_node": 1, "gpus_per_node": 0, "env": {"TORCH_LOGS": "+c10d"}}
    attack = {**spec, "env": {"TORCH_LOGS": "+c10d", "TORCH_LOGS_OUT": str(outside)}}
    async with Client(create_test_suite(app), mode="legacy") as client:
        for tool in ("plan_training_job", "submit_training_job"):
            text = await error(client, tool, {"spec": attack})
            assert "TORCH_LOGS_OUT" in text and "file, folder, library" in text and "accepted:" in text
        assert (await ok(client, "list_jobs", {}))["total"] == 0
        allowed = {**spec, "env": {**spec["env"], "JOB_SEEN_OUT": str(seen)}}
        job = await ok(client, "submit_training_job", {"spec": allowed, "wait_s": 0})
        done = await finish_job(client, job["job_id"], 180)
        assert done["state"] == "SUCCEEDED", done["reason"]
    assert json.loads(seen.read_text()) == {"TORCH_LOGS": "+c10d"}
    assert not outside.exists() and not outside.parent.exists()
