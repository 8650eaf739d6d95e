"""Packaging: the wheel carries the code, the data files and the console script; the CLI's version and config."""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import PYTHON, REPO_ROOT, server_env


def version_in_source() -> str:
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', (REPO_ROOT / "servers" / "__init__.py").read_text(), re.M)
    assert match, "servers/__init__.py has no __version__"
    return match.group(1)


class Wheel(NamedTuple):
    names: list[str]
    entry_points: str


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "servers.cli", *args],
        cwd=REPO_ROOT,
        env=server_env(tmp_path / "state"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [PYTHON, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        return Wheel(names, zf.read(entry_points).decode())


@pytest.mark.timeout(180)
def test_wheel_contains_code_and_data(built_wheel: Wheel) -> None:
    names = set(built_wheel.names)
    for required in (
        "servers/__init__.py",
        "servers/cli.py",
        "servers/core/jobs.py",
        "servers/core/transport.py",
        "servers/_data/resources/gpus.json",
        "servers/_data/resources/jobs.md",
    ):
        assert required in names, required
    prompts = sorted(p for p in (REPO_ROOT / "prompts").iterdir() if p.is_file())
    assert prompts, "the repository has no prompts/"
    for prompt in prompts:
        assert f"servers/_data/prompts/{prompt.name}" in names, prompt.name


@pytest.mark.timeout(180)
def test_wheel_declares_console_script(built_wheel: Wheel) -> None:
    entry_points = built_wheel.entry_points
    assert "[console_scripts]" in entry_points
    lines = [line.replace(" ", "") for line in entry_points.splitlines()]
    assert "llm-infra-mcp=servers.cli:main" in lines


@pytest.mark.timeout(180)
def test_wheel_has_no_tests(built_wheel: Wheel) -> None:
    stray = [
        n for n in built_wheel.names if n.startswith("tests/") or "/tests/" in n or n.split("/")[-1] == "conftest.py"
    ]
    assert not stray, stray


@pytest.mark.timeout(60)
def test_cli_version(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"llm-infra-mcp {version_in_source()}"


@pytest.mark.timeout(60)
def test_cli_config_claude(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "config", "claude", "--server", "suite", "--server", "overlap")
    assert result.returncode == 0, result.stderr
    servers = json.loads(result.stdout)["mcpServers"]
    assert len(servers) == 2
    tails = []
    for entry in servers.values():
        command = Path(entry["command"])
        assert command.is_absolute(), command
        assert command.is_file() and os.access(command, os.X_OK), command
        tails.append(entry["args"][-2:])
    assert sorted(tails) == sorted([["serve", "suite"], ["serve", "overlap"]])
