"""The SkyPilot backend: a training job as a SkyPilot managed job (``sky jobs launch``), so that SkyPilot's jobs
controller relaunches it after a preemption, on any cloud or Kubernetes cluster SkyPilot reaches.

SkyPilot is an optional extra (``pip install 'llm-infra-mcp[skypilot]'``, about 430 MB with its dependencies) and
is imported only when a plan is validated or a job is submitted, followed, cancelled or read, never at start-up.
Its client talks to a SkyPilot API server (a remote one from ``SKYPILOT_API_SERVER_ENDPOINT`` or
``api_server.endpoint`` in ~/.sky/config.yaml, else a local one that SkyPilot starts on 127.0.0.1:46580 on first
use); every call (``sky.jobs.launch``, ``sky.jobs.queue_v2``, ``sky.jobs.cancel``...) returns a request id at once,
and the result is fetched with ``sky.get`` once the API server says the request finished (``sky.api_status``).
The five steps of the `Backend` protocol (servers/engines/backend.py):

- ``plan(spec, settings)``: no side effects (validating with SkyPilot imports it, which creates ~/.sky as every
  SkyPilot command does). `rendered` is the task YAML: name, num_nodes, resources (accelerators "H100:8" from the
  spec's ``accelerator`` and ``gpus_per_node``; optional infra, use_spot, job_recovery, image_id), envs,
  workdir/file_mounts carrying the recipe or script, setup (pip packages, optional) and run: torchrun on every
  node with ``--nnodes $SKYPILOT_NUM_NODES --node_rank $SKYPILOT_NODE_RANK --master_addr`` (the first line of
  ``$SKYPILOT_NODE_IPS``) and ``--nproc_per_node``, every argument shell-quoted, under ``timeout`` for
  ``max_wall_s``. It is validated with ``sky.Task.from_yaml_str`` when SkyPilot is installed (its schema: unknown
  fields, num_nodes 0, bad names); otherwise structurally here, and the notes say so. Neither checks GPU names or
  the infra (that needs SkyPilot's catalog, which its API server has: the launch checks them).
- ``submit(plan, request)``: ``sky.jobs.launch(task, name=job_name_for(key))``; it returns once the API server has
  the request (first its client's health check, which starts a local API server if that is the one configured and
  it is down, the server's validation of the task, and the upload of its local files), without waiting for the
  job or the request's result: the handle's native_id is
  ``request:<request id>``. The job folder keeps the exact YAML submitted (skypilot-task.yaml) and the submit
  record (skypilot-submit.json: key, job name, request id, later the managed job id). Idempotent: a second submit
  with the same key and folder finds the record and launches nothing. A launch whose outcome is unknown (the
  connection broke after the request may have left, or the process died before recording the request id) is
  never launched again on its own: its handle is ``name:<job name>`` and status looks the job up by name.
- ``status``: the launch request first (PENDING/RUNNING: QUEUED; FAILED: FAILED with SkyPilot's error;
  CANCELLED), then the managed job (``sky.jobs.queue_v2(job_ids=[id])``) mapped with `MANAGED_JOB_STATES`: every
  ManagedJobStatus of SkyPilot 0.14 (PENDING, STARTING, RUNNING, RECOVERING, CANCELLING, SUCCEEDED, CANCELLED,
  FAILED, FAILED_SETUP, FAILED_PRECHECKS, FAILED_NO_RESOURCE, FAILED_CONTROLLER, and WINDING_DOWN, SUBMITTED); any
  other name is LOST. Reasons carry SkyPilot's failure_reason; restarts its recovery_count. These calls wait on
  the API server (bounded by ``request_timeout_s``): status is called by the job's follower process
  (servers/engines/follow.py), never inside a tool call. While the job runs, status also copies SkyPilot's job log
  into the job folder (logs/skypilot.log, every ``log_sync_s`` in a background thread, once more at the end, with
  the jobs controller's log as logs/controller.log), where read_job_logs serves it.
- ``cancel``: ``sky.jobs.cancel(job_ids=[id])``, or ``sky.api_cancel`` of a launch request still in flight (and
  the job cancelled if the launch got through anyway); idempotent; recorded in the job folder, so a job found
  later for a cancelled submission is cancelled too.

Plain module: no MCP; pydantic, PyYAML and the standard library at import.
"""

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import io
import math
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field

from servers.core.jobfiles import atomic_write_json, read_json
from servers.core.jobstore import JobState
from servers.core.paths import resolve_inside_roots
from servers.core.settings import Settings
from servers.engines.backend import (
    GPUS_PLACEHOLDER,
    JOB_DIR_PLACEHOLDER,
    BackendHandle,
    BackendPlan,
    EngineStatus,
    SubmitRequest,
    map_state,
)
from servers.launch.options import Options, given_options
from servers.launch.torchrun import CHECKPOINT_ENV, MAX_NPROC, METRICS_ENV

BACKEND_NAME = "skypilot"
DISTRIBUTIONS = ("skypilot", "skypilot-nightly")
TASK_FILE = "skypilot-task.yaml"
SUBMIT_RECORD = "skypilot-submit.json"
CANCEL_RECORD = "skypilot-cancel.json"
JOB_LOG = "skypilot"  # logs/skypilot.log: SkyPilot's log of the job (every node's output, prefixed by node)
CONTROLLER_LOG = "controller"  # logs/controller.log: the jobs controller's log of it (provisioning, recoveries)
LOG_PROCESSES = (CONTROLLER_LOG, JOB_LOG)
JOB_NAME_PREFIX = "llm"
NAME_LATER = "(set at submit from the idempotency key)"

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
LAUNCH_DIR = Path(__file__).resolve().parent
RECIPES_DIR = LAUNCH_DIR / "recipes"
METRICS_FILE = LAUNCH_DIR / "metrics.py"
# Where the files travel on every node: home-relative, so no node needs root. The recipes load their siblings and
# ../metrics.py by path, so the layout of servers/launch is kept.
REMOTE_LAUNCH = "~/llm-infra-mcp/launch"
REMOTE_SCRIPTS = "~/llm-infra-mcp/script"
REMOTE_RUN_DIR = "$HOME/llm-infra-mcp/run"  # in the run script (a shell), where metrics and checkpoints go
SKY_WORKDIR = "~/sky_workdir"  # where SkyPilot puts the workdir and runs the commands from
MASTER_PORT = 29500
KILL_AFTER_S = 30

# ---- states ---------------------------------------------------------------------------------------------------------
# ManagedJobStatus (sky/jobs/state.py, SkyPilot 0.14.1) onto the job engine's states. A job being recovered after a
# preemption is STARTING again (its cluster is relaunched); CANCELLING still holds its cluster, so it is not ended.
MANAGED_JOB_STATES: dict[str, JobState] = {
    "PENDING": JobState.QUEUED,
    "SUBMITTED": JobState.QUEUED,  # DEPRECATED_SUBMITTED: only in old controllers' databases
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

STATE_WORDS: dict[str, str] = {
    "PENDING": "waiting for a slot on the jobs controller (SkyPilot starts the controller first if it is down)",
    "SUBMITTED": "submitted to the jobs controller",
    "STARTING": "the jobs controller is provisioning the job's cluster (finding capacity, booting the nodes, "
    "running setup)",
    "RUNNING": "running on its cluster",
    "WINDING_DOWN": "the work is done; the controller is collecting the last of it",
    "RECOVERING": "its cluster was preempted or failed: the jobs controller is relaunching it (recovery)",
    "CANCELLING": "cancel requested: the jobs controller is tearing its cluster down",
    "SUCCEEDED": "the run command exited 0 on every node",
    "CANCELLED": "cancelled; its cluster has been torn down",
    "FAILED": "the run command failed (non-zero exit on a node)",
    "FAILED_SETUP": "the setup commands failed (or the node failed before the run began, e.g. OOM-killed)",
    "FAILED_PRECHECKS": "SkyPilot found no feasible resources or refused the task in its prechecks (e.g. an unknown "
    "accelerator or infra, no enabled cloud, a bad name)",
    "FAILED_NO_RESOURCE": "no cloud or cluster had the resources (capacity or quota) to launch it",
    "FAILED_CONTROLLER": "the jobs controller itself failed unexpectedly",
}

# A SkyPilot API request (sky/server/requests/requests.py RequestStatus).
REQUEST_ACTIVE = ("PENDING", "WAITING", "RUNNING")
REQUEST_FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")

# ---- validation -----------------------------------------------------------------------------------------------------
# SkyPilot's task name (sky/task.py _VALID_NAME_REGEX).
TASK_NAME_PATTERN = re.compile(r"[a-zA-Z0-9]+(?:[._-]{1,2}[a-zA-Z0-9]+)*")
ACCELERATOR_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
ACCELERATOR_ACCEPTED = "a SkyPilot GPU name such as H100, A100-80GB, L4 (letters, digits, '_', '.', '+', '-')"
INFRA_PATTERN = re.compile(r"[A-Za-z0-9*][A-Za-z0-9_.:@*-]{0,127}(?:/[A-Za-z0-9_.:@*-]{1,127}){0,8}")
INFRA_ACCEPTED = "cloud[/region[/zone]] or k8s[/context], e.g. aws, aws/us-east-1, gcp/*/us-central1-a, k8s/my-ctx"
RECOVERY_STRATEGIES = ("FAILOVER", "EAGER_NEXT_REGION")
IMAGE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,255}")
IMAGE_ACCEPTED = "a container image reference such as pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
PIP_PATTERN = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}(?:\[[A-Za-z0-9._,-]{1,200}\])?"
    r"(?:(?:==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!_-]{1,64}(?:,(?:==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!_-]{1,64}){0,7})?"
)
PIP_ACCEPTED = "PyPI requirement specifiers such as torch==2.5.1 or numpy>=1.26 (no URLs, paths or options)"
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
RESERVED_ENV_PREFIXES = ("SKYPILOT_", "LLM_INFRA_MCP_")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline are fine inside single quotes
MAX_NODES = 64
MAX_PIP_PACKAGES = 32
MAX_RESTARTS_ON_ERRORS = 100
SKY_IMAGE = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$"
SKY_ACCELERATOR = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$"
SKY_INFRA = r"^[A-Za-z0-9*][A-Za-z0-9_.:@*-]{0,127}(/[A-Za-z0-9_.:@*-]{1,127}){0,8}$"
PIP_REQUIREMENT = (
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}(\[[A-Za-z0-9._,-]{1,200}\])?"
    r"((==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!_-]{1,64}(,(==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!_-]{1,64}){0,7})?$"
)


class SkyPilotOptions(Options):
    """The SkyPilot backend's options (a spec's `options`)."""

    image: str | None = Field(default=None, pattern=SKY_IMAGE, description="Docker image; needs torch")
    accelerator: str | None = Field(default=None, pattern=SKY_ACCELERATOR, description="GPU type, e.g. H100")
    infra: str | None = Field(default=None, pattern=SKY_INFRA, description="cloud[/region] or k8s[/context]")
    use_spot: bool = False
    job_recovery: Literal["FAILOVER", "EAGER_NEXT_REGION"] | None = None
    max_restarts_on_errors: int = Field(default=0, ge=0, le=MAX_RESTARTS_ON_ERRORS)
    pip_packages: list[Annotated[str, Field(max_length=300, pattern=PIP_REQUIREMENT)]] = Field(
        default_factory=list, max_length=MAX_PIP_PACKAGES
    )


# Task fields and resources fields this backend renders (the structural check without SkyPilot).
TASK_FIELDS = ("name", "num_nodes", "resources", "envs", "workdir", "file_mounts", "setup", "run")
RESOURCES_FIELDS = ("infra", "accelerators", "use_spot", "job_recovery", "image_id")

# ---- the follower's pace --------------------------------------------------------------------------------------------
REQUEST_TIMEOUT_S = 60.0
CANCEL_WAIT_S = 30.0
LOG_SYNC_S = 30.0
LOST_AFTER_S = 900.0  # an uncertain launch not found by its name after this long is LOST
DEFAULT_LOG_CAP = 64 * 1024 * 1024
_REASON_CHARS = 2000
QUEUE_FIELDS = (
    "job_id",
    "task_id",
    "job_name",
    "task_name",
    "status",
    "schedule_state",
    "submitted_at",
    "start_at",
    "end_at",
    "recovery_count",
    "failure_reason",
    "details",
    "resources",
    "infra",
)

CREDENTIALS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # (what, files under ~ any of which counts, environment variables any of which counts)
    ("aws", ("~/.aws/credentials", "~/.aws/config"), ("AWS_ACCESS_KEY_ID",)),
    (
        "gcp",
        ("~/.config/gcloud/credentials.db", "~/.config/gcloud/application_default_credentials.json"),
        ("GOOGLE_APPLICATION_CREDENTIALS",),
    ),
    ("azure", ("~/.azure/msal_token_cache.json", "~/.azure/azureProfile.json"), ()),
    ("kubernetes", ("~/.kube/config",), ("KUBECONFIG",)),
    ("lambda", ("~/.lambda_cloud/lambda_keys",), ()),
    ("runpod", ("~/.runpod/config.toml",), ()),
    ("nebius", ("~/.nebius/credentials.json",), ()),
    ("oci", ("~/.oci/config",), ()),
    ("paperspace", ("~/.paperspace/config.json",), ()),
    ("fluidstack", ("~/.fluidstack/api_key",), ()),
    ("vast", ("~/.config/vastai/vast_api_key",), ()),
    ("ssh node pools", ("~/.sky/ssh_node_pools.yaml",), ()),
    ("slurm", ("~/.slurm/config",), ()),
)
ENDPOINT_ENV = "SKYPILOT_API_SERVER_ENDPOINT"
CONFIG_ENV = "SKYPILOT_CONFIG"
DEFAULT_CONFIG = "~/.sky/config.yaml"
DEFAULT_ENDPOINT = "http://127.0.0.1:46580"


class SkyPilotUnavailableError(RuntimeError):
    """SkyPilot cannot be used: it is not installed, or its API server does not answer in time. The message says
    what was tried and what to do."""


# ---- names ----------------------------------------------------------------------------------------------------------
def _slug(text: str, limit: int) -> str:
    """Letters and digits of `text` joined by single '-', at most `limit` characters (SkyPilot's name pattern)."""
    words = re.findall(r"[A-Za-z0-9]+", text)
    out = ""
    for word in words:
        piece = word if not out else f"-{word}"
        if len(out) + len(piece) > limit:
            room = limit - len(out) - (1 if out else 0)
            if room > 0:
                out += ("-" if out else "") + word[:room]
            break
        out += piece
    return out


def job_name_for(key: str) -> str:
    """The managed job's name for an idempotency key: deterministic (status looks the job up by it), readable,
    and valid as a SkyPilot name (its clusters are named after it)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    readable = _slug(key, 36)
    return f"{JOB_NAME_PREFIX}-{readable}-{digest}" if readable else f"{JOB_NAME_PREFIX}-{digest}"


def task_name_for(spec: Mapping[str, Any]) -> str:
    """The task's name in the YAML: the spec's name, else the recipe's, else the script's stem."""
    for value in (spec.get("name"), spec.get("recipe"), Path(str(spec.get("script") or "train")).stem):
        slug = _slug(str(value or ""), 63)
        if slug:
            return slug
    return "train"


def _first_line(text: Any, limit: int = 300) -> str:
    value = str(text or "").strip()
    line = value.splitlines()[0] if value else ""
    return line[:limit]


def _remote_path(path: str) -> str:
    """A node path ('~/...' or relative) as a shell word: '~/' becomes "$HOME"/ and the rest is quoted."""
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


# ---- the task YAML --------------------------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (run, setup), so the rendered task reads like a hand-written one."""


# What YAML reads as a line break besides \n (NEL U+0085, LS U+2028, PS U+2029) and the other characters PyYAML's
# emitter may write raw (C0 and C1 controls, DEL, BOM, surrogates, non-characters): a string holding one is written
# double-quoted, where each is an escape (\N, \L, \P, \x..), so that yaml.safe_load gives back exactly the string.
YAML_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff\ufffe\uffff]")


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = '"' if YAML_UNSAFE.search(data) else "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)

YAML_HEADER = "# SkyPilot task rendered by llm-infra-mcp (servers/launch/skypilot.py); launched as a managed job\n"


def render_yaml(task: Mapping[str, Any]) -> str:
    body = yaml.dump(dict(task), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=4096)
    return YAML_HEADER + body


def run_script(
    *,
    script: str,
    args: Sequence[str],
    nproc_per_node: int,
    max_restarts: int,
    max_wall_s: float | None,
    in_workdir: bool,
) -> str:
    """The run commands every node executes (SkyPilot runs them with bash): torchrun with the node's rank and the
    rank-0 node's address from SkyPilot's variables; `script` is a node path (see `_remote_path`)."""
    lines = [
        "# Every node runs this; SkyPilot sets SKYPILOT_NUM_NODES, SKYPILOT_NODE_RANK and SKYPILOT_NODE_IPS",
        "# (one IP a line, the rank-0 node first).",
        "set -eu",
        'MASTER_ADDR="$(printf \'%s\\n\' "$SKYPILOT_NODE_IPS" | head -n1)"',
        f'RUN_DIR="{REMOTE_RUN_DIR}"',
        'mkdir -p "$RUN_DIR/checkpoints"',
        f'export {METRICS_ENV}="$RUN_DIR/metrics.jsonl"',
        f'export {CHECKPOINT_ENV}="$RUN_DIR/checkpoints"',
    ]
    if not in_workdir:
        lines.append('cd "$RUN_DIR"')
    command = ["exec"]
    if max_wall_s is not None:
        command += ["timeout", "--signal=TERM", f"--kill-after={KILL_AFTER_S}", str(math.ceil(max_wall_s))]
    command += ["python", "-m", "torch.distributed.run"]
    body = [
        " ".join(command),
        '--nnodes "$SKYPILOT_NUM_NODES"',
        '--node_rank "$SKYPILOT_NODE_RANK"',
        f"--nproc_per_node {nproc_per_node}",
        '--master_addr "$MASTER_ADDR"',
        f"--master_port {MASTER_PORT}",
        f"--max_restarts {max_restarts}",
        " ".join([_remote_path(script), *(shlex.quote(a) for a in args)]),
    ]
    lines.append(" \\\n  ".join(body))
    return "\n".join(lines) + "\n"


def setup_script(packages: Sequence[str]) -> str:
    quoted = " ".join(shlex.quote(p) for p in packages)
    return f"set -eu\npython -m pip install --quiet {quoted}\n"


def check_structure(task: Mapping[str, Any]) -> list[str]:
    """Problems with a task mapping, checked here as SkyPilot's schema would (for when SkyPilot is not installed):
    the fields this backend renders and their types. Empty when it is well-formed."""
    problems: list[str] = []
    unknown = sorted(set(task) - set(TASK_FIELDS))
    if unknown:
        problems.append(f"task: unknown field(s) {', '.join(unknown)}")
    name = task.get("name")
    if not isinstance(name, str) or not TASK_NAME_PATTERN.fullmatch(name):
        problems.append(f"name: {name!r} is not a SkyPilot task name")
    nodes = task.get("num_nodes")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or not 1 <= nodes <= MAX_NODES:
        problems.append(f"num_nodes: {nodes!r}; accepted: an integer in [1, {MAX_NODES}]")
    resources = task.get("resources") or {}
    if not isinstance(resources, Mapping):
        problems.append("resources: not a mapping")
        resources = {}
    extra = sorted(set(resources) - set(RESOURCES_FIELDS))
    if extra:
        problems.append(f"resources: unknown field(s) {', '.join(extra)}")
    accelerators = resources.get("accelerators")
    if accelerators is not None:
        name_part, _, count = str(accelerators).partition(":")
        if not ACCELERATOR_PATTERN.fullmatch(name_part) or not (count.isdigit() and int(count) >= 1):
            problems.append(f"resources.accelerators: {accelerators!r}; accepted: NAME:COUNT, e.g. H100:8")
    if "use_spot" in resources and not isinstance(resources["use_spot"], bool):
        problems.append("resources.use_spot: not a boolean")
    recovery = resources.get("job_recovery")
    if recovery is not None and not isinstance(recovery, Mapping):
        problems.append("resources.job_recovery: not a mapping")
    for field in ("envs", "file_mounts"):
        value = task.get(field) or {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            problems.append(f"{field}: must map strings to strings")
    for target in task.get("file_mounts") or {}:
        if not str(target).startswith(("/", "~")) or str(target).endswith("/"):
            problems.append(f"file_mounts: {target!r}; a destination starts with / or ~ and does not end with /")
    for field in ("run", "setup", "workdir"):
        if field in task and not isinstance(task[field], str):
            problems.append(f"{field}: not a string")
    if not isinstance(task.get("run"), str) or not task["run"].strip():
        problems.append("run: missing")
    return problems


def skypilot_version() -> str | None:
    """The installed SkyPilot's version (either distribution), without importing it; None when not installed."""
    try:
        if importlib.util.find_spec("sky") is None:
            return None
    except (ImportError, ValueError):
        return None
    for distribution in DISTRIBUTIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    return "unknown version"


def _missing() -> str:
    return "SkyPilot is not installed: pip install 'llm-infra-mcp[skypilot]' (skypilot, about 430 MB)"


_IMPORT_LOCK = threading.Lock()


def _logs_to_stderr() -> None:
    """SkyPilot's loggers write to stdout (sky/sky_logging.py), which is the MCP wire of a stdio server or a
    follower's own output: point them at stderr. Cheap; done after every import and call, since SkyPilot may make
    its handlers anew. (No redirect_stdout: that is one global for every thread.)"""
    import logging

    loggers = [
        logger
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and (name == "sky" or name.startswith("sky."))
    ]
    for logger in loggers:
        for handler in list(logger.handlers):
            if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__):
                with contextlib.suppress(Exception):
                    handler.setStream(sys.stderr)


@contextlib.contextmanager
def _quiet() -> Any:
    try:
        yield
    finally:
        _logs_to_stderr()


def import_sky() -> Any:
    """The `sky` module (SkyPilot's SDK), its logs sent to stderr. SkyPilotUnavailableError without it."""
    with _IMPORT_LOCK:
        try:
            import sky
        except ImportError as exc:
            raise SkyPilotUnavailableError(f"{_missing()} ({exc})") from exc
        _logs_to_stderr()
    return sky


def validate_with_skypilot(rendered: str) -> str:
    """Parse the task with SkyPilot's own loader (its schema; offline: no catalog, no API server). Returns the
    version that validated it; ValueError with SkyPilot's words when it rejects the task."""
    sky = import_sky()
    try:
        with _quiet():
            task = sky.Task.from_yaml_str(rendered)
            task.validate_name()
            task.validate_run()
    except Exception as exc:  # SkyPilot raises ValueError, jsonschema's errors, its own exceptions
        raise ValueError(f"SkyPilot rejects the rendered task: {_first_line(exc, 500)}") from None
    return skypilot_version() or "unknown version"


# ---- the API server, as SkyPilot's client finds it ------------------------------------------------------------------
def _read_config(path: Path) -> Mapping[str, Any]:
    with contextlib.suppress(OSError, yaml.YAMLError, ValueError):
        if path.is_file() and path.stat().st_size <= 1024 * 1024:
            data = yaml.safe_load(path.read_text(errors="replace"))
            if isinstance(data, Mapping):
                return data
    return {}


def api_endpoint() -> tuple[str, str]:
    """(the API server URL SkyPilot's client will use, where that came from), read as its client does
    (sky/server/common.py get_server_url): $SKYPILOT_API_SERVER_ENDPOINT, else api_server.endpoint in the config
    ($SKYPILOT_CONFIG, else ~/.sky/config.yaml), else the local server. No network."""
    env = os.environ.get(ENDPOINT_ENV, "").strip()
    if env:
        return env.rstrip("/"), ENDPOINT_ENV
    config_path = Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG).expanduser()
    server = _read_config(config_path).get("api_server")
    if isinstance(server, Mapping) and isinstance(server.get("endpoint"), str) and server["endpoint"].strip():
        return server["endpoint"].strip().rstrip("/"), f"api_server.endpoint in {config_path}"
    port = os.environ.get("SKYPILOT_API_SERVER_LOCAL_PORT", "").strip()
    local = f"http://127.0.0.1:{port}" if port.isdigit() else DEFAULT_ENDPOINT
    return local, "the default: a local API server"


def redact(url: str) -> str:
    """The URL without a password (http://user:secret@host -> http://user:***@host)."""
    return re.sub(r"(://[^/:@]+):[^/@]*@", r"\1:***@", url)


def is_local(url: str) -> bool:
    host = re.sub(r"^[a-z]+://", "", url).split("/")[0].rsplit("@", 1)[-1]
    host = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return host in ("127.0.0.1", "localhost", "0.0.0.0", "[::1]")


def local_credentials() -> list[str]:
    """Clouds and clusters whose credentials are on this machine (files or variables SkyPilot reads); not checked
    (that is `sky check`, which calls the clouds)."""
    found = []
    for what, files, variables in CREDENTIALS:
        if any(os.environ.get(v) for v in variables) or any(Path(f).expanduser().is_file() for f in files):
            found.append(what)
    return found


# ---- follower-side bookkeeping --------------------------------------------------------------------------------------
@dataclass
class _Memo:
    job_id: int | None = None
    cancel_sent: bool = False
    last_sync: float = 0.0
    final_synced: bool = False
    syncing: threading.Thread | None = None


class _CappedText(io.TextIOBase):
    """A text stream that keeps the first `limit` bytes written to it and counts the rest."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = max(0, limit)
        self.parts: list[bytes] = []
        self.size = 0
        self.cut = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        data = str(text).encode("utf-8", errors="replace")
        room = self.limit - self.size
        if len(data) > room:
            self.cut = True
            data = data[: max(0, room)]
        if data:
            self.parts.append(data)
            self.size += len(data)
        return len(text)

    def value(self) -> bytes:
        return b"".join(self.parts)


def _field(record: Any, name: str) -> Any:
    """A field of a SkyPilot record: a dict (older servers) or a ResponseBaseModel (which also answers .get)."""
    if isinstance(record, Mapping):
        return record.get(name)
    getter = getattr(record, "get", None)
    if callable(getter):
        with contextlib.suppress(Exception):
            return getter(name)
    return getattr(record, name, None)


def _status_name(value: Any) -> str:
    """A ManagedJobStatus (enum) or its name as a string; 'DEPRECATED_SUBMITTED' has the value 'SUBMITTED'."""
    return str(getattr(value, "value", value) or "").strip().upper()


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def _is_unreachable(exc: BaseException) -> bool:
    """A failure to reach the API server (as opposed to the server answering with an error)."""
    if isinstance(exc, OSError | TimeoutError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(
        names
        & {
            "ApiServerConnectionError",
            "ApiServerAuthenticationError",
            "ConnectionError",
            "Timeout",
            "ReadTimeout",
            "ConnectTimeout",
            "ChunkedEncodingError",
        }
    )


def _not_sent(exc: BaseException) -> bool:
    """A launch that surely did not reach the API server: its health check failed before anything was sent."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    cause = exc.__cause__
    if cause is not None:
        names |= {cls.__name__ for cls in type(cause).__mro__}
    return bool(names & {"ApiServerConnectionError", "ApiServerAuthenticationError"})


# ---- reading a spec -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Job:
    """The fields every backend reads, checked."""

    script: Path
    args: list[str]
    nnodes: int
    nproc: int
    gpus: int
    max_restarts: int
    max_wall_s: float | None


@dataclass(frozen=True)
class _Sky:
    """The spec's SkyPilot options, checked."""

    accelerator: str | None
    infra: Any
    use_spot: Any
    strategy: str | None
    on_errors: Any
    image: Any
    packages: list[str]

    def resources(self, gpus: int) -> dict[str, Any]:
        """The task's resources section."""
        resources: dict[str, Any] = {}
        if self.infra is not None:
            resources["infra"] = str(self.infra)
        if self.accelerator is not None:
            resources["accelerators"] = f"{self.accelerator}:{gpus}"
        if self.use_spot:
            resources["use_spot"] = True
        if self.strategy is not None or self.on_errors:
            recovery: dict[str, Any] = {}
            if self.strategy is not None:
                recovery["strategy"] = self.strategy
            if self.on_errors:
                recovery["max_restarts_on_errors"] = self.on_errors
            resources["job_recovery"] = recovery
        if self.image is not None:
            resources["image_id"] = f"docker:{self.image}"
        return resources


def _read_job(spec: Mapping[str, Any]) -> _Job:
    script = Path(str(spec.get("script") or ""))
    if not script.is_absolute():
        raise ValueError(f"script: the path must be absolute, got {str(script)!r}")
    _check_local_path("script", str(script))
    args = [str(a) for a in spec.get("args") or []]
    for arg in args:
        if CONTROL.search(arg):
            raise ValueError("args: control characters (other than tab and newline) are not carried to the nodes")
        if JOB_DIR_PLACEHOLDER in arg or GPUS_PLACEHOLDER in arg:
            raise ValueError(
                f"args: {arg!r} names {JOB_DIR_PLACEHOLDER} or {GPUS_PLACEHOLDER}, this machine's job folder and "
                "GPUs, which SkyPilot's nodes do not have; the script finds its folders in "
                f"{METRICS_ENV} and {CHECKPOINT_ENV}"
            )
    nnodes = int(spec.get("nnodes") or 1)
    if not 1 <= nnodes <= MAX_NODES:
        raise ValueError(f"nnodes: {nnodes}; accepted: 1 to {MAX_NODES}")
    nproc = int(spec.get("nproc_per_node") or 1)
    if not 1 <= nproc <= MAX_NPROC:
        raise ValueError(f"nproc_per_node: {nproc}; accepted: 1 to {MAX_NPROC}")
    given = spec.get("gpus_per_node")
    gpus = int(given) if given is not None else int(spec.get("gpus_wanted") or 0)
    if gpus < 0:
        raise ValueError(f"gpus_per_node: {gpus}; accepted: 0 or more")
    if gpus and nproc > gpus:
        raise ValueError(f"nproc_per_node: {nproc} ranks need {nproc} GPUs per node, and the spec asks for {gpus}")
    max_restarts = int(spec.get("max_restarts") or 0)
    if max_restarts < 0:
        raise ValueError(f"max_restarts: {max_restarts}; accepted: 0 or more")
    wall = spec.get("max_wall_s")
    max_wall_s = float(wall) if wall is not None else None
    if max_wall_s is not None and not (max_wall_s > 0 and math.isfinite(max_wall_s)):
        raise ValueError(f"max_wall_s: {wall!r}; accepted: a number of seconds > 0")
    return _Job(script, args, nnodes, nproc, gpus, max_restarts, max_wall_s)


def _read_options(options: Mapping[str, Any], gpus: int) -> _Sky:
    """The SkyPilotOptions of a spec, each checked again (a caller may hand the backend any mapping)."""
    accelerator = options.get("accelerator")
    if accelerator is not None:
        accelerator = str(accelerator)
        if not ACCELERATOR_PATTERN.fullmatch(accelerator):
            raise ValueError(f"accelerator: {accelerator!r}; accepted: {ACCELERATOR_ACCEPTED}")
        if gpus == 0:
            raise ValueError(
                f"gpus_per_node: 0 with accelerator {accelerator}; accepted: gpus_per_node >= 1 with an "
                "accelerator, or no accelerator for CPU nodes"
            )
    elif gpus:
        raise ValueError(
            f"accelerator: missing for {gpus} GPU(s) per node; accepted: {ACCELERATOR_ACCEPTED} "
            "(SkyPilot asks for GPUs by name and count, e.g. H100:8)"
        )
    infra = options.get("infra")
    if infra is not None and not INFRA_PATTERN.fullmatch(str(infra)):
        raise ValueError(f"infra: {infra!r}; accepted: {INFRA_ACCEPTED}")
    use_spot = options.get("use_spot")
    if use_spot is not None and not isinstance(use_spot, bool):
        raise ValueError(f"use_spot: {use_spot!r}; accepted: true or false")
    strategy = options.get("job_recovery")
    if strategy is not None:
        strategy = str(strategy).upper()
        if strategy not in RECOVERY_STRATEGIES:
            raise ValueError(
                f"job_recovery: {options.get('job_recovery')!r}; accepted: {', '.join(RECOVERY_STRATEGIES)}"
            )
    on_errors = options.get("max_restarts_on_errors")
    if on_errors is not None and (
        not isinstance(on_errors, int) or isinstance(on_errors, bool) or not 0 <= on_errors <= MAX_RESTARTS_ON_ERRORS
    ):
        raise ValueError(f"max_restarts_on_errors: {on_errors!r}; accepted: 0 to {MAX_RESTARTS_ON_ERRORS}")
    image = options.get("image")
    if image is not None and not IMAGE_PATTERN.fullmatch(str(image)):
        raise ValueError(f"image: {image!r}; accepted: {IMAGE_ACCEPTED}")
    packages = [str(p) for p in options.get("pip_packages") or []]
    if len(packages) > MAX_PIP_PACKAGES:
        raise ValueError(f"pip_packages: {len(packages)} given; accepted: at most {MAX_PIP_PACKAGES}")
    for package in packages:
        if not PIP_PATTERN.fullmatch(package):
            raise ValueError(f"pip_packages: {package!r}; accepted: {PIP_ACCEPTED}")
    return _Sky(accelerator, infra, use_spot, strategy, on_errors, image, packages)


def _read_env(spec: Mapping[str, Any]) -> dict[str, Any]:
    user_env = dict(spec.get("env") or {})
    for key, value in user_env.items():
        if not isinstance(key, str) or not ENV_NAME_PATTERN.fullmatch(key) or not isinstance(value, str):
            raise ValueError("env: must map variable names to string values")
        if key.startswith(RESERVED_ENV_PREFIXES):
            raise ValueError(f"env: {key} is reserved ({', '.join(p + '*' for p in RESERVED_ENV_PREFIXES)})")
        if "\x00" in value or JOB_DIR_PLACEHOLDER in value or GPUS_PLACEHOLDER in value:
            raise ValueError(f"env: {key} holds a NUL byte or a placeholder of this machine ($JOB_DIR...)")
    return user_env


def _files(
    spec: Mapping[str, Any], script: Path, settings: Settings | None, notes: list[str]
) -> tuple[Path | None, dict[str, str], str]:
    """(workdir, file_mounts, the script's path on the nodes): the recipe (with the siblings and ../metrics.py it
    loads by path), or the script; a workdir. What is copied is said in `notes`."""
    file_mounts: dict[str, str] = {}
    workdir: Path | None = None
    if spec.get("workdir"):
        roots = (settings or Settings()).roots()
        workdir = resolve_inside_roots(str(spec["workdir"]), roots, what="workdir")
        _check_local_path("workdir", str(workdir))
    is_recipe = bool(spec.get("recipe")) or script.parent == RECIPES_DIR
    if is_recipe:
        if script.parent != RECIPES_DIR:
            raise ValueError(f"script: the recipe {spec.get('recipe')!r} is not in {RECIPES_DIR}")
        _check_local_path("recipes", str(RECIPES_DIR))
        file_mounts[f"{REMOTE_LAUNCH}/recipes"] = str(RECIPES_DIR)
        file_mounts[f"{REMOTE_LAUNCH}/metrics.py"] = str(METRICS_FILE)
        remote_script = f"{REMOTE_LAUNCH}/recipes/{script.name}"
        notes.append(
            f"files: the bundled recipes folder {RECIPES_DIR} and its metrics.py are copied to "
            f"{REMOTE_LAUNCH}/ on every node (file_mounts); the run starts {remote_script}"
        )
    elif workdir is not None and script.is_relative_to(workdir):
        remote_script = str(script.relative_to(workdir))
        notes.append(f"files: the script is {remote_script} in the workdir")
    else:
        remote_script = f"{REMOTE_SCRIPTS}/{script.name}"
        file_mounts[remote_script] = str(script)
        notes.append(
            f"files: the script {script} alone is copied to {remote_script} on every node (file_mounts); files "
            "it imports from its own folder are not: give a workdir holding them and the script"
        )
    if workdir is not None:
        notes.append(f"files: the workdir {workdir} is copied to {SKY_WORKDIR} on every node; the run starts there")
    notes.append(
        "a managed job carries local files through cloud storage: SkyPilot uploads the workdir and file_mounts "
        "to the bucket jobs.bucket of its config, else to a temporary bucket it makes for the job and deletes "
        "after it (the account needs object storage)"
    )
    return workdir, file_mounts, remote_script


def _validation_note(rendered: str) -> str:
    """The task validated by SkyPilot when it is installed (ValueError if it refuses it), or why it was not."""
    if skypilot_version() is not None:
        version = validate_with_skypilot(rendered)
        return (
            f"validated offline by SkyPilot {version} (sky.Task.from_yaml_str: its schema and names); the "
            "accelerator and infra are checked by the API server against SkyPilot's catalog at launch"
        )
    return (
        "not validated by SkyPilot: it is not installed here (pip install 'llm-infra-mcp[skypilot]'); checked "
        "structurally only (the fields and types this backend renders); the accelerator and infra are checked "
        "by the API server at launch"
    )


# ---- the backend ----------------------------------------------------------------------------------------------------
class SkyPilotBackend:
    """Training jobs as SkyPilot managed jobs. See the module docstring.

    jobs_dir: where submit makes job folders for plans not bound to one (default <state dir>/jobs/skypilot).
    request_timeout_s: how long one status/cancel/logs call waits for the API server to finish a request.
    log_sync_s: how often the follower copies SkyPilot's job log into the job folder while the job runs.
    log_cap_bytes: the most of each log copied or fetched (default 64 MiB).
    """

    name = BACKEND_NAME

    def __init__(
        self,
        *,
        jobs_dir: Path | str | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        cancel_wait_s: float = CANCEL_WAIT_S,
        log_sync_s: float = LOG_SYNC_S,
        log_cap_bytes: int = DEFAULT_LOG_CAP,
        lost_after_s: float = LOST_AFTER_S,
        request_poll_s: float = 0.5,
    ) -> None:
        self.jobs_dir = Path(jobs_dir) if jobs_dir is not None else None
        self.request_timeout_s = request_timeout_s
        self.cancel_wait_s = cancel_wait_s
        self.log_sync_s = log_sync_s
        self.log_cap_bytes = log_cap_bytes
        self.lost_after_s = lost_after_s
        self.request_poll_s = request_poll_s
        self._memos: dict[str, _Memo] = {}
        self._lock = threading.Lock()
        self._submit_lock = threading.Lock()

    # ---- available ----
    def available(self) -> tuple[bool, str]:
        """Whether SkyPilot is installed and has somewhere to launch: a remote API server configured (its cloud
        credentials are the server's), or cloud credentials here for the local API server SkyPilot would start.
        Reads files and variables only: no import of sky, no network."""
        version = skypilot_version()
        if version is None:
            return False, _missing()
        endpoint, source = api_endpoint()
        shown = redact(endpoint)
        if not is_local(endpoint):
            return True, (
                f"skypilot {version}; API server {shown} (from {source}; not contacted here: the cloud credentials "
                "are the server's)"
            )
        clouds = local_credentials()
        if clouds:
            return True, (
                f"skypilot {version}; local API server {shown} ({source}; SkyPilot starts it on first use); "
                f"credentials found here for {', '.join(clouds)} (present, not verified: `sky check` verifies them)"
            )
        return False, (
            f"skypilot {version} is installed, but no API server is configured ({ENDPOINT_ENV}, or api_server.endpoint "
            f"in {DEFAULT_CONFIG}: `sky api login`) and no cloud credentials were found here for a local one "
            "(~/.aws, gcloud, ~/.kube/config, ...): set one up and run `sky check`"
        )

    # ---- plan ----
    def plan(self, spec: Mapping[str, Any], settings: Settings | None = None) -> BackendPlan:
        """The task YAML for a validated spec (see the module docstring). No side effects beyond SkyPilot's own
        ~/.sky when it validates the task. ValueError: 'field: what is wrong; accepted: ...'."""
        job = _read_job(spec)
        sky = _read_options(given_options(spec, BACKEND_NAME), job.gpus)
        user_env = _read_env(spec)
        notes: list[str] = []
        workdir, file_mounts, remote_script = _files(spec, job.script, settings, notes)
        env = {**user_env}
        env.setdefault("PYTHONUNBUFFERED", "1")
        run = run_script(
            script=remote_script,
            args=job.args,
            nproc_per_node=job.nproc,
            max_restarts=job.max_restarts,
            max_wall_s=job.max_wall_s,
            in_workdir=workdir is not None,
        )
        task: dict[str, Any] = {"name": task_name_for(spec), "num_nodes": job.nnodes}
        resources = sky.resources(job.gpus)
        if resources:
            task["resources"] = resources
        task["envs"] = env
        if workdir is not None:
            task["workdir"] = str(workdir)
        if file_mounts:
            task["file_mounts"] = file_mounts
        if sky.packages:
            task["setup"] = setup_script(sky.packages)
        task["run"] = run
        rendered = render_yaml(task)

        problems = check_structure(task)
        if problems:  # a renderer bug, never the caller's: say so plainly
            raise ValueError("the rendered task is malformed: " + "; ".join(problems))
        notes.insert(0, _validation_note(rendered))
        key = spec.get("idempotency_key")
        job_name = job_name_for(str(key)) if key else NAME_LATER
        notes += self._notes(job, sky, job_name)
        return BackendPlan(
            backend=self.name,
            argv=["sky", "jobs", "launch", "--yes", "--name", job_name, f"{JOB_DIR_PLACEHOLDER}/{TASK_FILE}"],
            env=env,
            cwd=JOB_DIR_PLACEHOLDER,
            gpus=None,
            gpus_wanted=0,  # GPUs of SkyPilot's nodes, not of this machine
            nnodes=job.nnodes,
            nproc_per_node=job.nproc,
            rendered=rendered,
            notes=notes,
        )

    def _notes(self, job: "_Job", sky: "_Sky", job_name: str) -> list[str]:
        """What a person should know: how it runs, what it assumes, what it costs."""
        nnodes, nproc, gpus = job.nnodes, job.nproc, job.gpus
        strategy, on_errors = sky.strategy, sky.on_errors
        notes = [
            f"a SkyPilot managed job (sky jobs launch) named {job_name}: the jobs controller provisions the cluster, "
            "tears it down at the end, and relaunches it after a preemption"
            + (" (use_spot: spot/preemptible instances)" if sky.use_spot else "")
            + (
                f"; job_recovery {strategy or 'the default strategy (EAGER_NEXT_REGION)'}"
                + (f", relaunched up to {on_errors} time(s) after the job's own failures" if on_errors else "")
                if strategy is not None or on_errors
                else ""
            ),
            f"{nnodes} node(s) x {nproc} rank(s): every node runs the same run commands; torchrun's static rendezvous "
            "takes the node rank from SKYPILOT_NODE_RANK and the rank-0 node's address from the first line of "
            f"SKYPILOT_NODE_IPS, port {MASTER_PORT}, which the nodes must reach on each other (SkyPilot puts a "
            "cluster's nodes in one network)",
        ]
        if sky.accelerator is not None:
            notes.append(f"resources: {sky.accelerator}:{gpus} per node ({gpus * nnodes} GPU(s) in all)")
            if nproc < gpus:
                notes.append(f"nproc_per_node {nproc} < {gpus} GPUs per node: {gpus - nproc} GPU(s) per node idle")
        else:
            notes.append(
                "resources: no accelerator: SkyPilot's default CPU instance (the bundled recipes then use gloo)"
            )
        if sky.infra is None:
            notes.append("infra: not given: SkyPilot picks among the clouds and clusters enabled on its API server")
        notes.append(
            "assumed on every node: `python` on PATH with torch (and what the script imports), "
            + (f"from the image {sky.image}" if sky.image else "from the node's image")
            + (f" or setup's pip install of {', '.join(sky.packages)}" if sky.packages else "")
            + "; and coreutils `timeout`"
        )
        if job.max_wall_s is not None:
            notes.append(
                f"max_wall_s {job.max_wall_s:g} s: `timeout` ends torchrun on each node (SIGTERM, SIGKILL "
                f"{KILL_AFTER_S} s later; exit 124: FAILED); SkyPilot has no wall-time limit of its own, and the "
                "limit restarts with each recovery"
            )
        else:
            notes.append("no wall-time limit: the spec gives no max_wall_s")
        if job.max_restarts:
            notes.append(f"torchrun restarts the ranks in place up to {job.max_restarts} time(s) after a failure")
        notes.append(
            f"metrics ({METRICS_ENV}) and checkpoints ({CHECKPOINT_ENV}) are written on the nodes under "
            f"{REMOTE_RUN_DIR}, not copied back: read_job_metrics has none for this job, and a recovery starts on "
            "new nodes without them (resume needs checkpoints on a bucket)"
        )
        notes.append(
            f"logs: SkyPilot's job log (every node's output, lines prefixed by node) is copied into the job folder as "
            f"process {JOB_LOG} while the job runs (every {self.log_sync_s:g} s) and at its end, with the jobs "
            f"controller's log as process {CONTROLLER_LOG}"
        )
        endpoint, source = api_endpoint()
        notes.append(f"submits to the SkyPilot API server {redact(endpoint)} ({source})")
        return notes

    # ---- submit ----
    def _folder_for(self, plan: BackendPlan, name: str, job_dir: Path | str | None) -> Path:
        if job_dir is not None:
            folder = Path(job_dir)
        elif plan.cwd and JOB_DIR_PLACEHOLDER not in plan.cwd:
            folder = Path(plan.cwd)
        else:
            root = self.jobs_dir if self.jobs_dir is not None else Settings().jobs_dir / BACKEND_NAME
            folder = root / name
        return folder if folder.is_absolute() else folder.resolve()

    def submit(self, plan: BackendPlan, request: SubmitRequest, *, job_dir: Path | str | None = None) -> BackendHandle:
        """Launch the plan's task as a managed job named after request.key; returns as soon as the API server has
        the request (handle native_id ``request:<id>``), without waiting on it. Idempotent by the key and the job
        folder. SkyPilotUnavailableError: SkyPilot is missing or its API server was not reached (nothing was
        launched); RuntimeError: SkyPilot refused the task (nothing was launched)."""
        if plan.backend != self.name:
            raise ValueError(f"plan: made by the {plan.backend!r} backend; make it with SkyPilotBackend.plan")
        rendered = plan.rendered or ""
        try:
            task = yaml.safe_load(rendered)
        except yaml.YAMLError as exc:
            raise ValueError(f"plan: the rendered task is not YAML ({_first_line(exc)}); make the plan again") from None
        if not isinstance(task, Mapping) or check_structure(task):
            raise ValueError("plan: the rendered task is not one SkyPilotBackend.plan makes; make the plan again")
        name = job_name_for(request.key)
        folder = self._folder_for(plan, name, job_dir)
        handle = BackendHandle(backend=self.name, key=request.key, native_id="", job_dir=str(folder))
        record_path = folder / SUBMIT_RECORD
        with self._submit_lock:
            earlier = read_json(record_path, 64 * 1024)
            if isinstance(earlier, dict) and earlier.get("key") == request.key:
                if earlier.get("request_id"):
                    return handle.model_copy(update={"native_id": f"request:{earlier['request_id']}"})
                return handle.model_copy(update={"native_id": f"name:{earlier.get('job_name') or name}"})
            sky = import_sky()
            try:
                with _quiet():
                    sky_task = sky.Task.from_yaml_str(rendered)
            except Exception as exc:
                raise RuntimeError(
                    f"SkyPilot rejects the task: {_first_line(exc, 500)}; nothing was launched"
                ) from None
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{TASK_FILE}.tmp"
            tmp.write_text(rendered)
            os.replace(tmp, folder / TASK_FILE)
            record: dict[str, Any] = {
                "key": request.key,
                "job_name": name,
                "state": "launching",
                "request_id": None,
                "job_id": None,
                "submitted_at": time.time(),
                "api_server": redact(api_endpoint()[0]),
            }
            atomic_write_json(record_path, record)
            try:
                with _quiet():
                    request_id = sky.jobs.launch(sky_task, name=name)
            except Exception as exc:
                if _is_unreachable(exc) and not _not_sent(exc):
                    # The request may have reached the API server: look the job up by name, never launch again.
                    atomic_write_json(record_path, {**record, "state": "uncertain", "error": _first_line(exc, 500)})
                    return handle.model_copy(update={"native_id": f"name:{name}"})
                record_path.unlink(missing_ok=True)
                if _is_unreachable(exc):
                    raise SkyPilotUnavailableError(self._unreachable(exc, "nothing was launched")) from exc
                raise RuntimeError(f"SkyPilot refused the job: {_first_line(exc, 500)}; nothing was launched") from exc
            request_id = str(request_id)
            atomic_write_json(record_path, {**record, "state": "submitted", "request_id": request_id})
        return handle.model_copy(update={"native_id": f"request:{request_id}"})

    # ---- the API server ----
    def _unreachable(self, exc: BaseException, what: str) -> str:
        endpoint, source = api_endpoint()
        return (
            f"cannot reach the SkyPilot API server at {redact(endpoint)} ({source}; {type(exc).__name__}: "
            f"{_first_line(exc, 200)}); {what}. Start it (`sky api start`) or point {ENDPOINT_ENV} at one "
            "(`sky api login`)"
        )

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One SDK call; a failure to reach the API server becomes SkyPilotUnavailableError, the server's own
        errors pass through."""
        try:
            with _quiet():
                return fn(*args, **kwargs)
        except SkyPilotUnavailableError:
            raise
        except Exception as exc:
            if _is_unreachable(exc):
                raise SkyPilotUnavailableError(self._unreachable(exc, f"{what} was not done")) from exc
            raise

    def _request_status(self, sky: Any, request_id: str) -> tuple[str, str | None] | None:
        """(status, status message) of an API request, from sky.api_status (it does not wait); None when the
        server does not know the request (or a local server is not running)."""
        payloads = self._call("api_status", sky.api_status, [request_id]) or []
        for payload in payloads:
            rid = str(_field(payload, "request_id") or "")
            if rid == request_id or rid.startswith(request_id) or request_id.startswith(rid or "\x00"):
                status = str(getattr(_field(payload, "status"), "value", _field(payload, "status")) or "").upper()
                message = _field(payload, "status_msg")
                return status, (str(message) if message else None)
        return None

    def _wait_request(self, sky: Any, request_id: str, what: str, timeout_s: float | None = None) -> str:
        """Wait (polling api_status) until the request finished; its final status. SkyPilotUnavailableError if it
        did not finish in time or the server does not know it."""
        limit = self.request_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        pause = min(0.05, self.request_poll_s)
        while True:
            found = self._request_status(sky, request_id)
            if found is None:
                raise SkyPilotUnavailableError(f"the SkyPilot API server does not know the {what} request {request_id}")
            if found[0] in REQUEST_FINISHED:
                return found[0]
            if time.monotonic() >= deadline:
                raise SkyPilotUnavailableError(
                    f"the SkyPilot API server did not finish the {what} request {request_id} within {limit:g} s "
                    f"(it is {found[0]}); asked again on the next poll"
                )
            time.sleep(pause)
            pause = min(self.request_poll_s, pause * 2)

    def _result(self, sky: Any, request_id: Any, what: str) -> Any:
        """The result of a request, once finished (sky.get then returns at once); the request's own error raised."""
        rid = str(request_id)
        self._wait_request(sky, rid, what)
        return self._call(f"get({what})", sky.get, rid)

    def _records(self, sky: Any, job_ids: list[int] | None) -> list[Any]:
        """Managed-job records (sky.jobs.queue_v2; sky.jobs.queue on SDKs without it) of this user's jobs."""
        queue_v2 = getattr(sky.jobs, "queue_v2", None)
        if callable(queue_v2):
            rid = self._call("jobs.queue_v2", queue_v2, refresh=False, job_ids=job_ids, fields=list(QUEUE_FIELDS))
        else:
            rid = self._call("jobs.queue", sky.jobs.queue, refresh=False, job_ids=job_ids)
        result = self._result(sky, rid, "jobs.queue")
        if isinstance(result, tuple) and result and isinstance(result[0], list):
            result = result[0]  # queue_v2: (records, total, status counts, total without the filter)
        return list(result or [])

    def _find_by_name(self, sky: Any, name: str) -> int | None:
        ids = [_field(r, "job_id") for r in self._records(sky, None) if _field(r, "job_name") == name]
        ids = [int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool)]
        return max(ids) if ids else None

    # ---- status ----
    def _memo(self, handle: BackendHandle) -> _Memo:
        key = f"{handle.native_id}|{handle.job_dir}"
        with self._lock:
            return self._memos.setdefault(key, _Memo())

    @staticmethod
    def _record(handle: BackendHandle) -> dict[str, Any]:
        if not handle.job_dir:
            return {}
        data = read_json(Path(handle.job_dir) / SUBMIT_RECORD, 64 * 1024)
        return data if isinstance(data, dict) else {}

    def _remember(self, handle: BackendHandle, job_id: int) -> None:
        self._memo(handle).job_id = job_id
        if handle.job_dir:
            path = Path(handle.job_dir) / SUBMIT_RECORD
            record = self._record(handle)
            if record and record.get("job_id") != job_id:
                with contextlib.suppress(OSError):
                    atomic_write_json(path, {**record, "job_id": job_id, "state": "submitted"})

    def _resolve(self, sky: Any, handle: BackendHandle) -> tuple[int | None, EngineStatus | None]:
        """(the managed job id, None), or (None, what to report while there is no job: the launch request still
        in flight, failed, cancelled; a job not found)."""
        memo = self._memo(handle)
        if memo.job_id is not None:
            return memo.job_id, None
        record = self._record(handle)
        if isinstance(record.get("job_id"), int):
            memo.job_id = int(record["job_id"])
            return memo.job_id, None
        kind, _, value = handle.native_id.partition(":")
        if kind == "job" and value.isdigit():
            memo.job_id = int(value)
            return memo.job_id, None
        name = str(record.get("job_name") or (value if kind == "name" else job_name_for(handle.key)))
        if kind == "request" and value:
            found = self._request_status(sky, value)
            if found is None:  # forgotten, or a local API server not running (SkyPilot's api_status answers [])
                job_id = self._find_by_name(sky, name)  # (this starts a local API server, as SkyPilot's calls do)
                if job_id is not None:
                    self._remember(handle, job_id)
                    return job_id, None
                found = self._request_status(sky, value)
            if found is None:
                return None, EngineStatus(
                    state=JobState.LOST,
                    native_state=None,
                    reason=(
                        f"the SkyPilot API server knows neither the launch request {value} nor a managed job named "
                        f"{name} (a different or reset API server?): how the job went is unknown"
                    ),
                )
            status, message = found
            if status in REQUEST_ACTIVE:
                return None, EngineStatus(
                    state=JobState.QUEUED,
                    native_state=f"request {status}",
                    reason=(
                        f"the API server is handling the launch request ({status}"
                        + (f": {_first_line(message, 200)}" if message else "")
                        + "): it submits the job to the jobs controller, starting the controller first if it is down "
                        "(a few minutes)"
                    ),
                )
            if status == "CANCELLED":
                return None, EngineStatus(
                    state=JobState.CANCELLED,
                    native_state="request CANCELLED",
                    reason="the launch request was cancelled before SkyPilot made the managed job",
                )
            if status == "FAILED":
                try:
                    self._call("get(jobs.launch)", sky.get, value)
                    why = "the launch request failed"
                except SkyPilotUnavailableError:
                    raise
                except Exception as exc:
                    why = f"{type(exc).__name__}: {_first_line(exc, 1000)}"
                return None, EngineStatus(
                    state=JobState.FAILED,
                    native_state="request FAILED",
                    reason=f"SkyPilot did not launch the managed job: {why}"[:_REASON_CHARS],
                )
            if status == "SUCCEEDED":
                result = self._call("get(jobs.launch)", sky.get, value)
                job_ids = result[0] if isinstance(result, tuple | list) and result else None
                if isinstance(job_ids, int):
                    job_ids = [job_ids]
                if not job_ids:
                    return None, EngineStatus(
                        state=JobState.FAILED,
                        native_state="request SUCCEEDED",
                        reason="SkyPilot's launch request ended without a managed job id",
                    )
                self._remember(handle, int(job_ids[0]))
                return int(job_ids[0]), None
            return None, EngineStatus(
                state=JobState.LOST, native_state=f"request {status}", reason=f"unknown API request state {status!r}"
            )
        # name:<job name>: a launch whose outcome was not recorded; look the job up by its name.
        job_id = self._find_by_name(sky, name)
        if job_id is not None:
            self._remember(handle, job_id)
            return job_id, None
        since = record.get("submitted_at")
        age = time.time() - float(since) if isinstance(since, int | float) else math.inf
        if age < self.lost_after_s:
            return None, EngineStatus(
                state=JobState.QUEUED,
                native_state=None,
                reason=(
                    f"the launch's answer was lost ({record.get('error') or 'the submitting process stopped'}); "
                    f"looking for a managed job named {name}: nothing is launched again on its own"
                ),
            )
        return None, EngineStatus(
            state=JobState.LOST,
            native_state=None,
            reason=(
                f"no managed job named {name} appeared within {self.lost_after_s:g} s of a launch whose answer was "
                "lost: it most likely never reached SkyPilot; submit again with a new idempotency key"
            ),
        )

    def status(self, handle: BackendHandle) -> EngineStatus:
        """The managed job's state mapped (see the module docstring). Waits on the API server (at most about
        request_timeout_s per request): call it from the job's follower, not inside a tool call. Raises
        SkyPilotUnavailableError when the API server cannot be asked."""
        sky = import_sky()
        job_id, early = self._resolve(sky, handle)
        if job_id is None:
            assert early is not None
            return early
        status = self._job_status(sky, job_id)
        memo = self._memo(handle)
        if (
            not status.state.terminal
            and status.native_state != "CANCELLING"
            and not memo.cancel_sent
            and self._cancel_requested(handle)
        ):
            # Cancelled through this server before the job was known (a launch still in flight): cancel it now.
            memo.cancel_sent = True
            with contextlib.suppress(RuntimeError):
                self._result(sky, self._call("jobs.cancel", sky.jobs.cancel, job_ids=[job_id]), "jobs.cancel")
        self._sync_logs(sky, handle, job_id, status)
        return status

    def _job_status(self, sky: Any, job_id: int) -> EngineStatus:
        records = [r for r in self._records(sky, [job_id]) if _field(r, "job_id") == job_id]
        if not records:
            return EngineStatus(
                state=JobState.LOST,
                native_state=None,
                reason=f"the jobs controller has no managed job {job_id} (its database was reset?)",
            )
        # One record per task; this backend's jobs have one task. The least advanced one speaks for the job.
        record = min(records, key=lambda r: _field(r, "task_id") or 0)
        if len(records) > 1:
            unfinished = [
                r for r in records if not map_state(MANAGED_JOB_STATES, _status_name(_field(r, "status"))).terminal
            ]
            record = unfinished[0] if unfinished else records[-1]
        native = _status_name(_field(record, "status"))
        state = map_state(MANAGED_JOB_STATES, native)
        words = STATE_WORDS.get(native)
        details = [words] if words else [f"SkyPilot reports an unknown managed-job state {native!r}"]
        failure = _field(record, "failure_reason")
        if failure:
            details.append(f"SkyPilot: {_first_line(failure, 1000)}")
        elif _field(record, "details") and not state.terminal:
            details.append(_first_line(_field(record, "details"), 300))
        recoveries = _field(record, "recovery_count")
        restarts = int(recoveries) if isinstance(recoveries, int) and not isinstance(recoveries, bool) else 0
        if restarts:
            details.append(f"recovered {restarts} time(s)")
        return EngineStatus(
            state=state,
            native_state=native or None,
            reason="; ".join(details)[:_REASON_CHARS],
            exit_code=None,  # SkyPilot's records carry no exit code
            started_at=_number(_field(record, "start_at")),
            ended_at=_number(_field(record, "end_at")),
            restarts=restarts,
        )

    @staticmethod
    def _cancel_requested(handle: BackendHandle) -> bool:
        return bool(handle.job_dir) and (Path(str(handle.job_dir)) / CANCEL_RECORD).is_file()

    # ---- logs into the job folder ----
    def _sync_logs(self, sky: Any, handle: BackendHandle, job_id: int, status: EngineStatus) -> None:
        """Copy SkyPilot's logs into the job folder: the job's log while it runs (every log_sync_s, in the
        background: fetching it must not hold up the follower), both logs once more when it ended."""
        if not handle.job_dir:
            return
        memo = self._memo(handle)
        folder = Path(handle.job_dir)
        if status.state.terminal:
            if memo.final_synced:
                return
            if memo.syncing is not None:
                memo.syncing.join(timeout=self.request_timeout_s)
            memo.final_synced = True
            for process in LOG_PROCESSES:
                with contextlib.suppress(Exception):
                    self._copy_log(sky, job_id, folder, process)
            return
        if status.native_state not in ("RUNNING", "WINDING_DOWN", "CANCELLING"):
            return  # fetching the log of a job not running waits until it runs
        now = time.monotonic()
        if (memo.syncing is not None and memo.syncing.is_alive()) or now - memo.last_sync < self.log_sync_s:
            return
        memo.last_sync = now

        def copy() -> None:
            with contextlib.suppress(Exception):
                self._copy_log(sky, job_id, folder, JOB_LOG)

        memo.syncing = threading.Thread(target=copy, name=f"skypilot-logs-{job_id}", daemon=True)
        memo.syncing.start()

    def _fetch_log(self, sky: Any, job_id: int, process: str, limit: int) -> tuple[bytes, bool]:
        stream = _CappedText(limit)
        self._call(
            "jobs.tail_logs",
            sky.jobs.tail_logs,
            job_id=job_id,
            follow=False,
            controller=process == CONTROLLER_LOG,
            output_stream=stream,
        )
        return stream.value(), stream.cut

    def _copy_log(self, sky: Any, job_id: int, folder: Path, process: str) -> None:
        data, cut = self._fetch_log(sky, job_id, process, self.log_cap_bytes)
        if cut:
            data = data[: data.rfind(b"\n") + 1] + (
                f"\n----- llm-infra-mcp: log cut here at {self.log_cap_bytes} bytes -----\n".encode()
            )
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        tmp = logs / f".{process}.log.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, logs / f"{process}.log")

    # ---- cancel ----
    def cancel(self, handle: BackendHandle) -> JobState:
        """Cancel the managed job (sky.jobs.cancel), or the launch request still in flight (sky.api_cancel, then
        the job too if the launch got through). Idempotent; waits up to cancel_wait_s for it to end and returns
        the state then (CANCELLING shows as RUNNING: the controller is still tearing the cluster down)."""
        if handle.job_dir:
            with contextlib.suppress(OSError):
                path = Path(handle.job_dir) / CANCEL_RECORD
                if not path.exists():
                    atomic_write_json(path, {"requested_at": time.time()})
        sky = import_sky()
        job_id, early = self._resolve(sky, handle)
        kind, _, value = handle.native_id.partition(":")
        if job_id is None:
            assert early is not None
            if early.state.terminal or kind != "request":
                return early.state  # ended, or a lost launch not found yet: the record cancels it when found
            try:
                rid = self._call("api_cancel", sky.api_cancel, [value])
            except SkyPilotUnavailableError:
                raise
            except Exception:  # the request ended meanwhile: what it became is read below
                rid = None
            if rid is not None:
                with contextlib.suppress(RuntimeError):
                    self._wait_request(sky, str(rid), "api_cancel", self.cancel_wait_s)
            with contextlib.suppress(RuntimeError):
                self._wait_request(sky, value, "jobs.launch", self.cancel_wait_s)
            job_id, early = self._resolve(sky, handle)
            if job_id is None:
                assert early is not None
                return early.state
        current = self._job_status(sky, job_id)
        if current.state.terminal:
            return current.state
        memo = self._memo(handle)
        rid = self._call("jobs.cancel", sky.jobs.cancel, job_ids=[job_id])
        memo.cancel_sent = True
        try:
            self._result(sky, rid, "jobs.cancel")
        except SkyPilotUnavailableError:
            raise
        except Exception as exc:
            raise RuntimeError(f"SkyPilot did not cancel managed job {job_id}: {_first_line(exc, 500)}") from exc
        deadline = time.monotonic() + self.cancel_wait_s
        state = self.status(handle).state
        while not state.terminal and time.monotonic() < deadline:
            time.sleep(min(2.0, self.request_poll_s * 4))
            state = self.status(handle).state
        return state

    # ---- logs ----


def _check_local_path(field: str, path: str) -> None:
    """A local path that goes into the task: SkyPilot substitutes $VAR in file_mounts and workdir, and the YAML
    and shell carry it, so '$' and control characters are refused."""
    if "$" in path or CONTROL.search(path) or "\n" in path or "\t" in path:
        raise ValueError(f"{field}: {path!r} holds '$' or control characters, which SkyPilot's task cannot carry")
