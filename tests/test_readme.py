"""README.md stays true: its two commands come first, CI runs exactly its test command, its generated sections
(servers, tools, settings) match what the code registers, and the main job runs end to end."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from servers.docs import SETTINGS_BEGIN, SETTINGS_END, TOOLS_BEGIN, TOOLS_END, settings_markdown, tools_markdown
from tests.conftest import PYTHON, REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def code_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL)]


def test_readme_begins_with_the_two_commands() -> None:
    run, test = code_blocks(README)[:2]
    assert "examples/experiment_loop.py" in run and "pip install" in run and "-m venv" in run
    assert "pytest" in test and "pip install" in test and "-m venv" in test
    before_first = README[: README.index("```sh")]
    assert before_first.count("\n") <= 5, "the commands must open the README"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = code_blocks(README)[1]
    ci = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    commands = [
        line for line in ci if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))
    ]
    # Before it, CI only installs the system packages the cluster tests need (Slurm: they skip elsewhere) and the
    # pinned npm tools of the conformance tests (npm ci from tests/conformance/package-lock.json).
    assert commands[-1] == test_command
    installs = ("apt-get ", "export ", "DEBIAN_FRONTEND=", "npm ci ")
    assert all(line.startswith(installs) for line in commands[:-1]), commands


def _section(begin: str, end: str) -> str:
    return README[README.index(begin) : README.index(end) + len(end)]


def test_tools_section_matches_the_registered_tools() -> None:
    assert _section(TOOLS_BEGIN, TOOLS_END) == tools_markdown(), "README is stale: run `llm-infra-mcp docs`"


def test_settings_section_matches_the_settings() -> None:
    assert _section(SETTINGS_BEGIN, SETTINGS_END) == settings_markdown(), "README is stale: run `llm-infra-mcp docs`"


@pytest.mark.timeout(120)
def test_the_main_job_runs_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "LLM_INFRA_MCP_HOME": str(tmp_path / "state")}
    done = subprocess.run(
        [PYTHON, "examples/first_job.py", "--m", "64", "--n", "64", "--k", "64", "--iters", "3"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "SUCCEEDED" in done.stdout and "benchmark_gemm" in done.stdout and "wait_for_job" in done.stdout
    assert len(list((tmp_path / "state" / "jobs").iterdir())) == 1
