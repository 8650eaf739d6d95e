"""Shared fixtures: a fresh state directory per test, apps and in-process clients in both protocol eras."""

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from servers.core.mcp_layer import App
from servers.core.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[1]
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
