"""The SkyPilot backend (servers/launch/skypilot.py).

What is tested how:
- The task YAML: golden files per spec variant (tests/fixtures/skypilot/*.yaml, compared exactly, with this
  checkout's path as <PACKAGE> and the test's folder as <ROOT>). Regenerate them after a deliberate change with
  `.venv/bin/python -m tests.test_skypilot_backend --write` and review the diff.
- SkyPilot's own loader (sky.Task.from_yaml_str) on every golden task, and on what it must reject: only where
  SkyPilot is installed (skipped with the reason otherwise; it is an optional extra of about 430 MB).
- The run commands for real: bash runs the rendered run script of two "nodes" on 127.0.0.1 (SkyPilot's variables
  set as SkyPilot sets them, its file_mounts copied into a home folder), torchrun and the bundled recipe included;
  arguments reach the script literally; max_wall_s ends it (exit 124).
- The backend's calls into SkyPilot's client SDK against `FakeSky`, a stand-in module injected as `sky` that
  records every call and answers in the SDK's documented shapes (request ids; api_status payloads; get results;
  queue_v2's (records, total, counts, total) with ManagedJobRecord-like records carrying ManagedJobStatus values),
  with the real signatures of SkyPilot 0.14.1 (sky/client/sdk.py, sky/jobs/client/sdk.py, sky/jobs/state.py).
  Where SkyPilot is installed, the fake's signatures and states are checked against the real ones.
- The state table: every ManagedJobStatus mapped, each through status() with its reason, unknown ones LOST.
Not tested here: a real API server, a real jobs controller, any cloud (none can run on this machine).
"""

import enum
import importlib.machinery
import inspect
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servers.core.errors import InputError
from servers.core.jobfiles import JobFiles
from servers.core.jobstore import JobState
from servers.core.settings import Settings
from servers.engines.backend import Backend, BackendHandle, SubmitRequest
from servers.launch import skypilot
from servers.launch.skypilot import (
    CANCEL_RECORD,
    MANAGED_JOB_STATES,
    MASTER_PORT,
    PACKAGE_ROOT,
    RECIPES_DIR,
    STATE_WORDS,
    SUBMIT_RECORD,
    TASK_FILE,
    TASK_NAME_PATTERN,
    SkyPilotBackend,
    SkyPilotUnavailableError,
    check_structure,
    job_name_for,
)
from tests.engine_follow import wait_until
from tests.hostile import HOSTILE_ARGS

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "fixtures" / "skypilot"
ECHO_ARGS = REPO / "tests" / "fixtures" / "launch" / "echo_args.py"
TINY_GPT = RECIPES_DIR / "tiny_gpt.py"


def real_sky() -> Any:
    """SkyPilot's real SDK when installed (and not faked by a test), else None."""
    if skypilot.skypilot_version() is None:
        return None
    import sky

    return None if getattr(sky, "IS_FAKE", False) else sky


NEEDS_SKY = pytest.mark.skipif(
    skypilot.skypilot_version() is None,
    reason="SkyPilot is not installed (optional extra: pip install 'llm-infra-mcp[skypilot]', about 430 MB)",
)


# ---- spec variants and their golden YAML ----------------------------------------------------------------------------
def base_spec(script: Path, **extra: Any) -> dict[str, Any]:
    """A spec as training.plan hands it to a backend; SkyPilot's options in `extra` go into its options."""
    options = {k: extra.pop(k) for k in list(extra) if k in skypilot.SkyPilotOptions.model_fields}
    return {
        "script": str(script),
        "args": [],
        "nproc_per_node": 1,
        "max_restarts": 0,
        "env": {},
        "gpus_wanted": 0,
        "network": "host",
        "workdir": None,
        "max_log_bytes": 8 * 1024 * 1024,
        "run_id": "run1",
        "max_wall_s": 3600.0,
        "gpus_per_node": 0,
        "nnodes": 1,
        "idempotency_key": None,
        "recipe": None,
        "name": None,
        "tags": [],
        "options": options,
    } | extra


def variant_specs(root: Path) -> dict[str, tuple[dict[str, Any], Settings]]:
    """The golden variants; files they name are made under `root`."""
    project = root / "project"
    (project / "pkg").mkdir(parents=True, exist_ok=True)
    (project / "train.py").write_text("import pkg\n")
    (project / "pkg" / "__init__.py").write_text("")
    elsewhere = root / "scripts"
    elsewhere.mkdir(parents=True, exist_ok=True)
    (elsewhere / "train_alone.py").write_text("print('hi')\n")
    settings = Settings(home=root / "state", allowed_roots=[root])
    return {
        "recipe-cpu-1node": (
            base_spec(TINY_GPT, recipe="tiny-gpt", args=["--steps", "200"], nproc_per_node=2, max_wall_s=600.0),
            settings,
        ),
        "recipe-h100-2nodes-spot": (
            base_spec(
                TINY_GPT,
                recipe="tiny-gpt",
                name="tiny-gpt-h100",
                args=["--steps", "3000", "--batch-size", "64"],
                nnodes=2,
                nproc_per_node=8,
                gpus_per_node=8,
                gpus_wanted=8,
                accelerator="H100",
                infra="aws/us-east-1",
                use_spot=True,
                job_recovery="EAGER_NEXT_REGION",
                max_restarts_on_errors=2,
                max_restarts=1,
                env={"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
                max_wall_s=7200.0,
                idempotency_key="sweep-7-run-3",
            ),
            settings,
        ),
        "script-workdir-image-k8s": (
            base_spec(
                project / "train.py",
                name="my train",
                workdir=str(project),
                args=["--config", "configs/small.yaml"],
                nproc_per_node=4,
                gpus_per_node=4,
                accelerator="A100-80GB",
                infra="k8s/my-context",
                image="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                pip_packages=["transformers==4.46.0", "datasets>=3.0"],
                job_recovery="FAILOVER",
            ),
            settings,
        ),
        "script-alone-hostile-args": (
            base_spec(
                elsewhere / "train_alone.py",
                args=HOSTILE_ARGS,
                gpus_per_node=1,
                accelerator="L4",
                max_wall_s=None,
                env={"JOB_ECHO_ARGS_OUT": "args.json"},
            ),
            settings,
        ),
    }


def portable(text: str, root: Path) -> str:
    return text.replace(str(root), "<ROOT>").replace(str(PACKAGE_ROOT), "<PACKAGE>")


def render(name: str, root: Path) -> str:
    spec, settings = variant_specs(root)[name]
    return SkyPilotBackend().plan(spec, settings).rendered or ""


VARIANTS = ["recipe-cpu-1node", "recipe-h100-2nodes-spot", "script-alone-hostile-args", "script-workdir-image-k8s"]


def write_golden() -> None:
    """Regenerate tests/fixtures/skypilot/*.yaml (python -m tests.test_skypilot_backend --write)."""
    root = Path(tempfile.mkdtemp(prefix="skypilot-golden-")).resolve()
    try:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name in VARIANTS:
            (GOLDEN / f"{name}.yaml").write_text(portable(render(name, root), root))
            print(f"wrote {GOLDEN / name}.yaml")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_task_yaml_is_exactly_the_golden_file(name: str, tmp_path: Path) -> None:
    root = tmp_path.resolve()
    text = render(name, root)
    golden = (GOLDEN / f"{name}.yaml").read_text()
    assert portable(text, root) == golden, (
        f"the rendered task differs from {GOLDEN / name}.yaml; if the change is meant, run "
        "`.venv/bin/python -m tests.test_skypilot_backend --write` and review the diff"
    )
    task = yaml.safe_load(text)
    assert check_structure(task) == []
    assert list(task) == [k for k in skypilot.TASK_FIELDS if k in task]  # the order SkyPilot's docs use


def test_the_golden_files_are_the_variants_and_nothing_else(tmp_path: Path) -> None:
    assert sorted(variant_specs(tmp_path)) == VARIANTS
    assert sorted(p.stem for p in GOLDEN.glob("*.yaml")) == VARIANTS


def test_the_rendered_task_carries_the_spec(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    specs = variant_specs(root)
    big = yaml.safe_load(render("recipe-h100-2nodes-spot", root))
    assert big["num_nodes"] == 2
    assert big["resources"] == {
        "infra": "aws/us-east-1",
        "accelerators": "H100:8",
        "use_spot": True,
        "job_recovery": {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 2},
    }
    assert big["envs"] == {"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "PYTHONUNBUFFERED": "1"}
    assert big["file_mounts"] == {
        "~/llm-infra-mcp/launch/recipes": str(RECIPES_DIR),
        "~/llm-infra-mcp/launch/metrics.py": str(RECIPES_DIR.parent / "metrics.py"),
    }
    run = big["run"]
    for piece in (
        '--nnodes "$SKYPILOT_NUM_NODES"',
        '--node_rank "$SKYPILOT_NODE_RANK"',
        "--nproc_per_node 8",
        '--master_addr "$MASTER_ADDR"',
        "--max_restarts 1",
        "timeout --signal=TERM --kill-after=30 7200",
        'MASTER_ADDR="$(printf \'%s\\n\' "$SKYPILOT_NODE_IPS" | head -n1)"',
    ):
        assert piece in run
    k8s = yaml.safe_load(render("script-workdir-image-k8s", root))
    assert k8s["workdir"] == str(root / "project")
    assert "file_mounts" not in k8s  # the script travels in the workdir
    assert k8s["resources"]["image_id"] == "docker:pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert k8s["resources"]["job_recovery"] == {"strategy": "FAILOVER"}
    assert "python -m pip install --quiet transformers==4.46.0 'datasets>=3.0'" in k8s["setup"]
    assert "train.py --config configs/small.yaml" in k8s["run"]
    assert 'cd "$RUN_DIR"' not in k8s["run"]  # SkyPilot runs it from the workdir
    alone = yaml.safe_load(render("script-alone-hostile-args", root))
    assert alone["file_mounts"] == {"~/llm-infra-mcp/script/train_alone.py": str(root / "scripts" / "train_alone.py")}
    assert "timeout" not in alone["run"]
    cpu = yaml.safe_load(render("recipe-cpu-1node", root))
    assert "resources" not in cpu
    assert specs["recipe-cpu-1node"][0]["nproc_per_node"] == 2 and "--nproc_per_node 2" in cpu["run"]


def test_plan_shows_the_managed_job_and_what_it_assumes(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    spec, settings = variant_specs(root)["recipe-h100-2nodes-spot"]
    plan = SkyPilotBackend().plan(spec, settings)
    name = job_name_for("sweep-7-run-3")
    assert plan.backend == "skypilot" and plan.nnodes == 2 and plan.nproc_per_node == 8
    assert plan.argv == ["sky", "jobs", "launch", "--yes", "--name", name, f"$JOB_DIR/{TASK_FILE}"]
    assert plan.cwd == "$JOB_DIR" and plan.gpus_wanted == 0 and plan.gpus is None
    notes = "\n".join(plan.notes)
    for words in (
        f"managed job (sky jobs launch) named {name}",
        "relaunches it after a preemption (use_spot",
        "job_recovery EAGER_NEXT_REGION, relaunched up to 2 time(s)",
        "H100:8 per node (16 GPU(s) in all)",
        "`python` on PATH with torch",
        "exit 124: FAILED",
        "not copied back",
        "temporary bucket",
    ):
        assert words in notes, words
    bound = plan.bind(tmp_path / "job")
    assert bound.cwd == str(tmp_path / "job") and bound.argv[-1] == str(tmp_path / "job" / TASK_FILE)
    assert bound.rendered == plan.rendered  # nothing of this machine's job folder goes to the nodes


def test_plan_without_skypilot_says_it_was_not_validated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(skypilot, "skypilot_version", lambda: None)
    plan = SkyPilotBackend().plan(base_spec(TINY_GPT, recipe="tiny-gpt"), Settings(home=tmp_path))
    assert plan.notes[0].startswith("not validated by SkyPilot: it is not installed here")


def test_plan_with_skypilot_validates_with_its_loader(fake_sky: "FakeSky", tmp_path: Path) -> None:
    plan = SkyPilotBackend().plan(base_spec(TINY_GPT, recipe="tiny-gpt"), Settings(home=tmp_path))
    assert plan.notes[0].startswith("validated offline by SkyPilot")
    assert fake_sky.calls_named("Task.from_yaml_str") == [((plan.rendered,), {})]
    fake_sky.reject_yaml = ValueError("Invalid task YAML: Found unsupported field 'foo'.\nmore")
    with pytest.raises(ValueError, match="SkyPilot rejects the rendered task: Invalid task YAML: Found unsupported"):
        SkyPilotBackend().plan(base_spec(TINY_GPT, recipe="tiny-gpt"), Settings(home=tmp_path))


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"gpus_per_node": 8, "nproc_per_node": 8}, "accelerator: missing for 8 GPU(s) per node"),
        ({"accelerator": "H100"}, "gpus_per_node: 0 with accelerator H100"),
        ({"accelerator": "H100:8", "gpus_per_node": 8}, "accelerator: 'H100:8'; accepted: a SkyPilot GPU name"),
        ({"accelerator": "H100; rm -rf /", "gpus_per_node": 1}, "accelerator:"),
        ({"infra": "aws us-east-1"}, "infra: 'aws us-east-1'; accepted: cloud[/region[/zone]]"),
        ({"infra": "$(id)"}, "infra:"),
        ({"job_recovery": "RETRY"}, "job_recovery: 'RETRY'; accepted: FAILOVER, EAGER_NEXT_REGION"),
        ({"max_restarts_on_errors": -1}, "max_restarts_on_errors: -1; accepted: 0 to 100"),
        ({"use_spot": "yes"}, "use_spot: 'yes'; accepted: true or false"),
        ({"image": "img with space"}, "image: 'img with space'"),
        ({"pip_packages": ["--index-url=https://evil.example"]}, "pip_packages: '--index-url"),
        ({"pip_packages": ["git+https://github.com/x/y"]}, "pip_packages: 'git+https"),
        ({"pip_packages": ["torch; os_name=='nt'"]}, "pip_packages:"),
        ({"pip_packages": ["p"] * 33}, "pip_packages: 33 given; accepted: at most 32"),
        ({"args": ["--out=$JOB_DIR/x"]}, "args: '--out=$JOB_DIR/x' names $JOB_DIR"),
        ({"args": ["bell\x07"]}, "args: control characters"),
        ({"env": {"SKYPILOT_NODE_RANK": "0"}}, "env: SKYPILOT_NODE_RANK is reserved"),
        ({"env": {"LLM_INFRA_MCP_METRICS": "/x"}}, "env: LLM_INFRA_MCP_METRICS is reserved"),
        ({"env": {"JOB_X": "$JOB_DIR"}}, "env: JOB_X holds a NUL byte or a placeholder"),
        ({"nnodes": 65}, "nnodes: 65; accepted: 1 to 64"),
        ({"nproc_per_node": 8, "gpus_per_node": 4, "accelerator": "H100"}, "nproc_per_node: 8 ranks need 8 GPUs"),
        ({"max_wall_s": -5.0}, "max_wall_s: -5.0"),
        ({"script": "relative.py"}, "script: the path must be absolute"),
        ({"script": "/tmp/$HOME/x.py"}, "script: '/tmp/$HOME/x.py' holds '$'"),
    ],
)
def test_plan_refuses_what_skypilot_or_the_nodes_cannot_take(
    extra: dict[str, Any], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(skypilot, "skypilot_version", lambda: None)
    fields = dict(extra)
    script = Path(fields.pop("script", TINY_GPT))
    with pytest.raises(ValueError) as caught:
        SkyPilotBackend().plan(base_spec(script, recipe="tiny-gpt", **fields), Settings(home=tmp_path))
    assert words in str(caught.value)


def test_a_workdir_outside_the_allowed_roots_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    settings = Settings(home=tmp_path / "state", allowed_roots=[tmp_path / "inside"])
    with pytest.raises(InputError, match="workdir"):
        SkyPilotBackend().plan(base_spec(TINY_GPT, recipe="tiny-gpt", workdir=str(outside)), settings)


def test_job_names_are_skypilot_names_derived_from_the_key() -> None:
    keys = ["k", "sweep-7-run-3", "0123456789abcdef-a1b2c3d4e5f6", "a.b:c_d", "x" * 128, "ü-ñ", "---"]
    names = [job_name_for(k) for k in keys]
    assert len(set(names)) == len(keys)
    for name in names:
        assert TASK_NAME_PATTERN.fullmatch(name) and len(name) <= 63, name
    assert job_name_for("sweep-7-run-3") == job_name_for("sweep-7-run-3")
    assert job_name_for("sweep-7-run-3").startswith("llm-sweep-7-run-3-")


def test_the_backend_meets_the_protocol_and_imports_no_sky_at_start() -> None:
    assert isinstance(SkyPilotBackend(), Backend)
    code = "import sys, servers.launch.skypilot; assert 'sky' not in sys.modules, 'sky imported at start-up'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


# ---- SkyPilot's own loader (where installed) ------------------------------------------------------------------------
@NEEDS_SKY
@pytest.mark.parametrize("name", VARIANTS)
def test_skypilot_parses_every_golden_task(name: str, tmp_path: Path) -> None:
    sky = real_sky()
    assert sky is not None
    root = tmp_path.resolve()
    text = render(name, root)
    task = sky.Task.from_yaml_str(text)
    task.validate_name()
    task.validate_run()
    expected = yaml.safe_load(text)
    assert task.name == expected["name"] and task.num_nodes == expected["num_nodes"]
    assert task.run == expected["run"] and dict(task.envs) == expected["envs"]
    assert (task.setup or None) == expected.get("setup")
    (resources,) = list(task.resources)
    wanted = expected.get("resources", {})
    if "accelerators" in wanted:
        gpu, count = wanted["accelerators"].split(":")
        assert resources.accelerators == {gpu: int(count)}
    assert bool(resources.use_spot) == bool(wanted.get("use_spot"))
    if "job_recovery" in wanted:
        assert resources.job_recovery == wanted["job_recovery"]
    assert dict(task.file_mounts or {}) == expected.get("file_mounts", {})


@NEEDS_SKY
@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda t: t | {"num_nodes": 0}, "num_nodes"),
        (lambda t: t | {"nodes": 2}, "nodes"),
        (lambda t: t | {"resources": {"accelerators": "H100:8", "gpu_count": 8}}, "gpu_count"),
        (lambda t: t | {"name": "bad name!"}, "name"),
    ],
)
def test_skypilot_rejects_what_the_plan_must_never_render(change: Any, words: str, tmp_path: Path) -> None:
    sky = real_sky()
    assert sky is not None
    task = yaml.safe_load(render("recipe-cpu-1node", tmp_path.resolve()))
    with pytest.raises(Exception) as caught:
        loaded = sky.Task.from_yaml_str(yaml.safe_dump(change(task)))
        loaded.validate_name()
    assert words in str(caught.value)
    assert check_structure(change(task)) != []  # the structural check refuses it too


@NEEDS_SKY
def test_the_fake_has_skypilots_signatures_and_states() -> None:
    sky = real_sky()
    assert sky is not None
    assert {s.value for s in sky.jobs.ManagedJobStatus} == {s.value for s in ManagedJobStatus}
    for name in ("launch", "queue_v2", "queue", "cancel", "tail_logs"):
        real = list(inspect.signature(getattr(sky.jobs, name)).parameters)
        fake = list(inspect.signature(getattr(FakeSky.Jobs, name)).parameters)[1:]
        assert fake == real, name
    for name in ("get", "api_status", "api_cancel"):
        real = list(inspect.signature(getattr(sky, name)).parameters)
        fake = list(inspect.signature(getattr(FakeSky, name)).parameters)[1:]
        assert fake == real, name


# ---- the state table ------------------------------------------------------------------------------------------------
class ManagedJobStatus(enum.Enum):
    """sky/jobs/state.py ManagedJobStatus of SkyPilot 0.14.1, names and values."""

    PENDING = "PENDING"
    DEPRECATED_SUBMITTED = "SUBMITTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    WINDING_DOWN = "WINDING_DOWN"
    RECOVERING = "RECOVERING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"
    FAILED_PRECHECKS = "FAILED_PRECHECKS"
    FAILED_NO_RESOURCE = "FAILED_NO_RESOURCE"
    FAILED_CONTROLLER = "FAILED_CONTROLLER"


EXPECTED_STATES = {
    "PENDING": JobState.QUEUED,
    "SUBMITTED": JobState.QUEUED,
    "STARTING": JobState.STARTING,
    "RUNNING": JobState.RUNNING,
    "WINDING_DOWN": JobState.RUNNING,
    "RECOVERING": JobState.STARTING,
    "CANCELLING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
    "FAILED": JobState.FAILED,
    "FAILED_SETUP": JobState.FAILED,
    "FAILED_PRECHECKS": JobState.FAILED,
    "FAILED_NO_RESOURCE": JobState.FAILED,
    "FAILED_CONTROLLER": JobState.FAILED,
}


def test_the_state_table_maps_every_managed_job_state() -> None:
    assert MANAGED_JOB_STATES == EXPECTED_STATES
    assert set(MANAGED_JOB_STATES) == {s.value for s in ManagedJobStatus}
    assert set(STATE_WORDS) == set(MANAGED_JOB_STATES)
    for name in ("PENDING", "STARTING", "RUNNING", "RECOVERING", "CANCELLING"):  # the list
        assert not MANAGED_JOB_STATES[name].terminal
    sky = real_sky()
    if sky is not None:  # SkyPilot's own notion of terminal agrees
        for status in sky.jobs.ManagedJobStatus:
            assert MANAGED_JOB_STATES[status.value].terminal == status.is_terminal(), status
            assert (MANAGED_JOB_STATES[status.value] is JobState.FAILED) == status.is_failed(), status


@pytest.mark.parametrize("status", list(ManagedJobStatus), ids=lambda s: s.value)
def test_status_reports_each_state_with_its_reason(status: ManagedJobStatus, fake_sky: "FakeSky") -> None:
    job_id = fake_sky.add_job("llm-x", status, recovery_count=2, failure_reason="exit code 1 on node 1")
    got = SkyPilotBackend().status(BackendHandle(backend="skypilot", key="x", native_id=f"job:{job_id}"))
    assert got.state is EXPECTED_STATES[status.value]
    assert got.native_state == status.value
    assert STATE_WORDS[status.value] in (got.reason or "")
    assert got.restarts == 2 and "recovered 2 time(s)" in (got.reason or "")
    assert "SkyPilot: exit code 1 on node 1" in (got.reason or "")
    assert got.started_at == 1000.0 and got.exit_code is None


def test_an_unknown_state_is_lost(fake_sky: "FakeSky") -> None:
    job_id = fake_sky.add_job("llm-x", "TELEPORTING")
    got = SkyPilotBackend().status(BackendHandle(backend="skypilot", key="x", native_id=f"job:{job_id}"))
    assert got.state is JobState.LOST and "unknown managed-job state 'TELEPORTING'" in (got.reason or "")
    gone = SkyPilotBackend().status(BackendHandle(backend="skypilot", key="x", native_id="job:999"))
    assert gone.state is JobState.LOST and "no managed job 999" in (gone.reason or "")


# ---- the fake SDK ---------------------------------------------------------------------------------------------------
class ApiServerConnectionError(RuntimeError):
    """sky.exceptions.ApiServerConnectionError: raised by the client's health check, before any request is sent."""

    def __init__(self, server_url: str) -> None:
        super().__init__(f"Could not connect to SkyPilot API server at {server_url}.")


class Record:
    """Like sky.schemas.api.responses.ManagedJobRecord: fields as attributes, and the dict-like get of its base."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getitem__(self, key: str) -> Any:
        return self.__dict__[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.__dict__.get(key, default)


class FakeSky:
    """SkyPilot's client SDK as this backend uses it, in memory. Requests finish as the test says (`hold` keeps a
    launch request RUNNING until released); managed jobs follow a script of states, one per queue call."""

    IS_FAKE = True

    class Jobs:
        def __init__(self, outer: "FakeSky") -> None:
            self.outer = outer
            self.ManagedJobStatus = ManagedJobStatus

        def launch(
            self,
            task: Any,
            name: Any = None,
            pool: Any = None,
            num_jobs: Any = None,
            job_group: Any = None,
            _need_confirmation: bool = False,
        ) -> str:
            o = self.outer
            o.record("jobs.launch", (task,), {"name": name})
            if o.launch_error is not None:
                raise o.launch_error
            job_id = o.add_job(name, ManagedJobStatus.PENDING, create=not o.hold_launch)
            return o.add_request(
                "sky.jobs.launch", ([job_id], None), running=o.hold_launch, job_id=job_id, job_name=name
            )

        def queue_v2(
            self,
            refresh: bool,
            skip_finished: bool = False,
            all_users: bool = False,
            job_ids: Any = None,
            limit: Any = None,
            fields: Any = None,
            sort_by: Any = None,
            sort_order: Any = None,
            statuses: Any = None,
            submitted_after: Any = None,
            submitted_before: Any = None,
            infra_match: Any = None,
            name_match: Any = None,
        ) -> str:
            o = self.outer
            o.record("jobs.queue_v2", (), {"refresh": refresh, "job_ids": job_ids, "fields": fields})
            records = o.records(job_ids, as_dicts=False)
            return o.add_request("sky.jobs.queue_v2", (records, len(records), {}, len(o.jobs)), running=o.hold_queue)

        def queue(
            self,
            refresh: bool,
            skip_finished: bool = False,
            all_users: bool = False,
            job_ids: Any = None,
            version: int = 1,
        ) -> str:
            o = self.outer
            o.record("jobs.queue", (), {"refresh": refresh, "job_ids": job_ids})
            return o.add_request("sky.jobs.queue", o.records(job_ids, as_dicts=True))

        def cancel(
            self,
            name: Any = None,
            job_ids: Any = None,
            all: bool = False,  # SkyPilot's name
            all_users: bool = False,
            pool: Any = None,
            graceful: bool = False,
            graceful_timeout: Any = None,
            task: Any = None,
        ) -> str:
            o = self.outer
            o.record("jobs.cancel", (), {"job_ids": job_ids})
            for job_id in job_ids or []:
                job = o.jobs.get(job_id)
                if job is not None and not EXPECTED_STATES[job["script"][0].value].terminal:
                    job["script"] = [ManagedJobStatus.CANCELLING, ManagedJobStatus.CANCELLED]
            return o.add_request("sky.jobs.cancel", None)

        def tail_logs(
            self,
            name: Any = None,
            job_id: Any = None,
            follow: bool = True,
            controller: bool = False,
            refresh: bool = False,
            tail: Any = None,
            tail_offset: Any = None,
            output_stream: Any = None,
            task: Any = None,
            *,
            preload_content: bool = True,
        ) -> Any:
            o = self.outer
            o.record("jobs.tail_logs", (), {"job_id": job_id, "follow": follow, "controller": controller})
            text = o.controller_log if controller else o.job_log
            for line in text.splitlines(keepends=True):
                output_stream.write(line)
            return None

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.requests: dict[str, dict[str, Any]] = {}
        self.jobs: dict[int, dict[str, Any]] = {}
        self.next_job = 1
        self.hold_launch = False
        self.hold_queue = False
        self.launch_error: BaseException | None = None
        self.reject_yaml: BaseException | None = None
        self.unreachable: BaseException | None = None
        self.job_log = "(head, rank=0, pid=1) step 1\n(worker1, rank=1, pid=2) step 1\n"
        self.controller_log = "Launching the cluster...\nJob submitted.\n"
        self.lock = threading.Lock()
        self.jobs_module = FakeSky.Jobs(self)
        self.exceptions = types.SimpleNamespace(ApiServerConnectionError=ApiServerConnectionError)
        outer = self

        class Task:
            def __init__(self, text: str) -> None:
                self.text = text

            @staticmethod
            def from_yaml_str(yaml_str: str) -> "Task":
                outer.record("Task.from_yaml_str", (yaml_str,), {})
                if outer.reject_yaml is not None:
                    raise outer.reject_yaml
                return Task(yaml_str)

            def validate_name(self) -> None:
                pass

            def validate_run(self) -> None:
                pass

        self.Task = Task

    def record(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with self.lock:
            self.calls.append((name, args, kwargs))
        if self.unreachable is not None:
            raise self.unreachable

    def calls_named(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(a, k) for n, a, k in self.calls if n == name]

    def add_request(self, name: str, result: Any, *, running: bool = False, **extra: Any) -> str:
        rid = f"req-{len(self.requests) + 1:04d}-{name.rsplit('.', 1)[-1]}"
        self.requests[rid] = {"name": name, "status": "RUNNING" if running else "SUCCEEDED", "result": result} | extra
        return rid

    def add_job(self, name: Any, *statuses: Any, create: bool = True, **fields: Any) -> int:
        job_id = self.next_job
        self.next_job += 1
        if create:
            self.jobs[job_id] = {"name": name, "script": list(statuses), "fields": fields}
        else:
            self.pending_job = (job_id, name, list(statuses))
        return job_id

    def finish_launch(self, rid: str, status: str = "SUCCEEDED", error: BaseException | None = None) -> None:
        request = self.requests[rid]
        request["status"] = status
        request["error"] = error
        if status == "SUCCEEDED" and request.get("job_id") not in self.jobs:
            job_id, name, statuses = self.pending_job
            self.jobs[job_id] = {"name": name, "script": statuses, "fields": {}}

    def script(self, job_id: int, *statuses: Any) -> None:
        self.jobs[job_id]["script"] = list(statuses)

    def records(self, job_ids: Any, *, as_dicts: bool) -> list[Any]:
        out = []
        for job_id, job in sorted(self.jobs.items()):
            if job_ids is not None and job_id not in job_ids:
                continue
            status = job["script"][0]
            if len(job["script"]) > 1 and job_ids is not None:
                job["script"].pop(0)
            fields = {
                "job_id": job_id,
                "task_id": 0,
                "job_name": job["name"],
                "task_name": job["name"],
                "status": status,
                "submitted_at": 900.0,
                "start_at": 1000.0,
                "end_at": 2000.0
                if isinstance(status, ManagedJobStatus) and EXPECTED_STATES[status.value].terminal
                else None,
                "recovery_count": 0,
                "failure_reason": None,
                "resources": "1x[H100:8]",
            } | job["fields"]
            out.append(dict(fields) if as_dicts else Record(**fields))
        return out

    # sky.get / sky.api_status / sky.api_cancel
    def get(self, request_id: Any) -> Any:
        self.record("get", (request_id,), {})
        request = self.requests.get(str(request_id))
        if request is None:
            raise RuntimeError(f"Failed to get request {request_id}: 404 Not Found")
        if request["status"] == "FAILED":
            raise request["error"]
        if request["status"] == "CANCELLED":
            raise RuntimeError(f"Current {request['name']!r} request ({request_id}) is cancelled by another process.")
        if request["status"] != "SUCCEEDED":
            raise AssertionError("sky.get on a request not finished: the backend would block here")
        return request["result"]

    def api_status(
        self,
        request_ids: Any = None,
        all_status: bool = False,
        limit: Any = None,
        fields: Any = None,
        cluster_name: Any = None,
    ) -> list[Any]:
        self.record("api_status", (request_ids,), {})
        found = []
        for rid in request_ids or []:
            request = self.requests.get(rid)
            if request is not None:
                found.append(
                    types.SimpleNamespace(
                        request_id=rid,
                        name=request["name"],
                        status=request["status"],
                        status_msg=request.get("status_msg"),
                        created_at=0.0,
                    )
                )
        return found

    def api_cancel(self, request_ids: Any = None, all_users: bool = False, silent: bool = False) -> str:
        self.record("api_cancel", (request_ids,), {})
        for rid in request_ids or []:
            if self.requests.get(rid, {}).get("status") == "RUNNING" and not self.launch_gets_through:
                self.requests[rid]["status"] = "CANCELLED"
        return self.add_request("sky.api_cancel", list(request_ids or []))

    launch_gets_through = False

    def module(self) -> types.ModuleType:
        sky = types.ModuleType("sky")
        sky.__spec__ = importlib.machinery.ModuleSpec("sky", None)
        sky.IS_FAKE = True  # type: ignore[attr-defined]
        for name in ("Task", "get", "api_status", "api_cancel", "exceptions"):
            setattr(sky, name, getattr(self, name))
        sky.jobs = self.jobs_module  # type: ignore[attr-defined]
        return sky


@pytest.fixture
def fake_sky(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSky]:
    """A FakeSky injected as the `sky` module (and SkyPilot reported installed)."""
    fake = FakeSky()
    monkeypatch.setitem(sys.modules, "sky", fake.module())
    monkeypatch.setitem(sys.modules, "sky.jobs", fake.jobs_module)  # type: ignore[arg-type]
    monkeypatch.setattr(skypilot, "skypilot_version", lambda: "0.14.1 (fake)")
    yield fake


def quick_backend(tmp_path: Path, **kwargs: Any) -> SkyPilotBackend:
    options: dict[str, Any] = {
        "jobs_dir": tmp_path / "jobs",
        "request_timeout_s": 2.0,
        "cancel_wait_s": 2.0,
        "request_poll_s": 0.01,
        "log_sync_s": 0.0,
    }
    return SkyPilotBackend(**(options | kwargs))


def planned(tmp_path: Path, **extra: Any) -> Any:
    spec = base_spec(TINY_GPT, recipe="tiny-gpt", **({"nnodes": 2, "gpus_per_node": 8, "accelerator": "H100"} | extra))
    return SkyPilotBackend().plan(spec, Settings(home=tmp_path / "state"))


def request_for(key: str = "key-1") -> SubmitRequest:
    return SubmitRequest(key=key, spec={}, timeout_s=3600)


# ---- submit ---------------------------------------------------------------------------------------------------------
def test_submit_returns_the_request_id_at_once_and_status_resolves_it_later(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path)
    plan = planned(tmp_path).bind(tmp_path / "job")
    fake_sky.hold_launch = True  # the API server still works on the launch: submit must not wait for it
    started = time.monotonic()
    handle = backend.submit(plan, request_for())
    assert time.monotonic() - started < 1.0
    assert handle.native_id.startswith("request:req-") and handle.job_dir == str(tmp_path / "job")
    rid = handle.native_id.split(":", 1)[1]
    assert fake_sky.calls_named("get") == []  # nothing waited on the API server
    (launch,) = fake_sky.calls_named("jobs.launch")
    assert launch[1] == {"name": job_name_for("key-1")} and launch[0][0].text == plan.rendered
    assert (tmp_path / "job" / TASK_FILE).read_text() == plan.rendered
    record = json.loads((tmp_path / "job" / SUBMIT_RECORD).read_text())
    assert record["request_id"] == rid and record["job_name"] == job_name_for("key-1") and record["job_id"] is None

    waiting = backend.status(handle)
    assert waiting.state is JobState.QUEUED and waiting.native_state == "request RUNNING"
    assert "handling the launch request" in (waiting.reason or "")
    assert fake_sky.calls_named("get") == []

    fake_sky.finish_launch(rid)
    pending = backend.status(handle)
    assert pending.state is JobState.QUEUED and pending.native_state == "PENDING"
    job_id = json.loads((tmp_path / "job" / SUBMIT_RECORD).read_text())["job_id"]
    assert isinstance(job_id, int)
    fake_sky.script(job_id, ManagedJobStatus.STARTING, ManagedJobStatus.RUNNING, ManagedJobStatus.SUCCEEDED)
    assert [backend.status(handle).state for _ in range(3)] == [JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED]
    (_, queue_kwargs) = fake_sky.calls_named("jobs.queue_v2")[-1]
    assert queue_kwargs["job_ids"] == [job_id] and queue_kwargs["refresh"] is False
    # A new backend (a restarted follower) finds the job id in the record: no launch request asked again.
    before = len(fake_sky.calls_named("api_status"))
    fresh = quick_backend(tmp_path)
    assert fresh.status(handle).state is JobState.SUCCEEDED
    assert all(rid not in str(args) for args, _ in fake_sky.calls_named("api_status")[before:])


def test_submit_is_idempotent_by_key_and_folder(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path)
    plan = planned(tmp_path).bind(tmp_path / "job")
    first = backend.submit(plan, request_for())
    second = quick_backend(tmp_path).submit(plan, request_for())
    assert first == second and len(fake_sky.calls_named("jobs.launch")) == 1
    unbound = quick_backend(tmp_path).submit(planned(tmp_path), request_for("key-2"))
    assert unbound.job_dir == str(tmp_path / "jobs" / job_name_for("key-2"))


def test_a_refused_task_launches_nothing_and_can_be_retried(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path)
    plan = planned(tmp_path).bind(tmp_path / "job")
    fake_sky.launch_error = ValueError("Invalid accelerator 'H1OO'.\ndetails")
    with pytest.raises(
        RuntimeError, match=r"SkyPilot refused the job: Invalid accelerator 'H1OO'\.; nothing was launched"
    ):
        backend.submit(plan, request_for())
    assert not (tmp_path / "job" / SUBMIT_RECORD).exists()
    fake_sky.launch_error = None
    assert backend.submit(plan, request_for()).native_id.startswith("request:")
    assert len(fake_sky.calls_named("jobs.launch")) == 2


def test_an_api_server_that_does_not_answer_launches_nothing(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path)
    plan = planned(tmp_path).bind(tmp_path / "job")
    fake_sky.launch_error = ApiServerConnectionError("http://127.0.0.1:46580")
    with pytest.raises(
        SkyPilotUnavailableError, match=r"cannot reach the SkyPilot API server at .*nothing was launched"
    ):
        backend.submit(plan, request_for())
    assert not (tmp_path / "job" / SUBMIT_RECORD).exists()


def test_a_launch_whose_answer_was_lost_is_looked_up_by_name_never_launched_again(
    fake_sky: FakeSky, tmp_path: Path
) -> None:
    backend = quick_backend(tmp_path, lost_after_s=0.5)
    plan = planned(tmp_path).bind(tmp_path / "job")
    fake_sky.launch_error = ConnectionResetError("Connection reset by peer")  # the request may have left
    handle = backend.submit(plan, request_for())
    name = job_name_for("key-1")
    assert handle.native_id == f"name:{name}"
    assert json.loads((tmp_path / "job" / SUBMIT_RECORD).read_text())["state"] == "uncertain"
    again = quick_backend(tmp_path).submit(plan, request_for())
    assert again == handle and len(fake_sky.calls_named("jobs.launch")) == 1
    looking = backend.status(handle)
    assert looking.state is JobState.QUEUED and f"looking for a managed job named {name}" in (looking.reason or "")
    job_id = fake_sky.add_job(name, ManagedJobStatus.RUNNING)
    found = backend.status(handle)
    assert found.state is JobState.RUNNING
    assert json.loads((tmp_path / "job" / SUBMIT_RECORD).read_text())["job_id"] == job_id
    # Never found: LOST once lost_after_s passed.
    other = quick_backend(tmp_path, lost_after_s=0.2)
    lost_handle = other.submit(plan.bind(tmp_path / "job2"), request_for("key-3"))
    time.sleep(0.3)
    lost = other.status(lost_handle)
    assert lost.state is JobState.LOST and "most likely never reached SkyPilot" in (lost.reason or "")


def test_a_failed_or_cancelled_launch_request_ends_the_job(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path)
    fake_sky.hold_launch = True
    handle = backend.submit(planned(tmp_path).bind(tmp_path / "a"), request_for("a"))
    fake_sky.finish_launch(handle.native_id.split(":", 1)[1], "FAILED", RuntimeError("No enabled cloud has H100."))
    failed = backend.status(handle)
    assert failed.state is JobState.FAILED and failed.native_state == "request FAILED"
    assert "SkyPilot did not launch the managed job: RuntimeError: No enabled cloud has H100." == failed.reason
    other = backend.submit(planned(tmp_path).bind(tmp_path / "b"), request_for("b"))
    fake_sky.finish_launch(other.native_id.split(":", 1)[1], "CANCELLED")
    assert backend.status(other).state is JobState.CANCELLED


def test_a_request_the_api_server_forgot_is_lost(fake_sky: FakeSky, tmp_path: Path) -> None:
    handle = BackendHandle(backend="skypilot", key="k", native_id="request:req-gone", job_dir=str(tmp_path / "j"))
    lost = quick_backend(tmp_path).status(handle)
    assert lost.state is JobState.LOST and "knows neither the launch request req-gone" in (lost.reason or "")
    job_id = fake_sky.add_job(job_name_for("k"), ManagedJobStatus.RUNNING)  # ...unless its job is there by name
    assert quick_backend(tmp_path).status(handle).state is JobState.RUNNING
    assert job_id in fake_sky.jobs


def test_an_unreachable_api_server_is_an_error_the_follower_rides_out(fake_sky: FakeSky, tmp_path: Path) -> None:
    job_id = fake_sky.add_job("llm-x", ManagedJobStatus.RUNNING)
    handle = BackendHandle(backend="skypilot", key="x", native_id=f"job:{job_id}")
    fake_sky.unreachable = ConnectionRefusedError("[Errno 111] Connection refused")
    with pytest.raises(SkyPilotUnavailableError, match="cannot reach the SkyPilot API server"):
        quick_backend(tmp_path).status(handle)
    fake_sky.unreachable = None
    fake_sky.hold_queue = True  # the queue request never finishes: bounded, never a blocking sky.get
    started = time.monotonic()
    with pytest.raises(SkyPilotUnavailableError, match=r"did not finish the jobs\.queue request"):
        quick_backend(tmp_path, request_timeout_s=0.3).status(handle)
    assert time.monotonic() - started < 3


def test_the_queue_without_queue_v2_reads_dict_records(
    fake_sky: FakeSky, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = fake_sky.add_job("llm-x", ManagedJobStatus.FAILED_NO_RESOURCE, failure_reason="no H100 in us-east-1")
    monkeypatch.delattr(FakeSky.Jobs, "queue_v2")  # an SDK older than queue_v2
    got = quick_backend(tmp_path).status(BackendHandle(backend="skypilot", key="x", native_id=f"job:{job_id}"))
    assert got.state is JobState.FAILED and "no H100 in us-east-1" in (got.reason or "")
    assert fake_sky.calls_named("jobs.queue") and not fake_sky.calls_named("jobs.queue_v2")


# ---- cancel ---------------------------------------------------------------------------------------------------------
def test_cancel_a_running_job(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path)
    handle = backend.submit(planned(tmp_path).bind(tmp_path / "job"), request_for())
    job_id = fake_sky.jobs[max(fake_sky.jobs)]
    fake_sky.script(max(fake_sky.jobs), ManagedJobStatus.RUNNING)
    assert backend.status(handle).state is JobState.RUNNING
    assert backend.cancel(handle) is JobState.CANCELLED
    assert fake_sky.calls_named("jobs.cancel") == [((), {"job_ids": [max(fake_sky.jobs)]})]
    assert (tmp_path / "job" / CANCEL_RECORD).is_file() and job_id["script"] == [ManagedJobStatus.CANCELLED]
    assert backend.cancel(handle) is JobState.CANCELLED  # idempotent: nothing sent again
    assert len(fake_sky.calls_named("jobs.cancel")) == 1


def test_cancelling_shows_as_running_until_the_cluster_is_down(fake_sky: FakeSky, tmp_path: Path) -> None:
    job_id = fake_sky.add_job("llm-x", ManagedJobStatus.CANCELLING)
    got = quick_backend(tmp_path).status(BackendHandle(backend="skypilot", key="x", native_id=f"job:{job_id}"))
    assert got.state is JobState.RUNNING and "tearing its cluster down" in (got.reason or "")


def test_cancel_a_launch_still_in_flight(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path)
    fake_sky.hold_launch = True
    handle = backend.submit(planned(tmp_path).bind(tmp_path / "job"), request_for())
    assert backend.cancel(handle) is JobState.CANCELLED
    rid = handle.native_id.split(":", 1)[1]
    assert fake_sky.calls_named("api_cancel") == [(([rid],), {})] and fake_sky.calls_named("jobs.cancel") == []


def test_a_launch_that_got_through_the_cancel_is_cancelled_too(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path)
    fake_sky.hold_launch = True
    fake_sky.launch_gets_through = True
    handle = backend.submit(planned(tmp_path).bind(tmp_path / "job"), request_for())
    rid = handle.native_id.split(":", 1)[1]
    releaser = threading.Timer(0.2, lambda: fake_sky.finish_launch(rid))
    releaser.start()
    try:
        assert backend.cancel(handle) is JobState.CANCELLED
    finally:
        releaser.join()
    assert len(fake_sky.calls_named("jobs.cancel")) == 1


def test_a_job_found_after_its_submission_was_cancelled_is_cancelled(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path, lost_after_s=60)
    fake_sky.launch_error = ConnectionResetError("reset")
    handle = backend.submit(planned(tmp_path).bind(tmp_path / "job"), request_for())
    assert backend.cancel(handle) is JobState.QUEUED  # nothing to cancel yet; the record stays
    fake_sky.add_job(job_name_for("key-1"), ManagedJobStatus.STARTING)
    assert backend.status(handle).state is JobState.STARTING
    assert len(fake_sky.calls_named("jobs.cancel")) == 1
    assert [backend.status(handle).state for _ in range(2)] == [JobState.RUNNING, JobState.CANCELLED]  # CANCELLING
    assert len(fake_sky.calls_named("jobs.cancel")) == 1


def test_cancel_of_an_ended_job_changes_nothing(fake_sky: FakeSky, tmp_path: Path) -> None:
    job_id = fake_sky.add_job("llm-x", ManagedJobStatus.SUCCEEDED)
    handle = BackendHandle(backend="skypilot", key="x", native_id=f"job:{job_id}", job_dir=str(tmp_path / "j"))
    assert quick_backend(tmp_path).cancel(handle) is JobState.SUCCEEDED
    assert fake_sky.calls_named("jobs.cancel") == []


# ---- logs -----------------------------------------------------------------------------------------------------------
def test_logs_are_copied_into_the_job_folder(fake_sky: FakeSky, tmp_path: Path) -> None:
    backend = quick_backend(tmp_path)
    handle = backend.submit(planned(tmp_path).bind(tmp_path / "job"), request_for())
    job_id = max(fake_sky.jobs)
    fake_sky.script(job_id, ManagedJobStatus.STARTING)
    backend.status(handle)
    assert fake_sky.calls_named("jobs.tail_logs") == []  # a job not running yet: its log would block
    fake_sky.script(job_id, ManagedJobStatus.RUNNING)
    backend.status(handle)
    copied = tmp_path / "job" / "logs" / "skypilot.log"
    wait_until(copied.is_file, 5, f"{copied} appears")
    assert copied.read_text() == fake_sky.job_log
    (_, kwargs) = fake_sky.calls_named("jobs.tail_logs")[0]
    assert kwargs == {"job_id": job_id, "follow": False, "controller": False}
    fake_sky.job_log += "(head, rank=0, pid=1) done\n"
    fake_sky.script(job_id, ManagedJobStatus.SUCCEEDED)
    assert backend.status(handle).state is JobState.SUCCEEDED
    assert (tmp_path / "job" / "logs" / "skypilot.log").read_text() == fake_sky.job_log  # the final copy
    assert (tmp_path / "job" / "logs" / "controller.log").read_text() == fake_sky.controller_log
    assert JobFiles(tmp_path / "job").processes() == ["controller", "skypilot"]  # what read_job_logs offers


def test_logs_are_capped(fake_sky: FakeSky, tmp_path: Path) -> None:
    fake_sky.job_log = "".join(f"line {i:04d}\n" for i in range(1000))
    job_id = fake_sky.add_job("llm-x", ManagedJobStatus.FAILED)
    handle = BackendHandle(backend="skypilot", key="x", native_id=f"job:{job_id}", job_dir=str(tmp_path / "j"))
    quick_backend(tmp_path, log_cap_bytes=1000).status(handle)
    text = (tmp_path / "j" / "logs" / "skypilot.log").read_text()
    assert text.startswith("line 0000\n") and text.endswith("log cut here at 1000 bytes -----\n")
    assert len(text.encode()) < 1100


# ---- the follower ---------------------------------------------------------------------------------------------------
class Progress:
    def __init__(self) -> None:
        self.messages: list[str] = []
        self.states: list[str] = []  # what the follower reports as the job's state (engine_state.py)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self.messages.append(message or "")

    def report_state(self, state: str, reason: str | None = None, started_at: float | None = None) -> None:
        self.states.append(state)


def test_the_follower_follows_a_preempted_job_to_its_end(fake_sky: FakeSky, tmp_path: Path) -> None:
    import dataclasses

    from servers.engines import registry
    from servers.engines.follow import follow

    backend = quick_backend(tmp_path)
    quick = dataclasses.replace(registry.get("skypilot"), poll_s=0.05)
    fake_sky.hold_launch = True
    handle = backend.submit(planned(tmp_path).bind(tmp_path / "job"), request_for())
    rid = handle.native_id.split(":", 1)[1]
    fake_sky.pending_job = (
        fake_sky.pending_job[0],
        fake_sky.pending_job[1],
        [
            ManagedJobStatus.PENDING,
            ManagedJobStatus.STARTING,
            ManagedJobStatus.RUNNING,
            ManagedJobStatus.RECOVERING,
            ManagedJobStatus.RUNNING,
            ManagedJobStatus.SUCCEEDED,
        ],
    )
    releaser = threading.Timer(0.3, lambda: fake_sky.finish_launch(rid))
    releaser.start()
    ctx = Progress()
    status = follow(backend, handle, ctx, threading.Event(), info=quick)  # type: ignore[arg-type]
    assert status.state is JobState.SUCCEEDED
    said = [m.split(":")[0] for m in ctx.messages]
    assert said == [
        "skypilot request RUNNING",
        "skypilot PENDING",
        "skypilot STARTING",
        "skypilot RUNNING",
        "skypilot RECOVERING",
        "skypilot RUNNING",
    ]
    # The job's own state is the managed job's: queued, placed, running, and placed again while it recovers.
    assert ctx.states == ["QUEUED", "QUEUED", "STARTING", "RUNNING", "STARTING", "RUNNING"], ctx.states
    assert (tmp_path / "job" / "logs" / "skypilot.log").is_file()


# ---- available ------------------------------------------------------------------------------------------------------
@pytest.fixture
def bare_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("SKYPILOT_API_SERVER_ENDPOINT", "SKYPILOT_CONFIG", "SKYPILOT_API_SERVER_LOCAL_PORT", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    for _, _, variables in skypilot.CREDENTIALS:
        for name in variables:
            monkeypatch.delenv(name, raising=False)
    return home


def test_available_says_what_is_missing(monkeypatch: pytest.MonkeyPatch, bare_home: Path) -> None:
    backend = SkyPilotBackend()
    monkeypatch.setattr(skypilot, "skypilot_version", lambda: None)
    assert backend.available() == (False, skypilot._missing())
    monkeypatch.setattr(skypilot, "skypilot_version", lambda: "0.14.1")
    found, detail = backend.available()
    assert not found and "no API server is configured" in detail and "no cloud credentials were found" in detail
    (bare_home / ".kube").mkdir()
    (bare_home / ".kube" / "config").write_text("apiVersion: v1\n")
    found, detail = backend.available()
    assert found and "local API server http://127.0.0.1:46580" in detail and "kubernetes" in detail
    config = bare_home / ".sky" / "config.yaml"
    config.parent.mkdir()
    config.write_text("api_server:\n  endpoint: https://alice:s3cret@sky.example.com/\n")
    found, detail = backend.available()
    assert found and "API server https://alice:***@sky.example.com (from api_server.endpoint in" in detail
    assert "s3cret" not in detail
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", "http://10.0.0.5:46580")
    assert "API server http://10.0.0.5:46580 (from SKYPILOT_API_SERVER_ENDPOINT" in backend.available()[1]


def test_import_sky_sends_its_logs_to_stderr(fake_sky: FakeSky) -> None:
    logger = logging.getLogger("sky")
    handler = logging.StreamHandler(sys.stdout)
    logger.addHandler(handler)
    try:
        skypilot.import_sky()
        assert handler.stream is sys.stderr
    finally:
        logger.removeHandler(handler)


# ---- the run commands, run for real ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lay_out_node(task: dict[str, Any], home: Path) -> None:
    """What SkyPilot does on a node before `run`: file_mounts copied to their destinations (~ is the node's home);
    the workdir copied to ~/sky_workdir."""
    for target, source in (task.get("file_mounts") or {}).items():
        destination = home / target[2:] if target.startswith("~/") else Path(target)
        destination.parent.mkdir(parents=True, exist_ok=True)
        if Path(source).is_dir():
            shutil.copytree(source, destination, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, destination)
    if task.get("workdir"):
        shutil.copytree(task["workdir"], home / "sky_workdir", dirs_exist_ok=True)


def node_env(task: dict[str, Any], home: Path, bin_dir: Path, rank: int, nodes: int) -> dict[str, str]:
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "SKYPILOT_NUM_NODES": str(nodes),
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * nodes),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
    }
    return env | dict(task.get("envs") or {})


@pytest.fixture
def python_on_path(tmp_path: Path) -> Path:
    """A bin folder whose `python` is this interpreter (with torch), as the nodes' image would provide."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def run_nodes(task: dict[str, Any], home: Path, bin_dir: Path, nodes: int, timeout_s: float) -> list[Any]:
    script = task["run"].replace(f"--master_port {MASTER_PORT}", f"--master_port {free_port()}")
    cwd = home / "sky_workdir" if task.get("workdir") else home
    procs = [
        subprocess.Popen(
            ["bash", "-c", script],
            cwd=cwd,
            env=node_env(task, home, bin_dir, rank, nodes),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(nodes)
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout_s)
        results.append((proc.returncode, out))
    return results


@pytest.mark.timeout(240)
def test_the_run_commands_train_the_recipe_on_two_nodes(tmp_path: Path, python_on_path: Path) -> None:
    plan = SkyPilotBackend().plan(
        base_spec(TINY_GPT, recipe="tiny-gpt", nnodes=2, args=["--steps", "20", "--log-every", "5"], max_wall_s=200.0),
        Settings(home=tmp_path / "state"),
    )
    task = yaml.safe_load(plan.rendered or "")
    home = tmp_path / "node-home"
    home.mkdir()
    lay_out_node(task, home)
    results = run_nodes(task, home, python_on_path, 2, 200)
    assert [code for code, _ in results] == [0, 0], results
    rows = [json.loads(line) for line in (home / "llm-infra-mcp" / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("split") == "train"]
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    assert all(r["tokens"] == r["step"] * 16 * 64 * 2 for r in train)  # two ranks, one per node
    assert list((home / "llm-infra-mcp" / "run" / "checkpoints").glob("step_*.pt"))


@pytest.mark.timeout(120)
def test_the_run_commands_pass_every_argument_literally(tmp_path: Path, python_on_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ECHO_ARGS, project / "echo_args.py")
    plan = SkyPilotBackend().plan(
        base_spec(
            project / "echo_args.py", args=HOSTILE_ARGS, workdir=str(project), env={"JOB_ECHO_ARGS_OUT": "args.json"}
        ),
        Settings(home=tmp_path / "state", allowed_roots=[tmp_path]),
    )
    task = yaml.safe_load(plan.rendered or "")
    home = tmp_path / "node-home"
    home.mkdir()
    lay_out_node(task, home)
    [(code, out)] = run_nodes(task, home, python_on_path, 1, 100)
    assert code == 0, out
    assert json.loads((home / "sky_workdir" / "args.json").read_text()) == HOSTILE_ARGS
    assert not list(home.rglob("PWNED*")) and not list(tmp_path.rglob("PWNED*"))


@pytest.mark.timeout(120)
def test_the_run_commands_end_at_max_wall_s(tmp_path: Path, python_on_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n")
    plan = SkyPilotBackend().plan(base_spec(script, max_wall_s=2.0), Settings(home=tmp_path / "state"))
    task = yaml.safe_load(plan.rendered or "")
    home = tmp_path / "node-home"
    home.mkdir()
    lay_out_node(task, home)
    started = time.monotonic()
    [(code, out)] = run_nodes(task, home, python_on_path, 1, 100)
    assert code == 124, out  # timeout's exit: SkyPilot marks the job FAILED
    assert time.monotonic() - started < 60


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_golden()
    else:
        print("usage: python -m tests.test_skypilot_backend --write  (regenerates tests/fixtures/skypilot/*.yaml)")
        sys.exit(2)


# ---- through the tools -----------------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_the_tools_plan_a_skypilot_job_and_list_the_backend(tmp_path: Path) -> None:
    from mcp import Client

    from servers.core.mcp_layer import App
    from tests.conftest import CHILD_ENV
    from tests.helpers import call_error, call_ok, create_test_suite

    app = App(Settings(home=tmp_path / "state", allowed_roots=[tmp_path]), owner="test", child_env=CHILD_ENV)
    async with Client(create_test_suite(app), mode="legacy") as client:
        backends = {b["name"]: b for b in (await call_ok(client, "list_backends", {}))["backends"]}
        sky_status = backends["skypilot"]
        installed = skypilot.skypilot_version()
        if installed is None:
            assert not sky_status["detected"] and "not installed" in sky_status["detail"]
        else:  # installed, with no API server or cloud credentials here: says which is missing
            assert installed in sky_status["detail"]
        assert sky_status["launch_supported"] is sky_status["detected"]
        assert sky_status["launch_supported"] or sky_status["launch_note"]
        spec = {
            "recipe": "tiny-gpt",
            "backend": "skypilot",
            "nnodes": 2,
            "nproc_per_node": 8,
            "gpus_per_node": 8,
            "options": {"accelerator": "H100", "use_spot": True, "pip_packages": ["torch==2.5.1"]},
            "max_wall_s": 1800,
        }
        plan = await call_ok(client, "plan_training_job", {"spec": spec})
        task = yaml.safe_load(plan["rendered"])
        assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H100:8"
        assert task["resources"]["use_spot"] is True and "torch==2.5.1" in task["setup"]
        assert plan["estimated_gpu_hours"] == pytest.approx(2 * 8 * 1800 / 3600)
        refused = await call_error(
            client, "plan_training_job", {"spec": {"recipe": "tiny-gpt", "options": {"accelerator": "H100"}}}
        )
        assert "accelerator: a skypilot option, not a local one; accepted for local: share_gpus" in refused
