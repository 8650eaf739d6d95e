"""Shared fixtures: a fresh state directory per test, apps and in-process clients in both protocol eras."""

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from servers.core.mcp_layer import App
from servers.core.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[1]
# CI runs the SkyPilot tests against the real SkyPilot, installed in an environment of its own (.ci/skypilot-site:
# it pins older uvicorn and click than ours); its site-packages come after ours on the path.
SKYPILOT_SITE = os.environ.get("LLM_INFRA_MCP_TEST_SKYPILOT_SITE")
if SKYPILOT_SITE is not None:  # set but empty: its installation failed, which must not pass as "not installed"
    if not (Path(SKYPILOT_SITE) / "sky").is_dir():
        raise RuntimeError(f"LLM_INFRA_MCP_TEST_SKYPILOT_SITE={SKYPILOT_SITE!r} holds no SkyPilot")
    sys.path.append(SKYPILOT_SITE)
# Children (supervisor, worker) import the test job kinds from tests/, so they need the checkout on their path.
CHILD_ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def settings(home: Path, tmp_path: Path) -> Settings:
    return Settings(home=home, cancel_grace_s=1.0, allowed_roots=[tmp_path])


@pytest.fixture
def app(settings: Settings) -> App:
    return App(settings, owner="test", child_env=CHILD_ENV)


def server_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment for a server subprocess: its own state directory, the checkout importable."""
    return {
        "LLM_INFRA_MCP_HOME": str(home),
        "LLM_INFRA_MCP_CANCEL_GRACE_S": "1",
        "PYTHONPATH": CHILD_ENV["PYTHONPATH"],
        "PATH": os.environ.get("PATH", ""),
        **extra,
    }


PYTHON = sys.executable


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def suite_client(app: App, mode: str) -> AsyncIterator[Client]:
    from tests.helpers import create_test_suite

    async with Client(create_test_suite(app), mode=mode) as client:
        yield client


@pytest.fixture(scope="session")
def ray_head() -> Iterator[Any]:
    """A Ray head of this test session's own (tests/fixtures/launch/ray_head.py): dashboard on 127.0.0.1, ports
    chosen free, 2 CPUs, its own temp folder, token authentication with a token made for it (the tests pass it to
    the client). Stopped by its pids at the end, also when a test failed. Without ray installed the tests that use
    it skip, except under CI=true, where they fail: CI installs the ray extra."""
    from servers.launch.ray_backend import ray_installed

    if not ray_installed():
        skip_unless_present(
            "ray is not installed (pip install -e '.[ray]'): the Ray backend tests need a real local Ray head"
        )
    from tests.fixtures.launch.ray_head import start_head

    head = start_head()
    try:
        yield head
    finally:
        head.stop()


@pytest.fixture(scope="session")
def k8s_api() -> Iterator[Any]:
    """One stand-in Kubernetes API on 127.0.0.1 for the session (tests/fixtures/k8s/fake_api.py); take it through
    `k8s_fake`, which gives each test a fresh state. Without the kubernetes client the tests that use it skip,
    except under CI=true."""
    from servers.launch.kubernetes import kubernetes_installed
    from tests.fixtures.k8s.fake_api import FakeKubernetes

    if not kubernetes_installed():
        skip_unless_present("the kubernetes client is not installed (pip install -e '.[dev]' or '.[kubernetes]')")
    api = FakeKubernetes().start()
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def k8s_fake(k8s_api: Any) -> Any:
    """The session's stand-in Kubernetes API, reset to a new one's state (no objects, no requests recorded)."""
    k8s_api.reset()
    return k8s_api


# ---- a real Slurm cluster (tests/test_slurm_backend.py) -------------------------------------------------------------
SLURM_CLUSTER_SCRIPT = REPO_ROOT / "scripts" / "slurm-cluster.sh"
SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
# A finished job leaves squeue after MinJobAge: short here, so that the tests see states after Slurm forgot the job.
SLURM_MIN_JOB_AGE_S = 10
SLURM_KILL_WAIT_S = 5


def slurm_missing() -> str | None:
    """Why this machine cannot run the test cluster, or None."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    missing = [b for b in SLURM_BINARIES if shutil.which(b, path=search) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} not found): apt-get install -y slurm-wlm munge"
    if os.geteuid() != 0:
        return "the test Slurm cluster (scripts/slurm-cluster.sh) starts munged and slurmd as root; not root here"
    return None


CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def headless_dom(page: Path, home: Path, *flags: str, why: str) -> str:
    """The DOM headless Chromium made of `page` (a local HTML file) with `flags`; skipped (failed under CI) when no
    Chromium is installed, `why` saying what needs it."""
    browser = next((path for name in CHROMIUM if (path := shutil.which(name))), None)
    if browser is None:
        skip_unless_present(f"chromium is not installed (apt-get install -y chromium): {why}")
    assert browser is not None
    args = [browser, "--headless", "--disable-gpu", "--no-first-run", *flags, "--dump-dom"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
    done = subprocess.run(
        [*args, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HOME": str(home)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def load_recipe(name: str) -> Any:
    """A bundled recipe's script as a module, loaded by path (as torchrun runs it, outside the package)."""
    import importlib.util

    from servers.launch.recipes import recipe_path

    spec = importlib.util.spec_from_file_location(f"recipe_{name.replace('-', '_')}", recipe_path(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def skip_unless_present(why: str | None) -> None:
    """Skip the test when `why` says what this machine lacks; under CI=true, where .ci/run installs everything the
    tests use, fail instead: a missing part there is a broken CI, not a reason to pass."""
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)


def need_slurm() -> None:
    """Skip (fail under CI=true) when the cluster cannot run here."""
    skip_unless_present(slurm_missing())


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real Slurm cluster of 2 nodes x 1 CPU on 127.0.0.1 for the whole session (scripts/slurm-cluster.sh), with
    SLURM_CONF exported to this process; its jobs are cancelled and it is stopped at the end, also after failures.
    Yields the cluster's folder."""
    need_slurm()
    folder = tmp_path_factory.mktemp("slurm-cluster")
    env = {
        **os.environ,
        "PATH": os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]),
        "SLURM_CLUSTER_MIN_JOB_AGE": str(SLURM_MIN_JOB_AGE_S),
        "SLURM_CLUSTER_KILL_WAIT": str(SLURM_KILL_WAIT_S),
    }
    previous = os.environ.get("SLURM_CONF")
    try:
        started = subprocess.run(
            ["bash", str(SLURM_CLUSTER_SCRIPT), "start", str(folder), "2", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if started.returncode != 0:
            pytest.fail(f"the Slurm cluster did not start: {started.stderr.strip()[-2000:]}")
        os.environ["SLURM_CONF"] = str(folder / "slurm.conf")
        yield folder
    finally:
        if (folder / "slurm.conf").exists():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    ["scancel", "--user", str(os.getuid())],
                    env={**env, "SLURM_CONF": str(folder / "slurm.conf")},
                    capture_output=True,
                    timeout=30,
                    check=False,
                )
                time.sleep(2)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["bash", str(SLURM_CLUSTER_SCRIPT), "stop", str(folder)], env=env, capture_output=True, timeout=60
            )
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
