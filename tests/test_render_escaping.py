"""Issue 21, suspicions 13 (a), (b) and (c): what the launch backends and the experiment loop render from the agent's
strings, each tried with the hostile values.

(a) A Kubernetes job with gpus_per_node 0 left its resources unset, so the ClusterTrainingRuntime's template (and a
    node whose default container runtime is NVIDIA's, with an image setting NVIDIA_VISIBLE_DEVICES=all) could give
    it GPUs: the manifest now says nvidia.com/gpu 0 (limit and request) and NVIDIA_VISIBLE_DEVICES=void.
(b) U+0085 (NEL) and the other characters YAML reads as line breaks were written raw into the SkyPilot task YAML
    (and the Kubernetes manifest's), so a value came back changed: such strings are now double-quoted and escaped,
    and every value round-trips through yaml.safe_load exactly, with no extra key.
(c) report.md was written as unescaped markdown: a variant name, a job's reason or a log tail could add links,
    images, raw HTML, headings or table cells. report.md_text escapes every block's text; a log tail's fence is
    longer than any run of backticks in it."""

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from servers.launch import k8s_manifests as m
from servers.launch.skypilot import TASK_FIELDS, TASK_NAME_PATTERN, SkyPilotBackend, check_structure
from servers.loop.report import blocks, md_text, render_markdown
from tests.fixtures.k8s import goldens
from tests.test_skypilot_backend import base_spec

# Characters YAML reads as line breaks, C1 controls, separators, BOM, bidi overrides, and YAML's own syntax.
HOSTILE_VALUES = [
    "a\x85b",
    "x\x85injected: true",
    "\x85",
    "tail\x85",
    "a\u2028b: c",
    "a\u2029- d",
    "c1\x80\x9b\x9f",
    "\ufeffbom",
    "rtl\u202eevil",
    "line1\nline2\x85key: value",
    "multi\nline\n",
    "tab\there",
    "carriage\rreturn",
    "key: value",
    "- item",
    "'single' \"double\" # comment",
    "&anchor *alias !tag %directive @at `tick`",
    "{flow: map} [flow, seq]",
    "null",
    "~",
    "0x10",
    "",
]


# ---- (b) the SkyPilot task YAML -------------------------------------------------------------------------------------
def test_skypilot_task_values_round_trip_exactly(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = [v for v in HOSTILE_VALUES if not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", v)]  # C0: refused by plan
    env = {f"JOB_V{i}": v for i, v in enumerate(HOSTILE_VALUES)}
    plan = SkyPilotBackend().plan(base_spec(script, args=args, env=env, name="evil\x85name: x\u2028y"))
    task = yaml.safe_load(plan.rendered or "")
    assert set(task) <= set(TASK_FIELDS) and check_structure(task) == []
    assert TASK_NAME_PATTERN.fullmatch(task["name"])
    assert task["envs"] == {**env, "PYTHONUNBUFFERED": "1"}  # every value exact, no key added
    assert task["envs"] == plan.env
    for arg in args:
        assert shlex.quote(arg) in task["run"], arg  # the run commands carry each argument whole
    assert set(task["file_mounts"]) and all(isinstance(v, str) for v in task["file_mounts"].values())


def test_skypilot_paths_with_line_separators_round_trip(tmp_path: Path) -> None:
    folder = tmp_path / "dir\x85name\u2028x"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text("print('hi')\n")
    plan = SkyPilotBackend().plan(base_spec(script))
    task = yaml.safe_load(plan.rendered or "")
    assert str(script) in task["file_mounts"].values()


# ---- (b) and (a) the Kubernetes manifest ----------------------------------------------------------------------------
def test_kubernetes_manifest_values_round_trip_exactly() -> None:
    variant = goldens.VARIANTS["trainjob-script-cpu-no-key"]
    env = {f"JOB_V{i}": v for i, v in enumerate(HOSTILE_VALUES)}
    for kind in ("TrainJob", "PyTorchJob"):
        spec = variant | {"args": HOSTILE_VALUES, "env": env, "k8s_kind": kind}
        if kind == "PyTorchJob":
            spec = spec | {"runtime": None}
        plan = goldens.backend().plan(goldens.with_options(spec))
        assert yaml.safe_load(plan.rendered) == plan.manifest  # what submit checks before it creates the object
        assert {k: v for k, v in plan.env.items() if k.startswith("JOB_")} == {k: m.escape(v) for k, v in env.items()}


def _containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if manifest["kind"] == "TrainJob":
        return [manifest["spec"]["trainer"]]
    return [r["template"]["spec"]["containers"][0] for r in manifest["spec"]["pytorchReplicaSpecs"].values()]


def _shape(kind: str, gpus: int, **extra: Any) -> m.JobShape:
    return m.JobShape(
        kind=kind,
        namespace="ml",
        image="python:3.11-slim",
        target=["/opt/train.py"],
        args=[],
        nnodes=2,
        nproc_per_node=max(1, gpus),
        gpus_per_node=gpus,
        max_wall_s=60,
        **extra,
    )


@pytest.mark.parametrize("kind", ["TrainJob", "PyTorchJob"])
def test_a_kubernetes_job_without_gpus_asks_for_none_explicitly(kind: str) -> None:
    """gpus_per_node 0: an explicit nvidia.com/gpu of 0, so the runtime's template cannot add GPUs, and
    NVIDIA_VISIBLE_DEVICES=void, so NVIDIA's container runtime mounts none whatever the image says."""
    manifest = m.render(_shape(kind, 0, env={"JOB_X": "1"}))
    for container in _containers(manifest):
        resources = container["resourcesPerNode"] if kind == "TrainJob" else container["resources"]
        assert resources == {"limits": {m.GPU_RESOURCE: 0}, "requests": {m.GPU_RESOURCE: 0}}
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["JOB_X"] == "1"
    with_gpus = m.render(_shape(kind, 4))
    for container in _containers(with_gpus):
        resources = container["resourcesPerNode"] if kind == "TrainJob" else container["resources"]
        assert resources == {"limits": {m.GPU_RESOURCE: 4}}
        assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in container.get("env") or []}
    assert yaml.safe_load(m.to_yaml(manifest)) == manifest


def test_the_kubernetes_plan_of_a_cpu_job_shows_no_gpu() -> None:
    plan = goldens.backend().plan(goldens.VARIANTS["trainjob-script-cpu-no-key"])
    assert plan.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "nvidia.com/gpu: 0" in (plan.rendered or "")


# ---- (c) report.md --------------------------------------------------------------------------------------------------
EVIL_VARIANT = "lr=0.02 [click me](https://evil.example/x) ![pixel](https://evil.example/p.png) <img src=x onerror=1>"
EVIL_REASON = (
    "rank 0 failed\n\n## Decision\n\nScale **evil**: <script>alert(1)</script> | forged | cell |\n[r]: https://e"
)
EVIL_LOG = "step 1\n```\n# not a heading\n<b>bold</b>\n````\n~~~\nend\x85\u202e"


def _shown(markdown: str) -> str:
    """What a CommonMark renderer shows of inline text made by md_text: backslash escapes and entities undone."""
    text = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _expected(value: str) -> str:
    value = re.sub(r"[\t\n\r]", " ", value)
    return re.sub(
        r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]", lambda c: f"\\u{ord(c.group()):04x}", value
    )


@pytest.mark.parametrize("value", [EVIL_VARIANT, EVIL_REASON, EVIL_LOG, *HOSTILE_VALUES, "a_b _c_ \\*x\\* C_mid=1"])
def test_md_text_shows_exactly_the_value(value: str) -> None:
    text = md_text(value)
    assert "\n" not in text and "<" not in text and ">" not in text
    assert not re.search(r"(?<!\\)[\[\]`*|#~]", text)  # every metacharacter escaped
    assert _shown(text) == _expected(value)


def test_a_hostile_variant_name_and_reason_add_nothing_to_the_report() -> None:
    data = {
        "study": "evil [study](https://e)",
        "scaling": {
            "dropped_variants": [EVIL_VARIANT],
            "runs": [
                {
                    "round": 1,
                    "variant": EVIL_VARIANT,
                    "seed": 0,
                    "job_id": "train-1",
                    "state": "FAILED",
                    "reason": EVIL_REASON,
                    "log_tail": EVIL_LOG,
                }
            ],
        },
        "errors": [{"where": "runs", "tool": None, "message": EVIL_REASON}],
    }
    content = blocks(data, {})
    md = render_markdown(content)
    # the log tail stays one code block: its fence is longer than any run of backticks in it
    before, code, after = md.split("\n`````\n")
    assert code == "step 1\n```\n# not a heading\n<b>bold</b>\n````\n~~~\nend\\u0085\\u202e"
    outside = before + "\n" + after
    headings = [b for b in content if b[0] == "h"]
    assert len([line for line in outside.splitlines() if line.startswith("#")]) == len(headings)  # none forged
    assert "<" not in outside and ">" not in outside  # no raw HTML, no autolink
    assert not re.search(r"(?<!\\)\[", outside)  # no link, image or reference definition
    assert md_text(EVIL_VARIANT) in md and md_text(EVIL_REASON) in md
    # the run's table row keeps its nine cells: the reason's '|' are escaped
    row = next(line for line in md.splitlines() if line.startswith("| 1 |"))
    assert len(re.findall(r"(?<!\\)\|", row)) == 10
