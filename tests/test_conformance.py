"""The official MCP tools against our servers, in both protocol eras.

- The MCP conformance suite (@modelcontextprotocol/conformance) against `llm-infra-mcp serve suite --transport http`:
  every server scenario of each era (`--suite all --spec-version V`), judged by the suite itself against
  tests/conformance/expected-failures-V.yml (each line says why that check cannot pass here).
- The MCP Inspector's CLI (@modelcontextprotocol/inspector) on every server, over stdio and over streamable HTTP, in
  each era: `--method initialize` (the negotiated version) and `--method tools/list --strict` (its tool-schema
  portability check: no error-severity finding), then our own checks of the listed tools (JSON Schema 2020-12
  metaschema, local $refs resolve, snake_case names, all four annotation hints; the same tools in every era and
  transport, named as the server registers them in process).
- Our own check of the handshake versions the Inspector does not speak (it asks for 2025-11-25 only).

The eras: the handshake era (initialize; protocol versions 2024-11-05 to 2025-11-25) and the stateless era
(2026-07-28: server/discover, per-request _meta), which SDK 2.3 serves side by side (mode "legacy" and "auto" of the
in-process tests). The Inspector's `--protocol-era legacy` negotiates 2025-11-25, `modern` 2026-07-28.

The npm tools are pinned in tests/conformance/package.json and its lock file, with Node.js 22 from the
node-linux-* package (both tools need Node 22; the machine has 20); .ci/run installs them with
`npm ci --prefix tests/conformance`. Without them these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import httpx
import jsonschema
import pytest
import yaml

from servers.cli import SERVER_MODULES, SERVER_NAMES
from tests.conftest import PYTHON, REPO_ROOT, server_env, skip_unless_present
from tests.test_http import MCP_HEADERS, free_port, stop, wait_for_port

CONFORMANCE_DIR = REPO_ROOT / "tests" / "conformance"
NODE_MODULES = CONFORMANCE_DIR / "node_modules"
NODE = NODE_MODULES / ".bin" / "node"
PINNED: dict[str, str] = json.loads((CONFORMANCE_DIR / "package.json").read_text())["dependencies"]
CONFORMANCE = "@modelcontextprotocol/conformance"
INSPECTOR = "@modelcontextprotocol/inspector"
MIN_NODE_MAJOR = 22

# The Inspector's --protocol-era and the protocol version each one negotiates.
ERAS = {"legacy": "2025-11-25", "modern": "2026-07-28"}
# Every handshake-era version; the Inspector speaks only the newest.
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
# One conformance run per era, at that era's wire, and the scenario that checks its lifecycle.
SPEC_VERSIONS = {"2025-11-25": "server-initialize", "2026-07-28": "server-stateless"}

TOOL_TIMEOUT_S = 60
CONFORMANCE_TIMEOUT_S = 150
TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
_RESULT_DIR = re.compile(r"server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT[\d-]+Z")


def serve_argv(name: str) -> list[str]:
    """`llm-infra-mcp serve NAME`: the console script of this interpreter's environment."""
    script = Path(PYTHON).with_name("llm-infra-mcp")
    return [str(script), "serve", name] if script.exists() else [PYTHON, "-m", "servers.cli", "serve", name]


def _installed_version(package: str) -> str | None:
    manifest = NODE_MODULES / package / "package.json"
    return json.loads(manifest.read_text()).get("version") if manifest.is_file() else None


def _package_bin(package: str) -> Path:
    manifest = json.loads((NODE_MODULES / package / "package.json").read_text())
    entry = manifest["bin"]
    return NODE_MODULES / package / (entry if isinstance(entry, str) else next(iter(entry.values())))


def npm_tools_missing() -> str | None:
    """Why the pinned npm tools cannot run here, or None."""
    how = "run: npm ci --prefix tests/conformance --ignore-scripts (as .ci/run does)"
    if not NODE.exists():
        return f"the pinned npm tools are not installed ({NODE.relative_to(REPO_ROOT)} missing); {how}"
    try:
        version = subprocess.run(
            [str(NODE), "--version"], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{NODE.relative_to(REPO_ROOT)} does not run ({exc}); {how}"
    if not re.fullmatch(r"v\d+\.\d+\.\d+", version) or int(version[1:].split(".")[0]) < MIN_NODE_MAJOR:
        return f"{NODE.relative_to(REPO_ROOT)} is {version or 'unknown'}; the tools need Node {MIN_NODE_MAJOR}; {how}"
    for package, pinned in PINNED.items():
        installed = _installed_version(package)
        if installed != pinned:
            return f"{package} is {installed or 'not installed'}, pinned {pinned}; {how}"
    return None


@pytest.fixture(scope="module")
def npm_tools() -> None:
    """Skip (fail under CI=true, where .ci/run installs them) when the pinned npm tools are not installed."""
    skip_unless_present(npm_tools_missing())


@pytest.fixture(scope="module")
def http_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Every server over streamable HTTP on 127.0.0.1 and a free port, each with its own state directory; yields
    name -> base URL. All are stopped at the end, also after failures."""
    folder = tmp_path_factory.mktemp("http-servers")
    procs: dict[str, tuple[subprocess.Popen[bytes], int, Path]] = {}
    try:
        for name in SERVER_NAMES:
            port = free_port()
            log = folder / f"{name}.log"
            with log.open("wb") as out:
                procs[name] = (
                    subprocess.Popen(
                        [*serve_argv(name), "--transport", "http", "--host", "127.0.0.1", "--port", str(port)],
                        cwd=REPO_ROOT,
                        env=server_env(folder / f"state-{name}"),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    ),
                    port,
                    log,
                )
        for proc, port, log in procs.values():
            wait_for_port(proc, port, log)
        yield {name: f"http://127.0.0.1:{port}" for name, (_, port, _) in procs.items()}
    finally:
        for proc, _, _ in procs.values():
            stop(proc)


def run_node(argv: list[str], *, cwd: Path, home: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run an npm tool under the pinned Node, with an environment of its own (HOME in the test's folder: the
    Inspector keeps a catalog and settings there)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "HOME": str(home),
        "PATH": os.pathsep.join([str(NODE.parent), os.environ.get("PATH", "")]),
        "NO_COLOR": "1",
    }
    try:
        return subprocess.run(
            [str(NODE), *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(argv[:6])} ... did not finish within {timeout_s} s:\n{exc.stdout!r}\n{exc.stderr!r}")


def tail(done: subprocess.CompletedProcess[str], chars: int = 6000) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-chars:]}\n--- stderr\n{done.stderr[-chars:]}"


# ---- the conformance suite -----------------------------------------------------------------------------------------


def baseline_entries(path: Path) -> list[tuple[str, str | None]]:
    """(scenario, check id or None) for each line of an expected-failures file."""
    entries = []
    for line in yaml.safe_load(path.read_text())["server"]:
        scenario, _, check = str(line).partition(":")
        entries.append((scenario, check or None))
    return entries


def checks_by_scenario(results: Path) -> dict[str, list[dict[str, Any]]]:
    """The checks each scenario emitted, from the suite's result folders (server-<scenario>-<time>/checks.json)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for folder in sorted(results.iterdir()):
        match = _RESULT_DIR.fullmatch(folder.name)
        if match and (folder / "checks.json").is_file():
            found[match["scenario"]] = json.loads((folder / "checks.json").read_text())
    return found


@pytest.mark.timeout(CONFORMANCE_TIMEOUT_S + 30)
@pytest.mark.parametrize("spec_version", SPEC_VERSIONS)
def test_conformance_suite_passes_all_but_the_listed_checks(
    npm_tools: None, http_servers: dict[str, str], spec_version: str, tmp_path: Path
) -> None:
    baseline = CONFORMANCE_DIR / f"expected-failures-{spec_version}.yml"
    results = tmp_path / "results"
    done = run_node(
        [
            str(_package_bin(CONFORMANCE)),
            "server",
            "--url",
            http_servers["suite"] + "/mcp",
            "--suite",
            "all",
            "--spec-version",
            spec_version,
            "--expected-failures",
            str(baseline),
            "--output-dir",
            str(results),
        ],
        cwd=tmp_path,
        home=tmp_path / "home",
        timeout_s=CONFORMANCE_TIMEOUT_S,
    )
    # The suite judges the baseline itself: exit 1 for a failure not listed and for a listed check that passes.
    assert done.returncode == 0, tail(done)
    assert "Baseline check passed" in done.stdout, tail(done)

    ran = checks_by_scenario(results)
    core = {SPEC_VERSIONS[spec_version], "tools-list", "resources-list", "prompts-list", "dns-rebinding-protection"}
    assert core <= set(ran), sorted(ran)
    # The suite tolerates an entry whose scenario did not run or whose check was not emitted; we do not: such a
    # line would excuse nothing and hide that the suite changed.
    for scenario, check in baseline_entries(baseline):
        assert scenario in ran, f"{baseline.name}: {scenario} did not run at {spec_version}"
        if check is not None:
            emitted = {c["id"] for c in ran[scenario]}
            assert check in emitted, f"{baseline.name}: {scenario} emitted no check {check} ({sorted(emitted)})"
    # Every message our server sent was valid against the spec's schema of that version, in every scenario.
    for scenario, checks in ran.items():
        wire = [c for c in checks if c["id"] == "wire-schema-valid"]
        assert all(c["status"] == "SUCCESS" for c in wire), (scenario, wire)


# ---- the Inspector CLI ---------------------------------------------------------------------------------------------


def inspector(target: list[str], method: list[str], era: str, tmp_path: Path) -> dict[str, Any]:
    """One Inspector CLI call in JSON output; its parsed stdout."""
    done = run_node(
        [str(_package_bin(INSPECTOR)), "--cli", "--protocol-era", era, "--format", "json", *method, *target],
        cwd=tmp_path,
        home=tmp_path / "inspector-home",
        timeout_s=TOOL_TIMEOUT_S,
    )
    assert done.returncode == 0, f"inspector {' '.join(method)} ({era}) on {target[-3:]}: {tail(done)}"
    return json.loads(done.stdout)


def stdio_target(name: str, home: Path) -> list[str]:
    """The Inspector starts the server itself, with a bare environment plus what -e gives."""
    pairs = [arg for key, value in server_env(home).items() for arg in ("-e", f"{key}={value}")]
    return [*pairs, "--cwd", str(REPO_ROOT), "--", *serve_argv(name)]


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _refs(item)


def _resolves(schema: dict[str, Any], ref: str) -> bool:
    """A local reference (#/...) that points at something inside the schema."""
    if not ref.startswith("#"):
        return False
    node: Any = schema
    for part in [p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/") if p]:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def tool_problems(tools: list[dict[str, Any]]) -> list[str]:
    """What is wrong with a tools/list result as a client sees it on the wire; empty when nothing is."""
    problems = []
    names = [tool.get("name") for tool in tools]
    if len(set(names)) != len(names):
        problems.append(f"duplicate tool names: {sorted(n for n in set(names) if names.count(n) > 1)}")
    for tool in tools:
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            problems.append(f"{name!r}: not a snake_case name of at most 64 characters")
        if not isinstance(tool.get("description"), str) or not tool["description"].strip():
            problems.append(f"{name}: no description")
        for key in ("inputSchema", "outputSchema"):
            schema = tool.get(key)
            if not isinstance(schema, dict) or schema.get("type") != "object":
                problems.append(f"{name}: {key} is not an object schema")
                continue
            validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            try:
                validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                problems.append(f"{name}: {key} is no valid JSON Schema ({exc.message} at {list(exc.path)})")
            problems += [
                f"{name}: {key} $ref {ref} does not resolve" for ref in _refs(schema) if not _resolves(schema, ref)
            ]
        annotations = tool.get("annotations") or {}
        unset = [hint for hint in HINTS if not isinstance(annotations.get(hint), bool)]
        if unset:
            problems.append(f"{name}: annotations without {unset}")
    return problems


def registered_tools(name: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tools the server registers, in process (what every client must see)."""
    monkeypatch.setenv("LLM_INFRA_MCP_HOME", str(home))
    monkeypatch.delenv("LLM_INFRA_MCP_TOOLSETS", raising=False)
    server = importlib.import_module(SERVER_MODULES[name]).create_server()
    return [tool.name for tool in anyio.run(server.list_tools)]


def inspect_server(name: str, target: list[str], era: str, folder: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """initialize and tools/list --strict through the Inspector in one era; the tools it listed (without _meta) and
    what is wrong."""
    folder.mkdir(parents=True, exist_ok=True)
    problems = []
    init = inspector(target, ["--method", "initialize"], era, folder)["result"]
    if init.get("protocolVersion") != ERAS[era] or init.get("serverInfo", {}).get("name") != f"llm-infra-{name}":
        problems.append(f"initialize gave {init.get('protocolVersion')}, {init.get('serverInfo')}")
    # --strict: exit 6 on an error-severity schema finding (inspector() checks the exit); warnings are advisory.
    listed = inspector(target, ["--method", "tools/list", "--strict"], era, folder)
    problems += [
        f"{entry['toolName']}: {finding.get('path')}: {finding.get('issue')}"
        for entry in listed.get("schemaFindings", [])
        for finding in entry.get("findings", [])
        if finding.get("severity") == "error"
    ]
    tools = listed["result"]["tools"]
    problems += tool_problems(tools)
    return [{k: v for k, v in tool.items() if k != "_meta"} for tool in tools], problems


@pytest.mark.timeout(4 * TOOL_TIMEOUT_S)
@pytest.mark.parametrize("name", SERVER_NAMES)
def test_inspector_lists_valid_tools_over_stdio_and_http_in_both_eras(
    npm_tools: None, http_servers: dict[str, str], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    combos = [(transport, era) for transport in ("stdio", "http") for era in ERAS]

    def run(combo: tuple[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
        transport, era = combo
        folder = tmp_path / f"{transport}-{era}"
        target = stdio_target(name, folder / "state") if transport == "stdio" else [http_servers[name] + "/mcp"]
        return inspect_server(name, target, era, folder)

    # The four runs are independent and mostly process start-up: side by side.
    with ThreadPoolExecutor(max_workers=len(combos)) as pool:
        done = dict(zip(combos, pool.map(run, combos), strict=True))
    problems = [f"{transport}, {era}: {problem}" for (transport, era), (_, found) in done.items() for problem in found]
    assert not problems, "\n".join(problems)
    views = {combo: tools for combo, (tools, _) in done.items()}
    first = views[("stdio", "legacy")]
    for key, view in views.items():
        assert view == first, f"{key} lists other tools than stdio, legacy"
    assert [tool["name"] for tool in first] == registered_tools(name, tmp_path / "in-process", monkeypatch)


# ---- handshake versions the Inspector does not speak ---------------------------------------------------------------


def rpc(http: httpx.Client, url: str, message: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return http.post(url, json=message, headers={**MCP_HEADERS, **headers})


def rpc_result(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a streamable HTTP answer, plain JSON or one SSE event."""
    assert response.status_code == 200, (response.status_code, response.text[:500])
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        messages = [json.loads(d) for d in data if d]
        assert len(messages) == 1, response.text[:500]
        return messages[0]
    return response.json()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_every_handshake_version_is_negotiated_over_http(http_servers: dict[str, str], version: str) -> None:
    url = http_servers["suite"] + "/mcp"
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "conformance", "version": "0"},
        },
    }
    with httpx.Client(timeout=20) as http:
        first = rpc(http, url, init, {})
        answer = rpc_result(first)
        assert answer["result"]["protocolVersion"] == version, answer
        session = {"mcp-protocol-version": version}
        if "mcp-session-id" in first.headers:
            session["mcp-session-id"] = first.headers["mcp-session-id"]
        initialized = rpc(http, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        assert initialized.status_code == 202, (initialized.status_code, initialized.text[:500])
        listed = rpc_result(rpc(http, url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session))
        tools = listed["result"]["tools"]
        assert tools and not tool_problems(tools), tool_problems(tools)
        pinged = rpc_result(rpc(http, url, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, session))
        assert pinged == {"jsonrpc": "2.0", "id": 3, "result": {}}


def test_the_tool_checks_find_what_a_client_would_trip_on() -> None:
    """tool_problems itself (no npm tool needed): a clean tool passes, each kind of fault is named."""
    good = {
        "name": "fit_thing",
        "description": "Fits a thing.",
        "inputSchema": {
            "type": "object",
            "properties": {"data": {"$ref": "#/$defs/Data"}},
            "$defs": {"Data": {"type": "array", "items": {"type": "number"}}},
        },
        "outputSchema": {"type": "object", "properties": {"value": {"type": ["number", "null"]}}},
        "annotations": dict.fromkeys(HINTS, False),
    }
    assert tool_problems([good]) == []
    bad = [
        {**good, "name": "Fit-Thing"},
        {**good, "name": "no_output", "outputSchema": None},
        {**good, "name": "bad_type", "inputSchema": {"type": "object", "properties": {"x": {"type": "decimal"}}}},
        {**good, "name": "dangling", "inputSchema": {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}}},
        {**good, "name": "unhinted", "annotations": {"readOnlyHint": True}},
        {**good, "name": "fit_thing", "description": " "},
    ]
    found = "\n".join(tool_problems([good, *bad]))
    for expected in (
        "duplicate tool names: ['fit_thing']",
        "'Fit-Thing': not a snake_case name",
        "no_output: outputSchema is not an object schema",
        "bad_type: inputSchema is no valid JSON Schema",
        "dangling: inputSchema $ref #/$defs/X does not resolve",
        "unhinted: annotations without ['destructiveHint', 'idempotentHint', 'openWorldHint']",
        "fit_thing: no description",
    ):
        assert expected in found, found
