"""Issue 21, defect 12: the state directory can be uploaded.

The attack: a SkyPilot or Ray plan with workdir set to the state directory (launch.key, state.db, every job's logs)
was accepted at 0 GPU-hours; submit would have uploaded the folder to cloud storage or the Ray cluster. A workdir
may now neither be the state directory, lie inside it, nor contain it, on every backend (one check in the spec
validation every plan goes through).
"""

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from servers.core.mcp_layer import App
from servers.core.settings import Settings
from tests.conftest import CHILD_ENV
from tests.fixtures.k8s import goldens
from tests.helpers import call_error, call_ok, create_test_suite

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

BACKENDS: dict[str, dict[str, Any]] = {
    "local": {},
    "slurm": {"nnodes": 2},
    "ray": {},
    "kubernetes": {"options": {"image": "evil.example/miner:latest"}},
    "skypilot": {},
}
ACCEPTED = "accepted: a folder inside the roots that neither is nor contains the state directory"


@pytest.fixture(autouse=True)
def offline_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(goldens.KUBECONFIG))


@pytest.mark.parametrize("backend", list(BACKENDS))
async def test_a_workdir_that_is_inside_or_contains_the_state_directory_is_refused(
    settings: Settings, tmp_path: Path, backend: str
) -> None:
    home = settings.home
    (home / "jobs" / "someone").mkdir(parents=True)
    (tmp_path / "to-state").symlink_to(home)
    (tmp_path / "project").mkdir()
    app = App(settings, owner="test", child_env=CHILD_ENV)
    refusals = {
        str(home): "is the state directory",
        str(home / "jobs" / "someone"): "lies inside the state directory",
        str(home / "jobs" / "not-made-yet"): "lies inside the state directory",
        str(tmp_path): "contains the state directory",  # the root itself: an upload of it carries the state
        str(tmp_path / "to-state"): "is the state directory",  # a symlink to it
        str(tmp_path / "project" / ".." / "to-state" / "jobs"): "lies inside the state directory",
    }
    async with Client(create_test_suite(app), mode="legacy") as client:
        for workdir, why in refusals.items():
            spec = {"recipe": "tiny-gpt", "backend": backend, "workdir": workdir, **BACKENDS[backend]}
            text = await call_error(client, "plan_training_job", {"spec": spec})
            assert why in text and ACCEPTED in text and f"({home})" in text, (workdir, text)
            assert "workdir" in text
        if backend != "kubernetes":  # kubernetes takes no workdir (the image's): its own refusal
            ok = {"recipe": "tiny-gpt", "backend": backend, "workdir": str(tmp_path / "project"), **BACKENDS[backend]}
            plan = await call_ok(client, "plan_training_job", {"spec": ok})
            assert plan["backend_spec"]["workdir"] == str(tmp_path / "project")


async def test_a_sweep_is_refused_the_same_way(settings: Settings) -> None:
    app = App(settings, owner="test", child_env=CHILD_ENV)
    async with Client(create_test_suite(app), mode="legacy") as client:
        spec = {"recipe": "tiny-gpt", "backend": "ray", "workdir": str(settings.home)}
        text = await call_error(client, "plan_sweep", {"spec": spec, "variants": [["--steps", "3"], ["--steps", "4"]]})
        assert "is the state directory" in text and ACCEPTED in text
