"""Per-backend options (issue 23, item 2): a spec's common fields plus `options`, validated against the chosen
backend's own options model; an option under the wrong backend, beside the common fields or unknown is refused
with what is accepted; each backend's plan reads its options from there."""

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field, ValidationError

from servers.engines import registry
from servers.engines.registry import BackendInfo
from servers.launch import options as backend_options
from servers.launch.options import Options
from servers.launch.training import OPTIONS_TEXT, TrainingJobSpec, spec_hash

BUNDLED = ("local", "slurm", "ray", "kubernetes", "skypilot")
# Every field the flat spec had for one backend, with a value it accepts, and the backends that take it.
FORMER_FIELDS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "share_gpus": (True, ("local",)),
    "partition": ("gpu", ("slurm",)),
    "account": ("proj_1", ("slurm",)),
    "qos": ("high", ("slurm",)),
    "constraint": ("a100&ib", ("slurm",)),
    "exclude": ("node[1-3]", ("slurm",)),
    "nodelist": ("node[1-2]", ("slurm",)),
    "dependency": ("1234", ("slurm",)),
    "image": ("ghcr.io/acme/train:1", ("kubernetes", "skypilot")),
    "namespace": ("ml", ("kubernetes",)),
    "queue": ("team-a", ("kubernetes",)),
    "runtime": ("torch-distributed", ("kubernetes",)),
    "k8s_kind": ("PyTorchJob", ("kubernetes",)),
    "accelerator": ("H100", ("skypilot",)),
    "infra": ("aws/us-east-1", ("skypilot",)),
    "use_spot": (True, ("skypilot",)),
    "job_recovery": ("FAILOVER", ("skypilot",)),
    "max_restarts_on_errors": (2, ("skypilot",)),
    "pip_packages": (["torch==2.5.1"], ("skypilot",)),
}


def spec(**fields: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"recipe": "tiny-gpt", **fields})


def refusal(**fields: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        spec(**fields)
    return " ".join(str(e["msg"]) for e in caught.value.errors())


@pytest.mark.parametrize("name", list(FORMER_FIELDS))
def test_every_former_flat_field_is_its_backends_option_and_refused_elsewhere(name: str) -> None:
    value, takers = FORMER_FIELDS[name]
    for backend in BUNDLED:
        if backend in takers:
            assert spec(backend=backend, options={name: value}).options == {name: value}
            continue
        said = refusal(backend=backend, options={name: value})
        assert f"{name}: a {' and '.join(takers)} option, not a {backend} one" in said, said
        assert f"accepted for {backend}: " in said, said
    said = refusal(backend=takers[0], **{name: value})  # beside the common fields, where flat specs had it
    assert f"{name}: a {' and '.join(takers)} option; give it in options" in said, said


def test_the_options_models_hold_exactly_the_former_fields() -> None:
    declared = {b: set(backend_options.accepted(b)) for b in BUNDLED}
    assert declared["ray"] == set()
    assert set().union(*declared.values()) == set(FORMER_FIELDS)
    for name, (_, takers) in FORMER_FIELDS.items():
        assert backend_options.owners(name) == tuple(b for b in registry.names() if b in takers)


def test_an_unknown_option_is_refused_naming_what_the_backend_accepts() -> None:
    said = refusal(backend="slurm", options={"gpus_type": "H100"})
    assert "gpus_type: not an option of any backend; accepted for slurm: partition, account, qos" in said
    assert "accepted for ray: no options" in refusal(backend="ray", options={"image": "i:1"})


def test_option_values_keep_their_patterns_and_bounds() -> None:
    for backend, options, words in [
        ("slurm", {"partition": "debug\n#SBATCH --wrap=id"}, "partition: String should match pattern"),
        ("slurm", {"dependency": "afterany:3"}, "dependency: String should match pattern"),
        ("kubernetes", {"namespace": "../etc"}, "namespace: String should match pattern"),
        ("kubernetes", {"k8s_kind": "Job"}, "k8s_kind: Input should be 'TrainJob' or 'PyTorchJob'"),
        ("skypilot", {"max_restarts_on_errors": 101}, "max_restarts_on_errors: Input should be less than or equal"),
        ("skypilot", {"pip_packages": ["--index-url=https://evil.example"]}, "pip_packages.0: String should match"),
        ("skypilot", {"pip_packages": ["p"] * 33}, "pip_packages: List should have at most 32 items"),
        ("local", {"share_gpus": "yes please"}, "share_gpus: Input should be a valid boolean"),
    ]:
        assert words in refusal(backend=backend, options=options), (backend, options)
    many = {f"x{i}": 1 for i in range(33)}
    assert "at most 32" in refusal(backend="slurm", options=many)
    with pytest.raises(ValueError, match="bytes of JSON; accepted: at most 16384"):
        backend_options.validate("slurm", {"constraint": "a" * 17000})


def test_the_normalised_options_leave_defaults_out_so_one_spec_has_one_hash() -> None:
    plain = spec(backend="slurm")
    said_none = spec(backend="slurm", options={"partition": None, "qos": None})
    assert said_none.options == {} and spec_hash(said_none) == spec_hash(plain)
    assert spec(backend="skypilot", options={"use_spot": False, "pip_packages": []}).options == {}
    assert backend_options.full("local", {}) == {"share_gpus": False}
    assert backend_options.full("ray", {}) == {}


def test_the_published_schema_names_the_backends_and_the_options_description_is_true() -> None:
    schema = TrainingJobSpec.model_json_schema()
    assert set(schema["properties"]["backend"]["enum"]) == set(BUNDLED)
    options = schema["properties"]["options"]
    assert options["type"] == "object" and options["maxProperties"] == backend_options.MAX_OPTIONS
    assert "list_backends" in options["description"]
    for backend in BUNDLED:  # the description lists each bundled backend's options, exactly
        said = OPTIONS_TEXT.split(f"{backend}: ", 1)[1].split(";", 1)[0]
        names = [n.split(" ")[0] for n in said.split(", ")] if said != "none" else []
        assert names == list(backend_options.accepted(backend)), (backend, said)


def test_list_backends_rows_carry_each_backends_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from servers.engines.backend import BackendStatus
    from servers.launch import server

    found = [BackendStatus(name=b, detected=False, detail="-", launch_supported=False) for b in BUNDLED]
    monkeypatch.setattr(server, "detect_all", lambda settings: found)
    rows = {r.name: r for r in server.backend_rows(None)}
    assert rows["slurm"].options["dependency"] == "string: Slurm job ID to succeed first"
    assert rows["kubernetes"].options["k8s_kind"] == "TrainJob|PyTorchJob"
    assert rows["skypilot"].options["pip_packages"] == "list of string"
    assert rows["local"].options["share_gpus"].startswith("boolean: may use GPUs")
    assert rows["ray"].options == {}


def test_each_backends_plan_refuses_an_option_that_is_not_its_own(tmp_path: Path) -> None:
    from servers.launch.kubernetes import KubernetesBackend
    from servers.launch.local import LocalBackend
    from servers.launch.ray_backend import RayBackend
    from servers.launch.skypilot import SkyPilotBackend
    from servers.launch.slurm import SlurmBackend

    base = {"script": str(tmp_path / "t.py"), "nproc_per_node": 1, "nnodes": 1, "max_wall_s": 60.0}
    for backend, misplaced in [
        (SlurmBackend(job_root=tmp_path / "slurm", env={"PATH": str(tmp_path)}), {"image": "i:1"}),
        (RayBackend(address=None), {"partition": "gpu"}),
        (SkyPilotBackend(), {"namespace": "ml"}),
        (KubernetesBackend(kubeconfig=str(tmp_path / "none")), {"share_gpus": True}),
        (LocalBackend(), {"queue": "team-a"}),
    ]:
        with pytest.raises(ValueError) as caught:
            backend.plan(base | {"options": misplaced})
        name = next(iter(misplaced))
        assert f"options.{name}: a " in str(caught.value) and f"not a {backend.name} one" in str(caught.value)


class ToyOptions(Options):
    flavour: str = Field(default="plain", max_length=16, description="what the toy runs")


def test_a_registered_backends_own_options_model_is_what_a_spec_is_checked_against() -> None:
    info = registry.register(
        BackendInfo(name="toy_options", summary="a test's", factory=lambda c: None, options=ToyOptions)
    )
    try:
        assert spec(backend="toy_options", options={"flavour": "mint"}).options == {"flavour": "mint"}
        assert "partition: a slurm option, not a toy_options one; accepted for toy_options: flavour" in refusal(
            backend="toy_options", options={"partition": "gpu"}
        )
        assert "flavour: a toy_options option, not a slurm one" in refusal(backend="slurm", options={"flavour": "x"})
        assert "toy_options" in TrainingJobSpec.model_json_schema()["properties"]["backend"]["enum"]
    finally:
        registry.unregister(info.name)
    assert "'toy_options' is not a known backend; accepted: local" in refusal(backend="toy_options")


NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=20).filter(
    lambda n: n not in FORMER_FIELDS
)


@settings(max_examples=40, deadline=None)
@given(backend=st.sampled_from(BUNDLED), names=st.lists(NAMES, min_size=1, max_size=4, unique=True))
def test_any_name_no_backend_declares_is_refused_under_every_backend(backend: str, names: list[str]) -> None:
    said = refusal(backend=backend, options=dict.fromkeys(names, 1))
    for name in names:
        assert f"{name}: not an option of any backend; accepted for {backend}: " in said


def test_json_input_is_checked_as_strictly_as_the_common_fields() -> None:
    text = '{"recipe": "tiny-gpt", "backend": "%s", "options": {"%s": %s}}'
    for backend, name, value in [("local", "share_gpus", '"true"'), ("slurm", "dependency", "1234")]:
        with pytest.raises(ValidationError, match=f"{name}: Input should be a valid"):
            TrainingJobSpec.model_validate_json(text % (backend, name, value), strict=True)
    parsed = TrainingJobSpec.model_validate_json(text % ("slurm", "dependency", '"1234"'), strict=True)
    assert parsed.options == {"dependency": "1234"}


def test_a_plan_token_of_the_flat_spec_is_refused_as_old(tmp_path: Path) -> None:
    from servers.core.errors import InputError
    from servers.core.settings import Settings
    from servers.launch.training import sign, spec_from_token

    state = Settings(home=tmp_path / "state", allowed_roots=[tmp_path])
    flat = {"recipe": "tiny-gpt", "backend": "slurm", "partition": "gpu", "share_gpus": False}
    token = sign(state, "plan", {"spec": flat, "plan": "0123456789abcdef"})
    with pytest.raises(InputError, match="plan_token is from an older version; make a new plan"):
        spec_from_token(state, token)
    now = sign(state, "plan", {"spec": spec(backend="slurm", options={"partition": "gpu"}).model_dump(), "plan": "x"})
    assert spec_from_token(state, now)[0].options == {"partition": "gpu"}
