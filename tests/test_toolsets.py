"""LLM_INFRA_MCP_TOOLSETS: the suite serves only the parts named (the job tools with any part that starts jobs);
config claude --toolsets writes it; a bad value is refused in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servers.core.mcp_layer import App
from servers.core.settings import Settings
from servers.suite import create_server
from tests.conftest import CHILD_ENV, REPO_ROOT

pytestmark = [pytest.mark.anyio]
JOB_TOOLS = {"get_job", "list_jobs", "wait_for_job", "cancel_job", "read_job_logs", "read_job_metrics"}


async def _names(settings: Settings, toolsets: str) -> set[str]:
    app = App(settings.model_copy(update={"toolsets": Settings(toolsets=toolsets).toolsets}), owner="test")
    return {t.name for t in await create_server(app).list_tools()}


async def test_the_suite_serves_the_toolsets_named(settings: Settings) -> None:
    everything = await _names(settings, "")
    scaling = await _names(settings, "scaling")
    assert "fit_scaling_law" in scaling and not scaling & JOB_TOOLS and "submit_training_job" not in scaling
    launch = await _names(settings, "scaling, launch")
    assert scaling < launch and JOB_TOOLS <= launch and "gpu_health" not in launch
    assert JOB_TOOLS <= await _names(settings, "diagnostics")
    assert launch < everything and len(everything) > len(launch)


def test_a_bad_toolset_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="accepted: scaling, diagnostics, overlap, launch"):
        Settings(toolsets="scaling,nosuch")
    env = {**CHILD_ENV, "LLM_INFRA_MCP_TOOLSETS": "nosuch"}
    done = subprocess.run(
        [sys.executable, "-m", "servers.cli", "serve", "suite"],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "LLM_INFRA_MCP_TOOLSETS" in done.stderr and "pydantic" not in done.stderr


def test_config_claude_writes_the_toolsets(tmp_path: Path) -> None:
    env = {**CHILD_ENV, "HOME": str(tmp_path), "LLM_INFRA_MCP_HOME": str(tmp_path / "state")}
    argv = [sys.executable, "-m", "servers.cli", "config", "claude", "--toolsets", "scaling,launch"]
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    entry = json.loads(done.stdout)["mcpServers"]["llm-infra-suite"]
    assert entry["env"]["LLM_INFRA_MCP_TOOLSETS"] == "scaling,launch"
    bad = subprocess.run([*argv[:-1], "scaling,nosuch"], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "accepted" in bad.stderr
