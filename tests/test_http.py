"""The streamable HTTP transport, served by a real `llm-infra-mcp serve` subprocess.

Covers: the SDK client over HTTP (list and call tools), the SDK's DNS-rebinding protection on loopback (a foreign
Host header is refused), the refusal to start on a non-loopback address without a bearer token, and the bearer-token
check when a token is set. Plus unit tests of `is_loopback` and `http_app` without any subprocess.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import MCPServer

from servers.core.transport import BearerTokenMiddleware, TransportConfigError, http_app, is_loopback
from tests.conftest import PYTHON, REPO_ROOT, server_env

TOKEN = "some-secret"
START_TIMEOUT_S = 20.0
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test-http", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(host: str, port: int) -> list[str]:
    return [PYTHON, "-m", "servers.cli", "serve", "suite", "--transport", "http", "--host", host, "--port", str(port)]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def wait_for_port(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode} before listening:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"server did not listen on port {port} within {START_TIMEOUT_S} s:\n{log.read_text()}")


@contextmanager
def serving(argv_for_port: Callable[[int], list[str]], env: dict[str, str], log_dir: Path) -> Iterator[str]:
    """Run the HTTP server argv_for_port(port) gives, on a free port; yield its base URL on 127.0.0.1; stop it."""
    port = free_port()
    log = log_dir / f"server-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv_for_port(port),
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(proc, port, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@contextmanager
def http_server(tmp_path: Path, host: str, **extra_env: str) -> Iterator[str]:
    """Run `serve suite --transport http` on host and a free port; yield the base URL to reach it on 127.0.0.1."""
    with serving(lambda port: serve_command(host, port), server_env(tmp_path / "state", **extra_env), tmp_path) as url:
        yield url


@pytest.fixture
def loopback_url(tmp_path: Path) -> Iterator[str]:
    with http_server(tmp_path, "127.0.0.1") as url:
        yield url


@pytest.fixture
def token_url(tmp_path: Path) -> Iterator[str]:
    with http_server(tmp_path, "0.0.0.0", LLM_INFRA_MCP_HTTP_TOKEN=TOKEN) as url:
        yield url


# ---- unit tests: no subprocess ----


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"])
def test_is_loopback_true(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "example.com", "::", ""])
def test_is_loopback_false(host: str) -> None:
    assert not is_loopback(host)


def test_http_app_refuses_non_loopback_without_token() -> None:
    with pytest.raises(TransportConfigError, match="LLM_INFRA_MCP_HTTP_TOKEN"):
        http_app(MCPServer("t"), "0.0.0.0", None)
    with pytest.raises(TransportConfigError):
        http_app(MCPServer("t"), "0.0.0.0", "")


def test_http_app_wraps_with_token_only_when_set() -> None:
    assert isinstance(http_app(MCPServer("t"), "0.0.0.0", TOKEN), BearerTokenMiddleware)
    assert not isinstance(http_app(MCPServer("t"), "127.0.0.1", None), BearerTokenMiddleware)


# ---- real server subprocess ----


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_client_lists_and_calls_tools_over_http(loopback_url: str) -> None:
    async with Client(loopback_url + "/mcp") as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"get_job", "benchmark_gemm", "predict_scaling"} <= names
        result = await client.call_tool(
            "predict_scaling",
            {"model": "power_law", "compute": [100], "parameters": {"A": 0.6, "B": 0.5, "D": 1.0}},
        )
    assert not result.is_error, result.content
    assert result.structured_content is not None
    (point,) = result.structured_content["values"]
    assert point["value"] == pytest.approx(0.6 - 1.0 * 100**-0.5)


@pytest.mark.timeout(60)
def test_foreign_host_header_refused_on_loopback(loopback_url: str) -> None:
    with httpx.Client(timeout=10) as http:
        bad = http.post(loopback_url + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Host": "evil.example.com"})
        assert 400 <= bad.status_code < 500 and bad.status_code != 401, (bad.status_code, bad.text)
        assert bad.status_code == 421  # what the SDK's transport security answers for an unknown Host
        assert "host" in bad.text.lower()

        good = http.post(loopback_url + "/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        assert good.status_code == 200, (good.status_code, good.text)
        assert '"serverInfo"' in good.text


@pytest.mark.timeout(60)
def test_non_loopback_without_token_refuses_to_start(tmp_path: Path) -> None:
    env = server_env(tmp_path / "state")
    env.pop("LLM_INFRA_MCP_HTTP_TOKEN", None)
    assert "LLM_INFRA_MCP_HTTP_TOKEN" not in env
    proc = subprocess.Popen(
        serve_command("0.0.0.0", free_port()),
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = proc.communicate(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop(proc)
        pytest.fail("server on 0.0.0.0 without a token kept running")
    finally:
        stop(proc)
    assert proc.returncode != 0
    assert "LLM_INFRA_MCP_HTTP_TOKEN" in stderr
    assert "token" in stderr.lower()


@pytest.mark.timeout(60)
def test_token_required_on_non_loopback(token_url: str) -> None:
    with httpx.Client(timeout=10) as http:
        missing = http.post(token_url + "/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        assert missing.status_code == 401
        assert missing.headers["content-type"].startswith("application/json")
        assert missing.json()["error"] == "unauthorized"
        assert missing.headers.get("www-authenticate") == "Bearer"

        wrong = http.post(token_url + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": "Bearer wrong"})
        assert wrong.status_code == 401
        assert wrong.json()["error"] == "unauthorized"

        bare = http.post(token_url + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": TOKEN})
        assert bare.status_code == 401


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_client_with_token_lists_tools(token_url: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
        Client(streamable_http_client(token_url + "/mcp", http_client=http)) as client,
    ):
        names = {tool.name for tool in (await client.list_tools()).tools}
    assert {"get_job", "benchmark_gemm", "predict_scaling"} <= names


def test_server_env_carries_no_token() -> None:
    # The refusal test above relies on the environment not leaking a token from the developer's shell.
    assert "LLM_INFRA_MCP_HTTP_TOKEN" not in server_env(Path("/nonexistent"))


@pytest.mark.parametrize("host", ["127.0.0.2", "[::1]", "::1", "localhost"])
def test_dns_rebinding_protection_on_every_loopback_spelling(host: str) -> None:
    from starlette.testclient import TestClient

    from servers.core.transport import http_app

    # In process there is no TCP peer whose user could be looked up (and such a request is refused, 403): the
    # token, which a loopback server takes instead of the user check, lets the requests reach the Host check.
    app = http_app(MCPServer("t"), host, TOKEN)
    with TestClient(app, base_url="http://127.0.0.1:9", headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        refused = http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Host": "evil.example.com"})
        assert refused.status_code == 421
        accepted = http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Host": "127.0.0.1:9"})
        assert accepted.status_code == 200
    with TestClient(http_app(MCPServer("t"), host, None), base_url="http://127.0.0.1:9") as http:
        unknown_peer = http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Host": "127.0.0.1:9"})
        assert unknown_peer.status_code == 403 and "cannot be determined" in unknown_peer.json()["error_description"]


# ---- issue 9: the bearer scheme is case-insensitive; a body that trickles in is timed out -------------------------


@pytest.mark.timeout(60)
def test_bearer_scheme_is_case_insensitive(token_url: str) -> None:
    with httpx.Client(timeout=10) as http:
        for header in (f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Bearer  {TOKEN}", f"bEaReR {TOKEN}"):
            ok = http.post(token_url + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": header})
            assert ok.status_code == 200, (header, ok.status_code, ok.text)
        for header in (f"Basic {TOKEN}", f"bearer {TOKEN.upper()}", "bearer", f"bearer{TOKEN}", f"Bearer {TOKEN}x"):
            refused = http.post(token_url + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": header})
            assert refused.status_code == 401, (header, refused.status_code)


@contextmanager
def uvicorn_in_thread(app: object) -> Iterator[int]:
    """Serve an ASGI app with uvicorn on 127.0.0.1 in a thread of this process; yields the port."""
    import threading

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def read_response(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    data = b""
    try:
        while b"\r\n\r\n" not in data or (b"content-length" in data.lower() and not data.endswith(b"}")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        pass
    return data


@pytest.mark.timeout(60)
def test_slow_request_body_gets_408_and_the_server_keeps_serving() -> None:
    app = http_app(MCPServer("t"), "127.0.0.1", None, body_timeout_s=1.0)
    body = json.dumps(INITIALIZE).encode()
    with uvicorn_in_thread(app) as port:
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(head + body[:5])
            answer = b""
            for byte in body[5:40]:  # one byte at a time, the slowloris way, until the server answers
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    break
                slow.settimeout(0.2)
                try:
                    answer += slow.recv(65536)
                except TimeoutError:
                    continue
                if answer:
                    break
            answer += read_response(slow, 5)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"request_timeout" in answer
        # the same body sent at once is served
        with httpx.Client(timeout=10) as http:
            good = http.post(f"http://127.0.0.1:{port}/mcp", content=body, headers=MCP_HEADERS)
        assert good.status_code == 200 and '"serverInfo"' in good.text


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_body_timeout_hands_the_app_the_whole_body_and_later_messages() -> None:
    from servers.core.transport import BodyTimeoutMiddleware

    seen: list[dict] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        seen.append(await receive())
        seen.append(await receive())

    incoming = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": True},
        {"type": "http.request", "body": b"e", "more_body": False},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict:
        return incoming.pop(0)

    async def send(message: dict) -> None:
        raise AssertionError(f"nothing should be sent: {message}")

    await BodyTimeoutMiddleware(app, timeout_s=10)({"type": "http"}, receive, send)
    assert seen == [{"type": "http.request", "body": b"abcde", "more_body": False}, {"type": "http.disconnect"}]


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_hundred_concurrent_calls_are_all_answered_correctly(loopback_url: str) -> None:
    """100 tool calls at once over one streamable HTTP session: each answered, each with its own right value."""
    import anyio

    results: dict[int, float] = {}

    async with Client(loopback_url + "/mcp") as client:

        async def one(i: int) -> None:
            compute = 100.0 * (i + 1)
            result = await client.call_tool(
                "predict_scaling",
                {"model": "power_law", "compute": [compute], "parameters": {"A": 0.6, "B": 0.5, "D": 1.0}},
            )
            assert not result.is_error, result.content
            results[i] = result.structured_content["values"][0]["value"]

        with anyio.fail_after(90):
            async with anyio.create_task_group() as group:
                for i in range(100):
                    group.start_soon(one, i)
    assert sorted(results) == list(range(100))
    for i, value in results.items():
        assert value == pytest.approx(0.6 - (100.0 * (i + 1)) ** -0.5)
