"""Kubernetes manifests for a training job, rendered offline: a Kubeflow Trainer TrainJob or a PyTorchJob.

Pure functions (pyyaml and the standard library): the plan step calls them with no cluster, no client and no
network. What they produce is validated in the tests against the CRD schemas of the releases named here
(tests/fixtures/k8s/README.md says where the schemas come from).

- **TrainJob** (``trainer.kubeflow.org/v1alpha1``, Kubeflow Trainer **v2.3.0**): ``spec.runtimeRef`` names a
  ClusterTrainingRuntime (``torch-distributed`` by default), ``spec.trainer`` holds image, command, args, env,
  numNodes, numProcPerNode and resourcesPerNode (``nvidia.com/gpu`` limits: 0 for a job without GPUs, see
  `NO_GPU_ENV`), ``spec.activeDeadlineSeconds`` the wall-time limit (the field exists from v2.2 on; v2.1 has
  none). The runtime's torch plugin injects PET_NNODES,
  PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT into the trainer container ("node").
- **PyTorchJob** (``kubeflow.org/v1``, the Training Operator's last v1 release **v1.9.3**): one Master replica and
  nnodes - 1 Workers, container "pytorch", ``runPolicy.activeDeadlineSeconds``; the operator injects the same
  PET_* variables.

The container runs ``torchrun`` with ``--nnodes=$(PET_NNODES) --nproc-per-node=$(PET_NPROC_PER_NODE)
--node-rank=$(PET_NODE_RANK) --master-addr=$(PET_MASTER_ADDR) --master-port=$(PET_MASTER_PORT)``: Kubernetes
replaces each ``$(NAME)`` of a container's command, args and env values by that variable of the container. So that
the job's own arguments and env values reach it literally, every ``$`` in them is doubled (``$$`` is Kubernetes'
escape for ``$``): see `escape`.

Identity: the object's name is derived from the idempotency key (`object_name`), its labels carry a hash of the key
(`LABEL_KEY`, what `find` selects by) and the run id, its annotations the key itself and, set at submit, this
server's job id. With a Kueue queue the object carries ``kueue.x-k8s.io/queue-name`` and is created suspended, as
Kubeflow's Kueue example does: Kueue unsuspends it when it admits it.
"""

import copy
import hashlib
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TRAINER_RELEASE = "v2.3.0"  # kubeflow/trainer: the TrainJob CRD the manifests are validated against
TRAINING_OPERATOR_RELEASE = "v1.9.3"  # kubeflow/training-operator (now kubeflow/trainer, tag v1.9.3): PyTorchJob


@dataclass(frozen=True)
class ManifestKind:
    """One kind of training object: where it lives in the API and how its pods are found."""

    kind: str
    group: str
    version: str
    plural: str
    container: str  # the training container's name in its pods
    release: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


TRAINJOB = ManifestKind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", "node", TRAINER_RELEASE)
PYTORCHJOB = ManifestKind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", "pytorch", TRAINING_OPERATOR_RELEASE)
KINDS: dict[str, ManifestKind] = {k.kind: k for k in (TRAINJOB, PYTORCHJOB)}
KINDS_BY_PLURAL: dict[str, ManifestKind] = {k.plural: k for k in (TRAINJOB, PYTORCHJOB)}
DEFAULT_KIND = "TrainJob"
DEFAULT_RUNTIME = "torch-distributed"
RUNTIME_KIND = "ClusterTrainingRuntime"
RUNTIME_PLURAL = "clustertrainingruntimes"
GPU_RESOURCE = "nvidia.com/gpu"
# A job that asks for no GPU says so: an explicit limit (and request) of 0, which replaces whatever GPUs the
# ClusterTrainingRuntime's template asks for, and NVIDIA_VISIBLE_DEVICES=void, which tells NVIDIA's container runtime
# to give the container no GPU even where it is the node's default runtime and the image sets
# NVIDIA_VISIBLE_DEVICES=all (CUDA images do). The job cannot undo it: NVIDIA_* is not on the env allow-list.
NO_GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "void"}
PYTORCHJOB_PORT_NAME = "pytorchjob-port"  # the operator's default port (pytorch_types.go); set explicitly here
PYTORCHJOB_PORT = 23456

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "llm-infra-mcp"
LABEL_KEY = "llm-infra-mcp/key-hash"
LABEL_RUN = "llm-infra-mcp/run-id"
ANNOTATION_KEY = "llm-infra-mcp/idempotency-key"
ANNOTATION_JOB = "llm-infra-mcp/job-id"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# In a plan made without an idempotency key, what the name and key label say until submit knows the key.
SET_AT_SUBMIT = "(set at submit from the idempotency key)"

# Pods: how each kind's controller labels them (JobSet for TrainJob; the Training Operator for PyTorchJob).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
TRAINER_REPLICATED_JOB = "node"  # the torch-distributed runtime's replicated job (and container) name
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # = PET_NODE_RANK of a TrainJob's pod
PTJ_NAME_LABEL = "training.kubeflow.org/job-name"
PTJ_TYPE_LABEL = "training.kubeflow.org/replica-type"
PTJ_INDEX_LABEL = "training.kubeflow.org/replica-index"

# Validation of what reaches a manifest (the spec's fields have the same patterns; checked again here).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # RFC 1123 label: namespaces
NAME_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # RFC 1035 label: the TrainJob CEL rule on metadata.name
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}")
IMAGE_ACCEPTED = "an image reference such as registry.example.com/team/train:1.0 or name@sha256:... (no spaces)"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_NAME_BASE = 30
MAX_DEADLINE_S = 30 * 86400


def escape(text: str) -> str:
    """`text` as Kubernetes passes it on literally in a command, args or env value: every ``$`` doubled. Kubernetes
    expands ``$(NAME)`` there and turns ``$$`` into ``$`` (k8s.io/kubernetes third_party/forked/golang/expansion),
    so after expansion the container sees exactly `text`."""
    return text.replace("$", "$$")


def key_hash(key: str) -> str:
    """The label value for an idempotency key (keys may hold ':' and be 128 long; label values may not)."""
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def object_name(base: str | None, key: str) -> str:
    """The object's name for an idempotency key: a readable part from `base` (the job's name, recipe or script)
    and a hash of the key. An RFC 1035 label of at most 41 characters, so that the pods' names and hostnames the
    controllers derive from it (``<name>-node-0-0``) stay within 63."""
    slug = re.sub(r"[^a-z0-9]+", "-", (base or "").lower()).strip("-")[:MAX_NAME_BASE].strip("-")
    if not slug or not slug[0].isalpha():
        slug = ("job-" + slug)[:MAX_NAME_BASE].strip("-")
    return f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def deadline_seconds(max_wall_s: float) -> int:
    """activeDeadlineSeconds for a wall-time limit: whole seconds, rounded up, at least 1."""
    if not 0 < max_wall_s <= MAX_DEADLINE_S:
        raise ValueError(f"max_wall_s: {max_wall_s:g} s; accepted: more than 0, at most {MAX_DEADLINE_S} s")
    return max(1, math.ceil(max_wall_s))


PET_ARGS = (
    "--nnodes=$(PET_NNODES)",
    "--nproc-per-node=$(PET_NPROC_PER_NODE)",
    "--node-rank=$(PET_NODE_RANK)",
    "--master-addr=$(PET_MASTER_ADDR)",
    "--master-port=$(PET_MASTER_PORT)",
)


def torchrun_command(target: Sequence[str], args: Sequence[str], max_restarts: int) -> tuple[list[str], list[str]]:
    """(command, args) of the training container: torchrun with the PET_* rendezvous of the controller, then
    `target` (``-m MODULE`` or a script path) and the job's args, escaped."""
    if max_restarts < 0:
        raise ValueError(f"max_restarts: {max_restarts}; accepted: 0 or more")
    return ["torchrun"], [
        *PET_ARGS,
        f"--max-restarts={max_restarts}",
        *(escape(t) for t in target),
        *(escape(a) for a in args),
    ]


@dataclass
class JobShape:
    """Everything a manifest is rendered from (validated by `check`)."""

    kind: str
    namespace: str
    image: str
    target: list[str]  # ["-m", "servers.launch.recipes.tiny_gpt"] or [script path]
    args: list[str]
    nnodes: int
    nproc_per_node: int
    gpus_per_node: int
    max_wall_s: float
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    queue: str | None = None
    runtime: str | None = None
    name: str | None = None  # None: set at submit (no idempotency key yet)
    key: str | None = None
    run_id: str | None = None

    def check(self) -> None:
        """ValueError, one line per problem ("field: what is wrong; accepted: ..."), for what cannot be rendered."""
        problems = []
        if self.kind not in KINDS:
            problems.append(f"k8s_kind: {self.kind!r}; accepted: {', '.join(KINDS)}")
        if not self.image:
            problems.append(
                "image: missing; the kubernetes backend needs the container image the pods run (with torch, and "
                "llm-infra-mcp for a bundled recipe); there is no default"
            )
        elif not IMAGE.fullmatch(self.image):
            problems.append(f"image: {self.image!r}; accepted: {IMAGE_ACCEPTED}")
        if len(self.namespace) > 63 or not DNS_LABEL.fullmatch(self.namespace):
            problems.append(f"namespace: {self.namespace!r}; accepted: an RFC 1123 label (a-z, 0-9, '-'; at most 63)")
        if self.queue is not None and (len(self.queue) > 63 or not DNS_LABEL.fullmatch(self.queue)):
            problems.append(f"queue: {self.queue!r}; accepted: a Kueue LocalQueue name (a-z, 0-9, '-'; at most 63)")
        if self.runtime is not None:
            if self.kind != TRAINJOB.kind:
                problems.append("runtime: a ClusterTrainingRuntime of a TrainJob; accepted with k8s_kind TrainJob only")
            elif len(self.runtime) > 253 or not DNS_SUBDOMAIN.fullmatch(self.runtime):
                problems.append(f"runtime: {self.runtime!r}; accepted: a ClusterTrainingRuntime name (DNS subdomain)")
        if not 1 <= self.nnodes <= 64:
            problems.append(f"nnodes: {self.nnodes}; accepted: 1 to 64")
        if not 1 <= self.nproc_per_node <= 64:
            problems.append(f"nproc_per_node: {self.nproc_per_node}; accepted: 1 to 64")
        if not 0 <= self.gpus_per_node <= 64:
            problems.append(f"gpus_per_node: {self.gpus_per_node}; accepted: 0 to 64")
        if self.name is not None and (len(self.name) > 63 or not NAME_1035.fullmatch(self.name)):
            problems.append(f"name: {self.name!r}; accepted: an RFC 1035 label of at most 63")
        if self.run_id is not None and (len(self.run_id) > 63 or not LABEL_VALUE.fullmatch(self.run_id)):
            problems.append(f"run_id: {self.run_id!r}; accepted: a label value")
        for name in self.env:
            if not ENV_NAME.fullmatch(name):
                problems.append(f"env: {name!r}; accepted: a letter or '_', then letters, digits and '_'")
        if not self.target:
            problems.append("script: nothing to run")
        if problems:
            raise ValueError("\n".join(problems))
        deadline_seconds(self.max_wall_s)


def _metadata(shape: JobShape) -> dict[str, Any]:
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_KEY: key_hash(shape.key) if shape.key else SET_AT_SUBMIT}
    if shape.run_id:
        labels[LABEL_RUN] = shape.run_id
    if shape.queue:
        labels[QUEUE_LABEL] = shape.queue
    return {
        "name": shape.name or SET_AT_SUBMIT,
        "namespace": shape.namespace,
        "labels": labels,
        "annotations": {ANNOTATION_KEY: shape.key or SET_AT_SUBMIT},
    }


def _env(shape: JobShape, *, unbuffered: bool) -> list[dict[str, str]]:
    env = [{"name": k, "value": escape(v)} for k, v in shape.env.items() if k not in NO_GPU_ENV]
    if not shape.gpus_per_node:
        env += [{"name": k, "value": v} for k, v in NO_GPU_ENV.items()]
    if unbuffered:  # Python's output reaches the pod log as it is written (the PyTorchJob operator sets it itself)
        env.append({"name": "PYTHONUNBUFFERED", "value": "1"})
    return env


def render(shape: JobShape) -> dict[str, Any]:
    """The manifest (a plain dict, as the API takes it) of `shape`. ValueError when `shape` is not valid."""
    shape.check()
    command, args = torchrun_command(shape.target, shape.args, shape.max_restarts)
    if shape.gpus_per_node:
        resources = {"limits": {GPU_RESOURCE: shape.gpus_per_node}}
    else:  # explicit: no GPU from the runtime's template either
        resources = {"limits": {GPU_RESOURCE: 0}, "requests": {GPU_RESOURCE: 0}}
    deadline = deadline_seconds(shape.max_wall_s)
    if shape.kind == TRAINJOB.kind:
        trainer: dict[str, Any] = {
            "image": shape.image,
            "command": command,
            "args": args,
            "env": _env(shape, unbuffered=True),
            "numNodes": shape.nnodes,
            "numProcPerNode": shape.nproc_per_node,
        }
        trainer["resourcesPerNode"] = resources
        spec: dict[str, Any] = {
            "runtimeRef": {
                "apiGroup": TRAINJOB.group,
                "kind": RUNTIME_KIND,
                "name": shape.runtime or DEFAULT_RUNTIME,
            },
            "trainer": trainer,
            "activeDeadlineSeconds": deadline,
        }
        if shape.queue:
            spec["suspend"] = True
        return {"apiVersion": TRAINJOB.api_version, "kind": TRAINJOB.kind, "metadata": _metadata(shape), "spec": spec}
    container: dict[str, Any] = {
        "name": PYTORCHJOB.container,
        "image": shape.image,
        "command": command,
        "args": args,
        "ports": [{"name": PYTORCHJOB_PORT_NAME, "containerPort": PYTORCHJOB_PORT}],
    }
    env = _env(shape, unbuffered=False)
    if env:
        container["env"] = env
    container["resources"] = resources

    def replica(count: int) -> dict[str, Any]:  # each replica its own copy (the YAML has no anchors then)
        spec = {"containers": [copy.deepcopy(container)]}
        return {"replicas": count, "restartPolicy": "Never", "template": {"spec": spec}}

    replicas = {"Master": replica(1)}
    if shape.nnodes > 1:
        replicas["Worker"] = replica(shape.nnodes - 1)
    run_policy: dict[str, Any] = {"activeDeadlineSeconds": deadline}
    if shape.queue:
        run_policy["suspend"] = True
    return {
        "apiVersion": PYTORCHJOB.api_version,
        "kind": PYTORCHJOB.kind,
        "metadata": _metadata(shape),
        "spec": {"nprocPerNode": str(shape.nproc_per_node), "runPolicy": run_policy, "pytorchReplicaSpecs": replicas},
    }


def with_identity(manifest: Mapping[str, Any], *, name: str, key: str, job_id: str | None) -> dict[str, Any]:
    """The manifest with what submit fills in: its name and key label (from the idempotency key), the key
    annotation, and this server's job id. Nothing else changes."""
    bound = copy.deepcopy(dict(manifest))
    metadata = bound["metadata"]
    metadata["name"] = name
    metadata["labels"][LABEL_KEY] = key_hash(key)
    metadata["annotations"][ANNOTATION_KEY] = key
    if job_id:
        metadata["annotations"][ANNOTATION_JOB] = job_id
    return bound


# What YAML reads as a line break besides \n (NEL U+0085, LS U+2028, PS U+2029) and the other characters PyYAML's
# emitter may write raw (C0 and C1 controls, DEL, BOM, surrogates, non-characters): a string holding one is written
# double-quoted, where each is an escape (\N, \L, \P, \x..), so that yaml.safe_load gives back exactly the string.
YAML_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff\ufffe\uffff]")


class _ExactDumper(yaml.SafeDumper):
    """yaml.safe_dump's output, but a string holding a character of `YAML_UNSAFE` is written double-quoted."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if YAML_UNSAFE.search(data):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    return dumper.represent_str(data)


_ExactDumper.add_representer(str, _represent_str)


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """The manifest as YAML, in its own key order; yaml.safe_load gives the same dict back, every string exact."""
    return yaml.dump(
        dict(manifest), Dumper=_ExactDumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100
    )


# ---- the user's kubeconfig (read, never written) ---------------------------------------------------------------------
MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class KubeContext:
    """What the kubeconfig says of the cluster a job would go to."""

    files: tuple[str, ...]  # the kubeconfig files that exist, in KUBECONFIG order
    context: str | None = None
    cluster: str | None = None
    server: str | None = None
    namespace: str = "default"
    problem: str | None = None  # why there is no usable context, if so

    @property
    def config_file(self) -> str | None:
        """What the official client's loaders take as config_file (several files joined as KUBECONFIG does)."""
        return os.pathsep.join(self.files) if self.files else None


def kubeconfig_files(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The kubeconfig files kubectl would read: those listed in KUBECONFIG, else ~/.kube/config."""
    env = os.environ if environ is None else environ
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    return [Path(p).expanduser() for p in listed] if listed else [Path("~/.kube/config").expanduser()]


def read_kubeconfig(files: Sequence[Path] | None = None, context: str | None = None) -> KubeContext:
    """The context (the current one unless `context` is given), its cluster's server and its namespace, merged from
    `files` as kubectl merges KUBECONFIG: the first file to set current-context wins, the first entry of a name wins.
    Reads only; a broken or missing file is reported in `problem`."""
    paths = list(files) if files is not None else kubeconfig_files()
    found = [p for p in paths if p.is_file()]
    if not found:
        where = ", ".join(str(p) for p in paths)
        return KubeContext(files=(), problem=f"no kubeconfig at {where} (set KUBECONFIG or create ~/.kube/config)")
    current: str | None = None
    contexts: dict[str, Any] = {}
    clusters: dict[str, Any] = {}
    for path in found:
        try:
            if path.stat().st_size > MAX_KUBECONFIG_BYTES:
                raise ValueError(f"larger than {MAX_KUBECONFIG_BYTES} bytes")
            data = yaml.safe_load(path.read_text()) or {}
            if not isinstance(data, dict):
                raise ValueError("not a mapping")
        except (OSError, ValueError, yaml.YAMLError) as exc:
            first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            return KubeContext(files=tuple(map(str, found)), problem=f"kubeconfig {path} cannot be read: {first}")
        if current is None and data.get("current-context"):
            current = str(data["current-context"])
        for entry in data.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name") is not None:
                contexts.setdefault(str(entry["name"]), entry.get("context") or {})
        for entry in data.get("clusters") or []:
            if isinstance(entry, dict) and entry.get("name") is not None:
                clusters.setdefault(str(entry["name"]), entry.get("cluster") or {})
    names = tuple(map(str, found))
    chosen = context or current
    if not chosen:
        return KubeContext(files=names, problem="the kubeconfig names no current-context")
    if chosen not in contexts:
        return KubeContext(files=names, context=chosen, problem=f"the kubeconfig has no context {chosen!r}")
    ctx = contexts[chosen] if isinstance(contexts[chosen], dict) else {}
    cluster = str(ctx.get("cluster")) if ctx.get("cluster") else None
    server = clusters.get(cluster, {}).get("server") if cluster else None
    namespace = str(ctx.get("namespace") or "default")
    return KubeContext(
        files=names,
        context=chosen,
        cluster=cluster,
        server=str(server) if server else None,
        namespace=namespace,
        problem=None if server else f"the kubeconfig's context {chosen!r} names no cluster server",
    )
