"""The Kubernetes backend: a training job as a Kubeflow Trainer TrainJob (or a PyTorchJob), through the official
`kubernetes` Python client (the optional extra ``kubernetes``; imported only inside the methods that talk to a
cluster, never at start-up).

`KubernetesBackend(kubeconfig=None, context=None)` reads the user's kubeconfig (KUBECONFIG, else ~/.kube/config;
several files merged as kubectl merges them) and never writes it (the client's loader runs with
persist_config=False). The steps of the `Backend` protocol (servers/engines/backend.py):

- ``plan(spec, settings)``: no side effects and no network (the kubeconfig file is read to name the context, its
  server and its namespace). The manifest comes from k8s_manifests.py: a TrainJob of Kubeflow Trainer v2.3.0 on the
  ``torch-distributed`` ClusterTrainingRuntime (or ``spec.runtime``), or with ``k8s_kind: PyTorchJob`` a PyTorchJob
  of the Training Operator v1.9.3. `rendered` is its YAML; `argv` is the training container's command and args as
  they are in the manifest. The image is the spec's ``image``; there is no default.
- ``submit(plan, request)``: create the object, named after the idempotency key, labelled with its hash
  (`LABEL_KEY`), annotated with the key and this server's job id. Idempotent: an object of that name with that key
  is the job already submitted (409 AlreadyExists is answered by reading it); one with another key is refused.
  The plan is bound to its cluster: submit refuses when the kubeconfig's
  context now points elsewhere.
- ``status``: the object's conditions. TrainJob: Failed (e.g. DeadlineExceeded: the wall-time limit) ->
  FAILED, Complete -> SUCCEEDED, Suspended -> QUEUED (Kueue holds it); PyTorchJob: Succeeded, Failed, Suspended,
  Restarting/Running. Before that, the pods say where it is: none yet -> STARTING, unschedulable -> QUEUED with the
  scheduler's message, pulling or creating -> STARTING with the container's waiting reason (an image that cannot be
  pulled says so), running -> RUNNING; a pod without a reason in its status gets its newest Warning event. A failed
  job names the first failing node, its exit code and the last exception line of its log. A job the API no longer
  has is CANCELLED if this server deleted it, else what this backend last saw of it ended (k8s-state.json in the
  job folder), else LOST, never SUCCEEDED.
- ``cancel``: delete with propagationPolicy Foreground (the JobSet/pods go first, then the object), recorded in
  the job folder (k8s-cancel.json); a job that already ended keeps its state (and its pods' logs).
- ``sync_logs`` (the log_sync capability; the follower, engines/follow.py, calls it): each node's pod log (node
  rank r: a TrainJob's pod whose completion index is r; a PyTorchJob's Master is node0, Worker i is node<i+1>;
  container "node" or "pytorch") copied into the job folder as logs/node<r>.log while the job is followed, capped at
  max_log_bytes, so read_job_logs serves them, also after the pods are gone.

Tested against a stand-in API on 127.0.0.1 answering in the API's documented shapes (tests/test_k8s_backend.py),
not against a real cluster.
"""

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from servers.core.jobfiles import atomic_write_json, read_json
from servers.core.jobstore import JobState
from servers.core.settings import Settings
from servers.engines.backend import JOB_DIR_PLACEHOLDER, BackendHandle, BackendPlan, EngineStatus, SubmitRequest
from servers.launch import k8s_manifests as m
from servers.launch.options import Options, given_options

BACKEND_NAME = "kubernetes"
SUBMIT_RECORD = "k8s-submit.json"
STATE_RECORD = "k8s-state.json"
CANCEL_RECORD = "k8s-cancel.json"
LOG_RECORD = "k8s-logs.json"
PROPAGATION = "Foreground"
NODE_PROCESS = "node"  # the job folder's log of node rank r: node<r>
_REASON_CHARS = 2000
INSTALL_HINT = "pip install 'llm-infra-mcp[kubernetes]'"
DEADLINE_MESSAGE = "active longer than specified deadline"  # the Training Operator's failure message


class KubernetesUnavailableError(RuntimeError):
    """The API cannot be used: the client is missing, the kubeconfig is unusable, or the server does not answer.
    The message says what was tried."""


class KubernetesApiError(RuntimeError):
    """The API answered with an error status (403 Forbidden, 404 NotFound, 409 AlreadyExists, 422 Invalid...)."""

    def __init__(self, what: str, status: int, reason: str, message: str) -> None:
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{what}: {status} {reason}: {message}" if message else f"{what}: {status} {reason}")


K8S_IMAGE = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$"
K8S_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
K8S_RUNTIME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


class KubernetesOptions(Options):
    """The Kubernetes backend's options (a spec's `options`)."""

    image: str | None = Field(
        default=None, pattern=K8S_IMAGE, description="Required; needs torch (+llm-infra-mcp for recipes)"
    )
    namespace: str | None = Field(default=None, pattern=K8S_LABEL)
    queue: str | None = Field(default=None, pattern=K8S_LABEL, description="Kueue LocalQueue")
    runtime: str | None = Field(default=None, pattern=K8S_RUNTIME, description="Kubeflow ClusterTrainingRuntime")
    k8s_kind: Literal["TrainJob", "PyTorchJob"] | None = None


def plan_warnings(plan: BackendPlan, spec: Mapping[str, Any]) -> list[str]:
    """What a Kubernetes launch's plan warns of (its BackendInfo's plan_warnings): for a job asking for no GPU, what
    its pods get, read from the manifest planned, and what the job costs."""
    if spec.get("gpus_per_node"):
        return []
    node_hours = int(spec.get("nnodes") or 1) * float(spec.get("max_wall_s") or 0) / 3600
    runtime = (spec.get("options") or {}).get("runtime")
    return [no_gpu_warning(plan, runtime, node_hours)]


def no_gpu_warning(plan: BackendPlan, runtime: str | None, node_hours: float) -> str:
    """What the pods of a job that asks for no GPU get, read from the manifest planned, and what the job costs."""
    if plan.env.get("NVIDIA_VISIBLE_DEVICES") == "void":
        given = (
            "the pods get an nvidia.com/gpu limit of 0 and NVIDIA_VISIBLE_DEVICES=void: no GPU, whatever the "
            "runtime's template or the image say; the ranks run on CPU"
        )
    else:
        given = (
            "the pods get no nvidia.com/gpu limit ("
            + (
                f"unless the runtime {runtime!r} gives them some: its template decides"
                if runtime and runtime != "torch-distributed"
                else "the torch-distributed runtime sets none"
            )
            + "), so the scheduler counts none; on a GPU node whose default container runtime is NVIDIA's, an "
            "image that sets NVIDIA_VISIBLE_DEVICES=all (CUDA images do) still sees all of the node's GPUs"
        )
    return f"no GPU asked for: {given}. The cost is counted in node-hours ({node_hours:.3g})"


class KubernetesPlan(BackendPlan):
    """A BackendPlan with the manifest and the cluster it is bound to. Stored plans come back with
    `KubernetesPlan.model_validate(stored)`."""

    kind: str = Field(description="TrainJob or PyTorchJob")
    namespace: str
    object_name: str | None = Field(description="metadata.name; None until submit when the spec had no key")
    name_base: str = Field(description="The readable part of the name made at submit")
    manifest: dict[str, Any] = Field(description="What submit creates (rendered is its YAML)")
    context: str | None = Field(description="The kubeconfig context the plan was made for")
    server: str | None = Field(description="Its cluster's API server")
    job_dir: str = Field(default=JOB_DIR_PLACEHOLDER, description="The job folder (node logs, records)")
    max_log_bytes: int | None = None

    def bind(self, job_dir: Path | str, gpus: list[int] | None = None) -> "KubernetesPlan":
        """The plan with its job folder. The manifest is not touched: its '$' are Kubernetes' ($$ escapes,
        $(PET_*) references) and must not meet the placeholders' substitution."""
        return self.model_copy(update={"job_dir": str(job_dir), "gpus": list(gpus) if gpus is not None else self.gpus})


def kubernetes_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("kubernetes") is not None
    except (ImportError, ValueError):
        return False


def _network_reason(exc: BaseException) -> str:
    """What went wrong on the wire, in a few words: "[Errno 111] Connection refused", "read timed out"..."""
    import re

    inner: BaseException = exc
    while getattr(inner, "reason", None) is not None and isinstance(inner.reason, BaseException):
        inner = inner.reason
    text = str(inner)
    errno = re.search(r"\[Errno -?\d+\][^)\"']*", text)
    if errno:
        return errno.group(0).strip()
    if "timed out" in text.lower():
        return "timed out" + (" (connect)" if "connect" in text.lower() else " (read)")
    return type(inner).__name__ + (f": {_first_line(text, 200)}" if "Pool(" not in text else "")


def _first_line(text: Any, limit: int = 300) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0][:limit] if lines else ""


def _ts(value: Any) -> float | None:
    """An RFC 3339 time of the API as epoch seconds."""
    if not isinstance(value, str) or not value:
        return None
    from datetime import datetime

    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


def _given(spec: Mapping[str, Any], key: str, default: Any) -> Any:
    """spec[key], or `default` when it is absent or None (0 stays 0, and is refused if it is wrong)."""
    value = spec.get(key)
    return default if value is None else value


def parse_native_id(native_id: str) -> tuple[str, m.ManifestKind, str]:
    """(namespace, kind, name) of a handle's native id "<namespace>/<plural>/<name>"."""
    parts = native_id.split("/")
    if len(parts) != 3 or parts[1] not in m.KINDS_BY_PLURAL:
        raise ValueError(f"native_id: {native_id!r}; accepted: <namespace>/<trainjobs|pytorchjobs>/<name>")
    return parts[0], m.KINDS_BY_PLURAL[parts[1]], parts[2]


class KubernetesBackend:
    """Training jobs as TrainJobs or PyTorchJobs on the kubeconfig's cluster. See the module docstring."""

    name = BACKEND_NAME
    log_sync_s = 5.0

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        *,
        connect_timeout_s: float = 5.0,
        request_timeout_s: float = 30.0,
        cancel_wait_s: float = 15.0,
    ) -> None:
        self.kubeconfig = kubeconfig  # None: KUBECONFIG, else ~/.kube/config, read when needed
        self.context = context  # None: the kubeconfig's current context, pinned at the first call
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.cancel_wait_s = cancel_wait_s
        self._lock = threading.Lock()
        self._client: Any = None
        self._kube: m.KubeContext | None = None
        self._cancelled: set[str] = set()
        self._last_sync: dict[str, float] = {}

    # ---- kubeconfig and client ----
    def kube_context(self) -> m.KubeContext:
        files = [Path(p).expanduser() for p in self.kubeconfig.split(os.pathsep) if p] if self.kubeconfig else None
        return m.read_kubeconfig(files, self.context)

    def _api(self) -> Any:
        with self._lock:
            if self._client is not None:
                return self._client
            if not kubernetes_installed():
                raise KubernetesUnavailableError(f"the kubernetes Python client is not installed: {INSTALL_HINT}")
            kube = self.kube_context()
            if kube.problem:
                raise KubernetesUnavailableError(kube.problem)
            from kubernetes import client, config

            configuration = type.__call__(client.Configuration)  # a fresh one, not a copy of a process default
            configuration.retries = 0  # fail fast; the follower asks again
            try:
                config.load_kube_config(
                    config_file=kube.config_file,
                    context=kube.context,
                    client_configuration=configuration,
                    persist_config=False,  # never write the user's kubeconfig (token refreshes stay in memory)
                )
            except Exception as exc:  # the loader raises ConfigException and what exec plugins raise
                raise KubernetesUnavailableError(
                    f"the kubeconfig's context {kube.context!r} cannot be used: {_first_line(exc)}"
                ) from None
            self._client = client.ApiClient(configuration)
            self._kube = kube
            self.context = kube.context
            return self._client

    def _where(self) -> str:
        kube = self._kube
        return f"the Kubernetes API at {kube.server} (context {kube.context!r})" if kube else "the Kubernetes API"

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, raw: bool = False, **kwargs: Any) -> Any:
        """One API call: JSON (or bytes with `raw`) of the answer; KubernetesApiError for an error status,
        KubernetesUnavailableError when nothing answers."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        kwargs.setdefault("_request_timeout", (self.connect_timeout_s, self.request_timeout_s))
        try:
            response = fn(*args, _preload_content=False, **kwargs)
            data = response.data
        except ApiException as exc:
            raise _api_error(what, exc) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubernetesUnavailableError(
                f"{self._where()} does not answer ({what}): {_network_reason(exc)}"
            ) from None
        if raw:
            return data
        try:
            return json.loads(data) if data else {}
        except ValueError:
            raise KubernetesUnavailableError(f"{self._where()} sent no JSON for {what}") from None

    def _custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self._api())

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api())

    # ---- pre-flight ----
    def available(self) -> tuple[bool, str]:
        """Whether jobs can be launched on the kubeconfig's cluster: the API answers, the TrainJob or PyTorchJob
        API is served, the runtime exists, the namespace exists (and its GPU quota, where readable). A few short
        GETs; starts nothing."""
        if not kubernetes_installed():
            return False, f"the kubernetes Python client is not installed ({INSTALL_HINT})"
        kube = self.kube_context()
        if kube.problem:
            return False, kube.problem
        try:
            self._api()
            from kubernetes import client

            version = self._call("GET /version", client.VersionApi(self._api()).get_code)
        except KubernetesUnavailableError as exc:
            return False, str(exc)
        except KubernetesApiError as exc:
            return False, f"{self._where()} refused the credentials of the kubeconfig: {exc}"
        parts = [f"context {kube.context!r}, server {kube.server} (Kubernetes {version.get('gitVersion', '?')})"]
        try:
            groups = self._call("GET /apis", client.ApisApi(self._api()).get_api_versions)
        except (KubernetesUnavailableError, KubernetesApiError) as exc:
            return False, "; ".join([*parts, f"API groups not readable: {exc}"])
        served = {g.get("name") for g in groups.get("groups") or [] if isinstance(g, dict)}
        kinds = []
        for kind in (m.TRAINJOB, m.PYTORCHJOB):
            resources = self._resources(kind.group, kind.version) if kind.group in served else set()
            if kind.plural in resources:
                kinds.append(kind.kind)
                parts.append(f"{kind.kind} API served ({kind.api_version})")
            else:
                parts.append(f"{kind.kind} API not served ({kind.plural}.{kind.group}/{kind.version} missing)")
        if m.TRAINJOB.kind in kinds:
            parts.append(self._runtime_note(m.DEFAULT_RUNTIME))
        parts.append("Kueue installed" if "kueue.x-k8s.io" in served else "no Kueue (kueue.x-k8s.io not served)")
        namespace_ok, note = self._namespace_note(kube.namespace)
        parts.append(note)
        ok = bool(kinds) and namespace_ok
        return ok, "; ".join(parts)

    def _resources(self, group: str, version: str) -> set[str]:
        try:
            listed = self._call(f"GET /apis/{group}/{version}", self._custom().get_api_resources, group, version)
        except (KubernetesUnavailableError, KubernetesApiError):
            return set()
        return {r.get("name") for r in listed.get("resources") or [] if isinstance(r, dict)}

    def _runtime_note(self, runtime: str) -> str:
        what = f"ClusterTrainingRuntime {runtime}"
        try:
            self._call(
                f"GET {what}",
                self._custom().get_cluster_custom_object,
                m.TRAINJOB.group,
                m.TRAINJOB.version,
                m.RUNTIME_PLURAL,
                runtime,
            )
        except KubernetesApiError as exc:
            if exc.status == 404:
                return f"{what} missing (install Trainer's runtimes, or name one with spec.runtime)"
            return f"{what} not readable ({exc.status} {exc.reason})"
        except KubernetesUnavailableError as exc:
            return f"{what} not checked: {exc}"
        return f"{what} present"

    def _namespace_note(self, namespace: str) -> tuple[bool, str]:
        core = self._core()
        try:
            self._call(f"GET namespace {namespace}", core.read_namespace, namespace)
        except KubernetesApiError as exc:
            if exc.status == 404:
                return False, f"namespace {namespace} does not exist"
            note = f"namespace {namespace} (not readable: {exc.status} {exc.reason})"
        except KubernetesUnavailableError as exc:
            return False, f"namespace {namespace} not checked: {exc}"
        else:
            note = f"namespace {namespace}"
        try:
            quotas = self._call(f"GET resourcequotas in {namespace}", core.list_namespaced_resource_quota, namespace)
        except (KubernetesApiError, KubernetesUnavailableError):
            return True, f"{note}; its quota is not readable"
        gpu = []
        for quota in quotas.get("items") or []:
            status = quota.get("status") or {}
            hard, used = status.get("hard") or {}, status.get("used") or {}
            for resource, limit in hard.items():
                if m.GPU_RESOURCE in resource:
                    gpu.append(f"{resource} {used.get(resource, '0')} of {limit} used")
        if gpu:
            return True, f"{note}; GPU quota: {', '.join(gpu)}"
        return True, f"{note}; no GPU quota" if quotas.get("items") is not None else note

    # ---- plan ----
    def plan(self, spec: Mapping[str, Any], settings: Settings | None = None) -> KubernetesPlan:
        """The manifest for a validated spec. No side effects; no network (the kubeconfig is read)."""
        if spec.get("workdir"):
            raise ValueError(
                "workdir: not on kubernetes (the container starts in the image's working directory); accepted: none"
            )
        script = str(spec.get("script") or "")
        recipe = spec.get("recipe")
        target = ["-m", f"servers.launch.recipes.{Path(script).stem}"] if recipe else [script]
        options = given_options(spec, BACKEND_NAME)  # image, namespace, queue...: KubernetesOptions' names
        kube = self.kube_context()
        kind = str(options.get("k8s_kind") or m.DEFAULT_KIND)
        key = spec.get("idempotency_key") or None
        base = str(spec.get("name") or recipe or Path(script).stem or "job")
        name = m.object_name(base, key) if key else None
        nproc = int(_given(spec, "nproc_per_node", 1))
        gpus = int(_given(spec, "gpus_per_node", 0))
        shape = m.JobShape(
            kind=kind,
            namespace=str(options.get("namespace") or kube.namespace),
            image=str(options.get("image") or ""),
            target=target,
            args=[str(a) for a in spec.get("args") or []],
            nnodes=int(_given(spec, "nnodes", 1)),
            nproc_per_node=nproc,
            gpus_per_node=gpus,
            max_wall_s=float(_given(spec, "max_wall_s", 3600.0)),
            max_restarts=int(_given(spec, "max_restarts", 0)),
            env={str(k): str(v) for k, v in (spec.get("env") or {}).items()},
            queue=options.get("queue") or None,
            runtime=options.get("runtime") or None,
            name=name,
            key=key,
            run_id=spec.get("run_id") or None,
        )
        manifest = m.render(shape)
        if kind == m.TRAINJOB.kind:
            container = manifest["spec"]["trainer"]
        else:
            container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env") or []}
        notes = self._notes(shape, kube, recipe, script)
        return KubernetesPlan(
            backend=BACKEND_NAME,
            argv=[*container["command"], *container["args"]],
            env=env,
            cwd="(the image's working directory)",
            nnodes=shape.nnodes,
            nproc_per_node=nproc,
            gpus_wanted=gpus,
            rendered=m.to_yaml(manifest),
            notes=notes,
            kind=kind,
            namespace=shape.namespace,
            object_name=name,
            name_base=base,
            manifest=manifest,
            context=kube.context,
            server=kube.server,
            max_log_bytes=int(spec["max_log_bytes"]) if spec.get("max_log_bytes") else None,
        )

    @staticmethod
    def _notes(shape: m.JobShape, kube: m.KubeContext, recipe: Any, script: str) -> list[str]:
        kind = m.KINDS[shape.kind]
        project = "Kubeflow Trainer" if kind is m.TRAINJOB else "the Kubeflow Training Operator"
        where = (
            f"on kubeconfig context {kube.context!r} (server {kube.server})"
            if not kube.problem
            else f"with no usable kubeconfig ({kube.problem}): submit fails until there is one"
        )
        notes = [
            f"a {kind.kind} ({kind.api_version}, the schema of {project} {kind.release}) in namespace "
            f"{shape.namespace}, {where}",
        ]
        if recipe:
            notes.append(
                f"the image {shape.image} must hold torch (torchrun on PATH) and llm-infra-mcp: the recipe runs as "
                f"`torchrun ... {' '.join(shape.target)}`; this server copies nothing into the pods"
            )
        else:
            notes.append(
                f"the script must exist in the image {shape.image} at {script} (the path it has here), with torch "
                "and torchrun on PATH: this server copies nothing into the pods (bake the script into the image"
                + (", or mount it through a runtime of your own, spec.runtime)" if kind is m.TRAINJOB else ")")
            )
        controller = "the runtime's torch plugin" if kind is m.TRAINJOB else "the Training Operator"
        notes.append(
            f"torchrun takes nodes, ranks per node, node rank and the master's address from the PET_* variables "
            f"{controller} injects (Kubernetes expands $(PET_...) in args); every '$' of the job's args and env "
            "values is doubled ($$, Kubernetes' escape) so that it reaches the job literally"
        )
        deadline = m.deadline_seconds(shape.max_wall_s)
        if kind is m.TRAINJOB:
            notes.append(
                f"activeDeadlineSeconds {deadline} (max_wall_s): Trainer counts it from the TrainJob's creation, or "
                "from its resume when it was suspended (waiting in a Kueue queue does not count; image pulls and "
                "scheduling do); past it the job fails (DeadlineExceeded) and its JobSet and pods are deleted"
            )
        else:
            notes.append(
                f"runPolicy.activeDeadlineSeconds {deadline} (max_wall_s): the Training Operator counts it from the "
                "job's startTime; past it the job fails and its pods are deleted"
            )
        if shape.queue:
            notes.append(
                f"Kueue: labelled {m.QUEUE_LABEL}={shape.queue} and created suspended; it starts when Kueue admits "
                "it to that LocalQueue"
            )
        notes.append(
            "metrics and checkpoints are not collected: the pods do not see this machine's job folder, so "
            "LLM_INFRA_MCP_METRICS and LLM_INFRA_MCP_CHECKPOINT_DIR are not set; each node's pod log is copied to "
            "the job folder as process node<rank> while the job is followed"
        )
        if shape.name is None:
            notes.append(
                "metadata.name and the key label and annotation are set at submit from the idempotency key; the "
                f"{m.ANNOTATION_JOB} annotation from this server's job id"
            )
        else:
            notes.append(f"the {m.ANNOTATION_JOB} annotation is set at submit from this server's job id")
        notes.append(f"cancel_job deletes the {kind.kind} with propagationPolicy {PROPAGATION} (its pods go first)")
        return notes

    # ---- submit ----
    def _check_plan(self, plan: KubernetesPlan) -> None:
        """Refuse a plan whose parts disagree (edited after it was made): submit creates exactly what was shown."""
        if plan.kind not in m.KINDS:
            raise ValueError(f"plan: kind {plan.kind!r}; accepted: {', '.join(m.KINDS)}")
        if plan.rendered is None or yaml.safe_load(plan.rendered) != plan.manifest:
            raise ValueError("plan: rendered is not the manifest's YAML; make the plan again")
        meta = plan.manifest.get("metadata") or {}
        kind = m.KINDS[plan.kind]
        if plan.manifest.get("kind") != kind.kind or plan.manifest.get("apiVersion") != kind.api_version:
            raise ValueError("plan: the manifest's kind or apiVersion differs from the plan's; make the plan again")
        if meta.get("namespace") != plan.namespace:
            raise ValueError("plan: the manifest's namespace differs from the plan's; make the plan again")
        container = (
            plan.manifest["spec"]["trainer"]
            if kind is m.TRAINJOB
            else plan.manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        )
        if [*container.get("command", []), *container.get("args", [])] != plan.argv:
            raise ValueError("plan: argv is not the manifest's command and args; make the plan again")

    def _bound_client(self, plan: KubernetesPlan) -> None:
        """The client for the plan's cluster; refused when the kubeconfig's context now points elsewhere."""
        if self.context is None and self._client is None:
            self.context = plan.context
        self._api()
        kube = self._kube
        assert kube is not None
        if (kube.context, kube.server) != (plan.context, plan.server):
            raise ValueError(
                f"the plan was made for context {plan.context!r} (server {plan.server}); the kubeconfig now gives "
                f"context {kube.context!r} (server {kube.server}): make the plan again"
            )

    def submit(self, plan: BackendPlan, request: SubmitRequest) -> BackendHandle:
        """Create exactly the plan's object, named after request.key (idempotent). See the module docstring."""
        if not isinstance(plan, KubernetesPlan):
            plan = KubernetesPlan.model_validate(plan.model_dump())
        self._check_plan(plan)
        kind = m.KINDS[plan.kind]
        name = m.object_name(plan.name_base, request.key)
        if plan.object_name is not None and plan.object_name != name:
            raise ValueError(
                f"plan: made for the idempotency key whose name is {plan.object_name}; this submit's key gives {name}"
            )
        folder = Path(plan.job_dir) if JOB_DIR_PLACEHOLDER not in plan.job_dir else None
        job_id = folder.name if folder is not None else None
        body = m.with_identity(plan.manifest, name=name, key=request.key, job_id=job_id)
        self._bound_client(plan)
        handle = BackendHandle(
            backend=BACKEND_NAME,
            key=request.key,
            native_id=f"{plan.namespace}/{kind.plural}/{name}",
            job_dir=str(folder) if folder is not None else None,
        )
        submitted = self._read_record(folder, SUBMIT_RECORD, handle.native_id)
        if (
            submitted is not None
            and submitted.get("key") == request.key
            and self._get(plan.namespace, kind, name) is None
        ):
            # This folder's job was created once already and its object is gone (a TTL, a delete): the job ended or
            # was lost there, and `status` says which from the records. Creating it again would run it twice.
            return handle
        what = f"create {kind.kind} {plan.namespace}/{name}"
        try:
            created = self._call(
                what,
                self._custom().create_namespaced_custom_object,
                kind.group,
                kind.version,
                plan.namespace,
                kind.plural,
                body,
            )
        except KubernetesUnavailableError as exc:
            raise KubernetesUnavailableError(
                f"{exc}; if the request reached the API the object exists: a retry with the same key finds it"
            ) from None
        except KubernetesApiError as exc:
            if exc.status != 409:
                raise RuntimeError(_refusal(kind, plan.namespace, exc)) from None
            created = self._get(plan.namespace, kind, name)
            if created is None:
                raise RuntimeError(f"{what}: 409 AlreadyExists, then not found; retry") from None
            theirs = ((created.get("metadata") or {}).get("annotations") or {}).get(m.ANNOTATION_KEY)
            if theirs != request.key:
                raise RuntimeError(
                    f"a {kind.kind} named {name} already exists in {plan.namespace} and was not made for this "
                    "idempotency key; nothing was created"
                ) from None
        if folder is not None:
            meta = created.get("metadata") or {}
            with contextlib.suppress(OSError):
                atomic_write_json(
                    folder / SUBMIT_RECORD,
                    {
                        "native_id": handle.native_id,
                        "uid": meta.get("uid"),
                        "context": plan.context,
                        "server": plan.server,
                        "key": request.key,
                        "max_log_bytes": plan.max_log_bytes,
                        "nnodes": plan.nnodes,
                        "submitted_at": time.time(),
                    },
                )
        return handle

    def _get(self, namespace: str, kind: m.ManifestKind, name: str) -> dict[str, Any] | None:
        try:
            return self._call(
                f"get {kind.kind} {namespace}/{name}",
                self._custom().get_namespaced_custom_object,
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                name,
            )
        except KubernetesApiError as exc:
            if exc.status == 404:
                return None
            raise

    # ---- status ----
    def status(self, handle: BackendHandle) -> EngineStatus:
        """The object's conditions mapped (and its pods before it ends); see the module docstring. Raises
        KubernetesUnavailableError / KubernetesApiError when the API cannot be asked."""
        namespace, kind, name = parse_native_id(handle.native_id)
        folder = Path(handle.job_dir) if handle.job_dir else None
        obj = self._get(namespace, kind, name)
        if obj is None:
            return self._gone(handle, folder, f"the {kind.kind} {namespace}/{name} no longer exists")
        meta = obj.get("metadata") or {}
        conditions = {
            c.get("type"): c
            for c in (obj.get("status") or {}).get("conditions") or []
            if isinstance(c, dict) and c.get("status") == "True"
        }
        if meta.get("deletionTimestamp") and self._cancel_requested(handle, folder):
            # before the conditions: pods ended by the deletion may make the controller mark the job Failed
            return EngineStatus(
                state=JobState.CANCELLED,
                native_state="Deleting",
                reason=f"deleted through this server (propagationPolicy {PROPAGATION}): its pods are going",
            )
        ended = self._ended(kind, conditions)
        if ended is not None:
            state, native, condition = ended
            status = self._ended_status(namespace, kind, name, obj, state, native, condition)
            self._record(handle, folder, status)
            return status
        pods_note = "being deleted, not by this server" if meta.get("deletionTimestamp") else ""
        suspended = conditions.get("Suspended")
        spec = obj.get("spec") or {}
        suspend = spec.get("suspend") if kind is m.TRAINJOB else (spec.get("runPolicy") or {}).get("suspend")
        if suspended is not None or (suspend and not pods_note):
            queue = (meta.get("labels") or {}).get(m.QUEUE_LABEL)
            why = (
                f"suspended: waiting for Kueue to admit it to the LocalQueue {queue}"
                if queue
                else "suspended (spec.suspend)"
            )
            if suspended is not None and suspended.get("message"):
                why += f" ({_first_line(suspended['message'], 200)})"
            return EngineStatus(state=JobState.QUEUED, native_state="Suspended", reason=why)
        status = self._from_pods(namespace, kind, name, obj)
        if pods_note:
            status.reason = f"{pods_note}; {status.reason}" if status.reason else pods_note
        if kind is m.PYTORCHJOB and "Restarting" in conditions:
            status.native_state = "Restarting"
            status.reason = _first_line(conditions["Restarting"].get("message"), _REASON_CHARS) or status.reason
        return status

    @staticmethod
    def _ended(kind: m.ManifestKind, conditions: Mapping[str, Any]) -> tuple[JobState, str, dict[str, Any]] | None:
        if "Failed" in conditions:
            return JobState.FAILED, "Failed", conditions["Failed"]
        done = "Complete" if kind is m.TRAINJOB else "Succeeded"
        if done in conditions:
            return JobState.SUCCEEDED, done, conditions[done]
        return None

    def _ended_status(
        self,
        namespace: str,
        kind: m.ManifestKind,
        name: str,
        obj: Mapping[str, Any],
        state: JobState,
        native: str,
        condition: Mapping[str, Any],
    ) -> EngineStatus:
        reason_word = str(condition.get("reason") or native)
        message = _first_line(condition.get("message"), 500)
        ended = _ts(condition.get("lastTransitionTime"))
        try:
            pods = self._pods(namespace, kind, name)
        except (KubernetesApiError, KubernetesUnavailableError):
            pods = {}
        started = _earliest_start(pods)
        restarts = max((_restarts(p) for p in pods.values()), default=0)
        if state is JobState.SUCCEEDED:
            return EngineStatus(
                state=state,
                native_state=f"{native} ({reason_word})",
                reason=message or None,
                exit_code=0,
                started_at=started,
                ended_at=ended,
                restarts=restarts,
            )
        deadline = (obj.get("spec") or {}).get("activeDeadlineSeconds") or (
            (obj.get("spec") or {}).get("runPolicy") or {}
        ).get("activeDeadlineSeconds")
        parts = []
        if reason_word == "DeadlineExceeded" or DEADLINE_MESSAGE in message:
            parts.append(
                f"the wall-time limit was reached (activeDeadlineSeconds {deadline}, from max_wall_s): the "
                f"{kind.kind} was ended ({reason_word})"
            )
        else:
            parts.append(f"{reason_word}: {message}" if message else reason_word)
        exit_code = None
        failing = _first_failed(pods, kind)
        if failing is not None:
            rank, pod, terminated = failing
            exit_code = terminated.get("exitCode") if isinstance(terminated.get("exitCode"), int) else None
            pod_name = (pod.get("metadata") or {}).get("name")
            parts.append(
                f"node {rank} (pod {pod_name}) exited with code {exit_code} ({terminated.get('reason') or 'Error'})"
            )
            cause = self._last_exception(namespace, pod_name, kind.container)
            if cause:
                parts.append(f"{cause}; see logs for process {NODE_PROCESS}{rank}")
        return EngineStatus(
            state=state,
            native_state=f"{native} ({reason_word})",
            reason="; ".join(parts)[:_REASON_CHARS],
            exit_code=exit_code,
            started_at=started,
            ended_at=ended,
            restarts=restarts,
        )

    def _last_exception(self, namespace: str, pod: str | None, container: str) -> str | None:
        from servers.launch.torchrun import last_exception_line

        if not pod:
            return None
        try:
            data = self._call(
                f"log of pod {pod}",
                self._core().read_namespaced_pod_log,
                pod,
                namespace,
                container=container,
                tail_lines=200,
                raw=True,
            )
        except (KubernetesApiError, KubernetesUnavailableError):
            return None
        return last_exception_line(bytes(data).decode("utf-8", errors="replace"))

    def _from_pods(self, namespace: str, kind: m.ManifestKind, name: str, obj: Mapping[str, Any]) -> EngineStatus:
        pods = self._pods(namespace, kind, name)
        spec = obj.get("spec") or {}
        if kind is m.TRAINJOB:
            nnodes = int((spec.get("trainer") or {}).get("numNodes") or 1)
        else:
            nnodes = sum(int((r or {}).get("replicas") or 1) for r in (spec.get("pytorchReplicaSpecs") or {}).values())
        restarts = max((_restarts(p) for p in pods.values()), default=0)
        started = _earliest_start(pods)
        if not pods:
            controller = "Trainer and JobSet are" if kind is m.TRAINJOB else "the Training Operator is"
            event = self._warning(namespace, kind.kind, name)
            reason = f"no pods yet: {controller} creating them" + (f"; {event}" if event else "")
            return EngineStatus(state=JobState.STARTING, native_state="Created", reason=reason, restarts=restarts)
        phases = {rank: str((p.get("status") or {}).get("phase") or "Unknown") for rank, p in pods.items()}
        running = sum(1 for phase in phases.values() if phase in ("Running", "Succeeded"))
        if running >= nnodes:
            return EngineStatus(
                state=JobState.RUNNING,
                native_state="Running",
                reason=f"{nnodes} node(s) running" if nnodes > 1 else None,
                started_at=started,
                restarts=restarts,
            )
        waiting: list[str] = []
        unschedulable = False
        for rank, pod in sorted(pods.items()):
            if phases[rank] != "Pending":
                continue
            why, queued = _pending_reason(pod)
            unschedulable = unschedulable or queued
            if why is None:
                why = self._warning(namespace, "Pod", (pod.get("metadata") or {}).get("name"))
            waiting.append(f"node {rank}: {why or 'pending'}")
        ready = f"{running} of {nnodes} node(s) running"
        reason = "; ".join([ready, *waiting])[:_REASON_CHARS]
        if running:
            return EngineStatus(
                state=JobState.RUNNING, native_state="Running", reason=reason, started_at=started, restarts=restarts
            )
        state = JobState.QUEUED if unschedulable else JobState.STARTING
        return EngineStatus(state=state, native_state="Pending", reason=reason, restarts=restarts)

    def _pods(self, namespace: str, kind: m.ManifestKind, name: str) -> dict[int, dict[str, Any]]:
        """The newest pod of each node rank."""
        if kind is m.TRAINJOB:
            selector = f"{m.JOBSET_NAME_LABEL}={name},{m.JOBSET_REPLICATED_JOB_LABEL}={m.TRAINER_REPLICATED_JOB}"
        else:
            selector = f"{m.PTJ_NAME_LABEL}={name}"
        listed = self._call(
            f"list pods of {name}", self._core().list_namespaced_pod, namespace, label_selector=selector
        )
        newest: dict[int, dict[str, Any]] = {}
        for pod in listed.get("items") or []:
            rank = node_rank(pod, kind)
            if rank is None:
                continue
            stamp = _ts((pod.get("metadata") or {}).get("creationTimestamp")) or 0.0
            current = newest.get(rank)
            if current is None or stamp >= (_ts((current.get("metadata") or {}).get("creationTimestamp")) or 0.0):
                newest[rank] = pod
        return newest

    def _warning(self, namespace: str, kind: str, name: str | None) -> str | None:
        """The newest Warning event of an object, in words; None when there is none (or events are not readable)."""
        if not name:
            return None
        selector = f"involvedObject.kind={kind},involvedObject.name={name}"
        try:
            listed = self._call(
                f"events of {name}", self._core().list_namespaced_event, namespace, field_selector=selector
            )
        except (KubernetesApiError, KubernetesUnavailableError):
            return None
        warnings = [e for e in listed.get("items") or [] if e.get("type") == "Warning"]
        if not warnings:
            return None

        def when(event: Mapping[str, Any]) -> float:
            return _ts(event.get("lastTimestamp")) or _ts(event.get("eventTime")) or 0.0

        event = max(warnings, key=when)
        return f"{event.get('reason')}: {_first_line(event.get('message'), 300)}"

    # ---- records in the job folder ----
    @staticmethod
    def _read_record(folder: Path | None, name: str, native_id: str) -> dict[str, Any] | None:
        """A record of this backend in the job folder, if it is about this object."""
        data = read_json(folder / name, 256 * 1024) if folder is not None else None
        return data if isinstance(data, dict) and data.get("native_id") == native_id else None

    def _record(self, handle: BackendHandle, folder: Path | None, status: EngineStatus) -> None:
        if folder is None or self._read_record(folder, STATE_RECORD, handle.native_id) is not None:
            return
        with contextlib.suppress(OSError):
            atomic_write_json(
                folder / STATE_RECORD,
                {**status.model_dump(mode="json"), "native_id": handle.native_id, "seen_at": time.time()},
            )

    def _cancel_requested(self, handle: BackendHandle, folder: Path | None) -> bool:
        return (
            handle.native_id in self._cancelled
            or self._read_record(folder, CANCEL_RECORD, handle.native_id) is not None
        )

    def _gone(self, handle: BackendHandle, folder: Path | None, what: str) -> EngineStatus:
        recorded = self._read_record(folder, STATE_RECORD, handle.native_id)
        if recorded is not None:
            with contextlib.suppress(ValueError):
                fields = set(EngineStatus.model_fields)
                status = EngineStatus.model_validate({k: v for k, v in recorded.items() if k in fields})
                status.reason = f"{what}; as this server last saw it: {status.reason or status.state.value}"
                return status
        if self._cancel_requested(handle, folder):
            return EngineStatus(
                state=JobState.CANCELLED, native_state="Deleted", reason=f"{what}: deleted through this server"
            )
        return EngineStatus(
            state=JobState.LOST,
            native_state=None,
            reason=f"{what} (deleted by someone else, or removed after it ended) and this server never saw it end: "
            "how it ended is unknown",
        )

    # ---- cancel ----
    def cancel(self, handle: BackendHandle) -> JobState:
        """Delete the object (propagationPolicy Foreground) and wait up to cancel_wait_s for it to go. A job that
        already ended keeps its state; a second cancel changes nothing."""
        current = self.status(handle)
        if current.state.terminal:
            return current.state
        namespace, kind, name = parse_native_id(handle.native_id)
        self._cancelled.add(handle.native_id)
        if handle.job_dir:
            with contextlib.suppress(OSError):
                atomic_write_json(
                    Path(handle.job_dir) / CANCEL_RECORD, {"native_id": handle.native_id, "requested_at": time.time()}
                )
        try:
            self._call(
                f"delete {kind.kind} {namespace}/{name}",
                self._custom().delete_namespaced_custom_object,
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                name,
                propagation_policy=PROPAGATION,
            )
        except KubernetesApiError as exc:
            if exc.status != 404:
                self._cancelled.discard(handle.native_id)
                if handle.job_dir:
                    (Path(handle.job_dir) / CANCEL_RECORD).unlink(missing_ok=True)
                raise RuntimeError(_refusal(kind, namespace, exc, verb="delete")) from None
        deadline = time.monotonic() + self.cancel_wait_s
        while time.monotonic() < deadline:
            if self._get(namespace, kind, name) is None:
                break
            time.sleep(0.5)
        return self.status(handle).state

    # ---- logs ----
    def _pod_log(self, namespace: str, pod: Mapping[str, Any], kind: m.ManifestKind, limit: int) -> bytes:
        name = (pod.get("metadata") or {}).get("name")
        try:
            data = self._call(
                f"log of pod {name}",
                self._core().read_namespaced_pod_log,
                name,
                namespace,
                container=kind.container,
                limit_bytes=max(1, limit),
                raw=True,
            )
        except KubernetesApiError as exc:
            if exc.status in (400, 404):  # the container has not started, or the pod is gone
                return b""
            raise
        return bytes(data)

    def sync_logs(self, handle: BackendHandle, job_dir: Path | str, *, final: bool = False) -> None:
        """Copy what each node's pod log gained into job_dir/logs/node<r>.log (at most every log_sync_s, and once
        more at the end), all logs together at most max_log_bytes. A new pod or a restarted container of a node
        starts a new section, marked. Errors are left for the next call."""
        now = time.monotonic()
        if not final and now - self._last_sync.get(handle.native_id, 0.0) < self.log_sync_s:
            return
        self._last_sync[handle.native_id] = now
        folder = Path(job_dir)
        try:
            namespace, kind, name = parse_native_id(handle.native_id)
            pods = self._pods(namespace, kind, name)
        except (KubernetesApiError, KubernetesUnavailableError, ValueError):
            return
        record = read_json(folder / LOG_RECORD, 1024 * 1024)
        state: dict[str, Any] = record if isinstance(record, dict) else {}
        submitted = read_json(folder / SUBMIT_RECORD, 256 * 1024)
        cap = submitted.get("max_log_bytes") if isinstance(submitted, dict) else None
        cap = int(cap) if isinstance(cap, int) and cap > 0 else None
        written = int(state.get("written") or 0)
        nodes: dict[str, Any] = dict(state.get("nodes") or {})
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for rank, pod in sorted(pods.items()):
            process = f"{NODE_PROCESS}{rank}"
            uid = (pod.get("metadata") or {}).get("uid")
            count = _container_restarts(pod, kind.container)
            seen = nodes.get(process) or {}
            copied = int(seen.get("copied") or 0)
            marker = b""
            if seen and (seen.get("pod") != uid or seen.get("restarts") != count):
                pod_name = (pod.get("metadata") or {}).get("name")
                marker = f"----- llm-infra-mcp: pod {pod_name} (restart {count}) -----\n".encode()
                copied = 0
            if cap is not None and written >= cap:
                if not state.get("cut"):
                    note = (
                        f"\n----- llm-infra-mcp: log cut here: the job's logs reached {cap} bytes (max_log_bytes) "
                        "-----\n"
                    )
                    with open(logs / f"{process}.log", "ab") as f:
                        f.write(note.encode())
                    state["cut"] = True
                continue
            room = None if cap is None else cap - written
            try:
                data = self._pod_log(namespace, pod, kind, copied + (room if room is not None else 1 << 30))
            except (KubernetesApiError, KubernetesUnavailableError):
                continue
            new = data[copied:]
            if not final:
                new = new[: new.rfind(b"\n") + 1]  # whole lines while it runs
            if room is not None:
                new = new[:room]
            if new or marker or not (logs / f"{process}.log").exists():
                with open(logs / f"{process}.log", "ab") as f:
                    f.write(marker + new)
            written += len(new)
            nodes[process] = {"pod": uid, "restarts": count, "copied": copied + len(new)}
        state.update(nodes=nodes, written=written)
        with contextlib.suppress(OSError):
            atomic_write_json(folder / LOG_RECORD, state)


def node_rank(pod: Mapping[str, Any], kind: m.ManifestKind) -> int | None:
    """A pod's node rank: a TrainJob's pod's completion index (= PET_NODE_RANK); a PyTorchJob's Master 0, Worker
    i i+1 (the operator's RANK and PET_NODE_RANK)."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if kind is m.TRAINJOB:
        value = annotations.get(m.COMPLETION_INDEX, labels.get(m.COMPLETION_INDEX))
        return int(value) if isinstance(value, str) and value.isdigit() else None
    role, index = labels.get(m.PTJ_TYPE_LABEL), labels.get(m.PTJ_INDEX_LABEL)
    if not isinstance(index, str) or not index.isdigit():
        return None
    if role == "master":
        return int(index)
    if role == "worker":
        return int(index) + 1
    return None


def _earliest_start(pods: Mapping[int, Mapping[str, Any]]) -> float | None:
    starts = [_ts((p.get("status") or {}).get("startTime")) for p in pods.values()]
    return min((t for t in starts if t), default=None)


def _container_restarts(pod: Mapping[str, Any], container: str) -> int:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return int(status.get("restartCount") or 0)
    return 0


def _restarts(pod: Mapping[str, Any]) -> int:
    label = ((pod.get("metadata") or {}).get("labels") or {}).get(m.JOBSET_RESTART_LABEL)
    attempt = int(label) if isinstance(label, str) and label.isdigit() else 0
    counts = [int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses") or []]
    return max([attempt, *counts])


def _pending_reason(pod: Mapping[str, Any]) -> tuple[str | None, bool]:
    """(why a pending pod waits, in the API's words; whether it waits for a node, i.e. is unschedulable)."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            word = condition.get("reason") or "Unschedulable"
            return f"{word}: {_first_line(condition.get('message'), 400)}", word == "Unschedulable"
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            message = _first_line(waiting.get("message"), 400)
            return (f"{waiting['reason']}: {message}" if message else str(waiting["reason"])), False
    return None, False


def _first_failed(pods: Mapping[int, Mapping[str, Any]], kind: m.ManifestKind) -> tuple[int, Any, Any] | None:
    """(node rank, pod, terminated state) of the node whose training container exited non-zero first (by its
    finishedAt; the lowest rank among equals): the others often fail after it because their peers went."""
    failed = []
    for rank, pod in pods.items():
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != kind.container:
                continue
            state, last = status.get("state") or {}, status.get("lastState") or {}
            terminated = state.get("terminated") or last.get("terminated")
            if terminated and terminated.get("exitCode") not in (0, None):
                failed.append((_ts(terminated.get("finishedAt")) or float("inf"), rank, pod, terminated))
    if not failed:
        return None
    _, rank, pod, terminated = min(failed, key=lambda f: (f[0], f[1]))
    return rank, pod, terminated


def _api_error(what: str, exc: Any) -> KubernetesApiError:
    """One line from an ApiException: the Status body's reason and message (never the raw dump)."""
    status = int(getattr(exc, "status", 0) or 0)
    reason = str(getattr(exc, "reason", "") or "")
    message = ""
    body = getattr(exc, "body", None)
    if body is None and getattr(exc, "data", None) is not None:
        body = exc.data
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str) and body:
        try:
            data = json.loads(body)
        except ValueError:
            message = _first_line(body)
        else:
            if isinstance(data, dict):
                reason = str(data.get("reason") or reason)
                message = _first_line(data.get("message"), 500)
    return KubernetesApiError(what, status, reason, message)


def _refusal(kind: m.ManifestKind, namespace: str, exc: KubernetesApiError, verb: str = "create") -> str:
    if exc.status == 404 and verb == "create":
        return (
            f"the API does not serve {kind.plural}.{kind.group}/{kind.version} in namespace {namespace} "
            f"({kind.kind} not installed?); nothing was created"
        )
    if exc.status in (401, 403):
        return f"Kubernetes refused to {verb} the {kind.kind} in namespace {namespace}: {exc.reason}: {exc.message}"
    done = "; nothing was created" if verb == "create" else ""
    return f"Kubernetes refused to {verb} the {kind.kind} in namespace {namespace}: {exc}{done}"
