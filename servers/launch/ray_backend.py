"""The Ray backend: a training job as a Ray job, submitted to a cluster's head through the Ray Jobs API.

`RayBackend(address)` talks to the Jobs API of a Ray head (the dashboard's HTTP address, e.g.
http://127.0.0.1:8265) through its REST endpoints (`RestJobsClient`, httpx: status, stop, logs, and submit), or
`ray.job_submission.JobSubmissionClient` for a submit that uploads a working_dir (the SDK packages it); ray is
imported only then, never at start-up (importing it costs every follower process about half a second). The five
steps of the `Backend` protocol (servers/engines/backend.py):

- ``plan(spec, settings, job_dir=None)``: no side effects. The command is torchrun of the recipe or script with
  its args, as `torchrun.torchrun_argv` builds it (``launcher="python"``: ``python SCRIPT ARGS`` for one rank),
  run by a small wrapper, `ray_entry.py` (servers/launch/ray_wrapper.py, with torchrun.py beside it for the
  rank-log mirror; standard library only), that submit writes into the job folder. Ray Jobs runs its entrypoint
  with a shell, so `rendered` (what Ray gets) is `argv` with every argument quoted by `shlex.quote`: each reaches
  the command literally, whatever shell syntax it holds. The plan (a `RayPlan`) also shows the runtime_env
  (env_vars: the spec's env, the metrics and checkpoint variables pointing into the job folder; working_dir only
  for a workdir inside the allowed roots) and the entrypoint's resources (entrypoint_num_cpus: one per rank;
  entrypoint_num_gpus: the spec's GPUs).
- ``submit(plan, request)``: `submit_job` with a submission id derived from `request.key`
  (`submission_id_for`), so a retried submit finds the job (`get_job_info`; the job folder is in its metadata).
  Idempotent on its own as well: when Ray knows that id, or the job folder holds the record of an earlier
  submit of it (Ray forgot the job), nothing is started and the same handle comes back. An unreachable address
  or a refused token is a `RayUnavailableError` that names the address and what to set; nothing is submitted.
- ``status``: `get_job_info` mapped with `RAY_STATES` (PENDING -> QUEUED, RUNNING, STOPPED ->
  CANCELLED, SUCCEEDED, FAILED; anything else -> LOST). A failed torchrun gets its root cause from the rank
  logs (`torchrun.describe_failure`). When Ray no longer knows the job (a restarted cluster forgets its jobs), the
  exit record the wrapper wrote (ray_exit.json) gives the exact end; without one the job is LOST, never
  SUCCEEDED.
- ``cancel``: `stop_job` (idempotent; a job already ended keeps its state). Ray cannot stop a job still PENDING
  (ray-project/ray#58353): the cancel is recorded in the job folder, the job is CANCELLED at once, and its wrapper
  ends without running the command if Ray ever starts it.
- logs: the wrapper writes them into the job folder (logs/rank<r>.log, copied from torchrun's per-rank files;
  logs/torchrun.log, torchrun's own output), where read_job_logs serves them.

The job folder (logs, metrics, checkpoints, the exit record) must be on a file system that the Ray node running
the entrypoint sees at the same path: true for a head on this machine, a shared file system otherwise.
"""

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from servers.core.jobfiles import BadJobFileError, atomic_write_json, open_regular, read_json
from servers.core.jobstore import JobState
from servers.core.paths import resolve_inside_roots
from servers.core.settings import Settings
from servers.engines.backend import (
    JOB_DIR_PLACEHOLDER,
    BackendHandle,
    BackendPlan,
    EngineStatus,
    SubmitRequest,
    map_state,
)
from servers.launch.options import given_options
from servers.launch.torchrun import (
    CHECKPOINT_ENV,
    LOG_DIR_NAME,
    METRICS_ENV,
    RUN_DIR_NAME,
    RUN_ID_PATTERN,
    attempt_dirs,
    describe_failure,
    last_exception_line,
    torchrun_argv,
)

ADDRESS_ENV = "RAY_ADDRESS"
ADDRESS_SETTING = "LLM_INFRA_MCP_RAY_ADDRESS"
JOB_DIR_ENV = "LLM_INFRA_MCP_JOB_DIR"
JOB_DIR_METADATA = "llm_infra_mcp_job_dir"
WRAPPER_NAME = "ray_entry.py"
EXIT_RECORD = "ray_exit.json"
SUBMIT_RECORD = "ray_submission.json"
CANCEL_RECORD = "ray_cancel.json"
LAUNCHERS = ("torchrun", "python")
MAX_NPROC = 1024
_REASON_CHARS = 2000

PENDING_CANCEL_NOTE = (
    "cancelled while it waited to start: Ray cannot stop a job still PENDING (ray-project/ray#58353), so it may stay "
    "in Ray's queue; if it ever starts, its wrapper sees the cancel and ends without running the command"
)

RAY_STATES: dict[str, JobState] = {
    "PENDING": JobState.QUEUED,
    "RUNNING": JobState.RUNNING,
    "STOPPED": JobState.CANCELLED,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
}

SHELL_NOTE = (
    "Ray Jobs runs the entrypoint with a shell (/bin/sh -c): `rendered` is argv with every argument quoted by "
    "shlex.quote, so each argument reaches the command literally (no expansion, no command substitution)"
)
NETWORK_NOTE = (
    "network: the Ray node's own; LLM_INFRA_MCP_JOB_NETWORK does not apply on Ray. torchrun's rendezvous store "
    "listens on the node's interfaces without authentication, like Ray's own ports: the Ray cluster's network "
    "must be trusted"
)


class RayUnavailableError(RuntimeError):
    """The Ray Jobs API cannot be used: ray is missing, no address is set, the address does not answer, or it
    refuses the token. The message says what was tried and what to set."""


# ---- the wrapper that runs on the Ray node -------------------------------------------------------------------------
# ray_wrapper.py, and torchrun.py beside it (the rank-log mirror it shares with the local and Slurm backends): both
# standard library only, written into the job folder by submit, so that the Ray node needs no llm-infra-mcp.
WRAPPER_FILES = {WRAPPER_NAME: "ray_wrapper.py", "torchrun.py": "torchrun.py"}  # name in the job folder: source


@functools.cache
def wrapper_sources() -> dict[str, str]:
    """The text of each file submit writes into the job folder, read once (the version this server runs)."""
    here = Path(__file__).parent
    return {name: (here / source).read_text() for name, source in WRAPPER_FILES.items()}


@functools.cache
def wrapper_sha256() -> str:
    """One digest of the wrapper's files (their names and texts), shown in the plan."""
    digest = hashlib.sha256()
    for name, text in sorted(wrapper_sources().items()):
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()


def write_wrapper(folder: Path) -> Path:
    """Write the wrapper's files into `folder`, each whole (a temporary file renamed); the wrapper's path."""
    for name, text in wrapper_sources().items():
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / name)
    return folder / WRAPPER_NAME


# ---- the plan --------------------------------------------------------------------------------------------------------
class RayPlan(BackendPlan):
    """A BackendPlan with what Ray's submit_job takes besides the entrypoint. Stored plans come back with
    `RayPlan.model_validate(stored)`."""

    runtime_env: dict[str, Any] = Field(description="Ray's runtime_env: env_vars (= env), working_dir if uploaded")
    entrypoint_num_cpus: float = Field(ge=0, description="CPUs Ray reserves for the entrypoint (one per rank)")
    entrypoint_num_gpus: float = Field(ge=0, description="GPUs Ray reserves for the entrypoint; Ray assigns them")
    metadata: dict[str, str] = Field(default_factory=dict, description="Ray job metadata (shown by Ray's tools)")
    max_wall_s: float | None = Field(default=None, description="Wall-time limit the wrapper enforces")
    launcher: str = Field(default="torchrun", description="torchrun, or python for one rank")

    def bind(self, job_dir: Path | str, gpus: list[int] | None = None) -> "RayPlan":
        """The plan with the job folder filled in, in runtime_env too. Ray assigns the GPUs itself (it sets
        CUDA_VISIBLE_DEVICES for the entrypoint), so `gpus` is only recorded."""
        bound = super().bind(job_dir, gpus)
        folder = str(job_dir)

        def sub(value: Any) -> Any:
            if isinstance(value, str):
                return value.replace(JOB_DIR_PLACEHOLDER, folder)
            if isinstance(value, dict):
                return {k: sub(v) for k, v in value.items()}
            if isinstance(value, list):
                return [sub(v) for v in value]
            return value

        # rendered is argv shell-quoted: quote the bound argv again (the folder may need quotes $JOB_DIR did not)
        return bound.model_copy(update={"runtime_env": sub(self.runtime_env), "rendered": shlex.join(bound.argv)})


def submission_id_for(key: str, prefix: str = "llm-infra-mcp") -> str:
    """The Ray submission id for an idempotency key: deterministic, and safe in Ray's URLs and file names."""
    readable = re.sub(r"[^A-Za-z0-9_-]", "_", key)[:48]
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{prefix}-{readable}-{digest}"


def normalise_address(address: str) -> str:
    """The Jobs API base URL for an address: http(s)://host:port as given, host:port gets http://. A Ray Client
    (ray://) or GCS address is refused with what to give instead."""
    text = address.strip().rstrip("/")
    if not text:
        raise RayUnavailableError(_no_address())
    if text.startswith("ray://") or text in ("auto", "local"):
        raise RayUnavailableError(
            f"Ray address {text!r} is not the Ray Jobs API: give the head's dashboard address, e.g. "
            f"http://127.0.0.1:8265 ({ADDRESS_SETTING} or {ADDRESS_ENV})"
        )
    if not re.match(r"^https?://", text):
        text = "http://" + text
    return text


def _no_address() -> str:
    return (
        f"no Ray address is set: set {ADDRESS_SETTING} (or {ADDRESS_ENV}) to the Ray Jobs API of the cluster's "
        "head, its dashboard address, e.g. http://127.0.0.1:8265"
    )


def resolve_token(explicit: str | None = None) -> str | None:
    """The token for a Ray cluster with token authentication: `explicit`, else $RAY_AUTH_TOKEN, else the file
    $RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token (where Ray's own tools look). None when there is none."""
    if explicit:
        return explicit.strip()
    env = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if env:
        return env
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()
    with contextlib.suppress(OSError):
        if path.is_file():
            text = path.read_text(errors="replace").strip()
            return text or None
    return None


@functools.lru_cache(maxsize=1)
def _client_class() -> type:
    """JobSubmissionClient with a timeout on every request (the SDK sets none, so a head that does not answer
    would hold a call forever). Built on first use: ray is imported here, not at start-up."""
    from ray.job_submission import JobSubmissionClient

    class TimedJobSubmissionClient(JobSubmissionClient):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, request_timeout_s: float = 30.0, **kwargs: Any) -> None:
            self._llm_infra_timeout = request_timeout_s
            super().__init__(*args, **kwargs)

        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", self._llm_infra_timeout)
            return super()._do_request(method, endpoint, **kwargs)

    return TimedJobSubmissionClient


class AuthenticationError(RuntimeError):
    """The Jobs API refused the token (HTTP 401/403); the name is the SDK's, which `_is_auth_error` recognises."""


@dataclasses.dataclass
class JobInfo:
    """The fields of Ray's JobDetails this backend reads (GET /api/jobs/<id>)."""

    status: str
    message: str | None = None
    error_type: str | None = None
    start_time: int | None = None
    end_time: int | None = None
    driver_exit_code: int | None = None
    metadata: dict[str, Any] | None = None
    runtime_env: dict[str, Any] | None = None
    entrypoint: str | None = None


class RestJobsClient:
    """Ray's Jobs REST API over httpx, for what this backend asks most (status, stop, logs, and a submit without
    a working_dir to upload): the SDK's calls with the SDK's conventions (RuntimeError "Request failed with
    status code N: ..."; AuthenticationError on 401/403; OSError when the head cannot be reached), without
    importing ray (about 0.5 s in every follower process). Endpoints: docs.ray.io, "Ray Jobs REST API"."""

    def __init__(self, address: str, *, headers: dict[str, str], request_timeout_s: float) -> None:
        import httpx

        self._httpx = httpx
        self._http = httpx.Client(base_url=address, headers=headers, timeout=request_timeout_s)
        version = self._request("GET", "/api/version")  # the SDK's connection check: is this a Jobs API?
        try:
            str(version.json()["ray_version"])
        except (ValueError, KeyError, TypeError):
            raise RuntimeError(
                f"Request to {address}/api/version answered HTTP {version.status_code}, not as a Jobs API"
            ) from None

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            reply = self._http.request(method, path, **kwargs)
        except self._httpx.TimeoutException as exc:
            raise TimeoutError(f"{method} {path}: {exc}") from exc
        except self._httpx.TransportError as exc:
            raise ConnectionError(f"{method} {path}: {exc}") from exc
        if reply.status_code in (401, 403):
            raise AuthenticationError(f"HTTP {reply.status_code}: {reply.text[:300]}")
        return reply

    def _ok(self, reply: Any) -> Any:
        if reply.status_code != 200:
            raise RuntimeError(f"Request failed with status code {reply.status_code}: {reply.text[:2000]}.")
        try:
            return reply.json()
        except ValueError:
            raise RuntimeError(f"Request failed with status code {reply.status_code}: not JSON") from None

    def submit_job(self, **request: Any) -> str:
        body = {k: v for k, v in request.items() if v is not None}
        return str(self._ok(self._request("POST", "/api/jobs/", json=body))["submission_id"])

    def get_job_info(self, sid: str) -> JobInfo:
        data = self._ok(self._request("GET", f"/api/jobs/{sid}"))
        if not isinstance(data, dict) or "status" not in data:
            raise RuntimeError("Request failed with status code 200: not a JobDetails answer.")
        fields = {f.name for f in dataclasses.fields(JobInfo)}
        return JobInfo(**{k: v for k, v in data.items() if k in fields})

    def stop_job(self, sid: str) -> bool:
        return bool(self._ok(self._request("POST", f"/api/jobs/{sid}/stop")).get("stopped"))


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status in the SDK's RuntimeError ("Request failed with status code 404: ...")."""
    match = re.search(r"status code (\d{3})", str(exc))
    return int(match.group(1)) if match else None


def _is_auth_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "AuthenticationError"


def _first_line(text: str | None, limit: int = 300) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line[:limit]


# ---- the backend ---------------------------------------------------------------------------------------------------
class RayBackend:
    """Training jobs on a Ray cluster through its Jobs API. See the module docstring.

    address: the Jobs API (the head's dashboard), e.g. http://127.0.0.1:8265; None: $RAY_ADDRESS (the server
    wires LLM_INFRA_MCP_RAY_ADDRESS here). auth_token: for a cluster with token authentication (Ray 2.60 turns it
    on by default); None: $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token, in that order; it is sent as
    `Authorization: Bearer ...` and never shown. python: the interpreter on the Ray node (default: this one,
    right for a head on this machine). jobs_dir: where submit makes job folders for plans not yet bound to one
    (default: <state dir>/jobs/ray).
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        auth_token: str | None = None,
        python: str | None = None,
        jobs_dir: Path | str | None = None,
        request_timeout_s: float = 30.0,
        probe_timeout_s: float = 5.0,
        cancel_wait_s: float = 15.0,
        id_prefix: str = "llm-infra-mcp",
    ) -> None:
        raw = address if address is not None else os.environ.get(ADDRESS_ENV)
        self.raw_address = raw.strip() if raw and raw.strip() else None
        self._auth_token = auth_token
        self.python = python or sys.executable
        self.jobs_dir = Path(jobs_dir) if jobs_dir is not None else None
        self.request_timeout_s = request_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.cancel_wait_s = cancel_wait_s
        self.id_prefix = id_prefix
        self._client_obj: Any = None
        self._lock = threading.Lock()
        self._submit_lock = threading.Lock()

    # ---- connection ----
    @property
    def address(self) -> str:
        """The Jobs API base URL. RayUnavailableError when none is set or it is not a Jobs API address."""
        if self.raw_address is None:
            raise RayUnavailableError(_no_address())
        return normalise_address(self.raw_address)

    def _headers(self) -> dict[str, str]:
        token = resolve_token(self._auth_token)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _unreachable(self, address: str, exc: BaseException, *, submitted: str = "nothing was submitted") -> str:
        kind = type(exc).__name__
        return (
            f"cannot reach the Ray Jobs API at {address} ({kind}); {submitted}. Start a Ray head whose dashboard "
            f"listens there (ray start --head --dashboard-port PORT) or set {ADDRESS_SETTING} (or {ADDRESS_ENV}) "
            "to the head's dashboard address, e.g. http://127.0.0.1:8265"
        )

    def _auth_message(self, address: str) -> str:
        have = "the token given was refused" if self._headers() else "no token was found"
        return (
            f"the Ray cluster at {address} requires token authentication and {have}: pass the cluster's token "
            "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token on this machine; `ray get-auth-token` on "
            "the head prints it)"
        )

    def _client(self, *, sdk: bool = False) -> Any:
        """A client of the address (made once; its constructor checks the connection): the REST client, or with
        `sdk` Ray's JobSubmissionClient (for a submit that uploads a working_dir: the SDK packages it)."""
        with self._lock:
            if self._client_obj is not None and (not sdk or not isinstance(self._client_obj, RestJobsClient)):
                return self._client_obj
            address = self.address
            if not ray_installed():
                raise RayUnavailableError(_ray_missing())
            try:
                cls = _client_class() if sdk else RestJobsClient
            except ImportError as exc:
                raise RayUnavailableError(f"{_ray_missing()} ({exc})") from exc
            try:
                client = cls(address, headers=self._headers(), request_timeout_s=self.request_timeout_s)
            except OSError as exc:  # ConnectionError, requests' errors and timeouts
                raise RayUnavailableError(self._unreachable(address, exc)) from exc
            except Exception as exc:
                if _is_auth_error(exc):
                    raise RayUnavailableError(self._auth_message(address)) from exc
                raise RayUnavailableError(
                    f"the Ray Jobs API at {address} did not answer as one: {_first_line(str(exc))}; set "
                    f"{ADDRESS_SETTING} (or {ADDRESS_ENV}) to the head's dashboard address"
                ) from exc
            self._client_obj = client
            return client

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A client call with its failures in words: RayUnavailableError for the connection and the token."""
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            with self._lock:
                self._client_obj = None
            raise RayUnavailableError(self._unreachable(self.address, exc, submitted=f"{what} did not happen")) from exc
        except Exception as exc:
            if _is_auth_error(exc):
                raise RayUnavailableError(self._auth_message(self.address)) from exc
            raise

    def _job_info(self, sid: str) -> Any | None:
        """Ray's JobDetails for a submission id, None when Ray does not know it."""
        client = self._client()
        try:
            return self._call("get_job_info", client.get_job_info, sid)
        except RuntimeError as exc:
            if isinstance(exc, RayUnavailableError):
                raise
            if _http_status(exc) == 404:
                return None
            raise RuntimeError(f"Ray get_job_info({sid}) failed: {_first_line(str(exc))}") from exc

    # ---- available ----
    def available(self) -> tuple[bool, str]:
        """ray installed, an address set, and the Jobs API answering there (with its version and the cluster's
        resources). Bounded by probe_timeout_s per request; starts nothing."""
        try:
            ray_version = importlib.metadata.version("ray")
        except importlib.metadata.PackageNotFoundError:
            return False, _ray_missing()
        if not ray_installed():
            return False, f"ray {ray_version} is installed without its Jobs SDK: {_ray_missing()}"
        try:
            address = self.address
        except RayUnavailableError as exc:
            return False, str(exc)
        import httpx

        headers = self._headers()
        try:
            reply = httpx.get(f"{address}/api/version", headers=headers, timeout=self.probe_timeout_s)
        except httpx.HTTPError as exc:
            return False, self._unreachable(address, exc, submitted="ray " + ray_version + " is installed")
        if reply.status_code in (401, 403):
            return False, self._auth_message(address)
        try:
            server = reply.json()
            server_version = str(server["ray_version"])
        except (ValueError, KeyError, TypeError):
            return False, (
                f"{address} answered HTTP {reply.status_code} but is not a Ray Jobs API; set {ADDRESS_SETTING} "
                f"(or {ADDRESS_ENV}) to the head's dashboard address"
            )
        resources = self._resources(address, headers)
        return True, f"ray {ray_version} here; Ray {server_version} at {address}; {resources}"

    def _resources(self, address: str, headers: dict[str, str]) -> str:
        """The cluster's CPUs and GPUs (alive nodes, the state API), with what is free when the autoscaler's load
        report has it. Bounded by probe_timeout_s per request."""
        import httpx

        try:
            reply = httpx.get(
                f"{address}/api/v0/nodes", params={"limit": 1000}, headers=headers, timeout=self.probe_timeout_s
            )
            nodes = [n for n in reply.json()["data"]["result"]["result"] if n.get("state") == "ALIVE"]
            totals = {
                name: sum(float((n.get("resources_total") or {}).get(name, 0)) for n in nodes)
                for name in ("CPU", "GPU")
            }
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return "cluster resources unknown (the dashboard's /api/v0/nodes did not answer)"
        usage: dict[str, Any] = {}
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            reply = httpx.get(f"{address}/api/cluster_status", headers=headers, timeout=self.probe_timeout_s)
            usage = reply.json()["data"]["clusterStatus"]["loadMetricsReport"]["usage"] or {}
        parts = []
        for name, total in totals.items():
            used = usage.get(name)
            free = f" ({total - float(used[0]):g} free)" if isinstance(used, list) and len(used) == 2 else ""
            parts.append(f"{total:g} {name}{free}")
        return f"cluster: {', '.join(parts)} on {len(nodes)} node(s)"

    # ---- plan ----
    def plan(
        self,
        spec: Mapping[str, Any],
        settings: Settings | None = None,
        *,
        job_dir: Path | None = None,
    ) -> RayPlan:
        """The exact entrypoint and submit_job arguments for a validated spec. No side effects (no files, no
        processes, no network). Without `job_dir`, paths in the job folder read `$JOB_DIR/...` (bind fills them)."""
        given_options(spec, "ray")  # the Ray backend takes none: a misplaced one is refused, naming its backend
        script = Path(str(spec["script"]))
        module = str(spec.get("module") or "")  # a framework's Ray driver (servers/launch/frameworks.py)
        if not module and not script.is_absolute():
            raise ValueError(f"script: the path must be absolute, got {str(script)!r}")
        args = spec.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError("args: must be a list of strings")
        nproc = int(spec.get("nproc_per_node") or 1)
        if not 1 <= nproc <= MAX_NPROC:
            raise ValueError(f"nproc_per_node: must be in [1, {MAX_NPROC}], got {nproc}")
        nnodes = int(spec.get("nnodes") or 1)
        if nnodes != 1 and not module:  # a driver's workers span the cluster's nodes
            raise ValueError(
                f"nnodes: the Ray backend runs torchrun inside one Ray job's entrypoint, on one node; got {nnodes}; "
                "accepted: 1"
            )
        max_restarts = int(spec.get("max_restarts") or 0)
        run_id = str(spec.get("run_id") or "run")
        if not RUN_ID_PATTERN.match(run_id):
            raise ValueError(f"run_id: bad value {run_id!r}: letters, digits, '_', '-' and '.' only, at most 96")
        user_env = dict(spec.get("env") or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in user_env.items()):
            raise ValueError("env: must map names to string values")
        if spec.get("gpus_per_node") is not None:
            gpus = int(spec["gpus_per_node"])
        elif spec.get("gpus_wanted") is not None:
            gpus = int(spec["gpus_wanted"])
        else:
            gpus = len(spec.get("gpus") or [])
        if gpus < 0:
            raise ValueError(f"gpus_per_node: must be >= 0, got {gpus}")
        if gpus and nproc > gpus:
            raise ValueError(f"nproc_per_node: {nproc} ranks need {nproc} GPUs, and the job is given {gpus}")
        launcher = "python" if module else str(spec.get("launcher") or "torchrun")
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher: {launcher!r} is not one; accepted: {', '.join(LAUNCHERS)}")
        if launcher == "python" and (nproc != 1 or max_restarts):
            raise ValueError("launcher: python runs one rank without restarts; use torchrun for more")
        wall = spec.get("max_wall_s")
        max_wall_s = float(wall) if wall is not None else None
        if max_wall_s is not None and max_wall_s <= 0:
            raise ValueError(f"max_wall_s: must be > 0, got {max_wall_s}")
        cap = spec.get("max_log_bytes")
        log_cap = int(cap) if isinstance(cap, int) and cap > 0 else 0

        folder = Path(str(job_dir)) if job_dir is not None else Path(JOB_DIR_PLACEHOLDER)
        workdir = spec.get("workdir")
        working_dir: Path | None = None
        if workdir:
            roots = (settings or Settings()).roots()
            working_dir = resolve_inside_roots(str(workdir), roots, what="workdir")
        notes: list[str] = [SHELL_NOTE]

        # The command, then the wrapper around it.
        if module:  # the driver runs alone; the framework's workers take the GPUs through its placement groups
            command, output, rank_logs = [self.python, "-m", module, *args], "rank0", ""
            notes.append(
                f"python -m {module}, a Ray driver ({module} must be importable by {self.python} on the Ray node); "
                f"its workers span {nnodes} node(s); its output as process rank0"
            )
        else:
            command, output, rank_logs = self._command(
                script, list(args), launcher, nproc, max_restarts, folder, run_id, working_dir, notes
            )
        cwd = "" if working_dir is not None else str(folder / RUN_DIR_NAME)
        argv = [
            self.python,
            str(folder / WRAPPER_NAME),
            "--job-dir",
            str(folder),
            "--cwd",
            cwd,
            "--max-wall-s",
            f"{max_wall_s:g}" if max_wall_s is not None else "0",
            "--log-cap",
            str(log_cap),
            "--output",
            output,
            "--rank-logs",
            rank_logs,
            "--",
            *command,
        ]

        env = dict(user_env)
        env[METRICS_ENV] = str(folder / "metrics.jsonl")
        env[CHECKPOINT_ENV] = str(folder / "checkpoints")
        env[JOB_DIR_ENV] = str(folder)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("OMP_NUM_THREADS", "1")
        if module:
            notes.append(
                f"the driver reserves no GPU (entrypoint_num_gpus 0): the framework's workers take {gpus} GPU(s) on "
                f"each of {nnodes} node(s) from the cluster"
            )
        elif gpus:
            notes.append(f"Ray reserves {gpus} GPU(s) for the entrypoint and sets CUDA_VISIBLE_DEVICES to them")
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
            notes.append("no GPU: CUDA_VISIBLE_DEVICES is empty, the ranks run on CPU (gloo)")
        notes.append(f"Ray reserves {nproc:g} CPU(s) for the entrypoint (entrypoint_num_cpus, one per rank)")
        runtime_env: dict[str, Any] = {"env_vars": dict(env)}
        if working_dir is not None:
            runtime_env["working_dir"] = str(working_dir)
            notes.append(
                f"working_dir {working_dir}: submit uploads it to the cluster (Ray's size limit applies) and the "
                "command runs in Ray's copy of it"
            )
        else:
            notes.append(f"working directory {folder / RUN_DIR_NAME} (a folder apart from the job's own files)")
        notes += self._notes(folder, max_wall_s, max_restarts, module=module)
        metadata = {"llm_infra_mcp_run_id": run_id}
        if spec.get("name"):
            metadata["name"] = str(spec["name"])[:128]
        key = spec.get("idempotency_key")
        if key:
            notes.append(f"Ray submission id {submission_id_for(str(key), self.id_prefix)} (from the idempotency key)")
        return RayPlan(
            backend=self.name,
            argv=argv,
            env=env,
            cwd=str(working_dir) if working_dir is not None else cwd,
            gpus=None,
            gpus_wanted=0,  # Ray assigns the GPUs (entrypoint_num_gpus); the server assigns none here
            nnodes=nnodes,
            nproc_per_node=nproc,
            rendered=shlex.join(argv),
            notes=notes,
            runtime_env=runtime_env,
            entrypoint_num_cpus=float(nproc),
            entrypoint_num_gpus=0.0 if module else float(gpus),
            metadata=metadata,
            max_wall_s=max_wall_s,
            launcher=launcher,
        )

    def _command(
        self,
        script: Path,
        args: list[str],
        launcher: str,
        nproc: int,
        max_restarts: int,
        folder: Path,
        run_id: str,
        working_dir: Path | None,
        notes: list[str],
    ) -> tuple[list[str], str, str]:
        """(the command the wrapper runs, the process its output is, torchrun's log folder or ""); `notes` says how
        the ranks run."""
        script_arg = str(script)
        if working_dir is not None and script.is_relative_to(working_dir):
            script_arg = str(script.relative_to(working_dir))  # runs from Ray's copy of the working_dir
        if launcher == "torchrun":
            log_dir = folder / LOG_DIR_NAME
            command = torchrun_argv(script, list(args), nproc, max_restarts, log_dir, run_id)
            command[0] = self.python
            command[len(command) - len(args) - 1] = script_arg
            output = "torchrun"
            rank_logs = str(log_dir)
            notes.append(
                f"{nproc} rank(s) under torchrun on one Ray node; per-rank logs as processes rank0..rank{nproc - 1} "
                "(copied from torchrun's files by the wrapper), torchrun's own output as process torchrun"
            )
        else:
            command = [self.python, script_arg, *args]
            output = "rank0"
            rank_logs = ""
            notes.append("one rank, run by python without torchrun (no RANK/WORLD_SIZE); its output as process rank0")
        return command, output, rank_logs

    def _notes(self, folder: Path, max_wall_s: float | None, max_restarts: int, *, module: str = "") -> list[str]:
        """What the Ray node must share with this machine, the wrapper, the limits, where the job goes."""
        notes: list[str] = []
        notes.append(
            f"the job folder {folder} must be on a file system the Ray node sees at the same path (true for a head "
            "on this machine; a shared file system otherwise): metrics (LLM_INFRA_MCP_METRICS), checkpoints "
            "(LLM_INFRA_MCP_CHECKPOINT_DIR), logs and the exit record are written there"
        )
        notes.append(
            f"{WRAPPER_NAME}: a fixed wrapper (servers/launch/ray_wrapper.py and torchrun.py beside it, standard "
            f"library only, sha256 {wrapper_sha256()[:16]}) that submit writes into the job folder; it runs the "
            "command after '--' (no shell), copies its logs, "
            + (f"ends it after max_wall_s {max_wall_s:g} s, " if max_wall_s else "")
            + f"and writes {EXIT_RECORD} when it ends"
        )
        if not module:  # a module's note says where it must be importable
            notes.append(f"the interpreter {self.python} and the script must exist at these paths on the Ray node")
        if max_wall_s is None:
            notes.append("no wall-time limit: the spec gives no max_wall_s")
        if max_restarts:
            notes.append(f"torchrun restarts all ranks in place up to {max_restarts} time(s) after a failure")
        notes.append(NETWORK_NOTE)
        if self.raw_address:
            notes.append(f"submits to the Ray Jobs API at {self.raw_address}")
        else:
            notes.append(f"no Ray address is set yet ({ADDRESS_SETTING} or {ADDRESS_ENV})")
        return notes

    # ---- submit ----
    def submission_id(self, key: str) -> str:
        return submission_id_for(key, self.id_prefix)

    def _folder_for(self, plan: RayPlan, sid: str, job_dir: Path | str | None) -> Path:
        if job_dir is not None:
            return Path(job_dir)
        named = plan.env.get(JOB_DIR_ENV, "")
        if named and JOB_DIR_PLACEHOLDER not in named:
            return Path(named)
        root = self.jobs_dir if self.jobs_dir is not None else Settings().jobs_dir / "ray"
        return root / sid

    def submit(self, plan: BackendPlan, request: SubmitRequest, *, job_dir: Path | str | None = None) -> BackendHandle:
        """Submit exactly the plan as a Ray job whose submission id is derived from request.key (so a retry
        finds it). Idempotent on its own too: the same key returns the first handle and starts nothing. The job
        folder: `job_dir`, else the one the plan was bound to, else jobs_dir/<submission id>."""
        if plan.backend != self.name:
            raise ValueError(f"plan: made by the {plan.backend!r} backend; make it with RayBackend.plan")
        try:
            ray_plan = plan if isinstance(plan, RayPlan) else RayPlan.model_validate(plan.model_dump())
        except ValueError as exc:  # a BackendPlan without the Ray fields
            raise ValueError("plan: not a Ray plan (runtime_env, entrypoint resources missing); use RayPlan") from exc
        sid = self.submission_id(request.key)
        folder = self._folder_for(ray_plan, sid, job_dir)
        folder = folder if folder.is_absolute() else folder.resolve()
        bound = ray_plan.bind(folder)
        self._check_plan(bound, folder)
        handle = BackendHandle(backend=self.name, key=request.key, native_id=sid, job_dir=str(folder))
        self._client()  # unreachable or refused: RayUnavailableError, before anything is written
        with self._submit_lock:
            return self._submit_once(bound, request, sid, folder, handle)

    def _submit_once(
        self, bound: RayPlan, request: SubmitRequest, sid: str, folder: Path, handle: BackendHandle
    ) -> BackendHandle:
        if self._job_info(sid) is not None:
            return handle
        record = folder / SUBMIT_RECORD
        earlier = read_json(record, 64 * 1024)
        if isinstance(earlier, dict) and earlier.get("submission_id") == sid:
            return handle  # submitted before and forgotten by Ray: never launched again on its own
        folder.mkdir(parents=True, exist_ok=True)
        write_wrapper(folder)
        atomic_write_json(
            record,
            {"submission_id": sid, "key": request.key, "address": self.address, "submitted_at": time.time()},
        )
        metadata = {**bound.metadata, "idempotency_key": request.key[:200], JOB_DIR_METADATA: str(folder)}
        client = self._client(sdk="working_dir" in bound.runtime_env)
        try:
            client.submit_job(
                entrypoint=bound.rendered,
                submission_id=sid,
                runtime_env=bound.runtime_env,
                metadata=metadata,
                entrypoint_num_cpus=bound.entrypoint_num_cpus,
                entrypoint_num_gpus=bound.entrypoint_num_gpus,
            )
        except OSError as exc:
            timeout = "Timeout" in type(exc).__name__ and "Connect" not in type(exc).__name__
            with self._lock:
                self._client_obj = None
            if timeout:  # the request went out: Ray may have the job; a retry with the same key finds it
                raise RayUnavailableError(
                    self._unreachable(
                        self.address, exc, submitted="the submit may have reached Ray: retry with the same key"
                    )
                ) from exc
            record.unlink(missing_ok=True)
            raise RayUnavailableError(self._unreachable(self.address, exc)) from exc
        except Exception as exc:
            if "already exists" in str(exc):  # a concurrent submit with the same key won
                return handle
            record.unlink(missing_ok=True)
            if _is_auth_error(exc):
                raise RayUnavailableError(self._auth_message(self.address)) from exc
            raise RuntimeError(f"Ray refused the job: {_first_line(str(exc), 500)}; nothing was submitted") from exc
        return handle

    def _check_plan(self, plan: RayPlan, folder: Path) -> None:
        """Refuse a plan whose parts disagree (edited after it was made): submit runs exactly what was shown."""
        if plan.rendered != shlex.join(plan.argv):
            raise ValueError("plan: rendered is not argv shell-quoted; make the plan again with RayBackend.plan")
        if plan.runtime_env.get("env_vars") != plan.env:
            raise ValueError("plan: runtime_env.env_vars differs from env; make the plan again with RayBackend.plan")
        if len(plan.argv) < 2 or plan.argv[1] != str(folder / WRAPPER_NAME):
            raise ValueError(f"plan: the entrypoint is not {WRAPPER_NAME} in the job folder {folder}")
        if JOB_DIR_PLACEHOLDER in plan.rendered or any(JOB_DIR_PLACEHOLDER in v for v in plan.env.values()):
            raise ValueError("plan: the job folder placeholder is still in it after binding")

    # ---- status ----
    def status(self, handle: BackendHandle) -> EngineStatus:
        """Ray's view of the job, mapped; when Ray does not know the job, the exit record; else LOST. Raises
        RayUnavailableError when Ray cannot be asked and the job left no exit record."""
        folder = Path(handle.job_dir) if handle.job_dir else None
        try:
            info = self._job_info(handle.native_id)
        except RayUnavailableError as exc:
            record = self._exit_record(folder)
            if record is not None:
                return self._from_record(record, folder, f"Ray cannot be asked ({_first_line(str(exc), 120)})")
            raise
        if info is None:
            record = self._exit_record(folder)
            if record is not None:
                return self._from_record(record, folder, "Ray no longer knows the job")
            where = f" and {folder} holds no {EXIT_RECORD}" if folder else ""
            return EngineStatus(
                state=JobState.LOST,
                native_state=None,
                reason=(
                    f"the Ray cluster at {self.address} does not know submission {handle.native_id} (a restarted "
                    f"cluster forgets its jobs){where}: how it ended is unknown"
                ),
            )
        native = str(getattr(info.status, "value", info.status))
        state = map_state(RAY_STATES, native)
        record = self._exit_record(folder) if state.terminal else None
        if state == JobState.QUEUED and self._cancel_requested(folder):
            return EngineStatus(state=JobState.CANCELLED, native_state=native, reason=PENDING_CANCEL_NOTE)
        if state == JobState.FAILED and record is not None and record.get("cancelled_before_start"):
            return EngineStatus(
                state=JobState.CANCELLED,
                native_state=native,
                reason="cancelled before it started: the wrapper did not run the command",
                started_at=info.start_time / 1000 if info.start_time else None,
                ended_at=info.end_time / 1000 if info.end_time else None,
            )
        started = info.start_time / 1000 if info.start_time else None
        ended = info.end_time / 1000 if info.end_time else None
        if state == JobState.FAILED and record is not None and _clean_exit(record):
            # Ray failed the job after the command ended well (its supervisor died, a record re-made after a
            # delete): the wrapper's record of the command's own exit is the exact end.
            return EngineStatus(
                state=JobState.SUCCEEDED,
                native_state=native,
                reason=f"the command exited with code 0 (exit record); Ray reported: {_first_line(info.message)}",
                exit_code=0,
                started_at=started or record.get("started_at"),
                ended_at=ended or record.get("ended_at"),
                restarts=self._restarts(record, folder),
            )
        exit_code = getattr(info, "driver_exit_code", None)  # older Ray lacks it: the record then
        if exit_code is None and record is not None:
            exit_code = record.get("exit_code")
        reason: str | None
        if state == JobState.FAILED:
            reason = self._failure_reason(record, folder, exit_code, info.message, getattr(info, "error_type", None))
        elif state == JobState.CANCELLED:
            reason = "stopped through Ray (stop_job)"
        elif state == JobState.QUEUED:
            reason = _first_line(info.message, _REASON_CHARS) or "waiting for Ray to start it"
        elif state == JobState.LOST:
            reason = f"Ray reports an unknown state {native!r}"
        else:
            reason = _first_line(info.message, _REASON_CHARS) or None
        return EngineStatus(
            state=state,
            native_state=native,
            reason=reason,
            exit_code=exit_code if isinstance(exit_code, int) else None,
            started_at=started,
            ended_at=ended,
            restarts=self._restarts(record, folder),
        )

    @staticmethod
    def _cancel_requested(folder: Path | None) -> bool:
        return folder is not None and (folder / CANCEL_RECORD).is_file()

    def _exit_record(self, folder: Path | None) -> dict[str, Any] | None:
        if folder is None:
            return None
        data = read_json(folder / EXIT_RECORD, 256 * 1024)
        if not isinstance(data, dict) or "ended_at" not in data:
            return None
        return data

    def _restarts(self, record: dict[str, Any] | None, folder: Path | None) -> int:
        if record is not None and isinstance(record.get("attempts"), int):
            return max(0, int(record["attempts"]) - 1)
        if folder is not None:
            return max(0, len(attempt_dirs(folder / LOG_DIR_NAME)) - 1)
        return 0

    def _from_record(self, record: dict[str, Any], folder: Path | None, why: str) -> EngineStatus:
        code = record.get("exit_code")
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        started = record.get("started_at") if isinstance(record.get("started_at"), int | float) else None
        ended = record.get("ended_at") if isinstance(record.get("ended_at"), int | float) else None
        cancelled = self._cancel_requested(folder)
        if record.get("cancelled_before_start"):
            state, reason = JobState.CANCELLED, f"{why}; cancelled before it started (the command never ran)"
        elif _clean_exit(record):
            state, reason = JobState.SUCCEEDED, f"{why}; its exit record says the command exited with code 0"
        elif cancelled:
            state, reason = JobState.CANCELLED, f"{why}; cancelled through this server, then ended (exit record)"
        else:
            state = JobState.FAILED
            reason = f"{why}; exit record: " + self._failure_reason(record, folder, code, None, None)
        return EngineStatus(
            state=state,
            native_state=None,
            reason=reason[:_REASON_CHARS],
            exit_code=code,
            started_at=started,
            ended_at=ended,
            restarts=self._restarts(record, folder),
        )

    def _failure_reason(
        self,
        record: dict[str, Any] | None,
        folder: Path | None,
        exit_code: int | None,
        message: str | None,
        error_type: str | None,
    ) -> str:
        ray_line = _first_line(message)
        if error_type:
            ray_line = f"{ray_line} ({error_type})" if ray_line else str(error_type)
        parts: list[str] = []
        if record is not None and record.get("timed_out"):
            parts.append("the wall-time limit (max_wall_s) was reached: the wrapper stopped the command")
        elif record is not None and record.get("stopped_by"):
            parts.append(f"stopped by {record['stopped_by']} (not a cancel through this server)")
        elif record is not None and record.get("error"):
            parts.append(f"the command could not start: {_first_line(str(record['error']))}")
        if folder is not None and not parts:
            log_dir = folder / LOG_DIR_NAME
            code = exit_code if exit_code is not None else 1
            if attempt_dirs(log_dir):
                parts.append(describe_failure(code, log_dir, folder / "logs" / "torchrun.log"))
            else:
                cause = last_exception_line(_tail(folder / "logs" / "rank0.log"))
                if cause:
                    parts.append(f"rank 0 failed (exit {code}): {cause}; see logs for process rank0")
        if ray_line:
            parts.append(f"Ray: {ray_line}")
        if not parts:
            parts.append(f"the entrypoint exited with code {exit_code}" if exit_code is not None else "failed")
        return "; ".join(parts)[:_REASON_CHARS]

    # ---- cancel ----
    def cancel(self, handle: BackendHandle) -> JobState:
        """Record the cancel in the job folder, stop_job, then wait up to cancel_wait_s for Ray to say it ended.
        A job that already ended keeps its state; a second cancel changes nothing. A job still waiting to start is
        CANCELLED at once: Ray cannot stop it, and its wrapper will not run the command (PENDING_CANCEL_NOTE)."""
        current = self.status(handle)
        if current.state.terminal:
            return current.state
        if handle.job_dir:
            with contextlib.suppress(OSError):
                atomic_write_json(Path(handle.job_dir) / CANCEL_RECORD, {"requested_at": time.time()})
        client = self._client()
        try:
            self._call("stop_job", client.stop_job, handle.native_id)
        except RuntimeError as exc:
            if isinstance(exc, RayUnavailableError) or _http_status(exc) != 404:
                raise
        deadline = time.monotonic() + self.cancel_wait_s
        state = self.status(handle).state
        while not state.terminal and time.monotonic() < deadline:
            time.sleep(0.2)
            state = self.status(handle).state
        return state

    # ---- logs ----


def _clean_exit(record: Mapping[str, Any]) -> bool:
    """An exit record of a command that exited with code 0 by itself (no wall-time stop, no signal)."""
    code = record.get("exit_code")
    return code == 0 and not isinstance(code, bool) and not record.get("timed_out") and not record.get("signal")


def _tail(path: Path, limit: int = 64 * 1024) -> str:
    try:
        with open_regular(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", errors="replace")
    except (OSError, BadJobFileError):
        return ""


def ray_installed() -> bool:
    """Whether ray and its Jobs SDK (requests, from ray[default]) can be imported; imports neither."""
    try:
        return importlib.util.find_spec("ray") is not None and importlib.util.find_spec("requests") is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken install
        return False


def _ray_missing() -> str:
    return "ray is not installed: pip install 'llm-infra-mcp[ray]' (ray[default], with its Jobs SDK)"
