"""The Kubernetes backend (servers/launch/kubernetes.py, k8s_manifests.py).

No Kubernetes API server can run here, so:
- plans are compared with golden manifests (tests/fixtures/k8s/*.yaml) and validated against the CRD schemas of
  Kubeflow Trainer v2.3.0 (TrainJob) and the Training Operator v1.9.3 (PyTorchJob), with jsonschema;
- submit, status, cancel and logs go through the official `kubernetes` client over real HTTP to a stand-in API on
  127.0.0.1 (tests/fixtures/k8s/fake_api.py) that answers in the API's documented shapes, through a temporary
  kubeconfig with a bearer token; the same stand-in serves a training job followed end to end through the MCP tools.
Without the kubernetes client those tests skip, except under CI=true (CI installs it with the dev extra).
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.core.jobfiles import JobFiles
from servers.core.jobstore import JobState
from servers.engines.backend import Backend, BackendHandle, SubmitRequest
from servers.launch import k8s_manifests as m
from servers.launch.kubernetes import (
    CANCEL_RECORD,
    KubernetesApiError,
    KubernetesBackend,
    KubernetesPlan,
    KubernetesUnavailableError,
    kubernetes_installed,
)
from tests.conftest import skip_unless_present
from tests.fixtures.k8s import goldens
from tests.fixtures.k8s.fake_api import GROUPS, FakeKubernetes

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "k8s"
SCHEMAS = {
    "TrainJob": FIXTURES / "trainjob-v2.3.0.schema.json",
    "PyTorchJob": FIXTURES / "pytorchjob-v1.9.3.schema.json",
}
HOSTILE = ["$(id)", "$$(PET_NODE_RANK)", "$(PET_NNODES)", "$", "a$", "$$", "${HOME}", "$(unclosed", "ü$(x)", ""]


def need_client() -> None:
    if not kubernetes_installed():
        skip_unless_present("the kubernetes client is not installed (pip install -e '.[dev]' or '.[kubernetes]')")


# ---- Kubernetes' own rules, written out here --------------------------------------------------------------------
def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of $(VAR) in a container's command, args and env values: a port of Expand in
    kubernetes/kubernetes third_party/forked/golang/expansion/expand.go ("$$" -> "$", "$(NAME)" -> its value when
    defined, anything else as it is)."""
    out, checkpoint, cursor = [], 0, 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":
                read, is_var, advance = "$", False, 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                read, is_var, advance = (rest[1:close], True, close + 1) if close > 0 else ("$(", False, 1)
            else:
                read, is_var, advance = "$" + rest[0], False, 1
            out.append(env.get(read, f"$({read})") if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)")


def label_problems(mapping: dict[str, str], *, values: bool) -> list[str]:
    """Kubernetes' syntax of label (and annotation) keys, and of label values."""
    problems = []
    for key, value in mapping.items():
        prefix, _, name = key.rpartition("/")
        if prefix and (len(prefix) > 253 or not m.DNS_SUBDOMAIN.fullmatch(prefix)):
            problems.append(f"key prefix {prefix!r}")
        if not name or len(name) > 63 or not LABEL_NAME.fullmatch(name):
            problems.append(f"key name {name!r}")
        if values and (len(value) > 63 or not (value == "" or LABEL_NAME.fullmatch(value))):
            problems.append(f"value {value!r} of {key}")
    return problems


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused where it lists properties (the API server would prune them)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in out and not open_ended:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def validator(kind: str) -> Any:
    import jsonschema

    return jsonschema.Draft7Validator(strict(json.loads(SCHEMAS[kind].read_text())))


def cel_rules(schema: Any, path: str = "") -> list[tuple[str, str]]:
    found = []
    if isinstance(schema, dict):
        for rule in schema.get("x-kubernetes-validations") or []:
            found.append((path or "<root>", rule["rule"]))
        for key, value in schema.items():
            if key == "properties":
                for name, sub in value.items():
                    found += cel_rules(sub, f"{path}.{name}")
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                found += cel_rules(value, f"{path}[]")
    return found


def schema_errors(manifest: dict[str, Any]) -> list[str]:
    """Every schema error of a manifest, plus the create-time CEL rules of its kind, checked by hand."""
    kind = manifest["kind"]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(kind).iter_errors(manifest)]
    meta = manifest["metadata"]
    if kind == "TrainJob":
        schema = json.loads(SCHEMAS[kind].read_text())
        for _, rule in cel_rules(schema):
            match = re.fullmatch(r"self\.metadata\.name\.matches\('(.+)'\)", rule)
            if match and not re.fullmatch(match.group(1), meta["name"]):
                errors.append(f"metadata.name {meta['name']!r} breaks {rule}")
            match = re.fullmatch(r"size\(self\.metadata\.name\) <= (\d+)", rule)
            if match and len(meta["name"]) > int(match.group(1)):
                errors.append(f"metadata.name breaks {rule}")
        if "managedBy" in manifest["spec"]:
            errors.append("managedBy set (its CEL rule is not checked here)")
    errors += label_problems(meta.get("labels") or {}, values=True)
    errors += label_problems(meta.get("annotations") or {}, values=False)
    if not m.DNS_SUBDOMAIN.fullmatch(meta["name"]) or len(meta["name"]) > 253:
        errors.append(f"metadata.name {meta['name']!r} is not a DNS subdomain")
    return errors


def bound(plan: KubernetesPlan, key: str = "the-key") -> dict[str, Any]:
    return m.with_identity(plan.manifest, name=m.object_name(plan.name_base, key), key=key, job_id="training_remote-x")


# ---- offline: plans, goldens, schemas ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(goldens.VARIANTS))
def test_golden_manifests_are_exact(variant: str, tmp_path: Path) -> None:
    before = hashlib.sha256(goldens.KUBECONFIG.read_bytes()).hexdigest()
    plan = goldens.backend().plan(goldens.VARIANTS[variant])
    expected = (FIXTURES / f"{variant}.yaml").read_text()
    assert plan.rendered == expected, f"regenerate with: .venv/bin/python -m tests.fixtures.k8s.goldens ({variant})"
    assert yaml.safe_load(plan.rendered) == plan.manifest
    assert plan.argv[0] == "torchrun" and list(m.PET_ARGS) == plan.argv[1:6]
    assert plan.context == "gpu-cluster" and plan.server == "https://k8s.example.test:6443"
    assert KubernetesPlan.model_validate(plan.model_dump(mode="json")) == plan
    assert hashlib.sha256(goldens.KUBECONFIG.read_bytes()).hexdigest() == before  # read, never written


@pytest.mark.parametrize("variant", sorted(goldens.VARIANTS))
def test_manifests_validate_against_the_crd_schema(variant: str) -> None:
    plan = goldens.backend().plan(goldens.VARIANTS[variant])
    assert schema_errors(bound(plan)) == []
    if plan.object_name is not None:  # named at plan time: valid as shown, before submit adds the job id
        assert schema_errors(plan.manifest) == []


def test_the_schema_check_catches_broken_manifests() -> None:
    plan = goldens.backend().plan(goldens.VARIANTS["trainjob-recipe-2x4gpu-kueue"])
    good = bound(plan)
    cases = {
        "numNodes": lambda d: d["spec"]["trainer"].__setitem__("numNodes", "two"),
        "fooBar": lambda d: d["spec"]["trainer"].__setitem__("fooBar", 1),  # a typo is refused, not pruned
        "name": lambda d: d["spec"]["runtimeRef"].pop("name"),
        "activeDeadlineSeconds": lambda d: d["spec"].__setitem__("activeDeadlineSeconds", 0),
        "metadata.name": lambda d: d["metadata"].__setitem__("name", "Upper_Case"),
        "key-hash": lambda d: d["metadata"]["labels"].__setitem__(m.LABEL_KEY, "x:y"),
    }
    for what, breaks in cases.items():
        broken = json.loads(json.dumps(good))
        breaks(broken)
        assert any(what in e for e in schema_errors(broken)), (what, schema_errors(broken))
    ptj = bound(goldens.backend().plan(goldens.VARIANTS["pytorchjob-recipe-3x8gpu"]))
    ptj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        m.GPU_RESOURCE
    ] = "eight"
    assert schema_errors(ptj), "a GPU count that is no quantity passed"


def test_every_cel_rule_of_the_schemas_is_accounted_for() -> None:
    """jsonschema runs no CEL: each rule is checked by hand (schema_errors), applies to updates only (oldSelf), or
    is on a field the manifests never set. A new rule in a new schema fails here until it is looked at."""
    rules = cel_rules(json.loads(SCHEMAS["TrainJob"].read_text()))
    never_set = (".spec.initializer", ".status", ".spec.managedBy")
    by_hand = {
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "size(self.metadata.name) <= 63",
    }
    for path, rule in rules:
        assert "oldSelf" in rule or rule in by_hand or path.startswith(never_set), (path, rule)
    assert by_hand <= {rule for _, rule in rules}
    assert all("oldSelf" in rule for _, rule in cel_rules(json.loads(SCHEMAS["PyTorchJob"].read_text())))


@given(st.text(alphabet=st.sampled_from(list("$()ab{}\\ü ")), max_size=30))
def test_escaped_text_reaches_the_container_literally(text: str) -> None:
    env = {"PET_NNODES": "2", "id": "EXPANDED", "x": "EXPANDED"}
    assert k8s_expand(m.escape(text), env) == text


def test_pet_references_expand_and_hostile_args_do_not() -> None:
    plan = goldens.backend().plan(
        goldens.with_options(goldens.BASE | {"script": "/opt/t.py", "args": HOSTILE, "image": "i:1"})
    )
    env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "j-node-0-0.j"}
    env |= {"PET_MASTER_PORT": "29400", "id": "uid=0", "HOME": "/root"}
    seen = [k8s_expand(a, env) for a in plan.argv]
    assert seen[1:6] == [
        "--nnodes=2",
        "--nproc-per-node=4",
        "--node-rank=1",
        "--master-addr=j-node-0-0.j",
        "--master-port=29400",
    ]
    assert seen[-len(HOSTILE) :] == HOSTILE


def test_plan_refusals_say_what_is_accepted() -> None:
    backend = goldens.backend()
    spec = goldens.BASE | {"script": "/opt/t.py", "image": "img:1"}
    cases = {
        "image: missing": {"image": None},
        "image: 'a b'": {"image": "a b"},
        "workdir": {"workdir": "/tmp"},
        "runtime: a ClusterTrainingRuntime of a TrainJob": {"k8s_kind": "PyTorchJob", "runtime": "x"},
        "namespace: 'Team_A'": {"namespace": "Team_A"},
        "nnodes: 65": {"nnodes": 65},
        "k8s_kind: 'Job'": {"k8s_kind": "Job"},
        "max_wall_s": {"max_wall_s": 0.0},
    }
    for expected, change in cases.items():
        with pytest.raises(ValueError) as caught:
            backend.plan(goldens.with_options(spec | change))
        assert expected in str(caught.value), (expected, str(caught.value))
    with pytest.raises(ValueError, match="there is no default"):
        backend.plan(goldens.with_options(spec | {"image": None}))
    with pytest.raises(ValueError, match=r"options\.partition: a slurm option, not a kubernetes one; accepted for "):
        backend.plan(goldens.with_options(spec) | {"options": {"image": "img:1", "partition": "gpu"}})


def test_names_labels_and_deadline() -> None:
    names = {m.object_name(base, key) for base in ("tiny-gpt", "GPT sweep #3", "9lives", "", "x" * 80) for key in "ab"}
    assert len(names) == 10
    for name in names:
        assert m.NAME_1035.fullmatch(name) and len(name) <= 41, name
    assert m.object_name("tiny-gpt", "k") == m.object_name("tiny-gpt", "k")
    assert m.LABEL_VALUE.fullmatch(m.key_hash("a:b" * 40))
    assert m.deadline_seconds(0.2) == 1 and m.deadline_seconds(7200.5) == 7201


def test_training_plan_checks_the_kubernetes_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from servers.core.settings import Settings
    from servers.launch import training
    from servers.launch.training import TrainingJobSpec

    monkeypatch.setenv("KUBECONFIG", str(goldens.KUBECONFIG))
    settings = Settings(home=tmp_path / "state", allowed_roots=[tmp_path])
    backend = KubernetesBackend()

    def plan(**fields: Any) -> Any:
        spec = TrainingJobSpec.model_validate({"recipe": "tiny-gpt", "backend": "kubernetes", **fields})
        return training.plan(settings, spec, gpus_present=0, gpus_in_use=0, backend=backend)

    made = plan(
        options={"image": "ghcr.io/acme/t:1", "queue": "team-a"},
        nnodes=2,
        max_wall_s=600,
        nproc_per_node=8,
        gpus_per_node=8,
    )
    assert made.spec["options"] == {"image": "ghcr.io/acme/t:1", "queue": "team-a"}
    assert made.backend == "kubernetes" and made.backend_plan.nnodes == 2 and made.gpus == 8
    assert not any("no GPU here" in w for w in made.warnings)  # this machine's GPUs say nothing of the cluster's
    assert made.estimated_gpu_hours == pytest.approx(8 * 2 * 600 / 3600)
    assert "kind: TrainJob" in made.rendered and "namespace: ml" in made.rendered
    assert "numNodes: 2" in made.rendered and "kueue.x-k8s.io/queue-name: team-a" in made.rendered
    with pytest.raises(InputError, match="image: missing"):
        plan()
    with pytest.raises(ValueError, match="partition: a slurm option, not a kubernetes one"):
        plan(options={"image": "i:1", "partition": "gpu"})
    with pytest.raises(ValueError, match="image: a kubernetes and skypilot option, not a local one"):
        TrainingJobSpec.model_validate({"recipe": "tiny-gpt", "options": {"image": "i:1"}})
    with pytest.raises(ValueError, match="namespace: String should match pattern"):
        TrainingJobSpec.model_validate(
            {"recipe": "tiny-gpt", "backend": "kubernetes", "options": {"namespace": "../etc"}}
        )


def test_kubeconfig_files_merge_as_kubectl_does(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text(yaml.safe_dump({"contexts": [{"name": "c2", "context": {"cluster": "k1", "namespace": "n1"}}]}))
    second.write_text(
        yaml.safe_dump(
            {
                "current-context": "c2",
                "contexts": [{"name": "c2", "context": {"cluster": "k2"}}],
                "clusters": [{"name": "k1", "cluster": {"server": "https://one"}}],
            }
        )
    )
    env = {"KUBECONFIG": os.pathsep.join([str(first), str(tmp_path / "missing"), str(second)])}
    found = m.read_kubeconfig(m.kubeconfig_files(env))
    assert (found.context, found.cluster, found.server, found.namespace) == ("c2", "k1", "https://one", "n1")
    assert found.problem is None and found.files == (str(first), str(second))
    assert "no kubeconfig" in (m.read_kubeconfig([tmp_path / "none"]).problem or "")
    (tmp_path / "bad").write_text("{{{")
    assert "cannot be read" in (m.read_kubeconfig([tmp_path / "bad"]).problem or "")


def test_the_backend_modules_do_not_import_the_client() -> None:
    code = (
        "import sys, servers.launch.kubernetes, servers.launch.k8s_manifests, servers.launch.backends; "
        "sys.exit(int('kubernetes' in sys.modules))"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_without_the_client_or_a_kubeconfig_it_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from servers.launch import backends
    from servers.launch import kubernetes as k8s

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    found, detail = KubernetesBackend().available()
    assert not found and ("no kubeconfig" in detail or "not installed" in detail)
    monkeypatch.setattr(k8s, "kubernetes_installed", lambda: False)
    found, detail = KubernetesBackend(kubeconfig=str(goldens.KUBECONFIG)).available()
    assert not found and "pip install 'llm-infra-mcp[kubernetes]'" in detail
    status = backends.detect_kubernetes()
    assert not status.detected and not status.launch_supported


# ---- against the stand-in API ----------------------------------------------------------------------------------------
@pytest.fixture
def fake(k8s_fake: FakeKubernetes) -> FakeKubernetes:
    """The session's stand-in API (tests/conftest.py), with a fresh state."""
    return k8s_fake


@pytest.fixture
def kubeconfig(fake: FakeKubernetes, tmp_path: Path) -> Path:
    return fake.kubeconfig(tmp_path / "kubeconfig")


def spec_for(kind: str = "TrainJob", **extra: Any) -> dict[str, Any]:
    return goldens.with_options(
        goldens.BASE
        | {
            "script": str(goldens.RECIPES / "tiny_gpt.py"),
            "recipe": "tiny-gpt",
            "image": "ghcr.io/acme/train:1",
            "nnodes": 2,
            "k8s_kind": kind,
            "max_log_bytes": 1 << 20,
            **extra,
        }
    )


def submit(backend: KubernetesBackend, job: Path, key: str, kind: str = "TrainJob", **extra: Any) -> BackendHandle:
    job.mkdir(parents=True, exist_ok=True)
    plan = backend.plan(spec_for(kind, **extra)).bind(job)
    return backend.submit(plan, SubmitRequest(key=key, spec={}))


@pytest.mark.timeout(60)
def test_preflight_says_what_is_there_and_what_is_missing(
    fake: FakeKubernetes, kubeconfig: Path, tmp_path: Path
) -> None:
    backend = KubernetesBackend(kubeconfig=str(kubeconfig))
    assert isinstance(backend, Backend)
    found, detail = backend.available()
    assert found, detail
    for part in (
        "context 'fake'",
        "Kubernetes v1.34.1",
        "TrainJob API served",
        "PyTorchJob API served",
        "ClusterTrainingRuntime torch-distributed present",
        "Kueue installed",
        "namespace team-a",
        "requests.nvidia.com/gpu 4 of 16 used",
    ):
        assert part in detail, (part, detail)
    fake.runtimes.clear()
    fake.quota_readable = False
    found, detail = KubernetesBackend(kubeconfig=str(kubeconfig)).available()
    assert found and "torch-distributed missing" in detail and "quota is not readable" in detail, detail
    del fake.served["trainer.kubeflow.org"], fake.served["kubeflow.org"]
    found, detail = KubernetesBackend(kubeconfig=str(kubeconfig)).available()
    assert not found and "TrainJob API not served" in detail and "PyTorchJob API not served" in detail, detail
    fake.served = dict(GROUPS)
    fake.namespaces.discard("team-a")
    found, detail = KubernetesBackend(kubeconfig=str(kubeconfig)).available()
    assert not found and "namespace team-a does not exist" in detail, detail
    wrong = fake.kubeconfig(tmp_path / "wrong-token", token="expired")
    found, detail = KubernetesBackend(kubeconfig=str(wrong)).available()
    assert not found and "refused the credentials" in detail and "401" in detail, detail
    dead = fake.kubeconfig(tmp_path / "dead", server="http://127.0.0.1:9")
    started = time.monotonic()
    found, detail = KubernetesBackend(kubeconfig=str(dead)).available()
    assert not found and "does not answer" in detail and "Connection refused" in detail, detail
    assert time.monotonic() - started < 10 and "HTTPConnectionPool" not in detail


@pytest.mark.timeout(60)
def test_list_backends_reads_the_kubeconfig_from_the_environment(
    fake: FakeKubernetes, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servers.launch.backends import detect_all

    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    before = kubeconfig.read_bytes()
    status = {b.name: b for b in detect_all()}["kubernetes"]
    assert status.detected and status.launch_supported and "TrainJob API served" in status.detail
    assert kubeconfig.read_bytes() == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["TrainJob", "PyTorchJob"])
def test_submit_creates_exactly_the_plan_once(
    fake: FakeKubernetes, kubeconfig: Path, tmp_path: Path, kind: str
) -> None:
    backend = KubernetesBackend(kubeconfig=str(kubeconfig))
    job = tmp_path / "jobs" / "training_remote-abc"
    job.mkdir(parents=True)
    plan = backend.plan(spec_for(kind, args=["$(id)"])).bind(job)
    first = backend.submit(plan, SubmitRequest(key="exp:1", spec={}))
    again = KubernetesBackend(kubeconfig=str(kubeconfig)).submit(plan, SubmitRequest(key="exp:1", spec={}))
    assert first == again and first.job_dir == str(job)
    posts = fake.calls("POST")
    assert len(posts) == 2 and len(fake.objects) == 1  # the second create answered 409 AlreadyExists
    name = m.object_name("tiny-gpt", "exp:1")
    expected = m.with_identity(plan.manifest, name=name, key="exp:1", job_id="training_remote-abc")
    assert posts[0]["body"] == expected and schema_errors(expected) == []
    assert posts[0]["path"].endswith(f"/namespaces/team-a/{m.KINDS[kind].plural}")
    fake.stored(name).obj["metadata"]["annotations"][m.ANNOTATION_KEY] = "someone-else"
    with pytest.raises(RuntimeError, match="was not made for this idempotency key"):
        backend.submit(plan, SubmitRequest(key="exp:1", spec={}))
    edited = plan.model_copy(update={"argv": [*plan.argv, "--extra"]})
    with pytest.raises(ValueError, match="argv is not the manifest"):
        backend.submit(edited, SubmitRequest(key="exp:2", spec={}))


@pytest.mark.timeout(60)
def test_submit_is_bound_to_the_plans_cluster(fake: FakeKubernetes, kubeconfig: Path, tmp_path: Path) -> None:
    plan = KubernetesBackend(kubeconfig=str(kubeconfig)).plan(spec_for())
    moved = fake.kubeconfig(tmp_path / "moved", server="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="make the plan again"):
        KubernetesBackend(kubeconfig=str(moved)).submit(plan, SubmitRequest(key="k", spec={}))
    assert not fake.calls("POST")


STATUS_CASES = {
    # phase: (state, words the reason must hold)
    "created": (JobState.STARTING, "no pods yet"),
    "creating": (JobState.STARTING, "ContainerCreating"),
    "imagepull": (JobState.STARTING, "ErrImagePull: failed to pull and unpack image"),
    "unschedulable": (JobState.QUEUED, "Insufficient nvidia.com/gpu"),
    "pending-quiet": (JobState.STARTING, 'FailedMount: MountVolume.SetUp failed for volume "data"'),
    "suspended": (JobState.QUEUED, "suspended"),
    "running": (JobState.RUNNING, "2 node(s) running"),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["TrainJob", "PyTorchJob"])
def test_status_maps_each_condition_and_pod_state(
    fake: FakeKubernetes, kubeconfig: Path, tmp_path: Path, kind: str
) -> None:
    backend = KubernetesBackend(kubeconfig=str(kubeconfig))
    for index, (phase, (state, words)) in enumerate(STATUS_CASES.items()):
        fake.next_scenario = [(phase, 1)]
        queue = {"queue": "team-a"} if phase == "suspended" else {}  # Kueue would unsuspend the others
        handle = submit(backend, tmp_path / f"job{index}", f"key-{index}", kind, **queue)
        status = backend.status(handle)
        assert status.state == state and words in (status.reason or ""), (phase, status)
        if phase == "suspended":
            assert "Kueue" in (status.reason or "") and "team-a" in (status.reason or "")
    fake.next_scenario = [("complete", 1)]
    done = backend.status(submit(backend, tmp_path / "ok", "ok", kind))
    assert done.state == JobState.SUCCEEDED and done.exit_code == 0, done
    assert done.native_state == (
        "Complete (AllJobsCompleted)" if kind == "TrainJob" else "Succeeded (PyTorchJobSucceeded)"
    )
    fake.next_scenario = [("failed", 1)]
    failed = backend.status(submit(backend, tmp_path / "bad", "bad", kind))
    assert failed.state == JobState.FAILED and failed.exit_code == 1, failed
    assert "node 1 (pod " in failed.reason and "ValueError: loss is nan at step 2" in failed.reason, failed.reason
    fake.next_scenario = [("deadline", 1)]
    late = backend.status(submit(backend, tmp_path / "late", "late", kind))
    assert late.state == JobState.FAILED and "wall-time limit was reached (activeDeadlineSeconds 3600" in late.reason


@pytest.mark.timeout(60)
def test_api_errors_are_one_line_and_create_nothing(fake: FakeKubernetes, kubeconfig: Path, tmp_path: Path) -> None:
    backend = KubernetesBackend(kubeconfig=str(kubeconfig))
    fake.forbid.add(("POST", "trainjobs"))
    with pytest.raises(RuntimeError) as caught:
        submit(backend, tmp_path / "a", "a")
    text = str(caught.value)
    assert "refused to create the TrainJob in namespace team-a: Forbidden" in text and 'User "alice"' in text
    assert "\n" not in text and "HTTP response" not in text and not fake.objects
    fake.forbid.clear()
    del fake.served["kubeflow.org"]
    with pytest.raises(RuntimeError, match=r"does not serve pytorchjobs.kubeflow.org/v1 .*nothing was created"):
        submit(backend, tmp_path / "b", "b", "PyTorchJob")
    fake.next_scenario = [("running", 1)]
    handle = submit(backend, tmp_path / "c", "c")
    fake.forbid.add(("GET", "trainjobs"))
    with pytest.raises(KubernetesApiError) as denied:
        backend.status(handle)
    assert denied.value.status == 403 and isinstance(denied.value, RuntimeError)


@pytest.mark.timeout(60)
def test_an_unreachable_api_is_said_and_nothing_guessed(fake: FakeKubernetes, tmp_path: Path) -> None:
    dead = fake.kubeconfig(tmp_path / "dead", server="http://127.0.0.1:9")
    backend = KubernetesBackend(kubeconfig=str(dead))
    handle = BackendHandle(backend="kubernetes", key="k", native_id="team-a/trainjobs/x-1", job_dir=str(tmp_path))
    for call in (
        lambda: backend.status(handle),
        lambda: backend.cancel(handle),
        lambda: submit(backend, tmp_path, "k"),
    ):
        started = time.monotonic()
        with pytest.raises(KubernetesUnavailableError, match=r"127\.0\.0\.1:9.*does not answer"):
            call()
        assert time.monotonic() - started < 10
    assert not (tmp_path / CANCEL_RECORD).exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["TrainJob", "PyTorchJob"])
def test_cancel_deletes_in_the_foreground_once(
    fake: FakeKubernetes, kubeconfig: Path, tmp_path: Path, kind: str
) -> None:
    backend = KubernetesBackend(kubeconfig=str(kubeconfig), cancel_wait_s=5)
    fake.next_scenario = [("running", 1)]
    handle = submit(backend, tmp_path / "run", "run", kind)
    assert backend.cancel(handle) == JobState.CANCELLED
    deletes = fake.calls("DELETE")
    assert len(deletes) == 1 and deletes[0]["query"].get("propagationPolicy") == "Foreground"
    assert not fake.objects  # gone once its dependents were (the stand-in's foreground deletion)
    assert backend.cancel(handle) == JobState.CANCELLED and len(fake.calls("DELETE")) == 1
    assert KubernetesBackend(kubeconfig=str(kubeconfig)).status(handle).state == JobState.CANCELLED  # the record
    fake.next_scenario = [("complete", 1)]
    finished = submit(backend, tmp_path / "done", "done", kind)
    assert backend.cancel(finished) == JobState.SUCCEEDED and len(fake.calls("DELETE")) == 1  # kept, with its logs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["TrainJob", "PyTorchJob"])
def test_logs_per_node_rank_are_copied_into_the_job_folder(
    fake: FakeKubernetes, kubeconfig: Path, tmp_path: Path, kind: str
) -> None:
    backend = KubernetesBackend(kubeconfig=str(kubeconfig))
    fake.next_scenario = [("running", 1), ("complete", 1)]  # running until the first GET of the object
    job = tmp_path / "job"
    handle = submit(backend, job, "logs", kind, nnodes=3)
    backend.sync_logs(handle, job)
    assert JobFiles(job).processes() == ["node0", "node1", "node2"]  # what read_job_logs offers
    assert (job / "logs" / "node2.log").read_text() == "node 2 step 1\nnode 2 step 2\n"
    assert (job / "logs" / "node0.log").read_text() == "node 0 step 1\nnode 0 step 2\n"
    backend.sync_logs(handle, job)  # within log_sync_s: nothing asked
    status = backend.status(handle)
    assert status.state == JobState.SUCCEEDED
    backend.sync_logs(handle, job, final=True)
    assert (job / "logs" / "node0.log").read_text() == "".join(f"node 0 step {s}\n" for s in range(1, 5)) + (
        "done: loss 1.23\n"
    )
    capped = tmp_path / "capped"
    small = submit(backend, capped, "capped", kind, max_log_bytes=20)
    backend.sync_logs(small, capped, final=True)
    texts = [(capped / "logs" / f"node{r}.log").read_text() for r in range(2)]
    assert len(texts[0]) == 20 and "log cut here" in texts[1], texts


@pytest.mark.timeout(60)
def test_the_kubeconfig_is_never_written(fake: FakeKubernetes, kubeconfig: Path, tmp_path: Path) -> None:
    before = (kubeconfig.read_bytes(), kubeconfig.stat().st_mtime_ns)
    backend = KubernetesBackend(kubeconfig=str(kubeconfig))
    fake.next_scenario = [("running", 1)]
    handle = submit(backend, tmp_path / "j", "j")
    backend.status(handle)
    backend.cancel(handle)
    backend.available()
    assert (kubeconfig.read_bytes(), kubeconfig.stat().st_mtime_ns) == before


# ---- end to end through the MCP tools ------------------------------------------------------------------------------
@pytest.fixture
def k8s_app(fake: FakeKubernetes, kubeconfig: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from servers.core.mcp_layer import App
    from tests.conftest import CHILD_ENV

    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # the server's plans and list_backends
    return App(settings, owner="test", child_env={**CHILD_ENV, "KUBECONFIG": str(kubeconfig)})


TOOL_SPEC = {
    "recipe": "tiny-gpt",
    "backend": "kubernetes",
    "options": {"image": "ghcr.io/acme/llm-infra-train:2.13"},
    "nnodes": 2,
    "nproc_per_node": 1,
    "args": ["--steps", "20"],
    "max_wall_s": 600,
}


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_a_training_job_on_kubernetes_through_the_tools(k8s_app: Any, fake: FakeKubernetes) -> None:
    from mcp import Client

    from tests.helpers import call_ok, create_test_suite, finish_job

    fake.next_scenario = [("created", 2), ("creating", 2), ("running", 3), ("complete", 1)]
    async with Client(create_test_suite(k8s_app), mode="legacy") as client:
        backends = {b["name"]: b for b in (await call_ok(client, "list_backends", {}))["backends"]}
        assert backends["kubernetes"]["detected"] and backends["kubernetes"]["launch_supported"]
        plan = await call_ok(client, "plan_training_job", {"spec": TOOL_SPEC})
        assert plan["backend"] == "kubernetes" and "kind: TrainJob" in plan["rendered"]
        assert any("context 'fake'" in note for note in plan["notes"])
        job = await call_ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        done = await finish_job(client, job["job_id"], 120)
        assert done["state"] == "SUCCEEDED", done["reason"]
        assert done["result"]["backend"] == "kubernetes"
        assert done["result"]["native_state"] == "Complete (AllJobsCompleted)" and done["result"]["exit_code"] == 0
        assert {"node0", "node1"} <= {entry["process"] for entry in done["logs"]}
        log = await call_ok(client, "read_job_logs", {"job_id": job["job_id"], "process": "node0"})
        assert "done: loss 1.23" in log["text"]
        got = await call_ok(client, "get_job", {"job_id": job["job_id"]})
        assert got["state"] == "SUCCEEDED"
    (created,) = [r for r in fake.calls("POST") if r["path"].endswith("/trainjobs")]
    annotations = created["body"]["metadata"]["annotations"]
    assert annotations[m.ANNOTATION_JOB] == job["job_id"] and schema_errors(created["body"]) == []


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_a_failed_and_a_cancelled_job_through_the_tools(k8s_app: Any, fake: FakeKubernetes) -> None:
    from mcp import Client

    from tests.helpers import call_error, call_ok, create_test_suite, finish_job

    async with Client(create_test_suite(k8s_app), mode="legacy") as client:
        no_image = {k: v for k, v in TOOL_SPEC.items() if k != "options"}
        refused = await call_error(client, "plan_training_job", {"spec": no_image})
        assert "image: missing" in refused and "no default" in refused
        fake.next_scenario = [("running", 2), ("failed", 1)]
        failed = await call_ok(
            client, "submit_training_job", {"spec": TOOL_SPEC | {"idempotency_key": "f-1"}, "wait_s": 0}
        )
        ended = await finish_job(client, failed["job_id"], 120)
        assert ended["state"] == "FAILED" and "node 1" in ended["reason"] and "ValueError" in ended["reason"], ended
        fake.next_scenario = [("running", 1)]
        job = await call_ok(
            client,
            "submit_training_job",
            {"spec": TOOL_SPEC | {"options": TOOL_SPEC["options"] | {"k8s_kind": "PyTorchJob"}}, "wait_s": 3},
        )
        assert not job["finished"], job
        cancelled = await call_ok(client, "cancel_job", {"job_id": job["job_id"]})
        assert cancelled["state"] == "CANCELLED", cancelled
    deadline = time.monotonic() + 30
    while not fake.calls("DELETE", "/pytorchjobs/") and time.monotonic() < deadline:
        time.sleep(0.2)
    (delete,) = fake.calls("DELETE", "/pytorchjobs/")
    assert delete["query"]["propagationPolicy"] == "Foreground"
