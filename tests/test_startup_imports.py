"""Starting a server stays light: importing it and answering initialize + tools/list imports no torch, scipy or
matplotlib (they load only when a tool needs them), and `servers.cli` alone (for --version) does not import mcp.

Each check runs in a fresh interpreter, since this test process has long imported whatever other tests needed.
benchmarks/startup.py measures what this keeps cheap: each server's cold start over stdio.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "scipy", "matplotlib")
SERVER_MODULES = (
    "servers.scaling.server",
    "servers.diagnostics.server",
    "servers.overlap.server",
    "servers.launch.server",
    "servers.suite",
)

# Import the module, build the server, list its tools in-process in both protocol eras, then report which of the
# heavy modules (and numpy, for information) the interpreter holds.
LIST_TOOLS = """
import importlib, json, sys

import anyio
from mcp import Client

module = importlib.import_module(sys.argv[1])
server = module.create_server()


async def tool_names(mode):
    async with Client(server, mode=mode) as client:
        return sorted(tool.name for tool in (await client.list_tools()).tools)


legacy = anyio.run(tool_names, "legacy")
auto = anyio.run(tool_names, "auto")
loaded = [name for name in ("torch", "scipy", "matplotlib", "numpy") if name in sys.modules]
print(json.dumps({"legacy": legacy, "auto": auto, "loaded": loaded}))
"""


def run_python(code: str, *args: str, home: Path) -> Any:
    """Run `code` in a fresh interpreter with its own state directory; return the JSON its last line prints."""
    env = {**os.environ, "LLM_INFRA_MCP_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", SERVER_MODULES)
def test_listing_tools_imports_no_heavy_module(module: str, tmp_path: Path) -> None:
    report = run_python(LIST_TOOLS, module, home=tmp_path / "state")
    assert report["legacy"], f"{module} lists no tools"
    assert report["auto"] == report["legacy"]
    heavy = [name for name in report["loaded"] if name in HEAVY]
    assert not heavy, f"importing {module} and listing its tools imported {heavy}"


@pytest.mark.timeout(120)
def test_cli_import_does_not_import_mcp(tmp_path: Path) -> None:
    code = (
        "import json, sys\nimport servers.cli\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.'))))"
    )
    loaded = run_python(code, home=tmp_path / "state")
    assert not loaded, f"importing servers.cli imported {loaded}; --version should not pay for the MCP SDK"


@pytest.mark.timeout(120)
def test_gpu_smoke_reaches_nvml_without_pydantic_or_mcp(tmp_path: Path) -> None:
    """benchmarks/gpu_smoke.py runs on a GPU machine that has torch and nvidia-ml-py but not mcp or pydantic, and
    opens NVML with servers.core.machine.nvml_session: that module must import with neither installed."""
    code = (
        "import json, sys\n"
        "for name in ('pydantic', 'pydantic_core', 'mcp'):\n"
        "    sys.modules[name] = None  # as if not installed: importing them raises ImportError\n"
        "sys.path.insert(0, 'benchmarks')\n"
        "import gpu_smoke\n"
        "from servers.core.machine import NvmlUnavailable, nvml_session\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('servers'))))"
    )
    loaded = run_python(code, home=tmp_path / "state")
    assert "servers.core.machine" in loaded
